"""A batch send looks for DELAY and the reserved INNER_MULTI_ properties in its messages'
properties only (speedups.batch_props_have), not in their bodies: a body that mentions
them keeps the store's split (no object per message), and the refusals are unchanged."""

from __future__ import annotations

import random

import pytest

import core.broker.processors.send as send_mod
from core.common.codec import BatchItem, encode_batch
from core.store import speedups_py as ref
from tests.core.broker.harness import batch_body, run_embedded, send_request

try:
    import core._speedups as c
except ImportError:  # pragma: no cover - test_speedups says the extension must be built
    c = None

needs_c = pytest.mark.skipif(c is None, reason="core._speedups not built")
MARKS = (b"DELAY\x01", b"INNER_MULTI_", b"", b"\x01")


@needs_c
def test_c_answers_as_the_reference():
    rng = random.Random(11)
    words = ["DELAY", "INNER_MULTI_DISPATCH", "UNIQ_KEY", "TAGS", "X"]
    for _ in range(300):
        items = []
        for _ in range(rng.randrange(0, 5)):
            pairs = [f"{rng.choice(words)}\x01{rng.choice(words)}" for _ in range(rng.randrange(3))]
            body = rng.choice([b"", b"DELAY\x01", b"INNER_MULTI_x", rng.randbytes(50)])
            items.append(BatchItem(0, body, "\x02".join(pairs)))
        raw = encode_batch(items)
        cut = rng.choice([raw, raw[: rng.randrange(len(raw) + 1)], raw + rng.randbytes(7)])
        for mark in MARKS:
            assert c.batch_props_have(cut, mark) == ref.batch_props_have(cut, mark), (cut, mark)
    body = encode_batch([BatchItem(0, b"DELAY\x01", "A\x01b")])
    assert c.batch_props_have(body, b"DELAY\x01") == 0
    assert c.batch_props_have(body[:-1], b"DELAY\x01") == -1
    for bad in ((bytearray(body), b"x"), (body, "x"), (body,)):
        with pytest.raises(TypeError):
            c.batch_props_have(*bad)


@pytest.mark.skipif(send_mod.batch_props_have is None, reason="core._speedups not in use")
def test_marks_in_bodies_keep_the_store_split(tmp_path, monkeypatch):
    decoded = []
    real = send_mod.decode_batch
    monkeypatch.setattr(send_mod, "decode_batch", lambda b: decoded.append(1) or real(b))

    async def body(server, client):
        addr = server.broker.broker_addr

        async def send(raw, **kw):
            return await client.invoke(addr, send_request("BatchM", raw, code=320, **kw))

        mentions = batch_body([(b"DELAY\x01 INNER_MULTI_DISPATCH\x01%LMQ%x", {"UNIQ_KEY": "U1"}),
                               (b"b", {"TAGS": "t"})])
        assert (await send(mentions)).code == 0
        assert decoded == []  # split by the store, not decoded by the processor
        # Properties still decide, whatever the bodies hold.
        delayed = batch_body([(b"a", {}), (b"b", {"DELAY": "3"})])
        resp = await send(delayed)
        assert (resp.code, resp.remark) == (13, "batch message does not support delay")
        reserved = batch_body([(b"a", {}), (b"b", {"INNER_MULTI_DISPATCH": "%LMQ%x"})])
        resp = await send(reserved)
        assert resp.code != 0 and "INNER_MULTI_DISPATCH" in resp.remark
        assert (await send(batch_body([(b"a", {"DELAY": "0"})]))).code == 0
        resp = await send(mentions[:-3])
        assert resp.code == 13 and resp.remark.startswith("bad batch body: ")

    run_embedded(body, tmp_path)
