"""AMQP users, virtual hosts and permissions (docs/amqp.md "Users, virtual hosts and
permissions"), kept in a JSON file managed by `lmq amqp user ...` / `lmq amqp vhost ...`.

As RabbitMQ: a user has a password and, per virtual host, three regular expressions —
configure (declare/delete queues and exchanges), write (publish to an exchange, bind a
queue to it... as the destination), read (consume, get, purge a queue; the source of a
binding). A name is allowed when the expression matches anywhere in it (RabbitMQ's
unanchored match: `.*` allows all, `^$` none, `^app\\.` a prefix). Opening a virtual host
needs some permission on it (530 NOT_ALLOWED otherwise, as RabbitMQ); a refused operation
is 403 ACCESS_REFUSED on the channel.

Without a file the built-in default is RabbitMQ's: virtual host `/` and user
`guest`/`guest` with `.*` everywhere on it (and `guest` from loopback only: the
server's `guest_loopback_only`).

Passwords are stored as salted PBKDF2-HMAC-SHA256 (`PASSWORD_ITERATIONS` rounds), checked
in a worker thread. The expressions are the operator's, but the names are the peer's:
each match runs with the `regex` module's timeout (`MATCH_TIMEOUT_S`; a match that runs
out is a refusal), and answers are cached per connection.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import os
import secrets
import tempfile
from dataclasses import dataclass, field
from typing import Any

import regex

__all__ = ["UserDb", "Permissions", "hash_password", "check_password", "MATCH_TIMEOUT_S",
           "PASSWORD_ITERATIONS", "MAX_USERS", "MAX_VHOSTS", "MAX_PATTERN_LENGTH",
           "default_db"]

log = logging.getLogger(__name__)

#: PBKDF2 rounds of a stored password (about 30 ms of one core per login, in a thread).
PASSWORD_ITERATIONS = 60_000
#: Longest one permission match may run (the `regex` module's timeout); past it: refused.
MATCH_TIMEOUT_S = 0.01
#: Bounds of the file (checked when it is written and when it is read).
MAX_USERS = 10_000
MAX_VHOSTS = 1_000
MAX_PATTERN_LENGTH = 1_000
MAX_FILE_BYTES = 16 * 1024 * 1024
KINDS = ("configure", "write", "read")


def hash_password(password: str, salt: bytes | None = None,
                  iterations: int = PASSWORD_ITERATIONS) -> str:
    salt = salt or secrets.token_bytes(16)
    digest = hashlib.pbkdf2_hmac("sha256", password.encode("utf-8", "surrogateescape"),
                                 salt, iterations)
    b64 = base64.b64encode
    return f"pbkdf2-sha256${iterations}${b64(salt).decode()}${b64(digest).decode()}"


def check_password(stored: str, password: str) -> bool:
    try:
        scheme, iterations, salt, digest = stored.split("$")
        if scheme != "pbkdf2-sha256":
            return False
        n = int(iterations)
        if not 1 <= n <= 10 * PASSWORD_ITERATIONS:
            return False
        want = base64.b64decode(digest)
        got = hashlib.pbkdf2_hmac("sha256", password.encode("utf-8", "surrogateescape"),
                                  base64.b64decode(salt), n)
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(want, got)


def _compile(pattern: str) -> Any:
    if len(pattern) > MAX_PATTERN_LENGTH:
        raise ValueError(f"permission pattern longer than {MAX_PATTERN_LENGTH} characters")
    try:
        return regex.compile(pattern)
    except regex.error as exc:
        raise ValueError(f"bad permission pattern {pattern!r}: {exc}") from None


@dataclass
class Permissions:
    """One user's three expressions on one virtual host."""

    configure: str = ".*"
    write: str = ".*"
    read: str = ".*"
    _compiled: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def allows(self, kind: str, name: str) -> bool:
        compiled = self._compiled.get(kind)
        if compiled is None:
            compiled = self._compiled[kind] = _compile(getattr(self, kind))
        try:
            return compiled.search(name, timeout=MATCH_TIMEOUT_S) is not None
        except TimeoutError:
            log.warning("AMQP permission match of %s pattern timed out: refused", kind)
            return False


@dataclass
class UserDb:
    """Users (password hash, tags), virtual hosts and permissions[vhost][user]."""

    users: dict[str, dict[str, Any]] = field(default_factory=dict)
    vhosts: list[str] = field(default_factory=list)
    permissions: dict[str, dict[str, Permissions]] = field(default_factory=dict)

    # ------------------------------------------------------------------ queries
    def authenticate(self, username: str, password: str) -> bool:
        user = self.users.get(username)
        if user is None:
            # Same work for an unknown user: timing says nothing about who exists.
            check_password(_dummy(), password)
            return False
        return check_password(user.get("password", ""), password)

    def vhost_access(self, username: str, vhost: str) -> bool | str:
        """Connection.Open: True, False (unknown vhost) or the refusal text."""
        if vhost not in self.vhosts:
            return False
        if username not in self.permissions.get(vhost, {}):
            return f"NOT_ALLOWED - access to vhost '{vhost}' refused for user '{username}'"
        return True

    def permissions_of(self, username: str, vhost: str) -> Permissions | None:
        return self.permissions.get(vhost, {}).get(username)

    # ------------------------------------------------------------------ changes
    def add_user(self, name: str, password: str, tags: list[str] | None = None) -> None:
        if not name or len(name) > 255:
            raise ValueError("a user name is 1..255 characters")
        if name in self.users:
            raise ValueError(f"user '{name}' already exists")
        if len(self.users) >= MAX_USERS:
            raise ValueError(f"at most {MAX_USERS} users")
        self.users[name] = {"password": hash_password(password), "tags": list(tags or [])}

    def change_password(self, name: str, password: str) -> None:
        self._user(name)["password"] = hash_password(password)

    def delete_user(self, name: str) -> None:
        self._user(name)
        del self.users[name]
        for perms in self.permissions.values():
            perms.pop(name, None)

    def add_vhost(self, vhost: str) -> None:
        if not vhost or len(vhost) > 255:
            raise ValueError("a virtual host name is 1..255 characters")
        if vhost in self.vhosts:
            raise ValueError(f"virtual host '{vhost}' already exists")
        if len(self.vhosts) >= MAX_VHOSTS:
            raise ValueError(f"at most {MAX_VHOSTS} virtual hosts")
        self.vhosts.append(vhost)

    def delete_vhost(self, vhost: str) -> None:
        if vhost not in self.vhosts:
            raise ValueError(f"no virtual host '{vhost}'")
        self.vhosts.remove(vhost)
        self.permissions.pop(vhost, None)

    def set_permissions(self, name: str, vhost: str, configure: str, write: str,
                        read: str) -> None:
        self._user(name)
        if vhost not in self.vhosts:
            raise ValueError(f"no virtual host '{vhost}'")
        for pattern in (configure, write, read):
            _compile(pattern)
        self.permissions.setdefault(vhost, {})[name] = Permissions(configure, write, read)

    def clear_permissions(self, name: str, vhost: str) -> None:
        self._user(name)
        self.permissions.get(vhost, {}).pop(name, None)

    def _user(self, name: str) -> dict[str, Any]:
        user = self.users.get(name)
        if user is None:
            raise ValueError(f"no user '{name}'")
        return user

    # ------------------------------------------------------------------ file
    def to_json(self) -> dict[str, Any]:
        return {"vhosts": list(self.vhosts), "users": self.users,
                "permissions": {v: {u: {k: getattr(p, k) for k in KINDS}
                                    for u, p in perms.items()}
                                for v, perms in self.permissions.items()}}

    @classmethod
    def from_json(cls, data: Any) -> UserDb:
        if not isinstance(data, dict):
            raise ValueError("the users file holds one JSON object")
        vhosts = data.get("vhosts", [])
        users = data.get("users", {})
        perms = data.get("permissions", {})
        if not (isinstance(vhosts, list) and all(isinstance(v, str) for v in vhosts)):
            raise ValueError("'vhosts' must be a list of names")
        if not isinstance(users, dict) or not all(
                isinstance(u, dict) and isinstance(u.get("password", ""), str)
                for u in users.values()):
            raise ValueError("'users' must map names to {password, tags}")
        if len(users) > MAX_USERS or len(vhosts) > MAX_VHOSTS:
            raise ValueError("too many users or virtual hosts")
        db = cls(dict(users), list(vhosts), {})
        if not isinstance(perms, dict):
            raise ValueError("'permissions' must map vhosts to users")
        for vhost, by_user in perms.items():
            if not isinstance(by_user, dict):
                raise ValueError(f"permissions of '{vhost}' must map users to patterns")
            for user, p in by_user.items():
                if not isinstance(p, dict) or not all(isinstance(p.get(k, ""), str)
                                                      for k in KINDS):
                    raise ValueError(f"permissions of '{user}' in '{vhost}' are malformed")
                for k in KINDS:
                    _compile(p.get(k, "^$"))
                db.permissions.setdefault(vhost, {})[user] = Permissions(
                    *(p.get(k, "^$") for k in KINDS))
        return db

    @classmethod
    def load(cls, path: str) -> UserDb:
        """The file's database; RabbitMQ's default when the file does not exist."""
        try:
            with open(path, "rb") as fh:
                raw = fh.read(MAX_FILE_BYTES + 1)
        except FileNotFoundError:
            return default_db()
        if len(raw) > MAX_FILE_BYTES:
            raise ValueError(f"{path} is larger than {MAX_FILE_BYTES} bytes")
        try:
            return cls.from_json(json.loads(raw))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not JSON: {exc}") from None

    def save(self, path: str) -> None:
        """Write atomically (a temporary file renamed over it), readable by the owner only."""
        directory = os.path.dirname(os.path.abspath(path))
        fd, tmp = tempfile.mkstemp(prefix=".amqp-users-", dir=directory)
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump(self.to_json(), fh, indent=1, sort_keys=True)
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(tmp, 0o600)
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise


_DUMMY: list[str] = []


def _dummy() -> str:
    if not _DUMMY:
        _DUMMY.append(hash_password("", b"\0" * 16))
    return _DUMMY[0]


def default_db() -> UserDb:
    """RabbitMQ's out-of-the-box state: vhost `/`, user guest/guest with all rights."""
    db = UserDb()
    db.vhosts.append("/")
    # The default password is public: one round is as good as many for it.
    db.users["guest"] = {"password": hash_password("guest", iterations=1),
                         "tags": ["administrator"]}
    db.permissions["/"] = {"guest": Permissions()}
    return db


class UserFile:
    """The database behind a running server: read again when the file changes (its
    modification time and size are checked before each login, in the login's thread)."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self.db = default_db() if not path else UserDb.load(path)
        self._stamp = self._file_stamp()

    def _file_stamp(self) -> tuple[int, int] | None:
        if not self.path:
            return None
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size

    def refresh(self) -> None:
        """Reload if the file changed; a file that does not load keeps the old state."""
        stamp = self._file_stamp()
        if stamp == self._stamp:
            return
        try:
            self.db = UserDb.load(self.path) if self.path else default_db()
        except (OSError, ValueError) as exc:
            log.error("AMQP users file %s not reloaded: %s", self.path, exc)
        self._stamp = stamp

    def authenticate(self, username: str, password: str) -> bool:
        """Runs in a worker thread (PBKDF2)."""
        self.refresh()
        return self.db.authenticate(username, password)
