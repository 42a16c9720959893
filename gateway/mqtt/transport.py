"""Byte streams under MQTT: TLS comes from trio.SSLStream; WebSocket is adapted here.

MQTT over WebSocket (MQTT 5.0 §6): binary messages carry the MQTT byte stream (a
message may hold part of a packet or several), subprotocol "mqtt". The handshake and
frames are handled by the `websockets` library's sans-IO `ServerProtocol`; `WsStream`
gives the connection the same `receive_some` / `send_all` / `aclose` it gets from TCP.
"""

from __future__ import annotations

import logging
import ssl

import trio
from websockets.frames import Opcode
from websockets.http11 import Request
from websockets.server import ServerProtocol

__all__ = ["WsStream", "accept_websocket", "server_ssl_context"]

log = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT_S = 10.0
_DATA = (Opcode.BINARY, Opcode.CONT)


def server_ssl_context(certfile: str, keyfile: str) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(certfile, keyfile)
    return ctx


class WsStream:
    """A trio stream carrying MQTT in WebSocket binary messages."""

    def __init__(self, stream: trio.abc.Stream, proto: ServerProtocol) -> None:
        self.stream = stream
        self.proto = proto
        self._pending: list[bytes] = []
        self._lock = trio.StrictFIFOLock()
        self._eof = False

    async def _write_out(self) -> None:
        out = self.proto.data_to_send()
        if not out:
            return
        async with self._lock:
            for chunk in out:
                if chunk:
                    await self.stream.send_all(chunk)

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        proto = self.proto
        while not self._pending:
            if self._eof:
                return b""
            data = await self.stream.receive_some(65536)
            if not data:
                proto.receive_eof()
                self._eof = True
                return b""
            proto.receive_data(data)
            for ev in proto.events_received():
                if ev.opcode in _DATA:
                    if ev.data:
                        self._pending.append(bytes(ev.data))
                elif ev.opcode == Opcode.TEXT:
                    # MQTT-6.0.0-1: text frames are a reason to close.
                    proto.fail(1003, "MQTT needs binary frames")
                    self._eof = True
                elif ev.opcode == Opcode.CLOSE:
                    self._eof = True
            await self._write_out()
        if len(self._pending) == 1:
            return self._pending.pop()
        data = b"".join(self._pending)
        self._pending.clear()
        return data

    async def send_all(self, data: bytes) -> None:
        self.proto.send_binary(data)
        await self._write_out()

    async def aclose(self) -> None:
        try:
            if not self._eof:
                self.proto.send_close(1000)
                await self._write_out()
        except Exception:
            pass
        await self.stream.aclose()


async def accept_websocket(stream: trio.abc.Stream, path: str, max_size: int) -> WsStream | None:
    """Run the opening handshake; None (connection answered and closed) if it fails."""
    proto = ServerProtocol(subprotocols=["mqtt"], max_size=max_size,
                           select_subprotocol=_select_mqtt)
    request: Request | None = None
    with trio.move_on_after(HANDSHAKE_TIMEOUT_S):
        while request is None:
            data = await stream.receive_some(65536)
            if not data:
                return None
            proto.receive_data(data)
            for ev in proto.events_received():
                if isinstance(ev, Request):
                    request = ev
    if request is None:
        return None
    if path not in ("", "/") and request.path.split("?", 1)[0] != path:
        response = proto.reject(404, f"MQTT is served on {path}\n")
    else:
        response = proto.accept(request)
    proto.send_response(response)
    ws = WsStream(stream, proto)
    await ws._write_out()
    if response.status_code != 101:
        await stream.aclose()
        return None
    return ws


def _select_mqtt(proto: ServerProtocol, offered) -> str | None:
    # Clients that offer no subprotocol are served too (some browsers' libraries).
    return "mqtt" if "mqtt" in offered else None
