"""Queue allocation strategies for clustering consumers (seed 000, Java AllocateMessageQueue*).

Every member sorts the same queue list and the same member list and runs the same function,
so members agree without talking to each other. A strategy is any callable
``(group, client_id, sorted_queues, sorted_client_ids) -> queues for client_id``.

With queues q0..q3 and members c0, c1: `allocate_averagely` gives c0 [q0, q1] and c1
[q2, q3]; `allocate_averagely_by_circle` gives c0 [q0, q2] and c1 [q1, q3].
"""

from __future__ import annotations

from collections.abc import Callable

from core.client.model import MessageQueue

AllocateStrategy = Callable[[str, str, list[MessageQueue], list[str]], list[MessageQueue]]


def _check(client_id: str, mqs: list[MessageQueue], cids: list[str]) -> int | None:
    if not client_id or not mqs or client_id not in cids:
        return None
    return cids.index(client_id)


def allocate_averagely(group: str, client_id: str, mqs: list[MessageQueue],
                       cids: list[str]) -> list[MessageQueue]:
    """Contiguous blocks; the first `len(mqs) % len(cids)` members get one extra queue."""
    index = _check(client_id, mqs, cids)
    if index is None:
        return []
    n, m = len(mqs), len(cids)
    mod = n % m
    if n <= m:
        average = 1
    elif mod > 0 and index < mod:
        average = n // m + 1
    else:
        average = n // m
    start = index * average if (mod > 0 and index < mod) else index * average + mod
    count = min(average, n - start)
    return [mqs[(start + i) % n] for i in range(max(0, count))]


def allocate_averagely_by_circle(group: str, client_id: str, mqs: list[MessageQueue],
                                 cids: list[str]) -> list[MessageQueue]:
    """Round robin: member i gets queues i, i+m, i+2m ..."""
    index = _check(client_id, mqs, cids)
    if index is None:
        return []
    return mqs[index::len(cids)]


STRATEGIES: dict[str, AllocateStrategy] = {
    "averagely": allocate_averagely,
    "averagely_by_circle": allocate_averagely_by_circle,
}


def resolve_strategy(strategy: str | AllocateStrategy) -> AllocateStrategy:
    """A strategy callable from a name ("averagely", "averagely_by_circle") or a callable."""
    if callable(strategy):
        return strategy
    try:
        return STRATEGIES[strategy]
    except KeyError:
        raise ValueError(
            f"unknown allocation strategy {strategy!r}; known: {', '.join(STRATEGIES)}"
        ) from None
