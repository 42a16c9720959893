"""speedups.recent_slices, the read of an LMQ's records whose units are in memory
(MessageStore.recent_records): the C function against the Python reference on a real
store's unit lists (several generations, CommitLog files rolled, records removed by
retention, reads bounded by count and bytes), and the C function refusing malformed
input with an exception instead of reading out of bounds."""

from __future__ import annotations

import random
import struct

import pytest

from core.common.codec import decode_record
from core.store import speedups_py as ref
from tests.core.store.conftest import lmq_msg

try:
    import core._speedups as c
except ImportError:  # pragma: no cover - test_speedups says the extension must be built
    c = None

needs_c = pytest.mark.skipif(c is None, reason="core._speedups not built")
UNIT = struct.Struct(">qiqq")


def _filled(open_store):
    """A store whose LMQs have units in several in-memory generations across 3+ files."""
    store = open_store(commitlog_file_size=16 * 1024)
    rng = random.Random(7)
    for i in range(120):
        names = ["%LMQ%a"] + (["%LMQ%b"] if i % 3 else [])
        store.put(lmq_msg(names, body=bytes([i]) * rng.randrange(1, 400)))
        if i % 25 == 24:
            store._commit_kv()  # a new generation
    assert len(store.commitlog.files) >= 3
    return store


def _args(store, name, offset, count, max_bytes, clmin=None, wrote=None):
    cl = store.commitlog
    return (store._lmq.recent_chain(name, offset), offset, count, max_bytes, cl.files,
            cl.file_size, cl.first_no, cl.min_offset if clmin is None else clmin,
            store._wrote if wrote is None else wrote)


def _same(a, b):
    (sa, ta), (sb, tb) = a, b
    assert [bytes(x) for x in sa] == [bytes(x) for x in sb] and ta == tb
    return sa


@needs_c
def test_c_reads_what_the_reference_reads(open_store):
    store = _filled(open_store)
    rng = random.Random(3)
    for _ in range(400):
        name = rng.choice(["%LMQ%a", "%LMQ%b"])
        maxo = store._lmq.next_offset(name)
        offset = rng.randrange(0, maxo + 2)
        args = _args(store, name, offset, rng.randrange(0, 33), rng.choice([1, 300, 1 << 17]))
        if args[0] is None:
            continue
        if rng.random() < 0.5:  # a byte bound equal to the size of the first few records
            sizes = [len(b) for b in store.get(name, 0, offset, 32, max_bytes=1 << 20).buffers]
            args = (*args[:3], sum(sizes[: rng.randrange(1, 6)]), *args[4:])
        got = _same(c.recent_slices(*args), ref.recent_slices(*args))
        # consecutive offsets from `offset`, the records the store's get returns
        want = store.get(name, 0, offset, max(1, len(got)), max_bytes=1 << 20).buffers
        assert [bytes(x) for x in got] == [bytes(x) for x in want[: len(got)]]
    # Retention and the write position cut a read short at the first record gone.
    chain = store._lmq.recent_chain("%LMQ%a", 0)
    units = [UNIT.unpack(u)[:2] for gen in chain for u in gen[1::2]]
    for cut in (units[5][0], units[5][0] + 1, units[40][0]):
        for clmin, wrote in ((cut, store._wrote), (0, cut)):
            args = _args(store, "%LMQ%a", 0, 200, 1 << 30, clmin, wrote)
            got = _same(c.recent_slices(*args), ref.recent_slices(*args))
            kept = 0
            for phys, size in units:
                if phys < clmin or phys + size > wrote:
                    break
                kept += 1
            assert len(got) == kept


def test_store_reads_each_record_once_in_order(open_store):
    """Through MessageStore.recent_records (C or Python, whichever runs): a reader
    following the LMQ gets every record once, in order."""
    store = _filled(open_store)
    seen = []
    offset = 0
    while True:
        got = store.recent_records("%LMQ%a", offset, 7, 2000)
        if not got or not got[0]:
            break
        seen += [decode_record(b).body[0] for b in got[0]]
        offset += len(got[0])
    assert offset == store._lmq.next_offset("%LMQ%a") == 120
    assert seen == list(range(120))


@needs_c
@pytest.mark.parametrize("chain", [
    [[0, b"short"]],                          # a unit shorter than phys + size
    [[0, "not bytes"]],
    [(0, UNIT.pack(0, 10, 0, 0))],            # a tuple, not a list
    ["nope"],
    [[True, UNIT.pack(0, 10, 0, 0)]],         # offsets are exact ints
])
def test_c_refuses_malformed_chains(open_store, chain):
    store = open_store()
    store.put(lmq_msg(["%LMQ%a"]))
    cl = store.commitlog
    with pytest.raises(TypeError):
        c.recent_slices(chain, 0, 5, 1 << 20, cl.files, cl.file_size, cl.first_no, 0, store._wrote)


@needs_c
def test_c_refuses_bad_bounds_and_stays_inside_files(open_store):
    store = open_store(commitlog_file_size=8192)
    store.put(lmq_msg(["%LMQ%a"]))
    cl = store.commitlog
    base = (0, 5, 1 << 20, cl.files)
    with pytest.raises(ValueError):
        c.recent_slices([], *base, 0, 0, 0, 100)
    with pytest.raises(TypeError):
        c.recent_slices([], *base[:3], tuple(cl.files), cl.file_size, 0, 0, 100)
    # Units pointing outside every file, or across a file's end, give nothing.
    for phys, size in ((8190, 10), (10 * 8192, 10), (-5, 10), (0, -1), (0, 1 << 31 - 1)):
        unit = struct.pack(">qi", phys, size) + bytes(16)
        out = c.recent_slices([[0, unit]], 0, 5, 1 << 20, cl.files, cl.file_size, cl.first_no,
                              0, 1 << 40)
        assert out == ([], 0)
