"""POP journal P and B records (docs/pop.md "Durability"): the first deliveries of one pop
and the acks of one BATCH_ACK entry are one journal line each, and replay gives back the
per-message records."""

from __future__ import annotations

from core.broker.pop.journal import PopJournal
from tests.core.broker.harness import run_embedded, send_request


def journal_lines(server) -> list[str]:
    path = server.broker.pop_service.journal.path
    with open(path, "rb") as f:
        return [line.decode().rsplit(" ", 1)[0] for line in f.read().splitlines()]


def test_one_line_per_pop_and_per_batch_ack_entry(tmp_path):
    from core.client.pop_consumer import PopClient

    async def body(server, client):
        b = server.broker
        for i in range(5):
            resp = await client.invoke(b.broker_addr, send_request("JB", f"m{i}".encode()))
            assert resp.code == 0, resp.remark
        pc = PopClient(client, b.broker_addr, b.config.broker_name, "GID_JB")
        r = await pc.pop("JB", queue_id=0, max_nums=5, invisible_ms=60_000)
        assert len(r.messages) == 5
        hands = [ln for ln in journal_lines(server) if ln[0] in "HP"]
        assert hands == [f"P GID_JB JB 0 {r.pop_time} {r.pop_time + 60_000} 1 - 0,1,2,3,4"]
        await pc.batch_ack(r.messages[1:4])
        gone = [ln for ln in journal_lines(server) if ln[0] in "AB"]
        assert gone == ["B GID_JB JB 0 1,2,3"]

    run_embedded(body, tmp_path)


def test_replay_expands_and_stops_at_a_bad_line(tmp_path):
    j = PopJournal(str(tmp_path))
    j.open()
    j.hand_many("g", "t", 2, [7, 8, 9], 100, 200, 1, "gw")
    j.gone_many("g", "t", 2, [8, 9])
    j.flush()
    assert list(j.replay()) == [
        ("H", "g", "t", 2, 7, 100, 200, 1, "gw"), ("H", "g", "t", 2, 8, 100, 200, 1, "gw"),
        ("H", "g", "t", 2, 9, 100, 200, 1, "gw"), ("A", "g", "t", 2, 8),
        ("A", "g", "t", 2, 9)]
    j._pending.append(b"B g t 2 1,x 00000000\n")  # a bad CRC and offset: replay ends there
    j.gone("g", "t", 2, 7)
    j.flush()
    j.close()
    assert len(list(PopJournal(str(tmp_path)).replay())) == 5
