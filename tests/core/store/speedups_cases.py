"""Well-formed arguments for the C functions of core._speedups, for the hostile-input and
fuzz tests (test_speedups_hostile.py, test_speedups_fuzz.py) to start from and spoil."""

from __future__ import annotations

from core.common.codec import FIXED_SIZE, BatchItem, encode_batch, encode_host

BORN = encode_host("10.0.0.1:9")
HOST = encode_host("10.0.0.2:10911")
TAIL = b"\x02T1"


def record_args(body=b"hello", pb=b"TAGS\x01a", tail=TAIL, pos=16) -> list:
    """write_record's arguments after `mm`."""
    total = FIXED_SIZE - 1 + len(body) + len(tail) + len(pb)
    return [pos, total, 3, 7, 42, 1 << 40, 5, 1_700_000_000_123, BORN,
            1_700_000_000_456, HOST, 2, 0, body, tail, pb]


def batch_body(n: int = 3) -> bytes:
    return encode_batch([
        BatchItem(i, b"body-%d" % i, f"KEYS\x01k{i} x{i}\x02UNIQ_KEY\x01U{i}\x02WAIT\x01true")
        for i in range(n)
    ])


def split_args(body: bytes, extra: bytes = b"") -> list:
    """split_batch's arguments (store limits of a 64 KiB CommitLog file)."""
    return [body, extra, FIXED_SIZE + len(TAIL) - 1, 64 * 1024 - 8, 4 * 1024 * 1024, 32767,
            None, True, True, True]


def batch_args(items: list, body: bytes, mm, pos: int = 0, limit: int | None = None,
               pending: list | None = None) -> list:
    """write_batch's 24 arguments for split_batch `items` of `body`."""
    return [mm, pos, len(mm) if limit is None else limit, items, 0, 1, 100, 1 << 30, 0,
            1_700_000_000_000, BORN, 1_700_000_000_001, HOST, 0, body, TAIL,
            HOST.hex().upper(), [], bytearray(), pending, b"T1#", 17, None, None]
