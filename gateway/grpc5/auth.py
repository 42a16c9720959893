"""The RocketMQ 5 `authorization` header, checked against the 4.x plain-ACL accounts
(core/acl, docs/acl.md; docs/grpc.md "Authentication").

Every call of an official 5.x client with credentials carries

    authorization: MQv2-HMAC-SHA1 Credential=<accessKey>, SignedHeaders=x-mq-date-time,
                   Signature=<hex HMAC-SHA1(secretKey, value of x-mq-date-time)>
    x-mq-date-time: 20261125T171500Z

We accept it when the account exists, the signature matches, and the date is within
`MAX_CLOCK_SKEW_S` of ours (the signature covers only the date: without that bound a
captured header would be good forever). Then the account's topic and group permissions
apply to what the call touches, as they do for 4.x requests. Addresses on the global or
the account's white list pass as they do in the 4.x ACL.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable, Iterable
from datetime import UTC, datetime

from core.acl import AclConfig
from core.acl.permissions import check_permission, group_resource
from core.common.names import RETRY_GROUP_TOPIC_PREFIX
from gateway.grpc5.convert import GrpcError
from gateway.grpc5.proto import messaging_pb2 as pb

__all__ = ["GrpcAuth", "MAX_CLOCK_SKEW_S", "group_resource", "peer_addr"]

#: How far a client's x-mq-date-time may be from our clock (seconds).
MAX_CLOCK_SKEW_S = 15 * 60
#: Longest authorization header looked at.
MAX_HEADER_LENGTH = 1024
_SCHEME = "MQv2-HMAC-SHA1"


def peer_addr(peer: str) -> str:
    """grpc's "ipv4:1.2.3.4:5" / "ipv6:[::1]:5" -> "1.2.3.4:5" / "[::1]:5"."""
    for prefix in ("ipv4:", "ipv6:"):
        if peer.startswith(prefix):
            return peer[len(prefix):]
    return peer


def _parse(header: str) -> tuple[str, str, str]:
    """-> (access key, signed headers, signature); UNAUTHORIZED if malformed."""
    if len(header) > MAX_HEADER_LENGTH or not header.startswith(_SCHEME + " "):
        raise GrpcError(pb.UNAUTHORIZED, "malformed authorization header")
    fields: dict[str, str] = {}
    for part in header[len(_SCHEME) + 1:].split(","):
        key, sep, value = part.strip().partition("=")
        if sep:
            fields[key] = value
    try:
        return fields["Credential"], fields["SignedHeaders"], fields["Signature"]
    except KeyError:
        raise GrpcError(pb.UNAUTHORIZED, "malformed authorization header") from None


class GrpcAuth:
    """Checks a call's credentials and rights; `acl` returns the current accounts (the
    broker's guard may reload them)."""

    def __init__(self, acl: Callable[[], AclConfig],
                 now: Callable[[], float] | None = None) -> None:
        self._acl = acl
        self._now = now or (lambda: datetime.now(UTC).timestamp())

    def check(self, metadata: dict[str, str], peer: str,
              resources: Iterable[tuple[str, int]]) -> None:
        """GrpcError UNAUTHORIZED (who) or FORBIDDEN (what) unless the call may go on."""
        config = self._acl()
        addr = peer_addr(peer)
        if config.global_white.matches(addr):
            return
        header = metadata.get("authorization")
        if not header:
            raise GrpcError(pb.UNAUTHORIZED, "no authorization header (ACL is on)")
        access_key, signed, signature = _parse(header)
        account = config.accounts.get(access_key)
        if account is None:
            raise GrpcError(pb.UNAUTHORIZED, "unknown access key")
        if not account.white_remote_address.matches(addr):
            date = metadata.get("x-mq-date-time", "")
            if signed.lower() != "x-mq-date-time" or not date:
                raise GrpcError(pb.UNAUTHORIZED, "the signature must cover x-mq-date-time")
            try:
                when = datetime.strptime(date, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
            except ValueError:
                raise GrpcError(pb.UNAUTHORIZED, "malformed x-mq-date-time") from None
            if abs(when.timestamp() - self._now()) > MAX_CLOCK_SKEW_S:
                raise GrpcError(pb.UNAUTHORIZED, "x-mq-date-time too far from the server's "
                                "clock")
            expected = hmac.new(account.secret_key.encode(), date.encode(),
                                hashlib.sha1).hexdigest()
            if not hmac.compare_digest(expected, signature.lower()):
                raise GrpcError(pb.UNAUTHORIZED, "signature mismatch")
        if account.admin and not account.perms:
            return  # as the 4.x ACL: an admin account without perms of its own passes
        for resource, needed in resources:
            owned = account.perms.get(resource)
            if owned is None:
                owned = (account.default_group_perm
                         if resource.startswith(RETRY_GROUP_TOPIC_PREFIX)
                         else account.default_topic_perm)
            if not check_permission(needed, owned):
                raise GrpcError(pb.FORBIDDEN, f"no permission on {resource[:128]!r}")

