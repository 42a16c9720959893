"""`lmq amqp`: a stand-alone AMQP 0-9-1 gateway in front of a cluster (docs/amqp.md)."""

from __future__ import annotations

import argparse
import functools
import logging

from lmq.commands import _amqp_users

log = logging.getLogger("lmq.amqp")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("amqp", help="run a stand-alone AMQP 0-9-1 gateway")
    parser.add_argument("--namesrv-addr", default="127.0.0.1:9876",
                        help="name server address(es), ';'-separated (default %(default)s)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="bind address (default %(default)s: this machine only)")
    parser.add_argument("--amqp-port", type=int, default=5672,
                        help="AMQP listen port (default %(default)s; 0 picks a free one)")
    parser.add_argument("--log-level", default="INFO", help="logging level (default %(default)s)")
    parser.add_argument("--users-file", default="",
                        help="users, vhosts and permissions (JSON, managed by `lmq amqp "
                             "user ...`; default: vhost / and guest/guest only)")
    parser.add_argument("--amqp-tls-port", type=int, default=None,
                        help="AMQPS listen port (5671 by convention; needs --certfile/--keyfile)")
    parser.add_argument("--certfile", default=None, help="TLS certificate chain (PEM)")
    parser.add_argument("--keyfile", default=None, help="TLS private key (PEM)")
    _amqp_users.register(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if getattr(args, "amqp_command", None):
        return _amqp_users.run(args)
    import signal

    import trio

    from gateway.amqp.server import AmqpServerConfig
    from gateway.amqp.standalone import run_standalone
    from lmq.commands._broker_args import setup_logging

    setup_logging(args.log_level)
    config = AmqpServerConfig(host=args.host, port=args.amqp_port, users_file=args.users_file,
                              tls_port=args.amqp_tls_port, certfile=args.certfile or "",
                              keyfile=args.keyfile or "")

    async def main() -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:
                await nursery.start(functools.partial(run_standalone, args.namesrv_addr,
                                                      config))
                async for _ in signals:
                    nursery.cancel_scope.cancel()
                    return

    try:
        trio.run(main)
    except (OSError, trio.TooSlowError) as exc:
        log.error("cannot start: %r", exc)
        return 1
    return 0
