"""The POP journal on real files: torn tails are ignored, compaction keeps the state."""

from __future__ import annotations

import trio

from core.broker.pop import journal as journal_mod
from core.broker.pop.journal import PopJournal, snapshot_line


def test_replay_stops_at_torn_or_corrupt_line(tmp_path):
    j = PopJournal(str(tmp_path / "pop"))
    j.open()
    j.cursor("G", "T", 0, 3)
    j.hand("G", "T", 0, 2, 100, 200, 1)
    j.gone("G", "T", 0, 2)
    j.flush()
    j.close()
    with open(j.path, "ab") as f:
        f.write(b"H G T 0 9 1 2 3 0000")  # torn: no newline, bad CRC
    assert list(j.replay()) == [("C", "G", "T", 0, 3),
                                ("H", "G", "T", 0, 2, 100, 200, 1, None),
                                ("A", "G", "T", 0, 2)]
    raw = open(j.path, "rb").read().replace(b"H G T 0 2 100", b"H G T 0 2 101")
    open(j.path, "wb").write(raw)
    assert list(j.replay()) == [("C", "G", "T", 0, 3)]


def test_compaction_rewrites_live_state_and_keeps_appends(tmp_path, monkeypatch):
    monkeypatch.setattr(journal_mod, "POP_JOURNAL_COMPACT_BYTES", 100)
    j = PopJournal(str(tmp_path / "pop"))
    j.open()
    for i in range(50):
        j.hand("G", "T", 0, i, 1000 + i, 5000, 1)
        j.gone("G", "T", 0, i)
    j.flush()
    big = j.size
    assert j.needs_compaction(live_records=2)

    async def main():
        await j.compact([snapshot_line("C", "G", "T", 0, 50)])
        j.hand("G", "T", 0, 50, 2000, 6000, 1, "gw-1")
        j.flush()

    trio.run(main)
    j.close()
    assert j.size < big
    assert list(j.replay()) == [("C", "G", "T", 0, 50),
                                ("H", "G", "T", 0, 50, 2000, 6000, 1, "gw-1")]


def test_queue_state_memory_stays_bounded_by_in_flight():
    from core.broker.pop.state import QueueState

    qs = QueueState(0)
    # One message stuck in flight with a long deadline while many others are acked.
    qs.hand_out(0, 1, 10**9)
    for off in range(1, 5000):
        qs.hand_out(off, off + 1, 10**9)
        assert qs.ack(off, off + 1)
    assert qs.committed() == 0
    assert len(qs._deadlines) < 200 and len(qs._low) < 200
    assert qs.ack(0, 1) and qs.committed() == 5000
