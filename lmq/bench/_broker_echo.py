"""Trivial servers that `lmq bench broker` measures its baselines against.

* ``remoting`` — our `RemotingServer` with a processor table whose one (inline) handler
  answers every request at once with a send-shaped response. Its round trips per second
  are the transport ceiling: decode, dispatch, encode, socket, and nothing else. Every
  broker figure is printed as a ratio to it.
* ``raw`` — no remoting layer at all: frames are cut by their length prefix and answered
  with a canned frame carrying the request's opaque. Nothing can answer faster in Python,
  so its rate is the load generator's own ceiling.

Run as a child process, as the broker is, so the generator and the server each have their
own interpreter (and core)::

    python -m lmq.bench._broker_echo --mode remoting --port 0     # prints "PORT <n>" when ready

The process ends when its stdin closes (the bench exits or dies) or on SIGTERM.
"""

from __future__ import annotations

import argparse
import socket
import struct
import sys

import trio

from core.remoting.codec import RemotingCommand, encode_command_bytes
from core.remoting.processor import ProcessorTable, RequestContext
from core.remoting.server import RemotingServer

__all__ = ["echo_table", "main", "serve_raw"]

_INT = struct.Struct(">i")
_PREFIX = struct.Struct(">iI")

# What a send response carries (docs/protocol.md §5.1), so the echo answer costs what the
# broker's answer costs to encode and decode.
_SEND_EXT = {
    "msgId": "7F00000100002A9F0000000000000000",
    "queueId": "0",
    "queueOffset": "0",
    "MSG_REGION": "DefaultRegion",
    "TRACE_ON": "true",
}


async def _echo(ctx: RequestContext, cmd: RemotingCommand) -> RemotingCommand:
    return cmd.make_response(0, None, _SEND_EXT)


def echo_table() -> ProcessorTable:
    """A table answering every request code with a constant send-shaped response."""
    table = ProcessorTable()
    table.register_default(_echo, inline=True)
    return table


# ---------------------------------------------------------------------------- raw server

_OPAQUE_KEY = b'"opaque":'
_SENTINEL = 1_987_654_321


def _canned_parts() -> tuple[bytes, bytes]:
    # A real encoded response split around its opaque digits.
    frame = encode_command_bytes(RemotingCommand(0, flag=1, opaque=_SENTINEL, ext_fields=_SEND_EXT))
    header = frame[8:]
    head, tail = header.split(str(_SENTINEL).encode(), 1)
    return head, tail


async def _serve_raw_conn(stream: trio.SocketStream) -> None:
    stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    head, tail = _canned_parts()
    fixed = len(head) + len(tail)
    buf = bytearray()
    out: list[bytes] = []
    try:
        while True:
            data = await stream.receive_some(256 * 1024)
            if not data:
                return
            buf += data
            pos = 0
            n = len(buf)
            while n - pos >= 8:
                (total,) = _INT.unpack_from(buf, pos)
                end = pos + 4 + total
                if total < 4 or end > n:
                    if total < 4:
                        return
                    break
                hlen = _INT.unpack_from(buf, pos + 4)[0] & 0xFFFFFF
                hstart = pos + 8
                i = buf.find(_OPAQUE_KEY, hstart, hstart + hlen) + len(_OPAQUE_KEY)
                j = i
                while buf[j] in b"-0123456789":
                    j += 1
                opaque = bytes(buf[i:j])
                hl = fixed + len(opaque)
                out.append(_PREFIX.pack(4 + hl, hl) + head + opaque + tail)
                pos = end
            if pos:
                del buf[:pos]
            if out:
                await stream.send_all(b"".join(out))
                out.clear()
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        return


async def serve_raw(port: int, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Serve canned responses on 127.0.0.1:`port`; reports the bound port."""
    listeners = await trio.open_tcp_listeners(port, host="127.0.0.1")
    task_status.started(listeners[0].socket.getsockname()[1])
    await trio.serve_listeners(_serve_raw_conn, listeners)


async def _serve_remoting(port: int, task_status=trio.TASK_STATUS_IGNORED) -> None:
    server = RemotingServer(echo_table(), "127.0.0.1", port)
    await server.listen()
    task_status.started(server.port)
    await server.serve()


async def _main(mode: str, port: int) -> None:
    async with trio.open_nursery() as nursery:
        serve = serve_raw if mode == "raw" else _serve_remoting
        bound = await nursery.start(serve, port)
        print(f"PORT {bound}", flush=True)
        # Parent gone (stdin closed) -> exit; nothing may outlive the bench.
        await trio.to_thread.run_sync(sys.stdin.buffer.read, abandon_on_cancel=True)
        nursery.cancel_scope.cancel()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lmq.bench._broker_echo")
    parser.add_argument("--mode", choices=("remoting", "raw"), default="remoting")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        trio.run(_main, args.mode, args.port)
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
