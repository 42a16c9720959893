"""Replication of the CommitLog from a master broker to its slaves (docs/ha.md).

Wire protocol on the HA port (all integers big-endian):

    master -> slave   "LMQHA2" + nonce[32]
    slave  -> master  hmac[32] + int64 slave_max_offset + int32 broker id + int32 epoch
                      + uint16 len + broker name
                      hmac = HMAC-SHA256(ha_secret, "slave" + nonce + name + id + epoch)
    master -> slave   hmac[32] + int32 master epoch + uint16 len + master remoting address
                      hmac = HMAC-SHA256(ha_secret, "master" + nonce + name + epoch)
    then
    master -> slave   int64 offset + int32 length + CommitLog bytes  (length 0: heartbeat,
                      offset = master max offset)
    slave  -> master  int64 slave max offset (after every chunk, and every heartbeat)
                      or, after a POP append or snapshot end, -1 - (POP frames applied
                      in this session) (pop_sync.py; SYNC_MASTER acks wait for it)

The master streams from the offset the slave reports; a chunk is whole records within
one CommitLog file (core/store/ha). SYNC_MASTER sends wait until some slave (under a
controller: every slave of the in-sync set) reports an offset at or past the end of their
record (`wait_replicated`). Epochs are 0 without a controller (docs/ha.md, "Failover").
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import struct

import trio

from core.broker.ha.ack_waiters import AckWaiters
from core.broker.ha.pop_sync import (
    POP_KINDS,
    POP_SNAPSHOT,
    POP_SNAPSHOT_END,
    PopFeed,
    PopReplica,
    PopSyncError,
)
from core.broker.offsets import TOPIC_GROUP_SEPARATOR
from core.broker.subscription_group import SubscriptionGroupConfig
from core.broker.topic_config import TopicConfig
from core.remoting.codec import RemotingCommand
from core.remoting.codes import RequestCode
from core.remoting.errors import RemotingError
from core.store.ha import ReplicaError, append_chunk, read_chunk
from core.store.ha.replica import slave_commit_if_due

log = logging.getLogger(__name__)

MAGIC = b"LMQHA3"
_NONCE = 32
_MAC = 32
_I64 = struct.Struct(">q")
_ID_EPOCH = struct.Struct(">ii")
_HEADER = struct.Struct(">qi")
_MAX_NAME = 1024
_MAX_HANDSHAKES = 16  # connections in the handshake at once, beyond ha_max_slaves
_COALESCE = 64 * 1024  # chunks up to this are copied behind their header: one send
_REPORTS_READ = 4096  # bytes of slave reports read at once (512 reports)
_FRAMES_READ = 256 * 1024  # the slave reads the stream this much at a time


class SyncStatus:
    OK = "OK"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"


class HAProtocolError(Exception):
    pass


def _mac(secret: str, role: bytes, nonce: bytes, name: bytes, extra: bytes = b"") -> bytes:
    return hmac.new(secret.encode(), role + nonce + name + extra, hashlib.sha256).digest()


class _Reader:
    """Buffered reads of the HA stream (slave): small frames and their headers come out
    of one receive, not one each."""

    def __init__(self, stream) -> None:
        self.stream = stream
        self.buf = bytearray()

    async def exactly(self, n: int) -> bytes:
        buf = self.buf
        while len(buf) < n:
            data = await self.stream.receive_some(max(n - len(buf), _FRAMES_READ))
            if not data:
                raise HAProtocolError("connection closed")
            buf += data
        out = bytes(buf[:n])
        del buf[:n]
        return out


async def _recv_exactly(stream, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        data = await stream.receive_some(n - len(buf))
        if not data:
            raise HAProtocolError("connection closed")
        buf += data
    return bytes(buf)


def _last_reports(buf: bytes, whole: int) -> tuple[int | None, int | None]:
    """The last offset report and the last POP report (frames applied) among the
    reports in buf[:whole]: only the newest of each counts."""
    off = pop = None
    for i in range(whole - 8, -1, -8):
        v, = _I64.unpack_from(buf, i)
        if v >= 0:
            if off is None:
                off = v
                if pop is not None:
                    break
        elif pop is None:
            pop = -1 - v
            if off is not None:
                break
    return off, pop


def split_addr(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return host or "127.0.0.1", int(port)


# ---------------------------------------------------------------------- master
class HAMaster:
    """Master side: the HA listener, one streaming task per slave, and the SYNC_MASTER
    wait on the slaves' acknowledged offset."""

    def __init__(self, broker) -> None:
        self.broker = broker
        self.config = broker.config
        self.store = broker.store
        self.port: int | None = None
        self.slaves: dict[int, int] = {}  # connection id -> offset it reported
        self.slave_ids: dict[int, int] = {}  # connection id -> the slave's broker id
        self.caught_up_at: dict[int, float] = {}  # connection id -> last time at our end
        # Under a controller: broker ids whose report every SYNC send waits for (the
        # in-sync set minus this broker, plus slaves proposed for it). None = any slave.
        self.ack_ids: set[int] | None = None
        self.acked = -1  # offset every waited-for slave holds
        self.acked_high = -1  # greatest `acked` so far (what SYNC sends were told)
        self._data = trio.Event()
        self._waiters = AckWaiters()  # SYNC sends, by end offset
        self._next_id = 0
        self.refused = 0  # connections refused at the handshake
        self._open = 0  # connections being served (handshaking or streaming)
        self.pop_feed = PopFeed(self)  # POP journal to the slaves (pop_sync.py)
        self.pop_acked = 0  # POP journal flushes every waited-for slave holds
        self._pop_waiters = AckWaiters()  # SYNC_MASTER POP acks, by flush seq

    # -- hooks of the broker
    def notify_append(self) -> None:
        """A put wrote records: wake the streaming tasks (cheap; every put)."""
        self._data.set()

    async def wait_replicated(self, end_offset: int, timeout_s: float) -> str:
        """SYNC_MASTER: OK once a slave holds [.., end_offset); SLAVE_NOT_AVAILABLE when no
        slave is connected; FLUSH_SLAVE_TIMEOUT after `timeout_s`. Waiters sit in a heap by
        offset, so a report wakes only the sends it covers."""
        if not self._has_replicas():
            return SyncStatus.SLAVE_NOT_AVAILABLE
        if self.acked < end_offset:
            await self._waiters.wait(end_offset, timeout_s)
        return self._sync_status(self.acked >= end_offset)

    async def wait_pop_replicated(self, timeout_s: float) -> str:
        """SYNC_MASTER acks: `wait_replicated` for the POP journal flushes made so far
        (an ack calls it right after its own flush, so that flush is among them)."""
        if not self._has_replicas():
            return SyncStatus.SLAVE_NOT_AVAILABLE
        seq = self.pop_feed.seq
        if self.pop_acked < seq:
            await self._pop_waiters.wait(seq, timeout_s)
        return self._sync_status(self.pop_acked >= seq)

    def _sync_status(self, reached: bool) -> str:
        """A SYNC wait's answer once it ended."""
        if reached:
            return SyncStatus.OK
        if not self._has_replicas():
            return SyncStatus.SLAVE_NOT_AVAILABLE
        return SyncStatus.FLUSH_SLAVE_TIMEOUT

    def _set_pop_acked(self) -> None:
        boxes = self.pop_feed.outboxes
        if self.ack_ids is None:
            acked = max((b.confirmed for b in boxes.values()), default=0)
        else:
            ids = self.slave_ids
            acked = min((max((b.confirmed for cid, b in boxes.items() if ids.get(cid) == i),
                             default=0) for i in self.ack_ids), default=0)
        self.pop_acked = acked
        self._pop_waiters.release(acked if self._has_replicas() else None)

    def _has_replicas(self) -> bool:
        return bool(self.slaves) if self.ack_ids is None else bool(self.ack_ids)

    def slave_offset(self, broker_id: int) -> int:
        """The greatest offset a connected slave with this id reported (-1: none)."""
        return max((off for cid, off in self.slaves.items()
                    if self.slave_ids.get(cid) == broker_id), default=-1)

    def set_ack_ids(self, ids: set[int] | None) -> None:
        """Controller mode: the slaves every SYNC send must reach (docs/ha.md)."""
        self.ack_ids = None if ids is None else set(ids)
        self._set_acked()
        self._set_pop_acked()

    def _set_acked(self) -> None:
        if self.ack_ids is None:
            self.acked = max(self.slaves.values(), default=-1)
        else:
            self.acked = min((self.slave_offset(i) for i in self.ack_ids), default=-1)
        if self.acked > self.acked_high:
            self.acked_high = self.acked
        # nobody to wait for: answer every waiting send now
        self._waiters.release(self.acked if self._has_replicas() else None)

    # -- listener
    async def serve(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        cfg = self.config
        port = cfg.port + 1 if cfg.ha_listen_port is None else cfg.ha_listen_port
        listeners = await trio.open_tcp_listeners(port, host=cfg.host)
        self.port = listeners[0].socket.getsockname()[1]
        log.info("HA listener on %s:%d", cfg.host, self.port)
        async with trio.open_nursery() as nursery:
            task_status.started(self.port)
            try:
                await trio.serve_listeners(self._handle, listeners, handler_nursery=nursery)
            finally:
                for ln in listeners:
                    await ln.aclose()

    async def _handle(self, stream) -> None:
        cfg = self.config
        # Slaves plus connections still in the handshake (those cost a task each for up
        # to ha_handshake_timeout_s).
        if self._open >= cfg.ha_max_slaves + _MAX_HANDSHAKES:
            await trio.aclose_forcefully(stream)
            return
        self._open += 1
        try:
            await self._serve_slave(stream)
        finally:
            self._open -= 1

    async def _serve_slave(self, stream) -> None:
        cfg = self.config
        peer = "?"
        try:
            host, port = stream.socket.getpeername()[:2]
            peer = f"{host}:{port}"
            with trio.fail_after(cfg.ha_handshake_timeout_s):
                offset = await self._handshake(stream)
        except (HAProtocolError, trio.TooSlowError, OSError, trio.BrokenResourceError) as exc:
            self.refused += 1
            log.warning("HA: refused slave %s: %s", peer, exc)
            await trio.aclose_forcefully(stream)
            return
        if len(self.slaves) >= cfg.ha_max_slaves:
            log.warning("HA: refused slave %s: already %d slaves", peer, len(self.slaves))
            await trio.aclose_forcefully(stream)
            return
        offset, slave_id = offset
        cid = self._next_id = self._next_id + 1
        self.slaves[cid] = offset
        self.slave_ids[cid] = slave_id
        self._set_acked()
        log.info("HA: slave %s connected at offset %d", peer, offset)
        box = self.pop_feed.open(cid)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._read_reports, stream, cid, nursery.cancel_scope)
                await self._stream_to(stream, offset, box)
        except (HAProtocolError, ReplicaError, OSError, trio.BrokenResourceError,
                trio.ClosedResourceError) as exc:
            log.warning("HA: slave %s dropped: %s", peer, exc)
        finally:
            self.pop_feed.close(cid)
            self.slaves.pop(cid, None)
            self.slave_ids.pop(cid, None)
            self.caught_up_at.pop(cid, None)
            self._set_acked()
            self._set_pop_acked()
            await trio.aclose_forcefully(stream)

    async def _handshake(self, stream) -> tuple[int, int]:
        cfg = self.config
        nonce = os.urandom(_NONCE)
        await stream.send_all(MAGIC + nonce)
        mac = await _recv_exactly(stream, _MAC)
        offset, = _I64.unpack(await _recv_exactly(stream, 8))
        id_epoch = await _recv_exactly(stream, _ID_EPOCH.size)
        slave_id, slave_epoch = _ID_EPOCH.unpack(id_epoch)
        n, = struct.unpack(">H", await _recv_exactly(stream, 2))
        if n > _MAX_NAME:
            raise HAProtocolError("broker name too long")
        name = await _recv_exactly(stream, n)
        if not hmac.compare_digest(mac, _mac(cfg.ha_secret, b"slave", nonce, name, id_epoch)):
            raise HAProtocolError("bad credentials")
        if name.decode("utf-8", "replace") != cfg.broker_name:
            raise HAProtocolError(f"slave of broker {name!r}, this is {cfg.broker_name!r}")
        if offset < 0 or offset > self.store.max_physical_offset:
            raise HAProtocolError(f"slave offset {offset} is ahead of this master")
        link = self.broker.ha_link
        epoch = 0
        if link is not None:
            # Controller mode: only the master of the current epoch streams, and only to
            # a slave whose data is a prefix of ours (docs/ha.md, "Failover").
            problem = link.check_slave(slave_epoch, offset)
            if problem:
                raise HAProtocolError(problem)
            epoch = link.epoch
        addr = self.broker.broker_addr.encode()
        ep = struct.pack(">i", epoch)
        await stream.send_all(
            _mac(cfg.ha_secret, b"master", nonce, name, ep) + ep
            + struct.pack(">H", len(addr)) + addr
        )
        return offset, slave_id

    async def _read_reports(self, stream, cid: int, scope: trio.CancelScope) -> None:
        buf = b""
        try:
            while True:
                with trio.fail_after(self.config.ha_housekeeping_s):
                    data = await stream.receive_some(_REPORTS_READ)
                if not data:
                    raise HAProtocolError("connection closed")
                # Reports only grow: of those that arrived together, the last one counts
                # (one wake-up of the waiting sends, not one per report).
                buf += data
                whole = len(buf) - len(buf) % 8
                if not whole:
                    continue
                report, pop = _last_reports(buf, whole)
                buf = buf[whole:]
                if pop is not None:
                    box = self.pop_feed.outboxes.get(cid)
                    if box is not None and box.confirm(pop):
                        self._set_pop_acked()
                if report is None:
                    continue
                # A report past our own end would acknowledge sends the slave cannot hold.
                end = self.store.max_physical_offset
                off = min(report, end)
                if off == end:
                    self.caught_up_at[cid] = trio.current_time()
                if off > self.slaves.get(cid, -1):
                    self.slaves[cid] = off
                    self._set_acked()
        except (HAProtocolError, trio.TooSlowError, OSError, trio.BrokenResourceError,
                trio.ClosedResourceError) as exc:
            log.info("HA: slave connection %d ends: %s", cid, exc)
        scope.cancel()

    async def _stream_to(self, stream, offset: int, box) -> None:
        cfg = self.config
        store = self.store
        store_start = store.min_physical_offset
        if offset < store_start:
            # The slave's data is older than anything kept here (or it is empty):
            # start at the first file (the slave repositions an empty store).
            offset = store_start
        while True:
            if box.frames:  # POP journal frames first (small; the state changes they carry)
                for kind, data in box.take():
                    await stream.send_all(_HEADER.pack(kind, len(data)) + data)
            chunk = read_chunk(store, offset, cfg.ha_batch_bytes)
            if chunk is None:
                ev = self._data
                if ev.is_set():
                    self._data = ev = trio.Event()
                    continue
                with trio.move_on_after(cfg.ha_heartbeat_s):
                    await ev.wait()
                    continue
                await stream.send_all(_HEADER.pack(store.max_physical_offset, 0))
                continue
            if len(chunk) <= _COALESCE:
                await stream.send_all(_HEADER.pack(offset, len(chunk)) + chunk)  # one segment
            else:
                await stream.send_all(_HEADER.pack(offset, len(chunk)))
                await stream.send_all(chunk)
            offset += len(chunk)


# ---------------------------------------------------------------------- slave
class HASlave:
    """Slave side: connect to the master's HA port, apply the stream, report offsets,
    and pull topics and consumer offsets from the master every `ha_config_sync_s`."""

    def __init__(self, broker) -> None:
        self.broker = broker
        self.config = broker.config
        self.store = broker.store
        self.master_broker_addr: str | None = None
        self.connected = False
        self.master_offset = -1  # the master's max offset at its last heartbeat
        self._sync_now = trio.Event()
        # The master's HA address: fixed by config, or set by the controller link.
        self.master_address: str | None = self.config.ha_master_address
        self._retargeted = trio.Event()
        self._session_scope: trio.CancelScope | None = None
        self._run_scope: trio.CancelScope | None = None
        self.pop = broker.ha_pop_replica = PopReplica(broker)  # POP journal (pop_sync.py)

    def retarget(self, address: str | None) -> None:
        """Follow another master (controller mode): drop the current session."""
        if address == self.master_address:
            return
        self.master_address = address
        self.master_broker_addr = None
        if self._session_scope is not None:
            self._session_scope.cancel()
        self._retargeted.set()

    def stop(self) -> None:
        """Stop replicating (this broker was promoted)."""
        if self._run_scope is not None:
            self._run_scope.cancel()
        self.connected = False

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        with trio.CancelScope() as self._run_scope:
            task_status.started()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._config_sync_loop)
                while True:
                    if self.master_address is None:
                        self._retargeted = trio.Event()
                        await self._retargeted.wait()
                        continue
                    address = self.master_address
                    try:
                        with trio.CancelScope() as self._session_scope:
                            await self._session(address)
                    except (HAProtocolError, ReplicaError, PopSyncError, OSError, ValueError,
                            struct.error, trio.BrokenResourceError, trio.ClosedResourceError,
                            trio.TooSlowError) as exc:
                        log.warning("HA: connection to master %s failed: %s", address, exc)
                    finally:
                        self.pop.abort()
                    self.connected = False
                    if address == self.master_address:
                        await trio.sleep(self.config.ha_reconnect_s)

    async def _session(self, address: str) -> None:
        cfg = self.config
        link = self.broker.ha_link
        host, port = split_addr(address)
        with trio.fail_after(cfg.ha_handshake_timeout_s):
            stream = await trio.open_tcp_stream(host, port)
        async with stream:
            with trio.fail_after(cfg.ha_handshake_timeout_s):
                hello = await _recv_exactly(stream, len(MAGIC) + _NONCE)
                if hello[: len(MAGIC)] != MAGIC:
                    raise HAProtocolError("not an HA port")
                nonce = hello[len(MAGIC):]
                name = cfg.broker_name.encode()
                local_epoch = link.local_epoch if link is not None else 0
                id_epoch = _ID_EPOCH.pack(cfg.broker_id, local_epoch)
                await stream.send_all(
                    _mac(cfg.ha_secret, b"slave", nonce, name, id_epoch)
                    + _I64.pack(self.store.max_physical_offset) + id_epoch
                    + struct.pack(">H", len(name)) + name
                )
                mac = await _recv_exactly(stream, _MAC)
                ep = await _recv_exactly(stream, 4)
                if not hmac.compare_digest(mac, _mac(cfg.ha_secret, b"master", nonce, name, ep)):
                    raise HAProtocolError("master failed authentication")
                epoch, = struct.unpack(">i", ep)
                if epoch < local_epoch:
                    raise HAProtocolError(f"master epoch {epoch} is older than ours "
                                          f"({local_epoch}): a deposed master")
                n, = struct.unpack(">H", await _recv_exactly(stream, 2))
                self.master_broker_addr = (await _recv_exactly(stream, n)).decode()
            if link is not None and epoch > local_epoch:
                # The master checked that our data is a prefix of its own: from here on
                # our tail is the data of its epoch.
                await link.adopt_epoch(epoch)
            self.connected = True
            self._sync_now.set()  # topics and offsets at once, then every ha_config_sync_s
            log.info("HA: replicating from %s at offset %d", address,
                     self.store.max_physical_offset)
            limit = cfg.ha_batch_bytes + cfg.max_message_size + 65536
            reader = _Reader(stream)
            committed = trio.current_time()
            while True:
                with trio.fail_after(cfg.ha_housekeeping_s):
                    offset, length = _HEADER.unpack(await reader.exactly(_HEADER.size))
                    if length < 0 or length > limit:
                        raise HAProtocolError(f"chunk of {length} bytes")
                    data = await reader.exactly(length) if length else b""
                if offset < 0:  # POP journal frames (pop_sync.py): no report
                    if offset not in POP_KINDS or (offset == POP_SNAPSHOT_END and length):
                        raise HAProtocolError(f"frame of kind {offset}")
                    await self.pop.apply(offset, data)
                    if offset != POP_SNAPSHOT:  # a flush or a whole snapshot is held
                        await stream.send_all(_I64.pack(-1 - self.pop.frames))
                    continue
                if length:
                    append_chunk(self.store, offset, data, commit=False)
                else:
                    self.master_offset = offset
                await stream.send_all(_I64.pack(self.store.max_physical_offset))
                # The key index's RocksDB batch after the report: the waiting sends need
                # the CommitLog bytes, not the index (rebuilt by recovery anyway). It
                # spans chunks (replica.py); a heartbeat (idle stream) writes it.
                now = trio.current_time()
                if not length:
                    self.store._commit_kv()
                    committed = now
                elif slave_commit_if_due(self.store, now, committed):
                    committed = now

    async def _config_sync_loop(self) -> None:
        while True:
            if self.master_broker_addr is not None:
                try:
                    await self.sync_config()
                except (RemotingError, OSError, ValueError, KeyError, TypeError,
                        AttributeError) as exc:
                    log.warning("HA: config sync from %s failed: %r", self.master_broker_addr, exc)
            with trio.move_on_after(self.config.ha_config_sync_s):
                await self._sync_now.wait()
            self._sync_now = trio.Event()

    async def sync_config(self) -> None:
        """Topics, consumer offsets and subscription groups from the master (RocketMQ's
        slave does the same with GET_ALL_TOPIC_CONFIG / GET_ALL_CONSUMER_OFFSET /
        GET_ALL_SUBSCRIPTIONGROUP_CONFIG)."""
        broker = self.broker
        client = broker.client
        if client is None:
            return
        addr = self.master_broker_addr
        timeout = self.config.register_timeout_s
        resp = await client.invoke(
            addr, RemotingCommand.request(RequestCode.GET_ALL_TOPIC_CONFIG, {}), timeout
        )
        if resp.code == 0 and resp.body:
            table = json.loads(resp.body).get("topicConfigTable", {})
            for data in table.values():
                broker.topic_config_manager.update(TopicConfig.from_json(data))
        resp = await client.invoke(
            addr, RemotingCommand.request(RequestCode.GET_ALL_CONSUMER_OFFSET, {}), timeout
        )
        if resp.code == 0 and resp.body:
            om = broker.offset_manager
            for key, queues in json.loads(resp.body).get("offsetTable", {}).items():
                topic, _, group = key.rpartition(TOPIC_GROUP_SEPARATOR)
                for q, off in queues.items():
                    om.commit(group, topic, int(q), int(off))
        resp = await client.invoke(addr, RemotingCommand.request(
            RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, {}), timeout)
        if resp.code == 0 and resp.body:
            sgm = broker.subscription_group_manager
            for name, data in json.loads(resp.body).get("subscriptionGroupTable", {}).items():
                current = sgm.table.get(name)
                if current is None or current.to_json() != data:
                    sgm.update(SubscriptionGroupConfig.from_json(data))
