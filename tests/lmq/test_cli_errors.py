"""The `lmq` command as a newcomer meets it: start-up errors are one line naming the cause
and the fix (never a traceback), and the small conveniences (--version, per-command usage)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from core.broker.config import BrokerConfig
from core.namesrv import NamesrvConfig
from gateway.mqtt.config import MqttConfig
from lmq.commands._checks import config_type_error, lock_data_dir

ROOT = Path(__file__).resolve().parents[2]


def lmq(*args: str, timeout: float = 60, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lmq", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, **kw)


def one_line_error(r: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in r.stderr, r.stderr
    lines = [line for line in r.stderr.splitlines() if "ERROR" in line or "error:" in line]
    assert len(lines) == 1, r.stderr
    return lines[0]


def serve_args(tmp_path: Path, *extra: str) -> list[str]:
    return ["serve", "--no-grpc", "--data-dir", str(tmp_path / "data"), "--namesrv-port", "0",
            "--broker-port", "0", "--no-mqtt", *extra]


def test_version():
    r = lmq("--version")
    assert r.returncode == 0
    assert r.stdout.startswith("lmq ") and r.stdout.split()[1][0].isdigit(), r.stdout


def test_wrong_serve_flag_shows_serve_usage():
    r = lmq("serve", "--mqtt-prot", "1884")
    assert r.returncode == 2
    assert "usage: lmq serve" in r.stderr
    assert "lmq serve --help" in one_line_error(r)


def test_unknown_log_level_refused(tmp_path):
    r = lmq(*serve_args(tmp_path, "--log-level", "verbose"))
    assert r.returncode == 2
    line = one_line_error(r)
    assert "'verbose'" in line and "DEBUG" in line


def test_config_value_of_wrong_type_refused(tmp_path):
    config = tmp_path / "lmq.toml"
    config.write_text('file_reserved_hours = "abc"\n')
    r = lmq(*serve_args(tmp_path, "--config", str(config)))
    assert r.returncode == 2
    line = one_line_error(r)
    assert "file_reserved_hours = 'abc'" in line and "must be a number" in line
    assert str(config) in line


def test_broker_config_value_of_wrong_type_refused(tmp_path):
    """`lmq broker` checks the broker part of the file as `lmq serve` does."""
    config = tmp_path / "lmq.toml"
    config.write_text('file_reserved_hours = "abc"\n')
    r = lmq("broker", "--data-dir", str(tmp_path / "data"), "--broker-port", "0",
            "--namesrv-addr", "127.0.0.1:1", "--config", str(config))
    assert r.returncode == 2
    line = one_line_error(r)
    assert "file_reserved_hours = 'abc'" in line and str(config) in line
    assert not (tmp_path / "data").exists()  # refused before the data dir is touched


@pytest.mark.parametrize("config", [BrokerConfig(), NamesrvConfig(), MqttConfig()])
def test_defaults_pass_the_type_check(config):
    assert config_type_error(config) is None


def test_type_check_accepts_an_int_for_a_float_but_no_bool_for_an_int():
    assert config_type_error(BrokerConfig(file_reserved_hours=2)) is None
    assert "must be an integer" in config_type_error(BrokerConfig(port=True))


def test_taken_port_named_with_its_listener(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = lmq("serve", "--no-grpc", "--data-dir", str(tmp_path / "data"), "--namesrv-port", "0",
                "--broker-port", str(port), "--no-mqtt")
    assert r.returncode == 1
    assert f"port {port} (broker)" in one_line_error(r)


def test_taken_port_of_a_standalone_name_server(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = lmq("namesrv", "--port", str(port))
    assert r.returncode == 1
    assert f"port {port} (name server)" in one_line_error(r)


def test_data_dir_held_by_another_server(tmp_path):
    import os

    fd, problem = lock_data_dir(str(tmp_path / "data"))  # what a running server holds
    assert problem is None
    try:
        r = lmq(*serve_args(tmp_path))
    finally:
        os.close(fd)
    assert r.returncode == 1
    line = one_line_error(r)
    assert "in use by another lmq server" in line and f"pid {os.getpid()}" in line
    assert "--data-dir" in line


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_closed_pipe_is_a_quiet_exit(tmp_path):
    """`lmq admin topic list | head` when head has gone: no BrokenPipeError traceback."""
    import time

    addr = f"127.0.0.1:{_free_port()}"
    server = subprocess.Popen(
        [sys.executable, "-m", "lmq", "serve", "--no-grpc", "--data-dir", str(tmp_path / "data"),
         "--namesrv-port", addr.split(":")[1], "--broker-port", "0", "--no-mqtt"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while lmq("admin", "clusterList", "-n", addr).returncode != 0:
            assert server.poll() is None and time.monotonic() < deadline, "server did not start"
            time.sleep(0.3)
        proc = subprocess.Popen([sys.executable, "-m", "lmq", "admin", "topic", "list", "-n", addr],
                                cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        proc.stdout.close()  # the reader is gone before the first line is written
        err = proc.stderr.read().decode()
        proc.wait(timeout=60)
        proc.stderr.close()
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert "BrokenPipe" not in err and "Traceback" not in err, err
    assert proc.returncode == 141


def test_gateway_waits_for_its_name_server_and_stops_on_sigterm(tmp_path):
    import signal

    addr = f"127.0.0.1:{_free_port()}"  # nothing listens there
    proc = subprocess.Popen(
        [sys.executable, "-m", "lmq", "mqtt", "--namesrv-addr", addr, "--port", "0",
         "--data-dir", str(tmp_path / "mqtt")],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        lines = [proc.stderr.readline() for _ in range(2)]  # it retries, saying so each time
        proc.send_signal(signal.SIGTERM)
        rest = proc.stderr.read()
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()
    for line in lines:
        assert f"name server not reachable: {addr}" in line, lines
        assert "Connection refused" in line
        assert "fix --namesrv-addr" in line
    assert "Traceback" not in rest, rest


def test_admin_without_name_server_is_one_line():
    r = lmq("admin", "clusterList", "-n", f"127.0.0.1:{_free_port()}", "--timeout", "2")
    assert r.returncode == 1
    assert "no name server reachable" in one_line_error(r)


def test_one_spelling_of_the_mqtt_flags_for_both_commands():
    from lmq.cli import build_parser

    parser = build_parser()
    for argv in (["serve", "--mqtt-port", "1884"], ["mqtt", "--mqtt-port", "1884"],
                 ["mqtt", "--port", "1884"]):
        assert parser.parse_args(argv).mqtt_port == 1884, argv
    help_text = _subparser(parser, "mqtt").format_help()
    assert "--mqtt-port" in help_text and "--port" not in help_text.replace("--mqtt-port", "")


def _subparser(parser, name):
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[name]
    raise KeyError(name)


def test_every_option_has_help():
    import argparse

    from lmq.cli import build_parser

    def walk(parser, path):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from walk(sub, f"{path} {name}")
            elif action.option_strings and action.help is not argparse.SUPPRESS:
                yield path, action

    missing = [f"{path} {'/'.join(a.option_strings)}" for path, a in walk(build_parser(), "lmq")
               if not a.help]
    assert not missing, missing


def test_taken_mqtt_port_named_embedded_and_standalone(tmp_path):
    import time

    addr = f"127.0.0.1:{_free_port()}"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = subprocess.Popen(
            [sys.executable, "-m", "lmq", "serve", "--no-grpc", "--data-dir", str(tmp_path / "data"),
             "--namesrv-port", addr.split(":")[1], "--broker-port", "0", "--mqtt-port", str(port)],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            # lmq serve keeps its name server and broker up and says why MQTT is not.
            deadline = time.monotonic() + 60
            for line in server.stderr:
                if "MQTT gateway not started" in line or time.monotonic() > deadline:
                    break
            assert "MQTT gateway not started" in line and f"MQTT port {port}" in line, line
            assert "--mqtt-port" in line
            while lmq("admin", "clusterList", "-n", addr).returncode != 0:
                assert time.monotonic() < deadline, "broker did not register"
                time.sleep(0.3)
            # lmq mqtt alone exits with one line naming the port.
            r = lmq("mqtt", "--namesrv-addr", addr, "--mqtt-port", str(port),
                    "--data-dir", str(tmp_path / "gw"))
        finally:
            server.terminate()
            server.wait(timeout=30)
            server.stderr.close()
    assert r.returncode == 1
    assert f"port {port} (MQTT)" in one_line_error(r)


def test_mqtt_config_value_of_wrong_type_refused(tmp_path):
    config = tmp_path / "mqtt.toml"
    config.write_text('receive_maximum = "lots"\n')
    r = lmq(*serve_args(tmp_path)[:-1], "--mqtt-config", str(config))
    assert r.returncode == 2
    line = one_line_error(r)
    assert "receive_maximum = 'lots'" in line and "must be an integer" in line
