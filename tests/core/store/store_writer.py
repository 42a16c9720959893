"""A store writer run as a separate process by the crash and torn-tail tests.

It appends messages with LMQ dispatch (single puts and small batches), flushes from a
worker thread as the broker would, and prints one line per acknowledged message:

    ACK <tag> <seq> <queue offset> <physical offset> <lmq offsets, comma-separated>

stdout is flushed after every line, so every line the parent reads is a message the
store acknowledged before the process was killed.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import threading
import time

from core.common.message import InnerMessage
from core.store import MessageStore, StoreConfig

LMQS = ("%LMQ%all", "%LMQ%m{mod}", "%LMQ%tag{tag}")


def lmq_names(tag: str, seq: int) -> list[str]:
    return [n.format(mod=seq % 3, tag=tag) for n in LMQS]


def body_of(tag: str, seq: int) -> bytes:
    head = f"{tag}:{seq}:".encode()
    return head + bytes([65 + seq % 26]) * (seq * 37 % 700)


def make(tag: str, seq: int) -> InnerMessage:
    return InnerMessage(
        "T", body_of(tag, seq), properties={
            "INNER_MULTI_DISPATCH": ",".join(lmq_names(tag, seq)),
            "KEYS": f"{tag}-{seq}", "UNIQ_KEY": f"U{tag}x{seq}", "TAGS": f"t{seq % 4}",
        },
    )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--tag", required=True)
    ap.add_argument("--count", type=int, default=10**9)
    ap.add_argument("--flush-ms", type=float, default=20)
    ap.add_argument("--file-size", type=int, default=64 * 1024)
    ap.add_argument("--cq-units", type=int, default=64)
    ap.add_argument("--unflushed", type=int, default=0,
                    help="after --count messages and a flush, write this many more, then _exit")
    ap.add_argument("--wal", action="store_true")
    args = ap.parse_args()
    store = MessageStore(StoreConfig(
        args.dir, commitlog_file_size=args.file_size, consume_queue_units_per_file=args.cq_units,
        kv_batch_max_ops=50, kv_disable_wal=not args.wal, kv_max_replay_bytes=256 * 1024,
        disk_max_used_ratio=1.0, disk_full_ratio=1.0,
    ))
    store.start()
    print(f"STARTED {store.recovery_report.bytes_scanned}", flush=True)
    stop = threading.Event()

    def flusher() -> None:
        while not stop.wait(args.flush_ms / 1000):
            store.flush()

    if args.flush_ms > 0:
        threading.Thread(target=flusher, daemon=True).start()
    rnd = random.Random(os.getpid())
    out = sys.stdout
    seq = 0

    def ack(s: int, r) -> None:
        out.write(f"ACK {args.tag} {s} {r.queue_offset} {r.physical_offset} "
                  f"{','.join(map(str, r.lmq_offsets))}\n")

    while seq < args.count:
        if rnd.random() < 0.2:
            n = rnd.randint(2, 4)
            r = store.put_batch([make(args.tag, seq + k) for k in range(n)])
            assert r.ok, r
            for k in range(n):
                m = store.look_message(int(r.msg_ids[k][16:], 16))
                ack(seq + k, type(r)(r.status, None, m.commitlog_offset, 0, m.queue_offset,
                                     [], 0, 0, list(m.lmq_offsets().values())))
            seq += n
        else:
            r = store.put(make(args.tag, seq))
            assert r.ok, r
            ack(seq, r)
            seq += 1
        out.flush()
    if args.unflushed:
        stop.set()
        store.flush(force_checkpoint=True)
        for k in range(args.unflushed):
            r = store.put(make(args.tag, seq + k))
            ack(seq + k, r)
        out.flush()
        os._exit(0)  # a crash: no shutdown, no checkpoint, RocksDB memtable lost
    while True:  # wait to be killed
        time.sleep(1)


if __name__ == "__main__":
    sys.exit(main())
