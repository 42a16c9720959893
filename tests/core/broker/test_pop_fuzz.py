"""Arbitrary POP requests (codes 200050/51/53/151 and the private 9000xx) over a real
socket: always a protocol answer, never a handler exception, the broker stays healthy."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.remoting.codec import RemotingCommand
from tests.core.broker.harness import send_request, sync_invoke
from tests.core.broker.test_fuzz import BackgroundBroker, _assert_healthy, ext_values

POP_CODES = [200050, 200051, 200053, 200151, 900001, 900002, 900003]
FIELDS = ["consumerGroup", "topic", "queueId", "maxMsgNums", "invisibleTime", "pollTime",
          "bornTime", "initMode", "expType", "exp", "order", "attemptId", "extraInfo",
          "offset", "holderId"]
HANDLES = st.one_of(
    st.text(max_size=40),
    st.builds(lambda xs: " ".join(xs), st.lists(
        st.sampled_from(["0", "-1", "1", "99999999999999999999", "x", "broker-a", ""]),
        min_size=6, max_size=9)),
)
BODIES = st.one_of(
    st.none(), st.binary(max_size=200),
    st.sampled_from([b"{}", b"[]", b'{"acks": null}', b'{"acks": [1, "x", {}]}',
                     b'{"acks": [{"c": "G", "t": "PopZ", "r": "0", "so": 0, "q": 0,'
                     b' "pt": 1, "b": "AQ=="}]}',
                     b'{"acks": [{"c": "G", "t": "PopZ", "r": "0", "so": -5, "q": -1,'
                     b' "pt": "x", "b": "////"}]}']),
)


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    bg = BackgroundBroker(tmp_path_factory.mktemp("popfuzz")).start()
    resp = sync_invoke(bg.server.broker.broker_addr, send_request("PopZ", b"z"))
    assert resp.code == 0
    yield bg
    bg.stop()


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    code=st.sampled_from(POP_CODES),
    ext=st.dictionaries(st.sampled_from(FIELDS), ext_values, max_size=12),
    handle=st.one_of(st.none(), HANDLES),
    body=BODIES,
)
def test_structured_pop_requests(broker, code, ext, handle, body):
    if handle is not None:
        ext["extraInfo"] = handle
    if "pollTime" in ext:
        ext["pollTime"] = "0"  # a held pop would only slow the run down
    resp = sync_invoke(broker.server.broker.broker_addr,
                       RemotingCommand.request(code, ext, body), timeout=5)
    assert isinstance(resp.code, int)
    assert all(isinstance(v, str) for v in (resp.ext_fields or {}).values())
    _assert_healthy(broker)


VALID = {
    200050: {"consumerGroup": "GZ", "topic": "PopZ", "queueId": "-1", "maxMsgNums": "4",
             "invisibleTime": "50", "pollTime": "0", "bornTime": "0", "initMode": "0"},
    200051: {"consumerGroup": "GZ", "topic": "PopZ", "queueId": "0", "offset": "0",
             "extraInfo": "0 1 50 0 0 broker-a 0 0"},
    200053: {"consumerGroup": "GZ", "topic": "PopZ", "queueId": "0", "offset": "0",
             "invisibleTime": "0", "extraInfo": "0 1 50 0 0 broker-a 0 0"},
    900003: {"consumerGroup": "GZ", "topic": "PopZ", "queueId": "0", "offset": "0",
             "extraInfo": "0 1 50 0 0 broker-a 0 0"},
}


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    code=st.sampled_from(sorted(VALID)),
    changes=st.dictionaries(st.sampled_from(FIELDS), st.one_of(ext_values, HANDLES),
                            max_size=3),
)
def test_nearly_valid_pop_requests(broker, code, changes):
    ext = dict(VALID[code], **changes)
    ext["pollTime"] = "0" if code == 200050 else ext.get("pollTime", "0")
    resp = sync_invoke(broker.server.broker.broker_addr,
                       RemotingCommand.request(code, ext), timeout=5)
    assert isinstance(resp.code, int)
    _assert_healthy(broker)
