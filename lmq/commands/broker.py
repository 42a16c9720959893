"""`lmq broker`: a broker alone, registering with separate name servers.

    lmq broker --namesrv-addr 10.0.0.5:9876 --broker-name broker-b --broker-port 10921
"""

from __future__ import annotations

import argparse

from lmq.commands._broker_args import (
    add_broker_options,
    add_ha_options,
    broker_overrides,
    ha_overrides,
    log,
    refuse_insecure,
    run_server,
    setup_logging,
)
from lmq.commands._checks import lock_data_dir
from lmq.metrics import add_metrics_options


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "broker",
        help="run a broker that registers with separate name servers",
        description="Run a RocketMQ 4.x compatible broker (master or slave: docs/ha.md).",
    )
    add_broker_options(parser, namesrv_port=False)
    add_ha_options(parser)
    add_metrics_options(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from lmq.commands._embedded import embedded_server, load_configs

    setup_logging(args.log_level)
    configs = load_configs(args, {**broker_overrides(args), **ha_overrides(args)})
    if configs is None:
        return 2
    broker_config = configs[0]
    if broker_config.auto_create_topic_enable is None and broker_config.auto_create_topic is None:
        # A cluster broker creates no topic on a send unless configured to (RocketMQ's
        # autoCreateTopicEnable=false in production); `lmq serve` keeps it on.
        broker_config.auto_create_topic_enable = False
    if not broker_config.namesrv_addrs:
        log.error("no name server: give --namesrv-addr (or namesrv_addrs in --config)")
        return 2
    problem = refuse_insecure(broker_config)
    if problem:
        log.error("%s", problem)
        return 2
    lock, problem = lock_data_dir(broker_config.data_dir)
    if problem:
        log.error("%s", problem)
        return 1
    server, exporter = embedded_server(args, broker_config)
    restart = _arm_restart() if broker_config.controller_addr else None
    code = run_server(server, [("broker", broker_config.host, broker_config.port)], exporter)
    if restart is not None and restart:
        # Deposed by the HA controller: start again (as a slave, cutting what no later
        # master has) with the same command line. The data-dir lock is close-on-exec.
        import os
        import sys

        log.warning("restarting as a slave")
        os.execv(sys.executable, [sys.executable, "-m", "lmq", *sys.argv[1:]])
    return code


def _arm_restart() -> list:
    """A deposed broker stops as on SIGTERM, then `run` re-executes it."""
    import os
    import signal

    from core.broker.ha import controller_link

    flag: list = []

    def hook() -> None:
        if not flag:
            flag.append(True)
            os.kill(os.getpid(), signal.SIGTERM)

    controller_link.PROCESS_RESTART_HOOK = hook
    return flag
