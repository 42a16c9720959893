"""Users, virtual hosts and permissions from the users file (`lmq amqp user ...`), and the
AMQPS listener, driven by pika over a real broker."""

from __future__ import annotations

import ssl
import subprocess
import sys
import time

import pika
import pika.exceptions
import pytest

from gateway.amqp.users import UserDb, default_db
from lmq.cli import main as lmq_main
from tests.gateway.amqp.broker_harness import Gateway, params, run_gateway
from tests.gateway.amqp.test_broker_pika import _closed_with
from tests.tls_certs import certs

__all__ = ["certs"]  # fixture used below

pytestmark = pytest.mark.timeout(120)


def _connect(gw: Gateway, user: str, password: str, vhost: str = "/"):
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", gw.port, virtual_host=vhost,
        credentials=pika.PlainCredentials(user, password), connection_attempts=1,
        socket_timeout=10))


def _refused_open(gw: Gateway, *args) -> type:
    try:
        _connect(gw, *args).close()
    except pika.exceptions.AMQPConnectionError as exc:
        return type(exc)
    return type(None)


def test_cli_manages_the_users_file(tmp_path):
    path = str(tmp_path / "users.json")
    run = lambda *a: lmq_main(["amqp", *a, "--users-file", path])  # noqa: E731
    assert run("vhost", "add", "/app") == 0
    assert run("user", "add", "bob", "s3cret", "--tags", "monitoring") == 0
    assert run("user", "set-permissions", "bob", "^bob\\.", ".*", "^$", "-p", "/app") == 0
    assert run("user", "add", "bob", "again") == 2  # exists
    assert run("user", "set-permissions", "bob", "(", ".*", ".*") == 2  # bad pattern
    assert run("user", "set-permissions", "nobody", ".*", ".*", ".*") == 2
    db = UserDb.load(path)
    assert db.vhosts == ["/", "/app"]
    assert db.authenticate("bob", "s3cret") and not db.authenticate("bob", "guess")
    assert db.authenticate("guest", "guest")  # the default is where the file starts
    perms = db.permissions_of("bob", "/app")
    assert (perms.configure, perms.write, perms.read) == ("^bob\\.", ".*", "^$")
    assert "s3cret" not in open(path).read()  # only the salted hash is stored
    assert run("user", "delete", "guest") == 0
    assert run("vhost", "delete", "/app") == 0
    db = UserDb.load(path)
    assert db.vhosts == ["/"] and sorted(db.users) == ["bob"]
    assert db.permissions_of("bob", "/app") is None
    # The password can come from stdin (not the shell history).
    out = subprocess.run([sys.executable, "-m", "lmq", "amqp", "user", "change-password", "bob",
                          "--users-file", path], input="from-stdin\n", text=True,
                         capture_output=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert UserDb.load(path).authenticate("bob", "from-stdin")


def test_users_vhosts_and_permissions_as_rabbitmq(tmp_path):
    path = str(tmp_path / "users.json")
    db = default_db()
    db.add_vhost("/app")
    db.add_user("bob", "s3cret")
    db.set_permissions("bob", "/app", "^bob\\.", "^(amq\\.default|bob\\..*)$", "^bob\\.")
    db.add_user("slow", "pw")
    db.set_permissions("slow", "/app", "(a+)+$", ".*", ".*")  # catastrophic on purpose
    db.save(path)

    def client(gw: Gateway):
        out: dict = {}
        out["bad password"] = _refused_open(gw, "bob", "wrong", "/app")
        out["no rights on /"] = _refused_open(gw, "bob", "s3cret", "/")
        out["unknown vhost"] = _refused_open(gw, "bob", "s3cret", "/nope")
        conn = _connect(gw, "bob", "s3cret", "/app")
        ch = conn.channel()
        ch.queue_declare("bob.q")
        ch.basic_publish("", "bob.q", b"in /app")
        out["configure"] = _closed_with(lambda: conn.channel().queue_declare("alice.q"))
        out["read exchange"] = _closed_with(
            lambda: conn.channel().queue_bind("bob.q", "amq.direct", "k"))
        ch = conn.channel()
        got = ch.basic_get("bob.q", auto_ack=True)[2]
        # guest's "/" has its own bob.q: virtual hosts do not share names.
        guest = pika.BlockingConnection(params(gw.port))
        gch = guest.channel()
        gch.queue_declare("bob.q")
        gch.basic_publish("", "bob.q", b"in /")
        ch.basic_publish("", "bob.q", b"again in /app")
        in_root = [gch.basic_get("bob.q", auto_ack=True)[2] for _ in range(2)]
        in_app = ch.basic_get("bob.q", auto_ack=True)[2]
        guest.close()
        conn.close()
        slow = _connect(gw, "slow", "pw", "/app")
        t = time.monotonic()
        out["bounded match"] = _closed_with(
            lambda: slow.channel().queue_declare("a" * 200 + "!"))
        out["match seconds"] = time.monotonic() - t
        slow.close()
        # A user added while the server runs can log in (the file is read again).
        later = UserDb.load(path)
        later.add_user("carol", "pw")
        later.set_permissions("carol", "/", ".*", ".*", ".*")
        later.save(path)
        carol = _connect(gw, "carol", "pw", "/")
        out["carol"] = carol.is_open
        carol.close()
        return out, got, in_root, in_app

    out, got, in_root, in_app = run_gateway(tmp_path, client, users_file=path)
    assert out["bad password"] is pika.exceptions.ProbableAuthenticationError
    assert out["no rights on /"] is pika.exceptions.ProbableAccessDeniedError
    assert out["unknown vhost"] is pika.exceptions.ProbableAccessDeniedError
    assert out["configure"] == (403, "ACCESS_REFUSED - configure access to queue 'alice.q' "
                                     "in vhost '/app' refused for user 'bob'")
    assert out["read exchange"][0] == 403
    assert got == b"in /app"
    assert in_root == [b"in /", None] and in_app == b"again in /app"
    assert out["bounded match"][0] == 403 and out["match seconds"] < 5
    assert out["carol"]


def test_amqps_listener_serves_pika_over_tls(tmp_path, certs):
    cert, key = certs

    def client(gw: Gateway):
        ctx = ssl.create_default_context(cafile=cert)
        tls = pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", gw.server.tls_port, credentials=pika.PlainCredentials("guest", "guest"),
            ssl_options=pika.SSLOptions(ctx, "127.0.0.1"), connection_attempts=1,
            socket_timeout=10))
        ch = tls.channel()
        ch.queue_declare("over-tls")
        ch.confirm_delivery()
        ch.basic_publish("", "over-tls", b"secret")
        plain = pika.BlockingConnection(params(gw.port))
        body = plain.channel().basic_get("over-tls", auto_ack=True)[2]
        plain.close()
        tls.close()
        return gw.server.tls_port != gw.port, body

    assert run_gateway(tmp_path, client, tls_port=0, certfile=cert, keyfile=key) == (
        True, b"secret")


def test_tls_port_without_a_certificate_is_refused():
    from gateway.amqp.server import AmqpServerConfig

    with pytest.raises(ValueError, match="certfile"):
        AmqpServerConfig(tls_port=5671)
