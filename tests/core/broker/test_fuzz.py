"""Arbitrary input over a real socket never crashes the broker, never makes a handler raise,
and never stalls other clients."""

from __future__ import annotations

import json
import socket
import threading

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.broker.config import BrokerConfig
from core.cluster import EmbeddedServer
from core.namesrv import NamesrvConfig
from core.remoting.codec import RemotingCommand
from tests.core.broker.harness import SMALL_FILES, send_request, sync_invoke

BROKER_CODES = [10, 11, 12, 14, 15, 17, 21, 26, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 41,
                42, 43, 46, 200, 201, 202, 203, 204, 207, 208, 215, 310, 320]
FIELD_NAMES = ["topic", "queueId", "consumerGroup", "producerGroup", "queueOffset", "maxMsgNums",
               "sysFlag", "commitOffset", "suspendTimeoutMillis", "subVersion", "subscription",
               "expressionType", "offset", "batch", "properties", "defaultTopic",
               "defaultTopicQueueNums", "bornTimestamp", "flag", "clientID", "key", "maxNum",
               "beginTimestamp", "endTimestamp", "timestamp", "readQueueNums", "writeQueueNums",
               "perm", "group", "delayLevel", "a", "b", "c", "d", "e", "f", "g", "h", "i", "m"]


class BackgroundBroker:
    """An EmbeddedServer running in its own thread (its own trio loop)."""

    def __init__(self, tmp_path) -> None:
        self.config = BrokerConfig(host="127.0.0.1", port=0, data_dir=str(tmp_path / "data"),
                                   max_suspend_ms=300, **SMALL_FILES)
        self.server = EmbeddedServer(self.config, NamesrvConfig(host="127.0.0.1", port=0))
        self._ready = threading.Event()
        self._token = None
        self._thread = threading.Thread(target=trio.run, args=(self._main,), daemon=True)

    async def _main(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        async with trio.open_nursery() as nursery:
            await nursery.start(self.server.serve)
            self._ready.set()

    def start(self) -> BackgroundBroker:
        self._thread.start()
        assert self._ready.wait(30)
        return self

    def stop(self) -> None:
        trio.from_thread.run_sync(self.server.stop, trio_token=self._token)
        self._thread.join(30)


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    bg = BackgroundBroker(tmp_path_factory.mktemp("fuzz")).start()
    yield bg
    bg.stop()
    assert not bg._thread.is_alive()


def _exchange(addr: str, payload: bytes) -> None:
    host, _, port = addr.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=2) as sock:
        sock.settimeout(2)
        try:
            sock.sendall(payload)
            sock.shutdown(socket.SHUT_WR)  # EOF: the server answers what it can, then closes
            while sock.recv(65536):
                pass
        except OSError:
            pass  # a reset is fine; crashing is not


def _assert_healthy(bg: BackgroundBroker) -> None:
    resp = sync_invoke(bg.server.broker.broker_addr,
                       RemotingCommand.request(30, {"topic": "TBW102", "queueId": "0"}))
    assert resp.code == 0
    assert bg._thread.is_alive()
    # Every failure must be an answer with a protocol code, never a handler exception.
    assert dict(bg.server.broker.table._reported) == {}


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.binary(max_size=512))
def test_random_bytes(broker, data):
    _exchange(broker.server.broker.broker_addr, data)
    _assert_healthy(broker)


ext_values = st.one_of(
    st.text(max_size=64), st.integers(-2**63, 2**63).map(str),
    st.sampled_from(["", "-1", "0", "1", "true", "%LMQ%x", "TBW102", "*", "TagA || TagB",
                     "SQL92", "a > 1", "99999999999999999999", "SCHEDULE_TOPIC_XXXX",
                     "evil\n", "%RETRY%x\n", "a > 1.5 OR b BETWEEN 1 AND 2", "1" * 5000 + "x"]),
)


@settings(max_examples=600, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    code=st.sampled_from(BROKER_CODES),
    ext=st.dictionaries(st.sampled_from(FIELD_NAMES), ext_values, max_size=12),
    body=st.one_of(st.none(), st.binary(max_size=300),
                   st.sampled_from([b"{}", b"[]", b'{"clientID":"x","consumerDataSet":[{}]}',
                                    b'{"consumerGroup":"g","clientId":"c","mqSet":[{}]}'])),
    flag=st.sampled_from([0, 2]),
)
def test_structured_requests(broker, code, ext, body, flag):
    cmd = RemotingCommand.request(code, ext, body)
    cmd.flag = flag
    addr = broker.server.broker.broker_addr
    if flag == 0:
        try:
            resp = sync_invoke(addr, cmd, timeout=3)
        except TimeoutError:
            resp = None  # a held pull may legitimately outlast our wait
        if resp is not None:
            assert isinstance(resp.code, int)
            assert all(isinstance(v, str) for v in (resp.ext_fields or {}).values())
    else:
        from core.remoting.codec import encode_command_bytes

        _exchange(addr, encode_command_bytes(cmd))
    _assert_healthy(broker)


def _templates() -> list[tuple[int, dict, bytes | None]]:
    send = send_request("FuzzT", b"body", properties={"TAGS": "A"}).ext_fields
    pull = {"consumerGroup": "G", "topic": "FuzzT", "queueId": "0", "queueOffset": "0",
            "maxMsgNums": "32", "sysFlag": "4", "commitOffset": "-1",
            "suspendTimeoutMillis": "0", "subscription": "*", "subVersion": "0"}
    heartbeat = json.dumps({"clientID": "c", "consumerDataSet": [
        {"groupName": "G", "consumeType": 1, "messageModel": 1, "consumeFromWhere": 0,
         "subscriptionDataSet": [{"topic": "FuzzT", "subString": "*", "subVersion": "1"}]}],
        "producerDataSet": [{"groupName": "P"}]}).encode()
    lock = json.dumps({"consumerGroup": "G", "clientId": "c",
                       "mqSet": [{"topic": "FuzzT", "brokerName": "broker-a", "queueId": 0}]})
    return [
        (10, send, b"body"),
        (11, pull, None),
        (12, {"topic": "FuzzT", "key": "k", "maxNum": "32", "beginTimestamp": "0",
              "endTimestamp": "99999999999999"}, None),
        (14, {"consumerGroup": "G", "topic": "FuzzT", "queueId": "0"}, None),
        (15, {"consumerGroup": "G", "topic": "FuzzT", "queueId": "0", "commitOffset": "1"}, None),
        (17, {"topic": "FuzzNew", "defaultTopic": "TBW102", "readQueueNums": "2",
              "writeQueueNums": "2", "perm": "6", "topicFilterType": "SINGLE_TAG"}, None),
        (29, {"topic": "FuzzT", "queueId": "0", "timestamp": "0"}, None),
        (33, {"offset": "0"}, None),
        (34, {}, heartbeat),
        (35, {"clientID": "c", "producerGroup": "", "consumerGroup": "G"}, None),
        (36, {"group": "G", "offset": "0", "delayLevel": "0"}, None),
        (37, {"producerGroup": "P", "tranStateTableOffset": "0", "commitLogOffset": "0",
              "commitOrRollback": "8", "msgId": "x"}, None),
        (38, {"consumerGroup": "G"}, None),
        (41, {}, lock.encode()),
        (42, {}, lock.encode()),
        (202, {"topic": "FuzzT"}, None),
        (208, {"consumerGroup": "G"}, None),
        (215, {"topic": "FuzzGone"}, None),
    ]


TEMPLATES = _templates()
extreme = st.one_of(
    st.integers(-(2**70), 2**70).map(str),
    st.sampled_from(["", "-1", "2147483648", "-2147483649", "9223372036854775808", "NaN",
                     "1e3", " 1", "0x10", "%RETRY%G", "%DLQ%G", "%LMQ%q", "a" * 300,
                     "SCHEDULE_TOPIC_XXXX", "TBW102", "true", "1"]),
    st.text(max_size=64),
)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    template=st.sampled_from(range(len(TEMPLATES))),
    changes=st.dictionaries(st.sampled_from(FIELD_NAMES + ["key", "maxNum", "group",
                                                           "delayLevel", "commitOrRollback",
                                                           "tranStateTableOffset",
                                                           "commitLogOffset"]),
                            extreme, min_size=1, max_size=8),
    drop_body=st.booleans(),
)
def test_mutated_valid_requests(broker, template, changes, drop_body):
    code, ext, body = TEMPLATES[template]
    ext = {**ext, **changes}
    cmd = RemotingCommand.request(code, ext, None if drop_body and code != 10 else body)
    try:
        resp = sync_invoke(broker.server.broker.broker_addr, cmd, timeout=3)
    except TimeoutError:
        resp = None
    if resp is not None:
        assert all(isinstance(v, str) for v in (resp.ext_fields or {}).values())
    _assert_healthy(broker)


def test_valid_send_after_fuzzing(broker):
    resp = sync_invoke(broker.server.broker.broker_addr, send_request("AfterFuzz", b"ok"))
    assert resp.code == 0, resp.remark
    assert json.loads(json.dumps(resp.ext_fields))["queueId"] == "0"


def test_stalled_client_does_not_block_others(broker):
    """A client that sends half a frame and a client that never reads stall nobody."""
    host, _, port = broker.server.broker.broker_addr.rpartition(":")
    half = socket.create_connection((host, int(port)))
    half.sendall(b"\x00\x00\x10\x00\x00\x00")  # promises 4 KiB, sends 2 bytes
    hog = socket.create_connection((host, int(port)))
    hog.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    from core.remoting.codec import encode_command_bytes

    big_pull = encode_command_bytes(RemotingCommand.request(30, {"topic": "T", "queueId": "0"}))
    try:
        hog.sendall(big_pull * 2000)  # thousands of answers it never reads
    except OSError:
        pass
    try:
        _assert_healthy(broker)
    finally:
        half.close()
        hog.close()
