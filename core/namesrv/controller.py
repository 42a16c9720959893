"""The HA controller: who may write for each broker name (docs/ha.md, "Failover").

Runs inside one name server (`controller_enable`). Per broker name it holds the master's
broker id, an epoch (raised by every election), the in-sync set (brokers that hold every
message a SYNC_MASTER acknowledged) and the epoch history (where each epoch's data starts
in the CommitLog). The master holds a write lease that its heartbeats renew; a new
master is elected only from the in-sync set, and only once the old lease has certainly
run out (`controller_lease_s` + `controller_lease_margin_s` after the last renewal).

State that an election depends on (epoch, master, in-sync set, history) is written to
`controller_dir` before any answer that reveals it, so a restarted controller never hands
out an epoch twice; after a restart every master is assumed to hold a fresh lease.

Request codes are private (900100+), JSON in and out; the design follows the idea of
Apache RocketMQ 5's controller (SyncStateSet, epochs, elect from the in-sync set), with a
lease added so that a paused master cannot write beside its successor.
"""

from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import dataclass, field

import trio

from core.remoting.codec import RemotingCommand
from core.remoting.codes import RequestCode, ResponseCode
from core.remoting.processor import ProcessorTable, RequestContext

log = logging.getLogger(__name__)

CONTROLLER_HEARTBEAT = RequestCode.CONTROLLER_HEARTBEAT
CONTROLLER_ALTER_SYNC_SET = RequestCode.CONTROLLER_ALTER_SYNC_SET
CONTROLLER_GET_STATE = RequestCode.CONTROLLER_GET_STATE
CONTROLLER_ELECT = RequestCode.CONTROLLER_ELECT

STATE_FILE = "controller.json"
MAX_HISTORY = 64  # epoch entries kept per broker name
MAX_REPLICAS = 16  # broker ids per broker name
MAX_NAME = 127


@dataclass
class Replica:
    addr: str
    ha_addr: str
    last_seen: float
    max_offset: int = -1
    epoch: int = 0
    slaves: dict = field(default_factory=dict)  # master only: id -> lag figures


@dataclass
class Group:
    """One broker name."""

    epoch: int = 0
    master: int | None = None
    sync: set[int] = field(default_factory=set)
    version: int = 0
    history: list[list] = field(default_factory=list)  # [epoch, start offset | None]
    lease_end: float = 0.0  # controller clock; the master's own lease ends earlier
    replicas: dict[int, Replica] = field(default_factory=dict)
    switch_to: int | None = None  # manual switch in progress (no more renewals)
    stuck_logged: bool = False

    def durable(self) -> dict:
        return {"epoch": self.epoch, "master": self.master, "sync": sorted(self.sync),
                "version": self.version, "history": self.history}


class Controller:
    def __init__(self, config) -> None:
        if not (config.controller_lease_s > 0 and config.controller_lease_margin_s >= 0
                and config.controller_check_s > 0 and config.controller_max_broker_names > 0):
            raise ValueError("controller_lease_s, controller_check_s and "
                             "controller_max_broker_names must be > 0, "
                             "controller_lease_margin_s >= 0")
        self.config = config
        self.lease_s = config.controller_lease_s
        self.margin_s = config.controller_lease_margin_s
        self.groups: dict[str, Group] = {}
        self._path = os.path.join(config.controller_dir, STATE_FILE)
        self._changes = 0
        self._saved = 0
        self._save_lock = trio.Lock()
        self.elections = 0

    # ------------------------------------------------------------------ state file
    def load(self) -> None:
        os.makedirs(self.config.controller_dir, exist_ok=True)
        try:
            with open(self._path, encoding="utf-8") as fh:
                data = json.load(fh)
        except FileNotFoundError:
            return
        for name, d in data.items():
            g = Group(epoch=int(d["epoch"]), master=d["master"], sync=set(d["sync"]),
                      version=int(d["version"]), history=[list(h) for h in d["history"]])
            # A lease may have been granted just before the restart: assume a fresh one
            # (counted from when `run` starts).
            g.lease_end = math.inf
            self.groups[name] = g

    def _write(self, payload: bytes) -> None:
        tmp = self._path + ".tmp"
        with open(tmp, "wb") as fh:
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self._path)

    async def _persist(self) -> None:
        """Every change so far on disk before the caller answers."""
        async with self._save_lock:
            if self._saved >= self._changes:
                return
            seq = self._changes
            payload = json.dumps({n: g.durable() for n, g in self.groups.items()}).encode()
            await trio.to_thread.run_sync(self._write, payload)
            self._saved = seq

    def _changed(self) -> None:
        self._changes += 1

    # ------------------------------------------------------------------ rules
    def _state(self, name: str, g: Group, broker_id: int | None, lease_ms: int = 0) -> dict:
        m = g.replicas.get(g.master) if g.master is not None else None
        return {"brokerName": name, "epoch": g.epoch, "masterId": g.master,
                "masterAddr": m.addr if m else None, "masterHaAddr": m.ha_addr if m else None,
                "syncStateSet": sorted(g.sync), "syncVersion": g.version,
                "history": g.history, "leaseMs": lease_ms, "brokerId": broker_id}

    def _elect(self, name: str, g: Group, candidate: int, now: float) -> None:
        g.epoch += 1
        g.master = candidate
        g.sync = {candidate}
        g.version += 1
        g.history.append([g.epoch, None])
        del g.history[:-MAX_HISTORY]
        g.lease_end = now + self.lease_s  # time for the new master to report in
        g.switch_to = None
        g.stuck_logged = False
        self.elections += 1
        self._changed()
        log.warning("controller: broker %s: broker id %d is master of epoch %d",
                    name, candidate, g.epoch)

    def heartbeat(self, name: str, broker_id: int, addr: str, ha_addr: str, epoch: int,
                  max_offset: int, epoch_start: int | None, slaves: dict) -> dict:
        now = trio.current_time()
        g = self.groups.get(name)
        if g is None:
            if len(self.groups) >= self.config.controller_max_broker_names:
                raise ValueError("too many broker names")
            g = self.groups[name] = Group()
        r = g.replicas.get(broker_id)
        if r is None:
            if len(g.replicas) >= MAX_REPLICAS:
                raise ValueError("too many brokers for one broker name")
            r = g.replicas[broker_id] = Replica(addr, ha_addr, now)
        r.addr, r.ha_addr, r.last_seen = addr, ha_addr, now
        r.max_offset, r.epoch = max_offset, epoch
        if g.master is None and not g.history:
            self._elect(name, g, broker_id, now)  # a new broker name: the first one writes
        lease_ms = 0
        if broker_id == g.master and epoch == g.epoch:
            r.slaves = slaves
            last = g.history[-1] if g.history else None
            if last is not None and last[0] == epoch and last[1] is None \
                    and epoch_start is not None and epoch_start >= 0:
                last[1] = epoch_start
                self._changed()
            if last is not None and last[1] is not None and g.switch_to is None:
                g.lease_end = now + self.lease_s
                lease_ms = int(self.lease_s * 1000)
        return self._state(name, g, broker_id, lease_ms)

    def alter_sync_set(self, name: str, broker_id: int, epoch: int, version: int,
                       new_set: set[int]) -> tuple[bool, dict]:
        now = trio.current_time()
        g = self.groups.get(name)
        if g is None:
            raise ValueError("unknown broker name")
        ok = (broker_id == g.master and epoch == g.epoch and version == g.version
              and broker_id in new_set and now < g.lease_end and g.switch_to is None
              and new_set <= set(g.replicas))
        if ok and new_set != g.sync:
            g.sync = set(new_set)
            g.version += 1
            self._changed()
            log.info("controller: broker %s epoch %d: in-sync set %s", name, g.epoch,
                     sorted(g.sync))
        return ok, self._state(name, g, broker_id)

    def request_switch(self, name: str, target: int | None) -> str | None:
        """A controlled switch: stop renewing the master's lease; the checker elects
        `target` (or the best in-sync slave) once the lease has run out."""
        g = self.groups.get(name)
        if g is None or g.master is None:
            return "unknown broker name or no master"
        candidates = g.sync - {g.master}
        if target is not None and target not in candidates:
            return f"broker id {target} is not an in-sync slave (in-sync: {sorted(g.sync)})"
        if not candidates:
            return "no in-sync slave to switch to"
        g.switch_to = target if target is not None else -1
        return None

    def is_master(self, name: str, addr: str) -> bool:
        """Is `addr` the current master of `name` (the name server lets it take id 0)?"""
        g = self.groups.get(name)
        r = g.replicas.get(g.master) if g is not None and g.master is not None else None
        return r is not None and r.addr == addr

    def check(self) -> None:
        """Elect where a master's lease has certainly run out."""
        now = trio.current_time()
        for name, g in self.groups.items():
            if g.master is None or now <= g.lease_end + self.margin_s:
                continue
            alive = [i for i in g.sync - {g.master}
                     if (r := g.replicas.get(i)) is not None
                     and now - r.last_seen <= self.lease_s]
            if not alive:
                if not g.stuck_logged:
                    g.stuck_logged = True
                    log.warning("controller: broker %s: master %d lost and no live in-sync "
                                "slave (in-sync: %s): no election", name, g.master,
                                sorted(g.sync))
                continue
            if g.switch_to in alive:
                best = g.switch_to
            else:
                best = max(alive, key=lambda i: (g.replicas[i].max_offset, -i))
            self._elect(name, g, best, now)

    def snapshot(self) -> dict:
        now = trio.current_time()
        out = {}
        for name, g in self.groups.items():
            st = self._state(name, g, None)
            master = g.replicas.get(g.master) if g.master is not None else None
            granted = master is not None and bool(g.history) and g.history[-1][1] is not None
            st["leaseLeftS"] = round(max(0.0, g.lease_end - now), 3) if granted else 0.0
            st["replicas"] = {
                str(i): {"addr": r.addr, "haAddr": r.ha_addr, "maxOffset": r.max_offset,
                         "epoch": r.epoch, "lastSeenS": round(now - r.last_seen, 3),
                         "role": "MASTER" if i == g.master else "SLAVE",
                         "inSync": i in g.sync,
                         **({"lagBytes": max(0, master.max_offset - r.max_offset)}
                            if master is not None and i != g.master else {}),
                         **(master.slaves.get(str(i), {}) if master is not None else {})}
                for i, r in g.replicas.items()}
            out[name] = st
        return out

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        now = trio.current_time()
        for g in self.groups.values():
            if g.lease_end == math.inf:
                g.lease_end = now + self.lease_s
        task_status.started()
        while True:
            await trio.sleep(self.config.controller_check_s)
            self.check()
            if self._changes > self._saved:
                await self._persist()

    # ------------------------------------------------------------------ remoting
    def register(self, table: ProcessorTable) -> None:
        table.register(CONTROLLER_HEARTBEAT, self._on_heartbeat)
        table.register(CONTROLLER_ALTER_SYNC_SET, self._on_alter)
        table.register(CONTROLLER_GET_STATE, self._on_get_state)
        table.register(CONTROLLER_ELECT, self._on_elect)

    async def _answer(self, cmd: RemotingCommand, state: dict,
                      code: int = ResponseCode.SUCCESS, remark: str | None = None):
        await self._persist()
        return cmd.make_response(code, remark, body=json.dumps(state).encode())

    @staticmethod
    def _name(cmd: RemotingCommand) -> str:
        name = cmd.ext_str("brokerName", required=True)
        if not name or len(name) > MAX_NAME:
            raise ValueError("bad brokerName")
        return name

    async def _on_heartbeat(self, ctx: RequestContext, cmd: RemotingCommand):
        try:
            body = json.loads(cmd.body_bytes() or b"{}")
            slaves = body.get("slaves", {}) if isinstance(body, dict) else {}
            if not isinstance(slaves, dict) or len(slaves) > MAX_REPLICAS:
                raise ValueError("bad slaves")
            start = cmd.ext_int("epochStart", -1)
            state = self.heartbeat(
                self._name(cmd), cmd.ext_int("brokerId", required=True),
                cmd.ext_str("brokerAddr", required=True)[:256],
                cmd.ext_str("haAddr", "")[:256], cmd.ext_int("epoch", 0),
                cmd.ext_int("maxOffset", -1), start if start >= 0 else None, slaves)
        except (ValueError, TypeError) as exc:
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, f"bad heartbeat: {exc}")
        return await self._answer(cmd, state)

    async def _on_alter(self, ctx: RequestContext, cmd: RemotingCommand):
        try:
            body = json.loads(cmd.body_bytes() or b"{}")
            new_set = {int(i) for i in body["syncStateSet"]}
            if len(new_set) > MAX_REPLICAS:
                raise ValueError("set too large")
            ok, state = self.alter_sync_set(
                self._name(cmd), cmd.ext_int("brokerId", required=True),
                cmd.ext_int("epoch", required=True), cmd.ext_int("syncVersion", required=True),
                new_set)
        except (ValueError, TypeError, KeyError) as exc:
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, f"bad request: {exc}")
        if not ok:
            return await self._answer(cmd, state, ResponseCode.SYSTEM_ERROR, "refused")
        return await self._answer(cmd, state)

    async def _on_get_state(self, ctx: RequestContext, cmd: RemotingCommand):
        return await self._answer(cmd, self.snapshot())

    async def _on_elect(self, ctx: RequestContext, cmd: RemotingCommand):
        try:
            name = self._name(cmd)
            target = cmd.ext_int("brokerId", -1)
        except (ValueError, TypeError) as exc:
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, str(exc))
        problem = self.request_switch(name, target if target >= 0 else None)
        if problem:
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, problem)
        return await self._answer(cmd, self.snapshot().get(name, {}))
