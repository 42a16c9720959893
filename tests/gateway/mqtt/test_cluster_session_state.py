"""The in-flight state of connected sessions written into their cluster records
(gateway/mqtt/cluster_sessions.py, `post_state`): coalesced per session, built when
written, after the ordered writes, at a bounded rate; and a record's in-flight entries
brought up to newer committed positions when a session is resumed. No sockets: the
writer runs under trio's MockClock with its sends recorded."""

from __future__ import annotations

from types import SimpleNamespace

import trio
import trio.testing

from gateway.mqtt import cluster_sessions
from gateway.mqtt.cluster_sessions import ClusterSessions, _drop_acknowledged


class _Sess(SimpleNamespace):
    def record(self) -> dict:
        return {"v": 5, "exp": 60, "subs": [], "gone": None}

    def offsets_record(self) -> dict:
        return {}

    def inflight_record(self) -> list:
        return [[pid, 1, "p", "b", 100 + pid, [], None, False, []] for pid in self.pids]


def _sess(cid: str, connected: bool = True) -> _Sess:
    return _Sess(client_id=cid, conn=object() if connected else None, ended=False,
                 pids=[1], inbound_qos2=set(), will=None, will_due=None, cluster_stamp=-1)


def _writer() -> tuple[ClusterSessions, list]:
    async def create_topic(*_a) -> None:
        return None

    client = SimpleNamespace(api=SimpleNamespace(create_topic=create_topic))
    cs = ClusterSessions(SimpleNamespace(client=client), "127.0.0.1:1", "broker-a", "mqtt-a")
    written: list = []

    async def write_record(sess, body, done) -> None:
        written.append((trio.current_time(), body))
        if done is not None:
            done.set()

    cs._write_record = write_record  # type: ignore[method-assign]
    return cs, written


def test_state_records_are_coalesced_built_late_and_rate_bounded() -> None:
    async def main() -> None:
        cs, written = _writer()
        sessions = [_sess(f"c{i}") for i in range(5)]
        gone = _sess("gone", connected=False)
        async with trio.open_nursery() as nursery:
            await nursery.start(cs.run)
            for s in sessions:
                for _ in range(10):  # changed ten times before its turn: one record
                    cs.post_state(s)
            cs.post_state(gone)  # disconnected before its turn: its disconnect record counts
            sessions[0].pids = [1, 2]  # the newest state is what gets written
            done = cs.post_record(_sess("ordered"))  # an ordered write goes first
            await done.wait()
            await trio.sleep(10)
            nursery.cancel_scope.cancel()
        names = [b["c"] for _t, b in written]
        assert names == ["ordered", "c0", "c1", "c2", "c3", "c4"]
        assert [e[0] for e in written[1][1]["s"]["inf"]] == [1, 2]
        times = [t for t, b in written if "s" in b]
        gaps = [t2 - t1 for t1, t2 in zip(times, times[1:], strict=False)]
        assert min(gaps) >= 1 / cluster_sessions.STATE_WRITES_PER_S - 1e-9

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_resume_drops_what_newer_committed_positions_acknowledged() -> None:
    key = "b\x00L"
    offsets = {key: [10, 14]}  # the record: committed 10, sent up to 14
    inflight = [[p, 1, "p", "b", 900 + p, [[key, 9 + p]], None, False, []]
                for p in (1, 2, 3, 4)]  # offsets 10 .. 13 in flight
    shared = [9, 1, "p", "b", 999, [], None, False, []]  # no cursor: kept as it is
    left = _drop_acknowledged(offsets, [*inflight, shared], {("b", "L"): 12})
    assert offsets[key] == [12, 14]
    assert [e[0] for e in left] == [3, 4, 9]  # 10 and 11 were acknowledged since
    # A committed position older than the record changes nothing.
    offsets = {key: [10, 14]}
    assert len(_drop_acknowledged(offsets, inflight, {("b", "L"): 8})) == 4
    assert offsets[key] == [10, 14]
