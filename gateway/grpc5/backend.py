"""The broker side of the gRPC front end: routes, sends, POP, ACK, transactions, over a
`core.client.ClientInstance` (in-process inside `lmq serve`, TCP in `lmq proxy`).

Runs on the trio loop. It keeps no per-message state: a receipt handle is the broker's
POP handle, and a transaction id names the broker and offsets END_TRANSACTION needs, so
any proxy process can serve any call (docs/grpc.md "Stateless").
"""

from __future__ import annotations

import itertools
import logging
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import trio

from core.broker.processors.recall import (
    ILLEGAL_OPERATION,
    decode_recall_handle,
    encode_recall_handle,
)
from core.client import ClientInstance
from core.client.errors import MQBrokerError, MQClientError
from core.client.model import MASTER_ID, MessageQueue, SendStatus, TopicRouteData, loads_lenient
from core.client.pop_consumer import (
    INIT_MODE_MAX,
    INIT_MODE_MIN,
    PopClient,
    PopResult,
    private_code_refused,
)
from core.common.msgid import decode_offset_msg_id
from core.common.properties import MessageConst, encode_properties
from core.common.sysflag import MessageSysFlag
from core.remoting.codes import RequestCode, ResponseCode
from core.remoting.errors import RemotingError
from gateway.grpc5.config import GrpcConfig
from gateway.grpc5.convert import DELIVER_MS, GrpcError, OutgoingMessage
from gateway.grpc5.mqtt_out import MqttOut
from gateway.grpc5.proto import messaging_pb2 as pb
from gateway.grpc5.renew import Renewer

__all__ = ["Backend", "BrokerQueues", "Handle", "client_handle", "parse_handle"]

log = logging.getLogger(__name__)

AUTO_CREATE_TOPIC = "TBW102"
#: Queues per broker a topic created by its first send gets (as the 4.x producer).
DEFAULT_TOPIC_QUEUES = 4
#: Topics whose transactional sends this proxy answers broker checks for.
MAX_TRANSACTION_TOPICS = 1024
#: A waiting lite receive checks its parent topic's offsets this often (one
#: GET_MAX_OFFSET per queue), and looks at all its lite topics again at least this often
#: (redeliveries do not grow the parent).
LITE_WAKE_S = 0.1
LITE_RESCAN_S = 1.0
#: A receive that names no broker, on a topic of several brokers, long-polls each broker
#: in turn this long (a message on another broker waits at most this per other broker).
POLL_SLICE_S = 1.0
#: Seconds a broker's list of FIFO groups (consumeMessageOrderly) is reused for Settings.
FIFO_CACHE_S = 10.0

# Broker response code -> RocketMQ 5 status code (as Apache's proxy converts them).
_CODES = {
    ResponseCode.TOPIC_NOT_EXIST: pb.TOPIC_NOT_FOUND,
    ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST: pb.CONSUMER_GROUP_NOT_FOUND,
    ResponseCode.NO_PERMISSION: pb.FORBIDDEN,
    ResponseCode.SYSTEM_BUSY: pb.TOO_MANY_REQUESTS,
    ResponseCode.POLLING_FULL: pb.TOO_MANY_REQUESTS,
    ResponseCode.MESSAGE_ILLEGAL: pb.BAD_REQUEST,
    ResponseCode.SUBSCRIPTION_PARSE_FAILED: pb.ILLEGAL_FILTER_EXPRESSION,
    ResponseCode.INVALID_PARAMETER: pb.BAD_REQUEST,
    ResponseCode.NO_MESSAGE: pb.INVALID_RECEIPT_HANDLE,
    # A change whose new handle a SYNC_MASTER did not send (docs/client.md).
    ResponseCode.FLUSH_SLAVE_TIMEOUT: pb.SLAVE_PERSISTENCE_TIMEOUT,
    ResponseCode.SLAVE_NOT_AVAILABLE: pb.HA_NOT_AVAILABLE,
}
_SEND_STATUS = {
    SendStatus.FLUSH_DISK_TIMEOUT: pb.MASTER_PERSISTENCE_TIMEOUT,
    SendStatus.FLUSH_SLAVE_TIMEOUT: pb.SLAVE_PERSISTENCE_TIMEOUT,
    SendStatus.SLAVE_NOT_AVAILABLE: pb.HA_NOT_AVAILABLE,
}


def status_of(exc: BaseException) -> GrpcError:
    """A backend failure as the status the client gets."""
    if isinstance(exc, GrpcError):
        return exc
    if isinstance(exc, MQBrokerError):
        return GrpcError(_CODES.get(exc.code, pb.INTERNAL_SERVER_ERROR),
                         f"broker answered {exc.code}: {exc}")
    if isinstance(exc, (MQClientError, RemotingError, OSError, trio.TooSlowError)):
        return GrpcError(pb.PROXY_TIMEOUT, f"broker unreachable: {exc}")
    return GrpcError(pb.INTERNAL_SERVER_ERROR, repr(exc))


@dataclass(slots=True)
class BrokerQueues:
    name: str
    addr: str
    read: int
    write: int
    perm: int


@dataclass(slots=True)
class Handle:
    """A client's receipt handle: the broker's POP handle (docs/pop.md: what ACK and
    CHANGE_INVISIBLETIME need), `text`, and the message's commit-log offset (what
    CONSUMER_SEND_MSG_BACK needs; -1 when the client's handle has none)."""

    text: str
    broker: str
    queue_id: int
    offset: int
    commitlog_offset: int = -1

    def for_client(self, text: str | None = None) -> str:
        """`text` (a POP handle of this message, by default ours) as clients get it."""
        return client_handle(text or self.text, self.commitlog_offset)


def client_handle(pop_handle: str, commitlog_offset: int) -> str:
    """The receipt handle a client gets, as Apache's proxy forms it: the POP handle and
    the message's commit-log offset as a ninth field."""
    if commitlog_offset < 0:
        return pop_handle
    return f"{pop_handle} {commitlog_offset}"


def parse_handle(text: str) -> Handle:
    """INVALID_RECEIPT_HANDLE unless `text` is an 8-field POP handle, optionally followed
    by the commit-log offset (`client_handle`)."""
    f = text.split(" ")
    if len(f) not in (8, 9) or len(text) > 512:
        raise GrpcError(pb.INVALID_RECEIPT_HANDLE, "malformed receipt handle")
    try:
        for i in (0, 1, 2, 3, 4, 6, 7, 8)[:len(f) - 1]:
            int(f[i])
    except ValueError:
        raise GrpcError(pb.INVALID_RECEIPT_HANDLE, "malformed receipt handle") from None
    if len(f) == 9:
        return Handle(text[:text.rindex(" ")], f[5], int(f[6]), int(f[7]), int(f[8]))
    return Handle(text, f[5], int(f[6]), int(f[7]))


def transaction_id(broker: str, queue_offset: int, commit_log_offset: int) -> str:
    return f"{commit_log_offset:x}:{queue_offset:x}:{broker}"


def parse_transaction_id(text: str) -> tuple[str, int, int]:
    """-> (broker, queue offset, commit-log offset); INVALID_TRANSACTION_ID if bad."""
    try:
        clo, qo, broker = text.split(":", 2)
        return broker, int(qo, 16), int(clo, 16)
    except ValueError:
        raise GrpcError(pb.INVALID_TRANSACTION_ID, "malformed transaction id") from None


class _TransactionRelay:
    """A producer group (= topic) registered with the brokers so that their transaction
    checks reach this proxy; each check is passed to `on_check` (the gRPC side pushes it
    to a producer client of the topic over Telemetry)."""

    def __init__(self, group: str, on_check: Callable) -> None:
        self.group = group
        self._on_check = on_check

    def publish_topics(self) -> list[str]:
        return [self.group]

    def on_route(self, topic: str, route: TopicRouteData) -> None:
        pass

    async def check_transaction_state(self, addr: str, msg, cmd) -> None:
        self._on_check(addr, msg, cmd)

    async def shutdown(self) -> None:
        pass


class Backend:
    """What the gRPC service asks of the brokers."""

    def __init__(self, client: ClientInstance, config: GrpcConfig,
                 on_transaction_check: Callable | None = None) -> None:
        self.client = client
        self.config = config
        self._routes: dict[str, tuple[float, list[BrokerQueues]]] = {}
        self._addrs: dict[str, str] = {}
        self._rr = itertools.count()
        self._on_transaction_check = on_transaction_check or (lambda *a: None)
        self.renewer = Renewer(self._renew)
        #: MQTT traffic's routes (docs/grpc.md "MQTT and AMQP subscribers").
        self.mqtt = MqttOut(client)
        #: broker address -> (expiry, FIFO group names): see group_fifo.
        self._fifo_groups: dict[str, tuple[float, set[str]]] = {}
        #: Brokers that refused POP_DEAD_LETTER (Apache's, ours in apache_strict mode).
        self._apache_dead_letter: set[str] = set()

    async def _renew(self, group: str, topic: str, handle: str, invisible_ms: int,
                     route_topic: str | None) -> str:
        return await self._handle_call(group, topic, parse_handle(handle), "change",
                                       invisible_ms, route_topic=route_topic, raw=True)

    # ------------------------------------------------------------------ routes
    async def route(self, topic: str) -> list[BrokerQueues]:
        """The topic's queues per broker (cached `route_cache_s`); TBW102's when the topic
        does not exist yet and the brokers create topics on first send. TOPIC_NOT_FOUND
        when neither exists."""
        now = time.monotonic()
        hit = self._routes.get(topic)
        if hit is not None and hit[0] > now:
            return hit[1]
        try:
            route = await self.client.api.get_route(topic)
            default = False
            if route is None:
                route = await self.client.api.get_route(AUTO_CREATE_TOPIC)
                default = True
        except Exception as exc:
            raise status_of(exc) from exc
        out: list[BrokerQueues] = []
        if route is not None:
            addrs = {b.broker_name: b.broker_addrs.get(MASTER_ID) for b in route.broker_datas}
            for qd in route.queue_datas:
                addr = addrs.get(qd.broker_name)
                if not addr:
                    continue
                self._addrs[qd.broker_name] = addr
                read, write = qd.read_queue_nums, qd.write_queue_nums
                if default:
                    read = write = min(DEFAULT_TOPIC_QUEUES, write)
                out.append(BrokerQueues(qd.broker_name, addr, read, write, qd.perm))
        if not out:
            raise GrpcError(pb.TOPIC_NOT_FOUND, f"topic {topic} not found")
        out.sort(key=lambda b: b.name)
        if len(self._routes) > 10_000:
            self._routes.clear()
        self._routes[topic] = (now + self.config.route_cache_s, out)
        return out

    def broker_name(self, addr: str) -> str | None:
        """The name of the broker at `addr`, if a route named it."""
        return next((n for n, a in self._addrs.items() if a == addr), None)

    async def broker_addr(self, broker: str, topic: str) -> str:
        addr = self._addrs.get(broker)
        if addr is None:
            for bq in await self.route(topic):
                if bq.name == broker:
                    return bq.addr
            raise GrpcError(pb.BAD_REQUEST, f"unknown broker {broker!r}")
        return addr

    # ------------------------------------------------------------------ groups
    async def group_fifo(self, group: str, topics: list[str]) -> bool:
        """Whether `group` is a FIFO group (`consumeMessageOrderly` in its subscription
        group config on the first broker of its first topic; the table is cached
        `FIFO_CACHE_S` per broker). False when it cannot be read (the broker account
        of `lmq proxy` lacks the admin right, or no topic routes)."""
        for topic in topics[:1]:
            try:
                brokers = await self.route(topic)
            except GrpcError:
                return False
            addr = brokers[0].addr
            now = time.monotonic()
            hit = self._fifo_groups.get(addr)
            if hit is None or hit[0] <= now:
                try:
                    resp = await self.client.api.call(addr, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)
                    table = loads_lenient(resp.body_bytes()).get("subscriptionGroupTable") or {}
                except Exception as exc:  # noqa: BLE001 - no right, broker gone: not FIFO
                    log.debug("subscription groups of %s unreadable: %r", addr, exc)
                    table = {}
                fifo = {n for n, g in table.items()
                        if isinstance(g, dict) and g.get("consumeMessageOrderly") is True}
                hit = self._fifo_groups[addr] = (now + FIFO_CACHE_S, fifo)
            return group in hit[1]
        return False

    # ------------------------------------------------------------------ sending
    async def send(self, msg: OutgoingMessage) -> pb.SendResultEntry:
        if msg.mqtt_topic is not None:
            await self.mqtt.dispatch(msg)
        brokers = [b for b in await self.route(msg.topic) if b.write > 0 and b.perm & 2]
        if not brokers:
            raise GrpcError(pb.FORBIDDEN, f"topic {msg.topic} is not writable")
        slots = [(b, q) for b in brokers for q in range(b.write)]
        if msg.message_group is not None:
            # FIFO: one queue per message group, so the group's messages keep their order.
            broker, qid = slots[zlib.crc32(msg.message_group.encode()) % len(slots)]
        else:
            broker, qid = slots[next(self._rr) % len(slots)]
        if msg.transactional:
            await self._relay(msg.topic, broker.addr)
        sys_flag = MessageSysFlag.TRANSACTION_PREPARED_TYPE if msg.transactional else 0
        ext = {
            "a": msg.topic if msg.transactional else "GRPC_PROXY", "b": msg.topic,
            "c": AUTO_CREATE_TOPIC, "d": str(DEFAULT_TOPIC_QUEUES), "e": str(qid),
            "f": str(sys_flag), "g": str(msg.born_ms), "h": "0",
            "i": encode_properties(msg.properties), "j": "0", "k": "false", "m": "false",
        }
        mq = MessageQueue(msg.topic, broker.name, qid)
        try:
            result = await self.client.api.send_message(
                broker.addr, mq, ext, msg.body, batch=False, uniq_id=msg.message_id)
        except Exception as exc:
            self._routes.pop(msg.topic, None)
            if (isinstance(exc, MQBrokerError) and exc.code == ResponseCode.MESSAGE_ILLEGAL
                    and DELIVER_MS in msg.properties):
                # The broker's timer_max_delay_s is below ours (`lmq proxy
                # --timer-max-delay-s`): refused, not delivered early.
                raise GrpcError(pb.ILLEGAL_DELIVERY_TIME, f"broker refused: {exc}") from exc
            raise status_of(exc) from exc
        entry = pb.SendResultEntry(message_id=msg.message_id, offset=result.queue_offset)
        code = _SEND_STATUS.get(result.status, pb.OK)
        entry.status.code = code
        entry.status.message = "OK" if code == pb.OK else result.status.name
        if MessageConst.DELAY_TIME_LEVEL in msg.properties:
            # A scheduled message: RecallMessage cancels it with this handle.
            entry.recall_handle = encode_recall_handle(
                msg.topic, broker.name, int(msg.properties[DELIVER_MS]), msg.message_id)
        if msg.transactional:
            try:
                _, _, clo = decode_offset_msg_id(result.offset_msg_id)
            except ValueError:
                raise GrpcError(pb.INTERNAL_SERVER_ERROR, "broker sent no offset id") from None
            entry.transaction_id = transaction_id(broker.name, result.queue_offset, clo)
        return entry

    async def _relay(self, topic: str, addr: str) -> None:
        """Register the producer group `topic` with the broker at once (the periodic
        heartbeats keep it registered), so its transaction checks reach us."""
        producers = self.client.producers
        if topic in producers or len(producers) >= MAX_TRANSACTION_TOPICS:
            return
        producers[topic] = _TransactionRelay(topic, self._on_transaction_check)
        try:
            await self.client.api.heartbeat(addr, self.client.heartbeat_data())
        except Exception as exc:  # the periodic heartbeat retries
            log.debug("heartbeat to %s failed: %r", addr, exc)

    async def end_transaction(self, topic: str, message_id: str, txid: str, commit: bool,
                              from_check: bool) -> None:
        broker, queue_offset, clo = parse_transaction_id(txid)
        addr = await self.broker_addr(broker, topic)
        decision = (MessageSysFlag.TRANSACTION_COMMIT_TYPE if commit
                    else MessageSysFlag.TRANSACTION_ROLLBACK_TYPE)
        ext = {"producerGroup": topic, "tranStateTableOffset": str(queue_offset),
               "commitLogOffset": str(clo), "commitOrRollback": str(decision),
               "fromTransactionCheck": "true" if from_check else "false",
               "msgId": message_id, "transactionId": txid}
        try:
            await self.client.api.end_transaction(addr, ext)
        except Exception as exc:
            raise status_of(exc) from exc

    async def recall(self, topic: str, handle: str) -> str:
        """RECALL_MESSAGE to the broker named in the handle; the recalled message id."""
        try:
            h_topic, broker, _, _ = decode_recall_handle(handle)
        except ValueError as exc:
            raise GrpcError(pb.BAD_REQUEST, f"malformed recall handle: {exc}") from None
        if h_topic != topic:
            raise GrpcError(pb.BAD_REQUEST, "the recall handle is of another topic")
        addr = await self.broker_addr(broker, topic)
        try:
            resp = await self.client.api.call(
                addr, RequestCode.RECALL_MESSAGE,
                {"producerGroup": topic, "topic": topic, "recallHandle": handle},
                ok=(ResponseCode.SUCCESS, ILLEGAL_OPERATION))
        except Exception as exc:
            raise status_of(exc) from exc
        if resp.code == ILLEGAL_OPERATION:  # too late, another broker, malformed
            raise GrpcError(pb.BAD_REQUEST, resp.remark or "recall refused")
        return (resp.ext_fields or {}).get("msgId", "")

    # ------------------------------------------------------------------ POP
    def _pop_client(self, addr: str, broker: str, group: str) -> PopClient:
        return PopClient(self.client.remoting, addr, broker, group)

    async def receive(self, group: str, topic: str, broker: str | None, *, batch: int,
                      invisible_ms: int, poll_ms: int, exp_type: str | None,
                      exp: str | None, auto_renew: bool = False
                      ) -> list[tuple[str, PopResult]]:
        """POP from every readable broker of `topic` (or the one named), all queues;
        returns (broker name, result) for those that had messages."""
        brokers = [b for b in await self.route(topic) if b.read > 0 and b.perm & 4]
        if broker:
            brokers = [b for b in brokers if b.name == broker] or brokers
        results: list[tuple[str, PopResult]] = []
        # First a quick pass over every broker; then, with several, long polls of
        # POLL_SLICE_S on each broker in turn until one has messages or the time is up
        # (every response is read: a poll left running at a broker could pop messages
        # nobody takes, invisible until their deadline).
        deadline = trio.current_time() + poll_ms / 1000
        first = True
        while True:
            for b in brokers:
                if first:
                    wait_ms = poll_ms if len(brokers) == 1 else 0
                else:
                    if results:
                        return results
                    left = deadline - trio.current_time()
                    if left <= 0:
                        return results
                    wait_ms = int(min(left, POLL_SLICE_S) * 1000)
                r = await self._pop(b, group, topic, batch, invisible_ms, wait_ms, exp_type,
                                    exp)
                if r.messages:
                    results.append((b.name, r))
                    if auto_renew:
                        for m in r.messages:
                            self.renewer.add(group, topic, m.handle, invisible_ms)
                    batch -= len(r.messages)
                    if batch <= 0:
                        return results
            first = False
            if results or len(brokers) == 1 or trio.current_time() >= deadline:
                return results

    async def _pop(self, b: BrokerQueues, group: str, topic: str, batch: int,
                   invisible_ms: int, poll_ms: int, exp_type, exp,
                   queue_id: int = -1, init_mode: int = INIT_MODE_MAX) -> PopResult:
        pc = self._pop_client(b.addr, b.name, group)
        try:
            return await pc.pop(topic, max_nums=batch, invisible_ms=invisible_ms,
                                poll_ms=poll_ms, queue_id=queue_id, init_mode=init_mode,
                                exp_type=exp_type, exp=exp)
        except Exception as exc:
            raise status_of(exc) from exc

    async def receive_lite(self, group: str, parent: str, lites: list[str], *, batch: int,
                           invisible_ms: int, poll_ms: int, auto_renew: bool = False
                           ) -> list[tuple[str, PopResult]]:
        """POP across the LMQs of a lite consumer's topics (FIFO within each), starting at
        a rotating one; when none has a message, wait until the parent topic grows (a
        message for some lite topic was stored) or `LITE_RESCAN_S` passes, and look again,
        until `poll_ms`. Returns (lite topic, result) for those that had messages."""
        from gateway.grpc5.lite import lmq_name

        brokers = [b for b in await self.route(parent) if b.read > 0 and b.perm & 4]
        if not lites or not brokers:
            await trio.sleep(poll_ms / 1000)
            return []
        deadline = trio.current_time() + poll_ms / 1000
        first = next(self._rr)
        while True:
            mark = await self._parent_mark(brokers, parent)
            out: list[tuple[str, PopResult]] = []
            for i in range(len(lites)):
                lite = lites[(first + i) % len(lites)]
                for b in brokers:
                    # MIN: a lite topic's messages from its first one, so nothing
                    # sent between subscribing and the first receive is skipped.
                    r = await self._pop(b, group, lmq_name(parent, lite), batch, invisible_ms,
                                        0, None, None, queue_id=0, init_mode=INIT_MODE_MIN)
                    if r.messages:
                        out.append((lite, r))
                        if auto_renew:
                            for m in r.messages:
                                self.renewer.add(group, m.topic, m.handle, invisible_ms,
                                                 parent)
                        batch -= len(r.messages)
                        if batch <= 0:
                            return out
            if out or trio.current_time() >= deadline:
                return out
            rescan = min(deadline, trio.current_time() + LITE_RESCAN_S)
            while trio.current_time() < rescan:
                await trio.sleep(LITE_WAKE_S)
                if await self._parent_mark(brokers, parent) != mark:
                    break

    async def _parent_mark(self, brokers: list[BrokerQueues], parent: str) -> int:
        """Sum of the parent topic's queue max offsets (grows with every message)."""
        total = 0
        for b in brokers:
            for qid in range(b.read):
                try:
                    total += await self.client.api.get_max_offset(b.addr, parent, qid)
                except Exception as exc:
                    raise status_of(exc) from exc
        return total

    async def ack(self, group: str, topic: str, handle: Handle,
                  route_topic: str | None = None) -> None:
        await self._handle_call(group, topic, handle, "ack", route_topic=route_topic)

    async def change_invisible(self, group: str, topic: str, handle: Handle,
                               invisible_ms: int, route_topic: str | None = None) -> str:
        """The message's new receipt handle, as the client gets it."""
        return handle.for_client(await self._handle_call(group, topic, handle, "change",
                                                         invisible_ms,
                                                         route_topic=route_topic))

    async def dead_letter(self, group: str, topic: str, handle: Handle,
                          route_topic: str | None = None, message_id: str = "") -> None:
        await self._handle_call(group, topic, handle, "reject", route_topic=route_topic,
                                message_id=message_id)

    async def _handle_call(self, group: str, topic: str, handle: Handle, op: str,
                           invisible_ms: int = 0, route_topic: str | None = None,
                           raw: bool = False, message_id: str = "") -> str:
        from core.client.pop_consumer import PopMessage

        if not raw:  # a client's handle: the one the broker holds, if we renewed it
            current = await self.renewer.take(handle.text)
            if current != handle.text:
                handle = Handle(current, handle.broker, handle.queue_id, handle.offset,
                                handle.commitlog_offset)

        # Lite topics: the LMQ has no route of its own; its parent's names the broker.
        addr = await self.broker_addr(handle.broker, route_topic or topic)
        pc = self._pop_client(addr, handle.broker, group)
        m = PopMessage(None, topic, handle.queue_id, handle.offset, handle.text)  # type: ignore[arg-type]
        try:
            if op == "ack":
                ok = await pc.ack(m)
            elif op == "reject":
                ok = await self._dead_letter(pc, m, handle.commitlog_offset, message_id)
            else:
                ok = await pc.change_invisible(m, invisible_ms)
        except GrpcError:
            raise
        except Exception as exc:
            raise status_of(exc) from exc
        if not ok:
            raise GrpcError(pb.INVALID_RECEIPT_HANDLE,
                            "receipt handle expired: the message was redelivered or acked")
        return m.handle

    async def _dead_letter(self, pc: PopClient, m, commitlog_offset: int,
                           message_id: str) -> bool:
        """The broker's private POP_DEAD_LETTER; on a broker that refuses it (Apache's, or
        ours in apache_strict mode: one WARNING per broker), Apache's proxy's way:
        CONSUMER_SEND_MSG_BACK to %DLQ%<group>, then ACK (docs/grpc.md)."""
        if pc.broker_addr not in self._apache_dead_letter:
            try:
                return await pc.reject(m)
            except MQBrokerError as exc:
                if not private_code_refused(exc):
                    raise
                self._apache_dead_letter.add(pc.broker_addr)
                log.warning("gRPC front end: broker %s refuses POP_DEAD_LETTER (%s); "
                            "ForwardMessageToDeadLetterQueue sends messages back to "
                            "%%DLQ%%<group> and acknowledges them, as Apache's proxy "
                            "(docs/grpc.md)", pc.broker_addr, exc)
        if commitlog_offset < 0:
            raise GrpcError(pb.INVALID_RECEIPT_HANDLE,
                            "receipt handle without the commit-log offset this broker needs")
        return await pc.send_back_to_dlq(m, commitlog_offset, message_id)

