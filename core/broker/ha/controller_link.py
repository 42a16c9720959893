"""A broker's side of the HA controller (docs/ha.md, "Failover").

Every `controller_heartbeat_s` the broker reports itself (id, addresses, epoch, CommitLog
end) to the controller and learns who the master of its broker name is. As master it
gets a write lease: `lease_until` = when the heartbeat was *sent* + the granted lease, so
it runs out here before the controller's copy does. It proposes the in-sync set from its
slaves' reports. As a slave it follows the master the controller names.

The local epoch (`<data_dir>/ha_epoch`) is the epoch of the newest data in the
CommitLog: written when the broker becomes master, or when it starts taking data from a
master of a newer epoch. With the controller's epoch history it says where this broker's
data leaves the common history: the start of the first epoch after its own. A deposed
master (or a slave holding data no later master has) cuts its CommitLog there, at a
restart (`core/store/ha/truncate.py`).
"""

from __future__ import annotations

import json
import logging
import os

import trio

from core.broker.ha.pop_sync import reload_pop_state
from core.remoting.codec import RemotingCommand
from core.remoting.codes import RequestCode
from core.remoting.errors import RemotingError

log = logging.getLogger(__name__)

CONTROLLER_HEARTBEAT = RequestCode.CONTROLLER_HEARTBEAT  # core/namesrv/controller.py
CONTROLLER_ALTER_SYNC_SET = RequestCode.CONTROLLER_ALTER_SYNC_SET

EPOCH_FILE = "ha_epoch"
_STATE_KEYS = ("epoch", "masterId", "syncStateSet", "syncVersion", "history")

#: What a deposed broker does when it has no `restart_hook` of its own: `lmq broker`
#: sets a clean stop followed by a re-exec; embedded brokers just stop.
PROCESS_RESTART_HOOK = None


def truncate_point(history: list, local_epoch: int) -> int | None:
    """Where data of epochs up to `local_epoch` ends in the common history: the start of
    the first later epoch (None: no later epoch, nothing to cut)."""
    for epoch, start in history:
        if epoch > local_epoch and start is not None:
            return int(start)
    return None


class ControllerLink:
    def __init__(self, broker) -> None:
        self.broker = broker
        self.config = broker.config
        self.path = os.path.join(self.config.data_dir, EPOCH_FILE)
        self.local_epoch = self._read_epoch()
        self.epoch = 0  # the current epoch as last heard
        self.role = "UNKNOWN"  # MASTER | SLAVE | UNKNOWN
        self.lease_until = 0.0
        self.epoch_start: int | None = None  # master: where our epoch's data starts
        self.master_id: int | None = None
        self.master_addr: str | None = None
        self.sync_set: set[int] = set()
        self.sync_version = 0
        self.history: list = []
        self.pending_adds: dict[int, int] = {}  # id -> set version it was proposed at
        self.heartbeats = 0
        self.failures = 0
        self.restart_requested = False
        self._short_lease_logged = False
        self._was_writable = False

    # ------------------------------------------------------------------ epoch file
    def _read_epoch(self) -> int:
        try:
            with open(self.path, encoding="utf-8") as fh:
                return int(fh.read().strip() or 0)
        except FileNotFoundError:
            return 0

    def _write_epoch(self, epoch: int) -> None:
        os.makedirs(self.config.data_dir, exist_ok=True)
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(str(epoch))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)
        self.local_epoch = epoch

    async def adopt_epoch(self, epoch: int) -> None:
        await trio.to_thread.run_sync(self._write_epoch, epoch)

    # ------------------------------------------------------------------ queries
    def can_write(self) -> bool:
        return self.role == "MASTER" and trio.current_time() < self.lease_until

    def check_slave(self, slave_epoch: int, slave_offset: int) -> str | None:
        """Master: why this slave must not take our stream, or None."""
        if self.role != "MASTER":
            return "not the master"
        if slave_epoch > self.epoch:
            return f"slave epoch {slave_epoch} is newer than ours ({self.epoch})"
        cut = truncate_point(self.history, slave_epoch)
        if cut is not None and slave_offset > cut:
            return f"slave holds data past {cut} that this master does not: it must truncate"
        return None

    # ------------------------------------------------------------------ requests
    def _heartbeat_cmd(self, max_offset: int) -> RemotingCommand:
        cfg = self.config
        b = self.broker
        ext = {"brokerName": cfg.broker_name, "brokerId": str(cfg.broker_id),
               "brokerAddr": b.broker_addr, "haAddr": f"{cfg.advertised_ip}:{b.ha_port}",
               "epoch": str(self.local_epoch), "maxOffset": str(max_offset)}
        if self.role == "MASTER" and self.epoch_start is not None:
            ext["epochStart"] = str(self.epoch_start)
        body = {"slaves": self._slave_figures()} if self.role == "MASTER" else {}
        return RemotingCommand.request(CONTROLLER_HEARTBEAT, ext, json.dumps(body).encode())

    def _slave_figures(self) -> dict:
        ha = self.broker.ha_master
        if ha is None:
            return {}
        end = self.broker.store.max_physical_offset
        now = trio.current_time()
        out = {}
        for cid, off in ha.slaves.items():
            sid = ha.slave_ids.get(cid)
            caught = ha.caught_up_at.get(cid)
            out[str(sid)] = {"lagBytes": max(0, end - off),
                             "lagS": 0.0 if off >= end else
                             round(now - caught, 3) if caught is not None else None}
        return out

    async def _invoke(self, cmd: RemotingCommand) -> dict | None:
        client = self.broker.client
        if client is None:
            return None
        problem = None
        try:
            resp = await client.invoke(self.config.controller_addr, cmd,
                                       self.config.controller_heartbeat_s * 2)
            state = json.loads(resp.body) if resp.body else None
            if not isinstance(state, dict) or not all(k in state for k in _STATE_KEYS):
                problem = f"code {resp.code}: {resp.remark}"
        except (RemotingError, OSError, ValueError) as exc:
            problem = repr(exc)
        if problem is not None:
            # Logged once per outage (every heartbeat would flood the log).
            self.failures += 1
            if self.failures == 1:
                log.warning("HA controller %s: no usable answer (%s)",
                            self.config.controller_addr, problem)
            return None
        if self.failures:
            log.info("HA controller %s answers again", self.config.controller_addr)
        self.failures = 0
        return state

    async def bootstrap(self, client) -> None:
        """Before the store opens: learn the role and cut data no later master has."""
        from core.store.ha.truncate import truncate_commitlog

        cfg = self.config
        self.broker.client = client
        try:
            while True:
                state = await self._invoke(self._heartbeat_cmd(-1))
                if state is not None:
                    break
                await trio.sleep(cfg.controller_heartbeat_s)
        finally:
            self.broker.client = None
        self._take(state)
        if state["masterId"] != cfg.broker_id:
            cut = truncate_point(self.history, self.local_epoch)
            if cut is not None:
                n = await trio.to_thread.run_sync(
                    truncate_commitlog, cfg.data_dir, cfg.commitlog_file_size, cut)
                if n:
                    log.warning("HA: CommitLog cut at %d (epoch %d ended there; ours is %d)",
                                cut, next(e for e, _ in self.history if e > self.local_epoch),
                                self.local_epoch)

    def _take(self, state: dict) -> None:
        self.epoch = int(state["epoch"])
        self.master_id = state["masterId"]
        self.master_addr = state.get("masterHaAddr")
        self.history = state.get("history") or []
        version = int(state["syncVersion"])
        self.sync_set = set(state["syncStateSet"])
        self.sync_version = version
        for i, v in list(self.pending_adds.items()):
            if version > v or i in self.sync_set:
                del self.pending_adds[i]

    # ------------------------------------------------------------------ loop
    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            if not await self.beat():
                await trio.sleep(self.config.controller_heartbeat_s)

    async def beat(self) -> bool:
        """One heartbeat; True when another should follow at once (just promoted)."""
        broker = self.broker
        writable = self.can_write()
        if writable != self._was_writable:
            # Lease lost (controller unreachable, switch) or won: routes list us as
            # brokerId 0 only while we may write.
            self._was_writable = writable
            broker.request_register()
        sent = trio.current_time()
        state = await self._invoke(self._heartbeat_cmd(broker.store.max_physical_offset))
        if state is None:
            return False
        self.heartbeats += 1
        self._take(state)
        me = self.config.broker_id
        if state["masterId"] == me:
            if self.role != "MASTER":
                await self._promote()
                return self.role == "MASTER"  # report where our epoch starts at once
            lease_ms = int(state.get("leaseMs") or 0)
            if lease_ms > 0 and self.local_epoch == self.epoch:
                if lease_ms / 1000.0 <= 2 * self.config.controller_heartbeat_s \
                        and not self._short_lease_logged:
                    self._short_lease_logged = True
                    log.warning("HA: the controller's lease (%d ms) is not more than two "
                                "heartbeats (controller_heartbeat_s %.1f): writes will "
                                "pause", lease_ms, self.config.controller_heartbeat_s)
                had = self.can_write()
                self.lease_until = max(self.lease_until, sent + lease_ms / 1000.0)
                if not had:
                    log.info("HA: write lease held (epoch %d)", self.epoch)
                    broker.request_register()  # as brokerId 0 now
            await self._update_sync_set()
            self._apply_ack_set()
            return False
        # Somebody else writes for this broker name.
        if self.role == "MASTER":
            self.lease_until = 0.0
            log.warning("HA: deposed (epoch %d, master is broker id %s): restarting as a "
                        "slave", self.epoch, state["masterId"])
            self._restart()
            return False
        cut = truncate_point(self.history, self.local_epoch)
        if cut is not None and broker.store.max_physical_offset > cut:
            log.warning("HA: our data goes past %d, where epoch %d's master started: "
                        "restarting to cut it", cut, self.epoch)
            self._restart()
            return False
        if self.role != "SLAVE":
            self.role = "SLAVE"
            broker.request_register()
        if broker.ha_slave is not None:
            broker.ha_slave.retarget(self.master_addr)
        return False

    def _restart(self) -> None:
        self.role = "UNKNOWN"
        self.restart_requested = True
        self.broker.restart()

    async def _promote(self) -> None:
        broker = self.broker
        cut = truncate_point(self.history[:-1], self.local_epoch)
        if cut is not None and broker.store.max_physical_offset > cut:
            log.error("HA: elected, but our data goes past %d: not taking writes", cut)
            return
        if broker.ha_slave is not None:
            broker.ha_slave.stop()
        start = self.history[-1][1] if self.history and self.history[-1][0] == self.epoch \
            else None
        self.epoch_start = broker.store.max_physical_offset if start is None else int(start)
        await self.adopt_epoch(self.epoch)
        self.role = "MASTER"
        self._apply_ack_set()  # SYNC sends wait for the in-sync set from the start
        log.warning("HA: master of %s for epoch %d from offset %d", self.config.broker_name,
                    self.epoch, self.epoch_start)
        reload_pop_state(broker)  # POP acks the old master sent us (pop_sync.py)
        broker.on_promoted()

    def _in_sync(self) -> set[int]:
        """Connected slaves within `ha_max_gap_bytes` of our end."""
        ha = self.broker.ha_master
        if ha is None:
            return set()
        floor = self.broker.store.max_physical_offset - self.config.ha_max_gap_bytes
        if self.broker.sync_master:
            floor = max(floor, ha.acked_high)  # must hold every acknowledged message
        return {ha.slave_ids[cid] for cid, off in ha.slaves.items()
                if off >= floor and cid in ha.slave_ids}

    async def _update_sync_set(self) -> None:
        me = self.config.broker_id
        desired = {me} | self._in_sync()
        if desired == self.sync_set:
            return
        for i in desired - self.sync_set:
            self.pending_adds[i] = self.sync_version
        self._apply_ack_set()  # new members count for acknowledgements from now on
        ext = {"brokerName": self.config.broker_name, "brokerId": str(me),
               "epoch": str(self.epoch), "syncVersion": str(self.sync_version)}
        body = json.dumps({"syncStateSet": sorted(desired)}).encode()
        state = await self._invoke(RemotingCommand.request(CONTROLLER_ALTER_SYNC_SET, ext, body))
        if state is not None:
            self._take(state)

    def _apply_ack_set(self) -> None:
        ha = self.broker.ha_master
        if ha is not None:
            ha.set_ack_ids((self.sync_set | set(self.pending_adds)) - {self.config.broker_id})
