"""Password file, anonymous access and ACL through the gateway; `lmq mqtt passwd`."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gateway.mqtt.packets import Puback, Publish, Pubrec, Suback, Subscribe, Subscription
from tests.gateway.mqtt.server_harness import REPO, Client, GatewayServer, RawClient

ACL = """\
# devices write their own subtree, read commands for themselves
allow publish any devices/%c/#
allow subscribe any cmd/%c/#
allow all user admin #
deny subscribe any secret/#
allow subscribe any public/#
allow subscribe any #
allow publish user alice alice/%u/out
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("auth")
    pw = d / "passwd"
    for user, password in (("admin", "s3cret"), ("alice", "wonder")):
        r = subprocess.run([sys.executable, "-m", "lmq", "mqtt", "passwd", str(pw), user,
                            "--password", password], cwd=REPO, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
    acl = d / "acl"
    acl.write_text(ACL)
    with GatewayServer(allow_anonymous=False, password_file=str(pw), acl_file=str(acl)) as srv:
        yield srv


def test_passwd_file_uses_scrypt_and_is_private(server):
    path = server.gateway.config.password_file
    text = open(path).read()
    assert text.startswith("admin:$scrypt$") and "wonder" not in text
    assert os.stat(path).st_mode & 0o077 == 0


def test_good_and_bad_passwords(server):
    ok = Client(server.port, "pw-ok", 5, username="admin", password="s3cret")
    assert ok.rc == 0
    ok.disconnect()
    bad = RawClient(server.port, 5)
    assert bad.connect("pw-bad", username="admin", password=b"nope").reason_code == 0x86
    bad4 = RawClient(server.port, 4)
    assert bad4.connect("pw-bad4", username="admin", password=b"nope").reason_code == 4
    unknown = RawClient(server.port, 5)
    assert unknown.connect("pw-unknown", username="eve", password=b"x").reason_code == 0x86


def test_anonymous_refused(server):
    raw = RawClient(server.port, 5)
    assert raw.connect("anon").reason_code == 0x87
    raw4 = RawClient(server.port, 4)
    assert raw4.connect("anon4").reason_code == 5


def test_acl_publish_v5_puback_0x87_and_message_dropped(server):
    watcher = Client(server.port, "acl-watch", 5, username="admin", password="s3cret")
    watcher.subscribe("#", 1)
    raw = RawClient(server.port, 5)
    assert raw.connect("dev1", username="alice", password=b"wonder").reason_code == 0
    raw.send(Publish("devices/dev1/temp", b"ok", 1, packet_id=1))
    assert raw.recv_type(Puback).reason_code in (0, 0x10)
    raw.send(Publish("devices/dev2/temp", b"forged", 1, packet_id=2))
    assert raw.recv_type(Puback).reason_code == 0x87
    raw.send(Publish("devices/dev2/temp", b"forged2", 2, packet_id=3))
    assert raw.recv_type(Pubrec).reason_code == 0x87
    raw.send(Publish("alice/alice/out", b"by-user", 1, packet_id=4))
    assert raw.recv_type(Puback).reason_code in (0, 0x10)
    got = [watcher.get().payload for _ in range(2)]
    assert got == [b"ok", b"by-user"]
    assert watcher.none()
    watcher.disconnect()


def test_acl_publish_v311_acknowledged_and_dropped(server):
    watcher = Client(server.port, "acl-watch4", 4, username="admin", password="s3cret")
    watcher.subscribe("devices/#", 1)
    raw = RawClient(server.port, 4)
    raw.connect("dev3", username="alice", password=b"wonder")
    raw.send(Publish("devices/other/x", b"no", 1, packet_id=1))
    assert raw.recv_type(Puback).packet_id == 1
    assert watcher.none()
    watcher.disconnect()


def test_acl_subscribe_codes(server):
    raw = RawClient(server.port, 5)
    raw.connect("dev9", username="alice", password=b"wonder")
    raw.send(Subscribe(1, (Subscription("cmd/dev9/#", 1), Subscription("secret/x", 0),
                           Subscription("#", 0), Subscription("public/a", 0))))
    # '#' is granted (secret/... is filtered per message), secret/x refused
    assert raw.recv_type(Suback).reason_codes == (1, 0x87, 0, 0)
    raw4 = RawClient(server.port, 4)
    raw4.connect("dev10", username="alice", password=b"wonder")
    raw4.send(Subscribe(1, (Subscription("secret/y", 0),)))
    assert raw4.recv_type(Suback).reason_codes == (0x80,)


def test_passwd_delete(tmp_path):
    pw = tmp_path / "pw"
    run = [sys.executable, "-m", "lmq", "mqtt", "passwd", str(pw)]
    assert subprocess.run([*run, "bob", "--password", "x"], cwd=REPO).returncode == 0
    assert "bob:" in pw.read_text()
    assert subprocess.run([*run, "bob", "--delete"], cwd=REPO).returncode == 0
    assert "bob:" not in pw.read_text()
    assert subprocess.run([*run, "bob", "--delete"], cwd=REPO,
                          capture_output=True).returncode == 1


def test_anonymous_allowed_without_files():
    with GatewayServer() as srv:
        c = Client(srv.port, "anon-ok", 4)
        assert c.rc == 0
        c.disconnect()
