"""The POP receipt handle ("extraInfo", message property POP_CK) — docs/pop.md.

Eight space-separated fields, in Apache RocketMQ 5's order:

    ckQueueOffset popTime invisibleTime reviveQid retryMark brokerName queueId queueOffset

`retryMark` is 0 for a normal topic or LMQ (1 and 2 name Apache's pop-retry topics, which
this broker never hands out). `ckQueueOffset` is the first offset of that queue in the
pop response; `popTime` identifies the delivery (unique per broker).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ReceiptHandle", "build_extra_info", "parse_extra_info", "MAX_HANDLE_LENGTH"]

#: Longest extraInfo accepted (a real one is well under 200 characters).
MAX_HANDLE_LENGTH = 512


@dataclass(slots=True, frozen=True)
class ReceiptHandle:
    ck_queue_offset: int
    pop_time: int
    invisible_time: int
    revive_qid: int
    retry: str
    broker_name: str
    queue_id: int
    queue_offset: int

    def encode(self) -> str:
        return build_extra_info(
            self.ck_queue_offset, self.pop_time, self.invisible_time, self.revive_qid,
            self.broker_name, self.queue_id, self.queue_offset, self.retry,
        )


def build_extra_info(ck_queue_offset: int, pop_time: int, invisible_time: int,
                     revive_qid: int, broker_name: str, queue_id: int,
                     queue_offset: int, retry: str = "0") -> str:
    return (f"{ck_queue_offset} {pop_time} {invisible_time} {revive_qid} {retry} "
            f"{broker_name} {queue_id} {queue_offset}")


def parse_extra_info(text: str) -> ReceiptHandle:
    """Parse a handle; ValueError when it is not one. A 7-field handle (no queueOffset,
    as old clients build it) gets queue_offset -1: the request's `offset` header says it."""
    if not text or len(text) > MAX_HANDLE_LENGTH:
        raise ValueError("bad receipt handle length")
    parts = text.split(" ")
    if len(parts) not in (7, 8):
        raise ValueError(f"receipt handle has {len(parts)} fields, expected 7 or 8")
    return ReceiptHandle(
        int(parts[0]), int(parts[1]), int(parts[2]), int(parts[3]), parts[4], parts[5],
        int(parts[6]), int(parts[7]) if len(parts) == 8 else -1,
    )
