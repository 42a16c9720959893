"""RocketMQ 4.x plain ACL: accounts, permissions, request signing and the request guard.

Sits between core/remoting (below) and the broker, name server and client (above):
servers install `PlainAclGuard` on their processor table, clients sign with
`SigningRemotingClient` / `sign_request`. Facts and choices: docs/acl.md.
"""

from core.acl.config import Account, AclConfig, load_acl_file, parse_acl
from core.acl.signing import (
    Credentials,
    SigningRemotingClient,
    compute_signature,
    credentials_or_none,
    remoting_client,
    sign_request,
)
from core.acl.validator import IN_PROCESS, PlainAclGuard, Principal, may_write_inner

__all__ = [
    "IN_PROCESS",
    "Account",
    "AclConfig",
    "Credentials",
    "PlainAclGuard",
    "Principal",
    "SigningRemotingClient",
    "compute_signature",
    "credentials_or_none",
    "guard_from_file",
    "load_acl_file",
    "may_write_inner",
    "parse_acl",
    "remoting_client",
    "sign_request",
]


def guard_from_file(path: str | None) -> PlainAclGuard:
    """The guard of a server with ACL enabled; without a file every request is refused
    (no accounts), which is the safe reading of "ACL on, nothing configured"."""
    config = load_acl_file(path) if path else AclConfig()
    return PlainAclGuard(config)
