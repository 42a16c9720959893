"""Run the services of docker-compose.yml as local processes, without a Docker engine.

Each service runs its compose `command` and `environment` (with `${VAR:-default}`
interpolation), from the repository, with these mappings (docs/deploy.md, "Tested without
Docker"):

- every container port a service listens on (`expose` and the container side of `ports`)
  gets a free port on 127.0.0.1 (below the ephemeral range); a service with `network_mode: service:X` shares X's;
- in arguments and environment values: `<service>:<port>` becomes `127.0.0.1:<its port>`,
  `0.0.0.0` and a service name after a `--...host` flag become `127.0.0.1`, a token equal to a port the
  service listens on becomes the local port, and a path under a volume's container path
  moves to that volume's local directory (named volumes: a directory per volume under the
  run's directory; bind mounts: relative to the compose file);
- `lmq` is `python -m lmq` of this checkout; health checks (`CMD` form) run the same way,
  their text rewritten like the arguments.

Services start in `depends_on` order, each after its dependencies pass their health check
(compose does that only with `condition: service_healthy`, which the file uses) or, for a
one-shot (`condition: service_completed_successfully`), after it exited with status 0.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from tests.ports import free_port

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "docker-compose.yml"
_VAR = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)")
_PORT_IN_TEXT = re.compile(r"(?<![\d.])(\d{2,5})(?![\d.])")


def load(path: Path = COMPOSE_FILE, env: dict[str, str] | None = None) -> dict:
    """The compose file, YAML anchors merged and variables interpolated."""
    env = dict(os.environ if env is None else env)

    def interpolate(value):
        if isinstance(value, str):
            def sub(m: re.Match) -> str:
                if m.group(0) == "$$":
                    return "$"
                name = m.group(1) or m.group(3)
                got = env.get(name)
                return got if got else (m.group(2) or "")
            return _VAR.sub(sub, value)
        if isinstance(value, list):
            return [interpolate(v) for v in value]
        if isinstance(value, dict):
            return {k: interpolate(v) for k, v in value.items()}
        return value

    with open(path, encoding="utf-8") as f:
        return interpolate(yaml.safe_load(f))


def container_ports(svc: dict) -> list[int]:
    ports = [int(p) for p in svc.get("expose", [])]
    for spec in svc.get("ports", []):
        ports.append(int(str(spec).rsplit(":", 1)[-1].split("/")[0]))
    return sorted(set(ports))


def depends_on(svc: dict) -> list[str]:
    dep = svc.get("depends_on", [])
    return list(dep) if isinstance(dep, (list, dict)) else []


def start_order(services: dict) -> list[str]:
    order: list[str] = []

    def visit(name: str, path: tuple[str, ...] = ()) -> None:
        if name in order:
            return
        if name in path:
            raise ValueError(f"depends_on cycle through {name}")
        for dep in depends_on(services[name]):
            visit(dep, path + (name,))
        order.append(name)

    for name in services:
        visit(name)
    return order


def one_shots(services: dict) -> set[str]:
    """Services others wait for with `condition: service_completed_successfully`."""
    return {dep for svc in services.values() if isinstance(svc.get("depends_on"), dict)
            for dep, cond in svc["depends_on"].items()
            if (cond or {}).get("condition") == "service_completed_successfully"}


class Service:
    def __init__(self, stack: Stack, name: str, spec: dict) -> None:
        self.stack, self.name, self.spec = stack, name, spec
        mode = spec.get("network_mode", "")
        self.netns = mode.split(":", 1)[1] if mode.startswith("service:") else name
        self.proc: subprocess.Popen | None = None
        self.log_path = stack.dir / "logs" / f"{name}.log"
        self.mounts: list[tuple[str, Path]] = []
        for vol in spec.get("volumes", []):
            source, target = str(vol).split(":")[:2]
            if source.startswith((".", "/")):
                local = (stack.compose_path.parent / source).resolve()
            else:
                local = stack.dir / "volumes" / source
                local.mkdir(parents=True, exist_ok=True)
            self.mounts.append((target.rstrip("/"), local))
        self.mounts.sort(key=lambda m: -len(m[0]))

    # -- mapping ---------------------------------------------------------------------

    def ports(self) -> dict[int, int]:
        return self.stack.ports[self.netns]

    def port(self, container_port: int) -> int:
        """The local port of one of this service's container ports."""
        return self.ports()[container_port]

    def map_token(self, token: str, after: str = "") -> str:
        services = self.stack.services
        if token == "0.0.0.0" or (token in services and "host" in after):
            return "127.0.0.1"
        if token.isdigit() and int(token) in self.ports():
            return str(self.ports()[int(token)])
        for target, local in self.mounts:
            if token == target or token.startswith(target + "/"):
                return str(local) + token[len(target):]

        def hostport(m: re.Match) -> str:
            host, port = m.group(1), int(m.group(2))
            owner = self.netns if host in ("127.0.0.1", "localhost") else \
                self.stack.svc[host].netns
            return f"127.0.0.1:{self.stack.ports[owner][port]}"

        names = "|".join(re.escape(n) for n in sorted(services, key=len, reverse=True))
        return re.sub(rf"(?<![\w.-])({names}|127\.0\.0\.1|localhost):(\d+)", hostport, token)

    def map_text(self, text: str) -> str:
        """Code of a health check: every number that is a port of this service, and
        paths under its volumes."""
        text = _PORT_IN_TEXT.sub(
            lambda m: str(self.ports().get(int(m.group(1)), m.group(1))), text)
        for target, local in self.mounts:
            text = re.sub(rf"(?<![\w/]){re.escape(target)}(?=[/'\"]|$)",
                          lambda _m, local=local: str(local), text)
        return text

    def argv(self, words: list[str], *, code: bool = False) -> list[str]:
        out = [self.map_text(w) if code else self.map_token(w, words[i - 1] if i else "")
               for i, w in enumerate(words)]
        if out and out[0] == "lmq":
            out = [sys.executable, "-m", "lmq"] + out[1:]
        elif out and out[0] in ("python", "python3"):
            out[0] = sys.executable
        return out

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        raw = self.spec.get("environment") or {}
        if isinstance(raw, list):
            raw = dict(item.split("=", 1) for item in raw)
        env.update({k: self.map_token(str(v)) for k, v in raw.items()})
        return env

    # -- life cycle -------------------------------------------------------------------

    def start(self) -> Service:
        command = self.spec["command"]
        assert isinstance(command, list), f"{self.name}: use the exec (list) form"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.argv(command), cwd=str(REPO),
                                         env=self.environment(), stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def healthy(self) -> bool:
        test = self.spec["healthcheck"]["test"]
        if test[0] == "CMD":
            argv = self.argv(test[1:], code=True)
        else:  # CMD-SHELL
            argv = ["sh", "-c", self.map_text(test[1])]
        try:
            return subprocess.run(argv, cwd=str(REPO), env=self.environment(),
                                  capture_output=True, timeout=10).returncode == 0
        except subprocess.TimeoutExpired:
            return False

    def wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not self.healthy():
            if not self.running():
                raise RuntimeError(f"{self.name} exited ({self.proc.returncode}): "
                                   f"{self.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} not healthy after {timeout:g} s: "
                                   f"{self.log_tail()}")
            time.sleep(0.5)

    def signal(self, sig: int) -> None:
        if self.running():
            os.killpg(self.proc.pid, sig)   # the service's own process group (Spark's JVM)

    def stop(self, timeout: float = 20.0) -> None:
        if self.proc is None:
            return
        self.signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""


class Stack:
    """The compose file's services as local processes; `with Stack(dir) as s: ...`."""

    def __init__(self, run_dir: Path, compose_path: Path = COMPOSE_FILE,
                 env: dict[str, str] | None = None) -> None:
        self.dir, self.compose_path = Path(run_dir), compose_path
        self.config = load(compose_path, env)
        self.services: dict = self.config["services"]
        self.ports: dict[str, dict[int, int]] = {}
        taken: set[int] = set()
        for name, spec in self.services.items():
            if not str(spec.get("network_mode", "")).startswith("service:"):
                self.ports[name] = {p: free_port(taken) for p in container_ports(spec)}
        self.svc = {name: Service(self, name, spec) for name, spec in self.services.items()}

    def up(self, names: list[str] | None = None, timeout: float = 120.0) -> Stack:
        waited_for_exit = one_shots(self.services)
        for name in start_order(self.services):
            if names is not None and name not in names:
                continue
            svc = self.svc[name].start()
            if name in waited_for_exit:
                code = svc.proc.wait(timeout)
                if code != 0:
                    raise RuntimeError(f"{name} exited with {code}: {svc.log_tail()}")
            else:
                svc.wait_healthy(timeout)
        return self

    def down(self) -> None:
        for name in reversed(start_order(self.services)):
            self.svc[name].stop()

    def __enter__(self) -> Stack:
        return self

    def __exit__(self, *exc) -> None:
        self.down()
