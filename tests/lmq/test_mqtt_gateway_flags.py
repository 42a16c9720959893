"""`lmq mqtt --orphan-timeout / --sweep-interval` (docs/stateless-gateways.md, "Failure
behaviour"): they set the gateway's gateway_orphan_timeout_s / gateway_sweep_interval_s,
win over the TOML file, and a bad value ends the command with one line and exit code 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from gateway.mqtt.config import MqttConfig
from lmq.cli import build_parser
from lmq.commands.mqtt import mqtt_config_from_args

ROOT = Path(__file__).resolve().parents[2]


def test_flags_set_the_sweep_settings_and_win_over_the_file(tmp_path):
    config = tmp_path / "mqtt.toml"
    config.write_text("gateway_orphan_timeout_s = 99.0\ngateway_sweep_interval_s = 9.0\n")
    parser = build_parser()
    args = parser.parse_args(["mqtt", "--mqtt-config", str(config), "--orphan-timeout", "42",
                              "--sweep-interval", "7.5"])
    got = mqtt_config_from_args(args)
    assert (got.gateway_orphan_timeout_s, got.gateway_sweep_interval_s) == (42.0, 7.5)
    # Without the flags: the file's values; without either: the defaults.
    got = mqtt_config_from_args(parser.parse_args(["mqtt", "--mqtt-config", str(config)]))
    assert (got.gateway_orphan_timeout_s, got.gateway_sweep_interval_s) == (99.0, 9.0)
    got = mqtt_config_from_args(parser.parse_args(["mqtt"]))
    default = MqttConfig()
    assert (got.gateway_orphan_timeout_s, got.gateway_sweep_interval_s) == (
        default.gateway_orphan_timeout_s, default.gateway_sweep_interval_s)


def test_non_positive_orphan_timeout_refused_in_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "lmq", "mqtt", "--orphan-timeout", "0",
                        "--data-dir", str(tmp_path / "d"), "--namesrv-addr", "127.0.0.1:1"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    lines = [x for x in r.stderr.splitlines() if "ERROR" in x]
    assert len(lines) == 1 and "gateway_orphan_timeout_s" in lines[0], r.stderr
