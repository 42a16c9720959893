"""CommitLog files: rollover with BLANK fillers, reads across files, validation, mappings."""

from __future__ import annotations

import os

import pytest

from core.common.codec import BLANK_MAGIC, FIXED_SIZE, decode_record, encode_record
from core.store.commitlog import CommitLog
from core.store.mapped_file import MappedFile

from .conftest import msg

HOST = b"\x7f\0\0\1\0\0\0\0"


def test_rollover_writes_blank_and_records_never_straddle(open_store):
    store = open_store()
    body = b"b" * 1000
    offsets = []
    for i in range(200):  # ~200 KB over 64 KiB files
        r = store.put(msg(body=body + str(i).encode()))
        assert r.ok
        offsets.append((r.physical_offset, r.wrote_bytes))
    fs = store.commitlog.file_size
    for phys, size in offsets:
        assert phys // fs == (phys + size - 1) // fs, "record straddles two files"
    files = sorted(os.listdir(store._cfg.store_dir + "/commitlog"))
    assert len(files) >= 3
    assert files[1] == str(fs).zfill(20)
    # The first file ends with a BLANK filler right after its last record.
    last_in_first = max(p + s for p, s in offsets if p < fs)
    first = store.commitlog.files[0]
    remaining = int.from_bytes(first.mm[last_in_first : last_in_first + 4], "big")
    magic = int.from_bytes(first.mm[last_in_first + 4 : last_in_first + 8], "big")
    assert magic == BLANK_MAGIC
    assert remaining == fs - last_in_first
    # Every message reads back from its queue, across the files.
    got = store.get("T", 0, 0, 32)
    n = 0
    off = 0
    while got.message_count:
        for buf in got.buffers:
            assert decode_record(buf).body == body + str(n).encode()
            n += 1
        off = got.next_begin_offset
        got = store.get("T", 0, off, 32)
    assert n == 200


def test_record_larger_than_a_file_is_refused(open_store):
    store = open_store()
    r = store.put(msg(body=b"x" * (64 * 1024)))
    assert r.status.name == "MESSAGE_ILLEGAL"
    assert store.max_physical_offset == 0


def test_scan_stops_at_first_invalid_record(tmp_path):
    cl = CommitLog(str(tmp_path / "cl"), 4096)
    cl.load()
    mf = cl.new_file(0)
    pos = 0
    for i in range(3):
        rec = encode_record(
            topic=b"T", body=b"body%d" % i, properties=b"", queue_id=0, flag=0, queue_offset=i,
            physical_offset=pos, sys_flag=0, born_timestamp=1, born_host=HOST,
            store_timestamp=2, store_host=HOST, reconsume_times=0, prepared_transaction_offset=0,
        )
        mf.mm[pos : pos + len(rec)] = rec
        pos += len(rec)
    assert [p for p, _ in cl.scan(0)] == [0, FIXED_SIZE + 5 + 1, 2 * (FIXED_SIZE + 6)]
    assert cl.scan_end == pos
    # Corrupt the body of the last record: CRC mismatch ends the scan before it.
    last = 2 * (FIXED_SIZE + 6)
    mf.mm[last + 88] ^= 0xFF
    assert [p for p, _ in cl.scan(0)] == [0, FIXED_SIZE + 6]
    assert cl.scan_end == last
    # A wrong PHYSICALOFFSET (stale data from elsewhere) is invalid too.
    mf.mm[last + 88] ^= 0xFF
    mf.mm[last + 35] ^= 0x01  # low byte of PHYSICALOFFSET
    assert len(list(cl.scan(0))) == 2
    cl.close()


def test_mapping_with_live_slices_closes_lazily(tmp_path):
    path = str(tmp_path / "f")
    mf = MappedFile(path, 0, 8192, create=True)
    mf.mm[0:5] = b"hello"
    held = mf.view[0:5]
    assert mf.destroy() is False  # a reader holds a slice: no crash, deferred
    assert not os.path.exists(path)
    assert bytes(held) == b"hello"  # the slice stays valid after deletion
    held.release()
    mf2 = MappedFile(path, 0, 8192, create=True)
    assert mf2.close() is True


def test_zero_from_clears_only_the_tail(tmp_path):
    mf = MappedFile(str(tmp_path / "z"), 0, 1 << 21, create=True)
    mf.mm[0:10] = b"k" * 10
    mf.mm[100:110] = b"g" * 10
    mf.mm[(1 << 20) + 5] = 7
    written = mf.zero_from(50)
    assert written > 0
    assert bytes(mf.mm[0:10]) == b"k" * 10
    assert mf.mm[100:110] == bytes(10)
    assert mf.mm[(1 << 20) + 5] == 0
    mf.close()


def test_file_size_mismatch_is_an_error(tmp_path):
    d = tmp_path / "cl"
    d.mkdir()
    (d / ("0" * 20)).write_bytes(b"\0" * 8192)
    cl = CommitLog(str(d), 4096)
    with pytest.raises(ValueError):
        cl.load()
