"""The dashboard's write actions, run for a logged-in admin (see `lmq.dashboard`).

Topic and offset actions go through the broker's own admin processor (the code behind
UPDATE_AND_CREATE_TOPIC, DELETE_TOPIC_IN_BROKER and INVOKE_BROKER_TO_RESET_OFFSET), so
they validate and act exactly as `lmq admin` does. Purging an AMQP queue moves the
queue's consumer group to the end of its LMQ (a queue is a read position, docs/amqp.md);
kicking an MQTT client closes its connection with reason 0x98 (administrative action).
"""

from __future__ import annotations

import logging
from typing import Any

from lmq.dashboard.views import BadRequest


class Conflict(BadRequest):
    """The action cannot run in the current state: answered with 409."""

log = logging.getLogger("lmq.dashboard")

MAX_TOPIC_QUEUES = 64  # queues of a topic created from the dashboard (lmq admin allows more)
KICK_REASON = 0x98  # MQTT 5 DISCONNECT: Administrative action


def _text(body: dict[str, Any], name: str, limit: int = 255) -> str:
    value = body.get(name)
    if not isinstance(value, str) or not value.strip():
        raise BadRequest(f"{name} is required")
    if len(value) > limit:
        raise BadRequest(f"{name} is longer than {limit} characters")
    return value.strip()


def _number(body: dict[str, Any], name: str, default: int) -> int:
    value = body.get(name, default)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise BadRequest(f"{name} must be a whole number")
    return value


async def _admin(broker, code: int, ext: dict[str, str]) -> str:
    """Run one admin request in-process through the broker's processor; '' on success,
    else the broker's remark."""
    from core.broker.processors.admin import AdminProcessor
    from core.remoting.codec import RemotingCommand
    from core.remoting.errors import HeaderError

    cmd = RemotingCommand.request(code, ext)
    proc = AdminProcessor(broker)
    handler = {17: proc.update_and_create_topic, 215: proc.delete_topic,
               222: proc.invoke_broker_to_reset_offset}[code]
    try:
        answer = await handler(None, cmd)
    except HeaderError as exc:
        return str(exc)
    return "" if answer.code == 0 else (answer.remark or f"refused with code {answer.code}")


async def create_topic(broker, body: dict[str, Any]) -> str:
    topic = _text(body, "topic", 127)
    queues = _number(body, "queues", 4)
    if not 1 <= queues <= MAX_TOPIC_QUEUES:
        raise BadRequest(f"queues must be in 1..{MAX_TOPIC_QUEUES}")
    problem = await _admin(broker, 17, {"topic": topic, "readQueueNums": str(queues),
                                        "writeQueueNums": str(queues), "perm": "6"})
    if problem:
        raise BadRequest(problem)
    return f"topic {topic} created with {queues} queues"


async def delete_topic(broker, body: dict[str, Any]) -> str:
    topic = _text(body, "topic", 127)
    if broker.topic_config_manager.get(topic) is None:
        raise BadRequest(f"no topic {topic!r}")
    problem = await _admin(broker, 215, {"topic": topic})
    if problem:
        raise BadRequest(problem)
    return f"topic {topic} deleted"


async def reset_offset(broker, body: dict[str, Any]) -> str:
    """`to`: "earliest", "latest", or a timestamp in ms (the first message stored then)."""
    group = _text(body, "group")
    topic = _text(body, "topic", 127)
    to = body.get("to", "earliest")
    if to == "earliest":
        timestamp = 0
    elif to == "latest":
        timestamp = -1
    else:
        timestamp = _number(body, "to", 0)
        if timestamp < 0:
            raise BadRequest("to must be earliest, latest or a time in ms since 1970")
    problem = await _admin(broker, 222, {"topic": topic, "group": group,
                                         "timestamp": str(timestamp), "isForce": "true"})
    if problem:
        raise BadRequest(problem)
    return f"group {group} on {topic} reset to {to}"


def purge_amqp_queue(amqp, broker, body: dict[str, Any]) -> str:
    """Drop the ready messages of an AMQP queue: its consumer group moves to the end of
    the queue's LMQ. Once a consumer has popped from the queue, the broker's POP state
    owns that position, and the purge is refused (AMQP's own queue.purge is the way)."""
    name = _text(body, "queue")
    queue = amqp.queues.get(name)
    if queue is None:
        raise BadRequest(f"no AMQP queue {name!r}")
    group = amqp.config.group_prefix + queue.lmq
    pop = getattr(broker, "pop_service", None)
    if pop is not None and pop.state.get(group, queue.lmq, 0) is not None:
        raise Conflict(f"queue {name} has been consumed since the server started: purge it "
                       f"with AMQP queue.purge, or delete and declare it again")
    store = broker.store
    end = store.max_offset(queue.lmq, 0)
    done = broker.offset_manager.query(group, queue.lmq, 0)
    broker.offset_manager.commit(group, queue.lmq, 0, end)
    purged = max(0, end - max(done, store.min_offset(queue.lmq, 0)))
    return f"queue {name} purged ({purged} messages)"


def kick_mqtt_client(gw, body: dict[str, Any]) -> str:
    client_id = _text(body, "client_id", 65535)
    sess = gw.registry.sessions.get(client_id)
    if sess is None or sess.conn is None:
        raise BadRequest(f"MQTT client {client_id!r} is not connected")
    sess.conn.close(KICK_REASON)
    return f"client {client_id} disconnected"
