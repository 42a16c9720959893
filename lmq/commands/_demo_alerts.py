"""The MQTT alert subscriber of `lmq demo iot`: one MQTT connection subscribed to
``alerts/#`` (QoS 1), as a device's operator would be; it records every alert it receives
and the latency from the reading's publish (its ``ts``, set by the simulator just before it
published) to the alert's arrival."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time

ALERTS_FILTER = "alerts/#"


class AlertSubscriber:
    def __init__(self, port: int, host: str = "127.0.0.1", client_id: str = "iot-operator"):
        self.host, self.port, self.client_id = host, port, client_id
        #: (topic, alert dict, latency ms) per alert received, in arrival order
        self.received: list[tuple[str, dict, int]] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> AlertSubscriber:
        """Connect and subscribe (returns once the SUBACK arrived), then read in a thread."""
        from gateway.mqtt.codec import MqttCodec
        from gateway.mqtt.packets import Connect, Subscribe, Subscription

        codec = MqttCodec(role="client", protocol_version=4)
        s = socket.create_connection((self.host, self.port), timeout=10)
        s.sendall(codec.encode(Connect(client_id=self.client_id, protocol_version=4,
                                       clean_start=True, keepalive=0)))
        s.sendall(codec.encode(Subscribe(1, (Subscription(ALERTS_FILTER, 1),))))
        self._sock = s
        pending = self._read(codec, until_suback=True)
        self._thread = threading.Thread(target=self._run, args=(codec, pending),
                                        name="iot-alerts", daemon=True)
        self._thread.start()
        return self

    def _read(self, codec, until_suback: bool = False) -> list:
        from gateway.mqtt.packets import Connack, Suback

        got: list = []
        while True:
            data = self._sock.recv(65536)
            if not data:
                raise ConnectionError("the gateway closed the alert subscriber's connection")
            for p in codec.feed(data):
                if isinstance(p, Connack) and p.reason_code != 0:
                    raise ConnectionError(f"CONNACK refused: {p.reason_code}")
                if isinstance(p, Suback):
                    if until_suback:
                        return got
                    continue
                got.append(p)
            if not until_suback:
                return got

    def _run(self, codec, pending: list) -> None:
        from gateway.mqtt.packets import Puback, Publish

        self._sock.settimeout(0.5)
        try:
            while not self._stop.is_set():
                for p in pending:
                    if isinstance(p, Publish):
                        now = int(time.time() * 1000)
                        try:
                            alert = json.loads(p.payload)
                            latency = now - int(alert["ts"])
                        except (ValueError, KeyError, TypeError):
                            alert, latency = {}, -1
                        self.received.append((p.topic, alert, latency))
                        if p.qos == 1 and p.packet_id is not None:
                            self._sock.sendall(codec.encode(Puback(p.packet_id)))
                try:
                    pending = self._read(codec)
                except TimeoutError:
                    pending = []
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            if not self._stop.is_set():
                self.error = exc

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.sendall(b"\xe0\x00")            # DISCONNECT
                self._sock.close()

    def latencies_ms(self, since_ms: int = 0) -> list[int]:
        """Latencies of the alerts whose reading was published at or after `since_ms`."""
        return sorted(lat for _t, a, lat in self.received
                      if lat >= 0 and int(a.get("ts", 0)) >= since_ms)


def percentile(sorted_values: list[int], q: float) -> int | None:
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]
