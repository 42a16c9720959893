"""Who writes MQTT LMQs in this process: the amq.topic bridge between the MQTT and AMQP
gateways (docs/amqp.md, "MQTT and AMQP on one message").

An embedded MQTT gateway that believes itself the only writer of its LMQs predicts their
next offsets (gateway/mqtt/broker_link.py); an AMQP publish to `amq.topic` written into one
of them would be skipped. The AMQP gateway of the same process calls `note_foreign_writer`
before it stores its first such message, which switches every local MQTT gateway to
reading LMQs by long polls (`BrokerLink.share_lmqs`). AMQP gateways of other processes are
seen as route-log members instead (gateway/mqtt/server.py, FOREIGN_WRITER_PREFIXES); the
local one's id is in `LOCAL_WRITERS`, so it is not counted there.
"""

from __future__ import annotations

import weakref
from typing import Any

__all__ = ["AMQP_LMQ_PREFIXES", "LOCAL_WRITERS", "note_foreign_writer", "register_link"]

#: LMQs of AMQP queues (gateway/routing/lmq_names.py, namespace "a").
AMQP_LMQ_PREFIXES = ("%LMQ%a_", "%LMQ%a-")
#: Route-log member ids of this process's gateways that call `note_foreign_writer` before
#: writing MQTT LMQs (the embedded AMQP gateway).
LOCAL_WRITERS: set[str] = set()
#: The MQTT gateways' BrokerLinks of this process.
_LINKS: weakref.WeakSet = weakref.WeakSet()


def register_link(link: Any) -> None:
    """An MQTT BrokerLink of this process (it has `share_lmqs()`)."""
    _LINKS.add(link)


def note_foreign_writer() -> None:
    """Something other than the local MQTT gateways is about to write MQTT LMQs: they stop
    predicting LMQ tails from now on. Called before that write is sent, so no tail is
    predicted across it; a no-op once they switched."""
    for link in list(_LINKS):
        link.share_lmqs()
