"""`lmq admin`: cluster, topic, consumer and message administration (like mqadmin).

    lmq admin clusterList
    lmq admin topic list | route T | status T | create T [-r 8 -w 8] | update T ... | delete T
    lmq admin consumer progress GROUP [-t TOPIC]
    lmq admin consumer reset GROUP TOPIC --time -1h
    lmq admin group update GROUP [--fifo | --no-fifo] [-c CLUSTER | -b ADDR] | group show GROUP
    lmq admin message id MSGID [-t TOPIC] | message key TOPIC KEY
    lmq admin send TOPIC BODY [--tags A --keys "k1 k2" -p name=value]
    lmq admin tail TOPIC|%LMQ%name [--from-beginning] [-n COUNT]
    lmq admin ha status | ha switch BROKER_NAME [--to ID]   (controller mode, docs/ha.md)

Human tables by default, ``--json`` for scripts. Every failure (unknown topic, broker or
name server down, bad arguments) is one line on stderr and a non-zero exit.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import sys
from collections.abc import Awaitable, Callable
from typing import Any

DEFAULT_NAMESRV = "127.0.0.1:9876"
EXIT_ERROR = 1
EXIT_USAGE = 2


# ---------------------------------------------------------------------------------------
# argument parsing


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "admin", help="administer topics, groups and messages (like mqadmin)",
        description="Administer an lmq / RocketMQ 4.x cluster through its name servers.")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-n", "--namesrv-addr",
                        default=os.environ.get("NAMESRV_ADDR", DEFAULT_NAMESRV),
                        help="name servers, host:port[;host:port] (default %(default)s)")
    common.add_argument("--json", action="store_true", help="print JSON instead of a table")
    common.add_argument("--timeout", type=float, default=5.0, help="request timeout in seconds")
    # ACL credentials (docs/acl.md); admin commands need an account with admin = true.
    common.add_argument("--access-key", default=os.environ.get("LMQ_ACCESS_KEY"),
                        help="ACL access key (default: $LMQ_ACCESS_KEY)")
    common.add_argument("--secret-key", default=os.environ.get("LMQ_SECRET_KEY"),
                        help="ACL secret key (default: $LMQ_SECRET_KEY; prefer the variable: "
                        "a flag shows in the process list)")
    cmds = parser.add_subparsers(dest="admin_command", metavar="SUBCOMMAND")

    p = cmds.add_parser("clusterList", parents=[common], help="brokers of every cluster")
    p.set_defaults(func=_runner(_cluster_list))

    topic_parser = cmds.add_parser("topic", help="topic commands")
    topic_parser.set_defaults(func=lambda args: _usage(topic_parser))
    topic = topic_parser.add_subparsers(dest="topic_command", metavar="ACTION")
    p = topic.add_parser("list", parents=[common], help="all topics the name servers know")
    p.set_defaults(func=_runner(_topic_list))
    p = topic.add_parser("route", parents=[common], help="a topic's route")
    p.add_argument("topic")
    p.set_defaults(func=_runner(_topic_route))
    p = topic.add_parser("status", parents=[common], help="min/max offset of every queue")
    p.add_argument("topic")
    p.set_defaults(func=_runner(_topic_status))
    for name, text in (("create", "create a topic"), ("update", "change a topic's queues/perm")):
        p = topic.add_parser(name, parents=[common], help=text)
        p.add_argument("topic")
        p.add_argument("-r", "--read-queues", type=int, default=8,
                       help="queues consumers read (default %(default)s)")
        p.add_argument("-w", "--write-queues", type=int, default=8,
                       help="queues producers write (default %(default)s)")
        p.add_argument("-p", "--perm", type=int, default=6, help="2 write, 4 read, 6 both")
        p.add_argument("--order", action="store_true", help="mark as an ordered topic")
        where = p.add_mutually_exclusive_group()
        where.add_argument("-c", "--cluster", help="every master of this cluster (default: all)")
        where.add_argument("-b", "--broker-addr", help="only this broker (host:port)")
        p.set_defaults(func=_runner(_topic_create))
    p = topic.add_parser("delete", parents=[common], help="delete a topic (or an LMQ)")
    p.add_argument("topic")
    p.add_argument("-c", "--cluster", help="only the masters of this cluster")
    p.set_defaults(func=_runner(_topic_delete))

    consumer_parser = cmds.add_parser("consumer", help="consumer group commands")
    consumer_parser.set_defaults(func=lambda args: _usage(consumer_parser))
    consumer = consumer_parser.add_subparsers(dest="consumer_command", metavar="ACTION")
    p = consumer.add_parser("progress", parents=[common],
                            help="per queue: broker offset, consumer offset, lag")
    p.add_argument("group")
    p.add_argument("-t", "--topic", help="only this topic (default: every topic of the group)")
    p.set_defaults(func=_runner(_consumer_progress))
    p = consumer.add_parser("reset", parents=[common],
                            help="reset a group's offsets of a topic to a point in time")
    p.add_argument("group")
    p.add_argument("topic")
    p.add_argument("--time", required=True,
                   help="ms since epoch, ISO date-time (local), 'now', or relative: -30m, -2h, -1d")
    # argparse takes "-1h" for an option (only "-1" looks like a number to it): let relative
    # times through as values, as `--time -1h` is what people type.
    p._negative_number_matcher = _RELATIVE_ARG
    p.set_defaults(func=_runner(_consumer_reset))

    group_parser = cmds.add_parser("group", help="subscription group (consumer group) configs")
    group_parser.set_defaults(func=lambda args: _usage(group_parser))
    group = group_parser.add_subparsers(dest="group_command", metavar="ACTION")
    p = group.add_parser("update", parents=[common],
                         help="create or change a group's config (like mqadmin updateSubGroup)")
    p.add_argument("group")
    p.add_argument("--fifo", action=argparse.BooleanOptionalAction, default=None,
                   help="FIFO group: consumeMessageOrderly (docs/pop.md); default: unchanged")
    where = p.add_mutually_exclusive_group()
    where.add_argument("-c", "--cluster", help="every master of this cluster (default: all)")
    where.add_argument("-b", "--broker-addr", help="only this broker (host:port)")
    p.set_defaults(func=_runner(_group_update))
    p = group.add_parser("show", parents=[common], help="a group's config on every master")
    p.add_argument("group")
    p.set_defaults(func=_runner(_group_show))

    message_parser = cmds.add_parser("message", help="find messages")
    message_parser.set_defaults(func=lambda args: _usage(message_parser))
    message = message_parser.add_subparsers(dest="message_command", metavar="ACTION")
    p = message.add_parser("id", parents=[common], help="by message id")
    p.add_argument("msg_id")
    p.add_argument("-t", "--topic", help="needed for client (UNIQ_KEY) ids")
    p.set_defaults(func=_runner(_message_id))
    p = message.add_parser("key", parents=[common], help="by KEYS entry")
    p.add_argument("topic")
    p.add_argument("key")
    p.add_argument("-m", "--max", type=int, default=32,
                   help="at most this many messages (default %(default)s)")
    p.set_defaults(func=_runner(_message_key))

    p = cmds.add_parser("send", parents=[common], help="send a test message")
    p.add_argument("topic")
    p.add_argument("body")
    p.add_argument("--tags", help="the message's tag (consumers filter on it)")
    p.add_argument("--keys", help="space-separated keys")
    p.add_argument("-p", "--property", action="append", default=[], metavar="NAME=VALUE",
                   help="a user property (repeat for more)")
    p.add_argument("-g", "--group", default="TOOLS_PRODUCER",
                   help="producer group (default %(default)s)")
    p.set_defaults(func=_runner(_send))

    p = cmds.add_parser("tail", parents=[common], help="print new messages of a topic or LMQ")
    p.add_argument("topic", help="topic or %%LMQ%%name")
    p.add_argument("--from-beginning", action="store_true",
                   help="start at the oldest stored message (default: only new ones)")
    p.add_argument("-e", "--expression", default="*", help="tag expression")
    p.add_argument("-c", "--count", type=int, help="stop after this many messages")
    p.add_argument("-d", "--duration", type=float, help="stop after this many seconds")
    p.add_argument("--cluster", help="LMQ: only the masters of this cluster")
    p.set_defaults(func=_runner(_tail))

    parser.set_defaults(func=lambda args: _usage(parser))


    ha_parser = cmds.add_parser("ha", help="replication roles, epochs and lag (docs/ha.md)")
    ha_parser.set_defaults(func=lambda args: _usage(ha_parser))
    ha = ha_parser.add_subparsers(dest="ha_command", metavar="ACTION")
    ctl = argparse.ArgumentParser(add_help=False)
    ctl.add_argument("--controller", metavar="HOST:PORT",
                     help="the HA controller (default: the first name server)")
    p = ha.add_parser("status", parents=[common, ctl],
                      help="each broker's role, epoch and replication lag")
    p.set_defaults(func=_runner(_ha_status))
    p = ha.add_parser("switch", parents=[common, ctl],
                      help="hand writing over to an in-sync slave (waits out the lease)")
    p.add_argument("broker_name")
    p.add_argument("--to", type=int, metavar="ID", help="the slave's broker id "
                   "(default: the in-sync slave with the most data)")
    p.set_defaults(func=_runner(_ha_switch))


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return EXIT_USAGE


# ---------------------------------------------------------------------------------------
# running


class UsageError(Exception):
    """Bad argument values found after parsing."""


def _runner(body: Callable[[Any, argparse.Namespace], Awaitable[Any]]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        import trio

        from core.client.admin import AdminClient
        from core.client.config import ClientConfig
        from core.client.instance import ClientInstance

        try:
            if args.timeout <= 0:
                raise ValueError("--timeout must be positive")
            if bool(args.access_key) != bool(args.secret_key):
                raise ValueError("give both --access-key and --secret-key, or neither")
            config = ClientConfig(namesrv_addr=args.namesrv_addr, request_timeout=args.timeout,
                                  access_key=args.access_key or None,
                                  secret_key=args.secret_key or None)
        except ValueError as exc:
            print(f"lmq admin: error: {exc}", file=sys.stderr)
            return EXIT_USAGE

        async def main() -> Any:
            async with ClientInstance(config) as c:
                return await body(AdminClient(c), args)

        try:
            out = trio.run(main)
        except UsageError as exc:
            print(f"lmq admin: error: {exc}", file=sys.stderr)
            return EXIT_USAGE
        except KeyboardInterrupt:
            return 130
        except BaseException as exc:  # noqa: BLE001 - one line, never a traceback
            leaf = _first_leaf(exc)
            if isinstance(leaf, KeyboardInterrupt):
                return 130
            if isinstance(leaf, UsageError):
                print(f"lmq admin: error: {leaf}", file=sys.stderr)
                return EXIT_USAGE
            if isinstance(leaf, SystemExit):
                raise
            print(f"lmq admin: error: {_describe(leaf)}", file=sys.stderr)
            return EXIT_ERROR
        if out is not None:
            _emit(out, args)
        return 0
    return run


def _first_leaf(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _describe(exc: BaseException) -> str:
    from core.remoting.errors import RemotingConnectError, RemotingTimeoutError

    if isinstance(exc, RemotingConnectError):
        return f"cannot reach the broker or name server: {exc}"
    if isinstance(exc, RemotingTimeoutError):
        return f"no answer in time: {exc}"
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0]


class Table:
    """Rows for the human output: `columns` in order, with their headers."""

    def __init__(self, rows: list[dict[str, Any]], columns: list[tuple[str, str]], json_data: Any = None,
                 empty: str = "(none)") -> None:
        self.rows = rows
        self.columns = columns
        self.json_data = rows if json_data is None else json_data
        self.empty = empty


class Text:
    def __init__(self, text: str, json_data: Any) -> None:
        self.text = text
        self.json_data = json_data


def _emit(out: Any, args: argparse.Namespace) -> None:
    if args.json:
        data = out.json_data if isinstance(out, (Table, Text)) else out
        print(json.dumps(data, indent=2, sort_keys=False, default=str))
    elif isinstance(out, Table):
        print(format_table(out.rows, out.columns) if out.rows else out.empty)
    elif isinstance(out, Text):
        print(out.text)
    else:
        print(out)


def format_table(rows: list[dict[str, Any]], columns: list[tuple[str, str]]) -> str:
    cells = [[header for _, header in columns]]
    for row in rows:
        cells.append([_cell(row.get(key)) for key, _ in columns])
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    lines = []
    for r in cells:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, list):
        return " ".join(map(str, value))
    return str(value)


def _ts(ms: int) -> str:
    if not ms:
        return "-"
    return dt.datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%d %H:%M:%S")


_RELATIVE = re.compile(r"^-(\d+(?:\.\d+)?)([smhd])$")
# What argparse may take for a value rather than an option: -5, -1.5, -30m, -2h, -1d.
_RELATIVE_ARG = re.compile(r"^-\d+(?:\.\d+)?[smhd]?$|^-\.\d+$")


def parse_time(text: str, now_ms: int | None = None) -> int:
    """ms since epoch from "1700000000000", "2024-05-01T10:00", "now" or "-2h"."""
    import time

    now = int(time.time() * 1000) if now_ms is None else now_ms
    text = text.strip()
    if text == "now":
        return now
    if text.isdigit():
        return int(text)
    m = _RELATIVE.match(text)
    if m:
        factor = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}[m.group(2)]
        return now - int(float(m.group(1)) * factor)
    try:
        return int(dt.datetime.fromisoformat(text).timestamp() * 1000)
    except ValueError:
        raise UsageError(f"cannot read time {text!r} (ms, ISO date-time, 'now' or -30m/-2h/-1d)") from None


# ---------------------------------------------------------------------------------------
# subcommands


async def _cluster_list(admin, args) -> Table:
    rows = await admin.cluster_list()
    return Table(rows, [("cluster", "CLUSTER"), ("brokerName", "BROKER"), ("brokerId", "ID"),
                        ("addr", "ADDRESS"), ("status", "STATUS"), ("version", "VERSION"),
                        ("uptime", "UPTIME")], empty="(no brokers registered)")


async def _topic_list(admin, args) -> Text:
    topics = await admin.topic_list()
    return Text("\n".join(topics) if topics else "(no topics)", topics)


async def _topic_route(admin, args) -> Text:
    route = await admin.topic_route(args.topic)
    data = route.to_json()
    lines = [f"topic {args.topic}"]
    for bd in sorted(route.broker_datas, key=lambda b: b.broker_name):
        addrs = ", ".join(f"{i}={a}" for i, a in sorted(bd.broker_addrs.items()))
        lines.append(f"  broker {bd.broker_name} (cluster {bd.cluster}): {addrs}")
    for qd in sorted(route.queue_datas, key=lambda q: q.broker_name):
        lines.append(f"  queues on {qd.broker_name}: read {qd.read_queue_nums}, "
                     f"write {qd.write_queue_nums}, perm {qd.perm}")
    return Text("\n".join(lines), data)


async def _topic_status(admin, args) -> Table:
    rows = await admin.topic_status(args.topic)
    for r in rows:
        r["lastUpdate"] = _ts(r["lastUpdateTimestamp"])
    return Table(rows, [("brokerName", "BROKER"), ("queueId", "QID"), ("minOffset", "MIN"),
                        ("maxOffset", "MAX"), ("lastUpdate", "LAST UPDATE")])


async def _topic_create(admin, args) -> Text:
    addrs = await admin.topic_create(
        args.topic, read_queue_nums=args.read_queues, write_queue_nums=args.write_queues,
        perm=args.perm, order=args.order, cluster=args.cluster, broker_addr=args.broker_addr)
    verb = "created/updated" if args.topic_command == "create" else "updated"
    return Text(f"topic {args.topic} {verb} on {', '.join(addrs)}",
                {"topic": args.topic, "brokers": addrs})


async def _topic_delete(admin, args) -> Text:
    addrs = await admin.topic_delete(args.topic, cluster=args.cluster)
    return Text(f"topic {args.topic} deleted from {', '.join(addrs)} and the name servers",
                {"topic": args.topic, "brokers": addrs})


async def _consumer_progress(admin, args) -> Table:
    rows = await admin.consumer_progress(args.group, args.topic)
    total = sum(r["lag"] for r in rows)
    for r in rows:
        r["last"] = _ts(r["lastTimestamp"])
    table = Table(rows, [("topic", "TOPIC"), ("brokerName", "BROKER"), ("queueId", "QID"),
                         ("brokerOffset", "BROKER OFFSET"), ("consumerOffset", "CONSUMER OFFSET"),
                         ("lag", "LAG"), ("last", "LAST CONSUMED")],
                  json_data={"group": args.group, "totalLag": total, "queues": rows},
                  empty=f"(group {args.group} has no offsets)")
    if rows:
        table.rows = rows + [{"topic": "total", "lag": total}]
    return table


async def _consumer_reset(admin, args) -> Table:
    ts = parse_time(args.time)
    rows = await admin.reset_offset_by_time(args.group, args.topic, ts)
    return Table(rows, [("topic", "TOPIC"), ("brokerName", "BROKER"), ("queueId", "QID"),
                        ("oldOffset", "OLD OFFSET"), ("newOffset", "NEW OFFSET")],
                 json_data={"group": args.group, "timestamp": ts, "queues": rows})


async def _group_configs(admin, addrs: list[str], group: str) -> dict[str, dict | None]:
    """addr -> the group's subscription-group config there (None: not created)."""
    from core.remoting.codes import RequestCode

    out: dict[str, dict | None] = {}
    for addr in addrs:
        resp = await admin.api.call(addr, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)
        table = json.loads(resp.body_bytes() or b"{}").get("subscriptionGroupTable") or {}
        out[addr] = table.get(group)
    return out


async def _broker_addrs(admin, cluster: str | None = None) -> list[str]:
    return sorted((await admin._masters(cluster)).values())


async def _group_update(admin, args) -> Text:
    """UPDATE_AND_CREATE_SUBSCRIPTIONGROUP with the group's current config (defaults for a
    new group) and the options given: the others stay as they are."""
    from core.common.names import validate_group
    from core.remoting.codes import RequestCode

    reason = validate_group(args.group)
    if reason is not None:
        raise UsageError(reason)
    addrs = [args.broker_addr] if args.broker_addr else await _broker_addrs(admin, args.cluster)
    current = await _group_configs(admin, addrs, args.group)
    done = {}
    for addr in addrs:
        config = dict(current[addr] or {})
        config["groupName"] = args.group
        if args.fifo is not None:
            config["consumeMessageOrderly"] = args.fifo
        await admin.api.call(addr, RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
                             body=json.dumps(config).encode())
        done[addr] = config
    fifo = ", ".join(f"{a}: fifo={bool(c.get('consumeMessageOrderly'))}" for a, c in done.items())
    return Text(f"group {args.group} created/updated on {fifo}",
                {"group": args.group, "brokers": done})


async def _group_show(admin, args) -> Table:
    configs = await _group_configs(admin, await _broker_addrs(admin), args.group)
    rows = [{"addr": addr, "fifo": bool(c.get("consumeMessageOrderly")),
             "retryMaxTimes": c.get("retryMaxTimes"), "consumeEnable": c.get("consumeEnable"),
             "broadcast": c.get("consumeBroadcastEnable")}
            for addr, c in configs.items() if c is not None]
    if not rows:
        raise LookupError(f"group {args.group} has no config on any broker")
    return Table(rows, [("addr", "BROKER"), ("fifo", "FIFO"), ("retryMaxTimes", "MAX RETRIES"),
                        ("consumeEnable", "CONSUME"), ("broadcast", "BROADCAST")],
                 json_data={"group": args.group, "configs": {a: c for a, c in configs.items()
                                                             if c is not None}})


def _messages_out(msgs) -> Text:
    from core.client.admin import message_to_dict

    data = [message_to_dict(m) for m in msgs]
    blocks = []
    for d in data:
        lines = [f"msgId:          {d['msgId']}",
                 f"offsetMsgId:    {d['offsetMsgId']}",
                 f"topic:          {d['topic']}  queue {d['queueId']} offset {d['queueOffset']}",
                 f"tags / keys:    {d['tags'] or '-'} / {' '.join(d['keys']) or '-'}",
                 f"born:           {_ts(d['bornTimestamp'])} from {d['bornHost']}",
                 f"stored:         {_ts(d['storeTimestamp'])} at {d['storeHost']}",
                 f"reconsumeTimes: {d['reconsumeTimes']}",
                 f"properties:     {json.dumps(d['properties'], sort_keys=True)}",
                 f"body ({d['bodyLength']} B, {d['bodyEncoding']}): {d['body']}"]
        blocks.append("\n".join(lines))
    return Text("\n\n".join(blocks), data)


async def _message_id(admin, args) -> Text:
    msgs = await admin.message_by_id(args.msg_id, args.topic)
    if not msgs:
        raise LookupError(f"no message with id {args.msg_id}")
    return _messages_out(msgs)


async def _message_key(admin, args) -> Text:
    msgs = await admin.message_by_key(args.topic, args.key, args.max)
    if not msgs:
        raise LookupError(f"no message of topic {args.topic} with key {args.key!r}")
    return _messages_out(msgs)


async def _send(admin, args) -> Text:
    props = {}
    for item in args.property:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise UsageError(f"property {item!r} is not NAME=VALUE")
        props[name] = value
    result = await admin.send_message(args.topic, args.body.encode("utf-8"), tags=args.tags,
                                      keys=args.keys, properties=props, group=args.group)
    data = {"status": result.status.name, "msgId": result.msg_id,
            "offsetMsgId": result.offset_msg_id, "brokerName": result.message_queue.broker_name,
            "queueId": result.message_queue.queue_id, "queueOffset": result.queue_offset}
    text = (f"{data['status']} msgId={data['msgId']} offsetMsgId={data['offsetMsgId']} "
            f"queue={data['brokerName']}#{data['queueId']} offset={data['queueOffset']}")
    return Text(text, data)


async def _tail(admin, args) -> None:
    import trio

    from core.client.admin import message_to_dict

    def show(msg) -> None:
        if args.json:
            print(json.dumps(message_to_dict(msg), default=str), flush=True)
        else:
            body = msg.body.decode("utf-8", "replace")
            where = f"{msg.topic}#{msg.queue_id}@{msg.queue_offset}"
            tag = f" [{msg.tags}]" if msg.tags else ""
            print(f"{_ts(msg.store_timestamp)} {where}{tag} {msg.msg_id}: {body}", flush=True)

    if args.count is not None and args.count <= 0:
        raise UsageError("--count must be positive")
    with trio.move_on_after(args.duration if args.duration else float("inf")):
        await admin.tail(args.topic, show, from_beginning=args.from_beginning,
                         expression=args.expression, cluster=args.cluster, max_messages=args.count)
    return None


# ---------------------------------------------------------------------------------------
# HA controller (docs/ha.md, "Failover")


def _controller_addr(admin, args) -> str:
    return args.controller or admin.client.config.namesrv_addrs[0]


async def _ha_status(admin, args) -> Table:
    from core.remoting.codes import RequestCode

    resp = await admin.api.call(_controller_addr(admin, args), RequestCode.CONTROLLER_GET_STATE)
    state = json.loads(resp.body_bytes() or b"{}")
    rows = []
    for name, g in sorted(state.items()):
        for bid, r in sorted(g.get("replicas", {}).items(), key=lambda kv: int(kv[0])):
            rows.append({"brokerName": name, "brokerId": int(bid), "addr": r.get("addr"),
                         "role": r.get("role"), "epoch": r.get("epoch"),
                         "inSync": "yes" if r.get("inSync") else "no",
                         "lagBytes": r.get("lagBytes", ""), "lagS": r.get("lagS", ""),
                         "lastSeenS": r.get("lastSeenS"),
                         "lease": g.get("leaseLeftS") if r.get("role") == "MASTER" else ""})
    return Table(rows, [("brokerName", "BROKER"), ("brokerId", "ID"), ("addr", "ADDRESS"),
                        ("role", "ROLE"), ("epoch", "EPOCH"), ("inSync", "IN-SYNC"),
                        ("lagBytes", "LAG BYTES"), ("lagS", "LAG S"),
                        ("lastSeenS", "SEEN S AGO"), ("lease", "LEASE S")],
                 json_data=state, empty="(no broker reports to this controller)")


async def _ha_switch(admin, args) -> Text:
    from core.remoting.codes import RequestCode

    ext = {"brokerName": args.broker_name}
    if args.to is not None:
        ext["brokerId"] = str(args.to)
    resp = await admin.api.call(_controller_addr(admin, args), RequestCode.CONTROLLER_ELECT, ext)
    state = json.loads(resp.body_bytes() or b"{}")
    return Text(f"switch of {args.broker_name} requested: the master's lease is no longer "
                f"renewed; a new master is elected when it has run out (epoch now "
                f"{state.get('epoch')})", state)

