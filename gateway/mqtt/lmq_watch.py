"""Watching an LMQ that other gateways write too (several gateways on one cluster).

A gateway cannot predict the offsets of an LMQ others write (broker_link.py), so its
readers would not learn of those writes: one long-polling PULL_MESSAGE per (broker, LMQ)
that a connected session reads, from the end known so far (maxMsgNums 1, suspended up to
`WATCH_SUSPEND_MS`), raises the state's `top` and `version` and wakes the readers when an
entry arrives, whichever gateway wrote it. It ends when nobody reads the LMQ any more.
"""

from __future__ import annotations

import logging
from typing import Any

import trio

from core.client.errors import MQClientError
from core.common.sysflag import PullSysFlag
from core.remoting.codes import RequestCode, ResponseCode
from core.remoting.errors import RemotingError
from gateway.mqtt.lmq_state import LmqState

__all__ = ["WATCH_RETRY_S", "WATCH_SUSPEND_MS", "watch_lmq"]

log = logging.getLogger(__name__)

#: Suspension of a watch pull: it returns at once when the LMQ gets an entry, else after
#: this long and is sent again.
WATCH_SUSPEND_MS = 15_000
#: Pause after a failed watch pull.
WATCH_RETRY_S = 1.0
#: Answer time allowed on top of the suspension.
WATCH_MARGIN_S = 5.0
_WATCH_FLAGS = str(int(PullSysFlag.SUBSCRIPTION | PullSysFlag.SUSPEND))
_WATCH_OK = (ResponseCode.SUCCESS, ResponseCode.PULL_NOT_FOUND,
             ResponseCode.PULL_RETRY_IMMEDIATELY, ResponseCode.PULL_OFFSET_MOVED)


async def watch_lmq(link: Any, st: LmqState, watched: set[tuple[str, str]]) -> None:
    """Long-poll `st`'s LMQ at its known end while someone reads it; each new entry
    (whichever gateway wrote it) raises `top` and wakes the readers."""
    key = (st.broker, st.lmq)
    ext = {"consumerGroup": link.config.pull_group, "topic": st.lmq, "queueId": "0",
           "maxMsgNums": "1", "sysFlag": _WATCH_FLAGS, "commitOffset": "0",
           "suspendTimeoutMillis": str(WATCH_SUSPEND_MS), "subscription": "*",
           "subVersion": "0", "expressionType": "TAG"}
    timeout = WATCH_SUSPEND_MS / 1000 + WATCH_MARGIN_S
    try:
        while st.watchers and link.states.get(key) is st:
            ext["queueOffset"] = str(st.top)
            try:
                resp = await link.client.api.call(link.addr(st.broker),
                                                  RequestCode.PULL_MESSAGE, dict(ext),
                                                  timeout=timeout, ok=_WATCH_OK)
            except (MQClientError, RemotingError, OSError, trio.TooSlowError) as exc:
                log.debug("watch pull of %s@%s failed: %r", st.lmq, st.broker, exc)
                await trio.sleep(WATCH_RETRY_S)
                continue
            top = resp.ext_int("maxOffset", 0)
            if resp.code == ResponseCode.PULL_NOT_FOUND and top <= st.top:
                continue  # suspension ran out
            if top > st.top:
                st.top = top
            st.version += 1
            for w in list(st.watchers):
                w.wake()
            if top <= int(ext["queueOffset"]):
                await trio.sleep(WATCH_RETRY_S)  # offset moved under us: do not spin
    finally:
        watched.discard(key)
