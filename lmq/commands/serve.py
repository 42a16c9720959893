"""`lmq serve`: name server + broker + MQTT and AMQP gateways in one process.

    lmq serve --data-dir ./data                     # 9876 + 10911 + MQTT 1883 + AMQP 5672
    lmq serve --host 0.0.0.0 --allow-unauthenticated   # reachable from other hosts, no ACL
    lmq serve --config lmq.toml --flush sync
    lmq serve --mqtt-port 1884 --mqtt-ws-port 8083 --mqtt-config mqtt.toml
    lmq serve --no-mqtt
    lmq serve --amqp-port 5673 --amqp-config amqp.toml
    lmq serve --no-amqp
    lmq serve --grpc-port 8082                      # RocketMQ 5 gRPC (default 8081)
    lmq serve --no-grpc
"""

from __future__ import annotations

import argparse

from lmq.commands._broker_args import (
    add_broker_options,
    broker_overrides,
    log,
    refuse_insecure,
    remoting_security_overrides,
    run_server,
    setup_logging,
)
from lmq.commands._checks import lock_data_dir
from lmq.commands._embedded import embedded_server, load_configs
from lmq.commands.mqtt import add_mqtt_options, mqtt_services
from lmq.metrics import add_metrics_options


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="run name server, broker, MQTT and AMQP gateways in one process",
        description="Run an embedded RocketMQ 4.x compatible name server and broker.",
    )
    add_broker_options(parser, namesrv_port=True)
    add_mqtt_options(parser, embedded=True)
    add_amqp_options(parser)
    add_grpc_options(parser)
    add_metrics_options(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from gateway.amqp.embedded import AmqpService
    from gateway.grpc5.embedded import GrpcService

    setup_logging(args.log_level)
    namesrv_overrides = {
        "host": args.host, "port": args.namesrv_port, **remoting_security_overrides(args)
    }
    configs = load_configs(args, broker_overrides(args), namesrv_overrides)
    if configs is None:
        return 2
    broker_config, namesrv_config = configs
    if broker_config.tls_certfile and namesrv_config.tls_certfile and not args.namesrv_tls:
        # The embedded broker registers with the embedded name server over TLS too,
        # trusting its certificate unless a CA file is given.
        broker_config.namesrv_tls = True
        broker_config.tls_ca_file = broker_config.tls_ca_file or namesrv_config.tls_certfile
    problem = refuse_insecure(broker_config, namesrv_config)
    if problem:
        log.error("%s", problem)
        return 2
    try:
        services = mqtt_services(args)
    except (OSError, ValueError, TypeError) as exc:
        log.error("bad MQTT configuration: %s", exc)
        return 2
    try:
        # AMQP first: once the MQTT gateway says it listens, AMQP has started too.
        services = amqp_services(args) + services
    except (OSError, ValueError, TypeError) as exc:
        log.error("bad AMQP configuration: %s", exc)
        return 2
    services = grpc_services(args) + services
    lock, problem = lock_data_dir(broker_config.data_dir)
    if problem:
        log.error("%s", problem)
        return 1
    listeners = [("name server", namesrv_config.host, namesrv_config.port),
                 ("broker", broker_config.host, broker_config.port)]
    for service in services:
        if isinstance(service, GrpcService):
            listeners.append(("gRPC", service.config.host, service.config.port))
            continue
        if isinstance(service, AmqpService):
            listeners.append(("AMQP", service.config.host, service.config.port))
            continue
        mqtt = service.config
        listeners += [("MQTT", mqtt.host, mqtt.port), ("MQTT over WebSocket", mqtt.host,
                      mqtt.ws_port), ("MQTT over TLS", mqtt.host, mqtt.tls_port)]
    server, exporter = embedded_server(args, broker_config, namesrv_config, services)
    return run_server(server, listeners, exporter)


def add_amqp_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--amqp-port", type=int,
                        help="AMQP 0-9-1 port (default 5672; 0 picks a free one)")
    parser.add_argument("--amqp-config", metavar="FILE",
                        help="AMQP gateway TOML file (keys = AmqpServerConfig / "
                             "AmqpBrokerConfig fields, docs/amqp.md)")
    parser.add_argument("--no-amqp", action="store_true", help="do not run the AMQP gateway")
    parser.add_argument("--amqp-tls-port", type=int,
                        help="AMQPS port (5671 by convention; needs --amqp-certfile/-keyfile)")
    parser.add_argument("--amqp-certfile", help="AMQPS certificate chain (PEM)")
    parser.add_argument("--amqp-keyfile", help="AMQPS private key (PEM)")


def amqp_services(args: argparse.Namespace) -> list:
    """The AMQP `EmbeddedServer` service (none with --no-amqp): defaults < the TOML file
    (typed) < --host / --amqp-port. ValueError names a bad key or value."""
    if args.no_amqp:
        return []
    from gateway.amqp.embedded import AmqpService
    from lmq.commands._gateway_main import amqp_configs

    return [AmqpService(*amqp_configs(
        args.amqp_config, host=args.host, port=args.amqp_port, tls_port=args.amqp_tls_port,
        certfile=args.amqp_certfile, keyfile=args.amqp_keyfile))]


def add_grpc_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--grpc-port", type=int, default=8081,
                        help="RocketMQ 5 gRPC port for the official 5.x clients (default "
                             "%(default)s; 0 picks a free one; docs/grpc.md)")
    parser.add_argument("--no-grpc", action="store_true",
                        help="do not run the RocketMQ 5 gRPC front end")
    parser.add_argument("--grpc-tls-certfile", metavar="PEM",
                        help="serve gRPC over TLS with this certificate chain")
    parser.add_argument("--grpc-tls-keyfile", metavar="PEM", help="its private key")


def grpc_services(args: argparse.Namespace) -> list:
    """The gRPC `EmbeddedServer` service (none with --no-grpc), on --host / --grpc-port."""
    if args.no_grpc:
        return []
    from gateway.grpc5.config import GrpcConfig
    from gateway.grpc5.embedded import GrpcService

    return [GrpcService(GrpcConfig(host=args.host or "127.0.0.1", port=args.grpc_port,
                                   tls_certfile=args.grpc_tls_certfile or "",
                                   tls_keyfile=args.grpc_tls_keyfile or ""))]
