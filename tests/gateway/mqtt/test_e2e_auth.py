"""Acceptance: password file (`lmq mqtt passwd`) and ACL file — refused CONNECTs per
version (v5 0x86 / 0x87, 3.1.1 return codes 4 / 5), denied subscriptions (v5 SUBACK 0x87,
3.1.1 0x80) and denied publishes (v5 PUBACK 0x87, never delivered).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from gateway.mqtt.packets import Connack, Puback, Publish, Subscription, Will
from tests.gateway.mqtt.e2e_support import (
    DEFAULT_TEST_CONFIG,
    REPO,
    Client,
    RawClient,
    gateway_only,
    make_gateway,
    uid,
)

pytestmark = gateway_only

USERS = {"alice": "wonderland", "bob": "builder"}
ACL = """\
# first matching rule wins
allow all user alice alice/#
allow subscribe user alice public/#
allow all user bob bob/#
allow publish user bob public/#
allow all any devices/%u/#
"""


def add_user(password_file: Path, user: str, password: str) -> subprocess.CompletedProcess:
    """`lmq mqtt passwd FILE USER --password -` (the password read from stdin)."""
    return subprocess.run(
        [sys.executable, "-m", "lmq", "mqtt", "passwd", str(password_file), user, "--password", "-"],
        input=f"{password}\n", capture_output=True, text=True, cwd=REPO, timeout=60,
    )


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    root = tmp_path_factory.mktemp("gw-auth")
    pw = root / "passwd"
    for user, password in USERS.items():
        done = add_user(pw, user, password)
        assert done.returncode == 0, done.stderr
    acl = root / "acl"
    acl.write_text(ACL)
    gw = make_gateway(root / "srv", {**DEFAULT_TEST_CONFIG, "allow_anonymous": False,
                                     "password_file": str(pw), "acl_file": str(acl)})
    gw.start()
    yield gw
    gw.stop()


def test_passwd_file_holds_hashes_not_passwords(secured):
    text = (secured.root.parent / "passwd").read_text()
    lines = dict(line.split(":", 1) for line in text.splitlines() if line)
    assert set(lines) == set(USERS)
    for user, password in USERS.items():
        assert password not in lines[user]
        assert lines[user].startswith("$scrypt$")


def test_passwd_replaces_a_password(tmp_path):
    pw = tmp_path / "passwd"
    assert add_user(pw, "carol", "one").returncode == 0
    first = pw.read_text()
    assert add_user(pw, "carol", "two").returncode == 0
    second = pw.read_text()
    assert first != second and second.count("carol:") == 1


@pytest.mark.parametrize("version", [4, 5], ids=["v3.1.1", "v5"])
def test_valid_credentials_accepted(secured, version):
    c = RawClient(secured.port, version)
    try:
        ack = c.connect("a-" + uid(), username="alice", password=b"wonderland")
        assert (ack.reason_code, ack.session_present) == (0, False)
    finally:
        c.close()


@pytest.mark.parametrize(
    "version,username,password,code",
    [
        (5, "alice", b"wrong", 0x86),  # Bad User Name or Password
        (5, "mallory", b"x", 0x86),
        (5, "alice", None, 0x86),
        (5, None, None, 0x87),  # Not authorized: anonymous not allowed
        (4, "alice", b"wrong", 4),  # 3.1.1: bad user name or password
        (4, "mallory", b"x", 4),
        (4, None, None, 5),  # 3.1.1: not authorized
    ],
    ids=["v5-bad-pw", "v5-unknown", "v5-no-pw", "v5-anon", "v311-bad-pw", "v311-unknown", "v311-anon"],
)
def test_refused_credentials(secured, version, username, password, code):
    c = RawClient(secured.port, version)
    try:
        ack = c.connect("r-" + uid(), username=username, password=password)
        assert isinstance(ack, Connack)
        assert (ack.reason_code, ack.session_present) == (code, False)
        assert c.until_closed() == []  # and the connection is closed (MQTT-3.2.2-5)
    finally:
        c.close()


def _login(gw, user: str, version: int) -> RawClient:
    c = RawClient(gw.port, version)
    assert c.connect(f"{user}-{uid()}", username=user, password=USERS[user].encode()).reason_code == 0
    return c


@contextmanager
def _logins(gw, *who: tuple[str, int]) -> Iterator[list[RawClient]]:
    """One logged-in raw client per (user, MQTT version), in order; all closed at the end."""
    made: list[RawClient] = []
    try:
        for user, version in who:
            made.append(_login(gw, user, version))
        yield made
    finally:
        for c in made:
            c.close()


@pytest.mark.parametrize("version,denied", [(5, 0x87), (4, 0x80)], ids=["v5", "v3.1.1"])
def test_subscribe_denied_per_filter(secured, version, denied):
    c = _login(secured, "alice", version)
    try:
        ack = c.subscribe(
            Subscription("alice/inbox/#", qos=1),
            Subscription("bob/#", qos=1),  # bob's
            Subscription("public/news", qos=2),  # alice may read public/#
            Subscription("#", qos=0),  # wider than anything alice may read
        )
        assert list(ack.reason_codes) == [1, denied, 2, denied]
    finally:
        c.close()


def test_publish_denied_v5_puback_0x87_and_not_delivered(secured):
    with _logins(secured, ("bob", 5), ("alice", 5)) as (bob, alice):
        bob.subscribe(Subscription("bob/#", qos=1))
        ack = alice.publish_qos1("bob/door", b"open", packet_id=1)
        assert ack.reason_code == 0x87
        bob.nothing()
        # Bob's own topic works, so the silence above is the ACL's doing.
        assert bob.publish_qos1("bob/door", b"mine", packet_id=2).reason_code == 0
        got = bob.expect(Publish)
        assert (got.topic, got.payload) == ("bob/door", b"mine")


def test_publish_denied_v311_not_delivered(secured):
    with _logins(secured, ("bob", 5), ("alice", 4)) as (bob, alice):
        bob.subscribe(Subscription("bob/#", qos=1))
        alice.send(Publish("bob/door", b"open", qos=1, packet_id=1))
        # 3.1.1 has no negative PUBACK: the server acknowledges or closes; never delivers.
        try:
            p = alice.recv()
            assert p == Puback(1)
        except Exception:  # noqa: BLE001 - closed is also allowed
            pass
        bob.nothing()


def test_acl_allows_what_it_allows(secured):
    with _logins(secured, ("alice", 5), ("bob", 5)) as (alice, bob):
        alice.subscribe(Subscription("public/#", qos=1))
        assert bob.publish_qos1("public/news", b"hello", packet_id=1).reason_code == 0
        got = alice.expect(Publish)
        assert (got.topic, got.payload) == ("public/news", b"hello")
        # alice may only read public/#, not write it
        assert alice.publish_qos1("public/news", b"nope", packet_id=1).reason_code == 0x87


def test_acl_user_substitution(secured):
    # A second connection of alice's publishes: the subscriber's own PUBLISH could
    # otherwise arrive before the PUBACK its publish_qos1 reads.
    with _logins(secured, ("alice", 5), ("alice", 5), ("bob", 5)) as (alice, alice_pub, bob):
        ack = alice.subscribe(Subscription("devices/alice/#", qos=1),
                              Subscription("devices/bob/#", qos=1))
        assert list(ack.reason_codes) == [1, 0x87]
        assert bob.publish_qos1("devices/alice/x", b"no", packet_id=1).reason_code == 0x87
        assert alice_pub.publish_qos1("devices/alice/x", b"yes", packet_id=2).reason_code == 0
        assert alice.expect(Publish).payload == b"yes"


def test_will_to_a_denied_topic_refused_at_connect(secured):
    bob = _login(secured, "bob", 5)
    alice = RawClient(secured.port, 5)
    try:
        bob.subscribe(Subscription("bob/#", qos=1))
        # alice may not write bob/#: the will is checked at CONNECT (docs/mqtt.md).
        ack = alice.connect("aw-" + uid(), username="alice", password=b"wonderland",
                            will=Will("bob/will", b"from alice", qos=1))
        assert ack.reason_code == 0x87
        alice.until_closed()
        bob.nothing()
    finally:
        bob.close()
        alice.close()


def test_server_still_serves_after_refusals(secured):
    for _ in range(5):
        c = RawClient(secured.port, 5)
        c.connect("x-" + uid(), username="alice", password=b"bad")
        c.close()
    ok = Client(secured.port, version=5)
    try:
        assert ok.connect(username="bob", password="builder")[0] == 0
    finally:
        ok.close()
