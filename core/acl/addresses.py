"""IP whitelist patterns of plain ACL (`globalWhiteRemoteAddresses`, `whiteRemoteAddress`).

Supported forms (docs/acl.md §2.3), compiled once when the ACL file is loaded:

* empty: matches nothing;  `*` or `*.*.*.*`: matches every address
* an exact IPv4 or IPv6 address
* IPv4 with trailing `*` parts: `192.168.*` or `192.168.1.*`
* IPv4 whose last part is a range or a set: `192.168.1.10-20`, `192.168.1.{1,2,3}`
* several exact addresses separated by commas: `10.0.0.1,10.0.0.2`
* CIDR blocks (`10.0.0.0/8`, `fd00::/8`) — ours, RocketMQ has no CIDR form
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable

__all__ = ["AddressPattern", "compile_pattern", "host_of"]

Matcher = Callable[[str], bool]


def host_of(remote_addr: str) -> str:
    """"1.2.3.4:5" -> "1.2.3.4"; "[::1]:5" -> "::1"."""
    host, sep, _port = remote_addr.rpartition(":")
    if not sep:
        return remote_addr
    if host.startswith("[") and host.endswith("]"):
        return host[1:-1]
    return host


def _never(_host: str) -> bool:
    return False


def _always(_host: str) -> bool:
    return True


def _octet(text: str, pattern: str) -> int:
    if not text.isdigit() or int(text) > 255:
        raise ValueError(f"bad IPv4 part {text!r} in address pattern {pattern!r}")
    return int(text)


def _ipv4_parts(host: str) -> list[str] | None:
    parts = host.split(".")
    return parts if len(parts) == 4 else None


def compile_pattern(pattern: str) -> Matcher:
    """A function telling whether a host (no port) matches `pattern`; ValueError if bad."""
    pattern = (pattern or "").strip()
    if not pattern:
        return _never
    if pattern in ("*", "*.*.*.*"):
        return _always
    if "/" in pattern:
        net = ipaddress.ip_network(pattern, strict=False)
        return lambda host: _in_network(host, net)
    if "," in pattern and "{" not in pattern:
        exact = {str(ipaddress.ip_address(p.strip())) for p in pattern.split(",") if p.strip()}
        return lambda host: _normal(host) in exact
    if ":" in pattern:
        one = str(ipaddress.ip_address(pattern))
        return lambda host: _normal(host) == one
    parts = pattern.split(".")
    if len(parts) > 4 or not parts:
        raise ValueError(f"bad address pattern {pattern!r}")
    if "*" in parts:
        first = parts.index("*")
        if any(p != "*" for p in parts[first:]):
            raise ValueError(f"'*' must only end the address pattern {pattern!r}")
        prefix = [_octet(p, pattern) for p in parts[:first]]
        return lambda host: _prefix_match(host, prefix)
    if len(parts) != 4:
        raise ValueError(f"bad address pattern {pattern!r}")
    head = [_octet(p, pattern) for p in parts[:3]]
    last = parts[3]
    if last.startswith("{") and last.endswith("}"):
        allowed = frozenset(_octet(p.strip(), pattern) for p in last[1:-1].split(","))
    elif "-" in last:
        low, _, high = last.partition("-")
        lo, hi = _octet(low, pattern), _octet(high, pattern)
        if lo > hi:
            raise ValueError(f"empty range in address pattern {pattern!r}")
        allowed = frozenset(range(lo, hi + 1))
    else:
        allowed = frozenset((_octet(last, pattern),))
    return lambda host: _last_match(host, head, allowed)


def _normal(host: str) -> str:
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return host


def _in_network(host: str, net) -> bool:
    try:
        return ipaddress.ip_address(host) in net
    except ValueError:
        return False


def _prefix_match(host: str, prefix: list[int]) -> bool:
    parts = _ipv4_parts(host)
    if parts is None:
        return False
    try:
        return all(int(parts[i]) == prefix[i] for i in range(len(prefix)))
    except ValueError:
        return False


def _last_match(host: str, head: list[int], allowed: frozenset[int]) -> bool:
    parts = _ipv4_parts(host)
    if parts is None:
        return False
    try:
        return [int(p) for p in parts[:3]] == head and int(parts[3]) in allowed
    except ValueError:
        return False


class AddressPattern:
    """One or more compiled patterns; `matches(remote_addr)` takes "ip:port"."""

    __slots__ = ("patterns", "_matchers")

    def __init__(self, patterns: list[str] | tuple[str, ...] = ()) -> None:
        self.patterns = tuple(p for p in patterns if p and p.strip())
        self._matchers = tuple(compile_pattern(p) for p in self.patterns)

    def __bool__(self) -> bool:
        return bool(self._matchers)

    def matches(self, remote_addr: str) -> bool:
        if not self._matchers:
            return False
        host = host_of(remote_addr)
        return any(m(host) for m in self._matchers)
