"""5.x sends that are MQTT traffic (docs/grpc.md "MQTT and AMQP subscribers").

A message sent to the MQTT store topic (`GrpcConfig.mqtt_store_topic`, `MQTT_MESSAGES`,
where the MQTT gateways store PUBLISHes) with the user property `MQTT_TOPIC` is stored
once as the MQTT gateway stores a PUBLISH on that topic: the `MQTT_*` properties of
gateway/mqtt/message.py, and INNER_MULTI_DISPATCH naming the LMQ of every MQTT route that
matches the topic and of every AMQP queue bound to `amq.topic` with a key matching it
(`RouteTable.mqtt_publish_lmqs`, as an MQTT publish), so MQTT and AMQP subscribers read
it as they read MQTT traffic.

* `prepare` (gRPC thread, pure): validate the MQTT topic and QoS, map the properties.
* `MqttOut.dispatch` (trio): bring the route table up to the log's end (a read-only
  follower, gateway/routing/route_reader.py), name the LMQs, and tell the MQTT gateways
  of this process that their LMQs have another writer (gateway/routing/bridge.py);
  gateways of other processes see this front end in the route log's member group
  (`writer-grpc-...`), as the Spark sink.
"""

from __future__ import annotations

import logging

import trio

from core.client import ClientInstance
from core.client.errors import MQClientError
from core.common.properties import MAX_PROPERTIES_BYTES, MessageConst, encode_properties
from core.remoting.errors import RemotingError
from gateway.grpc5.config import GrpcConfig
from gateway.grpc5.convert import SHARDING_KEY, GrpcError, OutgoingMessage
from gateway.grpc5.proto import messaging_pb2 as pb
from gateway.mqtt.message import K_QOS, K_TOPIC, MqttMessage, lmq_dispatch_value, to_properties
from gateway.mqtt.packets import NO_PROPERTIES, Properties
from gateway.mqtt.topics import validate_topic_name
from gateway.routing.bridge import note_foreign_writer
from gateway.routing.route_reader import RouteReader, open_reader
from gateway.routing.route_table import RouteTable

__all__ = ["ANNOUNCE_WAIT_S", "DEFAULT_QOS", "MqttOut", "prepare"]

log = logging.getLogger(__name__)

#: The first MQTT send of a front end waits this long after it joined the route log's
#: member group (the MQTT gateways' PEERS_CHECK_S, 2 s, plus a margin).
ANNOUNCE_WAIT_S = 3.0
#: QoS of a 5.x message that names none (`MQTT_QOS`): at least once, as a RocketMQ send.
DEFAULT_QOS = 1
_MQTT_PREFIX = "MQTT_"


def _props_size(props: dict[str, str]) -> int:
    return len(encode_properties(props).encode("utf-8"))


def prepare(msg: OutgoingMessage, config: GrpcConfig) -> None:
    """Turn a send to the MQTT store topic with `MQTT_TOPIC` into MQTT traffic (sets
    `msg.mqtt_topic`); GrpcError when it cannot be one. Other sends are left alone."""
    props = msg.properties
    if not config.mqtt_store_topic or msg.topic != config.mqtt_store_topic \
            or K_TOPIC not in props:
        return
    topic = props.pop(K_TOPIC)
    qos_text = props.pop(K_QOS, None)
    for key in props:
        if key.startswith(_MQTT_PREFIX):  # the stored form's own keys are ours to write
            raise GrpcError(pb.ILLEGAL_MESSAGE_PROPERTY_KEY,
                            f"property {key!r} is reserved on {msg.topic}")
    if msg.message_type not in (pb.NORMAL, pb.FIFO):
        raise GrpcError(pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                        "MQTT traffic is a NORMAL or FIFO message")
    try:
        validate_topic_name(topic)
    except Exception as exc:  # MqttProtocolError
        raise GrpcError(pb.BAD_REQUEST, f"MQTT_TOPIC is no MQTT topic name: {exc}") from None
    if topic.startswith("$"):
        raise GrpcError(pb.BAD_REQUEST, "MQTT_TOPIC may not start with '$'")
    if qos_text is None:
        qos = DEFAULT_QOS
    elif qos_text in ("0", "1", "2"):
        qos = int(qos_text)
    else:
        raise GrpcError(pb.BAD_REQUEST, "MQTT_QOS must be 0, 1 or 2")
    # The message's user properties go to MQTT 5 subscribers as user properties (and to
    # AMQP consumers as headers); they stay plain properties for 5.x and native readers.
    user = tuple((k, v) for k, v in props.items() if not _is_system(k))
    v5 = Properties(user_properties=user) if user else NO_PROPERTIES
    props.update(to_properties(MqttMessage(topic, b"", qos, False, v5)))
    if _props_size(props) > MAX_PROPERTIES_BYTES:
        raise GrpcError(pb.MESSAGE_PROPERTIES_TOO_LARGE,
                        f"properties exceed {MAX_PROPERTIES_BYTES} bytes")
    msg.mqtt_topic = topic


_SYSTEM = frozenset({
    MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX, MessageConst.TAGS, MessageConst.KEYS,
    SHARDING_KEY,
})


def _is_system(key: str) -> bool:
    return key in _SYSTEM


class MqttOut:
    """The route table of MQTT sends: a read-only follower of the route log, made at the
    first such send, brought up to the log's end before each send (concurrent sends share
    one catch-up that started after they arrived)."""

    def __init__(self, client: ClientInstance) -> None:
        self.client = client
        self.reader: RouteReader | None = None
        self._lock = trio.Lock()
        self._started = 0  # catch-ups begun
        self._done = 0  # the number of the last one finished
        self._joined = trio.Event()

    async def run(self) -> None:
        """Keep this front end a member of the route log's group once it wrote MQTT
        traffic (HEART_BEAT every `heartbeat_interval_s`)."""
        await self._joined.wait()
        assert self.reader is not None
        await self.reader._heartbeat_loop()

    async def table(self) -> RouteTable:
        """The route table, caught up with every change stored before this call."""
        arrived = self._started
        async with self._lock:
            if self._done > arrived and self.reader is not None:
                return self.reader.table
            self._started += 1
            ticket = self._started
            try:
                if self.reader is None:
                    self.reader = await open_reader(self.client, "grpc")
                    self._joined.set()
                    # MQTT gateways of other processes look for new members this often:
                    # let them switch to long polls before the first write (once).
                    await trio.sleep(ANNOUNCE_WAIT_S)
                await self.reader.catch_up()
            except (MQClientError, RemotingError, OSError) as exc:
                if self.reader is not None:  # the log's master may have moved (failover)
                    await self.reader.master.reresolve()
                raise GrpcError(pb.INTERNAL_SERVER_ERROR,
                                f"MQTT routes unreadable: {exc}") from exc
            self._done = ticket
            return self.reader.table

    async def dispatch(self, msg: OutgoingMessage) -> None:
        """Name the LMQs of `msg` (prepared MQTT traffic) in INNER_MULTI_DISPATCH."""
        assert msg.mqtt_topic is not None
        lmqs = (await self.table()).mqtt_publish_lmqs(msg.mqtt_topic)
        if not lmqs:
            return
        msg.properties[MessageConst.INNER_MULTI_DISPATCH] = lmq_dispatch_value(list(lmqs))
        if _props_size(msg.properties) > MAX_PROPERTIES_BYTES:
            raise GrpcError(pb.MESSAGE_PROPERTIES_TOO_LARGE,
                            f"properties with the LMQs of {len(lmqs)} subscriptions exceed "
                            f"{MAX_PROPERTIES_BYTES} bytes")
        # Before the write: the local MQTT gateways stop predicting their LMQs' tails.
        note_foreign_writer()
