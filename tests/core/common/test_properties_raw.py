"""find_property / drop_property agree with decode_properties on any encoded string."""

from __future__ import annotations

import random

from core.common.properties import decode_properties, drop_property, find_property

NAMES = ["TAGS", "WAIT", "KEYS", "UNIQ_KEY", "AWAIT", "WAITX", "T", ""]
VALUES = ["", "v", "true", "a b", "x\x01y", "WAIT", "TAGS\x01z", "é"]


def _random_props(rng: random.Random) -> str:
    pairs = []
    for _ in range(rng.randrange(0, 7)):
        name = rng.choice(NAMES)
        value = rng.choice(VALUES)
        pairs.append(name + ("\x01" + value if rng.random() < 0.9 else ""))
    text = "\x02".join(pairs)
    if rng.random() < 0.5:
        text += "\x02"
    if rng.random() < 0.2:
        text = "\x02" + text
    return text


def test_find_property_is_what_decode_gives():
    rng = random.Random(7)
    for _ in range(5000):
        text = _random_props(rng)
        raw = text.encode()
        decoded = decode_properties(text)
        for name in ("TAGS", "WAIT", "KEYS", "UNIQ_KEY", "T"):
            value = find_property(raw, name.encode() + b"\x01")
            expected = decoded.get(name)
            assert (value.decode() if value is not None else None) == expected, (text, name)


def test_drop_property_removes_only_that_name():
    rng = random.Random(11)
    for _ in range(5000):
        text = _random_props(rng)
        dropped = drop_property(text.encode(), b"WAIT\x01").decode()
        expected = decode_properties(text)
        expected.pop("WAIT", None)
        assert decode_properties(dropped) == expected, (text, dropped)
        assert list(decode_properties(dropped)) == list(expected)


def test_drop_property_keeps_other_pairs_byte_for_byte():
    raw = b"KEYS\x01k\x02WAIT\x01true\x02TAGS\x01A\x02"
    assert drop_property(raw, b"WAIT\x01") == b"KEYS\x01k\x02TAGS\x01A\x02"
    assert drop_property(b"A\x01b\x02WAIT\x01true", b"WAIT\x01") == b"A\x01b\x02"
    assert drop_property(b"A\x01xWAIT\x01y", b"WAIT\x01") == b"A\x01xWAIT\x01y"  # in a value
    assert drop_property(b"NOWAIT\x01y", b"WAIT\x01") == b"NOWAIT\x01y"
    assert find_property(b"A\x01x\x01TAGS\x01y", b"TAGS\x01") is None
    assert find_property(b"TAGS\x01a\x02TAGS\x01\x02", b"TAGS\x01") == b"a"
