"""`lmq mqtt`: the MQTT gateway alone, and its password file.

    lmq mqtt --namesrv-addr 10.0.0.5:9876 --data-dir ./mqtt-data      # gateway process
    lmq mqtt passwd ./mqtt.passwd alice                                # add / change a user
    lmq mqtt passwd ./mqtt.passwd alice --delete

`lmq serve` embeds the same gateway (its `--mqtt-*` flags come from `add_mqtt_options`).
"""

from __future__ import annotations

import argparse
import functools
import getpass
import logging
import os
import sys

from lmq.commands._checks import log_level, mapping_type_error

log = logging.getLogger("lmq")


def add_mqtt_options(parser: argparse.ArgumentParser, *, embedded: bool) -> None:
    """MQTT listener flags (None = keep the config file's / default value).

    One spelling for both commands: `--mqtt-port` etc. `lmq mqtt` also takes the short
    `--port` etc. it had first, hidden from its help."""
    options = (
        ("port", dict(type=int, help="MQTT TCP port (default 1883)")),
        ("ws-port", dict(type=int, help="MQTT over WebSocket port (default: off)")),
        ("tls-port", dict(type=int, help="MQTT over TLS port (default: off; needs "
                                         "--mqtt-certfile and --mqtt-keyfile)")),
        ("certfile", dict(help="TLS certificate chain (PEM) of the MQTT TLS port")),
        ("keyfile", dict(help="TLS private key (PEM) of the MQTT TLS port")),
        ("config", dict(metavar="FILE", help="MQTT gateway TOML file (keys = MqttConfig "
                                             "fields, docs/mqtt.md)")),
    )
    for name, kwargs in options:
        dest = "mqtt_" + name.replace("-", "_")
        parser.add_argument(f"--mqtt-{name}", dest=dest, **kwargs)
        if not embedded:
            hidden = {k: v for k, v in kwargs.items() if k != "help"}
            parser.add_argument(f"--{name}", dest=dest, help=argparse.SUPPRESS, **hidden)
    if embedded:
        parser.add_argument("--no-mqtt", action="store_true", help="do not run the MQTT gateway")


def mqtt_config_from_args(args: argparse.Namespace, **extra):
    from gateway.mqtt.config import load_mqtt_config

    overrides = {
        "port": args.mqtt_port,
        "ws_port": args.mqtt_ws_port,
        "tls_port": args.mqtt_tls_port,
        "certfile": args.mqtt_certfile,
        "keyfile": args.mqtt_keyfile,
    }
    # `lmq mqtt` only (docs/stateless-gateways.md, "Failure behaviour"): flags win over
    # the file's gateway_orphan_timeout_s / gateway_sweep_interval_s.
    overrides["gateway_orphan_timeout_s"] = getattr(args, "orphan_timeout", None)
    overrides["gateway_sweep_interval_s"] = getattr(args, "sweep_interval", None)
    overrides.update(extra)
    if args.mqtt_config:  # the file's values, typed, before MqttConfig checks their ranges
        import tomllib

        from gateway.mqtt.config import MqttConfig

        with open(args.mqtt_config, "rb") as fh:
            table = tomllib.load(fh)
        table = table.get("mqtt", table)
        problem = isinstance(table, dict) and mapping_type_error(MqttConfig, table,
                                                                 args.mqtt_config)
        if problem:
            raise ValueError(problem)
    return load_mqtt_config(args.mqtt_config, overrides)


def mqtt_services(args: argparse.Namespace) -> list:
    """The `EmbeddedServer` services for `lmq serve` (empty with --no-mqtt)."""
    if getattr(args, "no_mqtt", False):
        return []
    from gateway.mqtt.embedded import MqttService

    return [MqttService(mqtt_config_from_args(args, host=args.host))]


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "mqtt",
        help="run the MQTT gateway alone, or manage its password file",
        description="Run the MQTT 3.1/3.1.1/5.0 gateway against separate brokers "
        "(or use 'lmq mqtt passwd FILE USER'). Any number of gateways may serve one "
        "cluster: routes, persistent sessions, retained messages and client ids are shared "
        "through the brokers (docs/stateless-gateways.md).",
    )
    parser.add_argument("--namesrv-addr", default="127.0.0.1:9876",
                        help="name server address(es), ';'-separated (default %(default)s)")
    parser.add_argument("--data-dir", help="gateway state directory (default ./data/mqtt)")
    parser.add_argument("--host", help="bind address (default 127.0.0.1: this machine only)")
    parser.add_argument("--log-level", default="INFO", type=log_level, metavar="LEVEL",
                        help="DEBUG, INFO, WARNING, ERROR or CRITICAL (default %(default)s)")
    parser.add_argument("--remoting-tls", action="store_true",
                        help="reach the name servers and brokers over TLS")
    parser.add_argument("--remoting-tls-ca-file",
                        help="CA certificates (PEM) trusted for --remoting-tls")
    parser.add_argument("--remoting-tls-no-verify", action="store_true",
                        help="do not verify the remoting servers' certificates")
    parser.add_argument("--orphan-timeout", type=float, metavar="SECONDS",
                        help="a gateway out of the cluster this long has vanished: its clean "
                             "sessions' routes are swept and its persistent sessions expire "
                             "(default 300; config gateway_orphan_timeout_s)")
    parser.add_argument("--sweep-interval", type=float, metavar="SECONDS",
                        help="how often this gateway looks for vanished gateways (default "
                             "30; config gateway_sweep_interval_s)")
    add_mqtt_options(parser, embedded=False)
    from lmq.metrics import add_metrics_options

    add_metrics_options(parser)
    parser.set_defaults(func=run)
    sub = parser.add_subparsers(dest="mqtt_command", metavar="passwd")
    pw = sub.add_parser("passwd", help="add, change or delete a user of a password file")
    pw.add_argument("file", help="password file (created if missing)")
    pw.add_argument("user", help="user name")
    pw.add_argument("--password", help="the password (default: prompt; '-' reads stdin)")
    pw.add_argument("--delete", action="store_true", help="remove the user")
    pw.set_defaults(func=passwd)


def run(args: argparse.Namespace) -> int:
    import trio

    from gateway.mqtt.embedded import run_standalone
    from lmq.commands._broker_args import setup_logging
    from lmq.metrics import exporter_from_args

    setup_logging(args.log_level)
    try:
        extra = {"host": args.host, "data_dir": args.data_dir}
        config = mqtt_config_from_args(args, **extra)
    except (OSError, ValueError, TypeError) as exc:
        log.error("bad configuration: %s", exc)
        return 2

    async def main() -> None:
        import signal

        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:
                started: list = []
                # --metrics-port: /readyz says 503 until the gateway listens.
                metrics = exporter_from_args(args, mqtt=lambda: started[0] if started else None)
                if metrics is not None:
                    await nursery.start(metrics.serve)

                async def watch() -> None:
                    # Watching from the start: a signal while the name servers are still
                    # awaited ends the process at once.
                    async for _ in signals:
                        if metrics is not None:
                            metrics.stop()
                        if started:
                            started[0].stop()
                        else:
                            nursery.cancel_scope.cancel()
                        return

                nursery.start_soon(watch)
                await wait_for_namesrv(args.namesrv_addr)
                tls = {"tls": True, "tls_ca_file": args.remoting_tls_ca_file,
                       "tls_verify": not args.remoting_tls_no_verify}
                started.append(await nursery.start(functools.partial(
                    run_standalone, config, args.namesrv_addr,
                    client_options=tls if args.remoting_tls else None,
                )))

    try:
        trio.run(main)
    except (OSError, BaseExceptionGroup) as exc:
        import errno

        from lmq.commands._broker_args import _os_error
        from lmq.commands._checks import busy_listener

        error = _os_error(exc)
        if error is None:
            raise
        busy = None
        if error.errno == errno.EADDRINUSE:
            busy = busy_listener([("MQTT", config.host, config.port),
                                  ("MQTT over WebSocket", config.host, config.ws_port),
                                  ("MQTT over TLS", config.host, config.tls_port)])
        log.error("cannot start: %s", busy or error)
        return 1
    return 0


# Waits between attempts to reach the name servers at start-up: doubling up to the cap.
NAMESRV_RETRY_FIRST_S = 1.0
NAMESRV_RETRY_MAX_S = 10.0


async def wait_for_namesrv(addr_list: str) -> None:
    """Return once one of the name servers accepts a TCP connection; until then log one
    line per attempt saying what is wrong and what to do (a gateway may start first)."""
    import trio

    from core.broker.config import parse_addr_list

    addrs = parse_addr_list(addr_list)
    delay = NAMESRV_RETRY_FIRST_S
    while True:
        problems = []
        for addr in addrs:
            host, _, port = addr.rpartition(":")
            try:
                with trio.fail_after(5):
                    stream = await trio.open_tcp_stream(host, int(port))
                await stream.aclose()
                return
            except (OSError, trio.TooSlowError, ValueError) as exc:
                cause = exc.__cause__ or exc  # trio: "all attempts failed" from a group
                while isinstance(cause, BaseExceptionGroup) and cause.exceptions:
                    cause = cause.exceptions[0]
                reason = getattr(cause, "strerror", None) or str(cause) or "no answer in 5 s"
                problems.append(f"{addr} ({reason})")
        log.warning("name server not reachable: %s; retrying in %.0f s (start it, or fix "
                    "--namesrv-addr)", ", ".join(problems), delay)
        await trio.sleep(delay)
        delay = min(delay * 2, NAMESRV_RETRY_MAX_S)


def passwd(args: argparse.Namespace) -> int:
    from gateway.mqtt.auth import hash_password, read_password_file, write_password_file

    users = read_password_file(args.file) if os.path.exists(args.file) else {}
    if ":" in args.user or not args.user.strip():
        print("a user name must not be empty or contain ':'", file=sys.stderr)
        return 2
    if args.delete:
        if users.pop(args.user, None) is None:
            print(f"no user {args.user!r} in {args.file}", file=sys.stderr)
            return 1
        write_password_file(args.file, users)
        return 0
    password = args.password
    if password == "-":
        password = sys.stdin.readline().rstrip("\n")
    elif password is None:
        password = getpass.getpass(f"password for {args.user}: ")
        if getpass.getpass("again: ") != password:
            print("passwords differ", file=sys.stderr)
            return 1
    if not password:
        print("empty password refused", file=sys.stderr)
        return 2
    users[args.user] = hash_password(password)
    write_password_file(args.file, users)
    return 0
