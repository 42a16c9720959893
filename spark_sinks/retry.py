"""Riding out a lost broker (docs/spark.md, "When a broker fails").

A request that fails because its broker cannot be reached (connection refused or reset,
no answer in time) or because the broker it reached no longer writes for its name (a
slave answering SERVICE_NOT_AVAILABLE during a failover) is tried again: the addresses
of every broker name are re-read from the name servers first (in controller mode the
new master of a name is listed as brokerId 0 a few seconds after the old one died), then
the request is repeated after a backoff, until `lmq.retryTimeoutMs` has passed since the
first failure. Then the last error is raised and Spark fails the task (or the query) as
before. Anything else (a refused option, a message the broker rejects) is not retried.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from core.client.errors import MQBrokerError, MQClientError
from core.remoting.codes import ResponseCode
from core.remoting.errors import RemotingError

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Default of `lmq.retryTimeoutMs`: longer than a controller election (~4 s, docs/ha.md)
#: plus a name-server refresh, short enough that a cluster really gone fails the query.
DEFAULT_RETRY_TIMEOUT_MS = 30_000
#: First pause between attempts, doubled up to BACKOFF_MAX_S.
BACKOFF_FIRST_S = 0.2
BACKOFF_MAX_S = 2.0

#: Broker answers that mean "this broker does not write for its name now".
_MOVED_CODES = frozenset({ResponseCode.SERVICE_NOT_AVAILABLE, ResponseCode.SYSTEM_BUSY})


def retryable(exc: BaseException) -> bool:
    """Is `exc` a lost or moved broker (worth re-reading the addresses and trying again)?
    A group of errors (requests sent side by side) is when each of its errors is."""
    if isinstance(exc, BaseExceptionGroup):
        return all(retryable(e) for e in exc.exceptions)
    if isinstance(exc, (RemotingError, OSError)):
        return True
    if isinstance(exc, MQBrokerError):
        return exc.code in _MOVED_CODES
    if isinstance(exc, MQClientError):
        # The client's own wrapping of a connection failure, or a broker name whose
        # master is not listed (yet).
        text = str(exc)
        return "connect" in text or "not exist" in text or "no broker" in text
    return False


async def reresolve(instance) -> None:
    """Re-read every broker name's addresses and the routes this client knows."""
    info = await instance.api.get_cluster_info()
    for name, bd in info.brokers.items():
        addrs = dict(bd.broker_addrs)
        if addrs:
            instance.broker_addrs[name] = addrs
            if name in instance.pinned_brokers:
                instance.pinned_brokers[name] = dict(addrs)
    for topic in list(instance.routes):
        try:
            await instance.update_route(topic)
        except (MQClientError, RemotingError, OSError) as exc:
            log.debug("route of %s not re-read: %r", topic, exc)


def call_retrying(client, budget_s: float, what: str, attempt: Callable[[int], T], *,
                  sleep: Callable[[float], None] = time.sleep,
                  clock: Callable[[], float] = time.monotonic) -> T:
    """``attempt(n)`` (a blocking call; n = 0, 1, ...), tried again on a lost or moved
    broker (see the module doc) for up to `budget_s` seconds after the first failure,
    with the brokers' addresses re-read before each new attempt."""
    deadline = None
    pause = BACKOFF_FIRST_S
    n = 0
    while True:
        try:
            return attempt(n)
        except Exception as exc:
            if not retryable(exc):
                raise
            now = clock()
            if deadline is None:
                deadline = now + budget_s
                log.warning("lmq: %s failed (%s); retrying for up to %.0f s", what, exc,
                            budget_s)
            if now >= deadline:
                raise
            sleep(min(pause, max(0.0, deadline - now)))
            pause = min(pause * 2, BACKOFF_MAX_S)
            n += 1
            try:
                client.call(reresolve, client.instance)
            except Exception as again:  # noqa: BLE001 - name servers down too: next round
                log.debug("lmq: re-reading the brokers failed: %r", again)


def retrying(client, budget_s: float, what: str, afn, *args: Any) -> Any:
    """``client.call(afn, *args)`` with `call_retrying` (for requests safe to repeat)."""
    return call_retrying(client, budget_s, what, lambda _n: client.call(afn, *args))
