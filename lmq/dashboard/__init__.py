"""The web dashboard: static pages and a small JSON API on the metrics HTTP port.

`Dashboard.handle` answers `/dashboard/...` (the page and its assets, shipped in
`lmq/dashboard/static`) and `/api/...` (JSON read from the live server objects, see
`views.py`; the write actions are in `actions.py`). The HTTP server around it is the
metrics endpoint's (`lmq.metrics`), so its limits (request size, deadline, connections)
apply here too. docs/dashboard.md describes pages, API and security.

Security (secure by default):

* Reading: open on a loopback port (like `/metrics`); on any other address every API call
  needs an admin login. The message browser (message bodies) always needs one.
* Login: HTTP Basic credentials of an account with `admin = true` in the broker's ACL file
  (docs/acl.md); with ACL off there is no admin account and the actions are refused.
  Failed logins are throttled (`MAX_FAILED_LOGINS` per `LOGIN_WINDOW_S`).
* Actions: POST with a JSON body, the login, and the CSRF token `/api/session` hands out
  in the `X-CSRF-Token` header; a cross-site `Origin` is refused.
"""

from __future__ import annotations

import base64
import binascii
import collections
import hmac
import ipaddress
import json
import logging
import os
import secrets
import time
from dataclasses import dataclass, field
from importlib.resources import files
from typing import Any

import trio

from lmq.dashboard import actions, views

log = logging.getLogger("lmq.dashboard")

DEFAULT_SAMPLE_INTERVAL_S = 5.0  # how often the overview's rates are sampled
RING_SAMPLES = 120  # samples kept: 10 minutes at the default interval
MAX_FAILED_LOGINS = 10  # failed logins per window before every login is refused
LOGIN_WINDOW_S = 60.0
_STATIC_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
                 ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]  # lower-case names
    body: bytes = b""


@dataclass
class Response:
    status: int
    body: bytes
    ctype: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)


def json_response(status: int, data: Any) -> Response:
    return Response(status, json.dumps(data, separators=(",", ":")).encode())


def _error(status: int, message: str) -> Response:
    return json_response(status, {"error": message})


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


class Dashboard:
    """Pages, JSON API and the overview's sample ring for one server process; `sources`
    is the metrics `Exporter` (it knows the broker, name server, MQTT gateway)."""

    def __init__(self, sources, bind_host: str = "127.0.0.1",
                 sample_interval_s: float = DEFAULT_SAMPLE_INTERVAL_S) -> None:
        self.sources = sources
        self.sample_interval_s = sample_interval_s
        self.open_reads = is_loopback(bind_host)
        self.samples: collections.deque[dict[str, Any]] = collections.deque(maxlen=RING_SAMPLES)
        self._secret = secrets.token_bytes(32)
        self._failed: collections.deque[float] = collections.deque()
        static = files("lmq.dashboard") / "static"
        self._static = {p.name: p for p in static.iterdir() if p.suffix in _STATIC_TYPES}
        self.started = time.time()

    # -- sources ------------------------------------------------------------------------
    def amqp(self):
        """The embedded AMQP gateway's AmqpBroker, if this process runs one."""
        for service in getattr(self.sources.server, "services", ()):
            server = getattr(service, "server", None)
            if hasattr(service, "broker_config") and getattr(server, "broker", None):
                return server.broker
        return None

    def admin_accounts(self) -> dict:
        broker = self.sources.current_broker()
        guard = getattr(getattr(broker, "table", None), "guard", None)
        config = getattr(guard, "config", None)
        if broker is None or not broker.config.acl_enable or config is None:
            return {}
        return {ak: a for ak, a in config.accounts.items() if a.admin}

    # -- sampling -----------------------------------------------------------------------
    def sample(self) -> dict[str, Any]:
        row: dict[str, Any] = {"t": int(time.time() * 1000)}
        broker = self.sources.current_broker()
        if broker is not None and broker.started:
            s = broker.store.stats()
            row.update(puts=s["puts"], put_bytes=s["put_bytes"], gets=s["get_msgs"])
        gw = self.sources.current_mqtt()
        if gw is not None:
            row.update(mqtt_in=gw.stats.msgs_in, mqtt_out=gw.stats.msgs_out,
                       mqtt_clients=gw.stats.clients)
        return row

    async def run_sampler(self) -> None:
        while True:
            self.samples.append(self.sample())
            await trio.sleep(self.sample_interval_s)

    def rates(self) -> list[dict[str, Any]]:
        """Per-second rates between consecutive samples, and the current one."""
        rows = [*self.samples, self.sample()]
        out = []
        for a, b in zip(rows, rows[1:], strict=False):
            dt = (b["t"] - a["t"]) / 1000
            if dt <= 0:
                continue
            rate = {"t": b["t"]}
            for key in ("puts", "put_bytes", "gets", "mqtt_in", "mqtt_out"):
                if key in a and key in b:
                    rate[key] = round(max(0, b[key] - a[key]) / dt, 2)
            if "mqtt_clients" in b:
                rate["mqtt_clients"] = b["mqtt_clients"]
            out.append(rate)
        return out

    # -- auth ---------------------------------------------------------------------------
    def _user(self, request: Request) -> tuple[str | None, Response | None]:
        """(admin access key, None), (None, None) without credentials, or (None, error)."""
        header = request.headers.get("authorization", "")
        if not header:
            return None, None
        now = time.monotonic()
        while self._failed and self._failed[0] < now - LOGIN_WINDOW_S:
            self._failed.popleft()
        if len(self._failed) >= MAX_FAILED_LOGINS:
            return None, _error(429, "too many failed logins: try again in a minute")
        scheme, _, encoded = header.partition(" ")
        try:
            user, _, password = base64.b64decode(encoded.strip(), validate=True).decode(
                "utf-8").partition(":")
        except (binascii.Error, UnicodeDecodeError):
            user = password = ""
        account = self.admin_accounts().get(user) if scheme.lower() == "basic" else None
        if account is None or not hmac.compare_digest(password.encode(),
                                                      account.secret_key.encode()):
            self._failed.append(now)
            if not self.admin_accounts():
                return None, _error(401, "no admin account: turn ACL on and give an account "
                                         "admin = true (docs/acl.md)")
            return None, _error(401, "wrong access key or secret key, or not an admin account")
        return user, None

    def csrf_token(self, user: str) -> str:
        return hmac.new(self._secret, user.encode(), "sha256").hexdigest()[:32]

    # -- routing ------------------------------------------------------------------------
    async def handle(self, request: Request) -> Response:
        path = request.path
        if path in ("/", "/dashboard"):
            return Response(302, b"", "text/plain", {"Location": "/dashboard/"})
        if path.startswith("/dashboard/"):
            return self._static_file(path[len("/dashboard/"):] or "index.html")
        user, problem = self._user(request)
        if problem is not None:
            return problem
        try:
            if request.method == "POST":
                return await self._action(request, user)
            if request.method not in ("GET", "HEAD"):
                return _error(405, "method not allowed")
            if path == "/api/session":
                return json_response(200, self._session(user))
            if user is None and (not self.open_reads or path == "/api/messages"):
                return _error(401, "log in with an admin account (docs/dashboard.md)")
            data = self._read(path, request.query)
        except views.BadRequest as exc:
            return _error(409 if isinstance(exc, actions.Conflict) else 400, str(exc))
        if data is None:
            return _error(404, f"no such API path {path[:100]}")
        return json_response(200, data)

    def _static_file(self, name: str) -> Response:
        item = self._static.get(name)
        if item is None:
            return Response(404, b"not found\n", "text/plain; charset=utf-8")
        ctype = _STATIC_TYPES[os.path.splitext(name)[1]]
        return Response(200, item.read_bytes(), ctype, {
            "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'",
            "X-Frame-Options": "DENY"})

    def _session(self, user: str | None) -> dict[str, Any]:
        from lmq.cli import version

        return {"user": user, "csrf": self.csrf_token(user) if user else None,
                "can_act": bool(self.admin_accounts()), "open_reads": self.open_reads,
                "version": version()}

    def _read(self, path: str, query: dict[str, str]) -> dict[str, Any] | None:
        src = self.sources
        broker = src.current_broker()
        if broker is not None and not broker.started:
            broker = None
        gw = src.current_mqtt()
        if path == "/api/overview":
            amqp = self.amqp()
            return {"broker": views.broker_summary(broker) if broker else None,
                    "mqtt": views.mqtt_summary(gw) if gw else None,
                    "amqp": {"exchanges": len(amqp.exchanges), "queues": len(amqp.queues)}
                    if amqp else None,
                    "ready": src.not_ready_reason() or "ready",
                    "rates": self.rates(), "sample_interval_s": self.sample_interval_s}
        if path == "/api/brokers":
            ns = src.current_namesrv()
            return {"broker": views.broker_summary(broker) if broker else None,
                    "namesrv": views.namesrv_summary(ns) if ns is not None and ns.port else None}
        if path == "/api/mqtt/clients":
            return views.mqtt_clients_page(gw, query) if gw else _none("MQTT")
        if path == "/api/mqtt/retained":
            return views.retained_page(gw, query) if gw else _none("MQTT")
        if path == "/api/amqp":
            amqp = self.amqp()
            return views.amqp_summary(amqp, broker) if amqp else _none("AMQP")
        if broker is None and path in ("/api/topics", "/api/topic", "/api/groups",
                                       "/api/messages"):
            raise views.BadRequest("no broker in this process (or not started yet)")
        if path == "/api/topics":
            return views.topics_page(broker, query)
        if path == "/api/topic":
            return views.topic_detail(broker, query.get("name", ""))
        if path == "/api/groups":
            return views.groups_page(broker, query)
        if path == "/api/messages":
            return views.messages(broker, query)
        return None

    async def _action(self, request: Request, user: str | None) -> Response:
        if user is None:
            return _error(401, "log in with an admin account to act (docs/dashboard.md)")
        token = request.headers.get("x-csrf-token", "")
        if not hmac.compare_digest(token.encode(), self.csrf_token(user).encode()):
            return _error(403, "missing or wrong X-CSRF-Token (reload the page)")
        origin = request.headers.get("origin")
        host = request.headers.get("host", "")
        if origin is not None and origin.split("://", 1)[-1] != host:
            return _error(403, f"cross-site request from {origin[:100]} refused")
        if not request.headers.get("content-type", "").startswith("application/json"):
            return _error(415, "send the action as application/json")
        try:
            body = json.loads(request.body or b"{}")
        except (ValueError, UnicodeDecodeError):
            return _error(400, "the body is not JSON")
        if not isinstance(body, dict):
            return _error(400, "the body must be a JSON object")
        name = request.path.removeprefix("/api/actions/")
        broker = self.sources.current_broker()
        if broker is not None and not broker.started:
            broker = None
        gw = self.sources.current_mqtt()
        amqp = self.amqp()
        if name in ("topic/create", "topic/delete", "group/reset", "queue/purge") and not broker:
            raise views.BadRequest("no broker in this process (or not started yet)")
        if name == "topic/create":
            done = await actions.create_topic(broker, body)
        elif name == "topic/delete":
            done = await actions.delete_topic(broker, body)
        elif name == "group/reset":
            done = await actions.reset_offset(broker, body)
        elif name == "queue/purge":
            if amqp is None:
                raise views.BadRequest("no AMQP gateway in this process")
            done = actions.purge_amqp_queue(amqp, broker, body)
        elif name == "mqtt/kick":
            if gw is None:
                raise views.BadRequest("no MQTT gateway in this process")
            done = actions.kick_mqtt_client(gw, body)
        else:
            return _error(404, f"no such action {name[:100]}")
        log.info("dashboard: %s by %s", done, user)
        return json_response(200, {"ok": True, "message": done})


def _none(what: str) -> dict[str, Any]:
    return {"total": 0, "offset": 0, "items": [], "absent": f"no {what} gateway in this process"}
