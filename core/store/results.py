"""Results of store calls and the filter protocol (docs/store-api.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol


class PutStatus(Enum):
    """Outcome of `put`/`put_batch` (RocketMQ PutMessageStatus)."""

    OK = "OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"  # SYNC_MASTER (set by the broker)
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"
    SERVICE_NOT_AVAILABLE = "SERVICE_NOT_AVAILABLE"
    MESSAGE_ILLEGAL = "MESSAGE_ILLEGAL"
    PROPERTIES_SIZE_EXCEEDED = "PROPERTIES_SIZE_EXCEEDED"
    LMQ_NAME_ILLEGAL = "LMQ_NAME_ILLEGAL"
    LMQ_CONSUME_QUEUE_NUM_EXCEEDED = "LMQ_CONSUME_QUEUE_NUM_EXCEEDED"
    QUEUE_ID_ILLEGAL = "QUEUE_ID_ILLEGAL"
    UNKNOWN_ERROR = "UNKNOWN_ERROR"


@dataclass(slots=True)
class PutResult:
    """What an append produced. On a non-OK status nothing was written and the numeric
    fields are -1 (lists empty)."""

    status: PutStatus
    remark: str | None = None
    physical_offset: int = -1  # wrote offset of the (first) record
    wrote_bytes: int = 0
    queue_offset: int = -1  # queue offset of the (first) record
    msg_ids: list[str] = field(default_factory=list)  # offset msgIds, one per record
    store_timestamp: int = -1
    end_offset: int = -1  # CommitLog offset after the last byte written (SYNC flush waits)
    lmq_offsets: list[int] = field(default_factory=list)  # INNER_MULTI_QUEUE_OFFSET (first)

    @property
    def ok(self) -> bool:
        return self.status is PutStatus.OK


class GetStatus(Enum):
    """Outcome of `get` (RocketMQ GetMessageStatus); see docs/protocol.md §5.2 for the mapping."""

    FOUND = "FOUND"
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"
    OFFSET_FOUND_NULL = "OFFSET_FOUND_NULL"
    MESSAGE_WAS_REMOVING = "MESSAGE_WAS_REMOVING"
    NO_MATCHED_LOGIC_QUEUE = "NO_MATCHED_LOGIC_QUEUE"


@dataclass(slots=True)
class GetResult:
    """Records found by `get`: zero-copy slices of the mapped CommitLog, one per record.

    The slices stay valid after retention deletes their file (the mapping lives until the
    last slice is released), but callers should release them once sent.
    """

    status: GetStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    buffers: list[memoryview] = field(default_factory=list)
    message_count: int = 0
    total_size: int = 0


class MessageFilter(Protocol):
    """Server-side filter (implemented in core/broker/filter): a cheap check on the CQ tag
    code first, then an exact check on the stored record."""

    def is_matched_by_consume_queue(self, tags_code: int) -> bool: ...

    def is_matched_by_commit_log(self, record: memoryview) -> bool: ...
