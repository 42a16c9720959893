"""MessageStore.lmq_dispatch_listener: a put or batch multi-dispatched to N LMQs tells
its listener once, with every LMQ and its new max offset (the broker wakes their readers
in one pass, core/broker/arrival.py); without it, dispatch_listener is called per LMQ."""

from __future__ import annotations

from core.common.codec import BatchItem, encode_batch
from core.common.message import MessageBatch
from tests.core.store.conftest import lmq_msg

NAMES = [f"%LMQ%arr{i}" for i in range(40)]


def _recording(store):
    per_queue: list[tuple[str, int, int]] = []
    per_put: list[dict[str, int]] = []
    store.dispatch_listener = lambda t, q, mx: per_queue.append((t, q, mx))
    store.lmq_dispatch_listener = lambda names, mxs: per_put.append({n: mxs[n] for n in names})
    return per_queue, per_put


def test_store_tells_the_lmqs_of_a_put_in_one_call(open_store):
    store = open_store()
    per_queue, per_put = _recording(store)
    assert store.put(lmq_msg(NAMES, topic="T")).status.name == "OK"
    assert per_put == [dict.fromkeys(NAMES, 1)]
    assert per_queue == [("T", 0, 1)]  # the message's own queue only
    body = encode_batch([BatchItem(0, b"x", "INNER_MULTI_DISPATCH\x01" + ",".join(NAMES))] * 5)
    batch = MessageBatch("T", 0, body, "", born_timestamp=1, born_host=bytes(8))
    assert store.put_batch(batch).status.name == "OK"
    assert per_put[1:] == [dict.fromkeys(NAMES, 6)]  # one wake-up per LMQ, final offsets
    assert per_queue[1:] == [("T", 0, 6)]
    # A batch of InnerMessages (the Python planning) too.
    assert store.put_batch([lmq_msg(NAMES, topic="T") for _ in range(3)]).status.name == "OK"
    assert per_put[2:] == [dict.fromkeys(NAMES, 9)]
    assert per_queue[2:] == [("T", 0, 9)]
    # Without the LMQ listener the same wake-ups come one call per LMQ.
    store.lmq_dispatch_listener = None
    per_queue.clear()
    store.put(lmq_msg(NAMES, topic="T"))
    assert per_queue == [("T", 0, 10)] + [(n, 0, 10) for n in NAMES]
