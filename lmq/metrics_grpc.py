"""The gRPC front end's metrics (`lmq serve`'s and `lmq proxy`'s; docs/operations.md).

Read at scrape time from the counters `gateway/grpc5/stats.py` keeps on the gRPC thread
and from the servicer's client table and the auto-renew table.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

__all__ = ["grpc_metrics"]


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    m = CounterMetricFamily(name, doc)
    m.add_metric([], value)
    return m


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    m = GaugeMetricFamily(name, doc)
    m.add_metric([], value)
    return m


def grpc_metrics(server) -> Iterator:
    """`server`: a gateway.grpc5.server.GrpcServer (its `stats`, `servicer`)."""
    s = server.stats
    requests = CounterMetricFamily("lmq_grpc_requests", "gRPC calls answered, by method and "
                                   "RocketMQ status code (error: failed before a status)",
                                   labels=["method", "code"])
    for (method, code), n in sorted(dict(s.requests).items()):  # a copy: atomic
        requests.add_metric([method, code], n)
    yield requests
    yield _counter("lmq_grpc_messages_received", "Messages accepted by SendMessage",
                   s.msgs_in)
    yield _counter("lmq_grpc_received_bytes", "Body bytes of the messages accepted",
                   s.bytes_in)
    yield _counter("lmq_grpc_messages_sent", "Messages delivered by ReceiveMessage",
                   s.msgs_out)
    yield _counter("lmq_grpc_sent_bytes", "Body bytes of the messages delivered", s.bytes_out)
    yield _gauge("lmq_grpc_telemetry_streams", "Open Telemetry streams", s.telemetry_streams)
    servicer = server.servicer
    yield _gauge("lmq_grpc_clients", "Clients known by their Telemetry stream",
                 len(servicer.clients) if servicer is not None else 0)
    yield _gauge("lmq_grpc_receives_waiting", "ReceiveMessage calls not answered yet "
                 "(long polling)", s.receives_waiting)
    yield _gauge("lmq_grpc_auto_renew_messages", "Received messages whose invisibility is "
                 "being renewed (push consumers)",
                 len(servicer.backend.renewer) if servicer is not None else 0)
