"""POP consumption state of the broker (RocketMQ 5 POP, docs/pop.md)."""

from core.broker.pop.handle import ReceiptHandle, build_extra_info, parse_extra_info
from core.broker.pop.state import Inflight, PopState, QueueState

__all__ = [
    "Inflight",
    "PopState",
    "QueueState",
    "ReceiptHandle",
    "build_extra_info",
    "parse_extra_info",
]
