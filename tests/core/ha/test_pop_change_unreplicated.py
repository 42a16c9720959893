"""CHANGE_MESSAGE_INVISIBLETIME on a SYNC_MASTER whose slave did not confirm: the answer
(SLAVE_NOT_AVAILABLE) still carries the new popTime, invisibleTime and reviveQid, since
the change was made on the master and the old receipt handle no longer acts."""

from __future__ import annotations

import trio

from core.client.pop_consumer import PopClient
from core.remoting.codec import RemotingCommand
from core.remoting.codes import RequestCode, ResponseCode
from tests.core.ha.test_replication import TOPIC, cluster, send

GROUP = "GID_HA_POP_CHANGE"


def test_unconfirmed_change_still_gives_the_new_handle(tmp_path):
    async def main():
        async with cluster(tmp_path, slave=False) as (client, master, _sl, _ns, _n):
            await send(client, master, b"m")  # stored (SLAVE_NOT_AVAILABLE all the same)
            pc = PopClient(client, master.broker_addr, "bk", GROUP)
            (m,) = (await pc.pop(TOPIC, queue_id=0, max_nums=1, invisible_ms=600_000)).messages
            ext = {"consumerGroup": GROUP, "topic": TOPIC, "queueId": "0",
                   "extraInfo": m.handle, "offset": str(m.queue_offset),
                   "invisibleTime": "5000"}
            r = await client.invoke(master.broker_addr, RemotingCommand.request(
                RequestCode.CHANGE_MESSAGE_INVISIBLETIME, ext))
            assert r.code == ResponseCode.SLAVE_NOT_AVAILABLE
            h = r.ext_fields or {}
            assert h.get("invisibleTime") == "5000" and h.get("reviveQid") == "0"
            entry = master.pop_service.state.get(GROUP, TOPIC, 0).inflight[m.queue_offset]
            assert int(h["popTime"]) == entry.pop_time != int(m.handle.split(" ")[1])

    trio.run(main)
