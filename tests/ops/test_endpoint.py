"""The metrics HTTP endpoint against misbehaving peers, in-process (trio, real sockets)."""

from __future__ import annotations

import trio
import trio.testing

from lmq import metrics
from lmq.metrics import Exporter


async def _request(port: int, data: bytes) -> bytes:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(data)
        out = bytearray()
        while chunk := await stream.receive_some(65536):
            out += chunk
        return bytes(out)


def _run(test) -> None:
    async def main() -> None:
        exporter = Exporter("127.0.0.1", 0)
        async with trio.open_nursery() as nursery:
            await nursery.start(exporter.serve)
            await test(exporter)
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_oversized_head_gets_431_and_others_still_served():
    async def test(ex: Exporter) -> None:
        big = b"GET /metrics HTTP/1.0\r\nX: " + b"a" * (2 * metrics.MAX_REQUEST_BYTES)
        answer = await _request(ex.port, big + b"\r\n\r\n")
        assert answer.startswith(b"HTTP/1.0 431 ")
        answer = await _request(ex.port, b"GET /healthz HTTP/1.0\r\n\r\n")
        assert answer.startswith(b"HTTP/1.0 200 ") and answer.endswith(b"\r\n\r\nok\n")

    _run(test)


def test_silent_peer_is_closed_and_does_not_block_scrapes():
    async def test(ex: Exporter) -> None:
        silent = await trio.open_tcp_stream("127.0.0.1", ex.port)
        async with silent:
            await silent.send_all(b"GET /metr")  # never finishes its request
            answer = await _request(ex.port, b"GET /metrics HTTP/1.0\r\n\r\n")
            assert b"lmq_event_loop_lag_seconds" in answer
            with trio.fail_after(metrics.REQUEST_TIMEOUT_S * 3):
                assert await silent.receive_some(100) == b""  # closed after the deadline

    _run(test)


def test_post_is_refused():
    async def test(ex: Exporter) -> None:
        answer = await _request(ex.port, b"POST /metrics HTTP/1.0\r\n\r\n")
        assert answer.startswith(b"HTTP/1.0 405 ")

    _run(test)


class _FakeStore:
    def max_offset(self, topic: str, queue_id: int) -> int:
        return 100


class _FakeBroker:
    """Only what the lag collector reads."""

    def __init__(self, groups: int) -> None:
        self.store = _FakeStore()
        self.offset_manager = type("O", (), {})()
        self.offset_manager.table = {f"T@G{i}": {0: 40, 1: 100} for i in range(groups)}


def test_lag_series_are_capped():
    from lmq.metrics import broker_lag_metrics

    families = list(broker_lag_metrics(_FakeBroker(groups=50), max_series=7))
    lag, dropped = families
    assert len(lag.samples) == 7
    assert dropped.samples[0].value == 100 - 7
    assert {s.value for s in lag.samples} <= {60, 0}
