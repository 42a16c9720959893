"""The ACL file: RocketMQ's plain_acl.yml keys, written as TOML (docs/acl.md §2).

    globalWhiteRemoteAddresses = ["10.10.103.*"]

    [[accounts]]
    accessKey = "RocketMQ"
    secretKey = "12345678"
    whiteRemoteAddress = ""
    admin = false
    defaultTopicPerm = "DENY"
    defaultGroupPerm = "SUB"
    topicPerms = ["topicA=DENY", "topicB=PUB|SUB", "topicC=SUB"]
    groupPerms = ["groupA=DENY", "groupB=PUB|SUB", "groupC=SUB"]
    innerProperties = false      # ours: may set INNER_* properties (gateway accounts)
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from typing import Any

from core.acl.addresses import AddressPattern
from core.acl.permissions import DENY, group_resource, parse_perm

__all__ = ["Account", "AclConfig", "load_acl_file", "parse_acl"]

#: RocketMQ refuses access and secret keys shorter than this.
MIN_KEY_LENGTH = 6

_ACCOUNT_KEYS = {
    "accessKey", "secretKey", "whiteRemoteAddress", "admin", "defaultTopicPerm",
    "defaultGroupPerm", "topicPerms", "groupPerms", "innerProperties",
}
_TOP_KEYS = {"globalWhiteRemoteAddresses", "accounts"}


@dataclass(eq=False)
class Account:
    """One accessKey with its secret and rights. `perms` maps topics and `%RETRY%<group>`
    names to permission bits."""

    access_key: str
    secret_key: str
    white_remote_address: AddressPattern = field(default_factory=AddressPattern)
    admin: bool = False
    default_topic_perm: int = DENY
    default_group_perm: int = DENY
    perms: dict[str, int] = field(default_factory=dict)
    inner_properties: bool = False

    @property
    def may_write_inner(self) -> bool:
        """May set broker-internal properties (INNER_MULTI_DISPATCH ...)."""
        return self.admin or self.inner_properties

    def __repr__(self) -> str:  # never print the secret
        return f"<Account {self.access_key} admin={self.admin}>"


@dataclass
class AclConfig:
    global_white: AddressPattern = field(default_factory=AddressPattern)
    accounts: dict[str, Account] = field(default_factory=dict)


def _perm_entries(raw: Any, what: str, key_of) -> dict[str, int]:
    if raw is None:
        return {}
    if not isinstance(raw, list):
        raise ValueError(f"{what} must be a list of 'name=PERM' strings")
    out: dict[str, int] = {}
    for entry in raw:
        name, sep, word = str(entry).partition("=")
        if not sep or not name.strip():
            raise ValueError(f"bad {what} entry {entry!r}, expected 'name=PERM'")
        out[key_of(name.strip())] = parse_perm(word)
    return out


def _bool(value: Any, what: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise ValueError(f"{what} must be true or false")


def _addresses(value: Any, what: str) -> AddressPattern:
    if value is None:
        return AddressPattern()
    if isinstance(value, str):
        return AddressPattern([value])
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return AddressPattern(value)
    raise ValueError(f"{what} must be a string or a list of strings")


def parse_acl(data: dict[str, Any]) -> AclConfig:
    """Build an AclConfig from a loaded mapping; ValueError names the bad entry."""
    unknown = set(data) - _TOP_KEYS
    if unknown:
        raise ValueError(f"unknown ACL keys: {', '.join(sorted(unknown))}")
    config = AclConfig(
        global_white=_addresses(data.get("globalWhiteRemoteAddresses"),
                                "globalWhiteRemoteAddresses"),
    )
    for i, raw in enumerate(data.get("accounts") or []):
        if not isinstance(raw, dict):
            raise ValueError(f"accounts[{i}] must be a table")
        unknown = set(raw) - _ACCOUNT_KEYS
        if unknown:
            raise ValueError(f"unknown keys in accounts[{i}]: {', '.join(sorted(unknown))}")
        ak = str(raw.get("accessKey") or "")
        sk = str(raw.get("secretKey") or "")
        if len(ak) < MIN_KEY_LENGTH or len(sk) < MIN_KEY_LENGTH:
            raise ValueError(
                f"accounts[{i}]: accessKey and secretKey need at least {MIN_KEY_LENGTH} characters"
            )
        if ak in config.accounts:
            raise ValueError(f"accounts[{i}]: accessKey {ak!r} appears twice")
        perms = _perm_entries(raw.get("topicPerms"), "topicPerms", lambda n: n)
        perms.update(_perm_entries(raw.get("groupPerms"), "groupPerms", group_resource))
        config.accounts[ak] = Account(
            access_key=ak,
            secret_key=sk,
            white_remote_address=_addresses(raw.get("whiteRemoteAddress"),
                                            f"accounts[{i}].whiteRemoteAddress"),
            admin=_bool(raw.get("admin", False), f"accounts[{i}].admin"),
            default_topic_perm=parse_perm(str(raw.get("defaultTopicPerm", "DENY"))),
            default_group_perm=parse_perm(str(raw.get("defaultGroupPerm", "DENY"))),
            perms=perms,
            inner_properties=_bool(raw.get("innerProperties", False),
                                   f"accounts[{i}].innerProperties"),
        )
    return config


def load_acl_file(path: str) -> AclConfig:
    """Read and parse a TOML ACL file (OSError / ValueError on failure)."""
    with open(path, "rb") as fh:
        data = tomllib.load(fh)
    return parse_acl(data)
