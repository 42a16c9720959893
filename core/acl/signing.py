"""Request signing of RocketMQ 4.x plain ACL, both sides (docs/acl.md §1).

The signature is HMAC-SHA1, keyed by the secret key, over the values of every ext field
except `Signature` (and `_UNIQUE_KEY_QUERY`, which Java adds after signing), taken in the
order of their keys, UTF-8 encoded and followed by the body; sent base64-encoded in the
`Signature` field beside `AccessKey` (and `SecurityToken` when one is used).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from dataclasses import dataclass

from core.remoting.client import RemotingClient
from core.remoting.codec import RemotingCommand, _normalise_ext

__all__ = [
    "ACCESS_KEY",
    "Credentials",
    "SECURITY_TOKEN",
    "SIGNATURE",
    "SigningRemotingClient",
    "compute_signature",
    "sign_request",
]

ACCESS_KEY = "AccessKey"
SECRET_KEY = "SecretKey"
SIGNATURE = "Signature"
SECURITY_TOKEN = "SecurityToken"
# Added by the Java client to a query after the hook signed it, so never signed.
UNIQUE_KEY_QUERY = "_UNIQUE_KEY_QUERY"
_UNSIGNED = frozenset((SIGNATURE, UNIQUE_KEY_QUERY))


@dataclass(frozen=True)
class Credentials:
    """An access key and its secret (and an optional security token)."""

    access_key: str
    secret_key: str
    security_token: str | None = None

    def __post_init__(self) -> None:
        if not self.access_key or not self.secret_key:
            raise ValueError("both an access key and a secret key are needed")

    def __repr__(self) -> str:  # keep secrets out of logs and tracebacks
        return f"Credentials(access_key={self.access_key!r})"


def _body_parts(body) -> tuple:
    if body is None:
        return ()
    if type(body) is list:
        return tuple(body)
    return (body,)


def compute_signature(secret_key: str, ext: dict[str, str], body) -> str:
    """Base64 HMAC-SHA1 of the signed content of a request with these fields and body."""
    mac = hmac.new(secret_key.encode("utf-8"), digestmod=hashlib.sha1)
    text = "".join(
        value for key, value in sorted(ext.items())
        if key not in _UNSIGNED and value is not None
    )
    mac.update(text.encode("utf-8"))
    for part in _body_parts(body):
        mac.update(part)
    return base64.b64encode(mac.digest()).decode("ascii")


def sign_request(cmd: RemotingCommand, credentials: Credentials) -> None:
    """Add AccessKey (SecurityToken) and Signature to `cmd`, as AclClientRPCHook does.

    Values are first turned into the strings the encoder will send, so the signature
    covers exactly what goes on the wire. Signing again (a retried command) replaces
    the old signature.
    """
    ext = _normalise_ext(dict(cmd.ext_fields) if cmd.ext_fields else {})
    ext[ACCESS_KEY] = credentials.access_key
    if credentials.security_token is not None:
        ext[SECURITY_TOKEN] = credentials.security_token
    ext.pop(SIGNATURE, None)
    ext[SIGNATURE] = compute_signature(credentials.secret_key, ext, cmd.body)
    cmd.ext_fields = ext


class SigningRemotingClient(RemotingClient):
    """A RemotingClient that signs every request it sends with `credentials`.

    Requests the server pushes back (and our answers to them) are not signed: RocketMQ's
    servers do not check what a client answers. Nor are requests to in-process servers
    (`register_local`): their guard trusts the process's own code.
    """

    def __init__(self, credentials: Credentials, **kwargs) -> None:
        super().__init__(**kwargs)
        self.credentials = credentials

    async def invoke(
        self, addr: str, cmd: RemotingCommand, timeout: float | None = None
    ) -> RemotingCommand:
        if addr not in self._local:
            sign_request(cmd, self.credentials)
        return await super().invoke(addr, cmd, timeout)

    async def invoke_oneway(self, addr: str, cmd: RemotingCommand) -> None:
        if addr not in self._local:
            sign_request(cmd, self.credentials)
        await super().invoke_oneway(addr, cmd)


def remoting_client(credentials: Credentials | None, **kwargs) -> RemotingClient:
    """A signing client when there are credentials, a plain one otherwise."""
    if credentials is None:
        return RemotingClient(**kwargs)
    return SigningRemotingClient(credentials, **kwargs)


def credentials_or_none(access_key: str | None, secret_key: str | None) -> Credentials | None:
    """Credentials from optional settings: both or neither (ValueError if only one)."""
    if not access_key and not secret_key:
        return None
    if not access_key or not secret_key:
        raise ValueError("set both the access key and the secret key, or neither")
    return Credentials(access_key, secret_key)
