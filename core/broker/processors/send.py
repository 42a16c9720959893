"""SEND_MESSAGE (10), SEND_MESSAGE_V2 (310) and SEND_BATCH_MESSAGE (320) — docs/protocol.md §5.1.

Code 10 names its header fields in full (`producerGroup`, `topic`, ...); 310/320 use the
one-letter names `a`..`m`. The C++ wheel sends batches as code 10 with `batch:"1"` and
zlib-compresses a whole batch body of 4 KiB or more (docs/protocol.md §7.8): such a body is inflated first,
then split, and its sub-messages are stored uncompressed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from core.acl import may_write_inner
from core.broker.pop.handoff import deferring
from core.broker.topic_config import TopicConfig
from core.broker.transaction_batch import prepare_batch
from core.common import names
from core.common.codec import RecordError, decode_batch
from core.common.message import InnerMessage, MessageBatch
from core.common.properties import MessageConst, decode_properties
from core.common.sysflag import MessageSysFlag, PermName, TopicSysFlag
from core.remoting.codec import RemotingCommand
from core.remoting.codes import FLAG_RESPONSE, MQVersion, RequestCode, ResponseCode
from core.remoting.errors import HeaderError
from core.remoting.inflate import InflateLimitError, inflate_async
from core.store.results import PutStatus
from core.store.speedups import batch_props_have

from .common import error, java_int
from .send_props import INNER_MARK, RESERVED_PROPERTIES, SendPropsMemo, positive_int

_rng = random.Random()


class SendRefused(Exception):
    """A send refused by its checks: the response code and remark it is answered with."""

    def __init__(self, code: int, remark: str) -> None:
        super().__init__(code, remark)
        self.code = code
        self.remark = remark

# Header field names: (V1 long name, V2 letter).
_F_GROUP = ("producerGroup", "a")
_F_TOPIC = ("topic", "b")
_F_DEFAULT_TOPIC = ("defaultTopic", "c")
_F_DEFAULT_QUEUES = ("defaultTopicQueueNums", "d")
_F_QUEUE_ID = ("queueId", "e")
_F_SYS_FLAG = ("sysFlag", "f")
_F_BORN = ("bornTimestamp", "g")
_F_FLAG = ("flag", "h")
_F_PROPS = ("properties", "i")
_F_RECONSUME = ("reconsumeTimes", "j")
_F_UNIT = ("unitMode", "k")
_F_MAX_RECONSUME = ("maxReconsumeTimes", "l")
_F_BATCH = ("batch", "m")

REGION_DEFAULT = "DefaultRegion"


@dataclass(slots=True)
class SendHeader:
    """A decoded send request header (either naming)."""

    producer_group: str
    topic: str
    default_topic: str
    default_topic_queue_nums: int
    queue_id: int
    sys_flag: int
    born_timestamp: int
    flag: int
    properties: str | None
    reconsume_times: int
    unit_mode: bool
    max_reconsume_times: int | None
    batch: bool


_I32 = (-(1 << 31), (1 << 31) - 1)
_I64 = (-(1 << 63), (1 << 63) - 1)
_MISSING = "missing required ext field"


def _fast_int(value: object) -> int:
    """java_int for the usual forms only (a JSON number, unsigned digits); anything else
    raises and the header takes the checked path."""
    if type(value) is int:
        return value
    if value.isdigit() and value.isascii():  # AttributeError for a non-string
        return int(value)
    raise ValueError(value)


def _int(ext: dict, name: str, bounds: tuple[int, int], default: int | None = None) -> int:
    """One integer ext field, parsed inline: this runs several times per message (the
    generic `ext_int32` path costs ~15% of a send). `default=None` means required."""
    value = ext.get(name)
    if value is None or value == "":
        if default is None:
            raise HeaderError(name, _MISSING)
        return default
    try:
        number = java_int(value)
    except ValueError:
        raise HeaderError(name, f"invalid integer {value!r} in ext field") from None
    if not bounds[0] <= number <= bounds[1]:
        raise HeaderError(name, f"value {number} out of range")
    return number


def _str(ext: dict, name: str) -> str:
    value = ext.get(name)
    if value is None:
        raise HeaderError(name, _MISSING)
    return value if type(value) is str else str(value)


# Field names by naming: index 0 for code 10 (long names), 1 for 310/320 (letters).
_NAMES = tuple(
    tuple(f[i] for f in (
        _F_GROUP, _F_TOPIC, _F_DEFAULT_TOPIC, _F_DEFAULT_QUEUES, _F_QUEUE_ID, _F_SYS_FLAG,
        _F_BORN, _F_FLAG, _F_PROPS, _F_RECONSUME, _F_UNIT, _F_MAX_RECONSUME, _F_BATCH,
    ))
    for i in (0, 1)
)
_I32_MIN, _I32_MAX = _I32
_I64_MIN, _I64_MAX = _I64


def _flag(cmd: RemotingCommand, ext: dict, name: str) -> bool:
    """A boolean ext field, default False: `ext_bool` without its work for the usual
    spellings."""
    value = ext.get(name)
    if value is None or value == "" or value == "false" or value == "0":
        return False
    if value == "true" or value == "1":
        return True
    return bool(cmd.ext_bool(name, False))


def decode_send_header(cmd: RemotingCommand) -> SendHeader:
    """Read the header of any of the three send codes; HeaderError names a bad field."""
    i = 0 if cmd.code == RequestCode.SEND_MESSAGE else 1
    ext = cmd.ext_fields or {}
    n = _NAMES[i]
    batch = cmd.code == RequestCode.SEND_BATCH_MESSAGE or _flag(cmd, ext, n[12])
    # Fast path: the fields every client sends, as strings in range. Anything else (a
    # missing field, a number out of range, a non-string) takes the checked path below,
    # which parses the same way and names the bad field.
    try:
        group = ext[n[0]]
        topic = ext[n[1]]
        default_topic = ext[n[2]]
        queue_nums = _fast_int(ext[n[3]])
        queue_id = _fast_int(ext[n[4]])
        sys_flag = _fast_int(ext[n[5]])
        born = _fast_int(ext[n[6]])
        flag = _fast_int(ext[n[7]])
        reconsume = ext.get(n[9])
        reconsume = 0 if reconsume is None or reconsume == "" else _fast_int(reconsume)
        max_reconsume = ext.get(n[11])
        if max_reconsume is not None and max_reconsume != "":
            max_reconsume = _fast_int(max_reconsume)
            if not _I32_MIN <= max_reconsume <= _I32_MAX:
                raise ValueError
        else:
            max_reconsume = None
        if (
            type(group) is str and type(topic) is str and type(default_topic) is str
            and _I32_MIN <= queue_nums <= _I32_MAX and _I32_MIN <= queue_id <= _I32_MAX
            and _I32_MIN <= sys_flag <= _I32_MAX and _I64_MIN <= born <= _I64_MAX
            and _I32_MIN <= flag <= _I32_MAX and _I32_MIN <= reconsume <= _I32_MAX
        ):
            props = ext.get(n[8])
            return SendHeader(
                group, topic, default_topic, queue_nums, queue_id, sys_flag, born, flag,
                None if props is None else str(props), reconsume, _flag(cmd, ext, n[10]),
                max_reconsume, batch,
            )
    except (AttributeError, KeyError, TypeError, ValueError):
        pass
    props = ext.get(n[8])
    max_reconsume = ext.get(n[11])
    return SendHeader(
        producer_group=_str(ext, n[0]),
        topic=_str(ext, n[1]),
        default_topic=_str(ext, n[2]),
        default_topic_queue_nums=_int(ext, n[3], _I32),
        queue_id=_int(ext, n[4], _I32),
        sys_flag=_int(ext, n[5], _I32),
        born_timestamp=_int(ext, n[6], _I64),
        flag=_int(ext, n[7], _I32),
        properties=None if props is None else str(props),
        reconsume_times=_int(ext, n[9], _I32, 0),
        unit_mode=bool(cmd.ext_bool(n[10], False)),
        max_reconsume_times=(
            None if max_reconsume in (None, "") else _int(ext, n[11], _I32)
        ),
        batch=batch,
    )


# PutStatus name -> response code (Java's SendMessageProcessor.handlePutMessageResult);
# anything else (LMQ_CONSUME_QUEUE_NUM_EXCEEDED, QUEUE_ID_ILLEGAL, UNKNOWN_ERROR) is 1.
_PUT_CODES = {
    "OK": ResponseCode.SUCCESS,
    "FLUSH_DISK_TIMEOUT": ResponseCode.FLUSH_DISK_TIMEOUT,
    "FLUSH_SLAVE_TIMEOUT": ResponseCode.FLUSH_SLAVE_TIMEOUT,
    "SLAVE_NOT_AVAILABLE": ResponseCode.SLAVE_NOT_AVAILABLE,
    "SERVICE_NOT_AVAILABLE": ResponseCode.SERVICE_NOT_AVAILABLE,
    "MESSAGE_ILLEGAL": ResponseCode.MESSAGE_ILLEGAL,
    "PROPERTIES_SIZE_EXCEEDED": ResponseCode.MESSAGE_ILLEGAL,
    "LMQ_NAME_ILLEGAL": ResponseCode.MESSAGE_ILLEGAL,
}


def _status_code(status_name: str) -> int:
    return _PUT_CODES.get(status_name, ResponseCode.SYSTEM_ERROR)


# The same by status, for the hot path (Enum.name is a property lookup).
_CODE_BY_STATUS = {st: _status_code(st.name) for st in PutStatus}
# Codes of a stored message (the send response carries its msgId and offsets).
STORED_CODES = (
    ResponseCode.FLUSH_DISK_TIMEOUT, ResponseCode.FLUSH_SLAVE_TIMEOUT,
    ResponseCode.SLAVE_NOT_AVAILABLE,
)
# Names that passed the per-name checks of docs/protocol.md §5.1 step 1 (bounded: names come from clients).
_SENDABLE_MAX = 4096
# A batch body needs the per-sub-message DELAY check only if this occurs in it.
_DELAY_MARK = MessageConst.DELAY_TIME_LEVEL.encode() + b"\x01"
_INNER_MARK_BYTES = INNER_MARK.encode()
_RETRY_PREFIX = names.RETRY_GROUP_TOPIC_PREFIX
_WRITE = PermName.WRITE


def _batch_props_have(body: bytes, mark: bytes) -> bool:
    """Whether `mark` may be in the properties of a batch's messages: searched in their
    properties only when core._speedups is built (a 1 KiB body per message made the body
    search ~0.6 µs per message), else in the whole body. A malformed body says no: the
    store's split answers it (MESSAGE_ILLEGAL, "bad batch body")."""
    if batch_props_have is None or type(body) is not bytes:
        return mark in body
    return batch_props_have(body, mark) == 1


class SendProcessor:
    """Validates, builds the stored message(s) and appends them through the broker."""

    def __init__(self, broker) -> None:
        self.broker = broker
        self.config = broker.config
        self._sendable: set[str] = set()
        #: Properties texts read once (send_props.py); the hot path reads `entries`.
        self._props = SendPropsMemo(self.config.cluster_name)
        self._props_of = self._props.entries.get

    # ------------------------------------------------------------------ checks
    def _check(self, h: SendHeader, remote: str):
        """Java's msgCheck (docs/protocol.md §5.1 steps 1-3): (TopicConfig, queue id), or
        SendRefused."""
        broker = self.broker
        if not self.config.broker_permission & _WRITE:  # (PermName.is_writeable inlined)
            raise SendRefused(
                ResponseCode.NO_PERMISSION,
                f"the broker[{broker.broker_addr}] sending message is forbidden",
            )
        if h.topic not in self._sendable:
            self._check_name(h.topic)
        tcm = broker.topic_config_manager
        tc: TopicConfig | None = tcm.table.get(h.topic) or tcm.get(h.topic)
        if tc is None:
            sys_flag = TopicSysFlag.UNIT if h.unit_mode else 0
            if names.is_retry_topic(h.topic):
                tc = tcm.create_retry_topic_in_send_message_method(h.topic, sys_flag)
            elif names.validate_topic(h.default_topic) is None:
                tc = tcm.create_topic_in_send_message_method(
                    h.topic, h.default_topic, h.default_topic_queue_nums, sys_flag
                )
            if tc is None:
                raise SendRefused(
                    ResponseCode.TOPIC_NOT_EXIST,
                    f"topic[{h.topic}] not exist, apply first please!",
                )
        if not tc.perm & _WRITE:
            raise SendRefused(
                ResponseCode.NO_PERMISSION,
                f"the topic[{h.topic}] sending message is forbidden",
            )
        queue_id = h.queue_id
        if queue_id >= tc.read_queue_nums and queue_id >= tc.write_queue_nums:  # queue_nums
            raise SendRefused(
                ResponseCode.SYSTEM_ERROR,
                f"request queueId[{queue_id}] is illegal, topic:[{h.topic}] "
                f"topicConfig.writeQueueNums:[{tc.write_queue_nums}] "
                f"consumer queue nums:[{tc.read_queue_nums}] Producer:[{remote}]",
            )
        if queue_id < 0:
            queue_id = _rng.randrange(max(1, tc.write_queue_nums))
        return tc, queue_id

    def _check_name(self, topic: str) -> None:
        """The checks of docs/protocol.md §5.1 step 1 that depend on the name only
        (remembered when passed); SendRefused."""
        reason = names.validate_topic(topic)
        if reason is not None:
            raise SendRefused(ResponseCode.SYSTEM_ERROR, reason)
        if topic in names.NOT_ALLOWED_SEND_TOPICS:
            raise SendRefused(
                ResponseCode.NO_PERMISSION, f"Sending message to topic[{topic}] is forbidden."
            )
        if names.is_lmq(topic):
            # LMQs are written through INNER_MULTI_DISPATCH of a normal topic (docs/protocol.md §10.2).
            raise SendRefused(
                ResponseCode.NO_PERMISSION,
                f"Sending message to topic[{topic}] is forbidden: LMQs are filled through "
                f"the {MessageConst.INNER_MULTI_DISPATCH} property",
            )
        if len(self._sendable) >= _SENDABLE_MAX:
            self._sendable.clear()
        self._sendable.add(topic)

    def _retry_or_dlq(self, version: int, h: SendHeader, inner: InnerMessage) -> None:
        """docs/protocol.md §5.1 step 4: a %RETRY% message consumed too often goes to
        %DLQ%<group>; SendRefused."""
        if not names.is_retry_topic(h.topic):
            return None
        group = h.topic[len(names.RETRY_GROUP_TOPIC_PREFIX):]
        sg = self.broker.subscription_group_manager.find_or_create(group)
        if sg is None:
            raise SendRefused(
                ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                f"subscription group not exist, {group}",
            )
        max_times = sg.retry_max_times
        # Java honours the header's maxReconsumeTimes only for clients >= V3_4_9 (docs/protocol.md §1.2).
        if version >= MQVersion.V3_4_9 and h.max_reconsume_times is not None:
            max_times = h.max_reconsume_times
        if h.reconsume_times >= max_times:
            dlq = names.dlq_topic(group)
            tc = self.broker.topic_config_manager.create_topic_in_send_back_method(
                dlq, 1, PermName.READ | PermName.WRITE
            )
            inner.topic = dlq
            inner.queue_id = _rng.randrange(max(1, tc.write_queue_nums))

    # ------------------------------------------------------------------ handler
    async def handle(self, ctx, cmd: RemotingCommand) -> RemotingCommand:
        h = decode_send_header(cmd)
        try:
            result, queue_id = await deferring(self.broker, self.store(  # pop/handoff.py
                h, cmd.body_bytes(), ctx.remote_addr, self._may_write_inner(ctx), cmd.version))
        except SendRefused as refused:
            return error(cmd, refused.code, refused.remark)
        return self._response(cmd, result, queue_id)

    async def store(self, h: SendHeader, body: bytes, remote: str, may_inner: bool,
                    version: int):
        """Every check of a send and its put (the request's path and LocalSend's):
        (PutResult, queue id answered), or SendRefused with the response code. A SYNC
        flush or SYNC_MASTER put returns once flushed / replicated, as the put does.
        `may_inner`: the sender may set INNER_MULTI_DISPATCH (docs/acl.md §4)."""
        _tc, queue_id = self._check(h, remote)
        if h.batch:
            return await self._send_batch(h, queue_id, body, remote, may_inner)
        if len(body) > self.config.max_message_size:
            raise SendRefused(
                ResponseCode.MESSAGE_ILLEGAL,
                f"the message body size over max value, MAX: {self.config.max_message_size}",
            )
        broker = self.broker
        # The properties read once per text (send_props.py): reserved names, DELAY,
        # timer and transaction properties found then; this send gets its own dict.
        text = h.properties
        read = self._props_of(text) or self._props.read(text)
        props = read.props.copy()
        retry = h.topic.startswith(_RETRY_PREFIX)
        if read.reserved:
            if retry:
                # A consumer's send-back copies the consumed message's properties.
                for key in read.reserved:
                    del props[key]
            elif not may_inner:
                raise _reserved_refusal(read.reserved[0])
        inner = InnerMessage(
            h.topic, body, queue_id, h.flag, props, h.sys_flag, h.born_timestamp,
            broker.encode_client_host(remote), broker.store_host, h.reconsume_times,
        )
        if retry:
            self._retry_or_dlq(version, h, inner)
        response_queue_id = inner.queue_id
        delayed = read.delayed
        # A DELAY level or Apache 5's timer properties (schedule.py "Timer messages").
        timed = read.timed
        # Java: a re-consumed transactional message coming back with a delay (the retry of
        # old clients) is an ordinary scheduled message, not a new half message.
        if read.prepared and not (inner.reconsume_times > 0 and delayed):
            service = broker.transaction_service
            if service is None:
                raise SendRefused(
                    ResponseCode.NO_PERMISSION,
                    f"the broker[{broker.broker_addr}] sending transaction message is forbidden",
                )
            # Apache checks a half message's delivery time at its send (its put runs the
            # timer checks); the commit then holds it (transaction.py).
            if timed and broker.schedule_service is not None:
                refused = broker.schedule_service.check_timer(inner)
                if refused is not None:
                    raise SendRefused(ResponseCode.MESSAGE_ILLEGAL, refused)
            service.prepare(inner)
        elif (
            timed
            and broker.schedule_service is not None
            and MessageSysFlag.transaction_value(inner.sys_flag)
            in (MessageSysFlag.TRANSACTION_NOT_TYPE, MessageSysFlag.TRANSACTION_COMMIT_TYPE)
        ):
            refused = broker.schedule_service.check_timer(inner)  # Apache: WHEEL_TIMER_MSG_ILLEGAL
            if refused is not None:
                raise SendRefused(ResponseCode.MESSAGE_ILLEGAL, refused)
            broker.schedule_service.hold(inner)
        return await broker.put_message(inner), response_queue_id

    def _may_write_inner(self, ctx) -> bool:
        return may_write_inner(
            ctx,
            acl_enable=self.config.acl_enable,
            allow_without_acl=self.config.allow_inner_properties_without_acl,
        )

    @staticmethod
    def _check_batch_inner(reserved: tuple[str, ...], body: bytes) -> None:
        """SendRefused if the batch (its properties set `reserved`) or one of its messages
        sets a reserved property."""
        if not reserved and _batch_props_have(body, _INNER_MARK_BYTES):
            try:
                items = decode_batch(body)
            except RecordError:
                return  # answered as a malformed batch below
            for item in items:
                props = decode_properties(item.properties)
                reserved = tuple(k for k in RESERVED_PROPERTIES if k in props)
                if reserved:
                    break
        if reserved:
            raise _reserved_refusal(reserved[0])

    async def _send_batch(self, h: SendHeader, queue_id: int, body: bytes, remote: str,
                          may_inner: bool):
        limit = self.config.max_message_size
        if names.is_retry_topic(h.topic):
            raise SendRefused(ResponseCode.MESSAGE_ILLEGAL, "retry topic is not allowed for batch")
        tran = MessageSysFlag.transaction_value(h.sys_flag)
        if tran != MessageSysFlag.TRANSACTION_NOT_TYPE and (
            # lmq extension: a prepared batch becomes one half message (transaction_batch.py)
            tran != MessageSysFlag.TRANSACTION_PREPARED_TYPE
            or self.broker.transaction_service is None
        ):
            raise SendRefused(
                ResponseCode.MESSAGE_ILLEGAL, "batch message does not support transaction"
            )
        sys_flag = h.sys_flag
        if sys_flag & MessageSysFlag.COMPRESSED:
            # C++ 1.2.3 compresses the whole batch (docs/protocol.md §7.8): inflate, bounded by the limit.
            # Bounded, and off the loop past its first 64 KiB (core.remoting.inflate).
            try:
                body = await inflate_async(body, limit)
            except InflateLimitError:
                raise SendRefused(
                    ResponseCode.MESSAGE_ILLEGAL,
                    f"the message body size over max value, MAX: {limit}",
                ) from None
            except ValueError as exc:
                raise SendRefused(ResponseCode.MESSAGE_ILLEGAL,
                                  f"cannot inflate batch body: {exc}") from None
            sys_flag &= ~MessageSysFlag.COMPRESSED
        elif len(body) > limit:
            raise SendRefused(
                ResponseCode.MESSAGE_ILLEGAL,
                f"the message body size over max value, MAX: {limit}",
            )
        broker = self.broker
        read = self._props_of(h.properties) or self._props.read(h.properties)
        batch_props = read.props  # (shared: read only)
        if not may_inner:
            self._check_batch_inner(read.reserved, body)
        if tran == MessageSysFlag.TRANSACTION_PREPARED_TYPE:
            half = prepare_batch(broker.transaction_service, h, queue_id, body, batch_props,
                                 sys_flag, broker.encode_client_host(remote), broker.store_host)
            if isinstance(half, str):
                raise SendRefused(ResponseCode.MESSAGE_ILLEGAL, half)
            return await broker.put_message(half), queue_id
        if (body and not _batch_props_have(body, _DELAY_MARK)
                and MessageConst.DELAY_TIME_LEVEL not in batch_props):
            # No DELAY anywhere (the usual case): the store splits the body itself, with no
            # object per sub-message, and answers MESSAGE_ILLEGAL for a malformed one.
            result = await broker.put_messages(MessageBatch(
                h.topic, queue_id, body, read.text, sys_flag,
                h.born_timestamp, broker.encode_client_host(remote), broker.store_host,
                h.reconsume_times,
            ))
            return result, queue_id
        try:
            items = decode_batch(body)
        except RecordError as exc:
            raise SendRefused(ResponseCode.MESSAGE_ILLEGAL, f"bad batch body: {exc}") from None
        if not items:
            raise SendRefused(ResponseCode.MESSAGE_ILLEGAL, "empty batch")
        if read.delayed:
            raise SendRefused(ResponseCode.MESSAGE_ILLEGAL, "batch message does not support delay")
        born_host = broker.encode_client_host(remote)
        inners = []
        for item in items:
            props = decode_properties(item.properties)
            if positive_int(props.get(MessageConst.DELAY_TIME_LEVEL)):
                raise SendRefused(
                    ResponseCode.MESSAGE_ILLEGAL, "batch message does not support delay"
                )
            props.pop(MessageConst.WAIT_STORE_MSG_OK, None)
            # Java appends the batch-level properties after each sub-message's own.
            props.update(batch_props)
            inners.append(
                InnerMessage(
                    topic=h.topic,
                    body=item.body,
                    queue_id=queue_id,
                    flag=item.flag,
                    properties=props,
                    sys_flag=sys_flag,
                    born_timestamp=h.born_timestamp,
                    born_host=born_host,
                    store_host=broker.store_host,
                    reconsume_times=h.reconsume_times,
                )
            )
        return await broker.put_messages(inners), queue_id

    def _response(self, cmd: RemotingCommand, result, queue_id: int) -> RemotingCommand:
        code = put_code(result)
        if code and code not in STORED_CODES:
            return error(cmd, code, put_failure(result))
        ids = result.msg_ids
        # Every value a JSON string: the C++ decoder reads numbers as 0 (docs/protocol.md §1.4 rule 3).
        ext = {
            "msgId": ids[0] if len(ids) == 1 else ",".join(ids),
            "queueId": str(queue_id),
            "queueOffset": str(result.queue_offset),
            "MSG_REGION": REGION_DEFAULT,
            "TRACE_ON": "true",
        }
        return RemotingCommand(
            code, opaque=cmd.opaque, flag=FLAG_RESPONSE, remark=result.remark if code else None,
            ext_fields=ext, serialize_type=cmd.serialize_type,
        )


def put_code(result) -> int:
    """The response code of a put's result (SUCCESS, a stored-but code of STORED_CODES,
    or a refusal)."""
    code = _CODE_BY_STATUS.get(result.status)
    return _status_code(result.status.name) if code is None else code


def put_failure(result) -> str:
    """The remark of a put that stored nothing."""
    return result.remark or f"put message failed: {result.status.name}"


def _reserved_refusal(key: str) -> SendRefused:
    return SendRefused(
        ResponseCode.NO_PERMISSION,
        f"the message property {key} is reserved for the broker and gateways",
    )


def register(table, broker) -> None:
    """Route the three send codes to one SendProcessor."""
    proc = SendProcessor(broker)
    for code in (
        RequestCode.SEND_MESSAGE,
        RequestCode.SEND_MESSAGE_V2,
        RequestCode.SEND_BATCH_MESSAGE,
    ):
        table.register(code, proc.handle, inline=not (broker.sync_flush or broker.sync_master))


__all__ = ["STORED_CODES", "HeaderError", "SendHeader", "SendProcessor", "SendRefused",
           "decode_send_header", "put_code", "put_failure", "register"]
