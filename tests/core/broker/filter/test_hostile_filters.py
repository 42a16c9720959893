"""Hostile filter input: numbers in SQL92 filters (which property values convert; hostile
ones cost linear work and cannot stall a running broker) and over-long tag expressions."""

from __future__ import annotations

import threading
import time

import pytest

from core.broker.filter import (
    DEFAULT_MAX_NUMBER_LENGTH,
    DEFAULT_MAX_TAG_EXPRESSION_LENGTH,
    FilterLimits,
    FilterParseError,
    build_message_filter,
    compile_sql92,
)
from core.broker.filter._sql_compile import to_double, to_long
from core.broker.filter._sql_lexer import tokenize
from core.common.codec import decode_records
from core.remoting.codec import RemotingCommand
from tests.core.broker.harness import (
    ServerProcess,
    heartbeat_request,
    pull_request,
    send_request,
    sync_invoke,
    wait_until,
)

# --- behaviour: Java's Long.valueOf / Double.valueOf, written out ------------------------

LONGS = [
    ("0", 0), ("7", 7), ("-7", -7), ("+7", 7), ("007", 7),
    ("9223372036854775807", 2**63 - 1), ("-9223372036854775808", -(2**63)),
]
NOT_LONGS = [
    "", "+", "-", " 7", "7 ", "7.0", "1e3", "1_000", "0x10", "9223372036854775808",
    "-9223372036854775809", "7L", "++7", "abc",
]
DOUBLES = [
    ("0", 0.0), ("1", 1.0), ("1.", 1.0), (".5", 0.5), ("-.5", -0.5), ("+1.25", 1.25),
    ("1.5e3", 1500.0), ("1E-2", 0.01), ("2e+2", 200.0), ("1.5f", 1.5), ("1.5D", 1.5),
    ("3d", 3.0), (" 4 ", 4.0), ("\t4\n", 4.0), ("Infinity", float("inf")),
    ("-Infinity", float("-inf")), ("007.50", 7.5), (".5e1", 5.0),
]
NOT_DOUBLES = [
    "", ".", "-", "+.", "e3", "1e", "1e+", "1.5.5", "1..5", "NaN", "0x10", "1,5", "1 5",
    "infinity", "Inf", "1.5fd", "1f5", "--1", "1e3.5", "abc", "1_0", ". 5",
]


@pytest.mark.parametrize(("text", "value"), LONGS)
def test_long_values(text: str, value: int) -> None:
    assert to_long(text) == value


@pytest.mark.parametrize("text", NOT_LONGS)
def test_not_longs(text: str) -> None:
    assert to_long(text) is None


@pytest.mark.parametrize(("text", "value"), DOUBLES)
def test_double_values(text: str, value: float) -> None:
    assert to_double(text) == value


@pytest.mark.parametrize("text", NOT_DOUBLES)
def test_not_doubles(text: str) -> None:
    assert to_double(text) is None


def test_long_values_are_not_converted() -> None:
    # Fits: a number padded to the cap still converts; one character more does not.
    padded = "0" * (DEFAULT_MAX_NUMBER_LENGTH - 1) + "7"
    assert to_long(padded) == 7
    assert to_double(padded) == 7.0
    assert to_long("0" + padded) is None
    assert to_double(" " + padded) is None
    f = compile_sql92("a > 5")
    assert f.evaluate({"a": padded}) is True
    assert f.evaluate({"a": "0" + padded}) is None  # unknown, as for "abc"
    # The cap is a FilterLimits setting.
    small = FilterLimits(max_number_length=4)
    assert compile_sql92("a > 1.5", small).evaluate({"a": "12.5"}) is True
    assert compile_sql92("a > 1.5", small).evaluate({"a": "123.5"}) is None
    assert compile_sql92("a > b", small).evaluate({"a": "123.5", "b": "1"}) is None
    with pytest.raises(ValueError):
        FilterLimits(max_number_length=0)


# --- linear work on adversarial text ---------------------------------------------------


def _best_time(fn, arg: str, rounds: int = 5) -> float:
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        fn(arg)
        best = min(best, time.perf_counter() - start)
    return best


# Shapes that make a backtracking matcher try many ways to split a run of digits.
ADVERSARIAL = [
    lambda n: "1" * n + "x",
    lambda n: "1" * n + ".",
    lambda n: "1" * n + ".x",
    lambda n: "1" * n + "." + "1" * n + "x",
    lambda n: "." + "1" * n + "x",
    lambda n: "1e" + "1" * n + "x",
    lambda n: "1" * n + "e" + "1" * n + "fx",
    lambda n: "+" + "1" * n + "ex",
]


@pytest.mark.parametrize("shape", range(len(ADVERSARIAL)))
def test_number_conversion_is_linear(shape: int) -> None:
    make = ADVERSARIAL[shape]
    unlimited = 10**9  # measure the matcher itself, not the length cap

    def convert(text: str) -> None:
        to_double(text, unlimited)
        to_long(text, unlimited)

    small, large = make(2_000), make(20_000)
    convert(small)  # warm up
    t_small = max(_best_time(convert, small), 1e-5)
    t_large = _best_time(convert, large)
    # Linear work gives a ratio near 10, quadratic near 100: 40 leaves room for noise.
    assert t_large / t_small < 40, (shape, t_small, t_large)


def test_filter_on_huge_property_is_cheap() -> None:
    # The whole evaluation (cap included) on the largest property a message may carry.
    f = compile_sql92("a > 1.5 OR a = 3 OR a BETWEEN 1 AND 2 OR a > b")
    hostile = {"a": "1" * 32_000 + "x", "b": "2" * 32_000 + "x"}
    start = time.perf_counter()
    for _ in range(100):
        assert f.evaluate(hostile) is None
    assert time.perf_counter() - start < 1.0  # quadratic matching took seconds per call


def test_lexer_is_linear_on_long_literals() -> None:
    def lex(text: str) -> None:
        try:
            tokenize(text)
        except Exception:  # noqa: BLE001 - only the time matters here
            pass

    for make in (lambda n: "a > " + "1" * n + "x", lambda n: "a > " + "1" * n + ".e",
                 lambda n: "a = '" + "''" * n, lambda n: "a > 1 -- " + "-" * n):
        small, large = make(2_000), make(20_000)
        lex(small)
        t_small = max(_best_time(lex, small), 1e-5)
        assert _best_time(lex, large) / t_small < 40


# --- tag expressions ------------------------------------------------------------------


def test_over_long_tag_expression_is_refused() -> None:
    fits = ("T||" * DEFAULT_MAX_TAG_EXPRESSION_LENGTH)[:DEFAULT_MAX_TAG_EXPRESSION_LENGTH]
    assert build_message_filter("TAG", fits) is not None
    assert build_message_filter(None, fits) is not None
    with pytest.raises(FilterParseError):
        build_message_filter("TAG", fits + "X")
    with pytest.raises(FilterParseError):
        build_message_filter("", "||".join(f"t{i}" for i in range(1_000_000)))
    small = FilterLimits(max_tag_expression_length=5)
    assert build_message_filter("TAG", "A||B", limits=small) is not None
    with pytest.raises(FilterParseError):
        build_message_filter("TAG", "A||B||C", limits=small)


# --- end to end: a running `lmq serve` keeps answering ---------------------------------

# A ping slower than this means the loop stalled. The quadratic pattern took ~16 s per
# evaluation of this property; a loaded 2-core box answers in well under a second.
STALL_S = 5.0


def test_hostile_property_does_not_stall_the_server(tmp_path) -> None:
    """A SQL92 subscriber pulls a message whose property is 30 kB of digits; another
    client's heartbeats and route queries keep being answered promptly."""
    with ServerProcess(tmp_path / "data") as server:
        hostile = "1" * 30_000 + "x"
        for value in ("5", hostile, "0.5", hostile, "7"):
            resp = sync_invoke(server.broker_addr, send_request("HostileT", properties={"a": value}))
            assert resp.code == 0, resp.remark

        def all_dispatched() -> bool:  # the consume queue is written after the ack
            r = sync_invoke(server.broker_addr, pull_request("CID_ALL", "HostileT"))
            return r.code == 0 and len(decode_records(r.body_bytes())) == 5

        wait_until(all_dispatched, 30, what="the five messages to be pullable")
        stop = threading.Event()
        results: list[list[str]] = []
        errors: list[BaseException] = []

        def puller() -> None:
            try:
                for _ in range(5):
                    if stop.is_set():
                        return
                    r = sync_invoke(server.broker_addr, pull_request(
                        "CID_HOSTILE", "HostileT", subscription="a > 1.5 OR a = 9",
                        expression_type="SQL92"), timeout=120)
                    results.append([m.properties["a"] for m in decode_records(r.body_bytes())])
            except BaseException as exc:  # noqa: BLE001 - reported by the main thread
                errors.append(exc)

        thread = threading.Thread(target=puller, daemon=True)
        thread.start()
        worst = 0.0
        pings = 0
        try:
            while thread.is_alive() or pings < 5:
                start = time.monotonic()
                assert sync_invoke(server.broker_addr, heartbeat_request("pinger"),
                                   timeout=60).code == 0
                route = RemotingCommand.request(105, {"topic": server.broker_name})
                assert sync_invoke(server.namesrv_addr, route, timeout=60).code == 0
                worst = max(worst, time.monotonic() - start)
                pings += 1
                if worst > STALL_S:
                    break  # stalled: fail now rather than after every pull
        finally:
            stop.set()
            thread.join(180)
        assert worst < STALL_S, f"a ping waited {worst:.1f} s"
        assert not errors, errors
        assert results and all(r == ["5", "7"] for r in results), results
        # A pull whose tag expression is megabytes long: SUBSCRIPTION_PARSE_FAILED (23).
        huge = "||".join(f"t{i}" for i in range(300_000))
        r = sync_invoke(server.broker_addr, pull_request("CID_HOSTILE", "HostileT",
                                                         subscription=huge), timeout=60)
        assert r.code == 23, r.remark
