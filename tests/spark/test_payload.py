"""Payload helpers: msgpack and JSON values decoded into structs."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

pytest.importorskip("pyspark")

import msgpack  # noqa: E402
import pyarrow as pa  # noqa: E402

from spark_sinks.payload import decode_msgpack_array  # noqa: E402
from tests.spark.conftest import topic_with_queues  # noqa: E402

T = pa.struct([("device", pa.string()), ("ts", pa.int64()), ("temperature", pa.float64()),
               ("tags", pa.list_(pa.string())), ("at", pa.timestamp("us", tz="UTC"))])


def test_decode_msgpack_array_fields_by_name_and_nulls_for_bad_values():
    at = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    good = msgpack.packb({"device": "d1", "ts": 7, "temperature": 21.5, "tags": ["a"],
                          "extra": {"x": 1}, "at": msgpack.Timestamp.from_datetime(at)})
    partial = msgpack.packb({"device": "d2"})
    values = pa.array([good, None, partial, b"\xc1", msgpack.packb([1, 2]),
                       msgpack.packb({"device": "d3", "ts": "not a number"}), good + b"\x00",
                       b"\x91" * 100 + b"\xc0"], pa.binary())
    out = decode_msgpack_array(values, T).to_pylist()
    assert out[0] == {"device": "d1", "ts": 7, "temperature": 21.5, "tags": ["a"], "at": at}
    assert out[2] == {"device": "d2", "ts": None, "temperature": None, "tags": None, "at": None}
    assert out[1] is None
    assert out[3:] == [None] * 5     # not msgpack / not a map / wrong type / trailing bytes
    assert len(out) == len(values)


@pytest.mark.slow
def test_from_msgpack_and_from_json_on_rows_read_from_the_broker(spark, lmq_cluster):
    from core.client import Message
    from core.client.blocking import BlockingClient
    from spark_sinks.payload import from_json, from_msgpack

    addr = lmq_cluster["addr"]
    topic_with_queues(addr, "PayMsgpack", 2)
    topic_with_queues(addr, "PayJson", 1)
    readings = [{"device": f"d{i % 3}", "ts": 1000 + i, "temperature": 20.0 + i / 4,
                 "humidity": 40 + i} for i in range(50)]
    with BlockingClient(addr) as c, c.producer("PG_PAYLOAD") as p:
        for r in readings:
            p.send(Message("PayMsgpack", msgpack.packb(r)))
            p.send(Message("PayJson", json.dumps(r).encode()))
        p.send(Message("PayMsgpack", b"not msgpack \xc1"))
    schema = "device string, ts long, temperature double, humidity int"
    want = sorted(tuple(r.values()) for r in readings)

    df = spark.read.format("lmq").option("lmq.namesrv", addr).option("subscribe", "PayMsgpack").load()
    rows = df.select(from_msgpack("value", schema).alias("r")).select("r.*").collect()
    assert sorted(tuple(r) for r in rows if r.device is not None) == want
    assert sum(r.device is None for r in rows) == 1           # the malformed one: a null struct

    df = spark.read.format("lmq").option("lmq.namesrv", addr).option("subscribe", "PayJson").load()
    rows = df.select(from_json(df.value, schema).alias("r")).select("r.*").collect()
    assert sorted(tuple(r) for r in rows) == want
