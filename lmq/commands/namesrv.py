"""`lmq namesrv`: run a standalone name server until Ctrl-C or SIGTERM."""

from __future__ import annotations

import argparse
import logging
import signal

import trio

from core.namesrv import NameServer, NamesrvConfig

log = logging.getLogger("lmq.namesrv")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "namesrv",
        help="run a RocketMQ name server (broker registry and topic routes)",
        description="Run a RocketMQ 4.x compatible name server.",
    )
    defaults = NamesrvConfig()
    parser.add_argument("--host", default=defaults.host, help="listen address (default %(default)s)")
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
        "--log-level", default="INFO", help="logging level (default %(default)s)"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    config = NamesrvConfig(host=args.host, port=args.port, broker_expiry_s=args.broker_expiry,
                           acl_enable=bool(args.acl_file), acl_file=args.acl_file)
    try:
        trio.run(_serve, config)
    except ValueError as exc:  # a bad ACL file
        log.error("bad configuration: %s", exc)
        return 2
    except OSError as exc:  # e.g. the port is taken
        log.error("cannot start the name server: %s", exc)
        return 1
    return 0


async def _serve(config: NamesrvConfig) -> None:
    nameserver = NameServer(config)
    await nameserver.listen()  # a taken port fails here, as a plain OSError
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            await nursery.start(nameserver.serve)
            async for signum in signals:
                log.info("received %s, stopping", signal.Signals(signum).name)
                nameserver.close()
                break
