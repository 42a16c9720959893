"""The routing table every gateway holds (sans-IO; docs/stateless-gateways.md).

A `Route` maps a pattern to a destination: an LMQ, or (AMQP exchange-to-exchange) another
exchange. Kinds:

* ``mqtt``: an MQTT subscription filter (`+`, `#`) matched against the MQTT topic;
* ``direct``: exchange + exact routing key;
* ``topic``: exchange + AMQP topic pattern (words split on `.`, `*` one word, `#` zero or
  more words);
* ``fanout``: every message of the exchange;
* ``headers``: exchange + header arguments, ``x-match`` ``all`` or ``any`` (a None value
  asks only for the header's presence; keys starting with ``x-`` are not compared).

`RouteTable.mqtt_lmqs(topic)` and `RouteTable.amqp_lmqs(exchange, key, headers)` compute
the LMQ set of a message. Wildcard patterns live in one `TopicTrie` each (MQTT, AMQP
topic), so a lookup costs the levels of the name, not the number of routes; direct and
fanout routes are dict look-ups; headers routes are scanned per exchange.

The table is a state machine fed by the route log: `apply(LogEntry)` in log order; the
entry's version (its log offset + 1) becomes the table's `version`. Entries at or below the
current version are ignored, so replaying a log over a snapshot is harmless. Routes have
set semantics: adding a route twice keeps one, removing a missing one changes nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from gateway.routing.topic_trie import TopicTrie

__all__ = [
    "KINDS", "LogEntry", "Route", "RouteError", "RouteTable", "clean_owner_gateway",
    "MAX_EXCHANGE_HOPS", "MAX_PATTERN_BYTES", "MAX_HEADER_ARGS", "MAX_ENTRY_BYTES",
    "BRIDGE_EXCHANGE", "MQTT_ROUTE_READERS", "amqp_key_to_topic", "mqtt_topic_to_key",
]

KINDS = ("mqtt", "direct", "topic", "fanout", "headers")
#: Exchange-to-exchange chains are followed this deep (cycles are cut by a visited set).
MAX_EXCHANGE_HOPS = 8
#: Bytes of a pattern, exchange or destination name (AMQP shortstr is 255 bytes; MQTT
#: filters are longer, but a route longer than this is refused).
MAX_PATTERN_BYTES = 4096
#: Header arguments of one headers route.
MAX_HEADER_ARGS = 32
#: Bytes of one encoded log entry (a peer's entry larger than this is skipped).
MAX_ENTRY_BYTES = 16 * 1024
#: The AMQP exchange of vhost "/" that MQTT traffic goes through both ways (RabbitMQ's
#: MQTT plugin default; docs/amqp.md, "MQTT and AMQP on one message").
BRIDGE_EXCHANGE = "amq.topic"
#: Gateways that route by MQTT filter routes: MQTT gateways, and AMQP gateways (a publish
#: to BRIDGE_EXCHANGE reaches MQTT subscribers). An MQTT route waits for these
#: (`RouteLog.add_route(wait_for=)` takes a tuple of prefixes too).
MQTT_ROUTE_READERS = ("mqtt-", "amqp-")
#: Topics whose bridged LMQ set `RouteTable.mqtt_publish_lmqs` remembers.
BRIDGE_CACHE_TOPICS = 65536


def mqtt_topic_to_key(topic: str) -> str:
    """The AMQP routing key of an MQTT topic (RabbitMQ's MQTT plugin mapping: `/` -> `.`,
    `+` -> `*`; `#` stays; a `.` in the topic stays too, so it separates AMQP words)."""
    return topic.replace("/", ".").replace("+", "*")


def amqp_key_to_topic(key: str) -> str:
    """The MQTT topic of an AMQP routing key (`.` -> `/`, `*` -> `+`)."""
    return key.replace("*", "+").replace(".", "/")


class RouteError(ValueError):
    """A route that is malformed or over a limit."""


@dataclass(frozen=True, slots=True)
class Route:
    kind: str
    pattern: str = ""  # MQTT filter, routing key or topic pattern; "" for fanout/headers
    dest: str = ""  # LMQ name, or exchange name when dest_exchange
    exchange: str = ""  # source exchange (AMQP kinds); "" for mqtt
    dest_exchange: bool = False
    x_match: str = "all"  # headers only
    headers: tuple[tuple[str, Any], ...] = ()  # headers only, sorted by key
    #: who holds the route (an MQTT session): equal routes of different owners are
    #: distinct entries, so one owner's remove leaves the others' routes in place
    owner: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise RouteError(f"unknown route kind {self.kind!r}")
        for text in (self.pattern, self.dest, self.exchange, self.owner):
            if not isinstance(text, str) or len(text.encode("utf-8", "surrogatepass")) > MAX_PATTERN_BYTES:
                raise RouteError("route field too long or not a string")
        if not self.dest:
            raise RouteError("route without destination")
        if self.kind == "mqtt":
            if self.exchange or self.dest_exchange:
                raise RouteError("an mqtt route has no exchange")
            try:
                TopicTrie().add(self.pattern, 0)
            except ValueError as exc:
                raise RouteError(str(exc)) from None
        elif self.kind == "headers":
            if self.x_match not in ("all", "any"):
                raise RouteError(f"x-match must be all or any, not {self.x_match!r}")
            if len(self.headers) > MAX_HEADER_ARGS:
                raise RouteError("too many header arguments")
            for _, v in self.headers:
                if v is not None and type(v) not in (str, int, float, bool):
                    raise RouteError("header argument values must be scalars")

    @classmethod
    def headers_route(cls, exchange: str, args: Mapping[str, Any], dest: str, *,
                      x_match: str = "all", dest_exchange: bool = False) -> Route:
        items = tuple(sorted((str(k), v) for k, v in args.items() if not str(k).startswith("x-")))
        return cls("headers", "", dest, exchange, dest_exchange, x_match, items)

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"k": self.kind, "d": self.dest}
        if self.pattern:
            d["p"] = self.pattern
        if self.exchange:
            d["x"] = self.exchange
        if self.dest_exchange:
            d["dx"] = True
        if self.kind == "headers":
            d["m"] = self.x_match
            d["h"] = [list(kv) for kv in self.headers]
        if self.owner:
            d["o"] = self.owner
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Route:
        try:
            headers = tuple((str(k), v) for k, v in d.get("h", ()))
            return cls(d["k"], d.get("p", ""), d["d"], d.get("x", ""), bool(d.get("dx", False)),
                       d.get("m", "all"), headers, d.get("o", ""))
        except (KeyError, TypeError, ValueError) as exc:
            raise RouteError(f"malformed route: {exc}") from None


@dataclass(frozen=True, slots=True)
class LogEntry:
    """One route change; `version` is the entry's log offset + 1 (0 before it is stored)."""

    op: str  # "add" | "remove"
    route: Route
    version: int = 0

    def encode(self) -> bytes:
        return json.dumps({"op": self.op, "r": self.route.to_json()},
                          separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes, version: int) -> LogEntry:
        if len(data) > MAX_ENTRY_BYTES:
            raise RouteError("log entry too large")
        try:
            d = json.loads(data)
            op = d["op"]
            route = Route.from_json(d["r"])
        except (ValueError, KeyError, TypeError) as exc:
            raise RouteError(f"malformed log entry: {exc}") from None
        if op not in ("add", "remove"):
            raise RouteError(f"unknown op {op!r}")
        return cls(op, route, version)


def clean_owner_gateway(owner: str) -> str | None:
    """The gateway id in a clean session's route owner `c:<gateway id>:<client id>`."""
    if not owner.startswith("c:"):
        return None
    end = owner.find(":", 2)
    return owner[2:end] if end > 2 else None


def _word(w: str) -> str:
    """One AMQP word as a trie level: injective, and no `/`, `+` or `#` left in it."""
    if "\\" in w or "/" in w or "+" in w or "#" in w:
        w = w.replace("\\", "\\\\").replace("/", "\\s").replace("+", "\\p").replace("#", "\\h")
    return w


def _amqp_filter(exchange: str, pattern: str) -> str:
    # The exchange is the first level: never a wildcard, so the MQTT `$` rule of the
    # trie never applies to AMQP keys.
    levels = [_word(exchange)]
    for w in pattern.split("."):
        levels.append("+" if w == "*" else "#" if w == "#" else _word(w))
    return "/".join(levels)


def _amqp_topic(exchange: str, key: str) -> str:
    return "/".join([_word(exchange)] + [_word(w) for w in key.split(".")])


_PRESENT = object()


def _headers_match(route: Route, headers: Mapping[str, Any]) -> bool:
    if not route.headers:
        return route.x_match == "all"
    if route.x_match == "all":
        for k, v in route.headers:
            got = headers.get(k, _PRESENT)
            if got is _PRESENT or (v is not None and got != v):
                return False
        return True
    for k, v in route.headers:
        got = headers.get(k, _PRESENT)
        if got is not _PRESENT and (v is None or got == v):
            return True
    return False


class RouteTable:
    """The whole routing table of the cluster, as applied up to `version`."""

    def __init__(self, *, max_routes: int = 1_000_000) -> None:
        self.max_routes = max_routes
        self.version = 0
        self._routes: set[Route] = set()
        self._mqtt: TopicTrie[str] = TopicTrie()
        self._topic: TopicTrie[tuple[bool, str]] = TopicTrie()
        self._direct: dict[tuple[str, str], set[tuple[bool, str]]] = {}
        self._fanout: dict[str, set[tuple[bool, str]]] = {}
        self._headers: dict[str, list[Route]] = {}
        #: MQTT topic -> LMQs of MQTT routes and BRIDGE_EXCHANGE bindings (cleared on change)
        self._bridged: dict[str, tuple[str, ...]] = {}
        #: routes of clean sessions (owner `c:<gateway id>:...`) by gateway id: what a
        #: sweep removes when that gateway vanished (RouteLog.sweep)
        self._clean: dict[str, set[Route]] = {}
        #: routes of persistent sessions (owner `p:...`) by owner (sweep of expired ones)
        self._persistent: dict[str, set[Route]] = {}

    def __len__(self) -> int:
        return len(self._routes)

    def __contains__(self, route: object) -> bool:
        return route in self._routes

    def routes(self) -> Iterator[Route]:
        return iter(self._routes)

    def clean_gateways(self) -> list[str]:
        """Gateway ids that own routes of clean sessions."""
        return list(self._clean)

    def clean_routes(self, gateway: str) -> list[Route]:
        """The routes owned by clean sessions of `gateway`."""
        return list(self._clean.get(gateway, ()))

    def persistent_owners(self) -> list[str]:
        """Owners `p:<client id>` of persistent sessions' routes."""
        return list(self._persistent)

    def owner_routes(self, owner: str) -> list[Route]:
        """The routes of a persistent session's owner `p:<client id>`."""
        return list(self._persistent.get(owner, ()))

    # ------------------------------------------------------------------ changes
    def add(self, route: Route) -> bool:
        """Add `route`; False if it was there. RouteError past `max_routes`."""
        if route in self._routes:
            return False
        if len(self._routes) >= self.max_routes:
            raise RouteError(f"routing table full ({self.max_routes} routes)")
        self._routes.add(route)
        if self._bridged:
            self._bridged.clear()
        gw = clean_owner_gateway(route.owner)
        if gw is not None:
            self._clean.setdefault(gw, set()).add(route)
        elif route.owner.startswith("p:"):
            self._persistent.setdefault(route.owner, set()).add(route)
        target = (route.dest_exchange, route.dest)
        kind = route.kind
        if kind == "mqtt":
            self._mqtt.add(route.pattern, route.dest)
        elif kind == "topic":
            self._topic.add(_amqp_filter(route.exchange, route.pattern), target)
        elif kind == "direct":
            self._direct.setdefault((route.exchange, route.pattern), set()).add(target)
        elif kind == "fanout":
            self._fanout.setdefault(route.exchange, set()).add(target)
        else:
            self._headers.setdefault(route.exchange, []).append(route)
        return True

    def remove(self, route: Route) -> bool:
        """Remove `route`; False if it was not there."""
        if route not in self._routes:
            return False
        self._routes.discard(route)
        if self._bridged:
            self._bridged.clear()
        gw = clean_owner_gateway(route.owner)
        if gw is not None:
            _discard(self._clean, gw, route)
        elif route.owner.startswith("p:"):
            _discard(self._persistent, route.owner, route)
        target = (route.dest_exchange, route.dest)
        kind = route.kind
        if kind == "mqtt":
            self._mqtt.remove(route.pattern, route.dest)
        elif kind == "topic":
            self._topic.remove(_amqp_filter(route.exchange, route.pattern), target)
        elif kind == "direct":
            _discard(self._direct, (route.exchange, route.pattern), target)
        elif kind == "fanout":
            _discard(self._fanout, route.exchange, target)
        else:
            bucket = self._headers[route.exchange]
            bucket.remove(route)
            if not bucket:
                del self._headers[route.exchange]
        return True

    def apply(self, entry: LogEntry) -> bool:
        """Apply one log entry (in log order); False if it was at or below `version`.

        A route refused by the table (full) is skipped, but the version still advances:
        every gateway refuses it the same way, so the tables stay equal.
        """
        if entry.version <= self.version:
            return False
        self.version = entry.version
        try:
            if entry.op == "add":
                self.add(entry.route)
            else:
                self.remove(entry.route)
        except RouteError:
            pass
        return True

    # ------------------------------------------------------------------ snapshots
    def snapshot(self) -> tuple[int, list[dict[str, Any]]]:
        """(version, routes as JSON-able dicts)."""
        return self.version, [r.to_json() for r in self._routes]

    def load(self, version: int, routes: Iterable[Mapping[str, Any]]) -> None:
        """Replace the content with a snapshot taken at `version`."""
        self.__init__(max_routes=self.max_routes)  # type: ignore[misc]
        for d in routes:
            try:
                self.add(Route.from_json(d))
            except RouteError:
                continue
        self.version = version

    # ------------------------------------------------------------------ lookups
    def mqtt_lmqs(self, topic: str) -> set[str]:
        """LMQs of every MQTT route matching the MQTT topic name `topic`."""
        return self._mqtt.match(topic)

    def mqtt_lmqs_sorted(self, topic: str) -> tuple[str, ...]:
        """`mqtt_lmqs` as a sorted tuple, remembered per topic until the next change (the
        MQTT dispatcher's router: a publisher repeats its topics)."""
        return self._mqtt.match_sorted(topic)

    def mqtt_publish_lmqs(self, topic: str) -> tuple[str, ...]:
        """The LMQs an MQTT publish on `topic` reaches, sorted: those of matching MQTT
        routes, plus the AMQP queues reached through BRIDGE_EXCHANGE with the routing key
        `mqtt_topic_to_key(topic)` (the MQTT dispatcher's router; remembered per topic
        until the next change). Topics starting with `$` (the gateway's `$SYS` tree) are
        not bridged, as an MQTT `#` does not match them either."""
        hit = self._bridged.get(topic)
        if hit is not None:
            return hit
        mqtt = self._mqtt.match_sorted(topic)
        if not (self._topic or self._direct or self._fanout or self._headers) \
                or topic[:1] == "$":
            return mqtt  # no AMQP binding at all: the plain MQTT lookup
        amqp = self.amqp_lmqs(BRIDGE_EXCHANGE, mqtt_topic_to_key(topic))
        hit = tuple(sorted(amqp.union(mqtt))) if amqp else mqtt
        if len(self._bridged) >= BRIDGE_CACHE_TOPICS:
            self._bridged.clear()
        self._bridged[topic] = hit
        return hit

    def amqp_lmqs(self, exchange: str, routing_key: str,
                  headers: Mapping[str, Any] | None = None) -> set[str]:
        """LMQs a message published to `exchange` reaches, following exchange-to-exchange
        routes up to MAX_EXCHANGE_HOPS deep (each exchange visited once)."""
        result: set[str] = set()
        seen = {exchange}
        frontier = [exchange]
        for _ in range(MAX_EXCHANGE_HOPS):
            nxt: list[str] = []
            for ex in frontier:
                for is_exchange, name in self._targets(ex, routing_key, headers):
                    if not is_exchange:
                        result.add(name)
                    elif name not in seen:
                        seen.add(name)
                        nxt.append(name)
            if not nxt:
                break
            frontier = nxt
        return result

    def _targets(self, exchange: str, key: str,
                 headers: Mapping[str, Any] | None) -> Iterator[tuple[bool, str]]:
        hit = self._direct.get((exchange, key))
        if hit:
            yield from hit
        hit = self._fanout.get(exchange)
        if hit:
            yield from hit
        if len(self._topic):
            yield from self._topic.match(_amqp_topic(exchange, key))
        bucket = self._headers.get(exchange)
        if bucket:
            h = headers or {}
            for route in bucket:
                if _headers_match(route, h):
                    yield (route.dest_exchange, route.dest)


def _discard(index: dict, key: Any, target: tuple[bool, str]) -> None:
    bucket = index[key]
    bucket.discard(target)
    if not bucket:
        del index[key]
