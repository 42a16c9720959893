"""Store statistics: counters and a fixed latency histogram (no per-message lists).

The histogram has 4 sub-buckets per power of two of nanoseconds, so a percentile is known
within 25 % at a cost of one `int.bit_length()` and one list increment per put.
"""

from __future__ import annotations

_SUB = 4  # sub-buckets per octave
_BUCKETS = 64 * _SUB


def bucket_of(ns: int) -> int:
    """Histogram bucket of a latency in nanoseconds."""
    b = ns.bit_length()
    if b <= 3:
        return ns  # 0..7 exactly
    return b * _SUB + ((ns >> (b - 3)) & (_SUB - 1))


def bucket_floor(i: int) -> int:
    """Smallest latency (ns) that falls into bucket `i`."""
    if i < 4 * _SUB:
        return i
    b, sub = divmod(i, _SUB)
    return (_SUB + sub) << (b - 3)


class LatencyHistogram:
    """Counts per bucket; the hot path may increment `counts[bucket_of(ns)]` directly."""

    __slots__ = ("counts",)

    def __init__(self) -> None:
        self.counts = [0] * _BUCKETS

    def record(self, ns: int) -> None:
        self.counts[bucket_of(ns)] += 1

    @property
    def total(self) -> int:
        return sum(self.counts)

    def percentile(self, q: float) -> int:
        """Latency (ns, bucket lower bound) below which a fraction `q` of samples fall."""
        total = self.total
        if total == 0:
            return 0
        rank = q * total
        seen = 0
        for i, c in enumerate(self.counts):
            seen += c
            if c and seen >= rank:
                return bucket_floor(i)
        return 0

    def max_ns(self) -> int:
        """Upper bound of the highest non-empty bucket."""
        for i in range(_BUCKETS - 1, -1, -1):
            if self.counts[i]:
                return bucket_floor(i + 1) if i + 1 < _BUCKETS else bucket_floor(i)
        return 0


class StoreStats:
    """Counters updated by the store's put and get paths."""

    __slots__ = (
        "put_calls", "put_msgs", "put_bytes", "put_errors", "get_calls", "get_msgs",
        "get_bytes", "lmq_dispatches", "put_latency",
    )

    def __init__(self) -> None:
        self.put_calls = 0
        self.put_msgs = 0
        self.put_bytes = 0
        self.put_errors = 0
        self.get_calls = 0
        self.get_msgs = 0
        self.get_bytes = 0
        self.lmq_dispatches = 0
        self.put_latency = LatencyHistogram()

    def snapshot(self) -> dict:
        h = self.put_latency
        return {
            "puts": self.put_msgs,
            "put_calls": self.put_calls,
            "put_bytes": self.put_bytes,
            "put_errors": self.put_errors,
            "gets": self.get_calls,
            "get_msgs": self.get_msgs,
            "get_bytes": self.get_bytes,
            "lmq_dispatches": self.lmq_dispatches,
            "put_latency_us": {
                "p50": h.percentile(0.50) / 1000,
                "p99": h.percentile(0.99) / 1000,
                "p999": h.percentile(0.999) / 1000,
                "max": h.max_ns() / 1000,
            },
        }
