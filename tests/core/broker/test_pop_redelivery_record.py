"""A redelivered POP record: the stored octets with POP_CK set and RECONSUMETIMES raised
(core/broker/pop/reading.py), everything else as stored."""

from __future__ import annotations

import pytest

from core.broker.pop.reading import redelivery_record
from core.common.codec import decode_record, encode_host, encode_record
from core.common.properties import encode_properties
from core.common.sysflag import MessageSysFlag


def stored(props: dict, sys_flag: int = 0, reconsume: int = 0) -> bytes:
    v6 = sys_flag & MessageSysFlag.STOREHOST_V6
    return encode_record(
        topic=b"%LMQ%q", body=b"payload", properties=encode_properties(props).encode(),
        queue_id=3, flag=7, queue_offset=42, physical_offset=4096, sys_flag=sys_flag,
        born_timestamp=1, born_host=encode_host("10.0.0.1:5"),
        store_timestamp=2, store_host=encode_host("[::1]:6" if v6 else "10.0.0.2:6"),
        reconsume_times=reconsume, prepared_transaction_offset=0)


@pytest.mark.parametrize("props, sys_flag", [
    ({"A": "1", "INNER_MULTI_DISPATCH": "%LMQ%q"}, 0),
    ({}, 0),
    ({"POP_CK": "old handle", "B": "2"}, 0),  # a producer's own POP_CK is replaced
    ({"A": "1"}, MessageSysFlag.STOREHOST_V6),
])
def test_only_the_handle_and_the_delivery_count_change(props, sys_flag):
    before = decode_record(stored(props, sys_flag, reconsume=1))
    after = decode_record(redelivery_record(stored(props, sys_flag, reconsume=1), "h 1 2", 2))
    assert after.properties == {**props, "POP_CK": "h 1 2"}
    assert after.reconsume_times == 3
    for name in ("topic", "body", "queue_id", "flag", "queue_offset", "commitlog_offset",
                 "sys_flag", "born_timestamp", "born_host", "store_timestamp", "store_host"):
        assert getattr(after, name) == getattr(before, name), name


def test_properties_past_the_limit_are_refused():
    with pytest.raises(ValueError):
        redelivery_record(stored({"A": "x" * 32700}), "h" * 100, 1)
