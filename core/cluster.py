"""Running the cluster pieces: `EmbeddedServer` (name server + broker in one trio process,
what `lmq serve` runs) and the config assembly shared by `lmq serve` / `lmq broker`.

Shutdown order matters: the broker stops first (it unregisters from the still-running name
server, persists its metadata and closes the store), then the name server.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import fields
from typing import TYPE_CHECKING, Any

import trio

from core.broker.config import (
    BrokerConfig,
    check_unknown_keys,
    config_kwargs,
    load_toml,
    parse_addr_list,
)
from core.namesrv import NameServer, NamesrvConfig

if TYPE_CHECKING:
    from core.broker.controller import BrokerController

log = logging.getLogger(__name__)

# Extra services started after the broker (gateways join here): async fn(server, task_status).
Service = Callable[..., Awaitable[None]]

# Top-level TOML aliases for the two `port` fields.
_PORT_ALIASES = {"broker_port": ("broker", "port"), "namesrv_port": ("namesrv", "port")}


def configs_from_toml(data: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split a loaded TOML mapping into (BrokerConfig kwargs, NamesrvConfig kwargs).

    Top-level keys apply to every config that has such a field (`host` sets both), except
    `port`, which is ambiguous: write `broker_port` / `namesrv_port`, or put `port` in a
    `[broker]` / `[namesrv]` table.
    """
    data = dict(data)
    if "port" in data:
        raise ValueError("top-level 'port' is ambiguous: use broker_port / namesrv_port")
    aliases = {k: data.pop(k) for k in list(data) if k in _PORT_ALIASES}
    check_unknown_keys(data, {"broker": BrokerConfig, "namesrv": NamesrvConfig})
    broker = config_kwargs(BrokerConfig, data, "broker")
    namesrv = config_kwargs(NamesrvConfig, data, "namesrv")
    for key, value in aliases.items():
        section, field_name = _PORT_ALIASES[key]
        (broker if section == "broker" else namesrv)[field_name] = value
    return broker, namesrv


def build_configs(
    config_file: str | None, overrides_broker: dict[str, Any], overrides_namesrv: dict[str, Any]
) -> tuple[BrokerConfig, NamesrvConfig]:
    """Defaults < TOML file < command-line flags (None values in overrides are ignored)."""
    broker_kw: dict[str, Any] = {}
    namesrv_kw: dict[str, Any] = {}
    if config_file:
        broker_kw, namesrv_kw = configs_from_toml(load_toml(config_file))
    broker_kw.update({k: v for k, v in overrides_broker.items() if v is not None})
    namesrv_kw.update({k: v for k, v in overrides_namesrv.items() if v is not None})
    if isinstance(broker_kw.get("namesrv_addrs"), str):
        broker_kw["namesrv_addrs"] = parse_addr_list(broker_kw["namesrv_addrs"])
    _check_fields(BrokerConfig, broker_kw)
    _check_fields(NamesrvConfig, namesrv_kw)
    return BrokerConfig(**broker_kw), NamesrvConfig(**namesrv_kw)


def _check_fields(cls: type, kwargs: dict[str, Any]) -> None:
    names = {f.name for f in fields(cls)}
    unknown = set(kwargs) - names
    if unknown:
        raise ValueError(f"unknown {cls.__name__} keys: {', '.join(sorted(unknown))}")


class EmbeddedServer:
    """Name server + broker (+ later gateways) in one process (docs/architecture.md §5).

    `namesrv_config=None` runs the broker alone against `broker_config.namesrv_addrs`.
    Start with ``await nursery.start(server.serve)``; `stop()` shuts down cleanly.
    """

    def __init__(
        self,
        broker_config: BrokerConfig,
        namesrv_config: NamesrvConfig | None = None,
        *,
        services: list[Service] | None = None,
    ) -> None:
        self.broker_config = broker_config
        self.namesrv_config = namesrv_config
        self.services = list(services or [])
        self.namesrv: NameServer | None = None
        self.broker: BrokerController | None = None
        self._stop: trio.Event | None = None
        self._stop_requested = False

    @property
    def namesrv_addr(self) -> str | None:
        if self.namesrv is None:
            return None
        return f"{self.broker_config.advertised_ip}:{self.namesrv.port}"

    async def serve(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        from core.broker.controller import BrokerController

        self._stop = trio.Event()
        if self._stop_requested:
            self._stop.set()
        async with trio.open_nursery() as outer:
            if self.namesrv_config is not None:
                self.namesrv = NameServer(self.namesrv_config)
                await outer.start(self.namesrv.serve)
                # The embedded name server is always one of the broker's name servers.
                if self.namesrv_addr not in self.broker_config.namesrv_addrs:
                    self.broker_config.namesrv_addrs.append(self.namesrv_addr)
            self.broker = BrokerController(self.broker_config)
            broker_done = trio.Event()

            async def run_broker(task_status=trio.TASK_STATUS_IGNORED) -> None:
                try:
                    await self.broker.serve(task_status=task_status)
                finally:
                    broker_done.set()

            stoppable: list[tuple[Service, trio.Event]] = []

            async def run_service(service, done, task_status=trio.TASK_STATUS_IGNORED) -> None:
                try:
                    await service(self, task_status=task_status)
                finally:
                    done.set()

            async with trio.open_nursery() as inner:
                await inner.start(run_broker)
                for service in self.services:
                    done = trio.Event()
                    if getattr(service, "stop", None) is not None:
                        stoppable.append((service, done))
                    await inner.start(run_service, service, done)
                task_status.started(self)
                await self._stop.wait()
                # Gateways stop first: they disconnect their clients and persist their
                # state while the broker still answers.
                for service, _ in stoppable:
                    service.stop()
                with trio.move_on_after(30):
                    for _, done in stoppable:
                        await done.wait()
                self.broker.stop()
                with trio.move_on_after(30):
                    await broker_done.wait()
                inner.cancel_scope.cancel()
            if self.namesrv is not None:
                self.namesrv.close()

    def stop(self) -> None:
        """Shut down: broker first (unregister, persist, close store), then name server."""
        self._stop_requested = True
        if self._stop is not None:
            self._stop.set()
