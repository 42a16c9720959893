"""`gateway/amqp/wire.py` over real TCP sockets: writes without a scheduler round trip,
order kept when the kernel's buffer is full, reads that stay fair to other tasks."""

from __future__ import annotations

import trio
import trio.testing

from gateway.amqp.wire import Wire


class _Meter:
    bytes_out = 0


class _Steps(trio.abc.Instrument):
    """Counts the scheduler steps of one task."""

    def __init__(self, task: trio.lowlevel.Task) -> None:
        self.task = task
        self.steps = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task is self.task:
            self.steps += 1


async def _pair() -> tuple[trio.SocketStream, trio.SocketStream, trio.SocketListener]:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    client = await trio.open_tcp_stream("127.0.0.1", port)
    server = await listeners[0].accept()
    return server, client, listeners[0]


async def _read_exactly(stream: trio.SocketStream, n: int) -> bytes:
    got = bytearray()
    while len(got) < n:
        chunk = await stream.receive_some(65536)
        assert chunk, "closed early"
        got += chunk
    return bytes(got)


async def _test_flush_writes_what_the_kernel_takes_without_yielding() -> None:
    server, client, listener = await _pair()
    queued = [b"frame-1", b"frame-2"]
    meter = _Meter()
    wire = Wire(server, lambda: b"".join(queued), 65536, meter)
    steps = _Steps(trio.lowlevel.current_task())
    trio.lowlevel.add_instrument(steps)
    try:
        await wire.flush()
    finally:
        trio.lowlevel.remove_instrument(steps)
    assert steps.steps == 0  # trio's send_all would have been rescheduled once
    assert await _read_exactly(client, 14) == b"frame-1frame-2"
    assert meter.bytes_out == 14
    for s in (server, client, listener):
        await s.aclose()


async def _test_flushes_keep_their_order_when_the_socket_is_full() -> None:
    server, client, listener = await _pair()
    chunks = [bytes([i]) * (1 << 20) for i in range(8)]  # far more than socket buffers
    pending = list(chunks)
    wire = Wire(server, lambda: pending.pop(0) if pending else b"", 65536, _Meter())
    total = sum(map(len, chunks))
    got = b""

    async def reader() -> None:
        nonlocal got
        got = await _read_exactly(client, total)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader)
        for _ in chunks:  # each flush takes the next chunk: most must wait for the reader
            nursery.start_soon(wire.flush)
            await trio.lowlevel.checkpoint()
    assert got == b"".join(chunks)
    for s in (server, client, listener):
        await s.aclose()


async def _test_reads_of_a_full_socket_let_other_tasks_run() -> None:
    server, client, listener = await _pair()
    wire = Wire(server, lambda: b"", 1024, _Meter())
    await client.send_all(b"x" * 100_000)
    ran = 0

    async def other() -> None:
        nonlocal ran
        while True:
            ran += 1
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(other)
        await trio.lowlevel.checkpoint()
        before = ran
        got = 0
        for _ in range(50):
            got += len(await wire.receive())
        nursery.cancel_scope.cancel()
    assert got == 50 * 1024
    assert ran - before >= 40  # the other task ran between (nearly) every two reads
    for s in (server, client, listener):
        await s.aclose()


async def _test_receive_returns_end_of_stream_and_waits_cancellably() -> None:
    server, client, listener = await _pair()
    wire = Wire(server, lambda: b"", 1024, _Meter())
    with trio.move_on_after(0.05) as scope:
        await wire.receive()  # nothing sent: it waits
    assert scope.cancelled_caught
    await client.send_all(b"abc")
    assert await wire.receive() == b"abc"
    await client.aclose()
    assert await wire.receive() == b""
    for s in (server, listener):
        await s.aclose()


async def _test_other_streams_use_their_own_calls() -> None:
    # TLS (or any stream without a plain socket): the stream's send_all / receive_some.
    left, right = trio.testing.memory_stream_pair()
    queued = [b"abc"]
    wire = Wire(left, lambda: queued.pop() if queued else b"", 1024, _Meter())
    await wire.flush()
    assert await right.receive_some(10) == b"abc"
    await right.send_all(b"xyz")
    assert await wire.receive() == b"xyz"


def test_other_streams_use_their_own_calls() -> None:
    trio.run(_test_other_streams_use_their_own_calls)


def test_flush_writes_what_the_kernel_takes_without_yielding() -> None:
    trio.run(_test_flush_writes_what_the_kernel_takes_without_yielding)


def test_flushes_keep_their_order_when_the_socket_is_full() -> None:
    trio.run(_test_flushes_keep_their_order_when_the_socket_is_full)


def test_reads_of_a_full_socket_let_other_tasks_run() -> None:
    trio.run(_test_reads_of_a_full_socket_let_other_tasks_run)


def test_receive_returns_end_of_stream_and_waits_cancellably() -> None:
    trio.run(_test_receive_returns_end_of_stream_and_waits_cancellably)
