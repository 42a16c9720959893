"""Permission bits, per-request resources and the codes that need the admin right.

Follows RocketMQ 4.x plain ACL (docs/acl.md §3): a request names the resources it touches
(topics, and groups as their `%RETRY%<group>` topic) and the permission it needs on each.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

from core.common.names import RETRY_GROUP_TOPIC_PREFIX
from core.remoting.codec import RemotingCommand
from core.remoting.codes import RequestCode as R

__all__ = [
    "ADMIN_CODES",
    "BodyTooLarge",
    "MAX_CHECKED_BODY_BYTES",
    "ANY",
    "DENY",
    "NAMESRV_WRITE_CODES",
    "PUB",
    "SUB",
    "check_permission",
    "gateway_only",
    "group_resource",
    "needs_admin",
    "parse_perm",
    "request_resources",
]

# RocketMQ's bit values.
DENY = 1
ANY = 2
PUB = 4
SUB = 8

_PERM_WORDS = {
    "DENY": DENY,
    "PUB": PUB,
    "SUB": SUB,
    "PUB|SUB": PUB | SUB,
    "SUB|PUB": PUB | SUB,
}

#: Broker codes that change broker-wide state or reveal other tenants' data. RocketMQ 4.x
#: marks only the first five; the rest are ours (docs/acl.md §3.3).
ADMIN_CODES = frozenset({
    R.UPDATE_AND_CREATE_TOPIC,
    R.UPDATE_BROKER_CONFIG,
    R.DELETE_TOPIC_IN_BROKER,
    R.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
    R.DELETE_SUBSCRIPTIONGROUP,
    R.GET_BROKER_CONFIG,
    R.GET_BROKER_RUNTIME_INFO,
    R.GET_ALL_TOPIC_CONFIG,
    R.GET_ALL_CONSUMER_OFFSET,
    R.GET_ALL_DELAY_OFFSET,
    R.GET_ALL_SUBSCRIPTIONGROUP_CONFIG,
    R.GET_CONSUMER_CONNECTION_LIST,
    R.GET_PRODUCER_CONNECTION_LIST,
    R.INVOKE_BROKER_TO_RESET_OFFSET,
    R.RESET_CONSUMER_CLIENT_OFFSET,
    R.INVOKE_BROKER_TO_GET_CONSUMER_STATUS,
    # Ours (docs/pop.md): releasing a POP holder makes another client's in-flight
    # messages visible again, so only an admin account (a gateway's) may name holders.
    R.POP_HOLDER_REGISTER,
    R.POP_HOLDER_RELEASE,
    # Purging drops every ready message of a queue for all its consumers (AMQP Queue.Purge).
    R.POP_PURGE,
})

#: Name-server codes that change the registry (or a broker's liveness).
NAMESRV_WRITE_CODES = frozenset({
    R.REGISTER_BROKER,
    R.UNREGISTER_BROKER,
    R.QUERY_DATA_VERSION,  # refreshes a broker's liveness
    R.PUT_KV_CONFIG,
    R.DELETE_KV_CONFIG,
    R.WIPE_WRITE_PERM_OF_BROKER,
    R.ADD_WRITE_PERM_OF_BROKER,
    R.DELETE_TOPIC_IN_NAMESRV,
    R.UPDATE_NAMESRV_CONFIG,
    R.GET_NAMESRV_CONFIG,
    # The HA controller (docs/ha.md): brokers' leases and roles, and the switch.
    R.CONTROLLER_HEARTBEAT,
    R.CONTROLLER_ALTER_SYNC_SET,
    R.CONTROLLER_GET_STATE,
    R.CONTROLLER_ELECT,
})


def needs_admin(code: int) -> bool:
    return code in ADMIN_CODES or code in NAMESRV_WRITE_CODES


def parse_perm(word: str) -> int:
    """"PUB", "SUB", "PUB|SUB", "DENY" -> bits; anything else is DENY, as in RocketMQ."""
    return _PERM_WORDS.get(word.strip().upper().replace(" ", ""), DENY)


def check_permission(needed: int, owned: int) -> bool:
    """RocketMQ's rule: DENY wins; ANY needs PUB or SUB; otherwise the bits must meet."""
    if owned & DENY:
        return False
    if needed & ANY:
        return bool(owned & (PUB | SUB))
    return bool(needed & owned)


def group_resource(group: str) -> str:
    """A group's permissions are keyed by its retry topic, as RocketMQ does."""
    return RETRY_GROUP_TOPIC_PREFIX + group


def _retry_group(topic: str) -> str | None:
    if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
        return topic[len(RETRY_GROUP_TOPIC_PREFIX):]
    return None


#: Groups and topics of the gateways' shared state (docs/stateless-gateways.md, "Security"):
#: `$share` POP groups, session position groups, the gateways' membership group and the
#: route log / client registry / session topics. Only gateway accounts (`admin` or
#: `innerProperties`) may use them, whatever their permissions say (ours; docs/acl.md §4).
GATEWAY_GROUP_PREFIXES = ("MQTT_SHARE_", "MQTT_S_", "LMQ_GW_")
GATEWAY_TOPIC_PREFIXES = ("LMQ_GW_",)


def gateway_only(resource: str) -> bool:
    """Is `resource` (a topic, or a group as its retry topic) reserved for gateways?"""
    if resource.startswith(RETRY_GROUP_TOPIC_PREFIX):
        return resource[len(RETRY_GROUP_TOPIC_PREFIX):].startswith(GATEWAY_GROUP_PREFIXES)
    return resource.startswith(GATEWAY_TOPIC_PREFIXES)


def send_resource(topic: str) -> tuple[str, int]:
    """The (resource, needed permission) of a send to `topic`: SUB on the group for a
    retry topic (a consumer sending a message back), else PUB on the topic."""
    group = _retry_group(topic)
    if group is not None:
        return group_resource(group), SUB
    return topic, PUB


def request_resources(cmd: RemotingCommand) -> Iterator[tuple[str, int]]:
    """(resource, needed permission) pairs of one request; empty for other codes.

    A send to a retry topic needs SUB on the group (a consumer sending a message back),
    as RocketMQ decides; everything else follows RocketMQ's table (docs/acl.md §3.2).
    """
    ext = cmd.ext_fields or {}
    code = cmd.code
    if code == R.SEND_MESSAGE or code == R.SEND_MESSAGE_V2 or code == R.SEND_BATCH_MESSAGE:
        long_names = code == R.SEND_MESSAGE
        yield send_resource(str(ext.get("topic" if long_names else "b") or ""))
    elif code == R.CONSUMER_SEND_MSG_BACK:
        yield group_resource(str(ext.get("group") or "")), SUB
        origin = ext.get("originTopic")
        if origin:
            yield str(origin), PUB
    elif code == R.PULL_MESSAGE:
        yield str(ext.get("topic") or ""), SUB
        yield group_resource(str(ext.get("consumerGroup") or "")), SUB
    elif code == R.QUERY_MESSAGE:
        yield str(ext.get("topic") or ""), SUB
    elif code == R.HEART_BEAT:
        yield from _heartbeat_resources(cmd)
    elif code in (R.UNREGISTER_CLIENT, R.GET_CONSUMER_LIST_BY_GROUP, R.GET_CONSUME_STATS):
        yield group_resource(str(ext.get("consumerGroup") or "")), SUB
    elif code in (R.UPDATE_CONSUMER_OFFSET, R.QUERY_CONSUMER_OFFSET):
        yield group_resource(str(ext.get("consumerGroup") or "")), SUB
        yield str(ext.get("topic") or ""), SUB
    elif code in (R.LOCK_BATCH_MQ, R.UNLOCK_BATCH_MQ):
        yield from _lock_resources(cmd)
    elif code in (R.POP_MESSAGE, R.ACK_MESSAGE, R.CHANGE_MESSAGE_INVISIBLETIME,
                  R.POP_DEAD_LETTER):
        # RocketMQ 5 consumes by POP with SUB on the topic and the group (docs/pop.md).
        yield str(ext.get("topic") or ""), SUB
        yield group_resource(str(ext.get("consumerGroup") or "")), SUB
    elif code == R.BATCH_ACK_MESSAGE:
        yield from _batch_ack_resources(cmd)
    elif code == R.RECALL_MESSAGE:  # as a send: PUB on the topic
        yield str(ext.get("topic") or ""), PUB


#: Largest HEART_BEAT / LOCK_BATCH_MQ / BATCH_ACK_MESSAGE body the ACL check parses to find its groups and
#: topics (real ones are a few KiB); a larger one is refused when ACL is on, so a peer
#: cannot make the check parse megabytes of JSON on the event loop.
MAX_CHECKED_BODY_BYTES = 1024 * 1024


class BodyTooLarge(ValueError):
    pass


def _json_body(cmd: RemotingCommand) -> object:
    if not cmd.body:
        return None
    if cmd.body_length > MAX_CHECKED_BODY_BYTES:
        raise BodyTooLarge(
            f"request body of {cmd.body_length} bytes is over the {MAX_CHECKED_BODY_BYTES} "
            f"bytes the ACL check reads"
        )
    try:
        return json.loads(cmd.body_bytes())
    except (ValueError, RecursionError):
        return None  # the handler answers the malformed body


def _heartbeat_resources(cmd: RemotingCommand) -> Iterator[tuple[str, int]]:
    data = _json_body(cmd)
    if not isinstance(data, dict):
        return
    consumers = data.get("consumerDataSet")
    for consumer in consumers if isinstance(consumers, list) else ():
        if not isinstance(consumer, dict):
            continue
        yield group_resource(str(consumer.get("groupName") or "")), SUB
        subs = consumer.get("subscriptionDataSet")
        for sub in subs if isinstance(subs, list) else ():
            if isinstance(sub, dict):
                yield str(sub.get("topic") or ""), SUB


def _batch_ack_resources(cmd: RemotingCommand) -> Iterator[tuple[str, int]]:
    # Each entry acks in its own (group, topic), short or long field names as Apache's.
    data = _json_body(cmd)
    acks = data.get("acks") if isinstance(data, dict) else None
    for item in acks if isinstance(acks, list) else ():
        if isinstance(item, dict):
            yield str(item.get("t", item.get("topic")) or ""), SUB
            yield group_resource(str(item.get("c", item.get("consumerGroup")) or "")), SUB


def _lock_resources(cmd: RemotingCommand) -> Iterator[tuple[str, int]]:
    # Ours: queue locks are taken by consumers of the group, on the group's topics.
    data = _json_body(cmd)
    if not isinstance(data, dict):
        return
    yield group_resource(str(data.get("consumerGroup") or "")), SUB
    queues = data.get("mqSet")
    for mq in queues if isinstance(queues, list) else ():
        if isinstance(mq, dict):
            yield str(mq.get("topic") or ""), SUB
