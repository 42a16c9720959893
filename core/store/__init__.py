"""The store: CommitLog, ConsumeQueues, LMQ index, dispatch, recovery, flush, retention,
key/time index (docs/architecture.md §2). A library: no sockets, no trio. API: docs/store-api.md."""

from core.store.config import StoreConfig
from core.store.message_store import MessageStore
from core.store.recovery import RecoveryReport
from core.store.results import (
    GetResult,
    GetStatus,
    MessageFilter,
    PutResult,
    PutStatus,
)

__all__ = [
    "GetResult",
    "GetStatus",
    "MessageFilter",
    "MessageStore",
    "PutResult",
    "PutStatus",
    "RecoveryReport",
    "StoreConfig",
]
