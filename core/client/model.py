"""Value types of the client: queues, routes, subscriptions, send and pull results.

JSON shapes follow docs/protocol.md §4.1 (TopicRouteData), docs/protocol.md §4.4 (ClusterInfo), docs/protocol.md §6.2
(HeartbeatData's SubscriptionData) and §6.4 (MessageQueue).
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum

from core.common.message import MessageExt
from core.common.properties import MessageConst
from core.common.sysflag import PermName
from core.common.taghash import java_string_hash
from core.namesrv.routes import QueueData  # the name server's own (docs/protocol.md §4.1)

MASTER_ID = 0

# fastjson writes map keys that are numbers unquoted (`{0:"1.2.3.4:10911"}`, docs/protocol.md §1.4 rule 7).
_UNQUOTED_KEY = re.compile(r'([{,]\s*)(-?\d+)(\s*:)')


def loads_lenient(data: bytes | str) -> object:
    """json.loads that also accepts fastjson's unquoted numeric keys."""
    text = data.decode("utf-8") if isinstance(data, (bytes, bytearray, memoryview)) else data
    try:
        return json.loads(text)
    except ValueError:
        return json.loads(_UNQUOTED_KEY.sub(r'\1"\2"\3', text))


@dataclass(frozen=True, order=True, slots=True)
class MessageQueue:
    """One queue of a topic on one broker; ordered as Java's compareTo (topic, broker, id)."""

    topic: str
    broker_name: str
    queue_id: int

    def to_json(self) -> dict:
        return {"topic": self.topic, "brokerName": self.broker_name, "queueId": self.queue_id}

    @classmethod
    def from_json(cls, obj: dict) -> MessageQueue:
        return cls(str(obj["topic"]), str(obj["brokerName"]), int(obj["queueId"]))

    def __str__(self) -> str:
        return f"{self.topic}@{self.broker_name}#{self.queue_id}"


@dataclass(slots=True)
class BrokerData:
    cluster: str
    broker_name: str
    broker_addrs: dict[int, str]

    def master_addr(self) -> str | None:
        return self.broker_addrs.get(MASTER_ID)


@dataclass(slots=True)
class TopicRouteData:
    """A topic's route as the name server answers GET_ROUTEINFO_BY_TOPIC (docs/protocol.md §4.1)."""

    queue_datas: list[QueueData] = field(default_factory=list)
    broker_datas: list[BrokerData] = field(default_factory=list)
    order_topic_conf: str | None = None

    @classmethod
    def decode(cls, body: bytes) -> TopicRouteData:
        obj = loads_lenient(body)
        if not isinstance(obj, dict):
            raise ValueError("route body is not a JSON object")
        qds = [QueueData.from_json(q) for q in obj.get("queueDatas") or []]
        bds = [
            BrokerData(
                str(b.get("cluster", "")),
                str(b["brokerName"]),
                {int(k): str(v) for k, v in (b.get("brokerAddrs") or {}).items()},
            )
            for b in obj.get("brokerDatas") or []
        ]
        return cls(qds, bds, obj.get("orderTopicConf") or None)

    def to_json(self) -> dict:
        return {
            "orderTopicConf": self.order_topic_conf,
            "queueDatas": [q.to_json() for q in self.queue_datas],
            "brokerDatas": [
                {
                    "cluster": b.cluster,
                    "brokerName": b.broker_name,
                    "brokerAddrs": {str(k): v for k, v in b.broker_addrs.items()},
                }
                for b in self.broker_datas
            ],
        }

    def signature(self) -> tuple:
        """Comparable summary, to tell whether a refresh changed anything."""
        return (
            sorted((q.broker_name, q.read_queue_nums, q.write_queue_nums, q.perm)
                   for q in self.queue_datas),
            sorted((b.broker_name, tuple(sorted(b.broker_addrs.items())))
                   for b in self.broker_datas),
            self.order_topic_conf,
        )

    def publish_queues(self, topic: str) -> list[MessageQueue]:
        """Writable queues on brokers that have a master (docs/protocol.md §4.1 "How clients use it").

        An `orderTopicConf` ("brokerA:8;brokerB:8") overrides the queue datas, as in Java.
        """
        out: list[MessageQueue] = []
        masters = {b.broker_name for b in self.broker_datas if b.master_addr()}
        if self.order_topic_conf:
            for part in self.order_topic_conf.split(";"):
                name, _, nums = part.partition(":")
                if name and nums.isdigit():
                    out.extend(MessageQueue(topic, name, i) for i in range(int(nums)))
            return out
        for q in sorted(self.queue_datas, key=lambda q: q.broker_name):
            if PermName.is_writeable(q.perm) and q.broker_name in masters:
                out.extend(MessageQueue(topic, q.broker_name, i) for i in range(q.write_queue_nums))
        return out

    def subscribe_queues(self, topic: str) -> list[MessageQueue]:
        """Readable queues of the topic."""
        out = [
            MessageQueue(topic, q.broker_name, i)
            for q in self.queue_datas
            if PermName.is_readable(q.perm)
            for i in range(q.read_queue_nums)
        ]
        out.sort()
        return out


@dataclass(slots=True)
class ClusterInfo:
    """GET_BROKER_CLUSTER_INFO answer (docs/protocol.md §4.4)."""

    brokers: dict[str, BrokerData]
    clusters: dict[str, list[str]]

    @classmethod
    def decode(cls, body: bytes) -> ClusterInfo:
        obj = loads_lenient(body) if body else {}
        brokers = {
            str(name): BrokerData(
                str(b.get("cluster", "")),
                str(b.get("brokerName", name)),
                {int(k): str(v) for k, v in (b.get("brokerAddrs") or {}).items()},
            )
            for name, b in (obj.get("brokerAddrTable") or {}).items()
        }
        clusters = {
            str(c): sorted(str(n) for n in names)
            for c, names in (obj.get("clusterAddrTable") or {}).items()
        }
        return cls(brokers, clusters)

    def master_addrs(self, cluster: str | None = None) -> dict[str, str]:
        """broker name -> master address, for one cluster or all."""
        names = self.clusters.get(cluster, []) if cluster else list(self.brokers)
        out = {}
        for name in names:
            bd = self.brokers.get(name)
            if bd and bd.master_addr():
                out[name] = bd.master_addr()
        return out


# ---------------------------------------------------------------------------------------
# subscriptions


class ExpressionType(StrEnum):
    TAG = "TAG"
    SQL92 = "SQL92"


SUB_ALL = "*"


@dataclass(slots=True)
class SubscriptionData:
    """One topic subscription (HeartbeatData's subscriptionDataSet element, docs/protocol.md §6.2)."""

    topic: str
    sub_string: str = SUB_ALL
    tags_set: list[str] = field(default_factory=list)
    code_set: list[int] = field(default_factory=list)
    sub_version: int = field(default_factory=lambda: time.time_ns() // 1000)
    expression_type: str = ExpressionType.TAG.value

    @classmethod
    def build(cls, topic: str, expression: str | None = None,
              expression_type: str = ExpressionType.TAG.value) -> SubscriptionData:
        """Parse a tag expression ("*", "A", "A || B") or keep an SQL92 one verbatim."""
        etype = ExpressionType(str(expression_type).upper()).value
        if etype == ExpressionType.SQL92.value:
            if not expression or not expression.strip():
                raise ValueError("an SQL92 subscription needs an expression")
            return cls(topic, expression.strip(), expression_type=etype)
        if not expression or not expression.strip() or expression.strip() == SUB_ALL:
            return cls(topic, SUB_ALL)
        tags = []
        for part in expression.split("||"):
            tag = part.strip()
            if tag and tag not in tags:
                tags.append(tag)
        if not tags:
            return cls(topic, SUB_ALL)
        return cls(topic, expression.strip(), tags, [java_string_hash(t) for t in tags])

    @property
    def is_tag_filter(self) -> bool:
        return self.expression_type == ExpressionType.TAG.value and bool(self.tags_set)

    def matches(self, msg: MessageExt) -> bool:
        """Client-side exact tag check (the broker filtered by tag hash only, docs/protocol.md §5.2)."""
        if not self.is_tag_filter:
            return True
        return msg.properties.get(MessageConst.TAGS) in self.tags_set

    def to_json(self) -> dict:
        return {
            "classFilterMode": False,
            "topic": self.topic,
            "subString": self.sub_string,
            "tagsSet": list(self.tags_set),
            "codeSet": list(self.code_set),
            "subVersion": self.sub_version,
            "expressionType": self.expression_type,
        }


# ---------------------------------------------------------------------------------------
# results


class SendStatus(IntEnum):
    """As Java's SendStatus; the broker's codes 0/10/12/11 map to these (docs/protocol.md §2.2)."""

    SEND_OK = 0
    FLUSH_DISK_TIMEOUT = 1
    FLUSH_SLAVE_TIMEOUT = 2
    SLAVE_NOT_AVAILABLE = 3


@dataclass(slots=True)
class SendResult:
    """Outcome of a send. `msg_id` is the UNIQ_KEY (comma-joined for a batch), as clients
    show it (docs/protocol.md §5.1); `offset_msg_id` is the broker's offset id."""

    status: SendStatus
    msg_id: str
    offset_msg_id: str
    message_queue: MessageQueue
    queue_offset: int
    transaction_id: str | None = None
    region_id: str | None = None

    def __str__(self) -> str:
        return (f"SendResult[{self.status.name} msgId={self.msg_id} "
                f"offsetMsgId={self.offset_msg_id} mq={self.message_queue} "
                f"queueOffset={self.queue_offset}]")


class PullStatus(IntEnum):
    FOUND = 0
    NO_NEW_MSG = 1
    NO_MATCHED_MSG = 2
    OFFSET_ILLEGAL = 3


@dataclass(slots=True)
class PullResult:
    """Outcome of one PULL_MESSAGE (docs/protocol.md §5.2)."""

    status: PullStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    messages: list[MessageExt] = field(default_factory=list)
    suggest_which_broker_id: int = MASTER_ID


class MessageModel(IntEnum):
    """Ordinals are the C++ integers; names are what Java sends (docs/protocol.md §6.2)."""

    BROADCASTING = 0
    CLUSTERING = 1


class ConsumeFromWhere(IntEnum):
    CONSUME_FROM_LAST_OFFSET = 0
    CONSUME_FROM_FIRST_OFFSET = 4
    CONSUME_FROM_TIMESTAMP = 5


class ConsumeType(IntEnum):
    CONSUME_ACTIVELY = 0
    CONSUME_PASSIVELY = 1
