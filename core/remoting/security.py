"""Who may reach a remoting port: loopback-by-default exposure check and TLS contexts.

Secure by default, as Mosquitto 2 chose: a listener binds to loopback unless told
otherwise, and a port reachable from other hosts without ACL needs an explicit
`allow_unauthenticated_remote` (and then logs a warning). TLS is optional: the server
uses a PEM certificate + key (the same options as the MQTT TLS listener), the client a CA
file or the system store, with verification on unless turned off.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import ssl

__all__ = [
    "InsecureListenerError",
    "check_exposure",
    "client_ssl_context",
    "is_loopback_host",
    "server_ssl_context",
]

log = logging.getLogger(__name__)


class InsecureListenerError(ValueError):
    """A port would be reachable from other hosts with no authentication."""


def is_loopback_host(host: str) -> bool:
    """True when every address `host` binds to is a loopback address.

    The wildcards ("", "0.0.0.0", "::") are not loopback; a name is resolved.
    """
    if host in ("", "0.0.0.0", "::", "*"):
        return False
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos)


def check_exposure(
    host: str, *, acl_enable: bool, allow_unauthenticated: bool, what: str
) -> None:
    """Refuse to expose `what` on a non-loopback `host` without ACL, unless allowed.

    Raises InsecureListenerError; when allowed, logs one warning.
    """
    if acl_enable or is_loopback_host(host):
        return
    if not allow_unauthenticated:
        raise InsecureListenerError(
            f"refusing to serve {what} on {host or '*'} without authentication: anyone who "
            f"reaches it could change topics, offsets and routes. Bind to 127.0.0.1 "
            f"(the default), turn ACL on (acl_enable), or accept the risk with "
            f"--allow-unauthenticated (allow_unauthenticated_remote = true)"
        )
    log.warning(
        "%s listens on %s without authentication (allow_unauthenticated_remote): "
        "anyone who reaches it can administer this server", what, host or "*",
    )


def server_ssl_context(certfile: str, keyfile: str) -> ssl.SSLContext:
    """TLS server context from a PEM certificate (chain) and private key."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(certfile, keyfile)
    return ctx


def client_ssl_context(ca_file: str | None = None, verify: bool = True) -> ssl.SSLContext:
    """TLS client context: trust `ca_file` (else the system store); `verify=False`
    encrypts without checking the server's certificate or name (self-signed test setups)."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca_file)
    if not verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx
