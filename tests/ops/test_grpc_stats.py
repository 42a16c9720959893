"""gateway/grpc5/stats.py's call counting on its own: codes of unary calls and streams,
failures before a status, and the gauges a cancelled long poll or stream leaves behind."""

from __future__ import annotations

import asyncio

import pytest

from gateway.grpc5.proto import messaging_pb2 as pb
from gateway.grpc5.stats import METHODS, GrpcStats, counted


class _Servicer:
    def __init__(self) -> None:
        self.poll = asyncio.Event()


def _make():
    servicer = _Servicer()

    async def unary(request, context):
        if request == "boom":
            raise RuntimeError("boom")
        resp = pb.HeartbeatResponse()
        resp.status.code = pb.OK if request == "ok" else pb.BAD_REQUEST
        return resp

    async def receive(request, context):
        await servicer.poll.wait()  # a long poll
        yield pb.ReceiveMessageResponse(status=pb.Status(code=pb.MESSAGE_NOT_FOUND))

    async def telemetry(requests, context):
        await asyncio.sleep(3600)
        yield pb.TelemetryCommand()

    for name, (_, streaming) in METHODS.items():
        setattr(servicer, name, unary if not streaming else
                receive if name == "ReceiveMessage" else telemetry)
    stats = GrpcStats()
    return servicer, stats, counted(servicer, stats)


def test_unary_codes_and_failures():
    _, stats, c = _make()

    async def main():
        await c.Heartbeat("ok", None)
        await c.Heartbeat("bad", None)
        with pytest.raises(RuntimeError):
            await c.Heartbeat("boom", None)

    asyncio.run(main())
    assert stats.requests == {("Heartbeat", "OK"): 1, ("Heartbeat", "BAD_REQUEST"): 1,
                              ("Heartbeat", "error"): 1}


def test_streams_count_waiting_and_open_until_they_end():
    servicer, stats, c = _make()

    async def drain(agen):
        return [item async for item in agen]

    async def main():
        poll = asyncio.ensure_future(drain(c.ReceiveMessage(None, None)))
        cancelled = asyncio.ensure_future(drain(c.ReceiveMessage(None, None)))
        stream = asyncio.ensure_future(drain(c.Telemetry(None, None)))
        for _ in range(3):  # let the three calls start and block
            await asyncio.sleep(0)
        assert stats.receives_waiting == 2 and stats.telemetry_streams == 1
        cancelled.cancel()  # the client went away during its long poll
        stream.cancel()
        servicer.poll.set()
        frames = await poll
        assert frames[0].status.code == pb.MESSAGE_NOT_FOUND
        for task in (cancelled, stream):
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(main())
    assert stats.receives_waiting == 0 and stats.telemetry_streams == 0
    assert stats.requests == {("ReceiveMessage", "MESSAGE_NOT_FOUND"): 1,
                              ("ReceiveMessage", "error"): 1, ("Telemetry", "error"): 1}
