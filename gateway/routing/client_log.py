"""Client-id registry shared by the gateways: who holds a client id now (session takeover
across gateways, MQTT-3.1.4-3; docs/stateless-gateways.md).

One system topic, ``LMQ_GW_CLIENTS`` (one queue, on the route log's broker). A gateway
that accepts a connection for a client id appends ``{c: client id, g: gateway id, k:
clean start}`` (`announce`, SEND_MESSAGE_V2) and remembers the record's queue offset for
that connection. Every gateway tails the topic (long-polling PULL_MESSAGE); a record for a
client id it has connected, from another gateway, at an offset after the one of its own
connection means the client connected elsewhere later: `on_taken(client_id, offset,
clean_start)` closes the old connection. Log order decides between two gateways that accept the same id at once: the
later record wins on both sides.

A lone gateway need not announce (nobody could take its clients over); a gateway that
never announced a connection treats any record from another gateway as newer, so a peer
that joins later still takes over its clients. Records are read from the end of the topic
at start (nothing to rebuild); the topic is cut by the broker's retention.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable

import trio

from core.client import ClientInstance, MessageQueue, PullStatus
from core.client.errors import MQClientError
from core.common.sysflag import PullSysFlag
from core.remoting.errors import RemotingError
from gateway.routing.master_follow import MasterFollower

__all__ = ["ClientLog", "MAX_RECORD_BYTES"]

log = logging.getLogger(__name__)

#: A record larger than this is skipped (an MQTT client id is at most 65535 bytes; ours
#: are bounded by `max_client_id_length`, far below).
MAX_RECORD_BYTES = 64 * 1024


class ClientLog:
    """One gateway's view of the client-id registry (see the module doc)."""

    def __init__(self, client: ClientInstance, broker_addr: str, broker_name: str,
                 gateway_id: str, on_taken: Callable[[str, int, bool], None], *,
                 topic: str = "LMQ_GW_CLIENTS", group: str = "LMQ_GW_CLIENTS",
                 pull_suspend_ms: int = 15_000, pull_batch: int = 32,
                 retry_delay_s: float = 0.5) -> None:
        self.client = client
        #: the master of `broker_name`, followed across a failover (re-read on a failure)
        self.master = MasterFollower(client, broker_name, broker_addr,
                                     min_interval_s=retry_delay_s)
        self.broker_name = broker_name
        self.gateway_id = gateway_id
        self.on_taken = on_taken
        self.topic = topic
        self.group = group
        self.pull_suspend_ms = pull_suspend_ms
        self.pull_batch = pull_batch
        self.retry_delay_s = retry_delay_s
        self._offset = 0
        #: records read so far
        self.read = 0

    @property
    def addr(self) -> str:
        return self.master.addr

    @addr.setter
    def addr(self, value: str) -> None:
        self.master.addr = value

    async def announce(self, client_id: str, clean_start: bool) -> int:
        """Record that `client_id` connected here; the record's offset."""
        body = json.dumps({"c": client_id, "g": self.gateway_id, "k": int(clean_start)},
                          separators=(",", ":")).encode()
        ext = {"a": self.group, "b": self.topic, "c": "TBW102", "d": "1", "e": "0", "f": "0",
               "g": str(int(time.time() * 1000)), "h": "0", "i": "", "j": "0",
               "k": "false", "m": "false"}
        mq = MessageQueue(self.topic, self.broker_name, 0)
        try:
            result = await self.client.api.send_message(self.addr, mq, ext, body,
                                                        batch=False, uniq_id="")
        except (MQClientError, RemotingError, OSError):
            if not await self.master.reresolve():
                raise
            # The master moved (failover): once more, to the new one.
            result = await self.client.api.send_message(self.addr, mq, ext, body,
                                                        batch=False, uniq_id="")
        assert result is not None
        return result.queue_offset

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        await self.client.api.create_topic(self.addr, self.topic, 1, 1)
        self._offset = await self.client.api.get_max_offset(self.addr, self.topic, 0)
        task_status.started()
        flag = str(int(PullSysFlag.SUBSCRIPTION | PullSysFlag.SUSPEND))
        while True:
            ext = {"consumerGroup": self.group, "topic": self.topic, "queueId": "0",
                   "queueOffset": str(self._offset), "maxMsgNums": str(self.pull_batch),
                   "sysFlag": flag, "commitOffset": "0",
                   "suspendTimeoutMillis": str(self.pull_suspend_ms), "subscription": "*",
                   "subVersion": "0", "expressionType": "TAG"}
            try:
                got = await self.client.api.pull_message(
                    self.addr, ext,
                    self.pull_suspend_ms / 1000 + self.client.config.request_timeout)
            except (MQClientError, RemotingError, OSError) as exc:
                log.warning("client registry pull failed: %s", exc)
                if not await self.master.reresolve():
                    await trio.sleep(self.retry_delay_s)
                continue
            if got.status is PullStatus.FOUND:
                for msg in got.messages:
                    self._record(msg.body, msg.queue_offset)
            if got.status in (PullStatus.FOUND, PullStatus.OFFSET_ILLEGAL):
                self._offset = max(self._offset, got.next_begin_offset)

    def _record(self, body: bytes, offset: int) -> None:
        self.read += 1
        if len(body) > MAX_RECORD_BYTES:
            return
        try:
            rec = json.loads(body)
            client_id, gateway, clean = rec["c"], rec["g"], bool(rec.get("k", 1))
        except (ValueError, KeyError, TypeError, AttributeError):
            return
        if not isinstance(client_id, str) or gateway == self.gateway_id:
            return
        try:
            self.on_taken(client_id, offset, clean)
        except Exception:
            log.exception("session takeover of a client failed")
