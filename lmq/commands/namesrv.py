"""`lmq namesrv`: run a standalone name server until Ctrl-C or SIGTERM."""

from __future__ import annotations

import argparse
import logging
import signal

import trio

from core.namesrv import NameServer, NamesrvConfig
from lmq.commands._broker_args import (
    add_remoting_security_options,
    raise_fd_limit,
    refuse_insecure,
    remoting_security_overrides,
)
from lmq.commands._checks import busy_listener, log_level
from lmq.metrics import add_metrics_options, exporter_from_args

log = logging.getLogger("lmq.namesrv")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "namesrv",
        help="run a RocketMQ name server (broker registry and topic routes)",
        description="Run a RocketMQ 4.x compatible name server.",
    )
    defaults = NamesrvConfig()
    parser.add_argument("--host", default=defaults.host,
                        help="listen address (default %(default)s: this machine only)")
    parser.add_argument("--port", type=int, default=defaults.port, help="listen port (default %(default)s)")
    parser.add_argument(
        "--broker-expiry",
        type=float,
        default=defaults.broker_expiry_s,
        metavar="SECONDS",
        help="forget a broker silent for this long (default %(default)s)",
    )
    parser.add_argument(
        "--acl-file", metavar="FILE",
        help="turn ACL on with this TOML ACL file (docs/acl.md); default: ACL off",
    )
    parser.add_argument(
        "--log-level", default="INFO", type=log_level, metavar="LEVEL",
        help="DEBUG, INFO, WARNING, ERROR or CRITICAL (default %(default)s)",
    )
    parser.add_argument(
        "--controller", action="store_true",
        help="also run the HA controller (failover of replicated brokers: docs/ha.md); "
        "on one name server only",
    )
    parser.add_argument("--controller-dir", default=defaults.controller_dir, metavar="DIR",
                        help="where the controller keeps its state (default %(default)s)")
    parser.add_argument("--controller-lease", type=float, default=defaults.controller_lease_s,
                        metavar="SECONDS",
                        help="a master's write lease (default %(default)s)")
    add_remoting_security_options(parser, broker=False)
    add_metrics_options(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    security = {k: v for k, v in remoting_security_overrides(args).items() if v is not None}
    try:
        config = NamesrvConfig(
            host=args.host, port=args.port, broker_expiry_s=args.broker_expiry,
            acl_enable=bool(args.acl_file), acl_file=args.acl_file,
            controller_enable=args.controller, controller_dir=args.controller_dir,
            controller_lease_s=args.controller_lease, **security
        )
    except (TypeError, ValueError) as exc:
        log.error("bad configuration: %s", exc)
        return 2
    problem = refuse_insecure(config)
    if problem:
        log.error("%s", problem)
        return 2
    raise_fd_limit()
    try:
        trio.run(_serve, config, args)
    except (OSError, ValueError) as exc:  # e.g. the port is taken, a bad certificate
        busy = busy_listener([("name server", config.host, config.port)])
        log.error("cannot start the name server: %s", busy or exc)
        return 1
    return 0


async def _serve(config: NamesrvConfig, args: argparse.Namespace) -> None:
    nameserver = NameServer(config)
    await nameserver.listen()  # a taken port fails here, as a plain OSError
    metrics = exporter_from_args(args, namesrv=nameserver)
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            if metrics is not None:
                await nursery.start(metrics.serve)
            await nursery.start(nameserver.serve)
            async for signum in signals:
                log.info("received %s, stopping", signal.Signals(signum).name)
                nameserver.close()
                if metrics is not None:
                    metrics.stop()
                break
