"""Store side of master/slave replication (docs/ha.md): cut CommitLog chunks on the
master, write and dispatch them on the slave."""

from core.store.ha.replica import ReplicaError, append_chunk, commit_if_due, read_chunk

__all__ = ["ReplicaError", "append_chunk", "commit_if_due", "read_chunk"]
