"""`$SYS/broker/...` statistics, published every `sys_interval_s` as retained messages.

Names follow Mosquitto's, so existing dashboards work:

    $SYS/broker/version                    "lmq-gateway <version>"
    $SYS/broker/uptime                     "<seconds> seconds"
    $SYS/broker/clients/connected          connected MQTT clients
    $SYS/broker/clients/total              sessions (connected + persistent offline)
    $SYS/broker/messages/received          PUBLISH packets received
    $SYS/broker/messages/sent              PUBLISH packets sent
    $SYS/broker/messages/dropped           expired / too large / skipped by a lag cut
    $SYS/broker/bytes/received             bytes read from clients
    $SYS/broker/bytes/sent                 bytes of PUBLISH packets written
    $SYS/broker/subscriptions/count        subscriptions of all sessions
    $SYS/broker/retained messages/count    retained messages
    $SYS/broker/store/messages             MQTT messages stored by this gateway

Root wildcards (`#`, `+/...`) do not match them (MQTT-4.7.2-1): subscribe to `$SYS/#`.
Only a value that changed is published again, so an idle server stores nothing: the uptime
goes out only along with another change, and `store/messages` leaves out the `$SYS`
messages themselves (counting them would make each round change the next one's value).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import trio

from gateway.mqtt.message import MqttMessage

if TYPE_CHECKING:
    from gateway.mqtt.server import MqttGateway

__all__ = ["sys_loop", "sys_values"]

try:
    from importlib.metadata import version as _dist_version

    VERSION = _dist_version("lmq-gateway")
except Exception:  # not installed as a distribution
    VERSION = "0"


UPTIME = "$SYS/broker/uptime"


def sys_values(gw: MqttGateway, own: int = 0) -> dict[str, str]:
    """Current `$SYS` topic -> text value; `own` = `$SYS` messages published so far."""
    s = gw.stats
    return {
        "$SYS/broker/version": f"lmq-gateway {VERSION}",
        "$SYS/broker/uptime": f"{int(time.monotonic() - s.started)} seconds",
        "$SYS/broker/clients/connected": str(s.clients),
        "$SYS/broker/clients/total": str(len(gw.registry.sessions)),
        "$SYS/broker/messages/received": str(s.msgs_in),
        "$SYS/broker/messages/sent": str(s.msgs_out),
        "$SYS/broker/messages/dropped": str(s.dropped),
        "$SYS/broker/bytes/received": str(s.bytes_in),
        "$SYS/broker/bytes/sent": str(s.bytes_out),
        "$SYS/broker/subscriptions/count": str(gw.registry.subscription_count),
        "$SYS/broker/retained messages/count": str(len(gw.retained)),
        "$SYS/broker/store/messages": str(max(0, gw.link.stats["stored"] - own)),
    }


async def sys_loop(gw: MqttGateway) -> None:
    last: dict[str, str] = {}
    own = 0
    while True:
        values = sys_values(gw, own)
        changed = [t for t, v in values.items() if t != UPTIME and last.get(t) != v]
        if changed:
            changed.append(UPTIME)
        for topic in changed:
            last[topic] = values[topic]
            gw.publish_internal(MqttMessage(topic, values[topic].encode(), 0, True))
        own += len(changed)
        await trio.sleep(gw.config.sys_interval_s)
