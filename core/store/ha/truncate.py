"""Cut a stopped store's CommitLog at an offset (a deposed master rejoining as a slave).

Runs before the store opens. The file holding `offset` is zeroed from there (shrunk and
grown back: the zeros are a hole, nothing is written), later files are deleted and the
checkpoint is moved back to at most `offset`. The normal recovery then ends the CommitLog
at `offset`, cuts ConsumeQueue units past it and drops LMQ units past it (RocksDB's
marker is ahead), exactly as after a torn tail.
"""

from __future__ import annotations

import os

from core.store.checkpoint import Checkpoint


def truncate_commitlog(store_dir: str, file_size: int, offset: int) -> int:
    """Returns the number of bytes the CommitLog held past `offset` (0: nothing cut)."""
    cl_dir = os.path.join(store_dir, "commitlog")
    try:
        names = sorted(n for n in os.listdir(cl_dir) if n.isdigit())
    except FileNotFoundError:
        return 0
    cut = 0
    for name in names:
        start = int(name)
        path = os.path.join(cl_dir, name)
        if start + file_size <= offset:
            continue
        if start > offset or (start == offset and start > int(names[0])):
            cut += os.path.getsize(path)
            os.unlink(path)
            continue
        keep = max(0, offset - start)
        size = os.path.getsize(path)
        with open(path, "r+b") as fh:
            fh.truncate(keep)
            fh.truncate(size)
            os.fsync(fh.fileno())
        cut += size - keep
    ck_path = os.path.join(store_dir, "checkpoint")
    if os.path.exists(ck_path):
        ck = Checkpoint(ck_path)
        try:
            if ck.physical_offset is not None and ck.physical_offset > offset:
                ck.write(offset)
        finally:
            ck.close()
    return cut
