"""The broker link's store request framed in C (core/_speedups.c batch_body / offset_ids,
gateway/mqtt/store_request.py): the same bytes and offsets as the Python reference, the
body the broker's batch decoder reads back, and refusals instead of overruns."""

from __future__ import annotations

import os
import random

import pytest

from core.common.codec import decode_batch
from gateway.mqtt import store_request
from gateway.mqtt.store_request import batch_body_py, offset_ids_py

try:
    from core._speedups import batch_body as c_batch_body
    from core._speedups import offset_ids as c_offset_ids
except ImportError:  # not built
    c_batch_body = c_offset_ids = None

needs_c = pytest.mark.skipif(c_batch_body is None, reason="core._speedups not built")


def _hexid(rng: random.Random, offset: int) -> str:
    host = rng.choice(["7F00000100002A9F", "00000000000000000000000000000001" + "00002A9F"])
    return host + f"{offset:016X}"


@pytest.mark.parametrize("impl", ["py", "c"])
def test_the_batch_body_reads_back(impl: str) -> None:
    if impl == "c" and c_batch_body is None:
        pytest.skip("core._speedups not built")
    build = batch_body_py if impl == "py" else c_batch_body
    payloads = [b"", b"x", bytes(range(256)) * 3]
    props = [b"a\x01b\x02", b"", "t\x01ü\x02".encode()]
    body = build(payloads, props)
    got = decode_batch(body)
    assert [m.body for m in got] == payloads
    assert [m.properties.encode() for m in got] == props


@needs_c
def test_c_batch_body_is_the_reference() -> None:
    rng = random.Random(7)
    for _ in range(200):
        n = rng.randrange(0, 20)
        payloads = [rng.randbytes(rng.randrange(0, 600)) for _ in range(n)]
        props = [rng.randbytes(rng.randrange(0, 300)) for _ in range(n)]
        assert c_batch_body(payloads, props) == batch_body_py(payloads, props)


@needs_c
@pytest.mark.parametrize("build", [batch_body_py, c_batch_body])
def test_batch_body_refusals(build) -> None:
    with pytest.raises(ValueError):
        build([b"a"], [])
    with pytest.raises(ValueError):
        build([b"a"], [bytes(32768)])
    assert build([b"a"], [bytes(32767)]) == batch_body_py([b"a"], [bytes(32767)])
    if build is c_batch_body:
        with pytest.raises(TypeError):
            build([bytearray(b"a")], [b""])
        with pytest.raises(TypeError):
            build((b"a",), [b""])


@needs_c
def test_c_offset_ids_is_the_reference() -> None:
    rng = random.Random(3)
    for _ in range(300):
        n = rng.randrange(1, 12)
        offsets = [rng.randrange(0, 2**64) for _ in range(n)]
        ids = [_hexid(rng, o) for o in offsets]
        if rng.random() < 0.3:  # damage one: wrong hex digit, cut short, lower case
            k = rng.randrange(n)
            ids[k] = rng.choice([ids[k][:-1] + "G", ids[k][-15:], ids[k].lower(),
                                 ids[k][:-1] + " "])
        text = ",".join(ids)
        for want in (n, n - 1, n + 1):
            assert c_offset_ids(text, want) == offset_ids_py(text, want), (text, want)
    assert c_offset_ids(",".join(_hexid(rng, o) for o in (5, 2**64 - 1)), 2) == [5, 2**64 - 1]
    for text in ("", ",", "0" * 16 + ",", "," + "0" * 16):
        assert c_offset_ids(text, 1) == offset_ids_py(text, 1)
        assert c_offset_ids(text, 2) == offset_ids_py(text, 2)
    with pytest.raises(TypeError):
        c_offset_ids(b"00", 1)


@pytest.mark.skipif(os.environ.get("LMQ_PURE_PYTHON", "") not in ("", "0"),
                    reason="LMQ_PURE_PYTHON set")
def test_the_link_uses_the_c_framing_when_built() -> None:
    if c_batch_body is not None:
        assert store_request.batch_body is c_batch_body
        assert store_request.offset_ids is c_offset_ids


def test_a_batchs_properties_are_each_messages_own_across_runs() -> None:
    # StoredProperties.parts looks a run's string up once: any field that differs from
    # the message before (topic, QoS, retain, sender, LMQs, v5 properties, expiry)
    # must give that message its own string, as a lookup per message does.
    from types import SimpleNamespace

    from gateway.mqtt.message import MqttMessage
    from gateway.mqtt.packets import Properties
    from gateway.mqtt.store_request import StoredProperties

    a, b = ("%LMQ%a",), ("%LMQ%a", "%LMQ%b")
    msgs = [
        (MqttMessage("t/1", b"x", 0, False, sender="c1"), a),
        (MqttMessage("t/1", b"y", 0, False, sender="c1"), a),
        (MqttMessage("t/1", b"y", 1, False, sender="c1"), a),
        (MqttMessage("t/1", b"y", 1, True, sender="c1"), a),
        (MqttMessage("t/1", b"y", 1, True, sender="c2"), a),
        (MqttMessage("t/1", b"y", 1, True, sender="c2"), b),
        (MqttMessage("t/2", b"y", 1, True, sender="c2"), b),
        (MqttMessage("t/2", b"y", 1, True, Properties(content_type="j"), sender="c2"), b),
        (MqttMessage("t/2", b"y", 1, True, Properties(content_type="k"), sender="c2"), b),
        (MqttMessage("t/2", b"y", 1, True, expiry_at=10**13, sender="c2"), b),
        (MqttMessage("t/2", b"y", 1, True, expiry_at=10**13 + 1000, sender="c2"), b),
        (MqttMessage("t/2", b"z", 1, True, sender="c2"), b),
    ]
    reqs = [SimpleNamespace(msg=m, lmqs=lmqs) for m, lmqs in msgs]
    payloads, props = StoredProperties().parts(reqs)
    assert payloads == [m.payload for m, _ in msgs]
    assert props == [StoredProperties().of(m, lmqs) for m, lmqs in msgs]
    assert len(set(props)) == len(props) - 2  # the two runs of equal messages share one
