"""Message model: what a producer sends (`Message`), what the store keeps and a consumer
receives (`MessageExt`), and what the broker hands to the store (`InnerMessage`, or
`MessageBatch` for a batch send)."""

from __future__ import annotations

from dataclasses import dataclass, field

from core.common.properties import MessageConst


@dataclass(slots=True)
class Message:
    """A message as a producer builds it."""

    topic: str
    body: bytes
    flag: int = 0
    properties: dict[str, str] = field(default_factory=dict)

    @property
    def tags(self) -> str | None:
        return self.properties.get(MessageConst.TAGS)

    @tags.setter
    def tags(self, value: str | None) -> None:
        self._set(MessageConst.TAGS, value)

    @property
    def keys(self) -> list[str]:
        raw = self.properties.get(MessageConst.KEYS, "")
        return [k for k in raw.split(MessageConst.KEY_SEPARATOR) if k]

    @keys.setter
    def keys(self, value: list[str] | str | None) -> None:
        if isinstance(value, (list, tuple)):
            value = MessageConst.KEY_SEPARATOR.join(value)
        self._set(MessageConst.KEYS, value)

    @property
    def delay_level(self) -> int:
        try:
            return int(self.properties.get(MessageConst.DELAY_TIME_LEVEL, "0"))
        except ValueError:
            return 0

    @delay_level.setter
    def delay_level(self, level: int) -> None:
        self._set(MessageConst.DELAY_TIME_LEVEL, str(level) if level > 0 else None)

    @property
    def uniq_key(self) -> str | None:
        return self.properties.get(MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX)

    def _set(self, key: str, value: str | None) -> None:
        if value:
            self.properties[key] = value
        else:
            self.properties.pop(key, None)


@dataclass(slots=True)
class MessageExt(Message):
    """A stored message with the fields the store assigned (docs/protocol.md §7.1)."""

    queue_id: int = 0
    queue_offset: int = 0
    commitlog_offset: int = 0
    store_size: int = 0
    sys_flag: int = 0
    born_timestamp: int = 0
    born_host: str = "127.0.0.1:0"
    store_timestamp: int = 0
    store_host: str = "127.0.0.1:0"
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0
    body_crc: int = 0

    @property
    def offset_msg_id(self) -> str:
        from core.common.codec import encode_host
        from core.common.msgid import offset_msg_id

        return offset_msg_id(encode_host(self.store_host), self.commitlog_offset)

    @property
    def msg_id(self) -> str:
        """What applications see as the id: UNIQ_KEY when present, else the offset id."""
        return self.uniq_key or self.offset_msg_id

    def lmq_offsets(self) -> dict[str, int]:
        """Position of this message in each queue of INNER_MULTI_DISPATCH (docs/protocol.md §10.2)."""
        names = self.properties.get(MessageConst.INNER_MULTI_DISPATCH)
        offsets = self.properties.get(MessageConst.INNER_MULTI_QUEUE_OFFSET)
        if not names or not offsets:
            return {}
        sep = MessageConst.MULTI_DISPATCH_SEPARATOR
        return {n: int(o) for n, o in zip(names.split(sep), offsets.split(sep), strict=False)}


@dataclass(slots=True)
class InnerMessage:
    """A message the broker asks the store to append.

    `born_host`/`store_host` are 8-byte encodings (`codec.encode_host`). `tags_code` is the
    consume-queue tag slot; None means "hash of TAGS" (the delay service puts the delivery
    time there instead). The store assigns queue offsets, the physical offset, the store
    timestamp and INNER_MULTI_QUEUE_OFFSET.
    """

    topic: str
    body: bytes
    queue_id: int = 0
    flag: int = 0
    properties: dict[str, str] = field(default_factory=dict)
    sys_flag: int = 0
    born_timestamp: int = 0
    born_host: bytes = b"\x7f\x00\x00\x01\x00\x00\x00\x00"
    store_host: bytes = b"\x7f\x00\x00\x01\x00\x00\x00\x00"
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0
    tags_code: int | None = None


@dataclass(slots=True)
class MessageBatch:
    """A batch send (docs/protocol.md §7.7) handed to `MessageStore.put_batch` as it arrived:
    the sub-messages stay encoded in `body`, so a batch costs no object per message.

    Each sub-message is stored as one record with its own FLAG, BODY and properties, the
    header fields below, and consecutive queue offsets. Its properties are stored as Java
    stores them: the sub-message's own string (minus WAIT pairs), a \\x02 if it does not
    end with one, then the batch-level `properties` (the broker adds CLUSTER there).
    """

    topic: str
    queue_id: int
    body: bytes  # the concatenated sub-messages, uncompressed
    properties: str = ""  # batch-level properties string, appended to every sub-message's
    sys_flag: int = 0
    born_timestamp: int = 0
    born_host: bytes = b"\x7f\x00\x00\x01\x00\x00\x00\x00"
    store_host: bytes = b"\x7f\x00\x00\x01\x00\x00\x00\x00"
    reconsume_times: int = 0
