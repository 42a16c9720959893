"""Counters of the gRPC front end, for `/metrics` (docs/operations.md "gRPC front end").

`counted(servicer, stats)` returns an object with the servicer's RPC methods wrapped: each
call adds one to `requests[(method, code)]`, `code` being the name of the RocketMQ status
code the call answered with (`OK`, `MESSAGE_NOT_FOUND`, ...; for a stream, the first status
it sent; `error` when it raised before sending one). Both label sets are finite (the
service's methods, the `Code` enum). The servicer itself adds the messages SendMessage
stored and ReceiveMessage delivered, and their body bytes, where it holds the bodies as
Python bytes (reading a protobuf bytes field copies it). Everything runs on the gRPC
thread only (plain int and dict updates, no locks, no logging); the exporter reads them from the trio thread, where reading an int or
copying a dict is atomic under the GIL.
"""

from __future__ import annotations

from gateway.grpc5.proto import messaging_pb2 as pb

__all__ = ["GrpcStats", "counted", "METHODS"]

#: The MessagingService RPCs: name -> client-streaming, server-streaming.
METHODS = {m.name: (m.client_streaming, m.server_streaming)
           for m in pb.DESCRIPTOR.services_by_name["MessagingService"].methods}
_CODES = {number: name for name, number in pb.Code.items()}


def _code(number: int) -> str:
    return _CODES.get(number, "CODE_UNSPECIFIED")


class GrpcStats:
    def __init__(self) -> None:
        self.requests: dict[tuple[str, str], int] = {}
        self.msgs_in = 0
        self.bytes_in = 0
        self.msgs_out = 0
        self.bytes_out = 0
        self.receives_waiting = 0  # ReceiveMessage calls not yet answered (long polling)
        self.telemetry_streams = 0  # open Telemetry streams

    def count(self, method: str, code: str) -> None:
        key = (method, code)
        self.requests[key] = self.requests.get(key, 0) + 1


class _Counted:
    """Stands in for the servicer in `add_MessagingServiceServicer_to_server`."""


def counted(servicer, stats: GrpcStats) -> _Counted:
    out = _Counted()
    for name, (_, server_streaming) in METHODS.items():
        fn = getattr(servicer, name)
        wrap = _stream if server_streaming else _unary
        setattr(out, name, wrap(name, fn, stats))
    return out


def _unary(name: str, fn, stats: GrpcStats):
    async def call(request, context):
        try:
            resp = await fn(request, context)
        except BaseException:
            stats.count(name, "error")
            raise
        stats.count(name, _code(resp.status.code))
        return resp

    return call


def _stream(name: str, fn, stats: GrpcStats):
    receiving = name == "ReceiveMessage"
    telemetry = name == "Telemetry"

    async def call(request, context):
        agen = fn(request, context)
        code: str | None = None
        waiting = receiving
        if receiving:
            stats.receives_waiting += 1
        if telemetry:
            stats.telemetry_streams += 1
        try:
            async for out in agen:
                if waiting:
                    waiting = False
                    stats.receives_waiting -= 1
                if code is None and out.HasField("status"):
                    code = _code(out.status.code)
                yield out
        except BaseException:
            if code is None:
                code = "error"
            raise
        finally:
            if waiting:
                stats.receives_waiting -= 1
            if telemetry:
                stats.telemetry_streams -= 1
            stats.count(name, code or "OK")
            await agen.aclose()

    return call
