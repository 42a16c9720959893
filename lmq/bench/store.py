"""`lmq bench store`: throughput of the store library, against a ceiling measured in the
same run (a loop that only packs 256-byte records into a mapped file: what CPython allows
before any store logic).

Figures (JSON keys): put_msgs_per_s_1cq (256 B bodies, one queue), put_msgs_per_s_4lmq
(each message also dispatched to 4 LMQs out of 1,000: always in the LMQ offset cache),
put_msgs_per_s_4lmq_100k / _1m (4 LMQs out of 100,000 / 1,000,000 LMQs that exist
already, picked at random: the cache holds 100,000 by default, so the 1M case mostly
misses it and reads RocksDB), put_batch_* (through put_batch, 32 per call),
put_mb_per_s_4k (4 KiB bodies, MB = 1e6 body bytes), get_msgs_per_s (32 per get),
recovery_s_1gib (MessageStore.start() after kill -9 of a writer that wrote 1 GiB),
rss_mb_1m_lmq (anonymous RSS added by 1M LMQs of one message each, in a fresh process),
raw_pack_msgs_per_s / raw_pack_mb_per_s_4k (the ceilings), and *_ratio = figure / ceiling.
Every message carries TAGS and UNIQ_KEY, as real producers send them.

Each throughput is the median of 3 timed rounds of equal size (the machine is shared:
the median is neither the luckiest nor the unluckiest round); the rounds themselves are
under <key>_rounds.
"""

from __future__ import annotations

import argparse
import gc
import json
import mmap
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zlib

from core.common.codec import HEADER, INT16, MAGIC_V1
from core.common.message import InnerMessage
from core.store import MessageStore, StoreConfig
from lmq import progress

HOST = b"\x7f\0\0\1\0\0\0\0"
# Measurements, not a disk-pressure test: no retention or refusal because the machine's
# disk is busy with other things (a really full disk still fails the puts: ENOSPC).
NO_DISK_LIMITS = {"disk_max_used_ratio": 1.0, "disk_full_ratio": 1.0}

ROUNDS = 3  # throughput figures are the median of this many rounds
# "lmq_100k" / "lmq_1m": LMQ populations (and the messages put over each) of the figures
# named after the full sizes.
FULL = {"put": 400_000, "lmq": 200_000, "big": 60_000, "raw": 1_000_000,
        "recovery_bytes": 1 << 30, "rss_lmqs": 1_000_000,
        "lmq_100k": (100_000, 150_000), "lmq_1m": (1_000_000, 60_000)}
QUICK = {"put": 20_000, "lmq": 10_000, "big": 3_000, "raw": 50_000,
         "recovery_bytes": 16 << 20, "rss_lmqs": 20_000,
         "lmq_100k": (2_000, 6_000), "lmq_1m": (20_000, 6_000)}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="small sizes (smoke test)")
    parser.add_argument("--no-lmq-1m", action="store_true",
                        help="skip the put over 1M existing LMQs (~30 s of the full run)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--data-dir", help="where to create stores (default: a temp dir)")


# ---------------------------------------------------------------------- ceilings
def raw_pack(n: int, body_size: int, directory: str) -> float:
    """Records per second packed into a mapped file by the tightest loop we can write."""
    body = os.urandom(body_size)
    topic_tail = b"\x05Bench"
    props = b"TAGS\x01TagA\x02UNIQ_KEY\x01" + b"0" * 32
    total = 91 + len(body) + 5 + len(props)
    size = min(n * total, 1 << 30)  # fresh pages in every round, as the store writes
    path = os.path.join(directory, "raw")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    os.ftruncate(fd, size)
    mm = mmap.mmap(fd, size)
    os.close(fd)
    pack = HEADER.pack_into
    pack16 = INT16.pack_into
    crc32 = zlib.crc32
    blen = len(body)
    rates = []
    pos = 0
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        for i in range(n // ROUNDS):
            if pos + total > size:
                pos = 0
            pack(mm, pos, total, MAGIC_V1, crc32(body) & 0x7FFFFFFF, 0, 0, i, pos, 0, 0, HOST,
                 0, HOST, 0, 0, blen)
            p = pos + 88
            mm[p : p + blen] = body
            p += blen
            mm[p : p + 6] = topic_tail
            p += 6
            pack16(mm, p, len(props))
            mm[p + 2 : p + 2 + len(props)] = props
            pos += total
        rates.append((n // ROUNDS) / (time.perf_counter() - t0))
    mm.close()
    os.unlink(path)
    return statistics.median(rates)


# ---------------------------------------------------------------------- store figures
def _messages(n: int, body_size: int, lmqs: int, queue_id: int = 0) -> list[InnerMessage]:
    body = os.urandom(body_size)
    out = []
    for i in range(n):
        props = {"TAGS": "TagA", "UNIQ_KEY": f"{i:032X}"}
        if lmqs:
            props["INNER_MULTI_DISPATCH"] = ",".join(f"%LMQ%q{(i * 7 + k) % 1000}" for k in range(lmqs))
        out.append(InnerMessage("Bench", body, queue_id=queue_id, properties=props))
    return out


def _lmq_messages(n: int, population: int, queue_id: int) -> list[InnerMessage]:
    """n messages of 256 B, each dispatched to 4 distinct LMQs of %LMQ%p0..population-1
    picked at random (the same every run)."""
    rng = random.Random(population)
    body = os.urandom(256)
    return [
        InnerMessage("Bench", body, queue_id=queue_id, properties={
            "TAGS": "TagA", "UNIQ_KEY": f"{i:032X}",
            "INNER_MULTI_DISPATCH": ",".join(f"%LMQ%p{x}" for x in rng.sample(range(population), 4)),
        })
        for i in range(n)
    ]


def _create_lmqs(store: MessageStore, population: int) -> None:
    """One message in each of %LMQ%p0..population-1 (not timed)."""
    for start in range(0, population, 1000):
        store.put_batch([
            InnerMessage("Warm", b"w", properties={"INNER_MULTI_DISPATCH": f"%LMQ%p{i}"})
            for i in range(start, min(population, start + 1000))
        ])


def _store(directory: str, name: str) -> MessageStore:
    path = os.path.join(directory, name)
    shutil.rmtree(path, ignore_errors=True)
    store = MessageStore(StoreConfig(path, commitlog_file_size=256 << 20, **NO_DISK_LIMITS))
    store.start()
    return store


def _timed_puts(store: MessageStore, msgs: list[InnerMessage], batch: int) -> list[float]:
    """The msg/s of each of ROUNDS rounds (each a third of `msgs`); the caller reports
    their median."""
    put, put_batch = store.put, store.put_batch
    # The prepared messages are not part of what is measured: keep the cyclic GC from
    # re-traversing them (a broker does not hold hundreds of thousands of messages).
    gc.collect()
    gc.freeze()
    rates = []
    n = len(msgs) // ROUNDS
    for r in range(ROUNDS):
        part = msgs[r * n : (r + 1) * n]
        t0 = time.perf_counter()
        if batch == 1:
            for m in part:
                put(m)
        else:
            for i in range(0, n, batch):
                put_batch(part[i : i + batch])
        rates.append(n / (time.perf_counter() - t0))
    gc.unfreeze()
    if store.stats()["put_errors"]:
        raise RuntimeError(f"puts were refused (disk full?): {store.stats()}")
    return rates


def _record(out: dict, key: str, rates: list[float]) -> None:
    out[key] = statistics.median(rates)
    out[key + "_rounds"] = rates


def put_figures(directory: str, sizes: dict, lmq_1m: bool = True) -> dict:
    out: dict = {}
    store = _store(directory, "put")
    try:
        _record(out, "put_msgs_per_s_1cq", _timed_puts(store, _messages(sizes["put"], 256, 0), 1))
        _record(out, "put_batch_msgs_per_s_1cq",
                _timed_puts(store, _messages(sizes["put"], 256, 0, 1), 32))
        _record(out, "put_msgs_per_s_4lmq", _timed_puts(store, _messages(sizes["lmq"], 256, 4, 2), 1))
        _record(out, "put_batch_msgs_per_s_4lmq",
                _timed_puts(store, _messages(sizes["lmq"], 256, 4, 3), 32))
        # get: drain queue 0 (sizes["put"] messages), 32 per call; median of ROUNDS passes
        rates = []
        for _ in range(ROUNDS):
            n = 0
            off = 0
            t0 = time.perf_counter()
            while True:
                g = store.get("Bench", 0, off, 32)
                if not g.message_count:
                    break
                n += g.message_count
                off = g.next_begin_offset
            rates.append(n / (time.perf_counter() - t0))
        _record(out, "get_msgs_per_s", rates)
        out["put_latency_us"] = store.stats()["put_latency_us"]
    finally:
        store.shutdown()
        shutil.rmtree(os.path.join(directory, "put"), ignore_errors=True)
    for key in ("lmq_100k", "lmq_1m") if lmq_1m else ("lmq_100k",):
        population, n = sizes[key]
        store = _store(directory, key)
        try:
            _create_lmqs(store, population)
            _record(out, f"put_msgs_per_s_4{key}", _timed_puts(store, _lmq_messages(n, population, 0), 1))
            out[f"{key}_population"] = population
        finally:
            store.shutdown()
            shutil.rmtree(os.path.join(directory, key), ignore_errors=True)
    store = _store(directory, "big")
    try:
        rates = [r * 4096 / 1e6 for r in _timed_puts(store, _messages(sizes["big"], 4096, 0), 1)]
        _record(out, "put_mb_per_s_4k", rates)
    finally:
        store.shutdown()
        shutil.rmtree(os.path.join(directory, "big"), ignore_errors=True)
    return out


# ---------------------------------------------------------------------- subprocess parts
def _writer_main(path: str, target: int) -> None:
    """Write until `target` bytes, flushing every 500 ms from a thread like a broker; print
    progress; wait to be killed."""
    store = MessageStore(StoreConfig(path, **NO_DISK_LIMITS))
    store.start()
    threading.Thread(target=lambda: [time.sleep(0.5) or store.flush() for _ in iter(int, 1)],
                     daemon=True).start()
    body = os.urandom(1000)
    i = 0
    while store.max_physical_offset < target:
        batch = [
            InnerMessage("Bench", body, properties={
                "TAGS": "TagA", "UNIQ_KEY": f"{i + k:032X}",
                "INNER_MULTI_DISPATCH": f"%LMQ%r{(i + k) % 1000}"})
            for k in range(32)
        ]
        store.put_batch(batch)
        i += 32
    print("DONE", store.max_physical_offset, flush=True)
    while True:
        time.sleep(1)


def _restart_main(path: str) -> None:
    store = MessageStore(StoreConfig(path, **NO_DISK_LIMITS))
    t0 = time.perf_counter()
    store.start()
    dt = time.perf_counter() - t0
    rep = store.recovery_report
    print(json.dumps({"seconds": dt, "scanned": rep.bytes_scanned, "end": rep.end}), flush=True)
    store.shutdown()


def _rss_main(path: str, n: int) -> None:
    import psutil

    proc = psutil.Process()
    store = MessageStore(StoreConfig(path, commitlog_file_size=256 << 20, **NO_DISK_LIMITS))
    store.start()
    before = proc.memory_info()
    for start in range(0, n, 1000):
        store.put_batch([
            InnerMessage("Devices", b"%d" % i, properties={"INNER_MULTI_DISPATCH": f"%LMQ%dev{i}"})
            for i in range(start, min(n, start + 1000))
        ])
    after = proc.memory_info()
    print(json.dumps({
        "anon_mb": ((after.rss - after.shared) - (before.rss - before.shared)) / 2**20,
        "rss_mb": (after.rss - before.rss) / 2**20,
        "lmq_count": store.stats()["lmq_count"],
    }), flush=True)
    store.shutdown()


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", f"import lmq.bench.store as b; {code}"]


def recovery_figure(directory: str, target: int) -> dict:
    path = os.path.join(directory, "recovery")
    shutil.rmtree(path, ignore_errors=True)
    proc = subprocess.Popen(_python(f"b._writer_main({path!r}, {target})"),
                            stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        if not line.startswith("DONE"):
            raise RuntimeError("recovery writer failed")
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    res = _child_result(f"b._restart_main({path!r})", path)
    return {"recovery_s_1gib": res["seconds"], "recovery_written_bytes": res["end"],
            "recovery_rescanned_bytes": res["scanned"]}


def _child_result(code: str, path: str) -> dict:
    """Runs `code` in a fresh interpreter (_python) and returns the JSON of its last output
    line; its data directory `path` is removed afterwards."""
    out = subprocess.run(_python(code), capture_output=True, text=True, check=True).stdout
    shutil.rmtree(path, ignore_errors=True)
    return json.loads(out.strip().splitlines()[-1])


def rss_figure(directory: str, n: int) -> dict:
    path = os.path.join(directory, "rss")
    shutil.rmtree(path, ignore_errors=True)
    res = _child_result(f"b._rss_main({path!r}, {n})", path)
    return {"rss_mb_1m_lmq": res["anon_mb"], "rss_total_mb_1m_lmq": res["rss_mb"],
            "rss_lmq_count": res["lmq_count"]}


# ---------------------------------------------------------------------- main
def measure(directory: str, quick: bool, lmq_1m: bool = True) -> dict:
    sizes = QUICK if quick else FULL
    out: dict = {"quick": quick, "rounds": ROUNDS, "statistic": "median"}
    progress.phase("raw record packing (the ceiling)")
    out["raw_pack_msgs_per_s"] = raw_pack(sizes["raw"], 256, directory)
    out["raw_pack_mb_per_s_4k"] = raw_pack(sizes["raw"] // 8, 4096, directory) * 4096 / 1e6
    progress.phase("puts and gets")
    out.update(put_figures(directory, sizes, lmq_1m))
    progress.phase("restart after kill -9")
    out.update(recovery_figure(directory, sizes["recovery_bytes"]))
    progress.phase("RSS of many LMQs")
    out.update(rss_figure(directory, sizes["rss_lmqs"]))
    ceiling = out["raw_pack_msgs_per_s"]
    for key in ("put_msgs_per_s_1cq", "put_batch_msgs_per_s_1cq", "put_msgs_per_s_4lmq",
                "put_batch_msgs_per_s_4lmq", "put_msgs_per_s_4lmq_100k", "put_msgs_per_s_4lmq_1m",
                "get_msgs_per_s"):
        if key in out:
            out[key.replace("_msgs_per_s", "") + "_ratio"] = out[key] / ceiling
    out["put_4k_ratio"] = out["put_mb_per_s_4k"] / out["raw_pack_mb_per_s_4k"]
    return out


def _rate(res: dict, key: str, unit: str = "msg/s") -> str:
    """The median, then the spread of the rounds it is the median of."""
    rounds = res.get(key + "_rounds")
    spread = f" ({min(rounds):,.0f}-{max(rounds):,.0f})" if rounds else ""
    return f"{res[key]:,.0f} {unit}{spread}"


def _table(res: dict) -> str:
    rows = [
        ("raw pack 256 B (ceiling)", f"{res['raw_pack_msgs_per_s']:,.0f} msg/s", ""),
        ("put, 1 CQ, 256 B", _rate(res, "put_msgs_per_s_1cq"), res["put_1cq_ratio"]),
        ("put_batch(32), 1 CQ", _rate(res, "put_batch_msgs_per_s_1cq"), res["put_batch_1cq_ratio"]),
        ("put, 4 of 1k LMQs (cached)", _rate(res, "put_msgs_per_s_4lmq"), res["put_4lmq_ratio"]),
        ("put_batch(32), 4 of 1k LMQs", _rate(res, "put_batch_msgs_per_s_4lmq"),
         res["put_batch_4lmq_ratio"]),
    ]
    for key, name in (("lmq_100k", "100k"), ("lmq_1m", "1M")):
        if f"put_msgs_per_s_4{key}" in res:
            label = f"put, 4 of {res[key + '_population']:,} LMQs" if res["quick"] else \
                f"put, 4 of {name} LMQs"
            rows.append((label, _rate(res, f"put_msgs_per_s_4{key}"), res[f"put_4{key}_ratio"]))
    rows += [
        ("get, 32 per call", _rate(res, "get_msgs_per_s"), res["get_ratio"]),
        ("raw pack 4 KiB (ceiling)", f"{res['raw_pack_mb_per_s_4k']:,.0f} MB/s", ""),
        ("put, 4 KiB bodies", _rate(res, "put_mb_per_s_4k", "MB/s"), res["put_4k_ratio"]),
        ("restart after kill -9", f"{res['recovery_s_1gib']:.2f} s "
         f"({res['recovery_written_bytes'] / 2**30:.2f} GiB written, "
         f"{res['recovery_rescanned_bytes'] / 2**20:.1f} MiB rescanned)", ""),
        (f"RSS of {res['rss_lmq_count']:,} LMQs", f"{res['rss_mb_1m_lmq']:.1f} MB anon "
         f"({res['rss_total_mb_1m_lmq']:.1f} MB with mapped pages)", ""),
    ]
    lat = res["put_latency_us"]
    rows.append(("put latency p50/p99/p999", f"{lat['p50']:.1f} / {lat['p99']:.1f} / {lat['p999']:.1f} µs", ""))
    width = max(len(r[0]) for r in rows)
    lines = [f"{'figure':<{width}}  {'value':<52} ratio to ceiling"]
    for name, value, ratio in rows:
        r = f"{ratio:.2f}" if isinstance(ratio, float) else ""
        lines.append(f"{name:<{width}}  {value:<52} {r}")
    lines += [
        "",
        f"msg/s, MB/s: median of {res['rounds']} timed rounds of equal size in one process; in",
        "  brackets the slowest and fastest round. Ceilings are medians too.",
        "ratio to ceiling: the median / the raw pack median of the same body size.",
        "4 of 1k LMQs: each message also dispatched to 4 LMQs out of 1,000, always in the",
        "  LMQ offset cache. 4 of 100k / 1M: out of that many LMQs that exist already,",
        "  picked at random (the cache holds lmq_offset_cache_size = 100,000 by default).",
        "put latency: per put call, over every put of the run (store.stats()).",
    ]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    base = args.data_dir
    tmp = None
    if base is None:
        tmp = base = tempfile.mkdtemp(prefix="lmq-bench-store-")
    else:
        os.makedirs(base, exist_ok=True)
    try:
        res = measure(base, args.quick, not args.no_lmq_1m)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        print(json.dumps(res))
    else:
        print(_table(res))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.store", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
