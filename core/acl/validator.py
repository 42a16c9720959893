"""`PlainAclGuard`: the check every request passes before its handler (docs/acl.md §3).

Installed as the processor table's guard (`ProcessorTable.set_guard`). Order, as
RocketMQ's PlainPermissionManager: global whitelist -> known access key -> per-account
whitelist -> signature -> admin right -> per-resource permissions. A refusal is
RocketMQ's own answer: SYSTEM_ERROR (1) with an `AclException` remark.
"""

from __future__ import annotations

import hmac
import logging
from dataclasses import dataclass

import trio

from core.acl.config import Account, AclConfig
from core.acl.permissions import (
    BodyTooLarge,
    check_permission,
    gateway_only,
    needs_admin,
    request_resources,
)
from core.acl.signing import ACCESS_KEY, SIGNATURE, compute_signature
from core.common.names import RETRY_GROUP_TOPIC_PREFIX
from core.remoting.codec import RemotingCommand
from core.remoting.codes import ResponseCode
from core.remoting.local import LocalConnection
from core.remoting.processor import RequestContext

__all__ = [
    "IN_PROCESS",
    "PlainAclGuard",
    "Principal",
    "may_write_inner",
]

log = logging.getLogger(__name__)

REFUSAL_LOG_INTERVAL_S = 1.0  # at most one "ACL refused" line per second (docs/acl.md)

#: Bodies larger than this are hashed in a worker thread (hashlib releases the GIL), so a
#: big signed send never holds the event loop.
THREAD_HASH_BYTES = 256 * 1024

_EXCEPTION = "org.apache.rocketmq.acl.common.AclException: "


@dataclass(frozen=True)
class Principal:
    """Who a request comes from, as the handlers see it (`ctx.principal`)."""

    name: str
    admin: bool = False
    inner_properties: bool = False

    @property
    def may_write_inner(self) -> bool:
        return self.admin or self.inner_properties


#: An in-process peer (the embedded gateway): the server's own code, fully trusted.
IN_PROCESS = Principal("in-process", admin=True, inner_properties=True)
#: A request admitted by the global whitelist without an account check.
WHITELISTED = Principal("whitelisted")


def _principal_of(account: Account) -> Principal:
    return Principal(account.access_key, account.admin, account.inner_properties)


def may_write_inner(ctx: RequestContext, *, acl_enable: bool, allow_without_acl: bool) -> bool:
    """May this request set INNER_* properties? (docs/acl.md §4)."""
    principal = ctx.principal
    if principal is not None:
        return principal.may_write_inner
    if isinstance(ctx.connection, LocalConnection):
        return True
    return not acl_enable and allow_without_acl


class AclError(Exception):
    pass


class PlainAclGuard:
    """Checks requests against an AclConfig; `config` may be replaced to reload."""

    def __init__(self, config: AclConfig, *, trust_in_process: bool = True) -> None:
        self._principals: dict[str, Principal] = {}
        self.config = config
        self.trust_in_process = trust_in_process
        self.refused = 0
        self._refusal_logged_at = float("-inf")
        self._refusals_unlogged = 0

    @property
    def config(self) -> AclConfig:
        return self._config

    @config.setter
    def config(self, config: AclConfig) -> None:
        self._config = config
        self._principals = {ak: _principal_of(a) for ak, a in config.accounts.items()}

    async def __call__(
        self, ctx: RequestContext, cmd: RemotingCommand
    ) -> RequestContext | RemotingCommand:
        """The context the handler should see, or the refusal to send instead."""
        if self.trust_in_process and isinstance(ctx.connection, LocalConnection):
            return ctx.with_principal(IN_PROCESS)
        try:
            principal = await self.validate(ctx.remote_addr, cmd)
        except AclError as exc:
            self.refused += 1
            self._log_refusal(ctx.remote_addr, cmd.code, str(exc))
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, _EXCEPTION + str(exc))
        return ctx.with_principal(principal)

    def _log_refusal(self, remote_addr: str, code: int, why: str) -> None:
        """One line per refused request, at most one per REFUSAL_LOG_INTERVAL_S: a client
        sending refused requests in a loop cannot fill the log (the line says how many
        were left out). The reason may quote what the client sent: cut to 200 characters."""
        now = trio.current_time()
        if now - self._refusal_logged_at < REFUSAL_LOG_INTERVAL_S:
            self._refusals_unlogged += 1
            return
        self._refusal_logged_at = now
        skipped, self._refusals_unlogged = self._refusals_unlogged, 0
        log.info("ACL refused request code %d from %s: %s%s", code, remote_addr, why[:200],
                 f" ({skipped} more refused since the last line)" if skipped else "")

    async def validate(self, remote_addr: str, cmd: RemotingCommand) -> Principal:
        """The request's principal; AclError says why it is refused."""
        config, principals = self._config, self._principals  # one snapshot (reloads)
        if config.global_white.matches(remote_addr):
            return WHITELISTED
        ext = cmd.ext_fields
        access_key = ext.get(ACCESS_KEY) if ext else None
        if not access_key:
            raise AclError("No accessKey is configured")
        account = config.accounts.get(access_key)
        if account is None:
            raise AclError(f"No acl config for {_printable(access_key)}")
        # RocketMQ skips the signature for an account's own whitelisted addresses; the
        # permissions below still apply (ours: RocketMQ would skip them too).
        if not account.white_remote_address.matches(remote_addr):
            await self._check_signature(account, cmd)
        self._check_rights(account, cmd)
        return principals[access_key]

    async def _check_signature(self, account: Account, cmd: RemotingCommand) -> None:
        ext = cmd.ext_fields or {}
        given = ext.get(SIGNATURE)
        if not isinstance(given, str) or not given:
            raise AclError(f"Check signature failed for accessKey={account.access_key}")
        if cmd.body_length > THREAD_HASH_BYTES:
            expected = await trio.to_thread.run_sync(
                compute_signature, account.secret_key, ext, cmd.body
            )
        else:
            expected = compute_signature(account.secret_key, ext, cmd.body)
        if not hmac.compare_digest(expected.encode(), given.encode("utf-8", "replace")):
            raise AclError(f"Check signature failed for accessKey={account.access_key}")

    def _check_rights(self, account: Account, cmd: RemotingCommand) -> None:
        if needs_admin(cmd.code) and not account.admin:
            raise AclError(
                f"Need admin permission for request code={cmd.code}, "
                f"but accessKey={account.access_key} is not"
            )
        perms = account.perms
        if account.admin and not perms:
            return  # RocketMQ: an admin account without its own perms passes them all
        try:
            resources = list(request_resources(cmd))
        except BodyTooLarge as exc:
            raise AclError(str(exc)) from None
        self._check_resources(account, resources)

    def in_process_refusal(self, access_key: str | None,
                           resources: list[tuple[str, int]]) -> str | None:
        """Why an in-process call (core/broker/local_send.py) made with `access_key`'s
        rights may not touch `resources`, as a request of that account would be refused
        (None: allowed). An in-process peer is trusted when `trust_in_process` is set."""
        if self.trust_in_process:
            return None
        config = self._config
        account = config.accounts.get(access_key) if access_key else None
        if account is None:
            return _EXCEPTION + (f"No acl config for {_printable(access_key)}" if access_key
                                 else "No accessKey is configured")
        if account.admin and not account.perms:
            return None
        try:
            self._check_resources(account, resources)
        except AclError as exc:
            return _EXCEPTION + str(exc)
        return None

    def principal(self, access_key: str | None) -> Principal | None:
        """The principal of an account (None: no such account)."""
        return self._principals.get(access_key) if access_key else None

    @staticmethod
    def _check_resources(account: Account, resources: list[tuple[str, int]]) -> None:
        perms = account.perms
        gateway = account.admin or account.inner_properties
        for resource, needed in resources:
            if not gateway and gateway_only(resource):
                raise AclError(
                    f"{_printable(resource)} is reserved for gateway accounts "
                    f"(accessKey={account.access_key})"
                )
            owned = perms.get(resource)
            if owned is None:
                owned = (
                    account.default_group_perm
                    if resource.startswith(RETRY_GROUP_TOPIC_PREFIX)
                    else account.default_topic_perm
                )
            if not check_permission(needed, owned):
                raise AclError(
                    f"No permission for {_printable(resource)} "
                    f"(needed {needed}, accessKey={account.access_key})"
                )


def _printable(text: str, limit: int = 128) -> str:
    """A peer-chosen name as it may appear in a remark or log: bounded, one line."""
    text = text[:limit]
    return text.encode("unicode_escape").decode("ascii")
