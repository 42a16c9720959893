"""`lmq bench broker --replicated`: what replication costs (docs/ha.md).

Three cases in one run, each a fresh `lmq namesrv` + `lmq broker` master (+ an `lmq
broker` slave) on loopback, in a temporary directory:

* ``async_noslave``: ASYNC_MASTER, no slave (the reference);
* ``async_slave``:   ASYNC_MASTER streaming to a slave;
* ``sync_slave``:    SYNC_MASTER, every send waits until the slave holds it.

Each case measures single sends (``--inflight`` in flight over ``--connections``), batch
sends (``--batch`` messages per request) and the latency of sync sends at ``--rate`` per
second (open loop, from each send's due time). The report gives every figure as a ratio
to ``async_noslave``; the targets (issue 14) are p99 at most 2x and at least 50 % of the
unreplicated batch throughput under SYNC_MASTER.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any

import trio

from core.remoting.client import RemotingClient
from core.remoting.codec import RemotingCommand
from core.remoting.codes import RequestCode
from core.remoting.errors import RemotingError
from lmq.bench import _broker_workload as wl
from lmq.bench._broker_loadgen import closed_loop, encode_frames, paced_latency
from lmq.bench._broker_procs import Child, free_port

CASES = (
    ("async_noslave", "ASYNC_MASTER", False),
    ("async_slave", "ASYNC_MASTER", True),
    ("sync_slave", "SYNC_MASTER", True),
)
_SECRET = "bench-replicated-secret"
_START_TIMEOUT_S = 60.0


def _broker_argv(tmp: str, name: str, ns: str, port: int, ha_port: int, config: str,
                 *extra: str) -> list[str]:
    return [sys.executable, "-m", "lmq", "broker", "--namesrv-addr", ns, "--data-dir",
            os.path.join(tmp, name), "--host", "127.0.0.1", "--broker-port", str(port),
            "--broker-name", "bench", "--ha-port", str(ha_port), "--config", config,
            "--log-level", "WARNING", *extra]


async def _until(what: str, fn, children: list[Child]) -> None:
    deadline = time.monotonic() + _START_TIMEOUT_S
    while True:
        try:
            if await fn():
                return
        except (RemotingError, OSError, RuntimeError):
            pass
        for c in children:
            if c.proc.poll() is not None:
                raise RuntimeError(f"a server exited; see {c.log_path}: {c.last_log_line()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        await trio.sleep(0.2)


async def _case(opts, tmp: str, client: RemotingClient, name: str, role: str,
                slave: bool) -> dict[str, Any]:
    ns_port, port, ha_port, slave_port = free_port(), free_port(), free_port(), free_port()
    ns = f"127.0.0.1:{ns_port}"
    config = os.path.join(tmp, f"{name}.toml")
    with open(config, "w", encoding="utf-8") as fh:
        fh.write(f'ha_secret = "{_SECRET}"\nbroker_role = "{role}"\n'
                 f"commitlog_file_size = {(opts.commitlog_mb or 256) << 20}\n"
                 f'flush = "{opts.flush}"\n')
    slave_config = os.path.join(tmp, f"{name}-slave.toml")
    with open(slave_config, "w", encoding="utf-8") as fh:
        fh.write(f'ha_secret = "{_SECRET}"\nha_config_sync_s = 1.0\n'
                 f"commitlog_file_size = {(opts.commitlog_mb or 256) << 20}\n")
    children: list[Child] = []
    try:
        children.append(Child([sys.executable, "-m", "lmq", "namesrv", "--port", str(ns_port),
                               "--log-level", "WARNING"],
                              os.path.join(tmp, f"{name}-namesrv.log"), port_line=False))
        master = Child(_broker_argv(tmp, f"{name}-master", ns, port, ha_port, config),
                       os.path.join(tmp, f"{name}-master.log"), port_line=False)
        children.append(master)
        addr = f"127.0.0.1:{port}"

        async def topic() -> bool:
            await wl.create_topic(client, addr)
            return True
        await _until("the master", topic, children)
        if slave:
            children.append(Child(_broker_argv(
                tmp, f"{name}-slave", ns, slave_port, free_port(), slave_config,
                "--broker-role", "SLAVE", "--broker-id", "1",
                "--ha-master-address", f"127.0.0.1:{ha_port}"),
                os.path.join(tmp, f"{name}-slave.log"), port_line=False))

            async def replicating() -> bool:  # the slave pulled the topic: it is connected
                resp = await client.invoke(f"127.0.0.1:{slave_port}", RemotingCommand.request(
                    RequestCode.GET_ALL_TOPIC_CONFIG, {}))
                return wl.TOPIC in json.loads(resp.body or b"{}").get("topicConfigTable", {})
            await _until("the slave", replicating, children)
            if role == "SYNC_MASTER":
                probe = wl.send_commands(1, opts.size)[0]

                async def acked() -> bool:
                    return (await client.invoke(addr, probe)).code == 0
                await _until("a replicated send", acked, children)
        send_frames = encode_frames(wl.send_commands(4096, opts.size))
        batch_frames = encode_frames(wl.batch_commands(256, opts.batch, opts.size))
        kw = dict(connections=opts.connections, warmup=opts.warmup, duration=opts.duration,
                  server_pid=master.pid)
        send = await closed_loop("127.0.0.1", port, send_frames, window=opts.inflight,
                                 per_response=1, **kw)
        batch = await closed_loop("127.0.0.1", port, batch_frames,
                                  window=opts.batch_inflight, per_response=opts.batch, **kw)
        lat = await trio.to_thread.run_sync(lambda: paced_latency(
            "127.0.0.1", port, send_frames, rate=opts.rate, warmup=opts.warmup,
            duration=opts.duration))
        return {"send_msgs_per_s": send.messages_per_s, "send_errors": send.errors,
                "batch_msgs_per_s": batch.messages_per_s, "batch_errors": batch.errors,
                "first_error": send.first_error or batch.first_error or lat.first_error,
                "p50_ms": lat.from_due_ms.get("p50"), "p99_ms": lat.from_due_ms.get("p99"),
                "latency_errors": lat.errors + lat.lost, "rate": opts.rate}
    finally:
        for c in reversed(children):
            c.stop()


async def run_replicated(opts) -> dict[str, Any]:
    """`--runs` rounds, each running the three cases one after the other (interleaved, so
    a change of machine load hits every case alike); figures and ratios are medians over
    the rounds, a ratio being taken within its round."""
    tmp = tempfile.mkdtemp(prefix="lmq-bench-replicated-")
    load = list(os.getloadavg())
    rounds: list[dict[str, dict[str, Any]]] = []
    try:
        async with RemotingClient(request_timeout=10.0) as client:
            for r in range(max(1, opts.runs)):
                cases: dict[str, dict[str, Any]] = {}
                where = os.path.join(tmp, str(r))
                os.makedirs(where)
                for name, role, slave in CASES:
                    try:
                        cases[name] = await _case(opts, where, client, name, role, slave)
                    except RuntimeError as exc:
                        cases[name] = {"error": str(exc)}
                _ratios(cases)
                cases["_load"] = {"load1": os.getloadavg()[0]}
                rounds.append(cases)
    finally:
        if not opts.keep_data:
            shutil.rmtree(tmp, ignore_errors=True)
    cases = {}
    for name, _role, _slave in CASES:
        per = [rd[name] for rd in rounds if "error" not in rd[name]]
        if not per:
            cases[name] = rounds[-1][name]
            continue
        cases[name] = {key: _median([c.get(key) for c in per]) for key in per[0]
                       if isinstance(per[0][key], (int, float)) or per[0][key] is None}
        cases[name]["first_error"] = next((c["first_error"] for c in per
                                           if c.get("first_error")), None)
        cases[name]["rounds"] = len(per)
    sync = cases.get("sync_slave", {})
    targets = None
    if sync.get("p99_ms_ratio") is not None and sync.get("batch_msgs_per_s_ratio") is not None:
        targets = {"p99_at_most_2x": sync["p99_ms_ratio"] <= 2.0,
                   "batch_at_least_half": sync["batch_msgs_per_s_ratio"] >= 0.5}
    return {"replicated": cases, "rounds": rounds, "targets": targets, "load_start": load,
            "load_end": list(os.getloadavg()), "inflight": opts.inflight,
            "batch": opts.batch, "size": opts.size, "rate": opts.rate,
            "duration": opts.duration}


def _ratios(cases: dict[str, dict[str, Any]]) -> None:
    ref = cases.get("async_noslave", {})
    for c in cases.values():
        for key in ("send_msgs_per_s", "batch_msgs_per_s", "p99_ms"):
            if c.get(key) and ref.get(key):
                c[f"{key}_ratio"] = c[key] / ref[key]


def _median(values: list) -> float | None:
    vals = sorted(v for v in values if isinstance(v, (int, float)))
    if not vals:
        return None
    mid = len(vals) // 2
    return vals[mid] if len(vals) % 2 else (vals[mid - 1] + vals[mid]) / 2


def print_replicated(report: dict[str, Any]) -> None:
    print(f"replication cost: {report['size']} B bodies, send {report['inflight']} in "
          f"flight, batch {report['batch']}/request, latency at {report['rate']:.0f}/s; "
          f"load {report['load_start'][0]:.2f} -> {report['load_end'][0]:.2f}")
    print(f"{'case':<15}{'send msg/s':>12}{'batch msg/s':>13}{'p50 ms':>9}{'p99 ms':>9}"
          f"{'batch x':>9}{'p99 x':>8}")
    for name, c in report["replicated"].items():
        if "error" in c:
            print(f"{name:<15}error: {c['error']}")
            continue

        def f(v, spec):
            return format(v, spec) if isinstance(v, (int, float)) else "-"
        print(f"{name:<15}{f(c['send_msgs_per_s'], ',.0f'):>12}"
              f"{f(c['batch_msgs_per_s'], ',.0f'):>13}{f(c['p50_ms'], '.2f'):>9}"
              f"{f(c['p99_ms'], '.2f'):>9}{f(c.get('batch_msgs_per_s_ratio'), '.2f'):>9}"
              f"{f(c.get('p99_ms_ratio'), '.2f'):>8}")
        if c.get("first_error"):
            print(f"{'':<15}first error: {c['first_error']}")
    per_round = []
    for rd in report.get("rounds", []):
        sync = rd.get("sync_slave", {})
        b, p = sync.get("batch_msgs_per_s_ratio"), sync.get("p99_ms_ratio")
        per_round.append(f"batch x {b:.2f}, p99 x {p:.2f} (load {rd['_load']['load1']:.1f})"
                         if b is not None and p is not None else "error")
    if per_round:
        print("sync_slave per round: " + "; ".join(per_round))
    t = report["targets"]
    if t is not None:
        print(f"targets (sync_slave vs async_noslave): p99 <= 2x: "
              f"{'met' if t['p99_at_most_2x'] else 'MISSED'}; batch >= 50 %: "
              f"{'met' if t['batch_at_least_half'] else 'MISSED'}")
