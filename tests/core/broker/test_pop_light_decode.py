"""The POP client's light decode reads a plain IPv4 record with one unpack
(`pop_records._plain_record`) and gives exactly what the general `parse_layout` path
gives: the same records, and the same error for anything malformed (differential, over
v1 and v2 records, cut and with octets changed)."""

from __future__ import annotations

import random
import struct

import pytest

from core.client import pop_records
from core.common.codec import MAGIC_V2, encode_record
from core.common.sysflag import MessageSysFlag


def _record(i: int, body: bytes, props: bytes, sys_flag: int = 0) -> bytes:
    return encode_record(
        topic=b"%LMQ%a_q", body=body, properties=props, queue_id=i % 3, flag=0,
        queue_offset=i, physical_offset=1000 * i, sys_flag=sys_flag,
        born_timestamp=1_700_000_000_000 + i, born_host=b"\x7f\x00\x00\x01\x00\x00\x10\x00",
        store_timestamp=1_700_000_000_500 + i, store_host=b"\x7f\x00\x00\x01\x00\x00\x20\x00",
        reconsume_times=i % 2, prepared_transaction_offset=0)


def _v2(rec: bytes) -> bytes:
    """The same record in the v2 layout (a 2-octet topic length)."""
    total = struct.unpack_from(">I", rec)[0]
    blen = struct.unpack_from(">i", rec, 84)[0]
    p = 88 + blen
    tlen = rec[p]
    out = bytearray(struct.pack(">II", total + 1, MAGIC_V2) + rec[8:p])
    out += struct.pack(">h", tlen) + rec[p + 1:]
    return bytes(out)


def _outcome(buf: bytes):
    try:
        return [(r.body, r.raw_properties, r.store_timestamp, r.reconsume_times, r.sys_flag,
                 r.has_pop_ck) for r in pop_records.light_records(buf)]
    except Exception as exc:  # the type is what must match
        return type(exc)


@pytest.fixture
def both(monkeypatch):
    monkeypatch.setattr(pop_records, "_shared", {})

    def run(buf: bytes):
        fast = _outcome(buf)
        with monkeypatch.context() as m:
            m.setattr(pop_records, "_plain_record", lambda mv, pos, end: None)
            slow = _outcome(buf)
        return fast, slow

    return run


def test_plain_records_decode_as_the_general_path(both):
    recs = [_record(i, bytes([i]) * (i * 7), b"A\x01b\x02POP_CK\x01x" if i % 3 else b"")
            for i in range(12)]
    buf = b"".join(recs) + b"".join(_v2(r) for r in recs)
    fast, slow = both(buf)
    assert fast == slow
    assert len(fast) == 24 and fast[5][0] == b"\x05" * 35
    assert fast[1][5] is True and fast[3][5] is False  # POP_CK seen
    # An IPv6 record (or a compressed one) takes the general path, the others around it not.
    v6 = bytearray(recs[2])
    struct.pack_into(">i", v6, 36, MessageSysFlag.STOREHOST_V6)
    assert pop_records._plain_record(memoryview(bytes(v6)), 0, len(v6)) is None
    assert pop_records._plain_record(memoryview(recs[2]), 0, len(recs[2])) is not None


def test_damaged_records_fail_as_the_general_path(both):
    rng = random.Random(13)
    recs = [_record(i, b"x" * rng.randrange(0, 300), b"K\x01v%d" % i) for i in range(4)]
    base = [b"".join(recs), b"".join(_v2(r) for r in recs)]
    for _ in range(600):
        buf = bytearray(rng.choice(base))
        for _ in range(rng.randrange(1, 4)):
            if rng.random() < 0.3:
                del buf[rng.randrange(len(buf)):]  # cut
            elif buf:
                # Change an octet, mostly in a header or a length field.
                at = rng.choice([rng.randrange(len(buf)), rng.randrange(min(len(buf), 100))])
                buf[at] = rng.randrange(256)
        fast, slow = both(bytes(buf))
        assert fast == slow, bytes(buf).hex()
