"""The POP service called in process (docs/pop.md "In process"), beside the POP request
codes: a gateway running in the broker's process (`lmq serve`) pops and acknowledges
through `LocalPop` with no request, no header strings and no response to parse.

What it shares with the POP_MESSAGE processor (`core/broker/processors/pop.py`), so both
keep the same rules: `access_error` (broker, topic and group checks) and `pop_held` (a
pop, held while nothing is found, woken by the dispatch as a long poll). The hand-out, the
journal records written before the answer, the invisibility deadline, the holder and the
delivery count are the service's, as for a request. The records handed over are the
stored ones (zero copy); the caller builds each receipt handle from `PopBatch.placed` and
the pop time, as a client does from the response header.
"""

from __future__ import annotations

import trio

from core.broker.pop.handoff import RETURN, Parked, deferring
from core.broker.pop.service import (
    POP_MAX_INVISIBLE_MS,
    POP_MAX_NUMS,
    POP_MAX_POLL_MS,
    POP_MAX_POLLING,
    PopBatch,
    PopService,
    PopStateFull,
    now_ms,
)
from core.client.errors import MQBrokerError
from core.common.sysflag import PermName
from core.remoting.codes import ResponseCode

__all__ = ["LocalPop", "access_error", "param_error", "pop_held"]


def access_error(broker, group: str, topic: str):
    """(topic config, None), or (None, (response code, remark)) when the broker, the topic
    or the consumer group does not allow this pop."""
    if not PermName.is_readable(broker.config.broker_permission):
        return None, (ResponseCode.NO_PERMISSION,
                      f"the broker[{broker.broker_addr}] pop message is forbidden")
    tc = broker.topic_config_manager.get(topic)
    why = None
    if tc is None:
        why = ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!"
    elif not PermName.is_readable(tc.perm):
        why = ResponseCode.NO_PERMISSION, f"the topic[{topic}] peeking message is forbidden"
    else:
        sg = broker.subscription_group_manager.find_or_create(group)
        if sg is None:
            why = (ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                   f"subscription group [{group}] does not exist")
        elif not sg.consume_enable:
            why = ResponseCode.NO_PERMISSION, f"subscription group no permission, {group}"
    return (None, why) if why is not None else (tc, None)


def param_error(max_nums: int, invisible_ms: int) -> str | None:
    """Why a pop's `maxMsgNums` or `invisibleTime` is refused (INVALID_PARAMETER), or None."""
    if not 0 < max_nums <= POP_MAX_NUMS:
        return f"pop message's num {max_nums} is not in 1..{POP_MAX_NUMS}"
    if not 0 <= invisible_ms <= POP_MAX_INVISIBLE_MS:
        return f"invisibleTime {invisible_ms} is not in 0..{POP_MAX_INVISIBLE_MS}"
    return None


async def pop_held(service: PopService, group: str, topic: str, queue_id: int,
                   read_queue_nums: int, max_nums: int, invisible_ms: int, init_mode: int,
                   filt, holder: str | None, order: bool,
                   hold_s: float, volatile: bool = False, *,
                   hand_off=None) -> tuple[PopBatch, bool]:
    """Pop; while nothing is found, wait up to `hold_s` for a dispatch, a requeue or the
    earliest deadline of the queues asked, then pop again. (batch, polling full): True
    when POP_MAX_POLLING pops are held already (nothing was waited for). `volatile`: the
    state is not journaled (docs/pop.md "Volatile states"). Raises PopStateFull.
    `hand_off(parked, after)`: what arrives while it waits is handed to it (delivery at
    arrival, handoff.py); nothing is found when it answers RETURN."""
    deadline = trio.current_time() + hold_s
    while True:
        queue_ids = [queue_id] if queue_id >= 0 else service.rotate(read_queue_nums)
        batch = service.pop(group, topic, queue_ids, max_nums, invisible_ms, init_mode, filt,
                            holder, order, volatile)
        remaining = deadline - trio.current_time()
        if batch.count or remaining <= 0 or service.broker.closing:
            return batch, False
        if service.polling >= POP_MAX_POLLING:
            return batch, True
        due = service.next_deadline(group, topic, queue_ids)
        if due is not None:
            remaining = min(remaining, max((due - now_ms()) / 1000.0, 0.0) + 0.001)
        if hand_off is None:
            await service.wait(topic, remaining)
            continue
        parked = Parked(service.handoffs, topic, hand_off, max_nums,
                        lambda n, q=queue_ids: service.pop(group, topic, q, n, invisible_ms,
                                                           init_mode, filt, holder, order,
                                                           volatile))
        await service.wait(topic, remaining, parked)
        if parked.outcome == RETURN:
            return batch, False  # (nothing found): the caller looks at its state again
        max_nums = parked.max_nums


class LocalPop:
    """POP of one broker's service without requests (module doc): `pop` (unfiltered,
    one queue or all) and `ack` (the acknowledgements of any groups' deliveries)."""

    def __init__(self, broker) -> None:
        self.broker = broker
        self.service: PopService = broker.pop_service
        self.broker_name: str = broker.config.broker_name
        #: Pops and acknowledgement rounds served, for tests and metrics.
        self.pops = 0
        self.ack_rounds = 0

    @classmethod
    def of(cls, broker) -> LocalPop | None:
        """The in-process API of `broker`, or None when it has no POP service or runs in
        apache_strict mode (it then serves Apache's codes only: none beside them)."""
        if getattr(broker, "pop_service", None) is None or broker.config.apache_strict:
            return None
        return cls(broker)

    async def pop(self, group: str, topic: str, max_nums: int, invisible_ms: int,
                  poll_ms: int, queue_id: int, init_mode: int,
                  holder: str | None, volatile: bool = False, *,
                  hand_off=None) -> tuple[PopBatch, bool]:
        """What POP_MESSAGE would hand out (`pop_held`); MQBrokerError where it would
        answer with an error code. `volatile`: the request's `volatile` field.
        `hand_off`: see `pop_held` (delivery at arrival)."""
        bad = param_error(max_nums, invisible_ms)
        if bad is not None:
            raise self._refused(ResponseCode.INVALID_PARAMETER, bad)
        tc, err = access_error(self.broker, group, topic)
        if err is not None:
            raise self._refused(*err)
        if queue_id >= tc.read_queue_nums:
            raise self._refused(ResponseCode.INVALID_PARAMETER, f"queueId[{queue_id}] is illegal")
        self.pops += 1
        service = self.service
        order = service.orderly.wanted(group, False)
        hold_s = min(max(poll_ms, 0), POP_MAX_POLL_MS) / 1000.0
        try:
            return await pop_held(service, group, topic, queue_id, tc.read_queue_nums,
                                  max_nums, invisible_ms, init_mode, None, holder, order,
                                  hold_s, volatile, hand_off=hand_off)
        except PopStateFull as exc:
            raise self._refused(ResponseCode.SYSTEM_BUSY,
                                f"too many POP consumers: {exc}") from None

    def deferring(self, coro):
        """Await `coro` (a store call) as a deferral window: the hand-offs of the pops
        parked meanwhile run when it returns or first suspends (handoff.py)."""
        return deferring(self.broker, coro)

    def _refused(self, code: int, remark: str) -> MQBrokerError:
        return MQBrokerError(code, remark, self.broker.broker_addr)

    def ack(self, entries) -> int:
        """Acknowledge (group, topic, queue id, pop time, offsets) entries, as one
        BATCH_ACK_MESSAGE would (entries not current are skipped); one journal write. How
        many were acknowledged. Unlike the request it does not wait for a SYNC_MASTER's
        slave (docs/pop.md "In process")."""
        self.ack_rounds += 1
        service = self.service
        done = 0
        try:
            for group, topic, qid, pop_time, offsets in entries:
                done += service.ack_offsets(group, topic, qid, offsets, pop_time)
        finally:
            service.journal.flush()
        return done
