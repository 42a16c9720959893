"""`Producer`: sync, async (awaitable and callback), one-way, ordered and batch sends.

The send path follows seeds 001/002 and Java's DefaultMQProducerImpl:

1. validate (topic name, non-empty body, ``max_message_size`` = 4 MiB, properties size);
2. find the topic's publish info: the route from the name servers, or, when the topic has
   none, the route of ``TBW102`` limited to ``default_topic_queue_nums`` queues per broker
   so the broker auto-creates the topic (docs/protocol.md §4.1);
3. pick a queue (round robin, avoiding the broker that just failed; with
   ``send_latency_fault_enable`` also brokers that were slow or dead recently, latency.py);
4. send (SEND_MESSAGE_V2, or SEND_BATCH_MESSAGE with ``m=true``), bodies of 4 KiB and more
   zlib-compressed (sysFlag bit 0), a UNIQ_KEY id on every message;
5. on a transport failure or a retryable broker code, retry (``retry_times`` = 2) within the
   total ``send_timeout``.
"""

from __future__ import annotations

import inspect
import logging
import time
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import trio

from core.client.errors import ClientStateError, MQBrokerError, MQClientError, NoRouteError
from core.client.instance import ClientInstance
from core.client.latency import (
    DEFAULT_LATENCY_MAX_MS,
    DEFAULT_NOT_AVAILABLE_MS,
    MQFaultStrategy,
    TopicPublishInfo,
)
from core.client.model import MessageQueue, SendResult, SendStatus, TopicRouteData
from core.common.codec import BatchItem, encode_batch
from core.common.message import Message, MessageExt
from core.common.msgid import UniqKeyGenerator
from core.common.names import (
    AUTO_CREATE_TOPIC_KEY_TOPIC,
    DEFAULT_PRODUCER_GROUP,
    NOT_ALLOWED_SEND_TOPICS,
    is_retry_topic,
    validate_group,
    validate_topic,
)
from core.common.properties import MAX_PROPERTIES_BYTES, MessageConst, encode_properties
from core.common.sysflag import MessageSysFlag
from core.common.taghash import java_string_hash
from core.remoting.codec import RemotingCommand
from core.remoting.codes import ResponseCode
from core.remoting.errors import RemotingError

log = logging.getLogger(__name__)

#: Body limit (Java maxMessageSize, broker default as well).
DEFAULT_MAX_MESSAGE_SIZE = 4 * 1024 * 1024
#: Bodies of at least this size are zlib-compressed (compressMsgBodyOverHowmuch, docs/protocol.md §7.8).
DEFAULT_COMPRESS_OVER = 4096
#: Broker codes after which a send is retried on another queue (Java retryResponseCodes,
#: plus SYSTEM_BUSY: a busy broker is as good a reason to go elsewhere).
RETRY_RESPONSE_CODES = frozenset({
    ResponseCode.TOPIC_NOT_EXIST,
    ResponseCode.SERVICE_NOT_AVAILABLE,
    ResponseCode.SYSTEM_ERROR,
    ResponseCode.SYSTEM_BUSY,
    ResponseCode.NO_PERMISSION,
    ResponseCode.NO_BUYER_ID,
    ResponseCode.NOT_IN_CURRENT_UNIT,
})

MessageQueueSelector = Callable[[list[MessageQueue], Message, Any], MessageQueue]
SendCallback = Callable[[SendResult | None, BaseException | None], Any]


def select_by_hash(queues: list[MessageQueue], msg: Message, arg: Any) -> MessageQueue:
    """Queue chosen by a stable hash of `arg` (same key -> same queue -> ordered)."""
    if isinstance(arg, int):
        h = arg
    else:
        h = java_string_hash(str(arg))
    return queues[abs(h) % len(queues)]


class SendFuture:
    """Result of `Producer.send_async`: ``await fut.result()`` or a callback."""

    def __init__(self) -> None:
        self._done = trio.Event()
        self._result: SendResult | None = None
        self._error: BaseException | None = None

    def _set(self, result: SendResult | None, error: BaseException | None) -> None:
        self._result, self._error = result, error
        self._done.set()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    async def result(self) -> SendResult:
        await self._done.wait()
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result


class Producer:
    """A producer group member running in a `ClientInstance`.

    ``async with Producer(client, "PG") as p: await p.send(Message("T", b"hi"))``
    """

    def __init__(
        self,
        client: ClientInstance,
        group: str = DEFAULT_PRODUCER_GROUP,
        *,
        send_timeout: float = 3.0,
        retry_times: int = 2,
        retry_times_async: int = 2,
        retry_another_broker_when_not_store_ok: bool = False,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        compress_over: int = DEFAULT_COMPRESS_OVER,
        compress_level: int = 5,
        default_topic_queue_nums: int = 4,
        create_topic_key: str = AUTO_CREATE_TOPIC_KEY_TOPIC,
        send_latency_fault_enable: bool = False,
        latency_max_ms: Sequence[int] = DEFAULT_LATENCY_MAX_MS,
        not_available_ms: Sequence[int] = DEFAULT_NOT_AVAILABLE_MS,
    ) -> None:
        reason = validate_group(group)
        if reason:
            raise MQClientError(reason)
        if retry_times < 0 or retry_times_async < 0:
            raise ValueError("retry times must be >= 0")
        self.client = client
        self.group = group
        self.send_timeout = send_timeout
        self.retry_times = retry_times
        self.retry_times_async = retry_times_async
        self.retry_another_broker_when_not_store_ok = retry_another_broker_when_not_store_ok
        self.max_message_size = max_message_size
        self.compress_over = compress_over
        self.compress_level = compress_level
        self.default_topic_queue_nums = default_topic_queue_nums
        self.create_topic_key = create_topic_key
        self.fault = MQFaultStrategy(send_latency_fault_enable, tuple(latency_max_ms),
                                     tuple(not_available_ms))
        self.publish_info: dict[str, TopicPublishInfo] = {}
        self._ids = UniqKeyGenerator(client.config.client_ip or "127.0.0.1")
        self.running = False

    # -- lifetime -------------------------------------------------------------------

    async def start(self) -> None:
        self.client.register_producer(self)
        self.running = True
        await self.client.send_heartbeats()

    async def shutdown(self) -> None:
        if not self.running:
            return
        self.running = False
        await self.client.unregister(producer_group=self.group)

    async def __aenter__(self) -> Producer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        with trio.CancelScope(shield=True):
            await self.shutdown()

    # -- instance callbacks ---------------------------------------------------------

    def publish_topics(self) -> list[str]:
        return list(self.publish_info)

    def on_route(self, topic: str, route: TopicRouteData) -> None:
        if topic in self.publish_info:
            self.publish_info[topic] = TopicPublishInfo(topic, route)

    async def check_transaction_state(self, addr: str, msg: MessageExt, cmd: RemotingCommand) -> None:
        """Only transactional producers answer checks (transaction.py)."""

    # -- validation and routing -------------------------------------------------------

    def _check_running(self) -> None:
        if not self.running:
            raise ClientStateError(f"producer {self.group!r} is not running (call start())")

    def _validate(self, msg: Message) -> None:
        reason = validate_topic(msg.topic)
        if reason:
            raise MQClientError(reason, ResponseCode.MESSAGE_ILLEGAL)
        if msg.topic in NOT_ALLOWED_SEND_TOPICS:
            raise MQClientError(f"Sending message to topic[{msg.topic}] is forbidden.",
                                ResponseCode.NO_PERMISSION)
        if msg.body is None or len(msg.body) == 0:
            raise MQClientError("the message body length is zero", ResponseCode.MESSAGE_ILLEGAL)
        if len(msg.body) > self.max_message_size:
            raise MQClientError(
                f"the message body size {len(msg.body)} exceeds the limit of "
                f"{self.max_message_size} bytes (max_message_size)", ResponseCode.MESSAGE_ILLEGAL)

    async def find_publish_info(self, topic: str) -> TopicPublishInfo:
        """Publish info from the topic's route, or from TBW102's for auto-creation."""
        info = self.publish_info.get(topic)
        if info is not None and info.ok():
            return info
        route = await self.client.update_route(topic)
        if route is not None:
            info = TopicPublishInfo(topic, route)
            if info.ok():
                self.publish_info[topic] = info
                return info
        default = await self.client.api.get_route(self.create_topic_key)
        if default is not None:
            for qd in default.queue_datas:
                n = min(self.default_topic_queue_nums, qd.read_queue_nums)
                qd.read_queue_nums = qd.write_queue_nums = n
            for bd in default.broker_datas:
                self.client.broker_addrs.setdefault(bd.broker_name, dict(bd.broker_addrs))
            self.client._greet_new_brokers()
            info = TopicPublishInfo(topic, default)
            if info.ok():
                self.publish_info[topic] = info
                return info
        raise NoRouteError(topic)

    async def _broker_addr(self, mq: MessageQueue) -> str:
        addr = self.client.find_broker_addr(mq.broker_name)
        if addr is None:
            await self.client.update_route(mq.topic)
            addr = self.client.find_broker_addr(mq.broker_name)
        if addr is None:
            raise MQClientError(f"The broker[{mq.broker_name}] not exist")
        return addr

    # -- the send kernel ------------------------------------------------------------

    def _prepare(self, msg: Message) -> tuple[bytes, int]:
        """Body to send and the sysFlag (compression, transaction type)."""
        body = bytes(msg.body)
        sys_flag = 0
        if len(body) >= self.compress_over:
            body = zlib.compress(body, self.compress_level)
            sys_flag |= MessageSysFlag.COMPRESSED
        if msg.properties.get(MessageConst.TRANSACTION_PREPARED) == "true":
            sys_flag |= MessageSysFlag.TRANSACTION_PREPARED_TYPE
        return body, sys_flag

    def _header(self, msg: Message, mq: MessageQueue, sys_flag: int, batch: bool) -> dict[str, str]:
        props = dict(msg.properties)
        reconsume = max_reconsume = None
        if is_retry_topic(mq.topic):
            # A consumer re-sending to %RETRY% passes its counters in the header (docs/protocol.md §5.1).
            reconsume = props.pop(MessageConst.RECONSUME_TIME, None)
            max_reconsume = props.pop(MessageConst.MAX_RECONSUME_TIMES, None)
        properties = encode_properties(props)
        if len(properties.encode("utf-8")) > MAX_PROPERTIES_BYTES:
            raise MQClientError(
                f"message properties exceed {MAX_PROPERTIES_BYTES} bytes", ResponseCode.MESSAGE_ILLEGAL)
        ext = {
            "a": self.group,
            "b": mq.topic,
            "c": self.create_topic_key,
            "d": str(self.default_topic_queue_nums),
            "e": str(mq.queue_id),
            "f": str(sys_flag),
            "g": str(int(time.time() * 1000)),
            "h": str(msg.flag),
            "i": properties,
            "j": str(reconsume or 0),
            "k": "false",
            "m": "true" if batch else "false",
        }
        if max_reconsume is not None:
            ext["l"] = str(max_reconsume)
        return ext

    async def _send_kernel(self, msg: Message, mq: MessageQueue, timeout: float,
                           oneway: bool = False, batch_body: bytes | None = None,
                           batch_ids: str = "") -> SendResult | None:
        addr = await self._broker_addr(mq)
        if batch_body is not None:
            body, sys_flag, uniq = batch_body, 0, batch_ids
        else:
            uniq = msg.properties.get(MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
            if not uniq:
                uniq = self._ids.next()
                msg.properties[MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX] = uniq
            body, sys_flag = self._prepare(msg)
        ext = self._header(msg, mq, sys_flag, batch_body is not None)
        return await self.client.api.send_message(
            addr, mq, ext, body, batch=batch_body is not None, uniq_id=uniq,
            timeout=timeout, oneway=oneway)

    async def _send_default(self, msg: Message, *, timeout: float | None, retries: int,
                            oneway: bool = False, batch_body: bytes | None = None,
                            batch_ids: str = "") -> SendResult | None:
        """Queue selection + retries within the total timeout (Java sendDefaultImpl)."""
        self._check_running()
        timeout = self.send_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        info = await self.find_publish_info(msg.topic)
        attempts = 1 if oneway else 1 + retries
        last_broker: str | None = None
        last_error: BaseException | None = None
        result: SendResult | None = None
        for attempt in range(attempts):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            mq = self.fault.select(info, last_broker)
            last_broker = mq.broker_name
            begin = time.monotonic()
            try:
                result = await self._send_kernel(msg, mq, remaining, oneway, batch_body, batch_ids)
            except (RemotingError, MQBrokerError, MQClientError) as exc:
                latency = (time.monotonic() - begin) * 1000
                self.fault.update_fault_item(mq.broker_name, latency, True)
                if isinstance(exc, MQBrokerError) and exc.code not in RETRY_RESPONSE_CODES:
                    raise
                if isinstance(exc, NoRouteError):
                    raise
                last_error = exc
                log.debug("send to %s failed (attempt %d): %r", mq, attempt + 1, exc)
                # The route may have changed (a broker died): refresh before the retry.
                info = await self._refreshed_info(msg.topic, info)
                continue
            self.fault.update_fault_item(mq.broker_name, (time.monotonic() - begin) * 1000, False)
            if oneway or result is None:
                return None
            if result.status is not SendStatus.SEND_OK and self.retry_another_broker_when_not_store_ok:
                continue
            return result
        if result is not None:
            return result
        if last_error is None:
            raise MQClientError(f"send of a message to {msg.topic} timed out after {timeout} s")
        raise MQClientError(
            f"send to topic {msg.topic} failed after {attempts} attempt(s): {last_error}",
            getattr(last_error, "code", -1)) from last_error

    async def _refreshed_info(self, topic: str, info: TopicPublishInfo) -> TopicPublishInfo:
        try:
            route = await self.client.update_route(topic)
        except Exception:
            return info
        if route is not None:
            fresh = TopicPublishInfo(topic, route)
            if fresh.ok():
                self.publish_info[topic] = fresh
                return fresh
        return info

    # -- public sends ---------------------------------------------------------------

    async def send(self, msg: Message, *, timeout: float | None = None) -> SendResult:
        """Send and wait for the broker's answer; retries `retry_times` on failure."""
        self._validate(msg)
        result = await self._send_default(msg, timeout=timeout, retries=self.retry_times)
        assert result is not None
        return result

    async def send_oneway(self, msg: Message) -> None:
        """Send without waiting for an answer (one attempt, one-way flag)."""
        self._validate(msg)
        await self._send_default(msg, timeout=None, retries=0, oneway=True)

    def send_async(self, msg: Message, callback: SendCallback | None = None, *,
                   timeout: float | None = None) -> SendFuture:
        """Start a send in the client's nursery and return at once.

        ``callback(result, error)`` (plain or async) runs when it completes; the returned
        `SendFuture` can be awaited too (``await fut.result()``).
        """
        self._check_running()
        self._validate(msg)
        fut = SendFuture()

        async def run() -> None:
            result: SendResult | None = None
            error: BaseException | None = None
            try:
                result = await self._send_default(msg, timeout=timeout, retries=self.retry_times_async)
            except Exception as exc:
                error = exc
            fut._set(result, error)
            if callback is not None:
                try:
                    ret = callback(result, error)
                    if inspect.isawaitable(ret):
                        await ret
                except Exception:
                    log.exception("send callback failed")

        self.client._need_nursery().start_soon(run)
        return fut

    async def send_to_queue(self, msg: Message, mq: MessageQueue, *,
                            timeout: float | None = None) -> SendResult:
        """Send to one given queue (no retry elsewhere: the caller chose the queue)."""
        self._check_running()
        self._validate(msg)
        if mq.topic != msg.topic:
            raise MQClientError(f"message topic {msg.topic!r} differs from queue topic {mq.topic!r}")
        result = await self._send_kernel(msg, mq, self.send_timeout if timeout is None else timeout)
        assert result is not None
        return result

    async def send_with_selector(self, msg: Message, selector: MessageQueueSelector, arg: Any,
                                 *, timeout: float | None = None) -> SendResult:
        """Send to the queue `selector(queues, msg, arg)` picks (ordered messages)."""
        self._check_running()
        self._validate(msg)
        info = await self.find_publish_info(msg.topic)
        mq = selector(list(info.queues), msg, arg)
        if mq not in info.queues:
            raise MQClientError(f"selector returned {mq}, which is not a queue of {msg.topic}")
        return await self.send_to_queue(msg, mq, timeout=timeout)

    async def send_orderly(self, msg: Message, sharding_key: Any, *,
                           timeout: float | None = None) -> SendResult:
        """Ordered send: messages with the same `sharding_key` go to the same queue."""
        return await self.send_with_selector(msg, select_by_hash, sharding_key, timeout=timeout)

    async def send_batch(self, msgs: Sequence[Message], *, timeout: float | None = None,
                         mq: MessageQueue | None = None) -> SendResult:
        """Send messages of one topic in one SEND_BATCH_MESSAGE request (docs/protocol.md §7.7).

        Batches may not carry a delay level or go to a %RETRY% topic (Java refuses both);
        the encoded batch must fit `max_message_size`.
        """
        self._check_running()
        if not msgs:
            raise MQClientError("a batch needs at least one message")
        topic = msgs[0].topic
        items = []
        ids = []
        for m in msgs:
            self._validate(m)
            if m.topic != topic:
                raise MQClientError("all messages of a batch must have the same topic")
            if m.delay_level > 0:
                raise MQClientError("delayed messages are not supported in a batch")
            if is_retry_topic(m.topic):
                raise MQClientError("retry-group messages are not supported in a batch")
            uniq = m.properties.get(MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
            if not uniq:
                uniq = self._ids.next()
                m.properties[MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX] = uniq
            ids.append(uniq)
            items.append(BatchItem(m.flag, bytes(m.body), encode_properties(m.properties)))
        body = encode_batch(items)
        if len(body) > self.max_message_size:
            raise MQClientError(
                f"the batch of {len(body)} bytes exceeds the limit of {self.max_message_size} "
                "bytes (max_message_size)", ResponseCode.MESSAGE_ILLEGAL)
        header_msg = Message(topic, body, properties={MessageConst.WAIT_STORE_MSG_OK: "true"})
        if mq is not None:
            result = await self._send_kernel(
                header_msg, mq, self.send_timeout if timeout is None else timeout,
                batch_body=body, batch_ids=",".join(ids))
        else:
            result = await self._send_default(header_msg, timeout=timeout, retries=self.retry_times,
                                              batch_body=body, batch_ids=",".join(ids))
        assert result is not None
        return result

    async def fetch_publish_queues(self, topic: str) -> list[MessageQueue]:
        """The writable queues a send to `topic` may use."""
        return list((await self.find_publish_info(topic)).queues)


async def call_maybe_async(fn: Callable[..., Any], *args: Any) -> Any:
    """Call a plain or async callback; plain ones run in the trio thread (keep them short)."""
    ret = fn(*args)
    if inspect.isawaitable(ret):
        ret = await ret
    return ret


__all__ = ["Producer", "SendFuture", "MessageQueueSelector", "select_by_hash", "call_maybe_async"]
