"""RECALL_MESSAGE (370): cancel a scheduled (delayed) message before it is due
(docs/grpc.md "RecallMessage").

Request header (Apache RocketMQ 5's): `topic`, `recallHandle`, optional `producerGroup`.
The handle is the base64url (no padding) of `v1 <topic> <brokerName> <deliverMs>
<messageId>`, as Apache's; it is given out with the send result of a delayed message
(the 5.x front end's SendMessage). Response header `msgId`.

A recall leaves a **mark** (topic, message id) that the delay service checks when the
scheduled message comes due (`ScheduleMessageService.recalls`): a marked message is
dropped instead of delivered. Marks are kept in `<data_dir>/config/delayRecall` (one
appended line each, no fsync: as durable as the POP journal) and expire once the
message can no longer be pending (its delivery time plus the longest delay level), so
their number is bounded by `MAX_RECALL_MARKS`.

Refused with ILLEGAL_OPERATION (604): a malformed handle, another topic or broker, a
delivery time already past (the message may have been delivered; as Apache, a recall
is accepted only before the delivery time the producer asked for). TOPIC_NOT_EXIST,
SYSTEM_BUSY when `MAX_RECALL_MARKS` marks are pending.
"""

from __future__ import annotations

import base64
import binascii
import logging
import os
import re
import time

from core.broker.metadata import atomic_write_bytes
from core.remoting.codec import RemotingCommand
from core.remoting.codes import RequestCode, ResponseCode

from .common import error

__all__ = ["register", "RecallMarks", "encode_recall_handle", "decode_recall_handle",
           "RECALL_MESSAGE", "MAX_RECALL_MARKS"]

log = logging.getLogger(__name__)

#: Apache RocketMQ's request code and response code for a refused recall.
RECALL_MESSAGE = RequestCode.RECALL_MESSAGE
ILLEGAL_OPERATION = 604
#: Most recall marks pending at once (SYSTEM_BUSY beyond).
MAX_RECALL_MARKS = 10_000
#: Longest recall handle accepted.
MAX_RECALL_HANDLE_LENGTH = 1024
_FILE = "delayRecall"
#: A handle field: printable ASCII without spaces (a mark is one line of the file).
_TOKEN = re.compile(r"[\x21-\x7e]{1,255}")


def encode_recall_handle(topic: str, broker: str, deliver_ms: int, message_id: str) -> str:
    text = f"v1 {topic} {broker} {deliver_ms} {message_id}".encode()
    return base64.urlsafe_b64encode(text).decode("ascii").rstrip("=")


def decode_recall_handle(handle: str) -> tuple[str, str, int, str]:
    """-> (topic, broker name, delivery time ms, message id); ValueError if malformed."""
    if not handle or len(handle) > MAX_RECALL_HANDLE_LENGTH:
        raise ValueError("bad recall handle length")
    try:
        text = base64.urlsafe_b64decode(handle + "=" * (-len(handle) % 4)).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise ValueError("recall handle is not base64url") from None
    parts = text.split(" ")
    if len(parts) != 5 or parts[0] != "v1" or not all(_TOKEN.fullmatch(p) for p in parts):
        raise ValueError("recall handle is not a v1 handle")
    return parts[1], parts[2], int(parts[3]), parts[4]


class RecallMarks:
    """Pending recalls: (topic, message id) -> expiry (epoch ms), journaled."""

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, _FILE)
        self.marks: dict[tuple[str, str], int] = {}
        self._fd: int | None = None
        self._lines = 0
        self._loaded = False
        self.recalled = 0  # scheduled messages dropped

    def load(self) -> None:
        """Read the marks back (dropping expired ones); the first recall after it rewrites
        the file compacted."""
        self._loaded = True
        now = int(time.time() * 1000)
        try:
            with open(self.path, encoding="utf-8", errors="replace") as f:
                for line in f:
                    parts = line.split(" ")
                    if len(parts) == 3 and line.endswith("\n"):
                        try:
                            expiry = int(parts[2])
                        except ValueError:
                            continue
                        if expiry > now:
                            self.marks[(parts[0], parts[1])] = expiry
        except FileNotFoundError:
            pass

    def _rewrite(self) -> None:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        data = "".join(f"{t} {m} {e}\n" for (t, m), e in self.marks.items())
        if self._fd is not None:
            os.close(self._fd)
        atomic_write_bytes(self.path, data.encode("utf-8"))
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        self._lines = len(self.marks)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def add(self, topic: str, message_id: str, expiry: int) -> bool:
        if not self._loaded:
            self.load()
        marks = self.marks
        if len(marks) >= MAX_RECALL_MARKS:
            now = int(time.time() * 1000)
            for key in [k for k, e in marks.items() if e <= now]:
                del marks[key]
            if len(marks) >= MAX_RECALL_MARKS:
                return False
        marks[(topic, message_id)] = expiry
        if self._fd is None or self._lines > 2 * len(marks) + 1000:
            self._rewrite()  # bounded: at most MAX_RECALL_MARKS short lines
        else:
            os.write(self._fd, f"{topic} {message_id} {expiry}\n".encode())
            self._lines += 1
        return True

    def take(self, topic: str, message_id: str | None) -> bool:
        """Whether the scheduled message (`topic`, `message_id`) was recalled (the delay
        service then drops it). The mark stays on file until it expires, so a delivery
        repeated after a crash is dropped too."""
        if not self._loaded:
            self.load()
        if not self.marks or not message_id:
            return False
        if self.marks.pop((topic, message_id), None) is None:
            return False
        self.recalled += 1
        return True


def register(table, broker) -> None:
    schedule = broker.schedule_service
    marks = RecallMarks(os.path.join(broker.config.data_dir, "config"))  # read on first use
    schedule.recalls = marks
    # A delivery time may lie up to timer_max_delay_s ahead (cascading through the
    # levels, core/broker/schedule.py), or one longest level for a 4.x delay.
    ahead_ms = max(max(schedule.delays_ms), schedule.timer_max_delay_ms)
    longest_ms = max(schedule.delays_ms)  # a mark outlives the delivery time by this

    async def recall(ctx, cmd: RemotingCommand) -> RemotingCommand:
        topic = cmd.ext_str("topic") or ""
        if broker.topic_config_manager.get(topic) is None:
            return error(cmd, ResponseCode.TOPIC_NOT_EXIST,
                         f"recall failed, the topic[{topic}] not exist")
        try:
            h_topic, h_broker, deliver_ms, message_id = decode_recall_handle(
                cmd.ext_str("recallHandle") or "")
        except ValueError as exc:
            return error(cmd, ILLEGAL_OPERATION, f"recall failed, {exc}")
        if h_topic != topic:
            return error(cmd, ILLEGAL_OPERATION, "recall failed, topic not match")
        if h_broker != broker.config.broker_name:
            return error(cmd, ILLEGAL_OPERATION, "recall failed, not this broker's message")
        now = int(time.time() * 1000)
        if not now < deliver_ms <= now + ahead_ms:
            return error(cmd, ILLEGAL_OPERATION, "recall failed, timestamp invalid")
        try:
            ok = marks.add(topic, message_id, deliver_ms + longest_ms + 60_000)
        except OSError as exc:
            return error(cmd, ResponseCode.SYSTEM_ERROR, f"recall failed: {exc}")
        if not ok:
            return error(cmd, ResponseCode.SYSTEM_BUSY,
                         f"recall failed, {MAX_RECALL_MARKS} recalls pending")
        return cmd.make_response(ResponseCode.SUCCESS, None, {"msgId": message_id})

    table.register(RECALL_MESSAGE, recall)
