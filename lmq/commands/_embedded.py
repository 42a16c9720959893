"""The start-up steps `lmq serve` and `lmq broker` share (docs/operations.md)."""

from __future__ import annotations

import argparse
import logging

from lmq.commands._checks import config_type_error
from lmq.commands._startup import banner_service, choose_advertise_host, install_recovery_line
from lmq.metrics import exporter_from_args

log = logging.getLogger("lmq")


def load_configs(args: argparse.Namespace, broker_overrides: dict,
                 namesrv_overrides: dict | None = None):
    """(broker config, name server config) from --config and the flags, their values'
    types checked; None after one error line when the file or a value is bad. Without
    `namesrv_overrides` (a broker alone) the name server part is neither checked nor
    returned (None in its place)."""
    from core.cluster import build_configs

    try:
        broker_config, namesrv_config = build_configs(
            args.config, broker_overrides, namesrv_overrides or {})
    except (OSError, ValueError, TypeError) as exc:
        log.error("bad configuration: %s", exc)
        return None
    if namesrv_overrides is None:
        namesrv_config = None
    source = args.config or "the flags"
    problem = config_type_error(broker_config, source) or (
        namesrv_config is not None and config_type_error(namesrv_config, source))
    if problem:
        log.error("%s", problem)
        return None
    return broker_config, namesrv_config


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
