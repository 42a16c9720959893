"""Basic.Ack with `multiple` takes the deliveries up to its tag without reading the rest of
the channel's unacknowledged window, and still takes exactly the right ones (also after a
Tx.Rollback put settled deliveries back)."""

from __future__ import annotations

from gateway.amqp.consume import Deliveries


class _CountingDict(dict):
    """A dict that counts the keys its iteration hands out."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.read = 0

    def __iter__(self):
        for key in super().__iter__():
            self.read += 1
            yield key


def _deliveries(tags) -> Deliveries:
    d = Deliveries(None, 1, 131072, lambda data: None, None)
    d.unacked = _CountingDict((t, (None, f"m{t}", None)) for t in tags)
    return d


def test_multiple_ack_reads_only_up_to_its_tag():
    window = 500
    d = _deliveries(range(1, window + 1))
    taken = d._take(3, True)
    assert [t for t, *_ in taken] == [1, 2, 3]
    assert [m for _, _, m, _ in taken] == ["m1", "m2", "m3"]
    assert d.unacked.read <= 4  # three taken, one look past them
    assert list(d.unacked) == list(range(4, window + 1))


def test_multiple_ack_after_a_rollback_and_tag_zero():
    d = _deliveries([2, 5, 9])
    d.tx = [(1, None, "m1", None, "ack"), (7, None, "m7", None, "ack")]
    d.rollback()  # 1 and 7 are unacknowledged again, in tag order
    assert [t for t, *_ in d._take(7, True)] == [1, 2, 5, 7]
    assert [t for t, *_ in d._take(0, True)] == [9]  # tag 0: everything
    assert d.unacked == {}
