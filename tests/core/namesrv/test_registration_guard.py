"""A REGISTER_BROKER must not silently replace a live broker (issue 9 §4), and
UNREGISTER_BROKER removes only the entry at the given address."""

from __future__ import annotations

import json

import trio
from trio.testing import trio_test, wait_all_tasks_blocked

from core.remoting import RemotingClient, RemotingCommand, RequestCode, ResponseCode
from tests.core.namesrv.test_nameserver import nameserver, register_broker, route

REAL = "10.0.0.1:10911"
FAKE = "10.6.6.6:10911"


def broker_addrs(resp: RemotingCommand) -> dict[str, str]:
    data = json.loads(resp.body)
    return data["brokerDatas"][0]["brokerAddrs"]


def unregister(addr: str) -> RemotingCommand:
    return RemotingCommand.request(RequestCode.UNREGISTER_BROKER, {
        "brokerName": "broker-a", "brokerAddr": addr, "clusterName": "DefaultCluster",
        "brokerId": "0"})


async def settle() -> None:
    """Let the name server see a closed connection (everything runs in this trio run)."""
    await wait_all_tasks_blocked(0.05)


@trio_test
async def test_registration_at_another_address_is_refused_while_the_broker_lives() -> None:
    async with nameserver() as (ns, addr), RemotingClient() as real:
        assert (await register_broker(real, addr, "broker-a", REAL, {"T": 4})).code == 0
        async with RemotingClient() as fake:
            refused = await register_broker(fake, addr, "broker-a", FAKE, {"T": 4})
            assert refused.code == ResponseCode.SYSTEM_ERROR
            assert "alive" in refused.remark
            assert broker_addrs(await route(real, addr, "T")) == {"0": REAL}
        # The fake's connection closed: the real broker is still routed.
        await settle()
        assert broker_addrs(await route(real, addr, "T")) == {"0": REAL}
        assert ns.processors.stats.refused_registrations == 1
        # Re-registering through its own connection keeps working.
        assert (await register_broker(real, addr, "broker-a", REAL, {"T": 4})).code == 0


@trio_test
async def test_registration_of_the_same_address_through_another_connection_is_refused():
    async with nameserver() as (ns, addr), RemotingClient() as real:
        assert (await register_broker(real, addr, "broker-a", REAL, {"T": 4})).code == 0
        async with RemotingClient() as fake:
            refused = await register_broker(fake, addr, "broker-a", REAL, {"T": 4})
            assert refused.code == ResponseCode.SYSTEM_ERROR
        await settle()
        # Closing the fake's connection removed nothing.
        assert broker_addrs(await route(real, addr, "T")) == {"0": REAL}


@trio_test
async def test_a_restarted_broker_registers_again_once_its_old_connection_closed():
    async with nameserver() as (ns, addr):
        async with RemotingClient() as first:
            assert (await register_broker(first, addr, "broker-a", REAL, {"T": 4})).code == 0
        with trio.fail_after(5):
            while ns.routes.live_broker_addrs():
                await trio.sleep(0.01)
        async with RemotingClient() as second:
            assert (await register_broker(second, addr, "broker-a", FAKE, {"T": 4})).code == 0
            assert broker_addrs(await route(second, addr, "T")) == {"0": FAKE}


@trio_test
async def test_an_expired_broker_can_be_replaced() -> None:
    async with nameserver() as (ns, addr), RemotingClient() as old, RemotingClient() as new:
        assert (await register_broker(old, addr, "broker-a", REAL, {"T": 4})).code == 0
        # Make the entry older than the expiry (the scan has not run yet).
        ns.routes.broker_live_table[REAL].last_update -= ns.routes.broker_expiry_s + 1
        assert (await register_broker(new, addr, "broker-a", FAKE, {"T": 4})).code == 0
        assert broker_addrs(await route(new, addr, "T")) == {"0": FAKE}


@trio_test
async def test_unregister_removes_only_the_entry_at_its_address() -> None:
    async with nameserver() as (ns, addr), RemotingClient() as client:
        assert (await register_broker(client, addr, "broker-a", REAL, {"T": 4})).code == 0
        assert (await client.invoke(addr, unregister(FAKE))).code == 0
        assert broker_addrs(await route(client, addr, "T")) == {"0": REAL}
        # The real address under another broker name: nothing of broker-a goes either.
        other = unregister(REAL)
        other.ext_fields["brokerName"] = "broker-b"
        assert (await client.invoke(addr, other)).code == 0
        assert REAL in ns.routes.broker_live_table
        assert (await client.invoke(addr, unregister(REAL))).code == 0
        assert (await route(client, addr, "T")).code == ResponseCode.TOPIC_NOT_EXIST
