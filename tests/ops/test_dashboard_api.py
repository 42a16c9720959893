"""The dashboard's JSON API and its guards, against a real in-process name server, broker
(ACL on, an admin account) and AMQP gateway, over real HTTP on a free port."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request

import pika
import pytest
import trio

from gateway.amqp.embedded import AmqpService
from gateway.amqp.server import AmqpServerConfig
from lmq import dashboard as dashboard_module
from lmq.metrics import Exporter
from tests.core.acl.acl_cluster import ADMIN, USER, acl_cluster
from tests.gateway.amqp.broker_harness import params as amqp_params

pytestmark = pytest.mark.timeout(60)


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def _http(port: int, path: str, *, body: dict | bytes | None = None, auth=None,
          headers: dict | None = None) -> tuple[int, dict]:
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data,
                                 method="POST" if data is not None else "GET")
    if auth:
        req.add_header("Authorization", _basic(*auth))
    if isinstance(body, dict):
        req.add_header("Content-Type", "application/json")
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.load(resp)
    except urllib.error.HTTPError as exc:
        text = exc.read()
        try:
            return exc.code, json.loads(text)
        except ValueError:  # the HTTP layer's own plain-text answers (413, 431)
            return exc.code, {"text": text.decode(errors="replace")}


def _run(test, *, services=None, host: str = "127.0.0.1") -> None:
    async def main() -> None:
        async with acl_cluster(services=services) as server:
            exporter = Exporter(host, 0, server=server, dashboard=True)
            async with trio.open_nursery() as nursery:
                await nursery.start(exporter.serve)

                async def call(*args, **kw):
                    return await trio.to_thread.run_sync(lambda: _http(exporter.port, *args,
                                                                       **kw))

                await test(server, call)
                nursery.cancel_scope.cancel()

    trio.run(main)


def test_actions_need_admin_login_csrf_and_same_origin():
    async def test(server, call) -> None:
        create = {"topic": "ApiTopic", "queues": 2}
        status, answer = await call("/api/actions/topic/create", body=create)
        assert status == 401, answer
        status, answer = await call("/api/session", auth=USER)  # an account, not an admin
        assert status == 401
        status, session = await call("/api/session", auth=ADMIN)
        assert status == 200 and session["user"] == ADMIN[0] and session["csrf"]
        status, answer = await call("/api/actions/topic/create", body=create, auth=ADMIN)
        assert status == 403 and "CSRF" in answer["error"]
        token = {"X-CSRF-Token": session["csrf"]}
        status, answer = await call("/api/actions/topic/create", body=create, auth=ADMIN,
                                    headers={**token, "Origin": "http://evil.example"})
        assert status == 403 and "cross-site" in answer["error"]
        status, answer = await call("/api/actions/topic/create", auth=ADMIN, headers=token,
                                    body=json.dumps(create).encode())  # not JSON-typed
        assert status == 415
        assert server.broker.topic_config_manager.get("ApiTopic") is None
        status, answer = await call("/api/actions/topic/create", body=create, auth=ADMIN,
                                    headers=token)
        assert status == 200, answer
        assert server.broker.topic_config_manager.get("ApiTopic").write_queue_nums == 2
        status, answer = await call("/api/actions/topic/create", auth=ADMIN, headers=token,
                                    body={"topic": "bad topic!", "queues": 1})
        assert status == 400
        status, answer = await call("/api/actions/topic/delete", body={"topic": "ApiTopic"},
                                    auth=ADMIN, headers=token)
        assert status == 200 and server.broker.topic_config_manager.get("ApiTopic") is None

    _run(test)


def test_reset_offset_and_message_browser():
    async def test(server, call) -> None:
        from core.client import ClientInstance, Producer
        from core.common.message import Message

        async with ClientInstance(namesrv_addr=server.namesrv_addr, access_key=ADMIN[0],
                                  secret_key=ADMIN[1]) as client:
            producer = Producer(client, "PG_API")
            await producer.start()
            for i in range(4):
                msg = Message("ApiOrders", b"body %d" % i)
                msg.keys = f"k{i}"
                sent = await producer.send(msg)
        broker = server.broker
        qid = sent.message_queue.queue_id
        broker.offset_manager.commit("CG_API", "ApiOrders", qid, 0)
        status, groups = await call("/api/groups")
        assert status == 200
        assert {"group": "CG_API", "topic": "ApiOrders"}.items() <= groups["items"][0].items()
        _, session = await call("/api/session", auth=ADMIN)
        status, answer = await call("/api/actions/group/reset", auth=ADMIN,
                                    headers={"X-CSRF-Token": session["csrf"]},
                                    body={"group": "CG_API", "topic": "ApiOrders",
                                          "to": "latest"})
        assert status == 200, answer
        assert broker.offset_manager.query("CG_API", "ApiOrders", qid) == \
            broker.store.max_offset("ApiOrders", qid)
        # Message bodies need the login even on loopback.
        status, _ = await call(f"/api/messages?topic=ApiOrders&queue={qid}")
        assert status == 401
        status, found = await call("/api/messages?topic=ApiOrders&key=k3", auth=ADMIN)
        assert status == 200 and [m["body"]["text"] for m in found["items"]] == ["body 3"]
        status, found = await call(f"/api/messages?id={sent.offset_msg_id}", auth=ADMIN)
        assert [m["keys"] for m in found["items"]] == [["k3"]]
        status, found = await call(f"/api/messages?topic=ApiOrders&queue={qid}&offset=0"
                                   "&count=1000", auth=ADMIN)
        assert 1 <= len(found["items"]) <= 4
        status, answer = await call("/api/topics?limit=abc")
        assert status == 400

    _run(test)


def test_non_loopback_dashboard_needs_login_to_read():
    async def test(server, call) -> None:
        status, answer = await call("/api/overview")
        assert status == 401
        status, answer = await call("/api/overview", auth=ADMIN)
        assert status == 200 and answer["broker"]["name"] == server.broker_config.broker_name

    _run(test, host="0.0.0.0")


def test_failed_logins_are_throttled(monkeypatch):
    monkeypatch.setattr(dashboard_module, "MAX_FAILED_LOGINS", 3)

    async def test(server, call) -> None:
        for _ in range(3):
            status, _ = await call("/api/session", auth=(ADMIN[0], "wrong-password"))
            assert status == 401
        status, answer = await call("/api/session", auth=ADMIN)  # right, but throttled
        assert status == 429, answer

    _run(test)


def test_purge_amqp_queue():
    service = AmqpService(AmqpServerConfig(port=0))

    def publish() -> None:
        conn = pika.BlockingConnection(amqp_params(service.server.port))
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("api-q")
        for i in range(3):
            ch.basic_publish("", "api-q", b"m%d" % i, mandatory=True)
        conn.close()

    async def test(server, call) -> None:
        await trio.to_thread.run_sync(publish)
        status, amqp = await call("/api/amqp")
        queue = next(q for q in amqp["queues"] if q["name"] == "api-q")
        assert queue["messages"] == 3
        _, session = await call("/api/session", auth=ADMIN)
        status, answer = await call("/api/actions/queue/purge", body={"queue": "api-q"},
                                    auth=ADMIN, headers={"X-CSRF-Token": session["csrf"]})
        assert status == 200 and "3 messages" in answer["message"], answer
        status, amqp = await call("/api/amqp")
        assert next(q for q in amqp["queues"] if q["name"] == "api-q")["messages"] == 0

    _run(test, services=[service])


def test_large_action_body_is_413_and_no_dashboard_flag():
    from lmq import metrics

    async def test(server, call) -> None:
        _, session = await call("/api/session", auth=ADMIN)
        big = b'{"topic": "' + b"x" * (2 * metrics.MAX_BODY_BYTES) + b'"}'
        status, answer = await call("/api/actions/topic/create", body=big, auth=ADMIN,
                                    headers={"X-CSRF-Token": session["csrf"],
                                             "Content-Type": "application/json"})
        assert status == 413

        off = Exporter("127.0.0.1", 0, server=server, dashboard=False)
        async with trio.open_nursery() as nursery:
            await nursery.start(off.serve)
            status, _ = await trio.to_thread.run_sync(
                lambda: _http_raw(off.port, "/dashboard/"))
            assert status == 404
            nursery.cancel_scope.cancel()

    _run(test)


def _http_raw(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
