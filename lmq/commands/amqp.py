"""`lmq amqp`: a stand-alone AMQP 0-9-1 gateway in front of a cluster (docs/amqp.md)."""

from __future__ import annotations

import argparse
import errno
import functools
import logging

from lmq.commands import _amqp_users
from lmq.commands._checks import log_level
from lmq.commands._gateway_main import add_gateway_options
from lmq.metrics import add_metrics_options
from lmq.metrics import seconds_arg as _wait_seconds  # 0.1..3600, as --dashboard-interval

log = logging.getLogger("lmq.amqp")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("amqp", help="run a stand-alone AMQP 0-9-1 gateway")
    add_gateway_options(parser)
    parser.add_argument("--amqp-port", type=int, default=None,
                        help="AMQP listen port (default 5672; 0 picks a free one)")
    parser.add_argument("--amqp-config", metavar="FILE",
                        help="AMQP gateway TOML file (keys = AmqpServerConfig / "
                             "AmqpBrokerConfig fields, docs/amqp.md); flags win over it")
    parser.add_argument("--log-level", default="INFO", type=log_level,
                        help="logging level (default %(default)s)")
    parser.add_argument("--users-file", default=None,
                        help="users, vhosts and permissions (JSON, managed by `lmq amqp "
                             "user ...`; default: vhost / and guest/guest only)")
    parser.add_argument("--amqp-tls-port", type=int, default=None,
                        help="AMQPS listen port (5671 by convention; needs --certfile/--keyfile)")
    parser.add_argument("--certfile", default=None, help="TLS certificate chain (PEM)")
    parser.add_argument("--keyfile", default=None, help="TLS private key (PEM)")
    parser.add_argument("--cluster-wait", type=_wait_seconds, default=None, metavar="SECONDS",
                        help="how long start-up waits for a master broker registered with "
                             "the name servers before giving up (default 30)")
    add_metrics_options(parser, gateway_only=True)
    _amqp_users.register(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if getattr(args, "amqp_command", None):
        return _amqp_users.run(args)
    import trio

    from gateway.amqp.standalone import CLUSTER_WAIT_S, run_standalone
    from lmq.commands._broker_args import _os_error, setup_logging
    from lmq.commands._checks import busy_listener
    from lmq.commands._gateway_main import find_exception, serve_until_signal
    from lmq.metrics import exporter_from_args

    setup_logging(args.log_level)
    try:
        config, broker_config = _configs(args)
    except (OSError, ValueError) as exc:
        log.error("cannot start: %s", exc)
        return 2

    wait_s = CLUSTER_WAIT_S if args.cluster_wait is None else args.cluster_wait
    exporter = exporter_from_args(args)
    # /readyz: 503 with this reason until the listener is up, 200 after, 503 when stopping
    state = {"not_ready": "AMQP gateway not started (waiting for a master broker)"}

    async def start(nursery: trio.Nursery) -> None:
        log.info("waiting for a master broker registered with %s (at most %g s)",
                 args.namesrv_addr, wait_s)
        await nursery.start(functools.partial(
            run_standalone, args.namesrv_addr, config, broker_config, cluster_wait_s=wait_s,
            on_server=lambda s: setattr(exporter, "amqp", s) if exporter else None))

    try:
        trio.run(serve_until_signal, start, state, "AMQP gateway shutting down", exporter)
    except (OSError, trio.TooSlowError, BaseExceptionGroup) as exc:
        error = _os_error(exc)
        if error is not None:
            busy = None
            if error.errno == errno.EADDRINUSE:
                busy = busy_listener([("AMQP", config.host, config.port),
                                      ("AMQPS", config.host, config.tls_port),
                                      ("metrics", args.metrics_host, args.metrics_port)])
            log.error("cannot start: %s", busy or error)
            return 1
        if find_exception(exc, trio.TooSlowError) is not None:
            log.error("cannot start: no master broker registered with the name server(s) "
                      "%s within %g s: start the cluster first, or check --namesrv-addr",
                      args.namesrv_addr, wait_s)
            return 1
        raise
    return 0


def _configs(args: argparse.Namespace):
    """(AmqpServerConfig, AmqpBrokerConfig) from --amqp-config and the flags."""
    from lmq.commands._gateway_main import amqp_configs

    return amqp_configs(args.amqp_config, host=args.host, port=args.amqp_port,
                        users_file=args.users_file, tls_port=args.amqp_tls_port,
                        certfile=args.certfile, keyfile=args.keyfile)
