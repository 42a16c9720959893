"""The properties of a send, read once per distinct text (docs/store-api.md "In process").

A gateway's publishes repeat a handful of property strings (the AMQP gateway's stored
properties of one exchange, key and queue set; the MQTT gateway's batch properties), and
every send used to decode its string into a dict, drop WAIT, add CLUSTER and look for
the reserved, delay, timer and transaction properties. `SendPropsMemo` keeps that work
per text: a send takes a copy of the dict and the flags. The texts come from clients, so
the memo is bounded (`PROPS_MEMO_SIZE` texts of at most `PROPS_MEMO_MAX_CHARS`, starting
over when full), and a text not kept is read as before. Its keys are `str` (SipHash).
"""

from __future__ import annotations

from typing import NamedTuple

from core.common.properties import MessageConst, decode_properties, encode_properties

__all__ = ["PROPS_MEMO_MAX_CHARS", "PROPS_MEMO_SIZE", "RESERVED_PROPERTIES", "SendProps",
           "SendPropsMemo", "positive_int"]

#: Property texts remembered (entries); the memo starts over when full.
PROPS_MEMO_SIZE = 512
#: Longer property texts are read for each send and not remembered.
PROPS_MEMO_MAX_CHARS = 4096

# Broker-internal properties a client may not set without the right (docs/acl.md §4):
# they make the store index the message into other queues (LMQs) at chosen offsets.
RESERVED_PROPERTIES = (
    MessageConst.INNER_MULTI_DISPATCH,
    MessageConst.INNER_MULTI_QUEUE_OFFSET,
)
# Every reserved name starts with this; a send without it anywhere needs no closer look.
INNER_MARK = "INNER_MULTI_"
# Every timer property (TIMER_DELIVER_MS, TIMER_DELAY_SEC, TIMER_DELAY_MS) contains this.
_TIMER_MARK = "TIMER_D"


def positive_int(value: str | None) -> bool:
    """A property value that reads as an integer above 0 (a DELAY level)."""
    if not value:
        return False
    try:
        return int(value) > 0
    except ValueError:
        return False


class SendProps(NamedTuple):
    """One send's properties as the processor reads them."""

    #: Decoded, WAIT left out, CLUSTER set; shared by the sends of this text: copy it.
    props: dict[str, str]
    #: `encode_properties(props)` (a batch's properties, appended to each message's).
    text: str
    #: The RESERVED_PROPERTIES it sets (only looked for when INNER_MARK is in the text).
    reserved: tuple[str, ...]
    #: A positive DELAY level.
    delayed: bool
    #: A DELAY level or a timer property (schedule.py "Timer messages").
    timed: bool
    #: TRAN_MSG is "true" (a half message, unless a delayed re-consumed one).
    prepared: bool


class SendPropsMemo:
    """SendProps by properties text (None: no properties), bounded (module doc)."""

    def __init__(self, cluster_name: str) -> None:
        self.cluster_name = cluster_name
        #: The hot path reads this dict itself (`entries.get(text) or read(text)`).
        self.entries: dict[str | None, SendProps] = {}

    def read(self, text: str | None) -> SendProps:
        """The SendProps of `text`, remembered when it is short enough."""
        props = decode_properties(text)
        props.pop(MessageConst.WAIT_STORE_MSG_OK, None)
        props[MessageConst.CLUSTER] = self.cluster_name
        reserved: tuple[str, ...] = ()
        if text and INNER_MARK in text:
            reserved = tuple(k for k in RESERVED_PROPERTIES if k in props)
        delay = props.get(MessageConst.DELAY_TIME_LEVEL)
        delayed = positive_int(delay)
        tran = props.get(MessageConst.TRANSACTION_PREPARED)
        entry = SendProps(props, encode_properties(props), reserved, delayed,
                          delayed or (text is not None and _TIMER_MARK in text),
                          bool(tran) and tran.lower() == "true")
        if text is None or len(text) <= PROPS_MEMO_MAX_CHARS:
            entries = self.entries
            if len(entries) >= PROPS_MEMO_SIZE:
                entries.clear()
            entries[text] = entry
        return entry
