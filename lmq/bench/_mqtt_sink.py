"""The "do-nothing" MQTT server of `lmq bench mqtt`: what the load generator reaches
against it is the generator's own ceiling.

It answers CONNECT with CONNACK, SUBSCRIBE with SUBACK, a QoS 1 PUBLISH with PUBACK,
and otherwise discards what it reads; after a SUBSCRIBE it streams pre-encoded QoS 0
PUBLISHes to that connection as fast as the socket takes them (the subscriber ceiling).
No routing, no storage: every figure measured against it is bounded by the generator.
Runs in a process of its own (`sink_main`), on 127.0.0.1.
"""

from __future__ import annotations

import socket

import trio

from gateway.mqtt.codec import MqttCodec
from gateway.mqtt.packets import Publish

__all__ = ["sink_main"]

_CONNACK = b"\x20\x02\x00\x00"
_FIREHOSE_BATCH = 256


def _firehose_batch(size: int) -> bytes:
    codec = MqttCodec(role="client", protocol_version=4)
    return codec.encode(Publish("ceiling/firehose", bytes(size))) * _FIREHOSE_BATCH


async def _firehose(stream: trio.SocketStream, batch: bytes) -> None:
    try:
        while True:
            await stream.send_all(batch)
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass


async def _handle(stream: trio.SocketStream, batch: bytes) -> None:
    stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = b""
    streaming = False
    try:
        async with trio.open_nursery() as nursery:
            while True:
                data = await stream.receive_some(1 << 18)
                if not data:
                    nursery.cancel_scope.cancel()
                    break
                data = buf + data if buf else data
                out: list[bytes] = []
                n = len(data)
                pos = 0
                while pos + 2 <= n:
                    b0 = data[pos]
                    length = 0
                    shift = 0
                    p = pos + 1
                    while p < n:
                        b = data[p]
                        p += 1
                        length |= (b & 0x7F) << shift
                        if not b & 0x80:
                            break
                        shift += 7
                    else:
                        break
                    end = p + length
                    if end > n:
                        break
                    kind = b0 >> 4
                    if kind == 3 and b0 & 0x06:  # QoS 1/2 PUBLISH: ack its packet id
                        q = p + 2 + ((data[p] << 8) | data[p + 1])
                        out.append(b"\x40\x02" + data[q:q + 2])
                    elif kind == 1:
                        out.append(_CONNACK)
                    elif kind == 8 and not streaming:
                        # SUBACK first; from then on only the firehose writes (one writer).
                        out.append(b"\x90\x03" + data[p:p + 2] + b"\x00")
                        await stream.send_all(b"".join(out))
                        out = []
                        streaming = True
                        nursery.start_soon(_firehose, stream, batch)
                    elif kind == 14:
                        nursery.cancel_scope.cancel()
                        return
                    pos = end
                buf = data[pos:]
                if out and not streaming:
                    await stream.send_all(b"".join(out))
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass
    finally:
        await stream.aclose()


async def _serve(port_cell, size: int) -> None:
    batch = _firehose_batch(size)
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port_cell.value = listeners[0].socket.getsockname()[1]

    async def handler(stream: trio.SocketStream) -> None:
        await _handle(stream, batch)

    await trio.serve_listeners(handler, listeners)


def sink_main(port_cell, size: int) -> None:
    """Process entry point: serve until killed; the bound port is put in `port_cell`."""
    trio.run(_serve, port_cell, size)
