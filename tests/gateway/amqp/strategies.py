"""Hypothesis strategies for AMQP field values, shaped so pika can round-trip them too."""

from __future__ import annotations

from decimal import Decimal

from hypothesis import strategies as st

# Short strings: at most 255 octets of UTF-8 (text of <= 60 chars is at most 240 octets).
shortstr = st.text(max_size=60)
longstr = st.binary(max_size=300)

decimals = st.builds(
    lambda unscaled, scale: Decimal(unscaled).scaleb(-scale),
    st.integers(-(2**31), 2**31 - 1),
    st.integers(0, 9),
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.text(max_size=40),
    st.binary(max_size=40),
    decimals,
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.text(max_size=20), inner, max_size=4),
    ),
    max_leaves=12,
)
tables = st.dictionaries(st.text(max_size=20), values, max_size=5)

BY_KIND = {
    "o": st.integers(0, 255),
    "s": st.integers(0, 0xFFFF),
    "l": st.integers(0, 0xFFFFFFFF),
    "L": st.integers(0, 2**64 - 1),
    "t": st.integers(0, 2**64 - 1),
    "b": st.booleans(),
    "S": shortstr,
    "X": longstr,
    "T": tables,
}


def method_args(method_cls):
    """A strategy for keyword arguments of every field of `method_cls`."""
    return st.fixed_dictionaries({name: BY_KIND[kind] for name, kind in method_cls.FIELDS})


def normalize(value):
    """Compare values across codecs: text and octets as octets, Decimals by value."""
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, dict):
        return {normalize(k): normalize(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [normalize(v) for v in value]
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, Decimal):
        return ("decimal", value.normalize() if value else Decimal(0))
    return value
