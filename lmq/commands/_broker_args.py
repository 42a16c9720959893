"""Options shared by `lmq serve` and `lmq broker`, and their signal-driven run loop."""

from __future__ import annotations

import argparse
import errno
import gc
import logging
import resource
import signal

import trio

from core.broker.config import parse_addr_list
from lmq.commands._checks import busy_listener, log_level

log = logging.getLogger("lmq")


def add_broker_options(parser: argparse.ArgumentParser, *, namesrv_port: bool) -> None:
    """Flags default to None so that a TOML `--config` value is only overridden when the
    flag is given (defaults < config file < flags)."""
    parser.add_argument("--config", metavar="FILE",
                        help="TOML file; keys are BrokerConfig / NamesrvConfig field names")
    parser.add_argument("--data-dir", help="data directory (default ./data)")
    parser.add_argument("--host", help="bind address (default 127.0.0.1: this machine only)")
    parser.add_argument(
        "--advertise-host",
        help="address clients use to reach the broker (default: --host; when binding "
        "0.0.0.0, this host's address on its default route, logged at start)",
    )
    add_remoting_security_options(parser, broker=True)
    if namesrv_port:
        parser.add_argument("--namesrv-port", type=int, help="name server port (default 9876)")
    parser.add_argument("--broker-port", type=int, help="broker port (default 10911)")
    parser.add_argument(
        "--namesrv-addr",
        help="name server address(es), ';'-separated" + (
            " (default: the embedded name server)" if namesrv_port else ""
        ),
    )
    parser.add_argument("--broker-name", help="broker name (default broker-a)")
    parser.add_argument("--cluster", help="cluster name (default DefaultCluster)")
    parser.add_argument("--flush", choices=("async", "sync"),
                        help="ASYNC_FLUSH or SYNC_FLUSH (default async)")
    parser.add_argument("--log-level", default="INFO", type=log_level, metavar="LEVEL",
                        help="DEBUG, INFO, WARNING, ERROR or CRITICAL (default %(default)s)")


def add_ha_options(parser: argparse.ArgumentParser) -> None:
    """Replication flags of `lmq broker` (docs/ha.md). The shared secret comes from the
    config file (`ha_secret`) or the LMQ_HA_SECRET environment variable, never a flag
    (command lines are visible to every local user)."""
    parser.add_argument("--broker-id", type=int, help="0 for a master, > 0 for a slave")
    parser.add_argument("--broker-role", choices=("ASYNC_MASTER", "SYNC_MASTER", "SLAVE"),
                        help="replication role (default ASYNC_MASTER)")
    parser.add_argument("--ha-port", type=int,
                        help="master: HA listener port (default broker port + 1; 0 = free)")
    parser.add_argument("--ha-master-address", help="slave: the master's HA host:port")
    parser.add_argument("--controller-addr", metavar="HOST:PORT",
                        help="failover: the HA controller (a name server started with "
                        "--controller); it decides which broker of the name writes")


def ha_overrides(args: argparse.Namespace) -> dict:
    import os

    return {
        "broker_id": args.broker_id,
        "broker_role": args.broker_role,
        "ha_listen_port": args.ha_port,
        "ha_master_address": args.ha_master_address,
        "controller_addr": getattr(args, "controller_addr", None),
        "ha_secret": os.environ.get("LMQ_HA_SECRET") or None,
    }


def add_remoting_security_options(parser: argparse.ArgumentParser, *, broker: bool) -> None:
    """Exposure and TLS flags of the remoting ports (docs/remoting.md)."""
    parser.add_argument(
        "--allow-unauthenticated", action="store_true", default=None,
        help="allow serving remoting ports on a non-loopback --host with ACL off "
        "(anyone who reaches them can administer the server; logged as a warning)",
    )
    parser.add_argument("--tls-certfile", help="serve the remoting ports over TLS: "
                        "certificate chain (PEM); needs --tls-keyfile")
    parser.add_argument("--tls-keyfile", help="TLS private key (PEM)")
    if broker:
        parser.add_argument("--namesrv-tls", action="store_true", default=None,
                            help="connect to the name servers over TLS")
        parser.add_argument("--tls-ca-file",
                            help="CA certificates (PEM) trusted for TLS to the name servers")
        parser.add_argument("--tls-no-verify", dest="tls_verify", action="store_false",
                            default=None, help="do not verify the name servers' certificates")


def remoting_security_overrides(args: argparse.Namespace) -> dict:
    """The exposure / TLS fields shared by BrokerConfig and NamesrvConfig."""
    return {
        "allow_unauthenticated_remote": args.allow_unauthenticated,
        "tls_certfile": args.tls_certfile,
        "tls_keyfile": args.tls_keyfile,
    }


def refuse_insecure(*configs) -> str | None:
    """The error message when a config would expose a remoting port without ACL and
    without allow_unauthenticated_remote (checked before anything starts)."""
    from core.remoting.security import InsecureListenerError, check_exposure

    for config in configs:
        if config is None or getattr(config, "allow_unauthenticated_remote", False):
            continue  # the server logs the warning itself when it starts
        try:
            check_exposure(config.host, acl_enable=getattr(config, "acl_enable", False),
                           allow_unauthenticated=False, what="the remoting ports")
        except InsecureListenerError as exc:
            return str(exc)
    return None


def broker_overrides(args: argparse.Namespace) -> dict:
    return {
        **remoting_security_overrides(args),
        "namesrv_tls": args.namesrv_tls,
        "tls_ca_file": args.tls_ca_file,
        "tls_verify": args.tls_verify,
        "data_dir": args.data_dir,
        "host": args.host,
        "advertise_host": args.advertise_host,
        "port": args.broker_port,
        "namesrv_addrs": parse_addr_list(args.namesrv_addr) if args.namesrv_addr else None,
        "broker_name": args.broker_name,
        "cluster_name": args.cluster,
        "flush": args.flush,
    }


def setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, str(level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


async def serve_until_signal(server, metrics=None) -> None:
    """Run `server.serve()` until SIGINT/SIGTERM asks for a clean stop; a second signal
    cancels (the broker still persists and closes its store, shielded)."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                first = True
                async for signum in signals:
                    log.info("received %s, shutting down", signal.Signals(signum).name)
                    if first:
                        server.stop()
                        first = False
                    else:
                        nursery.cancel_scope.cancel()

            nursery.start_soon(watch)
            if metrics is not None:  # --metrics-port: up before recovery, /readyz says 503
                await nursery.start(metrics.serve)
            await server.serve()
            nursery.cancel_scope.cancel()


def _os_error(exc: BaseException) -> OSError | None:
    """The OSError inside `exc` (trio wraps task failures in exception groups)."""
    if isinstance(exc, OSError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _os_error(inner)
            if found is not None:
                return found
    return None


# Young-generation threshold of CPython's cyclic GC in server processes (default 700).
# The default counts every short-lived container a message allocates, and the MQTT
# gateway keeps many live objects (sessions, recent messages per LMQ), so collections ran
# often and the older generations were re-scanned: 6.8-7.2 % of the wall time of an MQTT
# fan-in (1,041 young, 94 middle and 8 full collections in 5 s, timed with gc.callbacks).
# At 20,000 the same load ran 3 young collections in 10 s (0.4 %). Reference cycles are
# rare on the hot paths, so they wait a little longer to be freed.
GC_YOUNG_THRESHOLD = 20_000


def raise_fd_limit() -> None:
    """Lift the soft RLIMIT_NOFILE to the hard limit: every connection costs a descriptor,
    and the remoting servers keep a reserve below the soft limit for the store."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (OSError, ValueError):
        pass


def run_server(server, listeners: list[tuple[str, str, int | None]] = (),
               metrics=None) -> int:
    """trio.run the server until a signal; an OSError at start-up (port taken, data dir
    not writable) is one log line and exit code 1, not a traceback. `listeners` are the
    (name, host, port) the server binds, to say which one is taken."""
    raise_fd_limit()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, old)
    try:
        trio.run(serve_until_signal, server, metrics)
    except (OSError, BaseExceptionGroup) as exc:
        error = _os_error(exc)
        if error is None:
            raise
        busy = busy_listener(list(listeners)) if error.errno == errno.EADDRINUSE else None
        log.error("cannot start: %s", busy or error)
        return 1
    return 0
