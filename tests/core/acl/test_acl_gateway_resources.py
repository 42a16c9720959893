"""With ACL on, the groups and topics of the gateways' shared state (`$share` POP groups
MQTT_SHARE_*, session position groups MQTT_S_*, the membership group and system topics
LMQ_GW_*) are for gateway accounts only (admin or innerProperties), whatever an ordinary
account's permissions say (docs/acl.md §4, docs/stateless-gateways.md "Security")."""

from __future__ import annotations

import pytest
import trio

from core.acl import Credentials, PlainAclGuard, parse_acl, sign_request
from core.acl.validator import AclError
from core.remoting.codec import RemotingCommand
from core.remoting.codes import RequestCode as R

OPEN = {"defaultGroupPerm": "SUB", "defaultTopicPerm": "PUB|SUB"}


def _guard() -> PlainAclGuard:
    return PlainAclGuard(parse_acl({"accounts": [
        # An application account that may use every group and topic ...
        {"accessKey": "app-user", "secretKey": "secret1", **OPEN,
         "groupPerms": ["MQTT_SHARE_0123=SUB"], "topicPerms": ["LMQ_GW_ROUTE_LOG=PUB|SUB"]},
        # ... and a gateway account (may multi-dispatch).
        {"accessKey": "gw-user", "secretKey": "secret2", "innerProperties": True, **OPEN},
    ]}))


def _requests() -> dict[str, RemotingCommand]:
    return {
        "share pop": RemotingCommand.request(R.POP_MESSAGE, {
            "consumerGroup": "MQTT_SHARE_0123", "topic": "%LMQ%s_x", "queueId": "0"}),
        "share renew": RemotingCommand.request(R.CHANGE_MESSAGE_INVISIBLETIME, {
            "consumerGroup": "MQTT_SHARE_0123", "topic": "%LMQ%s_x"}),
        "share batch ack": RemotingCommand.request(
            R.BATCH_ACK_MESSAGE, None, b'{"acks":[{"c":"MQTT_SHARE_0123","t":"%LMQ%s_x"}]}'),
        "session offsets": RemotingCommand.request(R.UPDATE_CONSUMER_OFFSET, {
            "consumerGroup": "MQTT_S_abcd", "topic": "%LMQ%m_x", "queueId": "0",
            "commitOffset": "0"}),
        "membership": RemotingCommand.request(
            R.HEART_BEAT, None, b'{"consumerDataSet":[{"groupName":"LMQ_GW_ROUTES"}]}'),
        "route log write": RemotingCommand.request(R.SEND_MESSAGE_V2, {
            "a": "P", "b": "LMQ_GW_ROUTE_LOG"}, b"{}"),
    }


def _signed(cmd: RemotingCommand, who: str, secret: str) -> RemotingCommand:
    copy = RemotingCommand.request(cmd.code, dict(cmd.ext_fields or {}), cmd.body)
    sign_request(copy, Credentials(who, secret))
    return copy


@pytest.mark.parametrize("name", list(_requests()))
def test_gateway_state_is_refused_to_other_accounts_and_open_to_gateways(name) -> None:
    guard = _guard()
    cmd = _requests()[name]

    async def main() -> None:
        with pytest.raises(AclError, match="reserved for gateway accounts"):
            await guard.validate("10.0.0.1:1", _signed(cmd, "app-user", "secret1"))
        got = await guard.validate("10.0.0.1:1", _signed(cmd, "gw-user", "secret2"))
        assert got.name == "gw-user"

    trio.run(main)


def test_ordinary_groups_and_topics_stay_open() -> None:
    guard = _guard()
    pop = RemotingCommand.request(R.POP_MESSAGE, {"consumerGroup": "MQTT_SHARED_APP",
                                                  "topic": "MQTT_MESSAGES"})
    send = RemotingCommand.request(R.SEND_MESSAGE_V2, {"a": "P", "b": "LMQ_GWX"}, b"x")

    async def main() -> None:
        for cmd in (pop, send):
            assert (await guard.validate("10.0.0.1:1",
                                         _signed(cmd, "app-user", "secret1"))).name
    trio.run(main)
