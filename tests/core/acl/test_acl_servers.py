"""Plain ACL on a real broker and name server (TCP), with our signing client."""

from __future__ import annotations

import pytest
from trio.testing import trio_test

from core.acl import Credentials, SigningRemotingClient
from core.client import ClientInstance, Message, MQBrokerError, MQClientError, Producer
from core.client.admin import AdminClient
from core.common.properties import MessageConst
from core.remoting.client import RemotingClient
from core.remoting.codec import RemotingCommand
from core.remoting.codes import RequestCode, ResponseCode
from tests.core.acl.acl_cluster import ADMIN, GATEWAY, USER, acl_cluster


def creds(pair: tuple[str, str]) -> Credentials:
    return Credentials(*pair)


def send_request(topic: str, props: str = "", body: bytes = b"hello") -> RemotingCommand:
    """A SEND_MESSAGE_V2 as the Java client builds it."""
    return RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, {
        "a": "PG_ACL", "b": topic, "c": "TBW102", "d": "4", "e": "0", "f": "0",
        "g": "1700000000000", "h": "0", "i": props, "j": "0", "k": "false",
    }, body)


async def invoke(addr: str, cmd: RemotingCommand, who: tuple[str, str] | None):
    client = SigningRemotingClient(creds(who)) if who else RemotingClient()
    async with client:
        return await client.invoke(addr, cmd)


@trio_test
async def test_signed_requests_pass_and_unsigned_or_badly_signed_are_refused():
    async with acl_cluster() as srv:
        broker = srv.broker_config.broker_addr
        ok = await invoke(broker, send_request("AclTopic"), USER)
        assert ok.code == ResponseCode.SUCCESS, ok.remark

        unsigned = await invoke(broker, send_request("AclTopic"), None)
        assert unsigned.code == ResponseCode.SYSTEM_ERROR
        assert "AclException: No accessKey is configured" in unsigned.remark

        wrong = await invoke(broker, send_request("AclTopic"), (USER[0], "not-the-secret"))
        assert wrong.code == ResponseCode.SYSTEM_ERROR
        assert f"Check signature failed for accessKey={USER[0]}" in wrong.remark

        unknown = await invoke(broker, send_request("AclTopic"), ("nobody99", "whatever1"))
        assert unknown.code == ResponseCode.SYSTEM_ERROR and "No acl config" in unknown.remark

        # A signed request whose body was changed on the way is refused.
        async with SigningRemotingClient(creds(USER)) as client:
            cmd = send_request("AclTopic")
            from core.acl import sign_request
            sign_request(cmd, creds(USER))
            cmd.body = b"tampered"
            conn = await client.connection(broker)
            tampered = await conn.invoke(cmd, 3.0)
        assert tampered.code == ResponseCode.SYSTEM_ERROR and "signature" in tampered.remark
        # Only the one good send was stored.
        assert srv.broker.store.max_offset("AclTopic", 0) == 1


@trio_test
async def test_topic_and_group_permissions():
    async with acl_cluster() as srv:
        broker = srv.broker_config.broker_addr
        denied = await invoke(broker, send_request("OtherTopic"), USER)  # defaultTopicPerm DENY
        assert denied.code == ResponseCode.SYSTEM_ERROR and "No permission" in denied.remark
        sub_only = await invoke(broker, send_request("SubOnly"), USER)
        assert sub_only.code == ResponseCode.SYSTEM_ERROR
        pull = RemotingCommand.request(RequestCode.PULL_MESSAGE, {
            "consumerGroup": "DeniedGroup", "topic": "AclTopic", "queueId": "0",
            "queueOffset": "0", "maxMsgNums": "1", "sysFlag": "0", "commitOffset": "0",
            "suspendTimeoutMillis": "0", "subscription": "*", "subVersion": "0"})
        refused = await invoke(broker, pull, USER)
        assert refused.code == ResponseCode.SYSTEM_ERROR and "%RETRY%DeniedGroup" in refused.remark
        pull.ext_fields["consumerGroup"] = "AnyGroup"  # defaultGroupPerm SUB (re-signed)
        allowed = await invoke(broker, pull, USER)
        assert allowed.code != ResponseCode.SYSTEM_ERROR, allowed.remark
        # A send to a retry topic needs SUB on the group, not PUB on the topic.
        retry = await invoke(broker, send_request("%RETRY%DeniedGroup"), USER)
        assert retry.code == ResponseCode.SYSTEM_ERROR


@trio_test
async def test_admin_codes_need_an_admin_account():
    async with acl_cluster() as srv:
        broker = srv.broker_config.broker_addr
        create = RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC, {
            "topic": "MadeByAdmin", "defaultTopic": "TBW102", "readQueueNums": "2",
            "writeQueueNums": "2", "perm": "6", "topicFilterType": "SINGLE_TAG"})
        refused = await invoke(broker, create, USER)
        assert refused.code == ResponseCode.SYSTEM_ERROR
        assert "Need admin permission for request code=17" in refused.remark
        assert srv.broker.topic_config_manager.get("MadeByAdmin") is None
        create.ext_fields.pop("Signature")
        create.ext_fields.pop("AccessKey")
        done = await invoke(broker, create, ADMIN)
        assert done.code == ResponseCode.SUCCESS, done.remark
        config = await invoke(broker, RemotingCommand.request(RequestCode.GET_BROKER_CONFIG), USER)
        assert config.code == ResponseCode.SYSTEM_ERROR


@trio_test
async def test_name_server_write_codes_need_admin_and_reads_need_a_signature():
    async with acl_cluster() as srv:
        ns = srv.namesrv_addr
        def route():
            return RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "TBW102"})

        assert (await invoke(ns, route(), USER)).code == ResponseCode.SUCCESS
        assert (await invoke(ns, route(), None)).code == ResponseCode.SYSTEM_ERROR
        wipe = RemotingCommand.request(RequestCode.WIPE_WRITE_PERM_OF_BROKER,
                                       {"brokerName": "broker-a"})
        refused = await invoke(ns, wipe, USER)
        assert refused.code == ResponseCode.SYSTEM_ERROR and "Need admin" in refused.remark
        def kv():
            return RemotingCommand.request(RequestCode.PUT_KV_CONFIG,
                                           {"namespace": "N", "key": "k", "value": "v"})

        assert (await invoke(ns, kv(), USER)).code == ResponseCode.SYSTEM_ERROR
        assert srv.namesrv.kv.get("N", "k") is None
        assert (await invoke(ns, kv(), ADMIN)).code == ResponseCode.SUCCESS
        # The broker registered with its admin credentials: its routes are there.
        assert srv.namesrv.routes.broker_addr_table["broker-a"].broker_addrs
        # A non-admin account cannot register a broker (a fake one at its own address).
        from tests.core.namesrv.test_nameserver import register_broker

        async with SigningRemotingClient(creds(USER)) as client:
            fake = await register_broker(client, ns, "broker-fake", "10.6.6.6:10911", {"T": 1})
        assert fake.code == ResponseCode.SYSTEM_ERROR and "Need admin" in fake.remark
        assert "broker-fake" not in srv.namesrv.routes.broker_addr_table
        async with SigningRemotingClient(creds(ADMIN)) as client:
            real = await register_broker(client, ns, "broker-b", "10.0.0.9:10911", {"T": 1})
        assert real.code == ResponseCode.SUCCESS, real.remark


@trio_test
async def test_native_client_signs_with_configured_credentials():
    async with acl_cluster() as srv:
        async with ClientInstance(namesrv_addr=srv.namesrv_addr, access_key=USER[0],
                                  secret_key=USER[1]) as client:
            async with Producer(client, "PG_ACL") as p:
                r = await p.send(Message("AclTopic", b"signed"))
                assert r.queue_offset == 0
                with pytest.raises(MQClientError):
                    await p.send(Message("OtherTopic", b"denied"))
        async with ClientInstance(namesrv_addr=srv.namesrv_addr, access_key=USER[0],
                                  secret_key="wrong-secret") as client:
            async with Producer(client, "PG_ACL") as p:
                with pytest.raises(MQClientError):
                    await p.send(Message("AclTopic", b"refused"))
        async with ClientInstance(namesrv_addr=srv.namesrv_addr, access_key=ADMIN[0],
                                  secret_key=ADMIN[1]) as client:
            await AdminClient(client).topic_create("AdminMade", read_queue_nums=1,
                                                   write_queue_nums=1)
        assert srv.broker.topic_config_manager.get("AdminMade") is not None


def _dispatch_props(lmq: str) -> str:
    return (f"{MessageConst.INNER_MULTI_DISPATCH}\x01{lmq}\x02"
            f"{MessageConst.INNER_MULTI_QUEUE_OFFSET}\x010\x02")


@trio_test
async def test_reserved_properties_need_the_account_right():
    async with acl_cluster() as srv:
        broker = srv.broker_config.broker_addr
        store = srv.broker.store
        props = _dispatch_props("%LMQ%victim")
        refused = await invoke(broker, send_request("AclTopic", props), USER)
        assert refused.code == ResponseCode.NO_PERMISSION
        assert MessageConst.INNER_MULTI_DISPATCH in refused.remark
        assert store.max_offset("%LMQ%victim", 0) == 0
        assert store.max_offset("AclTopic", 0) == 0
        ok = await invoke(broker, send_request("GatewayTopic", props), GATEWAY)
        assert ok.code == ResponseCode.SUCCESS, ok.remark
        assert store.max_offset("%LMQ%victim", 0) == 1


@trio_test
async def test_reserved_properties_without_acl_only_in_process_unless_allowed():
    from tests.core.client.cluster import cluster

    props = _dispatch_props("%LMQ%open")
    async with cluster() as c:
        addr = c.broker_addrs[0]
        refused = await invoke(addr, send_request("PlainTopic", props), None)
        assert refused.code == ResponseCode.NO_PERMISSION
        assert c.brokers[0].store.max_offset("%LMQ%open", 0) == 0
    async with cluster(allow_inner_properties_without_acl=True) as c:
        addr = c.broker_addrs[0]
        ok = await invoke(addr, send_request("PlainTopic", props), None)
        assert ok.code == ResponseCode.SUCCESS, ok.remark
        assert c.brokers[0].store.max_offset("%LMQ%open", 0) == 1


def test_broker_error_names_the_acl_code():
    # What a client sees: RocketMQ's SYSTEM_ERROR, so Java and C++ clients report it.
    err = MQBrokerError(ResponseCode.SYSTEM_ERROR, "org.apache.rocketmq.acl.common.AclException: x")
    assert "SYSTEM_ERROR" in str(err)


@trio_test
async def test_reserved_property_inside_a_batch_is_refused():
    from core.common.codec import BatchItem, encode_batch

    async with acl_cluster() as srv:
        broker = srv.broker_config.broker_addr
        body = encode_batch([
            BatchItem(0, b"plain", "TAGS\x01a\x02"),
            BatchItem(0, b"forged", _dispatch_props("%LMQ%victim")),
        ])
        cmd = send_request("AclTopic", "", body)
        cmd.code = RequestCode.SEND_BATCH_MESSAGE
        refused = await invoke(broker, cmd, USER)
        assert refused.code == ResponseCode.NO_PERMISSION, refused.remark
        assert srv.broker.store.max_offset("%LMQ%victim", 0) == 0
        assert srv.broker.store.max_offset("AclTopic", 0) == 0
        # The same batch from the gateway account goes through.
        cmd = send_request("AclTopicGw", "", body)
        cmd.code = RequestCode.SEND_BATCH_MESSAGE
        ok = await invoke(broker, cmd, GATEWAY)
        assert ok.code == ResponseCode.SUCCESS, ok.remark
        assert srv.broker.store.max_offset("%LMQ%victim", 0) == 1


@trio_test
async def test_send_back_does_not_dispatch_into_the_lmqs_again():
    # A consumer of a multi-dispatched message (an MQTT publish on the store topic) sends
    # it back: the retry / DLQ copy must not be indexed into the subscribers' LMQs again.
    async with acl_cluster() as srv:
        broker = srv.broker_config.broker_addr
        store = srv.broker.store
        props = _dispatch_props("%LMQ%replayed")
        sent = await invoke(broker, send_request("StoreTopic", props), GATEWAY)
        assert sent.code == ResponseCode.SUCCESS, sent.remark
        assert store.max_offset("%LMQ%replayed", 0) == 1
        offset_msg_id = sent.ext_fields["msgId"]
        from core.common.msgid import decode_offset_msg_id

        commit_offset = decode_offset_msg_id(offset_msg_id)[-1]
        for delay in ("-1", "0"):  # straight to the DLQ, and through the delay queue
            back = RemotingCommand.request(RequestCode.CONSUMER_SEND_MSG_BACK, {
                "offset": str(commit_offset), "group": "CG_BACK", "delayLevel": delay,
                "originMsgId": offset_msg_id, "originTopic": "StoreTopic"})
            resp = await invoke(broker, back, GATEWAY)
            assert resp.code == ResponseCode.SUCCESS, resp.remark
        assert store.max_offset("%LMQ%replayed", 0) == 1


def pop_request(topic: str, group: str) -> RemotingCommand:
    return RemotingCommand.request(RequestCode.POP_MESSAGE, {
        "consumerGroup": group, "topic": topic, "queueId": "-1", "maxMsgNums": "4",
        "invisibleTime": "30000", "pollTime": "0", "bornTime": "1700000000000",
        "initMode": "0"})


@trio_test
async def test_pop_needs_sub_on_topic_and_group_and_holders_need_admin():
    async with acl_cluster() as srv:
        broker = srv.broker_config.broker_addr
        assert (await invoke(broker, send_request("AclTopic"), USER)).code == ResponseCode.SUCCESS
        popped = await invoke(broker, pop_request("AclTopic", "PopGroup"), USER)
        assert popped.code == ResponseCode.SUCCESS, popped.remark
        for topic, group in (("OtherTopic", "PopGroup"), ("AclTopic", "DeniedGroup")):
            refused = await invoke(broker, pop_request(topic, group), USER)
            assert refused.code == ResponseCode.SYSTEM_ERROR and "No permission" in refused.remark
        # A batch ack is checked entry by entry.
        body = b'{"acks": [{"c": "PopGroup", "t": "OtherTopic", "r": "0", "q": 0, "so": 0,' \
               b' "pt": 1, "b": "AQ=="}]}'
        batch = RemotingCommand.request(RequestCode.BATCH_ACK_MESSAGE, {}, body)
        refused = await invoke(broker, batch, USER)
        assert refused.code == ResponseCode.SYSTEM_ERROR and "OtherTopic" in refused.remark
        # Naming a POP holder (whose release redelivers others' messages) is for admins.
        holder = RemotingCommand.request(RequestCode.POP_HOLDER_REGISTER, {"holderId": "gw-1"})
        assert (await invoke(broker, holder, USER)).code == ResponseCode.SYSTEM_ERROR
        holder = RemotingCommand.request(RequestCode.POP_HOLDER_REGISTER, {"holderId": "gw-1"})
        assert (await invoke(broker, holder, ADMIN)).code == ResponseCode.SUCCESS
