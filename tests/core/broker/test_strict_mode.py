"""The broker's Apache-only strict mode (`apache_strict`), over a real socket."""

from __future__ import annotations

from core.remoting.codec import RemotingCommand
from core.remoting.codes import RequestCode, ResponseCode
from tests.core.broker.harness import run_embedded, send_request

PRIVATE = [
    (RequestCode.POP_HOLDER_REGISTER, {"holderId": "gw-1"}),
    (RequestCode.POP_HOLDER_RELEASE, {"holderId": "gw-1"}),
    (RequestCode.POP_DEAD_LETTER, {}),
]


def _addr(server) -> str:
    return server.broker.broker_addr


def test_strict_broker_refuses_codes_apache_lacks(tmp_path):
    async def body(server, client):
        addr = _addr(server)
        for code, ext in PRIVATE:
            resp = await client.invoke(addr, RemotingCommand.request(code, ext))
            assert resp.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED, code
            assert str(int(code)) in resp.remark and code.name in resp.remark
        # Apache codes keep working: a send and an offset query.
        sent = await client.invoke(addr, send_request("StrictTopic"))
        assert sent.code == ResponseCode.SUCCESS, sent.remark
        ext = {"topic": "StrictTopic", "queueId": 0}
        got = await client.invoke(addr, RemotingCommand.request(RequestCode.GET_MAX_OFFSET, ext))
        assert got.code == ResponseCode.SUCCESS and int(got.ext_fields["offset"]) == 1

    run_embedded(body, tmp_path, apache_strict=True, auto_create_topic_enable=True)


def test_default_broker_serves_private_codes(tmp_path):
    async def body(server, client):
        cmd = RemotingCommand.request(RequestCode.POP_HOLDER_REGISTER, {"holderId": "gw-1"})
        resp = await client.invoke(_addr(server), cmd)
        assert resp.code == ResponseCode.SUCCESS, resp.remark

    run_embedded(body, tmp_path)
