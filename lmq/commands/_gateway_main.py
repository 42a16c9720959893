"""What the stand-alone gateway commands (`lmq amqp`, `lmq proxy`) share: their first
options and their main task."""

from __future__ import annotations

import argparse
import signal
from collections.abc import Awaitable, Callable

import trio


def add_gateway_options(parser: argparse.ArgumentParser) -> None:
    """--namesrv-addr and --host (the command adds its own ports)."""
    parser.add_argument("--namesrv-addr", default="127.0.0.1:9876",
                        help="name server address(es), ';'-separated (default %(default)s)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="bind address (default %(default)s: this machine only)")


async def serve_until_signal(
    start: Callable[[trio.Nursery], Awaitable[object]], state: dict, stopping: str,
    exporter=None, ready: Callable[[], str | None] | None = None,
) -> None:
    """Run a gateway until SIGINT or SIGTERM, which cancel it at once, even while starting.

    `state["not_ready"]` is the /readyz reason: None once `start(nursery)` (which starts
    the gateway's tasks in the nursery) has returned, `stopping` after a signal. The
    metrics exporter, when there is one, serves first, so that /readyz answers 503 until
    the gateway is up; it asks `ready` (default: `state["not_ready"]`)."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:

            async def stop_on_signal() -> None:
                async for _ in signals:
                    state["not_ready"] = stopping
                    nursery.cancel_scope.cancel()
                    return

            nursery.start_soon(stop_on_signal)
            if exporter is not None:
                exporter.ready = ready or (lambda: state["not_ready"])
                await nursery.start(exporter.serve)
            await start(nursery)
            state["not_ready"] = None


def find_exception(exc: BaseException, kinds) -> BaseException | None:
    """The first exception of `kinds` in `exc` (trio wraps task failures in groups)."""
    if isinstance(exc, kinds):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = find_exception(inner, kinds)
            if found is not None:
                return found
    return None


def amqp_configs(path: str | None, **flags):
    """(AmqpServerConfig, AmqpBrokerConfig): defaults < the TOML file `path` (typed) < the
    flags given (None: not given). ValueError names a bad key or value."""
    from gateway.amqp.broker import AmqpBrokerConfig
    from gateway.amqp.embedded import amqp_config_tables
    from gateway.amqp.server import AmqpServerConfig
    from lmq.commands._checks import mapping_type_error

    server_kw, broker_kw = amqp_config_tables(path)
    server_kw.update({k: v for k, v in flags.items() if v is not None})
    source = path or "the flags"
    problem = (mapping_type_error(AmqpServerConfig, server_kw, source)
               or mapping_type_error(AmqpBrokerConfig, broker_kw, source))
    if problem:
        raise ValueError(problem)
    return AmqpServerConfig(**server_kw), AmqpBrokerConfig(**broker_kw)
