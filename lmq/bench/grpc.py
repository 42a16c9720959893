"""`lmq bench grpc`: the RocketMQ 5 gRPC front end driven by the official Python client
(rocketmq-python-client 5.1.2, in its own venv), beside our native client on the 4.x
remoting path, against one `lmq serve` child process, in the same run.

Phases (each run; figures are medians of ``--runs``):

* grpc send: the official Producer, ``--inflight`` send_async calls outstanding;
* grpc receive+ack: the official SimpleConsumer, receive 32 at a time, ack each message;
* native send: our `Producer` (remoting, ``--inflight`` concurrent tasks);
* native pop+ack: our `PopClient` (POP_MESSAGE 32 at a time, ACK_MESSAGE per message):
  the same broker work as the gRPC receive, without gRPC and the client library;
* per call: sequential QueryRoute round trips (p50, p99) to the front end (the route is
  cached, so this is the gRPC thread's hop into trio and back) and to a bare grpc.aio
  server that answers the same route from a constant (another child process): the
  difference is what the front end adds per call.

There are no published figures for Apache's proxy to compare with.

    lmq bench grpc                       # 3 runs of 5000 messages
    lmq bench grpc --quick --json        # smoke run
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from lmq.bench._client_common import free_port, latency_summary, median_of, ratio, report

_LOAD = Path(__file__).with_name("_rmq5_load.py")


def add_arguments(parser) -> None:
    parser.add_argument("-m", "--messages", type=int, default=5000, help="messages per phase")
    parser.add_argument("-s", "--size", type=int, default=256, help="body bytes")
    parser.add_argument("--inflight", type=int, default=32, help="sends outstanding")
    parser.add_argument("--calls", type=int, default=2000, help="QueryRoute calls timed")
    parser.add_argument("--runs", type=int, default=None, help="repetitions (default 3)")
    parser.add_argument("--quick", action="store_true", help="smoke run (not for figures)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def _wait_port(port: int, proc: subprocess.Popen, what: str) -> None:
    import socket

    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not start") from None
            time.sleep(0.1)


def _official(python: str, **args: Any) -> dict:
    # -I: not the script's directory on sys.path (lmq/bench/grpc.py would shadow grpcio).
    out = subprocess.run([python, "-I", str(_LOAD), json.dumps(args)], capture_output=True,
                         text=True, timeout=600)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        raise RuntimeError(f"official client load failed: {out.stderr[-2000:]}")
    return json.loads(lines[-1])


async def _native(namesrv: str, broker: str, topic: str, group: str, n: int, size: int,
                  inflight: int) -> tuple[float, float]:
    from core.client import ClientInstance, Message, Producer
    from core.client.pop_consumer import PopClient

    async with ClientInstance(namesrv_addr=namesrv) as client:
        async with Producer(client, "BenchGrpcNative") as producer:
            body = b"x" * size
            left = n

            async def worker() -> None:
                nonlocal left
                while left > 0:
                    left -= 1
                    await producer.send(Message(topic, body))

            start = time.perf_counter()
            async with trio.open_nursery() as nursery:
                for _ in range(inflight):
                    nursery.start_soon(worker)
            send_s = time.perf_counter() - start
        pc = PopClient(client.remoting, broker, "broker-a", group)
        got = 0
        start = time.perf_counter()
        while got < n:
            r = await pc.pop(topic, max_nums=32, invisible_ms=30_000, poll_ms=1000)
            for m in r.messages:
                await pc.ack(m)
                got += 1
        return n / send_s, n / (time.perf_counter() - start)


def _route_calls(port: int, calls: int, topic: str) -> dict[str, float]:
    import grpc

    from gateway.grpc5.proto import messaging_pb2 as pb
    from gateway.grpc5.proto import messaging_pb2_grpc as pbg

    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pbg.MessagingServiceStub(channel)
        req = pb.QueryRouteRequest(topic=pb.Resource(name=topic))
        meta = (("x-mq-client-id", "bench"),)
        for _ in range(min(200, calls)):
            stub.QueryRoute(req, metadata=meta, timeout=10)
        lat = []
        for _ in range(calls):
            t = time.perf_counter()
            stub.QueryRoute(req, metadata=meta, timeout=10)
            lat.append(time.perf_counter() - t)
    return latency_summary(lat)


def run(args) -> int:
    from lmq.bench._rmq5_venv import VenvError, rmq5_python

    if args.quick:
        args.messages, args.calls, args.runs = min(args.messages, 300), 200, 1
    runs = args.runs or 3
    try:
        python = rmq5_python()
    except VenvError as exc:
        print(f"lmq bench grpc: {exc}")
        return 1
    data = tempfile.mkdtemp(prefix="lmq-bench-grpc-")
    ns, broker_port, grpc_port, echo_port = free_port(), free_port(), free_port(), free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "lmq", "serve", "--data-dir", data, "--namesrv-port", str(ns),
         "--broker-port", str(broker_port), "--grpc-port", str(grpc_port), "--no-mqtt",
         "--no-amqp", "--log-level", "WARNING"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    echo = subprocess.Popen([sys.executable, "-m", "lmq.bench._grpc_echo", str(echo_port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"127.0.0.1:{grpc_port}"
    results: list[dict[str, Any]] = []
    try:
        _wait_port(grpc_port, server, "`lmq serve`")
        _wait_port(echo_port, echo, "the echo server")
        time.sleep(0.5)
        for i in range(runs):
            topic = f"BenchGrpc{i}"
            _official(python, endpoint=endpoint, op="send", topic=topic, messages=1,
                      size=8, inflight=1)  # creates the topic
            _official(python, endpoint=endpoint, op="receive", topic=topic,
                      group=f"BG{i}", prime=True)
            sent = _official(python, endpoint=endpoint, op="send", topic=topic,
                             messages=args.messages, size=args.size, inflight=args.inflight)
            recv = _official(python, endpoint=endpoint, op="receive", topic=topic,
                             group=f"BG{i}", messages=args.messages)
            n_send, n_recv = trio.run(_native, f"127.0.0.1:{ns}", f"127.0.0.1:{broker_port}",
                                      f"BenchNative{i}", f"BN{i}", args.messages, args.size,
                                      args.inflight)
            ours = _route_calls(grpc_port, args.calls, topic)
            bare = _route_calls(echo_port, args.calls, topic)
            results.append({
                "grpc_send_msg_s": sent["messages"] / max(sent["seconds"], 1e-9),
                "grpc_recv_ack_msg_s": recv["messages"] / max(recv["seconds"], 1e-9),
                "native_send_msg_s": n_send, "native_pop_ack_msg_s": n_recv,
                "call_p50_ms": ours["p50_ms"], "call_p99_ms": ours["p99_ms"],
                "echo_p50_ms": bare["p50_ms"], "echo_p99_ms": bare["p99_ms"],
            })
    finally:
        for proc in (server, echo):
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
    keys = tuple(results[0])
    med = median_of(results, keys)
    med["overhead_p50_ms"] = round(med["call_p50_ms"] - med["echo_p50_ms"], 3)
    med["grpc_send_vs_native"] = ratio(med["grpc_send_msg_s"], med["native_send_msg_s"])
    med["grpc_recv_vs_native"] = ratio(med["grpc_recv_ack_msg_s"], med["native_pop_ack_msg_s"])
    med.update(runs=runs, messages=args.messages, size=args.size, inflight=args.inflight)
    rows = [
        ("grpc send (official client)", f"{med['grpc_send_msg_s']:,.0f} msg/s "
         f"({med['grpc_send_vs_native']:.2f}x native)"),
        ("grpc receive+ack (official client)", f"{med['grpc_recv_ack_msg_s']:,.0f} msg/s "
         f"({med['grpc_recv_vs_native']:.2f}x native)"),
        ("native send (4.x remoting)", f"{med['native_send_msg_s']:,.0f} msg/s"),
        ("native pop+ack (4.x remoting)", f"{med['native_pop_ack_msg_s']:,.0f} msg/s"),
        ("QueryRoute p50 / p99: front end", f"{med['call_p50_ms']:.3f} / "
         f"{med['call_p99_ms']:.3f} ms"),
        ("QueryRoute p50 / p99: bare grpc.aio", f"{med['echo_p50_ms']:.3f} / "
         f"{med['echo_p99_ms']:.3f} ms"),
        ("added per call (p50)", f"{med['overhead_p50_ms']:.3f} ms"),
    ]
    report(med, args.json, rows)
    return 0
