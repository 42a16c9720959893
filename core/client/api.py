"""One async method per RocketMQ request the client makes (docs/protocol.md §4, §5).

`MQClientAPI` turns arguments into `RemotingCommand`s, invokes them through the shared
`RemotingClient`, and turns responses into values or `MQBrokerError`s. It holds no state
besides the name server rotation; routing and retries live in the callers.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable

from core.client.config import ClientConfig
from core.client.errors import MQBrokerError, MQClientError
from core.client.model import (
    ClusterInfo,
    MessageQueue,
    PullResult,
    PullStatus,
    SendResult,
    SendStatus,
    TopicRouteData,
    loads_lenient,
)
from core.common.codec import MAX_INFLATED_BODY, decode_record, decode_records
from core.common.message import MessageExt
from core.common.properties import MessageConst
from core.common.sysflag import MessageSysFlag
from core.remoting.client import RemotingClient
from core.remoting.codec import RemotingCommand
from core.remoting.codes import RequestCode, ResponseCode
from core.remoting.errors import RemotingError
from core.remoting.inflate import inflate_async

R = RequestCode
C = ResponseCode

#: Send response codes that mean "stored" (docs/protocol.md §2.2), with the status a caller sees.
_SEND_OK = {
    C.SUCCESS: SendStatus.SEND_OK,
    C.FLUSH_DISK_TIMEOUT: SendStatus.FLUSH_DISK_TIMEOUT,
    C.FLUSH_SLAVE_TIMEOUT: SendStatus.FLUSH_SLAVE_TIMEOUT,
    C.SLAVE_NOT_AVAILABLE: SendStatus.SLAVE_NOT_AVAILABLE,
}

_PULL_STATUS = {
    C.SUCCESS: PullStatus.FOUND,
    C.PULL_NOT_FOUND: PullStatus.NO_NEW_MSG,
    C.PULL_RETRY_IMMEDIATELY: PullStatus.NO_MATCHED_MSG,
    C.PULL_OFFSET_MOVED: PullStatus.OFFSET_ILLEGAL,
}


async def inflate_bodies(msgs: list[MessageExt]) -> None:
    """Inflate compressed bodies (sysflag bit 0) in place, as a consumer sees them:
    bounded by MAX_INFLATED_BODY, large ones in a worker thread (a stored message is
    whatever a producer sent, possibly a zlib bomb). A body that is not zlib or inflates
    past the cap is delivered as stored, flag kept, instead of failing the whole pull."""
    for msg in msgs:
        if msg.sys_flag & MessageSysFlag.COMPRESSED:
            try:
                msg.body = await inflate_async(msg.body, MAX_INFLATED_BODY)
            except ValueError:
                continue
            msg.sys_flag &= ~MessageSysFlag.COMPRESSED


class MQClientAPI:
    """Request/response wrappers over one `RemotingClient`."""

    def __init__(self, remoting: RemotingClient, config: ClientConfig) -> None:
        self.remoting = remoting
        self.config = config
        self._namesrv_index = 0

    # -- plumbing -------------------------------------------------------------------

    def _request(self, code: int, ext: dict | None = None, body: bytes | None = None) -> RemotingCommand:
        cmd = RemotingCommand.request(code, ext, body)
        cmd.language = self.config.language
        return cmd

    async def invoke(self, addr: str, cmd: RemotingCommand, timeout: float | None = None) -> RemotingCommand:
        return await self.remoting.invoke(
            addr, cmd, self.config.request_timeout if timeout is None else timeout
        )

    async def call(self, addr: str, code: int, ext: dict | None = None, body: bytes | None = None,
                   timeout: float | None = None, ok: Iterable[int] = (C.SUCCESS,)) -> RemotingCommand:
        """Invoke and raise MQBrokerError unless the response code is in `ok`."""
        resp = await self.invoke(addr, self._request(code, ext, body), timeout)
        if resp.code not in ok:
            raise MQBrokerError(resp.code, resp.remark, addr)
        return resp

    async def oneway(self, addr: str, code: int, ext: dict | None = None, body: bytes | None = None) -> None:
        await self.remoting.invoke_oneway(addr, self._request(code, ext, body))

    async def call_namesrv(self, code: int, ext: dict | None = None, body: bytes | None = None,
                           timeout: float | None = None) -> RemotingCommand:
        """Invoke on a name server, moving on to the next one when it is unreachable."""
        addrs = self.config.namesrv_addrs
        last: Exception | None = None
        for i in range(len(addrs)):
            idx = (self._namesrv_index + i) % len(addrs)
            try:
                resp = await self.invoke(addrs[idx], self._request(code, ext, body), timeout)
            except RemotingError as exc:
                last = exc
                continue
            self._namesrv_index = idx
            return resp
        raise MQClientError(f"no name server reachable ({', '.join(addrs)}): {last}")

    # -- name server ----------------------------------------------------------------

    async def get_route(self, topic: str, timeout: float | None = None) -> TopicRouteData | None:
        """The topic's route, or None when the name servers have none (code 17)."""
        resp = await self.call_namesrv(
            R.GET_ROUTEINFO_BY_TOPIC, {"topic": topic, "acceptStandardJsonOnly": "true"}, None, timeout
        )
        if resp.code == C.TOPIC_NOT_EXIST:
            return None
        if resp.code != C.SUCCESS:
            raise MQBrokerError(resp.code, resp.remark, "namesrv")
        if not resp.body:
            return None
        return TopicRouteData.decode(resp.body_bytes())

    async def get_cluster_info(self) -> ClusterInfo:
        resp = await self.call_namesrv(R.GET_BROKER_CLUSTER_INFO)
        if resp.code != C.SUCCESS:
            raise MQBrokerError(resp.code, resp.remark, "namesrv")
        return ClusterInfo.decode(resp.body_bytes())

    async def get_all_topic_list(self) -> list[str]:
        resp = await self.call_namesrv(R.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
        if resp.code != C.SUCCESS:
            raise MQBrokerError(resp.code, resp.remark, "namesrv")
        obj = loads_lenient(resp.body_bytes()) if resp.body else {}
        return sorted(str(t) for t in (obj.get("topicList") or []))

    async def delete_topic_in_namesrv(self, addr: str, topic: str) -> None:
        await self.call(addr, R.DELETE_TOPIC_IN_NAMESRV, {"topic": topic})

    # -- sending --------------------------------------------------------------------

    async def send_message(self, addr: str, mq: MessageQueue, ext: dict, body: bytes, *,
                           batch: bool, uniq_id: str, timeout: float | None = None,
                           oneway: bool = False) -> SendResult | None:
        """SEND_MESSAGE_V2 (310) or SEND_BATCH_MESSAGE (320) with one-letter names (docs/protocol.md §5.1)."""
        code = R.SEND_BATCH_MESSAGE if batch else R.SEND_MESSAGE_V2
        if oneway:
            await self.oneway(addr, code, ext, body)
            return None
        resp = await self.invoke(addr, self._request(code, ext, body), timeout)
        status = _SEND_OK.get(resp.code)
        if status is None:
            raise MQBrokerError(resp.code, resp.remark, addr)
        return SendResult(
            status=status,
            msg_id=uniq_id,
            offset_msg_id=resp.ext_str("msgId", "") or "",
            message_queue=MessageQueue(mq.topic, mq.broker_name, resp.ext_int("queueId", mq.queue_id)),
            queue_offset=resp.ext_int("queueOffset", -1),
            transaction_id=resp.ext_str("transactionId"),
            region_id=resp.ext_str(MessageConst.MSG_REGION),
        )

    async def end_transaction(self, addr: str, ext: dict, remark: str | None = None) -> None:
        """END_TRANSACTION (37), one-way as Java sends it (docs/protocol.md §5.12)."""
        cmd = self._request(R.END_TRANSACTION, ext)
        cmd.remark = remark
        await self.remoting.invoke_oneway(addr, cmd)

    # -- pulling and offsets --------------------------------------------------------

    async def pull_message(self, addr: str, ext: dict, timeout: float) -> PullResult:
        """PULL_MESSAGE (11); messages are decoded with bodies inflated (docs/protocol.md §5.2)."""
        resp = await self.invoke(addr, self._request(R.PULL_MESSAGE, ext), timeout)
        status = _PULL_STATUS.get(resp.code)
        if status is None:
            raise MQBrokerError(resp.code, resp.remark, addr)
        msgs = []
        if status is PullStatus.FOUND and resp.body:
            msgs = decode_records(resp.body_bytes())
            await inflate_bodies(msgs)
        return PullResult(
            status,
            resp.ext_int("nextBeginOffset", 0),
            resp.ext_int("minOffset", 0),
            resp.ext_int("maxOffset", 0),
            msgs,
            resp.ext_int("suggestWhichBrokerId", 0),
        )

    async def query_consumer_offset(self, addr: str, group: str, topic: str, queue_id: int) -> int:
        """Stored offset, or -1 when the broker has none (QUERY_NOT_FOUND, docs/protocol.md §5.3)."""
        # setZeroIfNotFound=false (RocketMQ 5 header): "no offset" must stay distinguishable
        # from offset 0, or consume_from_where could never apply to a new group.
        resp = await self.invoke(addr, self._request(
            R.QUERY_CONSUMER_OFFSET, {"consumerGroup": group, "topic": topic,
                                      "queueId": str(queue_id), "setZeroIfNotFound": "false"}
        ))
        if resp.code == C.QUERY_NOT_FOUND:
            return -1
        if resp.code != C.SUCCESS:
            raise MQBrokerError(resp.code, resp.remark, addr)
        return resp.ext_int("offset", -1)

    async def update_consumer_offset(self, addr: str, group: str, topic: str, queue_id: int,
                                     offset: int, oneway: bool = False) -> None:
        ext = {"consumerGroup": group, "topic": topic, "queueId": str(queue_id),
               "commitOffset": str(offset)}
        if oneway:
            await self.oneway(addr, R.UPDATE_CONSUMER_OFFSET, ext)
        else:
            await self.call(addr, R.UPDATE_CONSUMER_OFFSET, ext)

    async def _offset_call(self, addr: str, code: int, ext: dict, field: str = "offset") -> int:
        resp = await self.call(addr, code, ext)
        return resp.ext_int(field, 0)

    async def get_max_offset(self, addr: str, topic: str, queue_id: int) -> int:
        return await self._offset_call(addr, R.GET_MAX_OFFSET, {"topic": topic, "queueId": str(queue_id)})

    async def get_min_offset(self, addr: str, topic: str, queue_id: int) -> int:
        return await self._offset_call(addr, R.GET_MIN_OFFSET, {"topic": topic, "queueId": str(queue_id)})

    async def get_earliest_msg_storetime(self, addr: str, topic: str, queue_id: int) -> int:
        return await self._offset_call(
            addr, R.GET_EARLIEST_MSG_STORETIME, {"topic": topic, "queueId": str(queue_id)}, "timestamp"
        )

    async def search_offset(self, addr: str, topic: str, queue_id: int, timestamp_ms: int) -> int:
        return await self._offset_call(
            addr, R.SEARCH_OFFSET_BY_TIMESTAMP,
            {"topic": topic, "queueId": str(queue_id), "timestamp": str(timestamp_ms)},
        )

    # -- client management ----------------------------------------------------------

    async def heartbeat(self, addr: str, data: dict) -> None:
        await self.call(addr, R.HEART_BEAT, None, json.dumps(data).encode())

    async def unregister_client(self, addr: str, client_id: str, producer_group: str = "",
                                consumer_group: str = "") -> None:
        await self.call(addr, R.UNREGISTER_CLIENT, {
            "clientID": client_id, "producerGroup": producer_group, "consumerGroup": consumer_group,
        })

    async def get_consumer_id_list(self, addr: str, group: str) -> list[str]:
        resp = await self.invoke(addr, self._request(R.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": group}))
        if resp.code != C.SUCCESS:
            raise MQBrokerError(resp.code, resp.remark, addr)
        obj = loads_lenient(resp.body_bytes()) if resp.body else {}
        return [str(c) for c in (obj.get("consumerIdList") or [])]

    async def lock_batch_mq(self, addr: str, group: str, client_id: str,
                            mqs: Iterable[MessageQueue]) -> set[MessageQueue]:
        """LOCK_BATCH_MQ (41): the subset of `mqs` this client now holds (docs/protocol.md §5.11)."""
        body = json.dumps({"consumerGroup": group, "clientId": client_id,
                           "mqSet": [mq.to_json() for mq in mqs]}).encode()
        resp = await self.call(addr, R.LOCK_BATCH_MQ, None, body)
        obj = loads_lenient(resp.body_bytes()) if resp.body else {}
        return {MessageQueue.from_json(m) for m in (obj.get("lockOKMQSet") or [])}

    async def unlock_batch_mq(self, addr: str, group: str, client_id: str,
                              mqs: Iterable[MessageQueue], oneway: bool = False) -> None:
        body = json.dumps({"consumerGroup": group, "clientId": client_id,
                           "mqSet": [mq.to_json() for mq in mqs]}).encode()
        if oneway:
            await self.oneway(addr, R.UNLOCK_BATCH_MQ, None, body)
        else:
            await self.call(addr, R.UNLOCK_BATCH_MQ, None, body)

    async def consumer_send_msg_back(self, addr: str, msg: MessageExt, group: str, delay_level: int,
                                     max_reconsume_times: int, timeout: float | None = None) -> None:
        """CONSUMER_SEND_MSG_BACK (36): the broker re-delivers via %RETRY% or moves to DLQ."""
        await self.call(addr, R.CONSUMER_SEND_MSG_BACK, {
            "offset": str(msg.commitlog_offset),
            "group": group,
            "delayLevel": str(delay_level),
            "originMsgId": msg.msg_id,
            "originTopic": msg.topic,
            "unitMode": "false",
            "maxReconsumeTimes": str(max_reconsume_times),
        }, timeout=timeout)

    # -- lookups --------------------------------------------------------------------

    async def view_message(self, addr: str, phy_offset: int) -> MessageExt:
        resp = await self.call(addr, R.VIEW_MESSAGE_BY_ID, {"offset": str(phy_offset)})
        return decode_record(resp.body_bytes(), decompress=True)

    async def query_message(self, addr: str, topic: str, key: str, max_num: int = 32,
                            begin_ms: int = 0, end_ms: int | None = None,
                            unique: bool = False) -> list[MessageExt]:
        """QUERY_MESSAGE (12) by KEYS entry or, with `unique`, by UNIQ_KEY (docs/protocol.md §5.17)."""
        ext = {"topic": topic, "key": key, "maxNum": str(max_num), "beginTimestamp": str(begin_ms),
               "endTimestamp": str(end_ms if end_ms is not None else int(time.time() * 1000) + 60_000)}
        if unique:
            ext["_UNIQUE_KEY_QUERY"] = "true"
        resp = await self.invoke(addr, self._request(R.QUERY_MESSAGE, ext), timeout=None)
        if resp.code == C.QUERY_NOT_FOUND:
            return []
        if resp.code != C.SUCCESS:
            raise MQBrokerError(resp.code, resp.remark, addr)
        return decode_records(resp.body_bytes(), decompress=True) if resp.body else []

    # -- topic administration ---------------------------------------------------------

    async def create_topic(self, addr: str, topic: str, read_queue_nums: int, write_queue_nums: int,
                           perm: int = 6, order: bool = False, topic_sys_flag: int = 0) -> None:
        await self.call(addr, R.UPDATE_AND_CREATE_TOPIC, {
            "topic": topic, "defaultTopic": "TBW102", "readQueueNums": str(read_queue_nums),
            "writeQueueNums": str(write_queue_nums), "perm": str(perm),
            "topicFilterType": "SINGLE_TAG", "topicSysFlag": str(topic_sys_flag),
            "order": "true" if order else "false",
        })

    async def delete_topic_in_broker(self, addr: str, topic: str) -> None:
        await self.call(addr, R.DELETE_TOPIC_IN_BROKER, {"topic": topic})

    async def get_all_topic_config(self, addr: str) -> dict[str, dict]:
        resp = await self.call(addr, R.GET_ALL_TOPIC_CONFIG)
        obj = loads_lenient(resp.body_bytes()) if resp.body else {}
        return dict(obj.get("topicConfigTable") or {})
