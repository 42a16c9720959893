"""Signing, address patterns, permissions and the ACL file, without servers."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest

from core.acl import Credentials, parse_acl, sign_request
from core.acl.addresses import AddressPattern, compile_pattern
from core.acl.permissions import (
    DENY,
    PUB,
    SUB,
    check_permission,
    parse_perm,
    request_resources,
)
from core.remoting.codec import RemotingCommand, decode_frame, encode_command_bytes
from core.remoting.codes import RequestCode


def expected(secret: str, content: bytes) -> str:
    return base64.b64encode(hmac.new(secret.encode(), content, hashlib.sha1).digest()).decode()


def test_signature_covers_values_sorted_by_key_then_the_body():
    cmd = RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, {"b": "Topic", "a": "Group",
                                                               "e": 3}, b"body")
    sign_request(cmd, Credentials("myAccess", "mySecret"))
    # Keys in order: AccessKey, a, b, e (upper case sorts first); values only.
    assert cmd.ext_fields["Signature"] == expected("mySecret", b"myAccessGroupTopic3body")
    assert cmd.ext_fields["AccessKey"] == "myAccess"
    # What the server decodes is what was signed (the int went out as "3").
    received = decode_frame(encode_command_bytes(cmd))
    assert received.ext_fields["e"] == "3"


def test_signature_skips_unique_key_query_and_resigning_replaces_it():
    cmd = RemotingCommand.request(RequestCode.QUERY_MESSAGE, {"topic": "T",
                                                             "_UNIQUE_KEY_QUERY": "true"})
    creds = Credentials("access1", "secret1", security_token="tok")
    sign_request(cmd, creds)
    first = cmd.ext_fields["Signature"]
    # AccessKey, SecurityToken, (_UNIQUE_KEY_QUERY left out), topic.
    assert first == expected("secret1", b"access1tokT")
    sign_request(cmd, creds)
    assert cmd.ext_fields["Signature"] == first


def test_list_bodies_are_signed_as_their_concatenation():
    a = RemotingCommand.request(RequestCode.SEND_MESSAGE, {"topic": "T"}, [b"ab", b"cd"])
    b = RemotingCommand.request(RequestCode.SEND_MESSAGE, {"topic": "T"}, b"abcd")
    creds = Credentials("access1", "secret1")
    sign_request(a, creds)
    sign_request(b, creds)
    assert a.ext_fields["Signature"] == b.ext_fields["Signature"]


def test_credentials_hide_the_secret():
    assert "secret1" not in repr(Credentials("access1", "secret1"))
    with pytest.raises(ValueError):
        Credentials("access1", "")


@pytest.mark.parametrize("pattern,yes,no", [
    ("*", ["1.2.3.4", "::1"], []),
    ("192.168.1.5", ["192.168.1.5"], ["192.168.1.50", "10.0.0.1"]),
    ("192.168.*", ["192.168.0.1", "192.168.255.3"], ["192.169.0.1", "::1"]),
    ("192.168.1.*", ["192.168.1.9"], ["192.168.2.9"]),
    ("10.0.0.10-20", ["10.0.0.10", "10.0.0.20"], ["10.0.0.9", "10.0.0.21"]),
    ("10.0.0.{1,3}", ["10.0.0.1", "10.0.0.3"], ["10.0.0.2"]),
    ("10.0.0.1,10.0.0.2", ["10.0.0.2"], ["10.0.0.3"]),
    ("10.0.0.0/8", ["10.9.8.7"], ["11.0.0.1", "not-an-ip"]),
    ("::1", ["::1", "0:0:0:0:0:0:0:1"], ["::2"]),
])
def test_address_patterns(pattern, yes, no):
    match = compile_pattern(pattern)
    assert all(match(h) for h in yes)
    assert not any(match(h) for h in no)


@pytest.mark.parametrize("bad", ["10.*.1.1", "300.1.1.1", "1.2.3.9-1", "1.2-3.*", "1.2.3"])
def test_bad_address_patterns_are_refused(bad):
    with pytest.raises(ValueError):
        compile_pattern(bad)


def test_address_pattern_takes_ip_and_port():
    white = AddressPattern(["127.0.0.1"])
    assert white.matches("127.0.0.1:5555") and not white.matches("127.0.0.2:5555")
    assert AddressPattern(["::1"]).matches("[::1]:5555")
    assert not AddressPattern([]).matches("127.0.0.1:1")


def test_permission_rules():
    assert parse_perm("PUB|SUB") == PUB | SUB == parse_perm("sub|pub")
    assert parse_perm("nonsense") == DENY
    assert check_permission(PUB, PUB | SUB) and not check_permission(PUB, SUB)
    assert not check_permission(SUB, DENY | SUB)


def test_request_resources_map_groups_to_retry_topics():
    send = RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, {"a": "PG", "b": "%RETRY%CG"})
    assert list(request_resources(send)) == [("%RETRY%CG", SUB)]
    pull = RemotingCommand.request(RequestCode.PULL_MESSAGE, {"topic": "T",
                                                             "consumerGroup": "CG"})
    assert list(request_resources(pull)) == [("T", SUB), ("%RETRY%CG", SUB)]
    beat = RemotingCommand.request(RequestCode.HEART_BEAT, None, b'{"consumerDataSet":[{'
                                   b'"groupName":"CG","subscriptionDataSet":[{"topic":"T"}]}]}')
    assert list(request_resources(beat)) == [("%RETRY%CG", SUB), ("T", SUB)]
    garbage = RemotingCommand.request(RequestCode.HEART_BEAT, None, b"{not json")
    assert list(request_resources(garbage)) == []


def test_acl_file_parsing():
    config = parse_acl({
        "globalWhiteRemoteAddresses": ["10.1.*"],
        "accounts": [{"accessKey": "access1", "secretKey": "secret1", "admin": True,
                      "topicPerms": ["A=PUB"], "groupPerms": ["G=SUB"],
                      "defaultTopicPerm": "SUB"}],
    })
    account = config.accounts["access1"]
    assert account.admin and account.perms == {"A": PUB, "%RETRY%G": SUB}
    assert account.default_topic_perm == SUB and account.default_group_perm == DENY
    assert config.global_white.matches("10.1.2.3:1")
    for bad in (
        {"accounts": [{"accessKey": "short", "secretKey": "secret1"}]},
        {"accounts": [{"accessKey": "access1", "secretKey": "secret1", "admn": True}]},
        {"accounts": [{"accessKey": "access1", "secretKey": "secret1", "topicPerms": ["A"]}]},
        {"accounts": [{"accessKey": "access1", "secretKey": "secret1"}] * 2},
        {"globalWhiteRemoteAddresses": ["10.*.1"]},
        {"acounts": []},
    ):
        with pytest.raises(ValueError):
            parse_acl(bad)


def test_oversized_heartbeat_is_refused_by_the_check_without_parsing():
    import trio

    from core.acl import PlainAclGuard
    from core.acl.permissions import MAX_CHECKED_BODY_BYTES
    from core.acl.validator import AclError

    guard = PlainAclGuard(parse_acl({"accounts": [
        {"accessKey": "access1", "secretKey": "secret1", "defaultGroupPerm": "SUB",
         "defaultTopicPerm": "SUB"}]}))
    small = RemotingCommand.request(RequestCode.HEART_BEAT, None,
                                    b'{"consumerDataSet":[{"groupName":"G"}]}')
    big = RemotingCommand.request(RequestCode.HEART_BEAT, None,
                                  b" " * (MAX_CHECKED_BODY_BYTES + 1))
    creds = Credentials("access1", "secret1")
    sign_request(small, creds)
    sign_request(big, creds)

    async def main():
        assert (await guard.validate("10.0.0.1:1", small)).name == "access1"
        with pytest.raises(AclError, match="over the"):
            await guard.validate("10.0.0.1:1", big)

    trio.run(main)


def test_serve_config_turns_acl_on_for_broker_and_name_server():
    from core.cluster import build_configs, configs_from_toml

    broker_kw, namesrv_kw = configs_from_toml({
        "acl_enable": True, "acl_file": "/etc/lmq/acl.toml",
        "broker": {"namesrv_access_key": "broker-a", "namesrv_secret_key": "secret-a"},
    })
    assert broker_kw["acl_enable"] and namesrv_kw["acl_enable"]
    assert broker_kw["acl_file"] == namesrv_kw["acl_file"] == "/etc/lmq/acl.toml"
    broker, namesrv = build_configs(None, broker_kw, namesrv_kw)
    assert broker.acl_enable and namesrv.acl_enable
    assert broker.namesrv_access_key == "broker-a"
    assert "secret-a" not in repr(broker)  # secrets stay out of logged configs


def test_whitelists():
    import trio

    from core.acl import PlainAclGuard
    from core.acl.validator import AclError

    guard = PlainAclGuard(parse_acl({
        "globalWhiteRemoteAddresses": ["10.9.*"],
        "accounts": [{"accessKey": "access1", "secretKey": "secret1",
                      "whiteRemoteAddress": "10.1.1.1", "topicPerms": ["T=PUB"]}],
    }))

    def send(topic: str, signed: bool) -> RemotingCommand:
        cmd = RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, {"a": "G", "b": topic,
                                                                   "AccessKey": "access1"})
        if signed:
            sign_request(cmd, Credentials("access1", "secret1"))
        return cmd

    async def main():
        # Global whitelist: no account needed at all.
        assert (await guard.validate("10.9.0.1:1", RemotingCommand.request(10))).name
        # The account's own address: no signature needed, permissions still apply.
        assert (await guard.validate("10.1.1.1:1", send("T", False))).name == "access1"
        with pytest.raises(AclError, match="No permission"):
            await guard.validate("10.1.1.1:1", send("Other", False))
        # Elsewhere the signature is required.
        with pytest.raises(AclError, match="signature"):
            await guard.validate("10.1.1.2:1", send("T", False))
        assert (await guard.validate("10.1.1.2:1", send("T", True))).name == "access1"

    trio.run(main)
