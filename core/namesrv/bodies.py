"""JSON bodies of the name server (docs/protocol.md §4, §6.5, §6.6), sans-IO.

Decoding is lenient where real peers differ (fastjson vs jsoncpp, 4.x vs 5.x extra keys)
and strict where garbage would corrupt the route table: anything unusable raises
ValueError, which the processors answer with SYSTEM_ERROR.
"""

from __future__ import annotations

import json
import struct
import zlib
from dataclasses import dataclass, field
from typing import Any

from core.remoting.inflate import inflate

__all__ = [
    "DataVersion",
    "RegisterBrokerBody",
    "TopicConfigData",
    "decode_data_version",
    "decode_register_body",
    "encode_json",
    "encode_register_body",
    "parse_inflated_register_body",
]

_JSON = json.JSONEncoder(separators=(",", ":"))
_INT = struct.Struct(">i")

# Java's TopicConfig defaults (docs/protocol.md §6.5).
_DEFAULT_QUEUE_NUMS = 16
_DEFAULT_PERM = 6


def encode_json(obj: Any) -> bytes:
    """Compact, ASCII-only standard JSON (quoted keys, docs/protocol.md §1.4 rule 7)."""
    return _JSON.encode(obj).encode("ascii")


@dataclass(frozen=True)
class DataVersion:
    """A broker's topic-table version: changes whenever its topic configs change."""

    timestamp: int = 0
    counter: int = 0
    state_version: int = 0  # 5.x only

    def to_json(self) -> dict[str, int]:
        out = {"counter": self.counter, "timestamp": self.timestamp}
        if self.state_version:
            out["stateVersion"] = self.state_version
        return out


@dataclass(frozen=True)
class TopicConfigData:
    """The part of a broker's TopicConfig the name server keeps (docs/protocol.md §6.5)."""

    topic_name: str
    read_queue_nums: int = _DEFAULT_QUEUE_NUMS
    write_queue_nums: int = _DEFAULT_QUEUE_NUMS
    perm: int = _DEFAULT_PERM
    topic_sys_flag: int = 0
    topic_filter_type: str = "SINGLE_TAG"
    order: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "order": self.order,
            "perm": self.perm,
            "readQueueNums": self.read_queue_nums,
            "topicFilterType": self.topic_filter_type,
            "topicName": self.topic_name,
            "topicSysFlag": self.topic_sys_flag,
            "writeQueueNums": self.write_queue_nums,
        }


@dataclass
class RegisterBrokerBody:
    """Decoded REGISTER_BROKER body (docs/protocol.md §4.2)."""

    topic_configs: dict[str, TopicConfigData] = field(default_factory=dict)
    data_version: DataVersion = field(default_factory=DataVersion)
    filter_servers: list[str] = field(default_factory=list)


def _as_int(value: Any, default: int, what: str) -> int:
    if value is None:
        return default
    if isinstance(value, bool):
        raise ValueError(f"{what} must be an integer")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            pass
    if isinstance(value, dict) and "value" in value:  # an AtomicLong written as an object
        return _as_int(value["value"], default, what)
    raise ValueError(f"{what} must be an integer, got {value!r}")


def decode_data_version(obj: Any) -> DataVersion:
    if obj is None:
        return DataVersion()
    if not isinstance(obj, dict):
        raise ValueError("dataVersion must be an object")
    return DataVersion(
        _as_int(obj.get("timestamp"), 0, "dataVersion.timestamp"),
        _as_int(obj.get("counter"), 0, "dataVersion.counter"),
        _as_int(obj.get("stateVersion"), 0, "dataVersion.stateVersion"),
    )


def _decode_topic_config(name: str, obj: Any) -> TopicConfigData:
    if not isinstance(obj, dict):
        raise ValueError(f"topic config of {name!r} must be an object")
    topic = obj.get("topicName") or name
    if not isinstance(topic, str):
        raise ValueError("topicName must be a string")
    filter_type = obj.get("topicFilterType") or "SINGLE_TAG"
    return TopicConfigData(
        topic,
        _as_int(obj.get("readQueueNums"), _DEFAULT_QUEUE_NUMS, "readQueueNums"),
        _as_int(obj.get("writeQueueNums"), _DEFAULT_QUEUE_NUMS, "writeQueueNums"),
        _as_int(obj.get("perm"), _DEFAULT_PERM, "perm"),
        # 4.9.0+ name, then the older misspelling.
        _as_int(obj.get("topicSysFlag", obj.get("topicSynFlag")), 0, "topicSysFlag"),
        str(filter_type),
        bool(obj.get("order", False)),
    )


def _decode_filter_servers(obj: Any) -> list[str]:
    if obj is None:
        return []
    if not isinstance(obj, list) or not all(isinstance(s, str) for s in obj):
        raise ValueError("filterServerList must be a list of strings")
    return list(obj)


def _decode_json_register_body(body: bytes) -> RegisterBrokerBody:
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"register body is not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ValueError("register body must be a JSON object")
    wrapper = obj.get("topicConfigSerializeWrapper") or {}
    if not isinstance(wrapper, dict):
        raise ValueError("topicConfigSerializeWrapper must be an object")
    table = wrapper.get("topicConfigTable") or {}
    if not isinstance(table, dict):
        raise ValueError("topicConfigTable must be an object")
    configs = {}
    for name, tc_obj in table.items():
        tc = _decode_topic_config(name, tc_obj)
        configs[tc.topic_name] = tc
    return RegisterBrokerBody(
        configs,
        decode_data_version(wrapper.get("dataVersion")),
        _decode_filter_servers(obj.get("filterServerList")),
    )


def _decode_compressed_register_body(body: bytes, max_size: int) -> RegisterBrokerBody:
    try:
        raw = inflate(body, max_size)
    except ValueError as exc:
        raise ValueError(f"compressed register body: {exc}") from None
    return parse_inflated_register_body(raw)


def parse_inflated_register_body(raw: bytes) -> RegisterBrokerBody:
    """Parse an inflated compressed REGISTER_BROKER body (see decode_register_body)."""
    # Layout (docs/protocol.md §4.2): zlib( int32 len + DataVersion JSON, int32 topicCount,
    # topicCount x (int32 len + "name read write perm filterType"), int32 len + filter JSON ).
    pos = 0

    def chunk() -> bytes:
        nonlocal pos
        if pos + 4 > len(raw):
            raise ValueError("compressed register body truncated")
        (length,) = _INT.unpack_from(raw, pos)
        pos += 4
        if length < 0 or pos + length > len(raw):
            raise ValueError("compressed register body: bad length")
        data = raw[pos : pos + length]
        pos += length
        return data

    try:
        data_version = decode_data_version(json.loads(chunk()))
        if pos + 4 > len(raw):
            raise ValueError("compressed register body truncated")
        (count,) = _INT.unpack_from(raw, pos)
        pos += 4
        if count < 0:
            raise ValueError("compressed register body: negative topic count")
        configs = {}
        for _ in range(count):
            fields = chunk().decode("utf-8").split(" ")
            if len(fields) < 5:
                raise ValueError("compressed register body: bad topic config text")
            name = fields[0]
            configs[name] = TopicConfigData(
                name, int(fields[1]), int(fields[2]), int(fields[3]), 0, fields[4]
            )
        filters = _decode_filter_servers(json.loads(chunk())) if pos < len(raw) else []
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ValueError(f"compressed register body: {exc}") from None
    return RegisterBrokerBody(configs, data_version, filters)


def decode_register_body(
    body: bytes | None, compressed: bool = False, max_size: int = 64 * 1024 * 1024
) -> RegisterBrokerBody:
    """Decode a REGISTER_BROKER body; an absent body registers liveness only."""
    if not body:
        return RegisterBrokerBody()
    if compressed:
        return _decode_compressed_register_body(body, max_size)
    return _decode_json_register_body(body)


def encode_register_body(
    topic_configs: dict[str, TopicConfigData] | list[TopicConfigData],
    data_version: DataVersion,
    filter_servers: list[str] | None = None,
    compressed: bool = False,
) -> bytes:
    """Encode a REGISTER_BROKER body, JSON or compressed (the inverse of the decoder)."""
    configs = list(topic_configs.values()) if isinstance(topic_configs, dict) else topic_configs
    filters = filter_servers or []
    if not compressed:
        return encode_json(
            {
                "filterServerList": filters,
                "topicConfigSerializeWrapper": {
                    "dataVersion": data_version.to_json(),
                    "topicConfigTable": {tc.topic_name: tc.to_json() for tc in configs},
                },
            }
        )
    out = bytearray()

    def put(data: bytes) -> None:
        out.extend(_INT.pack(len(data)))
        out.extend(data)

    put(encode_json(data_version.to_json()))
    out.extend(_INT.pack(len(configs)))
    for tc in configs:
        text = (
            f"{tc.topic_name} {tc.read_queue_nums} {tc.write_queue_nums} {tc.perm} "
            f"{tc.topic_filter_type}"
        )
        put(text.encode("utf-8"))
    put(encode_json(filters))
    return zlib.compress(bytes(out), 9)
