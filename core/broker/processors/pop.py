"""POP_MESSAGE (200050), ACK_MESSAGE (200051), BATCH_ACK_MESSAGE (200151) and
CHANGE_MESSAGE_INVISIBLETIME (200053): RocketMQ 5 POP consumption (docs/pop.md); the
private holder, dead-letter and purge requests (900001-900004).

Header fields are Apache RocketMQ 5's. The state lives in `core.broker.pop`; this module
parses and checks requests, runs long polls, and builds the responses.
"""

from __future__ import annotations

import base64
import binascii

from core.broker.pop.handle import parse_extra_info
from core.broker.pop.local import access_error, param_error, pop_held
from core.broker.pop.service import (
    POP_MAX_INVISIBLE_MS,
    POP_MAX_POLL_MS,
    PopService,
    PopStateFull,
)
from core.broker.processors.pull import _cached_filter
from core.remoting.codec import RemotingCommand
from core.remoting.codes import RequestCode, ResponseCode

from .common import error, ext_int32, ext_int64, parse_json_body, required_group, required_topic

__all__ = ["register"]

#: Connection attribute naming the POP holder registered on it.
HOLDER_ATTR = "lmq.pop.holder"
#: Longest holder id (INVALID_PARAMETER beyond; no spaces either).
POP_MAX_HOLDER_ID_LENGTH = 255

#: Most entries in one BATCH_ACK_MESSAGE body, and most bytes of one entry's bit set.
BATCH_ACK_MAX_ENTRIES = 1024
BATCH_ACK_MAX_BITSET_BYTES = 4096


class PopProcessor:
    def __init__(self, broker, service: PopService) -> None:
        self.broker = broker
        self.service = service

    def _check_access(self, cmd: RemotingCommand, group: str, topic: str):
        """(topic config, None) or (None, error response)."""
        tc, err = access_error(self.broker, group, topic)
        return (tc, None) if err is None else (None, error(cmd, *err))

    # ------------------------------------------------------------------ pop
    async def pop(self, ctx, cmd: RemotingCommand) -> RemotingCommand:
        group = required_group(cmd, "consumerGroup")
        topic = required_topic(cmd)
        queue_id = ext_int32(cmd, "queueId", required=True)
        max_nums = ext_int32(cmd, "maxMsgNums", required=True)
        invisible_ms = ext_int64(cmd, "invisibleTime", required=True)
        poll_ms = ext_int64(cmd, "pollTime", required=True)
        ext_int64(cmd, "bornTime", required=True)
        init_mode = ext_int32(cmd, "initMode", required=True)
        bad = param_error(max_nums, invisible_ms)
        if bad is not None:
            return error(cmd, ResponseCode.INVALID_PARAMETER, bad)
        tc, err = self._check_access(cmd, group, topic)
        if err is not None:
            return err
        if queue_id >= tc.read_queue_nums:
            return error(cmd, ResponseCode.INVALID_PARAMETER,
                         f"queueId[{queue_id}] is illegal, topic:[{topic}] "
                         f"topicConfig.readQueueNums:[{tc.read_queue_nums}]")
        try:
            filt = _cached_filter(cmd.ext_str("expType") or None, cmd.ext_str("exp") or None)
        except Exception as exc:  # FilterParseError and friends
            return error(cmd, ResponseCode.SUBSCRIPTION_PARSE_FAILED, str(exc))
        holder = self._holder(cmd, ctx, required=False)
        if isinstance(holder, RemotingCommand):
            return holder
        service = self.service
        order = service.orderly.wanted(group, cmd.ext_bool("order", False))  # FIFO groups
        hold_s = min(max(poll_ms, 0), POP_MAX_POLL_MS) / 1000.0
        try:
            batch, full = await pop_held(service, group, topic, queue_id, tc.read_queue_nums,
                                         max_nums, invisible_ms, init_mode, filt, holder,
                                         order, hold_s, self._volatile(cmd))
        except PopStateFull as exc:
            return error(cmd, ResponseCode.SYSTEM_BUSY, f"too many POP consumers: {exc}")
        if full:
            return self._response(cmd, ResponseCode.POLLING_FULL, batch, invisible_ms)
        code = ResponseCode.SUCCESS if batch.count else ResponseCode.POLLING_TIMEOUT
        return self._response(cmd, code, batch, invisible_ms)

    def _volatile(self, cmd: RemotingCommand) -> bool:
        """The lmq-gateway extension field `volatile` (docs/pop.md "Volatile states");
        ignored in apache_strict mode, as an Apache broker ignores it."""
        return cmd.ext_str("volatile") == "true" and not self.broker.config.apache_strict

    def _response(self, cmd, code, batch, invisible_ms) -> RemotingCommand:
        ext = {
            "popTime": str(batch.pop_time),
            "invisibleTime": str(invisible_ms),
            "reviveQid": "0",
            "restNum": str(batch.rest_num),
        }
        if batch.count:
            ext["startOffsetInfo"] = ";".join(batch.start_offset_info)
            ext["msgOffsetInfo"] = ";".join(batch.msg_offset_info)
        return cmd.make_response(code, None, ext, batch.buffers if batch.count else None)

    # ------------------------------------------------------------------ holders
    def _holder(self, cmd: RemotingCommand, ctx, required: bool):
        """The request's `holderId` (else the one registered on its connection), or an
        error response when it is malformed."""
        holder = cmd.ext_str("holderId")
        if not holder:
            if required:
                return error(cmd, ResponseCode.INVALID_PARAMETER, "holderId is required")
            attrs = getattr(ctx.connection, "attributes", None)
            return attrs.get(HOLDER_ATTR) if attrs is not None else None
        if len(holder) > POP_MAX_HOLDER_ID_LENGTH or not holder.isprintable() or " " in holder:
            return error(cmd, ResponseCode.INVALID_PARAMETER,
                         f"holderId must be 1..{POP_MAX_HOLDER_ID_LENGTH} printable "
                         "characters without spaces")
        return holder

    async def register_holder(self, ctx, cmd: RemotingCommand) -> RemotingCommand:
        holder = self._holder(cmd, ctx, required=True)
        if isinstance(holder, RemotingCommand):
            return holder
        conn = ctx.connection
        attrs = getattr(conn, "attributes", None)
        if attrs is None:
            return error(cmd, ResponseCode.SYSTEM_ERROR, "connection cannot hold a holder")
        first = HOLDER_ATTR not in attrs
        attrs[HOLDER_ATTR] = holder
        if first:
            service = self.service

            def closed() -> None:
                current = attrs.get(HOLDER_ATTR)
                if current is not None:
                    service.release(current)

            conn.add_close_callback(closed)
        return cmd.make_response(ResponseCode.SUCCESS)

    async def release_holder(self, ctx, cmd: RemotingCommand) -> RemotingCommand:
        holder = self._holder(cmd, ctx, required=True)
        if isinstance(holder, RemotingCommand):
            return holder
        released = self.service.release(holder)
        return cmd.make_response(ResponseCode.SUCCESS, None, {"released": str(released)})

    # ------------------------------------------------------------------ ack
    def _handle(self, cmd: RemotingCommand):
        try:
            return parse_extra_info(cmd.ext_str("extraInfo", required=True))
        except ValueError as exc:
            return error(cmd, ResponseCode.INVALID_PARAMETER, f"bad extraInfo: {exc}")

    def _target(self, cmd: RemotingCommand):
        """(group, topic, queueId, offset, receipt handle) of an ACK-shaped header, or the
        error response for a bad handle."""
        group = required_group(cmd, "consumerGroup")
        topic = required_topic(cmd)
        queue_id = ext_int32(cmd, "queueId", required=True)
        offset = ext_int64(cmd, "offset", required=True)
        handle = self._handle(cmd)
        if isinstance(handle, RemotingCommand):
            return handle
        return group, topic, queue_id, offset, handle

    async def ack(self, ctx, cmd: RemotingCommand) -> RemotingCommand:
        target = self._target(cmd)
        if isinstance(target, RemotingCommand):
            return target
        group, topic, queue_id, offset, handle = target
        if self.broker.topic_config_manager.get(topic) is None:
            return error(cmd, ResponseCode.TOPIC_NOT_EXIST,
                         f"topic[{topic}] not exist, apply first please!")
        size = self.service.journal.size
        if not self.service.ack(group, topic, queue_id, offset, handle.pop_time):
            return error(cmd, ResponseCode.NO_MESSAGE,
                         f"no in-flight message at offset {offset} with this receipt handle")
        return await self._replicated(cmd, cmd.make_response(ResponseCode.SUCCESS), None, size)

    async def _replicated(self, cmd: RemotingCommand, response: RemotingCommand,
                          ext: dict[str, str] | None = None, size: int | None = None):
        """SYNC_MASTER: `response` once a slave holds the journal flush of this request
        (docs/ha.md, "POP state"), else the send's FLUSH_SLAVE_TIMEOUT or
        SLAVE_NOT_AVAILABLE (the change is made on this broker all the same; `ext`, the
        response's header fields, goes with that answer too: a new receipt handle).
        `response` at once when the journal is still `size` bytes: the request wrote
        nothing to replicate (volatile states, docs/pop.md)."""
        broker = self.broker
        ha = getattr(broker, "ha_master", None)
        if not broker.sync_master or ha is None or self.service.journal.size == size:
            return response
        status = await ha.wait_pop_replicated(broker.config.sync_slave_timeout_s)
        if status == "OK":
            return response
        return cmd.make_response(getattr(ResponseCode, status),
                                 f"POP state not replicated to a slave: {status}", ext)

    async def dead_letter(self, ctx, cmd: RemotingCommand) -> RemotingCommand:
        """POP_DEAD_LETTER (900003, ACK_MESSAGE's header): reject without requeue."""
        target = self._target(cmd)
        if isinstance(target, RemotingCommand):
            return target
        group, topic, queue_id, offset, handle = target
        if not self.service.dead_letter(group, topic, queue_id, offset, handle.pop_time):
            return error(cmd, ResponseCode.NO_MESSAGE,
                         f"no in-flight message at offset {offset} with this receipt handle")
        return cmd.make_response(ResponseCode.SUCCESS)

    async def purge(self, ctx, cmd: RemotingCommand) -> RemotingCommand:
        """POP_PURGE (900004): drop what waits for delivery in (group, topic, queue);
        `all` = true drops the unacknowledged deliveries and the queue state too.
        Response header `purged` = how many."""
        group = required_group(cmd, "consumerGroup")
        topic = required_topic(cmd)
        queue_id = ext_int32(cmd, "queueId", required=True)
        _, denied = self._check_access(cmd, group, topic)
        if denied is not None:
            if denied.code == ResponseCode.TOPIC_NOT_EXIST:  # nothing stored: nothing to drop
                return cmd.make_response(ResponseCode.SUCCESS, None, {"purged": "0"})
            return denied
        everything = cmd.ext_str("all") == "true"
        try:
            purged = self.service.purge(group, topic, queue_id, everything, self._volatile(cmd))
        except PopStateFull as exc:
            return error(cmd, ResponseCode.SYSTEM_BUSY, str(exc))
        return cmd.make_response(ResponseCode.SUCCESS, None, {"purged": str(purged)})

    async def batch_ack(self, ctx, cmd: RemotingCommand) -> RemotingCommand:
        data = parse_json_body(cmd)
        acks = data.get("acks") if isinstance(data, dict) else None
        if not isinstance(acks, list) or len(acks) > BATCH_ACK_MAX_ENTRIES:
            return error(cmd, ResponseCode.INVALID_PARAMETER,
                         f"acks must be a list of at most {BATCH_ACK_MAX_ENTRIES} entries")
        service = self.service
        size = service.journal.size
        for item in acks:
            try:
                group, topic, qid, start, pop_time, bits = _batch_entry(item)
            except (TypeError, ValueError, KeyError, binascii.Error) as exc:
                service.journal.flush()
                return error(cmd, ResponseCode.INVALID_PARAMETER, f"bad ack entry: {exc}")
            if service.ack_bits(group, topic, qid, start, bits, pop_time) < _bit_count(bits):
                size = None  # a stale entry (a retry?): wait for what was journaled before
        service.journal.flush()
        return await self._replicated(cmd, cmd.make_response(ResponseCode.SUCCESS), None, size)

    # ------------------------------------------------------------------ change
    async def change(self, ctx, cmd: RemotingCommand) -> RemotingCommand:
        group = required_group(cmd, "consumerGroup")
        topic = required_topic(cmd)
        queue_id = ext_int32(cmd, "queueId", required=True)
        offset = ext_int64(cmd, "offset", required=True)
        invisible_ms = ext_int64(cmd, "invisibleTime", required=True)
        if not 0 <= invisible_ms <= POP_MAX_INVISIBLE_MS:
            return error(cmd, ResponseCode.INVALID_PARAMETER,
                         f"invisibleTime {invisible_ms} is not in 0..{POP_MAX_INVISIBLE_MS}")
        handle = self._handle(cmd)
        if isinstance(handle, RemotingCommand):
            return handle
        if self.broker.topic_config_manager.get(topic) is None:
            return error(cmd, ResponseCode.TOPIC_NOT_EXIST,
                         f"topic[{topic}] not exist, apply first please!")
        size = self.service.journal.size
        new_pop_time = self.service.change_invisible(
            group, topic, queue_id, offset, handle.pop_time, invisible_ms)
        if new_pop_time is None:
            return error(cmd, ResponseCode.NO_MESSAGE,
                         f"no in-flight message at offset {offset} with this receipt handle")
        ext = {"popTime": str(new_pop_time), "invisibleTime": str(invisible_ms),
               "reviveQid": str(handle.revive_qid)}
        return await self._replicated(cmd, cmd.make_response(ResponseCode.SUCCESS, None, ext),
                                      ext, size)


def _bit_count(bits: bytes) -> int:
    return int.from_bytes(bits, "little").bit_count()


def _batch_entry(item) -> tuple[str, str, int, int, int, bytes]:
    """One BatchAck object (short or long field names, as Apache accepts)."""
    def get(short: str, long: str):
        return item[short] if short in item else item[long]

    if not isinstance(item, dict):
        raise TypeError("entry is not an object")
    if str(get("r", "retry")) != "0":
        raise ValueError("retry-topic acks are not served by this broker")
    raw = get("b", "bitSet")
    if not isinstance(raw, str) or len(raw) > BATCH_ACK_MAX_BITSET_BYTES * 4 // 3 + 4:
        raise ValueError("bitSet is not a base64 string of bounded length")
    return (str(get("c", "consumerGroup")), str(get("t", "topic")), int(get("q", "queueId")),
            int(get("so", "startOffset")), int(get("pt", "popTime")),
            base64.b64decode(raw, validate=True))


def register(table, broker) -> None:
    service = getattr(broker, "pop_service", None)
    if service is None:
        # The broker runs it among its services (revive timer): see `services`.
        service = broker.pop_service = PopService(broker)
    proc = PopProcessor(broker, service)
    # POP waits (long polling): its own task. The others only touch memory (but see below).
    table.register(RequestCode.POP_MESSAGE, proc.pop, inline=False)
    # Under SYNC_MASTER these wait for the slave (`_replicated`): their own task then.
    inline = not broker.sync_master
    table.register(RequestCode.ACK_MESSAGE, proc.ack, inline=inline)
    table.register(RequestCode.BATCH_ACK_MESSAGE, proc.batch_ack, inline=inline)
    table.register(RequestCode.CHANGE_MESSAGE_INVISIBLETIME, proc.change, inline=inline)
    table.register(RequestCode.POP_HOLDER_REGISTER, proc.register_holder)
    table.register(RequestCode.POP_HOLDER_RELEASE, proc.release_holder)
    table.register(RequestCode.POP_DEAD_LETTER, proc.dead_letter)
    table.register(RequestCode.POP_PURGE, proc.purge)
