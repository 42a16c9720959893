"""Authentication (password file, scrypt) and authorization (ACL file).

Password file: one `user:hash` per line, managed by `lmq mqtt passwd FILE USER`; the hash
is `$scrypt$n=<N>,r=<r>,p=<p>$<salt b64>$<key b64>` (hashlib.scrypt, 16-byte salt,
32-byte key; N=2^14, r=8, p=1 as RFC 7914 suggests for interactive logins). Verification
compares in constant time, runs in a worker thread (one scrypt costs ~40 ms of CPU: on
the event loop, ~25 bad CONNECTs a second would stall every client), at most
`password_check_threads` at once, and an unknown user name is checked against a dummy
hash of the same cost, so the answer time does not tell which names exist.

ACL file: one rule per line, first matching rule wins, lines starting with `#` are
comments:

    allow|deny  publish|subscribe|all  user <name> | client <id> | any  <topic filter>

The filter may contain `%u` (user name) and `%c` (client id); a rule using `%u` does not
apply to an anonymous client, and a substituted value holding `/`, `+` or `#` makes the
rule not apply (no wildcard injection). A publish is decided by the first rule whose
filter matches the topic; a subscription by the first rule whose filter covers the whole
requested filter; a `deny` rule refuses a subscription only when its filter covers the
whole requested filter. A `deny` rule above the deciding `allow` whose filter merely
overlaps (`deny subscribe any secret/#` above `allow subscribe any #`, subscribing to
`#`) does not refuse: the subscription is granted and each message is checked before it
is delivered (`may_read`), so `secret/...` never reaches the client, as in Mosquitto.
Nothing matching: refused when an ACL file is configured.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import os
from dataclasses import dataclass

import trio

from gateway.mqtt.topics import topic_matches

__all__ = ["Acl", "AclRule", "Authenticator", "hash_password", "verify_password",
           "read_password_file", "write_password_file", "filter_covers", "filters_overlap",
           "SUB_REFUSED", "SUB_ALLOWED", "SUB_CHECKED"]

log = logging.getLogger(__name__)

SCRYPT_N = 1 << 14
SCRYPT_R = 8
SCRYPT_P = 1

#: `Acl.subscription` answers: refused; every topic under the filter readable; granted,
#: but some topics under it are denied (check each message with `may_read`).
SUB_REFUSED = 0
SUB_ALLOWED = 1
SUB_CHECKED = 2


def hash_password(password: str, *, salt: bytes | None = None) -> str:
    """The password-file hash of `password`."""
    salt = os.urandom(16) if salt is None else salt
    key = hashlib.scrypt(password.encode("utf-8"), salt=salt, n=SCRYPT_N, r=SCRYPT_R,
                         p=SCRYPT_P, dklen=32)
    return (f"$scrypt$n={SCRYPT_N},r={SCRYPT_R},p={SCRYPT_P}$"
            f"{base64.b64encode(salt).decode()}${base64.b64encode(key).decode()}")


def verify_password(password: bytes, encoded: str) -> bool:
    """Check `password` against a `hash_password` string (False for a bad hash)."""
    try:
        _, scheme, params, salt_b64, key_b64 = encoded.split("$")
        if scheme != "scrypt":
            return False
        p = dict(item.split("=") for item in params.split(","))
        salt = base64.b64decode(salt_b64)
        key = base64.b64decode(key_b64)
        n, r, par = int(p["n"]), int(p["r"]), int(p["p"])
        if n > 1 << 20 or r > 32 or par > 16:
            return False  # refuse hashes that would cost a server minutes
        got = hashlib.scrypt(password, salt=salt, n=n, r=r, p=par, dklen=len(key),
                             maxmem=256 * 1024 * 1024)
    except (ValueError, KeyError):
        return False
    return hmac.compare_digest(got, key)


def read_password_file(path: str) -> dict[str, str]:
    users: dict[str, str] = {}
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            user, sep, encoded = line.partition(":")
            if not sep or not user:
                raise ValueError(f"{path}:{lineno}: expected user:hash")
            users[user] = encoded
    return users


def write_password_file(path: str, users: dict[str, str]) -> None:
    """Rewrite the file atomically (temp file + rename), owner-readable only."""
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        for user in sorted(users):
            fh.write(f"{user}:{users[user]}\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def filter_covers(rule: str, sub: str) -> bool:
    """Does every topic matched by filter `sub` match filter `rule`?"""
    r_levels = rule.split("/")
    s_levels = sub.split("/")
    for i, level in enumerate(r_levels):
        if level == "#":
            return True
        if i >= len(s_levels):
            return False
        s = s_levels[i]
        if s == "#":
            return False
        if level != "+" and (s == "+" or s != level):
            return False
    return len(r_levels) == len(s_levels)


def filters_overlap(a: str, b: str) -> bool:
    """Could some topic match both filters?"""
    a_levels = a.split("/")
    b_levels = b.split("/")
    for i in range(max(len(a_levels), len(b_levels))):
        x = a_levels[i] if i < len(a_levels) else None
        y = b_levels[i] if i < len(b_levels) else None
        if x == "#" or y == "#":
            return True
        if x is None or y is None:
            return False
        if x != "+" and y != "+" and x != y:
            return False
    return True


@dataclass(frozen=True, slots=True)
class AclRule:
    allow: bool
    publish: bool
    subscribe: bool
    kind: str  # "user" | "client" | "any"
    who: str
    topic: str

    def applies(self, username: str | None, client_id: str) -> bool:
        if self.kind == "user":
            return username is not None and username == self.who
        if self.kind == "client":
            return client_id == self.who
        return True

    def filter_for(self, username: str | None, client_id: str) -> str | None:
        topic = self.topic
        if "%u" in topic:
            if username is None or any(ch in username for ch in "/+#"):
                return None
            topic = topic.replace("%u", username)
        if "%c" in topic:
            if any(ch in client_id for ch in "/+#"):
                return None
            topic = topic.replace("%c", client_id)
        return topic


class Acl:
    """Rules of an ACL file, evaluated in order."""

    def __init__(self, rules: list[AclRule]) -> None:
        self.rules = rules

    @classmethod
    def parse(cls, text: str, source: str = "<acl>") -> Acl:
        rules = []
        for lineno, raw in enumerate(text.splitlines(), 1):
            line = raw.strip()
            # Whole-line comments only: a filter may itself contain '#'.
            if not line or line.startswith("#"):
                continue
            parts = line.split()
            try:
                action, what = parts[0], parts[1]
                if parts[2] == "any":
                    kind, who, topic = "any", "", parts[3]
                else:
                    kind, who, topic = parts[2], parts[3], parts[4]
                if action not in ("allow", "deny") or what not in ("publish", "subscribe", "all"):
                    raise ValueError
                if kind not in ("user", "client", "any"):
                    raise ValueError
            except (IndexError, ValueError):
                raise ValueError(f"{source}:{lineno}: expected "
                                 "'allow|deny publish|subscribe|all user X|client X|any FILTER'"
                                 ) from None
            rules.append(AclRule(action == "allow", what in ("publish", "all"),
                                 what in ("subscribe", "all"), kind, who, topic))
        return cls(rules)

    def can_publish(self, username: str | None, client_id: str, topic: str) -> bool:
        for rule in self.rules:
            if not rule.publish or not rule.applies(username, client_id):
                continue
            f = rule.filter_for(username, client_id)
            if f is not None and topic_matches(f, topic):
                return rule.allow
        return False

    def subscription(self, username: str | None, client_id: str, topic_filter: str) -> int:
        """SUB_REFUSED, SUB_ALLOWED or SUB_CHECKED (see the module doc)."""
        partial_deny = False
        for rule in self.rules:
            if not rule.subscribe or not rule.applies(username, client_id):
                continue
            f = rule.filter_for(username, client_id)
            if f is None:
                continue
            if filter_covers(f, topic_filter):
                if not rule.allow:
                    return SUB_REFUSED
                return SUB_CHECKED if partial_deny else SUB_ALLOWED
            if not rule.allow and filters_overlap(f, topic_filter):
                partial_deny = True
        return SUB_REFUSED

    def can_subscribe(self, username: str | None, client_id: str, topic_filter: str) -> bool:
        return self.subscription(username, client_id, topic_filter) != SUB_REFUSED

    def can_read(self, username: str | None, client_id: str, topic: str) -> bool:
        """May a message on `topic` be delivered? (first subscribe rule matching it)"""
        for rule in self.rules:
            if not rule.subscribe or not rule.applies(username, client_id):
                continue
            f = rule.filter_for(username, client_id)
            if f is not None and topic_matches(f, topic):
                return rule.allow
        return False


class Authenticator:
    """Password check, anonymous policy and ACL of one gateway (files read at start)."""

    def __init__(self, allow_anonymous: bool = True, password_file: str | None = None,
                 acl_file: str | None = None, *, password_check_threads: int = 2) -> None:
        self.allow_anonymous = allow_anonymous
        self.users = read_password_file(password_file) if password_file else None
        self.acl: Acl | None = None
        if acl_file:
            with open(acl_file, encoding="utf-8") as fh:
                self.acl = Acl.parse(fh.read(), acl_file)
        self._limiter = trio.CapacityLimiter(password_check_threads)
        # Unknown names are verified against this: same parameters, same cost.
        self._dummy = hash_password(os.urandom(16).hex()) if self.users is not None else ""

    def check_password(self, username: str, password: bytes | None) -> bool:
        """The scrypt check itself (blocking: call it in a worker thread)."""
        encoded = self.users.get(username)
        known = encoded is not None
        ok = verify_password(password if password is not None else b"",
                             encoded if known else self._dummy)
        return ok and known and password is not None

    async def authenticate(self, username: str | None, password: bytes | None) -> int:
        """0 if the client may connect, else the v5 CONNACK reason code."""
        if username is None:
            return 0 if self.allow_anonymous else 0x87  # Not authorized
        if self.users is None:
            return 0  # no password file: a user name is only a name (for the ACL)
        ok = await trio.to_thread.run_sync(self.check_password, username, password,
                                           limiter=self._limiter)
        return 0 if ok else 0x86  # Bad User Name or Password

    def can_publish(self, username: str | None, client_id: str, topic: str) -> bool:
        return self.acl is None or self.acl.can_publish(username, client_id, topic)

    def subscription(self, username: str | None, client_id: str, topic_filter: str) -> int:
        if self.acl is None:
            return SUB_ALLOWED
        return self.acl.subscription(username, client_id, topic_filter)

    def can_subscribe(self, username: str | None, client_id: str, topic_filter: str) -> bool:
        return self.subscription(username, client_id, topic_filter) != SUB_REFUSED

    def can_read(self, username: str | None, client_id: str, topic: str) -> bool:
        return self.acl is None or self.acl.can_read(username, client_id, topic)
