"""In-process transport: command objects handed straight to the peer's processor table.

A gateway running in the same process as its broker pays no sockets and no
serialization, yet goes through the same `ProcessorTable.process` path and the same
`Connection` interface as over TCP (docs/architecture.md §3). A pair of `LocalConnection`s
links a client (holding one end) and a server (whose handlers see the other end as
``ctx.connection``), so the server can push requests back to the client too.

Differences from TCP worth knowing:

* `invoke` runs the handler in the caller's task, whatever its ``inline`` setting; a
  timeout cancels the handler (over TCP the server would finish it and the late answer
  would be dropped). Handlers must be cancellation-safe anyway: server shutdown cancels.
* Bodies are passed by reference: a receiver must not mutate a body it did not create.
* A handler that never waits answers without a checkpoint, so `invoke` yields once after
  it (a task looping over in-process requests would otherwise starve the others), unless
  the calling task declared with `caller_yields()` that it yields between its requests
  itself: then the answer is used in the same turn (the MQTT broker link wakes a lone
  publish's readers without one more pass of the scheduler).
* That yield after a handler that never waited is also skipped when the calling task
  passed a schedule point since its previous in-process request ended (an AMQP
  connection's task waits for its socket between a publish's store request and the
  next): only back-to-back requests yield, so a loop over requests still lets others run.
  trio counts a task's schedule points for `trio.testing.assert_checkpoints`; that count
  is read here.
* The handler runs up to its first wait before the timeout is armed: one that answers at
  once (most do: a store put, a pop from memory) costs no cancel scope and no deadline in
  trio's timer heap (entering and leaving one was about 4 % of the MQTT gateway's CPU at
  1k msg/s). One that waits goes on under ``timeout`` from there, and has yielded, so no
  checkpoint is added after it. A handler that first waits inside a cancel scope or
  nursery of its own cannot be wrapped by a scope entered then (trio requires nesting):
  it runs to its end without the caller's timeout (its own scope bounds it), the wait
  for a deferred reply after it keeps the timeout.
"""

from __future__ import annotations

import itertools
import math
import types
from contextvars import ContextVar

import trio

from core.remoting.codec import RemotingCommand
from core.remoting.codes import FLAG_RESPONSE
from core.remoting.connection import Connection
from core.remoting.errors import RemotingConnectError
from core.remoting.processor import ProcessorTable

__all__ = ["LocalConnection", "caller_yields", "open_local_pair"]

# Pseudo source ports so each in-process peer has a distinct, parseable "ip:port".
_local_ports = itertools.count()

# True in a task that yields between its requests itself (caller_yields). A context
# variable: trio gives each task its own copy, so it holds for the declaring task (and
# tasks it starts afterwards) only.
_CALLER_YIELDS: ContextVar[bool] = ContextVar("lmq_local_caller_yields", default=False)

# (task, its schedule-point count) when its last in-process invoke ended: a task's first
# invoke, and one with no yield since its previous one, get the checkpoint (module doc).
_LAST_INVOKE: ContextVar[tuple[object, int] | None] = ContextVar("lmq_local_last_invoke", default=None)


def caller_yields() -> None:
    """Declare that the current task lets other tasks run between its in-process requests
    on its own: its `invoke`s skip the checkpoint after a handler that never waited (see
    the module doc). A task that loops over requests without yielding must not call it."""
    _CALLER_YIELDS.set(True)


class LocalConnection(Connection):
    """One end of an in-process connection; `peer` is the other end.

    `remote_table` is the processor table of the peer: requests sent through this end are
    processed there, with ``peer.context`` as their RequestContext.
    """

    def __init__(
        self,
        remote_addr: str,
        local_addr: str,
        remote_table: ProcessorTable,
        nursery: trio.Nursery,
    ) -> None:
        super().__init__(remote_addr, local_addr)
        self._remote_table = remote_table
        self._nursery = nursery
        self.peer: LocalConnection = self  # replaced by open_local_pair

    async def send(self, cmd: RemotingCommand) -> None:
        if self.closed:
            raise RemotingConnectError(f"connection to {self.remote_addr} is closed")
        if cmd.flag & FLAG_RESPONSE:
            self.peer._on_response(cmd)
        else:
            # A request sent without waiting (one-way, or answered through our pending
            # table): process it in its own task like a non-inline TCP request.
            self._nursery.start_soon(self._deliver, cmd)

    async def _deliver(self, cmd: RemotingCommand) -> None:
        response = await self._remote_table.process(self.peer.context, cmd)
        if response is not None and not self.closed:
            self._on_response(response)

    async def invoke(self, cmd: RemotingCommand, timeout: float | None = None) -> RemotingCommand:
        if self.closed:
            raise RemotingConnectError(f"connection to {self.remote_addr} is closed")
        if not _TASK_FIELDS:
            return await self._invoke_plain(cmd, timeout)
        opaque, pending = self._register_pending(cmd)
        waited = False
        try:
            # Run the handler to its first wait with no timeout armed (module doc).
            task = trio.lowlevel.current_task()
            status = task._cancel_status
            coro = self._remote_table.process(self.peer.context, cmd)
            try:
                trap = coro.send(None)
            except StopIteration as done:
                response = done.value
            else:
                waited = True
                response = None
                deadline = _deadline(timeout)
                if task._cancel_status is status:
                    with trio.move_on_at(deadline):
                        response = await _resume(coro, trap)
                else:  # waiting inside a scope of its own: ours cannot wrap it
                    response = await _resume(coro, trap)
            if response is None:
                # Timed out, or the handler answers later through ctx.connection.send.
                if not waited:
                    deadline = _deadline(timeout)
                with trio.move_on_at(deadline):
                    await pending.event.wait()
                response = self._pending_result(pending, timeout)
        finally:
            self._pending.pop(opaque, None)
        # A handler that never waited ran without a checkpoint; without this, a task
        # looping over in-process invokes would starve every other task (timers too),
        # unless that task yields between its requests itself (caller_yields), or has
        # passed a schedule point since its previous request (module doc).
        if not waited and not _CALLER_YIELDS.get():
            points = task._schedule_points
            last = _LAST_INVOKE.get()
            if last is None or last[0] is not task or last[1] == points:
                await trio.lowlevel.checkpoint()
                points = task._schedule_points
            _LAST_INVOKE.set((task, points))
        return response

    async def _invoke_plain(self, cmd: RemotingCommand,
                            timeout: float | None) -> RemotingCommand:
        """`invoke` without trio's task internals (a trio without the two fields read
        above): the timeout armed up front, a checkpoint after every instant answer."""
        opaque, pending = self._register_pending(cmd)
        response: RemotingCommand | None = None
        try:
            with trio.move_on_at(_deadline(timeout)):
                response = await self._remote_table.process(self.peer.context, cmd)
                if response is None:  # answered later through ctx.connection.send
                    await pending.event.wait()
            if response is None:
                response = self._pending_result(pending, timeout)
        finally:
            self._pending.pop(opaque, None)
        if not _CALLER_YIELDS.get():
            await trio.lowlevel.checkpoint()
        return response

    def close(self) -> None:
        """Close both ends; close callbacks run on both sides."""
        self._finish()
        self.peer._finish()


def open_local_pair(
    server_addr: str,
    server_table: ProcessorTable,
    client_table: ProcessorTable,
    nursery: trio.Nursery,
) -> LocalConnection:
    """Connect a client to the in-process server at `server_addr`; returns the client end.

    Requests through the returned end go to `server_table`; requests the server sends
    through ``ctx.connection`` go to `client_table`. One-way and fire-and-forget
    deliveries run in `nursery` (the client's).
    """
    client_addr = f"127.0.0.1:{next(_local_ports) % 65535 + 1}"
    client_end = LocalConnection(server_addr, client_addr, server_table, nursery)
    server_end = LocalConnection(client_addr, server_addr, client_table, nursery)
    client_end.peer = server_end
    server_end.peer = client_end
    return client_end


#: Whether this trio's tasks have the two private fields `invoke` reads (trio 0.35 has);
#: without them it takes `_invoke_plain`, which only costs more scheduler passes.
_TASK_FIELDS = all(hasattr(trio.lowlevel.Task, name)
                   for name in ("_cancel_status", "_schedule_points"))


def _deadline(timeout: float | None) -> float:
    return math.inf if timeout is None else trio.current_time() + timeout


@types.coroutine
def _resume(coro, trap):
    """Go on running `coro`, started and suspended on `trap`, in the awaiting task: each
    trap goes to trio, and trio's answer (or exception) back to `coro`."""
    try:
        while True:
            try:
                sent = yield trap
            except BaseException as exc:  # noqa: BLE001 - the handler's to handle
                trap = coro.throw(exc)
            else:
                trap = coro.send(sent)
    except StopIteration as done:
        return done.value
