"""Settings and limits of the RocketMQ 5 gRPC front end (docs/grpc.md "Limits")."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GrpcConfig", "DEFAULT_PORT"]

#: Apache's proxy listens for gRPC on 8081; so do we.
DEFAULT_PORT = 8081


@dataclass
class GrpcConfig:
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    #: Host written into routes and assignments (the address clients dial for every RPC
    #: after QueryRoute). Empty: the host the client reached us on (its access point).
    advertise_host: str = ""
    #: Largest message body accepted (Settings.publishing.max_body_size; the broker's own
    #: limit is 4 MiB too). Larger: MESSAGE_BODY_TOO_LARGE.
    max_body_size: int = 4 * 1024 * 1024
    #: Largest gRPC request frame: the body plus properties and framing.
    max_request_bytes: int = 5 * 1024 * 1024
    #: Long-polling timeout handed to consumers in Settings, and the cap of a request's.
    long_polling_timeout_s: float = 20.0
    #: ReceiveMessage batch cap (the broker's POP cap).
    max_receive_batch: int = 32
    #: Invisible duration of messages popped for push consumers (auto_renew requests
    #: name none), as Apache's proxy.
    auto_renew_invisible_s: float = 60.0
    #: Longest invisible duration a client may ask for (ILLEGAL_INVISIBLE_TIME above).
    max_invisible_s: float = 12 * 3600.0
    #: Seconds a topic route is reused before asking the name servers again.
    route_cache_s: float = 3.0
    #: Telemetry streams held at once (each is a client); more: TOO_MANY_REQUESTS.
    max_clients: int = 10_000
    #: Concurrent calls on one HTTP/2 connection (gRPC's max_concurrent_streams).
    max_streams_per_connection: int = 256
    #: Longest message group / tag / key, in characters (the proxy's defaults).
    max_message_group_length: int = 64
    #: Lite topics: quota of lite topics per consumer group, longest lite topic name.
    lite_subscription_quota: int = 1000
    max_lite_topic_size: int = 64
    #: Furthest a DELAY message's delivery_timestamp may lie ahead (Apache's
    #: timerMaxDelaySec, 3 days); later: ILLEGAL_DELIVERY_TIME.
    timer_max_delay_s: int = 3 * 86_400
    #: The MQTT gateways' store topic: a send to it with the user property MQTT_TOPIC is
    #: MQTT traffic (docs/grpc.md "MQTT and AMQP subscribers"). Empty: none is.
    mqtt_store_topic: str = "MQTT_MESSAGES"
    #: PEM certificate chain and key: serve gRPC over TLS only (clients with
    #: tls_enable; they verify against their default roots).
    tls_certfile: str = ""
    tls_keyfile: str = ""
    #: Seconds in-flight gRPC calls get to finish when the server stops.
    shutdown_grace_s: float = 1.0
