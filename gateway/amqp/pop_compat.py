"""Working without lmq-gateway's private POP codes (docs/amqp.md, "In front of an Apache
RocketMQ 5 broker"): how a refusal is recognised, and Queue.Purge by Apache's codes."""

from __future__ import annotations

import logging

from core.client.errors import MQBrokerError
from core.client.pop_consumer import PopClient
from core.remoting.codes import ResponseCode

__all__ = ["MAX_PURGE_DRAIN", "APACHE_MODE_LOG", "drain", "unsupported"]

log = logging.getLogger("gateway.amqp.broker")

#: Without the broker's POP_PURGE, Queue.Purge pops and acknowledges the ready messages:
#: at most this many per purge (about 3,000 POP + BATCH_ACK round trips).
MAX_PURGE_DRAIN = 100_000
#: Invisibility of the messages such a purge pops (acknowledged at once).
_DRAIN_INVISIBLE_MS = 60_000

APACHE_MODE_LOG = (
    "AMQP gateway: broker %s does not serve lmq-gateway's POP extensions (%s); using Apache "
    "RocketMQ 5 POP only: a crashed gateway's unacknowledged deliveries return after "
    "invisible_ms, not at once; a reject without a dead-letter exchange drops the message; "
    "Queue.Purge pops and acknowledges the ready messages (docs/amqp.md)")


def unsupported(exc: BaseException) -> bool:
    """The broker does not know the request code (an Apache broker, or ours in
    apache_strict mode, answering one of lmq-gateway's private POP codes)."""
    return isinstance(exc, MQBrokerError) and exc.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED


async def drain(pop: PopClient, lmq: str, batch: int, name: str) -> int:
    """Pop (no wait) and acknowledge the ready messages of `lmq`, up to MAX_PURGE_DRAIN;
    deliveries in flight stay (they come back at their deadline). How many went."""
    dropped = 0
    while dropped < MAX_PURGE_DRAIN:
        result = await pop.pop(lmq, max_nums=min(batch, MAX_PURGE_DRAIN - dropped),
                               invisible_ms=_DRAIN_INVISIBLE_MS, poll_ms=0, light=True)
        if not result.messages:
            return dropped
        await pop.batch_ack(result.messages)
        dropped += len(result.messages)
    log.warning("AMQP purge of queue %r stopped after %d messages (MAX_PURGE_DRAIN)", name,
                dropped)
    return dropped
