"""`apache.rocketmq.v2.MessagingService` on the gRPC (asyncio) thread: requests are
checked and converted here, the broker work hops to the trio loop (`Backend`), and the
answers carry the status codes Apache's proxy sends (docs/grpc.md "RPCs").
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import grpc

from core.acl.permissions import ANY, PUB, SUB
from gateway.grpc5.auth import GrpcAuth, group_resource
from gateway.grpc5.backend import Backend, Handle, client_handle, parse_handle, transaction_id
from gateway.grpc5.bridge import TrioHop
from gateway.grpc5.config import GrpcConfig
from gateway.grpc5.convert import GrpcError, from_grpc, to_grpc, wrap
from gateway.grpc5.lite import LiteSubscriptions, lmq_name
from gateway.grpc5.mqtt_out import prepare as mqtt_prepare
from gateway.grpc5.proto import messaging_pb2 as pb
from gateway.grpc5.proto import messaging_pb2_grpc as pbg
from gateway.grpc5.stats import GrpcStats

__all__ = ["MessagingServicer"]

log = logging.getLogger(__name__)

#: Every topic accepts every type (there are no typed topics here); LITE for lite parents.
_ALL_TYPES = (pb.NORMAL, pb.FIFO, pb.DELAY, pb.TRANSACTION, pb.LITE)
#: Producer retry policy sent in Settings (the proxy's: 3 attempts, 10 ms doubling to 1 s).
_PRODUCER_ATTEMPTS = 3
#: Consumer redelivery backoff: the broker's delay levels from the first retry on (the
#: proxy's customized backoff for concurrent consumers); attempts = 16 retries + 1.
_CONSUMER_BACKOFF_S = (1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600,
                       1200, 1800, 3600, 7200)
_CONSUMER_ATTEMPTS = 17
#: Commands waiting for one Telemetry stream (a client that sends Settings without
#: reading the replies, or pushes nobody takes); beyond, the stream is ended (the client
#: opens a new one) and transaction checks are dropped (the broker checks again later).
_TELEMETRY_QUEUE = 64


@dataclass(slots=True)
class _Client:
    """A client known by its Telemetry stream (x-mq-client-id)."""

    queue: asyncio.Queue
    namespace: str = ""
    settings: pb.Settings | None = None
    topics: set[str] = field(default_factory=set)


def _meta(context: grpc.aio.ServicerContext) -> dict[str, str]:
    return {k: v for k, v in (context.invocation_metadata() or ()) if isinstance(v, str)}


def _ms(duration) -> int:
    return duration.seconds * 1000 + duration.nanos // 1_000_000


class MessagingServicer(pbg.MessagingServiceServicer):
    def __init__(self, hop: TrioHop, backend: Backend, config: GrpcConfig) -> None:
        self.hop = hop
        self.backend = backend
        self.config = config
        self.clients: dict[str, _Client] = {}
        self.lite = LiteSubscriptions(config.lite_subscription_quota,
                                      config.max_lite_topic_size, config.max_clients)
        #: The ACL check of every call (None: ACL off).
        self.auth: GrpcAuth | None = None
        #: The bound port (config.port may be 0), set once the server listens.
        self.port = config.port
        self.loop: asyncio.AbstractEventLoop | None = None
        #: Message counters for /metrics (the calls are counted by stats.counted).
        self.stats = GrpcStats()

    # ------------------------------------------------------------------ helpers
    def _endpoints(self, asked: pb.Endpoints | None, context) -> pb.Endpoints:
        """Where clients reach us: the advertised host, else the access point they used."""
        out = pb.Endpoints()
        host = self.config.advertise_host
        if host:
            out.scheme = pb.IPv4 if host.replace(".", "").isdigit() else pb.DOMAIN_NAME
            out.addresses.add(host=host, port=self.port)
        elif asked is not None and asked.addresses:
            out.CopyFrom(asked)
        else:
            out.scheme = pb.IPv4
            out.addresses.add(host=self.config.host if self.config.host not in
                              ("0.0.0.0", "::", "") else "127.0.0.1",
                              port=self.port)
        return out

    def _authorize(self, context, *resources: tuple[str, int]) -> None:
        if self.auth is not None:
            self.auth.check(_meta(context), context.peer() or "", resources)

    def _sub(self, context, topic: str, group: str) -> None:
        self._authorize(context, (topic, SUB), (group_resource(group), SUB))

    @staticmethod
    def _names(request) -> tuple[str, str]:
        """The request's (group, topic), namespaced."""
        return (wrap(request.group.resource_namespace, request.group.name),
                wrap(request.topic.resource_namespace, request.topic.name))

    def _handle_of(self, request, context) -> tuple[str, str, Handle]:
        """(group, topic, receipt handle) of a call on one received message, once the
        caller may consume them."""
        group, topic = self._names(request)
        self._sub(context, topic, group)
        return group, topic, parse_handle(request.receipt_handle)

    def _lmq(self, topic: str, request) -> str:
        """The topic a handle belongs to: the lite topic's LMQ when one is named."""
        if request.HasField("lite_topic") and request.lite_topic:
            from gateway.grpc5.lite import check_lite_topic

            return lmq_name(topic, check_lite_topic(request.lite_topic,
                                                    self.config.max_lite_topic_size))
        return topic

    @staticmethod
    def _ok(resp):
        resp.status.code = pb.OK
        resp.status.message = "OK"
        return resp

    @staticmethod
    def _fail(resp, err: GrpcError):
        resp.status.code = err.code
        resp.status.message = err.message
        return resp

    async def _call(self, afn, *args, **kwargs):
        try:
            if kwargs:
                afn = functools.partial(afn, **kwargs)
            return await self.hop.call(afn, *args)
        except GrpcError:
            raise
        except Exception as exc:
            from gateway.grpc5.backend import status_of

            raise status_of(exc) from exc

    # ------------------------------------------------------------------ routes
    async def _route(self, request, context, topic: str, *rights: tuple[str, int]):
        """(the topic's brokers, the endpoints a reply names), once the caller holds
        `rights`."""
        self._authorize(context, *rights)
        brokers = await self._call(self.backend.route, topic)
        return brokers, self._endpoints(request.endpoints if request.HasField("endpoints")
                                        else None, context)

    async def QueryRoute(self, request, context):
        resp = pb.QueryRouteResponse()
        try:
            topic = wrap(request.topic.resource_namespace, request.topic.name)
            if not request.topic.name:
                raise GrpcError(pb.ILLEGAL_TOPIC, "topic is empty")
            brokers, endpoints = await self._route(request, context, topic, (topic, ANY))
        except GrpcError as err:
            return self._fail(resp, err)
        for b in brokers:
            for qid in range(max(b.read, b.write)):
                readable = qid < b.read and b.perm & 4
                writable = qid < b.write and b.perm & 2
                perm = (pb.READ_WRITE if readable and writable else pb.READ if readable
                        else pb.WRITE if writable else pb.NONE)
                mq = resp.message_queues.add(id=qid, permission=perm)
                mq.topic.CopyFrom(request.topic)
                mq.broker.name = b.name
                mq.broker.id = 0
                mq.broker.endpoints.CopyFrom(endpoints)
                mq.accept_message_types.extend(_ALL_TYPES)
        return self._ok(resp)

    async def QueryAssignment(self, request, context):
        resp = pb.QueryAssignmentResponse()
        try:
            group, topic = self._names(request)
            brokers, endpoints = await self._route(request, context, topic, (topic, SUB),
                                                   (group_resource(group), SUB))
        except GrpcError as err:
            return self._fail(resp, err)
        for b in brokers:
            if b.read > 0 and b.perm & 4:
                mq = resp.assignments.add().message_queue
                mq.topic.CopyFrom(request.topic)
                mq.id = -1  # every queue of the broker: the proxy's POP over all queues
                mq.permission = pb.READ
                mq.broker.name = b.name
                mq.broker.endpoints.CopyFrom(endpoints)
                mq.accept_message_types.extend(_ALL_TYPES)
        return self._ok(resp)

    # ------------------------------------------------------------------ clients
    async def Heartbeat(self, request, context):
        try:
            self._authorize(context)
        except GrpcError as err:
            return self._fail(pb.HeartbeatResponse(), err)
        return self._ok(pb.HeartbeatResponse())

    async def NotifyClientTermination(self, request, context):
        client_id = _meta(context).get("x-mq-client-id", "")
        self.clients.pop(client_id, None)
        self.lite.forget(client_id)
        return self._ok(pb.NotifyClientTerminationResponse())

    async def _fifo(self, asked: pb.Settings) -> bool:
        """Whether the consumer's group is a FIFO group (its subscription-group config)."""
        if not asked.HasField("subscription") or not asked.subscription.HasField("group"):
            return False
        sub = asked.subscription
        topics = [wrap(e.topic.resource_namespace, e.topic.name) for e in sub.subscriptions]
        try:
            return await self._call(self.backend.group_fifo,
                                    wrap(sub.group.resource_namespace, sub.group.name), topics)
        except GrpcError:
            return False

    def _settings_reply(self, asked: pb.Settings, fifo: bool = False) -> pb.TelemetryCommand:
        out = pb.TelemetryCommand()
        s = out.settings
        s.CopyFrom(asked)
        if asked.client_type == pb.PRODUCER or asked.HasField("publishing"):
            s.publishing.max_body_size = self.config.max_body_size
            s.publishing.validate_message_type = True
            s.backoff_policy.max_attempts = _PRODUCER_ATTEMPTS
            exp = s.backoff_policy.exponential_backoff
            exp.initial.FromMilliseconds(10)
            exp.max.FromMilliseconds(1000)
            exp.multiplier = 2.0
        else:
            sub = s.subscription
            sub.long_polling_timeout.FromMilliseconds(
                int(self.config.long_polling_timeout_s * 1000))
            sub.receive_batch_size = self.config.max_receive_batch
            sub.fifo = fifo  # the group's, as the proxy: FIFO groups consume in order
            sub.lite_subscription_quota = self.config.lite_subscription_quota
            sub.max_lite_topic_size = self.config.max_lite_topic_size
            s.backoff_policy.max_attempts = _CONSUMER_ATTEMPTS
            custom = s.backoff_policy.customized_backoff
            for secs in _CONSUMER_BACKOFF_S:
                custom.next.add(seconds=secs)
        out.status.code = pb.OK
        out.status.message = "OK"
        return out

    async def Telemetry(self, request_iterator, context) -> AsyncIterator[pb.TelemetryCommand]:
        client_id = _meta(context).get("x-mq-client-id", "")
        if not client_id:
            bad = pb.TelemetryCommand()
            self._fail(bad, GrpcError(pb.CLIENT_ID_REQUIRED, "x-mq-client-id is required"))
            yield bad
            return
        try:
            self._authorize(context)
        except GrpcError as err:
            yield self._fail(pb.TelemetryCommand(), err)
            return
        if client_id not in self.clients and len(self.clients) >= self.config.max_clients:
            busy = pb.TelemetryCommand()
            self._fail(busy, GrpcError(pb.TOO_MANY_REQUESTS, "too many clients"))
            yield busy
            return
        # Unbounded so the end-of-stream mark always fits; the bound is kept by hand.
        me = _Client(asyncio.Queue(), _meta(context).get("x-mq-namespace", ""))
        self.clients[client_id] = me

        async def read() -> None:
            try:
                async for cmd in request_iterator:
                    if cmd.HasField("settings"):
                        me.settings = cmd.settings
                        if cmd.settings.HasField("publishing"):
                            me.topics = {wrap(t.resource_namespace, t.name)
                                         for t in cmd.settings.publishing.topics}
                        if me.queue.qsize() >= _TELEMETRY_QUEUE:
                            break  # not reading its replies: end the stream
                        fifo = await self._fifo(cmd.settings)
                        me.queue.put_nowait(self._settings_reply(cmd.settings, fifo))
            except (grpc.aio.AioRpcError, asyncio.CancelledError):
                pass
            finally:
                me.queue.put_nowait(None)

        reader = asyncio.ensure_future(read())
        try:
            while True:
                item = await me.queue.get()
                if item is None:
                    break
                yield item
        finally:
            reader.cancel()
            if self.clients.get(client_id) is me:
                del self.clients[client_id]
                # Its lite set goes too (bounded state); a client that reconnects sends
                # it again with its periodic COMPLETE_ADD.
                self.lite.forget(client_id)

    def push_transaction_check(self, broker: str, msg, queue_offset: int, clo: int) -> None:
        """On the gRPC loop: ask one producer client of the message's topic to resolve a
        half message (RecoverOrphanedTransactionCommand)."""
        topic = msg.topic
        for c in self.clients.values():
            if topic in c.topics and c.queue.qsize() < _TELEMETRY_QUEUE:
                cmd = pb.TelemetryCommand()
                rec = cmd.recover_orphaned_transaction_command
                rec.message.CopyFrom(to_grpc(msg, c.namespace))
                rec.transaction_id = transaction_id(broker, queue_offset, clo)
                c.queue.put_nowait(cmd)
                return

    # ------------------------------------------------------------------ sending
    async def SendMessage(self, request, context):
        resp = pb.SendMessageResponse()
        try:
            if len(request.messages) != 1:
                raise GrpcError(pb.BAD_REQUEST, "send one message per request")
            out = from_grpc(request.messages[0], self.config, int(time.time() * 1000))
            mqtt_prepare(out, self.config)  # MQTT traffic (mqtt_out.py)
            self._authorize(context, (out.topic, PUB))
            entry = await self._call(self.backend.send, out)
        except (GrpcError, ValueError) as err:
            if not isinstance(err, GrpcError):
                err = GrpcError(pb.BAD_REQUEST, str(err))
            self._fail(resp, err)
            e = resp.entries.add()
            self._fail(e, err)
            if request.messages:
                e.message_id = request.messages[0].system_properties.message_id
            return resp
        resp.entries.append(entry)
        resp.status.CopyFrom(entry.status)
        if entry.status.code == pb.OK:
            self.stats.msgs_in += 1
            self.stats.bytes_in += len(out.body)  # the bytes we hold (pb's .body copies)
        return resp

    async def _reply(self, resp, work: Callable[[], Awaitable[None]]):
        """`resp` with status OK once `work()` has filled it in, else its GrpcError's."""
        try:
            await work()
        except GrpcError as err:
            return self._fail(resp, err)
        return self._ok(resp)

    async def EndTransaction(self, request, context):
        async def work() -> None:
            if request.resolution not in (pb.COMMIT, pb.ROLLBACK):
                raise GrpcError(pb.BAD_REQUEST, "resolution must be COMMIT or ROLLBACK")
            topic = wrap(request.topic.resource_namespace, request.topic.name)
            self._authorize(context, (topic, PUB))
            await self._call(self.backend.end_transaction, topic, request.message_id,
                             request.transaction_id, request.resolution == pb.COMMIT,
                             request.source == pb.SOURCE_SERVER_CHECK)

        return await self._reply(pb.EndTransactionResponse(), work)

    async def RecallMessage(self, request, context):
        resp = pb.RecallMessageResponse()

        async def work() -> None:
            topic = wrap(request.topic.resource_namespace, request.topic.name)
            self._authorize(context, (topic, PUB))
            resp.message_id = await self._call(self.backend.recall, topic,
                                               request.recall_handle)

        return await self._reply(resp, work)

    # ------------------------------------------------------------------ receiving
    async def ReceiveMessage(self, request, context):
        cfg = self.config
        ns = request.group.resource_namespace or request.message_queue.topic.resource_namespace
        try:
            group = wrap(request.group.resource_namespace, request.group.name)
            if not request.group.name:
                raise GrpcError(pb.ILLEGAL_CONSUMER_GROUP, "group is empty")
            mq = request.message_queue
            topic = wrap(mq.topic.resource_namespace, mq.topic.name)
            self._sub(context, topic, group)
            batch = request.batch_size
            if batch <= 0:
                raise GrpcError(pb.BAD_REQUEST, "batch_size must be positive")
            batch = min(batch, cfg.max_receive_batch)
            # Push consumers ask for auto_renew and name no duration: ours, renewed.
            auto_renew = request.auto_renew and not request.HasField("invisible_duration")
            if request.HasField("invisible_duration"):
                invisible_ms = _ms(request.invisible_duration)
            else:
                invisible_ms = int(cfg.auto_renew_invisible_s * 1000)
            if not 1000 <= invisible_ms <= cfg.max_invisible_s * 1000:
                raise GrpcError(pb.ILLEGAL_INVISIBLE_TIME, "invisible duration out of range")
            poll_ms = int(cfg.long_polling_timeout_s * 1000)
            if request.HasField("long_polling_timeout"):
                poll_ms = min(poll_ms, max(0, _ms(request.long_polling_timeout)))
            remaining = context.time_remaining()
            if remaining is not None:
                # Answer before the client's deadline, or its stream fails.
                poll_ms = max(0, min(poll_ms, int((remaining - 1.0) * 1000)))
            exp_type = exp = None
            fe = request.filter_expression
            if fe.type == pb.SQL:
                exp_type, exp = "SQL92", fe.expression
            elif fe.expression and fe.expression != "*":
                exp_type, exp = "TAG", fe.expression
            lite = self.lite.of(group, _meta(context).get("x-mq-client-id", ""))
            if lite is not None:
                results = await self._call(self.backend.receive_lite, group, topic,
                                           lite[1], batch=batch, invisible_ms=invisible_ms,
                                           poll_ms=poll_ms, auto_renew=auto_renew)
            else:
                results = await self._call(self.backend.receive, group, topic,
                                           mq.broker.name or None, batch=batch,
                                           invisible_ms=invisible_ms, poll_ms=poll_ms,
                                           exp_type=exp_type, exp=exp, auto_renew=auto_renew)
        except GrpcError as err:
            yield self._fail(pb.ReceiveMessageResponse(), err)
            yield _delivery_timestamp()
            return
        if not any(r.messages for _, r in results):
            yield self._fail(pb.ReceiveMessageResponse(),
                             GrpcError(pb.MESSAGE_NOT_FOUND, "no new message"))
            yield _delivery_timestamp()
            return
        yield self._ok(pb.ReceiveMessageResponse())
        stats = self.stats
        for _, r in results:
            for m in r.messages:
                stats.msgs_out += 1
                stats.bytes_out += len(m.message.body)
                out = pb.ReceiveMessageResponse()
                out.message.CopyFrom(to_grpc(
                    m.message, ns, topic=topic,
                    handle=client_handle(m.handle, m.message.commitlog_offset),
                    invisible_ms=r.invisible_time))
                yield out
        yield _delivery_timestamp()

    async def AckMessage(self, request, context):
        resp = pb.AckMessageResponse()
        group, topic = self._names(request)
        codes = set()
        try:
            self._sub(context, topic, group)
        except GrpcError as err:
            return self._fail(resp, err)
        for entry in request.entries:
            e = resp.entries.add(message_id=entry.message_id,
                                 receipt_handle=entry.receipt_handle)
            try:
                handle = parse_handle(entry.receipt_handle)
                await self._call(self.backend.ack, group, self._lmq(topic, entry), handle,
                                 topic)
            except GrpcError as err:
                self._fail(e, err)
            else:
                self._ok(e)
            codes.add(e.status.code)
        if not codes or codes == {pb.OK}:
            return self._ok(resp)
        if len(codes) == 1:
            resp.status.CopyFrom(resp.entries[0].status)
            return resp
        return self._fail(resp, GrpcError(pb.MULTIPLE_RESULTS, "entries differ"))

    async def ChangeInvisibleDuration(self, request, context):
        resp = pb.ChangeInvisibleDurationResponse()

        async def work() -> None:
            group, topic, handle = self._handle_of(request, context)
            invisible_ms = _ms(request.invisible_duration)
            if not 0 <= invisible_ms <= self.config.max_invisible_s * 1000:
                raise GrpcError(pb.ILLEGAL_INVISIBLE_TIME, "invisible duration out of range")
            resp.receipt_handle = await self._call(self.backend.change_invisible, group,
                                                   self._lmq(topic, request), handle,
                                                   invisible_ms, topic)

        return await self._reply(resp, work)

    async def ForwardMessageToDeadLetterQueue(self, request, context):
        async def work() -> None:
            group, topic, handle = self._handle_of(request, context)
            await self._call(self.backend.dead_letter, group, self._lmq(topic, request),
                             handle, topic, request.message_id)

        return await self._reply(pb.ForwardMessageToDeadLetterQueueResponse(), work)


    # ------------------------------------------------------------------ lite topics
    async def SyncLiteSubscription(self, request, context):
        resp = pb.SyncLiteSubscriptionResponse()
        try:
            group, topic = self._names(request)
            client_id = _meta(context).get("x-mq-client-id", "")
            if not client_id:
                raise GrpcError(pb.CLIENT_ID_REQUIRED, "x-mq-client-id is required")
            if not request.group.name or not request.topic.name:
                raise GrpcError(pb.BAD_REQUEST, "group and topic are required")
            self._sub(context, topic, group)
            self.lite.sync(group, client_id, topic, request.action,
                           list(request.lite_topic_set))
        except GrpcError as err:
            return self._fail(resp, err)
        return self._ok(resp)


def _delivery_timestamp() -> pb.ReceiveMessageResponse:
    out = pb.ReceiveMessageResponse()
    out.delivery_timestamp.FromMilliseconds(int(time.time() * 1000))
    return out


