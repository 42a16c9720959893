"""`NameServer`: the route registry served over RocketMQ remoting (default port 9876)."""

from __future__ import annotations

import logging

import trio

from core.acl import guard_from_file
from core.namesrv.config import NamesrvConfig
from core.namesrv.kvconfig import KVConfigManager
from core.namesrv.processors import NamesrvProcessors
from core.namesrv.routes import RouteInfoManager
from core.remoting.processor import ProcessorTable
from core.remoting.server import RemotingServer

__all__ = ["NameServer"]

log = logging.getLogger(__name__)


class NameServer:
    """One name server: route table, KV config, processors and a RemotingServer.

    Start with ``port = await nursery.start(nameserver.serve)``. `table` is public so an
    in-process broker or client can reach it without sockets
    (``client.register_local(addr, nameserver.table)``). Name servers share no state.
    """

    def __init__(self, config: NamesrvConfig | None = None) -> None:
        self.config = config or NamesrvConfig()
        self.routes = RouteInfoManager(self.config.broker_expiry_s)
        self.kv = KVConfigManager()
        self.processors = NamesrvProcessors(self.routes, self.kv, self.config)
        self.table = ProcessorTable()
        self.processors.register(self.table)
        self.controller = None
        if self.config.controller_enable:
            from core.namesrv.controller import Controller

            self.controller = Controller(self.config)
            self.controller.load()
            self.controller.register(self.table)
            self.processors.controller = self.controller
        if self.config.acl_enable:
            self.table.guard = guard_from_file(self.config.acl_file)
        self.server = RemotingServer.from_config(self.table, self.config, "name server")
        self._cancel_scope: trio.CancelScope | None = None
        self._closing = False

    @property
    def port(self) -> int:
        """The bound port (meaningful once started)."""
        return self.server.port

    async def listen(self) -> int:
        """Bind the port now (serve() does it otherwise); a taken port raises OSError."""
        return await self.server.listen()

    async def serve(self, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled or `close()`; reports the bound port.

        A port already in use raises a plain OSError before anything starts.
        """
        await self.listen()
        async with trio.open_nursery() as nursery:
            self._cancel_scope = nursery.cancel_scope
            if self._closing:
                nursery.cancel_scope.cancel()
            port = await nursery.start(self.server.serve)
            nursery.start_soon(self._scan_loop)
            if self.controller is not None:
                await nursery.start(self.controller.run)
            log.info("name server listening on %s:%d", self.config.host, port)
            task_status.started(port)

    async def _scan_loop(self) -> None:
        # Java scans every 10 s for brokers silent for 120 s (docs/protocol.md §4).
        while True:
            await trio.sleep(self.config.scan_interval_s)
            self.routes.scan_not_active_brokers()

    def close(self) -> None:
        self._closing = True
        if self._cancel_scope is not None:
            self._cancel_scope.cancel()
