"""The source's row schema and the conversion of pulled messages into Arrow record batches.

Columns (modelled on Spark's Kafka source; docs/spark.md): ``key`` (the message KEYS, as
text), ``value`` (body, binary), ``topic``, ``queueId``, ``queueOffset``, ``brokerName``,
``timestamp`` (store time), ``bornTimestamp``, ``tags``, ``msgId`` (UNIQ_KEY, else the
offset id), ``properties`` (every message property), and for MQTT traffic stored by the
gateway ``mqttTopic``, ``qos`` and ``retain`` (null for other messages).
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from core.common.message import MessageExt
from core.common.properties import MessageConst

# The MQTT gateway's stored form (docs/mqtt.md) is read with the gateway's own decoders.
from gateway.mqtt.message import K_QOS as MQTT_QOS
from gateway.mqtt.message import K_RETAIN as MQTT_RETAIN
from gateway.mqtt.message import K_TOPIC as MQTT_TOPIC
from gateway.mqtt.message import get_text, int_or_none

#: DDL of the source's rows (`spark.read.format("lmq").schema` cannot change it).
SOURCE_SCHEMA_DDL = (
    "key string, value binary, topic string, queueId int, queueOffset long, "
    "brokerName string, timestamp timestamp, bornTimestamp timestamp, tags string, "
    "msgId string, properties map<string,string>, mqttTopic string, qos int, retain boolean"
)

#: Extra column with `includeHeaders=true`: the user properties, shaped as Kafka's headers.
HEADERS_DDL = "headers array<struct<key:string,value:binary>>"


def schema_ddl(include_headers: bool) -> str:
    return f"{SOURCE_SCHEMA_DDL}, {HEADERS_DDL}" if include_headers else SOURCE_SCHEMA_DDL


ARROW_SCHEMA = pa.schema([
    ("key", pa.string()),
    ("value", pa.binary()),
    ("topic", pa.string()),
    ("queueId", pa.int32()),
    ("queueOffset", pa.int64()),
    ("brokerName", pa.string()),
    ("timestamp", pa.timestamp("us", tz="UTC")),
    ("bornTimestamp", pa.timestamp("us", tz="UTC")),
    ("tags", pa.string()),
    ("msgId", pa.string()),
    ("properties", pa.map_(pa.string(), pa.string())),
    ("mqttTopic", pa.string()),
    ("qos", pa.int32()),
    ("retain", pa.bool_()),
])

_HEADER_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
ARROW_SCHEMA_HEADERS = ARROW_SCHEMA.append(pa.field("headers", _HEADER_TYPE))

#: Properties that are not user headers: the broker's and clients' own (MessageConst), the
#: MQTT gateway's stored form and the sink's transaction tags.
_SYSTEM_PROPS = frozenset(v for k, v in vars(MessageConst).items()
                          if k.isupper() and isinstance(v, str))
_INTERNAL_PREFIXES = ("MQTT_", "SPARK_")


def user_headers(props: dict[str, str]) -> list[tuple[str, bytes]]:
    """A message's user properties as (key, UTF-8 value) pairs, sorted by key."""
    return [(k, v.encode()) for k, v in sorted(props.items())
            if k not in _SYSTEM_PROPS and not k.startswith(_INTERNAL_PREFIXES)]


def mqtt_topic_of(props: dict[str, str]) -> str | None:
    """The MQTT topic the gateway stored with a message (plain or base64 form), or None."""
    return get_text(props, MQTT_TOPIC)


#: Properties the pull path adds to each message (not part of the stored message).
_PULL_ONLY = frozenset({MessageConst.MIN_OFFSET, MessageConst.MAX_OFFSET})

_TS = pa.timestamp("us", tz="UTC")


def _ms_to_ts(ms: list[int]) -> pa.Array:
    return pc.multiply(pa.array(ms, pa.int64()), 1000).cast(_TS)


def to_record_batch(msgs: list[MessageExt], broker_name: str,
                    include_headers: bool = False) -> pa.RecordBatch:
    """One Arrow record batch holding `msgs` as source rows (plus `headers` if asked)."""
    keys, values, topics, qids, offsets, stores, borns = [], [], [], [], [], [], []
    tags, ids, props, mtopics, qoss, retains = [], [], [], [], [], []
    for m in msgs:
        p = m.properties
        keys.append(p.get(MessageConst.KEYS))
        values.append(m.body)
        topics.append(m.topic)
        qids.append(m.queue_id)
        offsets.append(m.queue_offset)
        stores.append(m.store_timestamp)
        borns.append(m.born_timestamp)
        tags.append(p.get(MessageConst.TAGS))
        ids.append(m.msg_id)
        props.append([kv for kv in p.items() if kv[0] not in _PULL_ONLY])
        mtopic = mqtt_topic_of(p)
        mtopics.append(mtopic)
        if mtopic is None:
            qoss.append(None)
            retains.append(None)
        else:
            qoss.append(int_or_none(p.get(MQTT_QOS)) or 0)
            retains.append(p.get(MQTT_RETAIN) == "1")
    n = len(msgs)
    columns = [
        pa.array(keys, pa.string()),
        pa.array(values, pa.binary()),
        pa.array(topics, pa.string()),
        pa.array(qids, pa.int32()),
        pa.array(offsets, pa.int64()),
        pa.array([broker_name] * n, pa.string()),
        _ms_to_ts(stores),
        _ms_to_ts(borns),
        pa.array(tags, pa.string()),
        pa.array(ids, pa.string()),
        pa.array(props, pa.map_(pa.string(), pa.string())),
        pa.array(mtopics, pa.string()),
        pa.array(qoss, pa.int32()),
        pa.array(retains, pa.bool_()),
    ]
    if include_headers:
        columns.append(pa.array([[{"key": k, "value": v} for k, v in user_headers(m.properties)]
                                 for m in msgs], _HEADER_TYPE))
        return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA_HEADERS)
    return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)
