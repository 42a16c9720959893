"""`lmq proxy`: a stand-alone, stateless RocketMQ 5 gRPC proxy in front of a cluster, for
the official 5.x clients (docs/grpc.md).

    lmq proxy --namesrv-addr 127.0.0.1:9876                 # gRPC on 127.0.0.1:8081
    lmq proxy --namesrv-addr 'ns1:9876;ns2:9876' --host 0.0.0.0 --advertise-host proxy1
"""

from __future__ import annotations

import argparse
import errno
import functools
import logging

from lmq.commands._checks import log_level
from lmq.commands._gateway_main import add_gateway_options
from lmq.metrics import add_metrics_options

log = logging.getLogger("lmq.proxy")

#: How often /readyz's name-server probe asks a name server for the cluster (proxy only).
NAMESRV_PROBE_S = 2.0
#: How long one probe waits for an answer.
NAMESRV_PROBE_TIMEOUT_S = 3.0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("proxy", help="run a stand-alone RocketMQ 5 gRPC proxy")
    add_gateway_options(parser)
    parser.add_argument("--grpc-port", type=int, default=8081,
                        help="gRPC listen port (default %(default)s; 0 picks a free one)")
    parser.add_argument("--advertise-host", default="",
                        help="host written into routes (default: the address each client "
                             "used to reach the proxy)")
    parser.add_argument("--access-key", help="ACL access key the proxy signs broker requests with")
    parser.add_argument("--secret-key", help="ACL secret key (with --access-key)")
    parser.add_argument("--grpc-tls-certfile", metavar="PEM",
                        help="serve gRPC over TLS with this certificate chain")
    parser.add_argument("--grpc-tls-keyfile", metavar="PEM", help="its private key")
    parser.add_argument("--acl-file", help="check every call's authorization header against "
                        "these ACL accounts (docs/acl.md, docs/grpc.md)")
    parser.add_argument("--allow-unauthenticated", action="store_true",
                        help="serve a non-loopback --host without --acl-file (anyone who "
                             "reaches the port can send and consume)")
    parser.add_argument("--log-level", default="INFO", type=log_level,
                        help="logging level (default %(default)s)")
    from gateway.grpc5.config import GrpcConfig

    parser.add_argument("--timer-max-delay-s", type=_positive_int,
                        default=GrpcConfig.timer_max_delay_s,
                        metavar="S", help="furthest a DELAY message's delivery time may lie "
                        "ahead, else ILLEGAL_DELIVERY_TIME (default %(default)s, 3 days; "
                        "keep it at most the brokers' timer_max_delay_s)")
    add_metrics_options(parser, gateway_only=True)
    parser.set_defaults(func=run)


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text}")
    return value


def run(args: argparse.Namespace) -> int:
    import trio

    from gateway.grpc5.config import GrpcConfig
    from gateway.grpc5.standalone import run_proxy
    from lmq.commands._broker_args import setup_logging
    from lmq.commands._checks import busy_listener
    from lmq.commands._gateway_main import find_exception, serve_until_signal
    from lmq.metrics import exporter_from_args

    setup_logging(args.log_level)
    from core.remoting.security import InsecureListenerError, check_exposure

    try:  # secure by default, as the remoting ports (docs/remoting.md)
        check_exposure(args.host, acl_enable=bool(args.acl_file),
                       allow_unauthenticated=args.allow_unauthenticated,
                       what="the gRPC proxy port")
    except InsecureListenerError as exc:
        log.error("%s", str(exc).replace("turn ACL on (acl_enable)", "pass --acl-file"))
        return 2
    config = GrpcConfig(host=args.host, port=args.grpc_port,
                        advertise_host=args.advertise_host,
                        tls_certfile=args.grpc_tls_certfile or "",
                        tls_keyfile=args.grpc_tls_keyfile or "",
                        timer_max_delay_s=args.timer_max_delay_s)

    exporter = exporter_from_args(args)
    # /readyz: 503 with this reason until the gRPC port is up, 200 after, 503 when stopping
    state = {"not_ready": "gRPC proxy not started", "namesrv": None}

    def not_ready():
        return state["not_ready"] or state["namesrv"]

    def on_server(server) -> None:
        if exporter is not None:
            exporter.grpc = server
            # /readyz also needs a name server to answer: until one does, routes fail
            state["namesrv"] = f"no name server reached yet ({args.namesrv_addr})"
            nursery_ref[0].start_soon(_probe_namesrv, server.client, args.namesrv_addr, state)

    nursery_ref: list = []

    async def start(nursery: trio.Nursery) -> None:
        nursery_ref.append(nursery)
        await nursery.start(functools.partial(
            run_proxy, args.namesrv_addr, config, access_key=args.access_key,
            secret_key=args.secret_key, acl_file=args.acl_file, on_server=on_server))

    try:
        trio.run(serve_until_signal, start, state, "gRPC proxy shutting down", exporter,
                 not_ready)
    except (OSError, ValueError, trio.TooSlowError, BaseExceptionGroup) as exc:
        error = find_exception(exc, (OSError, ValueError, trio.TooSlowError))
        if error is None:
            raise
        if isinstance(error, OSError) and error.errno == errno.EADDRINUSE:
            busy = busy_listener([("gRPC", args.host, args.grpc_port),
                                  ("metrics", args.metrics_host, args.metrics_port)])
            if busy:
                log.error("cannot start: %s", busy)
                return 1
        log.error("cannot start: %s (choose another port with --grpc-port)", error)
        return 1
    return 0


async def _probe_namesrv(client, addrs: str, state: dict) -> None:
    """Every NAMESRV_PROBE_S, ask the name servers for the cluster (one small request, the
    client's own fail-over): `state["namesrv"]` is None while one answers, else the reason
    /readyz gives. Any answer counts, an error code included: the server is reachable."""
    import trio

    from core.remoting.codes import RequestCode

    was_ok = None
    while True:
        reason = f"no name server answered within {NAMESRV_PROBE_TIMEOUT_S:g} s ({addrs})"
        with trio.move_on_after(NAMESRV_PROBE_TIMEOUT_S):
            try:
                await client.api.call_namesrv(RequestCode.GET_BROKER_CLUSTER_INFO)
                reason = None
            except Exception as exc:  # unreachable: MQClientError naming the addresses
                reason = f"name server unreachable: {exc}"
        if (reason is None) != was_ok:  # log once per change, not per probe
            if reason:
                log.warning("not ready: %s", reason)
            else:
                log.info("name server reachable (%s)", addrs)
            was_ok = reason is None
        state["namesrv"] = reason
        await trio.sleep(NAMESRV_PROBE_S)
