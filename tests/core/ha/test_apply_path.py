"""The slave's apply path (core/store/ha/replica.py): scan_chunk in C and in Python give
the same answers on the same chunks, honest, torn or hostile; a slave that applied chunks
holds the same indexes as a store recovered from the same CommitLog; a hostile chunk is
refused with ReplicaError, nothing past its valid prefix applied (docs/ha.md)."""

from __future__ import annotations

import random
import shutil
import struct

import pytest

from core.common.message import InnerMessage
from core.store import MessageStore, StoreConfig, speedups_py
from core.store import speedups as sp
from core.store.ha import ReplicaError, append_chunk, read_chunk

FS = 64 * 1024  # small CommitLog files: BLANK fillers between them
QOFF_AT = 20  # QUEUEOFFSET in a record (docs/protocol.md §7.1)
native = pytest.mark.skipif(not sp.SCAN_NATIVE, reason="core._speedups not built")


def _store(path, **kw) -> MessageStore:
    s = MessageStore(StoreConfig(str(path), commitlog_file_size=FS, preallocate_files=False,
                                 consume_queue_units_per_file=64, **kw))
    s.start()
    return s


def _fill(store) -> None:
    """Records of every kind the dispatch distinguishes."""
    rnd = random.Random(7)
    for i in range(400):
        kind = i % 8
        props = {"UNIQ_KEY": f"U{i:06d}"}
        topic, qid = f"T{i % 3}", i % 4
        if kind == 1:
            props["TAGS"] = rnd.choice(["a", "tag-b", "c" * 40])
        elif kind == 2:
            props["KEYS"] = f"k{i} k{i + 1}  k{i + 2}"
        elif kind == 3:
            props["INNER_MULTI_DISPATCH"] = f"%LMQ%a{i // 8 % 2},%LMQ%b"
        elif kind == 4:
            props["TAGS"] = "été"  # non-ASCII: the general dispatch
        elif kind == 5:
            topic, qid = "%LMQ%direct", 0
        elif kind == 6:
            props = {}
        body = bytes(rnd.randrange(256) for _ in range(rnd.randrange(0, 700)))
        assert store.put(InnerMessage(topic, body, queue_id=qid, properties=props)).ok
    batch = [InnerMessage("TB", b"b%d" % i, queue_id=1, properties={"KEYS": f"bk{i}"})
             for i in range(40)]
    assert store.put_batch(batch).ok


def _chunks(store, batch=8 * 1024) -> list[tuple[int, bytes]]:
    out, off = [], store.min_physical_offset
    while (chunk := read_chunk(store, off, batch)) is not None:
        out.append((off, bytes(chunk)))
        off += len(chunk)
    return out


def _scan(fn, data, phys, bucket_ms=3_600_000, max_qid=64):
    try:
        return fn(data, phys, phys % FS, FS, max_qid, True, b"%LMQ%", bucket_ms)
    except (TypeError, ValueError, OverflowError) as exc:
        return type(exc)


@pytest.fixture
def master(tmp_path):
    m = _store(tmp_path / "m")
    _fill(m)
    yield m
    m.shutdown()


def test_python_scan_plans_runs_and_general_records(master):
    chunks = _chunks(master)
    assert len({phys // FS for phys, _ in chunks}) >= 3  # several files, BLANK fillers
    runs = general = 0
    for phys, data in chunks:
        end, bad, last_ms, ops = speedups_py.scan_chunk(data, phys, phys % FS, FS, 64, True,
                                                        b"%LMQ%", 3_600_000)
        assert not bad and phys + end in (phys + len(data), (phys // FS + 1) * FS)
        assert last_ms > 0
        for op in ops:
            if type(op) is int:
                general += 1
            else:
                runs += 1
                assert len(op[3]) % 20 == 0
    assert runs and general


@native
def test_c_and_python_agree_on_honest_torn_and_hostile_chunks(master):
    rnd = random.Random(11)
    chunks = _chunks(master)
    for phys, data in chunks:
        for bucket in (0, 3_600_000):
            assert _scan(sp.scan_chunk, data, phys, bucket) == _scan(
                speedups_py.scan_chunk, data, phys, bucket)
    cases = 0
    for phys, data in rnd.sample(chunks, 12):
        variants = [data[: rnd.randrange(len(data))] for _ in range(6)]  # torn
        for _ in range(30):  # flipped bytes, in headers and anywhere
            b = bytearray(data)
            for _ in range(rnd.randrange(1, 4)):
                at = rnd.randrange(min(len(b), 120)) if rnd.random() < 0.6 else rnd.randrange(len(b))
                b[at] ^= 1 << rnd.randrange(8)
            variants.append(bytes(b))
        variants.append(bytes(rnd.randrange(256) for _ in range(300)))  # garbage
        variants.append(struct.pack(">iI", 0x7FFFFFFF, 0xDAA320A7) + data[8:])  # huge size
        for v in variants:
            cases += 1
            for max_qid in (64, 2):
                assert _scan(sp.scan_chunk, v, phys, max_qid=max_qid) == _scan(
                    speedups_py.scan_chunk, v, phys, max_qid=max_qid), (phys, v[:64])
    assert cases > 400
    # Arguments outside the contract: the same exception type from both.
    data = chunks[0][1]
    for args in ((bytearray(data), 0, 0, FS, 4, True, None, 0),
                 (data, -1, 0, FS, 4, True, None, 0),
                 (data, 0, FS - 10, FS, 4, True, None, 0),
                 (data, 0, 0, FS, 4, 1, None, 0),
                 (data, 0, 0, FS, 4, True, "p", 0),
                 (data, 0, 0, FS, 4, True, None, -5)):
        def call(fn, a=args):
            try:
                fn(*a)
            except (TypeError, ValueError, OverflowError) as exc:
                return type(exc)
        assert call(sp.scan_chunk) is call(speedups_py.scan_chunk) is not None


def _index_dump(store) -> tuple:
    cqs = {}
    for (topic, qid), cq in sorted(store._cqs.items()):
        cqs[(topic, qid)] = cq.units(0, 10_000)
    kv = store._kv
    kv.commit(store.max_physical_offset)
    entries = [(k, v) for k, v in kv.scan(b"\x01", b"\xff") if not k.startswith(b"\x00")]
    return cqs, sorted(entries)


@pytest.mark.parametrize("pure", [False, True])
def test_slave_indexes_match_a_recovered_store(master, tmp_path, monkeypatch, pure):
    if pure:
        from core.store.ha import replica
        monkeypatch.setattr(replica, "scan_chunk", speedups_py.scan_chunk)
    slave = _store(tmp_path / "s")
    try:
        for phys, data in _chunks(master, batch=16 * 1024):
            assert append_chunk(slave, phys, data) == phys + len(data)
        # Every queue the slave dispatched into, opened on both, and the LMQ offsets.
        for topic, qid in list(slave._cqs):
            master._cq(topic, qid)
        for name in ("%LMQ%a0", "%LMQ%a1", "%LMQ%b", "%LMQ%direct"):
            assert slave.max_offset(name, 0) == master.max_offset(name, 0) > 0
        slave_dump = _index_dump(slave)
        assert slave_dump == _index_dump(master)
        # The same CommitLog recovered from scratch (recovery's own dispatch).
        shutil.copytree(tmp_path / "s" / "commitlog", tmp_path / "r" / "commitlog")
    finally:
        slave.shutdown()
    rec = _store(tmp_path / "r")
    try:
        for topic, qid in slave_dump[0]:
            rec._cq(topic, qid)
        assert _index_dump(rec) == slave_dump
    finally:
        rec.shutdown()


def _bump_qoff(data: bytes, record_at: int, qoff: int) -> bytes:
    b = bytearray(data)
    struct.pack_into(">q", b, record_at + QOFF_AT, qoff)
    return bytes(b)


@pytest.mark.parametrize("qoff", [1 << 62, -1])
def test_hostile_queue_offset_is_refused_without_touching_the_queue(tmp_path, qoff):
    """A queue offset is not under the body CRC: a compromised master could send one that
    would make the slave map absurd ConsumeQueue files. It is refused like a bad CRC."""
    m, s = _store(tmp_path / "m"), _store(tmp_path / "s")
    try:
        for i in range(3):
            assert m.put(InnerMessage("T", b"x%d" % i)).ok
        data = bytes(read_chunk(m, 0, 1 << 20))
        size = len(data) // 3
        with pytest.raises(ReplicaError):
            append_chunk(s, 0, _bump_qoff(data, size, qoff))
        assert s.max_offset("T", 0) == 1 and s.max_physical_offset == size
        # The honest rest of the stream applies from the valid end.
        assert append_chunk(s, size, data[size:]) == len(data)
        assert s.max_offset("T", 0) == 3
    finally:
        m.shutdown()
        s.shutdown()


def test_torn_chunk_keeps_its_valid_prefix_and_nothing_after(tmp_path):
    m, s = _store(tmp_path / "m"), _store(tmp_path / "s")
    try:
        for i in range(4):
            assert m.put(InnerMessage("T", b"y" * 50, properties={"KEYS": f"k{i}"})).ok
        data = bytes(read_chunk(m, 0, 1 << 20))
        size = len(data) // 4
        with pytest.raises(ReplicaError):
            append_chunk(s, 0, data[: 2 * size + 30])
        assert s.max_physical_offset == 2 * size and s.max_offset("T", 0) == 2
        cl = s.commitlog.files[0]
        assert bytes(cl.mm[2 * size : 3 * size]) == bytes(size)  # nothing written past it
        assert append_chunk(s, 2 * size, data[2 * size :]) == len(data)
        s._kv.commit(s.max_physical_offset)
        assert len(s._keys.lookup(b"k", "T", "k3", 10, 0, 2**42)) == 1
    finally:
        m.shutdown()
        s.shutdown()


def test_hostile_multi_dispatch_offset_is_refused(tmp_path):
    m, s = _store(tmp_path / "m"), _store(tmp_path / "s")
    try:
        assert m.put(InnerMessage("T", b"a")).ok
        assert m.put(InnerMessage("T", b"b", properties={"INNER_MULTI_DISPATCH": "%LMQ%x"})).ok
        data = bytes(read_chunk(m, 0, 1 << 20))
        marker = b"INNER_MULTI_QUEUE_OFFSET\x010"
        assert data.count(marker) == 1
        hostile = data.replace(marker, marker[:-1] + b"9")  # offset 9: past any queue
        with pytest.raises(ReplicaError):
            append_chunk(s, 0, hostile)
        assert s.max_offset("%LMQ%x", 0) == 0 and s.max_offset("T", 0) == 1
    finally:
        m.shutdown()
        s.shutdown()


def test_slave_drops_a_compromised_master_cleanly_and_reconnects(tmp_path):
    """A master that knows the secret sends a chunk with an absurd queue offset: the slave
    logs, disconnects, keeps the valid prefix, serves on and connects again."""
    import trio

    from core.broker.config import BrokerConfig
    from core.broker.controller import BrokerController
    from core.broker.ha.service import _ID_EPOCH, _MAC, _NONCE, MAGIC, _mac, _recv_exactly

    secret = "s3cret-for-this-test"
    m = _store(tmp_path / "m")
    for i in range(3):
        assert m.put(InnerMessage("T", b"z%d" % i)).ok
    data = bytes(read_chunk(m, 0, 1 << 20))
    m.shutdown()
    size = len(data) // 3
    hostile = _bump_qoff(data, size, 1 << 62)
    sessions: list[int] = []

    async def fake_master(stream):
        async with stream:
            nonce = bytes(_NONCE)
            await stream.send_all(MAGIC + nonce)
            await _recv_exactly(stream, _MAC)
            offset = struct.unpack(">q", await _recv_exactly(stream, 8))[0]
            id_epoch = await _recv_exactly(stream, _ID_EPOCH.size)  # noqa: F841
            n = struct.unpack(">H", await _recv_exactly(stream, 2))[0]
            name = await _recv_exactly(stream, n)
            ep = struct.pack(">i", 0)
            addr = b"127.0.0.1:1"
            await stream.send_all(_mac(secret, b"master", nonce, name, ep) + ep
                                  + struct.pack(">H", len(addr)) + addr)
            sessions.append(offset)
            if offset == 0:
                await stream.send_all(struct.pack(">qi", 0, len(hostile)) + hostile)
            with trio.move_on_after(5):
                while await stream.receive_some(64):
                    pass

    async def main():
        async with trio.open_nursery() as nursery:
            listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
            port = listeners[0].socket.getsockname()[1]
            nursery.start_soon(trio.serve_listeners, fake_master, listeners)
            slave = BrokerController(BrokerConfig(
                host="127.0.0.1", port=0, data_dir=str(tmp_path / "slave"), broker_name="bk",
                broker_role="SLAVE", broker_id=1, ha_secret=secret, ha_reconnect_s=0.05,
                ha_master_address=f"127.0.0.1:{port}", commitlog_file_size=FS,
            ))
            await nursery.start(slave.serve)
            with trio.fail_after(20):
                while len(sessions) < 2:
                    await trio.sleep(0.01)
            # Reconnected from the end of the valid prefix; the queue holds only it.
            assert sessions[:2] == [0, size]
            assert slave.store.max_offset("T", 0) == 1
            slave.stop()
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_random_corruption_never_escapes_as_anything_but_replica_error(master, tmp_path):
    """Bytes flipped anywhere in chunks (headers, queue offsets, properties): the slave
    either applies the chunk or refuses it with ReplicaError keeping a valid prefix, and
    the honest stream then resumes from where it stopped."""
    rnd = random.Random(5)
    slave = _store(tmp_path / "s")
    try:
        refused = 0
        for phys, data in _chunks(master, batch=4096):
            assert slave.max_physical_offset == phys
            if rnd.random() < 0.5:
                b = bytearray(data)
                for _ in range(rnd.randrange(1, 4)):
                    b[rnd.randrange(len(b))] ^= 1 << rnd.randrange(8)
                try:
                    append_chunk(slave, phys, bytes(b))
                except ReplicaError:
                    refused += 1
                    have = slave.max_physical_offset
                    assert phys <= have < phys + len(data)
                    append_chunk(slave, have, data[have - phys :])
                    continue
                # Accepted: the flips were somewhere no check looks (a body CRC covers
                # the body; a flipped property or host field is data). Put it back.
                if bytes(b) != data:
                    slave.commitlog.file_for(phys).mm[phys % FS : phys % FS + len(data)] = data
                continue
            append_chunk(slave, phys, data)
        assert refused > 5
        assert slave.max_physical_offset == master.max_physical_offset
    finally:
        slave.shutdown()
