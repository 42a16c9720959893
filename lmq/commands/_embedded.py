"""The last start-up steps `lmq serve` and `lmq broker` share (docs/operations.md)."""

from __future__ import annotations

import argparse
import logging

from lmq.commands._startup import banner_service, choose_advertise_host, install_recovery_line
from lmq.metrics import exporter_from_args

log = logging.getLogger("lmq")


def embedded_server(args: argparse.Namespace, broker_config, namesrv_config=None,
                    services: list = ()):
    """(server, metrics exporter or None) of a checked configuration: logs the address
    the broker advertises when it binds every interface, shows a live line while the
    store recovers (on a terminal only) and builds the `EmbeddedServer` with `services`
    and the start-up banner."""
    from core.cluster import EmbeddedServer

    advertise = choose_advertise_host(broker_config)
    if advertise:
        log.log(logging.WARNING if "127.0.0.1" in advertise else logging.INFO, "%s", advertise)
    exporter = exporter_from_args(args)
    install_recovery_line()
    server = EmbeddedServer(broker_config, namesrv_config,
                            services=[*services, banner_service(exporter)])
    if exporter is not None:
        exporter.server = server  # read at scrape time
    return server, exporter
