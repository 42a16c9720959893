"""Storing a connection's publishes and sending their confirms (a mixin of
`AmqpSession`, gateway/amqp/session.py; docs/amqp.md, "Exchanges, queues, publish" and
"The publish path in one call").

Publishes received and not yet stored wait in `_pubs` as (stored properties, body,
confirm entry, channel, channel state). One task at a time stores them (`_storing`), a
batch per store request, in publish order: the connection's own task right after the
read that brought them when that read drained the socket (`store_queued`: a publisher
waiting for each confirm costs one scheduler pass per message), else a task in the
broker's nursery, which takes what arrives meanwhile too. Confirms go out in publish
order, a run of acks as one Basic.Ack with `multiple`.
"""

from __future__ import annotations

import logging
import struct
from typing import Any

import trio

from gateway.amqp import errors
from gateway.amqp.broker import MAX_BATCH_BYTES
from gateway.amqp.codec import FRAME_END, FRAME_METHOD
from gateway.amqp.errors import AmqpError
from gateway.amqp.methods import BasicAck, BasicNack

__all__ = ["PublishStore"]

log = logging.getLogger("gateway.amqp.session")

#: A confirm's Basic.Ack method frame in one pack: frame type, channel, payload size,
#: class and method ids, delivery tag, the `multiple` bit, frame end (the method table's
#: encoder costs about ten times as much: a pika publisher waits for one per message).
_ACK_FRAME = struct.Struct(">BHIHHQBB")
_ACK_SIZE = _ACK_FRAME.size - 8  # the payload: less the frame's head (7) and end (1)
_ACK_IDS = (BasicAck.CLASS_ID, BasicAck.METHOD_ID)


def ack_frame(channel: int, tag: int) -> bytes:
    """The frame of Basic.Ack(`tag`, multiple=True) on `channel` (what
    `encode_method_frame` gives for it)."""
    return _ACK_FRAME.pack(FRAME_METHOD, channel, _ACK_SIZE, *_ACK_IDS, tag, 1, FRAME_END)


class PublishStore:
    """Publish storing and confirms of `AmqpSession` (which provides `broker`, `conn`,
    `channels`, `id` and `flush`)."""

    def _init_store(self) -> None:
        self._pubs: list[tuple] = []
        self._pub_bytes = 0
        self._pub_space = trio.Event()  # set (and replaced) when a batch is stored
        self._storing = False
        self._ended = False
        self._stores_done = trio.Event()

    async def store_queued(self, inline: bool) -> None:
        """After a read's events: store what `publish_now` queued. `inline` (the read
        drained the socket: nothing more is waiting to be read; and no writer waits for
        the socket, which would hold this task up) stores it in this task,
        so a lone publish is read, stored and confirmed in one scheduler pass (a pika
        publisher waits for each confirm); else a store task takes it, and the next
        read overlaps its store (a busy publisher's batches grow)."""
        self._last_route = None  # (AmqpSession.publish_now's) this task may await now
        if not self._pubs or self._storing:
            return
        if inline or self.broker.nursery is None:
            self._begin_storing()
            await self._store_deferring()
        else:
            self._start_storing()

    async def _enqueue(self, pubs: list[tuple]) -> None:
        """Hand publishes to a store task (started on demand); back-pressure."""
        self._queue_pubs(pubs)
        while self._pub_bytes > self.broker.config.max_publish_backlog_bytes:
            await self._pub_space.wait()  # back-pressure: stop reading this socket

    def _queue_pubs(self, pubs: list[tuple], start: bool = True) -> None:
        """Queue publishes for storing; `start`: have a store task take them now (else
        the reader's `store_queued`, or its next `handle`, sees to them)."""
        for pub in pubs:
            self._pubs.append(pub)
            self._pub_bytes += len(pub[0]) + len(pub[1])
        if start:
            self._start_storing()

    def _begin_storing(self) -> None:
        self._storing = True
        self._stores_done = trio.Event()

    def _start_storing(self) -> None:
        """A store task takes the queued publishes (started unless one runs)."""
        if self._storing:
            return
        nursery = self.broker.nursery
        if nursery is None:
            raise AmqpError(errors.INTERNAL_ERROR, "INTERNAL_ERROR - broker side not running")
        self._begin_storing()
        nursery.start_soon(self._store_deferring)

    def _confirm(self, channel: int, state: Any) -> None:
        """Send the confirms of `channel` that are settled, in publish order (a run of
        acks as one Basic.Ack with multiple)."""
        if self.channels.get(channel) is not state:
            return  # the channel closed since: its confirms are moot
        confirms = state.confirms
        last_ack = 0
        while confirms and confirms[0][1] is not None:
            tag, ok = confirms.popleft()
            if ok:
                last_ack = tag
                continue
            if last_ack:
                self.conn.send_raw(ack_frame(channel, last_ack))
                last_ack = 0
            self.conn.send(channel, BasicNack(tag, False, False))
        if last_ack:
            self.conn.send_raw(ack_frame(channel, last_ack))

    async def _store_deferring(self) -> None:
        """`_store` as a deferral window of the broker in this process: consumers parked
        on the queues it fills get their deliveries once its confirms are written
        (docs/amqp.md "Delivery at arrival")."""
        local = self.broker.local_pop
        await (self._store() if local is None else local.deferring(self._store()))

    async def _store(self) -> None:
        """Store this connection's publishes in order, one batch at a time, until none is
        queued (`_storing` is set by the caller: one task at a time does this). Run by the
        reader's task (`store_queued`, `ended`) or as a task of the broker's nursery, which
        publishes queued meanwhile keep going (a batch accumulates while one is on the
        wire). All of a connection's publishes go to one store queue, so they reach every
        queue in the order they were published."""
        broker = self.broker
        qid = self.id % broker.config.store_queues
        try:
            while self._pubs:
                size = self._pub_bytes  # (all queued: no other batch is on the wire)
                if size <= MAX_BATCH_BYTES:
                    batch, self._pubs = self._pubs, []
                else:
                    size = n = 0
                    for pb, body, *_ in self._pubs:
                        if n and size + len(pb) + len(body) > MAX_BATCH_BYTES:
                            break
                        size += len(pb) + len(body)
                        n += 1
                    batch, self._pubs = self._pubs[:n], self._pubs[n:]
                ok = await broker.store_batch(qid, batch)
                if ok is None:
                    # The broker refused the batch as a whole (e.g. one message too big):
                    # store them one by one so only the culprits are nacked.
                    results = [await broker.store_batch(qid, [pub]) for pub in batch]
                else:
                    results = None
                self._pub_bytes -= size
                self._pub_space.set()
                self._pub_space = trio.Event()
                touched = {}
                for i, (_, _, entry, channel, state) in enumerate(batch):
                    if entry is not None:
                        # A third item: a reject-publish queue refused it (Basic.Nack).
                        stored = ok if results is None else results[i]
                        entry[1] = bool(stored) and len(entry) == 2
                        touched[channel] = state
                for channel, state in touched.items():
                    self._confirm(channel, state)
                if touched:
                    try:
                        await self.flush()
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        pass
        except Exception:
            # A bug here must not take the gateway down (this may run in the broker's
            # nursery): nack what is waiting and let the connection go on.
            log.exception("AMQP store of publishes failed")
            pending, self._pubs, self._pub_bytes = self._pubs, [], 0
            for _, _, entry, channel, state in pending:
                if entry is not None:
                    entry[1] = False
                    self._confirm(channel, state)
            self._pub_space.set()
        finally:
            self._storing = False
            self._stores_done.set()
