"""Drives the official RocketMQ 5 Python client (rocketmq-python-client) against our
gRPC front end. Runs in its own virtual environment (see conftest.py): it and the 4.x
`rocketmq` wheel both install a package named `rocketmq`.

    python rmq5_driver.py '<json: {"endpoint": ..., "op": ..., ...}>'

Prints one JSON object (the op's result) as its last line; exits 1 with {"error": ...}.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time


def _config(args):
    from rocketmq import ClientConfiguration, Credentials

    creds = Credentials(args.get("ak", ""), args.get("sk", ""))
    return ClientConfiguration(args["endpoint"], creds, args.get("namespace", ""),
                               request_timeout=args.get("timeout", 5))


def _message(args, topic, body, i):
    from rocketmq import Message

    m = Message()
    m.topic = topic
    m.body = body.encode() if isinstance(body, str) else body
    if args.get("tag"):
        m.tag = args["tag"]
    for key in args.get("keys") or ():
        m.keys = key  # the setter adds one key
    if args.get("group_of"):
        m.message_group = args["group_of"][i % len(args["group_of"])]
    if args.get("delay_s"):
        # This client takes seconds here (it writes the value to Timestamp.seconds).
        m.delivery_timestamp = int(time.time()) + args["delay_s"]
    if args.get("lite_of"):
        m.lite_topic = args["lite_of"][i % len(args["lite_of"])]
    for k, v in (args.get("props") or {}).items():
        m.add_property(k, v)
    return m


def produce(args):
    from rocketmq import Producer

    topic = args["topic"]
    producer = Producer(_config(args), (topic,))
    producer.startup()
    out = []
    sent_ms = int(time.time() * 1000)
    try:
        for i, body in enumerate(args["bodies"]):
            receipt = producer.send(_message(args, topic, body, i))
            out.append(receipt.message_id)
    finally:
        producer.shutdown()
    return {"ids": out, "sent_ms": sent_ms}


def recall(args):
    """Send `bodies` (delayed by `delay_s`), recall the ones named in `recall` with the
    receipt's recall handle; report each (id, handle, recalled id or error)."""
    from rocketmq import Producer

    topic = args["topic"]
    producer = Producer(_config(args), (topic,))
    producer.startup()
    out = []
    try:
        for i, body in enumerate(args["bodies"]):
            receipt = producer.send(_message(args, topic, body, i))
            entry = {"id": receipt.message_id, "handle": receipt.recall_handle}
            if body in args.get("recall", ()):
                try:
                    entry["recalled"] = producer.recall_message(topic, receipt.recall_handle)
                except Exception as exc:  # noqa: BLE001
                    entry["error"] = f"{type(exc).__name__}: {exc}"
            out.append(entry)
    finally:
        producer.shutdown()
    return {"sent": out}


def transaction(args):
    from rocketmq import Producer, TransactionChecker, TransactionResolution

    resolution = args.get("check_answer", "COMMIT")

    class Checker(TransactionChecker):
        checked = []

        def check(self, message):
            Checker.checked.append(message.message_id)
            return getattr(TransactionResolution, resolution)

    topic = args["topic"]
    producer = Producer(_config(args), (topic,), Checker())
    producer.startup()
    out = []
    try:
        for i, (body, decision) in enumerate(zip(args["bodies"], args["decisions"],
                                                  strict=True)):
            tx = producer.begin_transaction()
            receipt = producer.send(_message(args, topic, body, i), tx)
            out.append(receipt.message_id)
            if decision == "commit":
                tx.commit()
            elif decision == "rollback":
                tx.rollback()
        deadline = time.time() + args.get("wait_check_s", 0)
        while time.time() < deadline and len(Checker.checked) < args.get("want_checks", 0):
            time.sleep(0.1)
    finally:
        producer.shutdown()
    return {"ids": out, "checked": Checker.checked}


def _msg_json(m):
    return {"id": m.message_id, "body": m.body.decode("utf-8", "replace"), "tag": m.tag,
            "keys": list(m.keys or []), "group": m.message_group,
            "attempt": m.delivery_attempt, "props": dict(m.properties or {}),
            "topic": m.topic, "corrupted": m.corrupted, "recv_ms": int(time.time() * 1000),
            "delivery_ms": m.delivery_timestamp}


def simple(args):
    from rocketmq import FilterExpression, SimpleConsumer

    sub = {args["topic"]: FilterExpression(args.get("filter", "*"))}
    consumer = SimpleConsumer(_config(args), args["group"], sub,
                              await_duration=args.get("await_s", 2))
    consumer.startup()
    got, events = [], []
    try:
        deadline = time.time() + args.get("deadline_s", 20)
        while len(got) < args["want"] and time.time() < deadline:
            msgs = consumer.receive(args.get("batch", 16), args.get("invisible_s", 15))
            for m in msgs:
                got.append(_msg_json(m))
                if args.get("change_invisible_s") is not None and m.delivery_attempt == 1:
                    consumer.change_invisible_duration(m, args["change_invisible_s"])
                    events.append("changed")
                    continue
                if not args.get("no_ack"):
                    consumer.ack(m)
                    if args.get("double_ack"):
                        try:
                            consumer.ack(m)
                            events.append("double-ack-accepted")
                        except Exception as exc:  # noqa: BLE001
                            events.append("double-ack-refused:" + type(exc).__name__)
        # After the wanted count: one more receive must come back empty.
        if args.get("then_empty"):
            extra = consumer.receive(16, 15)
            events.append(f"extra:{len(extra)}")
    finally:
        consumer.shutdown()
    return {"messages": got, "events": events}


def fifo_simple(args):
    """SimpleConsumer of a FIFO group: acks every message but the first one of group
    `hold`, which it keeps (invisible `invisible_s`) until `others` messages of the other
    groups arrived; then it makes that one visible again in 1 s (an "released" event in
    the sequence; with `natural`, it waits for the invisible time to pass instead) and
    acks everything until `want` messages were received."""
    from rocketmq import FilterExpression, SimpleConsumer

    sub = {args["topic"]: FilterExpression("*")}
    consumer = SimpleConsumer(_config(args), args["group"], sub,
                              await_duration=args.get("await_s", 2))
    consumer.startup()
    seq, held, others = [], None, 0
    try:
        deadline = time.time() + args.get("deadline_s", 30)
        received = 0
        while received < args["want"] and time.time() < deadline:
            for m in consumer.receive(args.get("batch", 16), args.get("invisible_s", 60)):
                received += 1
                seq.append(_msg_json(m))
                if held is None and m.message_group == args["hold"]:
                    held = m
                    continue
                consumer.ack(m)
                others += m.message_group != args["hold"]
            if (held is not None and others >= args["others"] and "released" not in seq
                    and not args.get("natural")):  # natural: wait for its invisible time
                consumer.change_invisible_duration(held, 1)
                seq.append("released")
    finally:
        consumer.shutdown()
    return {"sequence": seq}


def push(args):
    from rocketmq import ConsumeResult, FilterExpression, MessageListener, PushConsumer

    got = []
    done = threading.Event()
    fail_first = args.get("fail_first", False)

    class Listener(MessageListener):
        def consume(self, message):
            got.append(_msg_json(message))
            time.sleep(args.get("sleep_s", 0))  # a slow listener
            if len(got) >= args["want"]:
                done.set()
            if fail_first and message.delivery_attempt == 1:
                return ConsumeResult.FAILURE
            return ConsumeResult.SUCCESS

    sub = {args["topic"]: FilterExpression(args.get("filter", "*"))}
    consumer = PushConsumer(_config(args), args["group"], Listener(), sub)
    consumer.startup()
    try:
        print(json.dumps({"ready": True}), flush=True)
        done.wait(args.get("deadline_s", 30))
        time.sleep(args.get("linger_s", 1.0))  # let the acks go out
        fifo = consumer.fifo  # from the server's Settings reply
    finally:
        consumer.shutdown()
    return {"messages": got, "fifo": fifo}


def hold(args):
    """Receive `want` messages without acking, print them, wait for a line on stdin (the
    test restarts the proxy meanwhile), then ack them all and report per message."""
    from rocketmq import FilterExpression, SimpleConsumer

    sub = {args["topic"]: FilterExpression("*")}
    consumer = SimpleConsumer(_config(args), args["group"], sub,
                              await_duration=args.get("await_s", 2))
    consumer.startup()
    held, acked = [], []
    try:
        deadline = time.time() + args.get("deadline_s", 20)
        while len(held) < args["want"] and time.time() < deadline:
            held += consumer.receive(16, args.get("invisible_s", 60))
        print(json.dumps({"held": [m.body.decode() for m in held]}), flush=True)
        sys.stdin.readline()
        for m in held:
            for _ in range(20):  # the proxy may still be starting
                try:
                    consumer.ack(m)
                    acked.append(m.body.decode())
                    break
                except Exception as exc:  # noqa: BLE001
                    last = repr(exc)
                    time.sleep(0.5)
            else:
                print(json.dumps({"ack-error": last}), flush=True)
    finally:
        consumer.shutdown()
    return {"held": [m.body.decode() for m in held], "acked": acked}


def lite(args):
    """LiteSimpleConsumer: subscribe to `lites` (one-character names: 5.1.2's
    subscribe_lite(str) sends the name split into characters), receive `want`, ack."""
    from rocketmq import LiteSimpleConsumer

    consumer = LiteSimpleConsumer(args["topic"], _config(args), args["group"],
                                  await_duration=args.get("await_s", 2))
    consumer.startup()
    got = []
    try:
        for name in args["lites"]:
            for _ in range(50):  # the quota arrives with the first Settings reply
                try:
                    consumer.subscribe_lite(name)
                    break
                except Exception:  # noqa: BLE001
                    time.sleep(0.1)
            else:
                raise RuntimeError(f"subscribe_lite({name!r}) kept failing")
        print(json.dumps({"ready": True}), flush=True)
        deadline = time.time() + args.get("deadline_s", 20)
        while len(got) < args["want"] and time.time() < deadline:
            for m in consumer.receive(16, 15):
                got.append({"body": m.body.decode(), "lite": m.lite_topic,
                            "attempt": m.delivery_attempt})
                consumer.ack(m)
    finally:
        consumer.shutdown()
    return {"messages": got}


def lite_push(args):
    """LitePushConsumer on `lites` (one-character names, as `lite`), until `want`."""
    from rocketmq import ConsumeResult, LitePushConsumer, MessageListener

    got = []
    done = threading.Event()

    class Listener(MessageListener):
        def consume(self, message):
            got.append({"body": message.body.decode(), "lite": message.lite_topic,
                        "attempt": message.delivery_attempt})
            if len(got) >= args["want"]:
                done.set()
            return ConsumeResult.SUCCESS

    consumer = LitePushConsumer(_config(args), args["group"], args["topic"], Listener())
    consumer.startup()
    try:
        for name in args["lites"]:
            consumer.subscribe_lite(name)  # push consumers have their settings already
        print(json.dumps({"ready": True}), flush=True)
        done.wait(args.get("deadline_s", 30))
        time.sleep(1.0)  # let the acks go out
    finally:
        consumer.shutdown()
    return {"messages": got}


OPS = {"recall": recall, "fifo_simple": fifo_simple, "lite_push": lite_push, "lite": lite, "hold": hold, "produce": produce, "transaction": transaction, "simple": simple, "push": push}


def main() -> int:
    args = json.loads(sys.argv[1])
    try:
        result = OPS[args["op"]](args)
    except Exception as exc:  # noqa: BLE001
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)
        return 1
    print(json.dumps(result), flush=True)
    sys.stdout.flush()
    os._exit(0)  # the client leaves non-daemon threads behind


if __name__ == "__main__":
    sys.exit(main())
