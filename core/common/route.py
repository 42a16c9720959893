"""Route data the name server keeps and answers and clients read (docs/protocol.md §4.1)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class QueueData:
    """A topic's queues on one broker (TopicRouteData.queueDatas element)."""

    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_sys_flag: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "brokerName": self.broker_name,
            "readQueueNums": self.read_queue_nums,
            "writeQueueNums": self.write_queue_nums,
            "perm": self.perm,
            "topicSysFlag": self.topic_sys_flag,
        }

    @classmethod
    def from_json(cls, obj: dict) -> QueueData:
        """As a client reads it: missing counts are 0, a missing perm is 6 (read and
        write), and older servers spell the flag `topicSynFlag`."""
        return cls(
            str(obj["brokerName"]),
            int(obj.get("readQueueNums", 0)),
            int(obj.get("writeQueueNums", 0)),
            int(obj.get("perm", 6)),
            int(obj.get("topicSysFlag", obj.get("topicSynFlag", 0)) or 0),
        )
