"""The web dashboard in a real headless Chromium against a real `lmq serve`.

The test puts known data in through real clients (RocketMQ producer and pull consumer,
paho MQTT, pika AMQP), opens every page, checks that the page shows that data, logs in
with the ACL admin account, browses messages, performs actions (create a topic, kick an
MQTT client) and takes a screenshot of every page into the test's temp dir.
Skipped when no Chromium is installed (`apt-get install chromium`; .ci/run does it).
"""

from __future__ import annotations

import json
import threading
import urllib.request

import paho.mqtt.client as mqtt
import pika
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from tests.gateway.amqp.broker_harness import params as amqp_params
from tests.gateway.mqtt.e2e_support import BROKER_TEST_CONFIG, free_port, write_toml
from tests.ops.browser import Browser, find_chromium
from tests.ops.test_metrics import Proc

CHROMIUM = find_chromium()
pytestmark = [pytest.mark.slow, pytest.mark.timeout(240),
              pytest.mark.skipif(CHROMIUM is None, reason="no chromium installed "
                                 "(apt-get install chromium) to drive the dashboard test")]

ADMIN = ("dashadmin", "dash-secret-1")


def _serve(tmp_path):
    acl = tmp_path / "acl.toml"
    acl.write_text(f'[[accounts]]\naccessKey = "{ADMIN[0]}"\nsecretKey = "{ADMIN[1]}"\n'
                   "admin = true\n")
    cfg = tmp_path / "lmq.toml"
    write_toml(cfg, {"acl_enable": True, "acl_file": str(acl), "namesrv_access_key": ADMIN[0],
                     "namesrv_secret_key": ADMIN[1], "broker": BROKER_TEST_CONFIG})
    ports = {name: free_port() for name in ("namesrv", "broker", "mqtt", "amqp")}
    proc = Proc(["serve", "--no-grpc", "--data-dir", str(tmp_path / "data"), "--config", str(cfg),
                 "--namesrv-port", str(ports["namesrv"]), "--broker-port", str(ports["broker"]),
                 "--mqtt-port", str(ports["mqtt"]), "--amqp-port", str(ports["amqp"]),
                 "--metrics-port", "0", "--dashboard-interval", "0.2"], tmp_path)
    return proc, ports


def _rocketmq_data(namesrv: str) -> None:
    """3 messages with keys on DashOrders; group CG_DASH consumed 1 of queue 0's."""
    from core.client.blocking import BlockingClient
    from core.common.message import Message

    creds = {"access_key": ADMIN[0], "secret_key": ADMIN[1]}
    with BlockingClient(namesrv, **creds) as client:
        client.admin().topic_create("DashOrders", read_queue_nums=1, write_queue_nums=1)
        with client.producer("PG_DASH") as producer:
            for i in range(3):
                msg = Message("DashOrders", f"order body {i}".encode())
                msg.keys = f"order-{i}"
                producer.send(msg)
        with client.pull_consumer("CG_DASH") as consumer:
            for mq in consumer.fetch_subscribe_message_queues("DashOrders"):
                consumer.update_consume_offset(mq, 1)


def _mqtt_data(port: int) -> mqtt.Client:
    """A connected persistent subscriber `dash-sub` and a retained `dash/temp` = 21.5."""
    sub = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="dash-sub", clean_session=False)
    subacked = threading.Event()
    sub.on_subscribe = lambda *a: subacked.set()
    sub.disconnected = threading.Event()

    def on_disconnect(*_args) -> None:
        sub.disconnected.set()
        sub.disconnect()  # no automatic reconnect: the dashboard shows it offline

    sub.on_disconnect = on_disconnect
    sub.connect("127.0.0.1", port)
    sub.loop_start()
    sub.subscribe("dash/#", qos=1)
    assert subacked.wait(30)
    pub = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="dash-pub")
    pub.connect("127.0.0.1", port)
    pub.loop_start()
    pub.publish("dash/temp", b"21.5", qos=1, retain=True).wait_for_publish(10)
    pub.disconnect()
    pub.loop_stop()
    return sub


def _amqp_data(port: int) -> None:
    conn = pika.BlockingConnection(amqp_params(port))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("dash-q", durable=True)
    ch.queue_bind("dash-q", "amq.topic", "dash.#")
    for i in range(2):
        ch.basic_publish("amq.topic", f"dash.{i}", b"amqp %d" % i, mandatory=True)
    conn.close()


def _open(browser: Browser, page: str, shots, name: str) -> str:
    """Show `#page`, wait until it has loaded, screenshot it, return its text."""
    browser.eval(f"location.hash = {json.dumps(page)}")
    key = page.split("?")[0]
    browser.wait(f"(() => {{ const m = document.getElementById('main'); return m.dataset.page "
                 f"=== {json.dumps(key)} && m.dataset.loaded; }})()", f"page {page}")
    assert browser.eval("document.getElementById('main').dataset.loaded") == "1", \
        browser.eval("document.body.innerText")
    browser.screenshot(shots / f"{name}.png")
    return browser.eval("document.getElementById('main').innerText")


def _topic_exists(port: int, topic: str) -> bool:
    url = f"http://127.0.0.1:{port}/api/topics?q={topic}"
    with urllib.request.urlopen(url, timeout=10) as resp:
        return any(r["topic"] == topic for r in json.load(resp)["items"])


def test_every_page_in_chromium(tmp_path):
    proc, ports = _serve(tmp_path)
    browser = sub = None
    shots = tmp_path / "screenshots"
    shots.mkdir()
    try:
        proc.wait_ready()
        _rocketmq_data(f"127.0.0.1:{ports['namesrv']}")
        sub = _mqtt_data(ports["mqtt"])
        _amqp_data(ports["amqp"])
        browser = Browser(CHROMIUM, tmp_path / "profile")
        base = f"http://127.0.0.1:{proc.metrics_port}"
        browser.goto(base + "/dashboard/")
        browser.wait("document.getElementById('main')?.dataset.loaded", "the overview")

        browser.wait("fetch('/api/overview').then(r => r.json()).then(d => d.rates.length > 5)",
                     "samples for the charts")
        text = _open(browser, "overview", shots, "01-overview")
        assert "MQTT clients" in text and "ready" in text
        cards = browser.eval("Object.fromEntries([...document.querySelectorAll('.card')].map("
                             "c => [c.querySelector('.label').innerText, "
                             "c.querySelector('.value').innerText]))")
        assert cards["MQTT clients"] == "1" and cards["AMQP queues"] == "1", cards
        assert browser.eval("document.querySelectorAll('canvas').length") == 2

        text = _open(browser, "brokers", shots, "02-brokers")
        assert "broker-a" in text and f"127.0.0.1:{ports['broker']}" in text

        text = _open(browser, "topics", shots, "03-topics")
        row = browser.eval("[...document.querySelectorAll('tr')].map(r => r.innerText)"
                           ".find(t => t.startsWith('DashOrders'))")
        assert row is not None and row.split("\t")[3] == "3", row  # 3 messages

        text = _open(browser, "groups", shots, "04-groups")
        row = browser.eval("[...document.querySelectorAll('tr')].map(r => r.innerText)"
                           ".find(t => t.startsWith('CG_DASH'))")
        assert row is not None and row.split("\t")[1] == "DashOrders", row
        assert row.split("\t")[3] == "2", row  # lag: 3 sent, offset 1 committed

        text = _open(browser, "mqtt", shots, "05-mqtt")
        assert "dash-sub" in text and "connected" in text and "dash/#" in text

        text = _open(browser, "retained", shots, "06-retained")
        assert "dash/temp" in text and "21.5" in text

        text = _open(browser, "amqp", shots, "07-amqp")
        row = browser.eval("[...document.querySelectorAll('tr')].map(r => r.innerText)"
                           ".find(t => t.startsWith('dash-q'))")
        assert row is not None and row.split("\t")[2] == "2" and "dash.#" in row, row

        # Not logged in: the message browser asks for the admin login.
        text = _open(browser, "messages", shots, "08-messages-form")
        assert "Message browser" in text
        browser.eval("location.hash = 'messages?topic=DashOrders&queue=0'")
        browser.wait("document.getElementById('main').dataset.loaded === 'error'", "refusal")
        assert "log in" in browser.eval("document.getElementById('main').innerText")

        browser.eval(f"document.getElementById('user').value = {json.dumps(ADMIN[0])};"
                     f"document.getElementById('password').value = {json.dumps(ADMIN[1])};"
                     "document.getElementById('login-form').requestSubmit()")
        browser.wait("!!document.getElementById('who')", "the login")
        text = _open(browser, "messages?topic=DashOrders&queue=0", shots, "09-messages-queue")
        assert all(f"order body {i}" in text for i in range(3)), text
        text = _open(browser, "messages?topic=DashOrders&key=order-2", shots, "10-messages-key")
        assert "order body 2" in text and "order body 1" not in text

        # Action: create a topic through the form.
        assert not _topic_exists(proc.metrics_port, "DashCreated")
        _open(browser, "topics", shots, "11-topics-admin")
        browser.eval("document.querySelector('#create-topic input[name=topic]').value = "
                     "'DashCreated'; document.getElementById('create-topic').requestSubmit()")
        browser.wait("document.getElementById('notice').innerText.includes('DashCreated')",
                     "the create notice")
        browser.wait("document.getElementById('main').innerText.includes('DashCreated')",
                     "the new topic in the list")
        browser.screenshot(shots / "12-topic-created.png")
        assert _topic_exists(proc.metrics_port, "DashCreated")

        # Action: kick the MQTT client.
        _open(browser, "mqtt", shots, "13-mqtt-admin")
        browser.eval("[...document.querySelectorAll('tr')].find(r => r.innerText.startsWith("
                     "'dash-sub')).querySelector('button').click()")
        assert sub.disconnected.wait(30), "the kicked client was not disconnected"
        browser.wait("document.getElementById('notice').innerText.includes('disconnected')",
                     "the kick notice")
        browser.wait("[...document.querySelectorAll('tr')].some(r => r.innerText.startsWith("
                     "'dash-sub') && r.innerText.includes('offline'))", "dash-sub offline")
        browser.screenshot(shots / "14-kicked.png")
        assert not browser.errors, browser.errors
    finally:
        if sub is not None:
            sub.loop_stop()
        if browser is not None:
            browser.close()
        proc.stop()
