"""Password hashing, password file and ACL rules (gateway/mqtt/auth.py)."""

from __future__ import annotations

import hashlib

import pytest
import trio

from gateway.mqtt.auth import (
    SUB_ALLOWED,
    SUB_CHECKED,
    SUB_REFUSED,
    Acl,
    Authenticator,
    filter_covers,
    filters_overlap,
    hash_password,
    read_password_file,
    verify_password,
    write_password_file,
)


def test_scrypt_hash_roundtrip_and_salted():
    h1, h2 = hash_password("pw"), hash_password("pw")
    assert h1 != h2 and h1.startswith("$scrypt$n=16384,r=8,p=1$")
    assert verify_password(b"pw", h1) and verify_password(b"pw", h2)
    assert not verify_password(b"px", h1)
    assert not verify_password(b"pw", "garbage")
    assert not verify_password(b"pw", "$scrypt$n=1073741824,r=8,p=1$AAAA$AAAA")  # too costly


def test_password_file_roundtrip(tmp_path):
    path = tmp_path / "pw"
    write_password_file(str(path), {"b": hash_password("2"), "a": hash_password("1")})
    users = read_password_file(str(path))
    assert sorted(users) == ["a", "b"]
    auth = Authenticator(allow_anonymous=False, password_file=str(path))

    async def check():
        assert await auth.authenticate("a", b"1") == 0
        assert await auth.authenticate("a", b"2") == 0x86
        assert await auth.authenticate("a", None) == 0x86
        assert await auth.authenticate("zz", b"1") == 0x86
        assert await auth.authenticate(None, None) == 0x87

    trio.run(check)


def test_unknown_user_goes_through_the_same_kdf(tmp_path, monkeypatch):
    """An unknown name costs one scrypt with the default parameters, like a known one."""
    path = tmp_path / "pw"
    write_password_file(str(path), {"known": hash_password("right")})
    auth = Authenticator(allow_anonymous=False, password_file=str(path))
    calls = []
    real = hashlib.scrypt

    def counting(password, **kw):
        calls.append((kw["n"], kw["r"], kw["p"], len(kw["salt"]), kw["dklen"]))
        return real(password, **kw)

    monkeypatch.setattr(hashlib, "scrypt", counting)

    async def attempts():
        return [await auth.authenticate(user, pw) for user, pw in (
            ("known", b"wrong"), ("nobody", b"wrong"), ("nobody", None), ("known", None),
            ("known", b"right"))]

    assert trio.run(attempts) == [0x86, 0x86, 0x86, 0x86, 0]
    # one KDF call per attempt, all with the same parameters, known name or not
    assert len(calls) == 5 and len(set(calls)) == 1, calls


def test_password_file_syntax_error(tmp_path):
    path = tmp_path / "pw"
    path.write_text("no-colon-here\n")
    with pytest.raises(ValueError, match="pw:1"):
        read_password_file(str(path))


@pytest.mark.parametrize("rule,sub,covered", [
    ("#", "a/b", True), ("a/#", "a", True), ("a/#", "a/+/c", True), ("a/+", "a/b", True),
    ("a/+", "a/+", True), ("a/+", "a/#", False), ("a/b", "a/+", False), ("+/b", "a/b", True),
    ("a/b", "a/b/c", False), ("a/b/c", "a/b", False), ("#", "#", True), ("a/+", "#", False),
])
def test_filter_covers(rule, sub, covered):
    assert filter_covers(rule, sub) is covered


@pytest.mark.parametrize("a,b,overlap", [
    ("secret/#", "#", True), ("secret/#", "public/#", False), ("a/+", "+/b", True),
    ("a/b", "a/c", False), ("a", "a/#", True), ("a/b", "a", False),
])
def test_filters_overlap(a, b, overlap):
    assert filters_overlap(a, b) is overlap


ACL = """
# comment
allow publish any devices/%c/#
allow subscribe user bob cmd/%u/+
deny subscribe any secret/#
allow subscribe any #
allow all client admin-1 #
"""


def test_acl_rules_in_order():
    acl = Acl.parse(ACL)
    assert acl.can_publish(None, "d1", "devices/d1/t")
    assert not acl.can_publish(None, "d1", "devices/d2/t")
    assert not acl.can_publish(None, "d/1", "devices/d/1/t")  # no '/' injection via %c
    assert acl.can_subscribe("bob", "x", "cmd/bob/go")
    assert not acl.can_publish("bob", "x", "cmd/bob/go")
    assert not acl.can_subscribe(None, "x", "secret/a")
    # '#' overlaps the deny above the allow: granted, and each message is checked
    assert acl.subscription(None, "x", "#") == SUB_CHECKED
    assert not acl.can_read(None, "x", "secret/a") and acl.can_read(None, "x", "open/a")
    assert acl.subscription(None, "x", "secret/#") == SUB_REFUSED  # exactly the denied one
    assert acl.subscription(None, "x", "secret/+/b") == SUB_REFUSED  # inside the subtree
    assert acl.subscription(None, "x", "open/#") == SUB_ALLOWED  # no check needed
    assert acl.can_subscribe(None, "x", "open/a")
    assert acl.can_publish(None, "admin-1", "anything")  # its own rule (publish: no deny)
    assert not acl.can_subscribe(None, "admin-1", "secret/x")  # the deny above comes first
    assert not acl.can_publish(None, "other", "anything")  # nothing matches: refused


def test_acl_syntax_error():
    with pytest.raises(ValueError, match="acl:1"):
        Acl.parse("permit everything\n", "acl")


def test_no_acl_allows_everything():
    auth = Authenticator()
    assert auth.can_publish(None, "c", "x") and auth.can_subscribe(None, "c", "#")
