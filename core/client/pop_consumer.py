"""A small POP API (RocketMQ 5 POP_MESSAGE / ACK / CHANGE_INVISIBLETIME) against one
broker — docs/pop.md.

    pop = PopClient(remoting_client, broker_addr, broker_name, "GID_X")
    result = await pop.pop("TopicA", max_nums=16, invisible_ms=30_000, poll_ms=5_000)
    for m in result.messages:
        ...
        await pop.ack(m)            # or: await pop.nack(m) / await pop.change_invisible(m, ms)

Each `PopMessage` carries its receipt handle (`handle`, also the message's POP_CK
property): the broker sets POP_CK on redeliveries; for first deliveries it is built from
the response header (startOffsetInfo), as Apache's client does.

`pop(..., light=True)` gives each `PopMessage` a `PopRecord` instead of a `MessageExt`: the
body, store timestamp, reconsume times and the properties (decoded when first read), for
consumers on a hot path (the AMQP gateway). The queue offsets then come from the
response's msgOffsetInfo header, not from each record's properties (the records' decode:
core/client/pop_records.py).
"""

from __future__ import annotations

import base64
import json
import logging
import time
from dataclasses import dataclass, field

from core.client.errors import MQBrokerError
from core.client.pop_records import PopRecord, light_records
from core.common import names
from core.common.codec import decode_records
from core.common.message import MessageExt
from core.remoting.codec import RemotingCommand
from core.remoting.codes import RequestCode, ResponseCode

__all__ = ["PopClient", "PopMessage", "PopRecord", "PopResult", "PopStatus", "INIT_MODE_MIN",
           "INIT_MODE_MAX", "SLAVE_UNCONFIRMED", "UNCONFIRMED", "private_code_refused"]

log = logging.getLogger(__name__)

POP_CK = "POP_CK"
#: How long `send_back_to_dlq` keeps a message invisible while it copies it to the DLQ.
SEND_BACK_HOLD_MS = 30_000
INIT_MODE_MIN = 0
INIT_MODE_MAX = 1


#: Answers of a SYNC_MASTER broker whose slave did not confirm an ack or a change in time
#: (docs/ha.md "POP state"): the ack or change is applied on the master all the same.
SLAVE_UNCONFIRMED = frozenset({ResponseCode.FLUSH_SLAVE_TIMEOUT,
                               ResponseCode.SLAVE_NOT_AVAILABLE})
#: At most one WARNING about such answers per this many seconds, per process.
UNCONFIRMED_LOG_S = 60.0


class UnconfirmedAcks:
    """POP acks and changes a master applied but its slave did not confirm: counted
    (`count`), with one WARNING per `UNCONFIRMED_LOG_S` giving the number since the last."""

    def __init__(self) -> None:
        self.count = 0
        self._logged = 0
        self._next_log = 0.0

    def note(self, addr: str, code: int) -> None:
        self.count += 1
        now = time.monotonic()
        if now >= self._next_log:
            self._next_log = now + UNCONFIRMED_LOG_S
            log.warning("POP: %d ack(s) or change(s) applied on master %s but not confirmed "
                        "by a slave (%s); a failover before the slave catches up may "
                        "redeliver them (docs/client.md)", self.count - self._logged, addr,
                        ResponseCode(code).name)
            self._logged = self.count


#: The process's count of unconfirmed POP acks and changes.
UNCONFIRMED = UnconfirmedAcks()


def private_code_refused(exc: BaseException) -> bool:
    """The broker does not know the request code: an Apache broker, or ours in
    apache_strict mode, answering one of lmq-gateway's private POP codes (docs/pop.md)."""
    return isinstance(exc, MQBrokerError) and exc.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED


class PopStatus:
    FOUND = "FOUND"
    NO_NEW_MSG = "NO_NEW_MSG"
    POLLING_FULL = "POLLING_FULL"


def _offset_list(text: str | None) -> list[tuple[int, int]] | None:
    """msgOffsetInfo "0 qid o1,o2;0 qid o3" -> [(qid, o1), (qid, o2), (qid, o3)], in the
    order of the answer's records; None when absent or not all first-topic entries."""
    if not text:
        return None
    out: list[tuple[int, int]] = []
    try:
        for one in text.split(";"):
            retry, qid, offsets = one.split(" ")
            if retry != "0":
                return None
            q = int(qid)
            out.extend((q, int(o)) for o in offsets.split(","))
    except ValueError:
        return None
    return out


@dataclass(slots=True)
class PopMessage:
    """A popped message and what acknowledging it needs."""

    message: MessageExt | PopRecord
    topic: str  # the topic popped (an LMQ name for LMQ pops)
    queue_id: int
    queue_offset: int  # in `topic`
    handle: str

    @property
    def body(self) -> bytes:
        return self.message.body

    @property
    def delivery_count(self) -> int:
        """1 on the first delivery, +1 for each redelivery (reconsume times + 1)."""
        return self.message.reconsume_times + 1

    @property
    def redelivered(self) -> bool:
        return self.message.reconsume_times > 0


@dataclass(slots=True)
class PopResult:
    status: str
    messages: list[PopMessage] = field(default_factory=list)
    pop_time: int = 0
    invisible_time: int = 0
    rest_num: int = 0


def _info_map(text: str | None) -> dict[str, str]:
    """"retry qid value;..." -> {"retry@qid": value}."""
    out: dict[str, str] = {}
    if text:
        for one in text.split(";"):
            parts = one.split(" ")
            if len(parts) == 3:
                out[f"{parts[0]}@{parts[1]}"] = parts[2]
    return out


class PopClient:
    """POP consumption of one group from one broker, over a `RemotingClient`."""

    def __init__(self, client, broker_addr: str, broker_name: str, group: str,
                 timeout_s: float = 30.0, holder_id: str | None = None) -> None:
        self.client = client
        self.broker_addr = broker_addr
        self.broker_name = broker_name
        self.group = group
        self.timeout_s = timeout_s
        #: Sent as `holderId` with every pop (lmq-gateway extension, docs/pop.md).
        self.holder_id = holder_id
        #: The broker's POP service in this process (`core.broker.pop.local.LocalPop`),
        #: when the caller attached it: light, unfiltered pops and `local_ack_entries` use it
        #: instead of requests (docs/pop.md "In process").
        self.local = None

    async def _invoke(self, cmd: RemotingCommand, extra_s: float = 0.0) -> RemotingCommand:
        return await self.client.invoke(self.broker_addr, cmd, self.timeout_s + extra_s)

    async def pop(self, topic: str, *, max_nums: int = 32, invisible_ms: int = 30_000,
                  poll_ms: int = 0, queue_id: int = -1, init_mode: int = INIT_MODE_MIN,
                  exp_type: str | None = None, exp: str | None = None,
                  light: bool = False, volatile: bool = False,
                  hand_off=None) -> PopResult:
        """`volatile`: the broker need not journal this (group, topic) state (a non-durable
        queue; sent as the lmq-gateway field `volatile`, docs/pop.md "Volatile states").
        `hand_off`: with the in-process service (`local`), a light pop that waits hands
        what arrives meanwhile to it (docs/pop.md "Delivery at arrival")."""
        local = self.local
        if local is not None and light and not exp_type and not exp:
            batch, full = await local.pop(self.group, topic, max_nums, invisible_ms, poll_ms,
                                          queue_id, init_mode, self.holder_id, volatile,
                                          hand_off=hand_off)
            if full:
                return PopResult(PopStatus.POLLING_FULL)
            if not batch.count:
                return PopResult(PopStatus.NO_NEW_MSG, rest_num=batch.rest_num)
            return self.local_result(batch, topic, invisible_ms)
        ext = {
            "consumerGroup": self.group, "topic": topic, "queueId": str(queue_id),
            "maxMsgNums": str(max_nums), "invisibleTime": str(invisible_ms),
            "pollTime": str(poll_ms), "bornTime": str(int(time.time() * 1000)),
            "initMode": str(init_mode),
        }
        if exp_type:
            ext["expType"] = exp_type
        if exp:
            ext["exp"] = exp
        if self.holder_id:
            ext["holderId"] = self.holder_id
        if volatile:
            ext["volatile"] = "true"
        resp = await self._invoke(RemotingCommand.request(RequestCode.POP_MESSAGE, ext),
                                  poll_ms / 1000.0)
        h = resp.ext_fields or {}
        if resp.code in (ResponseCode.POLLING_TIMEOUT, ResponseCode.PULL_NOT_FOUND):
            return PopResult(PopStatus.NO_NEW_MSG, rest_num=int(h.get("restNum", 0)))
        if resp.code == ResponseCode.POLLING_FULL:
            return PopResult(PopStatus.POLLING_FULL)
        if resp.code != ResponseCode.SUCCESS:
            raise MQBrokerError(resp.code, resp.remark or "", self.broker_addr)
        pop_time = int(h["popTime"])
        invisible = int(h["invisibleTime"])
        revive_qid = int(h.get("reviveQid", 0))
        starts = _info_map(h.get("startOffsetInfo"))
        is_lmq = names.is_lmq(topic)
        out = []
        if light:
            records = light_records(resp.body if type(resp.body) is list
                                     else resp.body_bytes())
            placed = _offset_list(h.get("msgOffsetInfo"))
            if placed is not None and len(placed) == len(records):
                return self._light_result(records, placed, starts, topic, pop_time, invisible,
                                          revive_qid, int(h.get("restNum", 0)))
            decoded = decode_records(resp.body_bytes(), decompress=True)
        else:
            decoded = decode_records(resp.body_bytes(), decompress=True)
        for msg in decoded:
            if is_lmq:
                qid = names.LMQ_QUEUE_ID
                offset = msg.lmq_offsets().get(topic, msg.queue_offset)
            else:
                qid, offset = msg.queue_id, msg.queue_offset
            handle = msg.properties.get(POP_CK)
            if handle is None:
                ck = starts.get(f"0@{qid}", str(offset))
                handle = (f"{ck} {pop_time} {invisible} {revive_qid} 0 {self.broker_name} "
                          f"{qid} {offset}")
                msg.properties[POP_CK] = handle
            else:
                offset = int(handle.split(" ")[7])
            out.append(PopMessage(msg, topic, qid, offset, handle))
        return PopResult(PopStatus.FOUND, out, pop_time, invisible, int(h.get("restNum", 0)))

    def local_result(self, batch, topic: str, invisible_ms: int) -> PopResult:
        """The FOUND result of an in-process pop's `PopBatch` (`local.pop`, a hand-off's
        pop) of `topic` under `invisible_ms`, with light records."""
        return self._light_result(light_records(batch.buffers), batch.placed, None, topic,
                                  batch.pop_time, invisible_ms, 0, batch.rest_num)

    def _light_result(self, records: list[PopRecord], placed: list[tuple[int, int]],
                      starts: dict[str, str] | None, topic: str, pop_time: int,
                      invisible: int, revive_qid: int, rest_num: int) -> PopResult:
        """The FOUND result of light `records` at `placed` (queue id, offset) pairs. A
        first delivery's handle: fields shared by the pop's messages of one queue (its
        `startOffsetInfo`, else the lowest offset of the queue in `placed`), then the
        offset."""
        out = []
        prefix_of: dict[int, str] = {}
        for msg, (qid, offset) in zip(records, placed, strict=True):
            handle = msg.properties.get(POP_CK) if msg.has_pop_ck else None
            if handle is None:
                prefix = prefix_of.get(qid)
                if prefix is None:
                    if starts is not None:
                        ck = starts.get(f"0@{qid}", str(offset))
                    else:
                        ck = min(o for q, o in placed if q == qid)
                    prefix = prefix_of[qid] = (f"{ck} {pop_time} {invisible} {revive_qid} 0 "
                                               f"{self.broker_name} {qid} ")
                handle = prefix + str(offset)
            out.append(PopMessage(msg, topic, qid, offset, handle))
        return PopResult(PopStatus.FOUND, out, pop_time, invisible, rest_num)

    def local_ack_entries(self, messages: list[PopMessage]) -> list[tuple]:
        """The entries acknowledging `messages` (popped by this client) through the
        attached in-process service, `local.ack(entries)`, as one BATCH_ACK_MESSAGE would:
        those of several clients go to one call, one journal write."""
        if len(messages) == 1:  # a lone message's ack: no grouping
            m = messages[0]
            return [(self.group, m.topic, m.queue_id, int(m.handle.split(" ", 2)[1]),
                     [m.queue_offset])]
        groups: dict[tuple[str, int, str], list[int]] = {}
        for m in messages:
            h = m.handle
            groups.setdefault((m.topic, m.queue_id, h[:h.rindex(" ")]), []).append(
                m.queue_offset)
        return [(self.group, topic, qid, int(prefix.split(" ", 2)[1]), offsets)
                for (topic, qid, prefix), offsets in groups.items()]

    def _ack_ext(self, m: PopMessage) -> dict[str, str]:
        return {"consumerGroup": self.group, "topic": m.topic, "queueId": str(m.queue_id),
                "extraInfo": m.handle, "offset": str(m.queue_offset)}

    def _applied(self, resp: RemotingCommand) -> None:
        """Raise MQBrokerError unless `resp` says the ack or change was made: SUCCESS, or
        a SYNC_MASTER's SLAVE_UNCONFIRMED answer (counted in `UNCONFIRMED`)."""
        if resp.code != ResponseCode.SUCCESS:
            if resp.code not in SLAVE_UNCONFIRMED:
                raise MQBrokerError(resp.code, resp.remark or "", self.broker_addr)
            UNCONFIRMED.note(self.broker_addr, resp.code)

    async def ack(self, m: PopMessage) -> bool:
        """True when acknowledged (by a SYNC_MASTER whose slave did not confirm it too:
        see `UNCONFIRMED`); False when the handle is no longer current (the message was
        redelivered since, or already acknowledged)."""
        resp = await self._invoke(RemotingCommand.request(RequestCode.ACK_MESSAGE,
                                                          self._ack_ext(m)))
        if resp.code == ResponseCode.NO_MESSAGE:
            return False
        self._applied(resp)
        return True

    async def batch_ack(self, messages: list[PopMessage]) -> None:
        """BATCH_ACK_MESSAGE: one entry per (topic, queue, pop time)."""
        await self.send_acks(self.ack_entries(messages))

    async def send_acks(self, acks: list[dict]) -> None:
        """One BATCH_ACK_MESSAGE of `acks` (`ack_entries` of any PopClients of this
        broker: each entry names its own consumer group, as in Apache's request)."""
        body = json.dumps({"brokerName": self.broker_name, "acks": acks}).encode()
        resp = await self._invoke(RemotingCommand.request(RequestCode.BATCH_ACK_MESSAGE, {}, body))
        self._applied(resp)

    def ack_entries(self, messages: list[PopMessage]) -> list[dict]:
        """The BATCH_ACK entries of `messages` (popped by this client's group)."""
        # Grouped by the handle without its offset (one string slice per message, the
        # fields parsed once per group).
        by_prefix: dict[tuple[str, str], list[PopMessage]] = {}
        for m in messages:
            h = m.handle
            by_prefix.setdefault((m.topic, h[:h.rindex(" ")]), []).append(m)
        groups: dict[tuple, list[PopMessage]] = {}
        for (topic, prefix), ms in by_prefix.items():
            f = prefix.split(" ")
            groups.setdefault((topic, ms[0].queue_id, int(f[0]), int(f[1]), int(f[2]),
                               int(f[3])), []).extend(ms)
        acks = []
        for (topic, qid, start, pop_time, invisible, rq), ms in groups.items():
            offsets = [m.queue_offset for m in ms]
            start = min(start, *offsets)
            bits = bytearray((max(offsets) - start) // 8 + 1)
            for i in offsets:
                i -= start
                bits[i >> 3] |= 1 << (i & 7)
            acks.append({"c": self.group, "t": topic, "r": "0", "so": start, "q": qid,
                         "rq": rq, "pt": pop_time, "it": invisible,
                         "b": base64.b64encode(bytes(bits)).decode("ascii")})
        return acks

    async def change_invisible(self, m: PopMessage, invisible_ms: int) -> bool:
        """New deadline `invisible_ms` from now; `m.handle` becomes the new handle.
        False when the handle is no longer current. A SYNC_MASTER's SLAVE_UNCONFIRMED
        answer counts as made (`UNCONFIRMED`) when it carries the new handle's fields, or
        for `invisible_ms` 0 (no handle needed); else it raises MQBrokerError: made on the
        master, but the new handle is unknown."""
        ext = self._ack_ext(m)
        ext["invisibleTime"] = str(invisible_ms)
        resp = await self._invoke(
            RemotingCommand.request(RequestCode.CHANGE_MESSAGE_INVISIBLETIME, ext))
        if resp.code == ResponseCode.NO_MESSAGE:
            return False
        h = resp.ext_fields or {}
        if resp.code in SLAVE_UNCONFIRMED and "popTime" not in h and invisible_ms:
            raise MQBrokerError(resp.code, f"{resp.remark or ''} (made on the master; the "
                                "broker sent no new handle)", self.broker_addr)
        self._applied(resp)
        if "popTime" not in h:
            return True  # a release (invisible_ms 0) not confirmed by the slave
        f = m.handle.split(" ")
        f[1], f[2], f[3] = h["popTime"], h["invisibleTime"], h["reviveQid"]
        m.handle = " ".join(f)
        if m.message is not None:  # None: a handle alone (the gRPC front end's)
            m.message.properties[POP_CK] = m.handle
        return True

    async def reject(self, m: PopMessage) -> bool:
        """Negative ack without requeue: to the group's %DLQ% topic, never delivered
        again (lmq-gateway private code 900003). False when the handle is not current."""
        resp = await self._invoke(RemotingCommand.request(RequestCode.POP_DEAD_LETTER,
                                                          self._ack_ext(m)))
        if resp.code == ResponseCode.NO_MESSAGE:
            return False
        if resp.code != ResponseCode.SUCCESS:
            raise MQBrokerError(resp.code, resp.remark or "", self.broker_addr)
        return True

    async def send_back_to_dlq(self, m: PopMessage, commitlog_offset: int,
                               origin_msg_id: str = "") -> bool:
        """Negative ack without requeue by Apache RocketMQ 5's codes only (as its proxy's
        ForwardMessageToDeadLetterQueue): CONSUMER_SEND_MSG_BACK with delay level -1 stores
        a copy of the message at `commitlog_offset` in the group's %DLQ% topic, then ACK.
        False when the handle is not current. Unlike Apache's proxy, the handle is checked
        first (CHANGE_INVISIBLETIME to `SEND_BACK_HOLD_MS`, which also keeps the message
        from coming back while it is copied), so a stale handle stores no copy."""
        if not await self.change_invisible(m, SEND_BACK_HOLD_MS):
            return False
        ext = {"offset": str(commitlog_offset), "group": self.group, "delayLevel": "-1",
               "originMsgId": origin_msg_id, "originTopic": m.topic, "unitMode": "false",
               "maxReconsumeTimes": "0"}
        resp = await self._invoke(RemotingCommand.request(RequestCode.CONSUMER_SEND_MSG_BACK,
                                                          ext))
        if resp.code != ResponseCode.SUCCESS:
            raise MQBrokerError(resp.code, resp.remark or "", self.broker_addr)
        return await self.ack(m)

    async def purge(self, topic: str, queue_id: int = 0, *, everything: bool = False,
                    volatile: bool = False) -> int:
        """Drop what waits for delivery in (group, topic, queue): never handed out or
        visible again; with `everything` the unacknowledged deliveries too (lmq-gateway
        private code 900004). Returns how many were dropped. `volatile` as for `pop`."""
        ext = {"consumerGroup": self.group, "topic": topic, "queueId": str(queue_id)}
        if everything:
            ext["all"] = "true"
        if volatile:
            ext["volatile"] = "true"
        resp = await self._invoke(RemotingCommand.request(RequestCode.POP_PURGE, ext))
        if resp.code != ResponseCode.SUCCESS:
            raise MQBrokerError(resp.code, resp.remark or "", self.broker_addr)
        return int((resp.ext_fields or {}).get("purged", 0))

    async def nack(self, m: PopMessage) -> bool:
        """Negative ack with requeue: visible again at once (invisible time 0)."""
        return await self.change_invisible(m, 0)

    # ------------------------------------------------------------------ holders
    async def register_holder(self, holder_id: str) -> None:
        """Bind `holder_id` to this client's connection to the broker: pops on it are
        held by `holder_id`, and when the connection closes the broker makes them
        visible again at once (lmq-gateway private code 900001)."""
        cmd = RemotingCommand.request(RequestCode.POP_HOLDER_REGISTER, {"holderId": holder_id})
        resp = await self._invoke(cmd)
        if resp.code != ResponseCode.SUCCESS:
            raise MQBrokerError(resp.code, resp.remark or "", self.broker_addr)

    async def release_holder(self, holder_id: str) -> int:
        """Make every delivery `holder_id` holds visible again now (900002); returns
        how many were released."""
        cmd = RemotingCommand.request(RequestCode.POP_HOLDER_RELEASE, {"holderId": holder_id})
        resp = await self._invoke(cmd)
        if resp.code != ResponseCode.SUCCESS:
            raise MQBrokerError(resp.code, resp.remark or "", self.broker_addr)
        return int((resp.ext_fields or {}).get("released", 0))
