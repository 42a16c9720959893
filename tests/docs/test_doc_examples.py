"""Every shell command and Python example of README.md and docs/*.md runs as written.

The fenced ``sh``/``bash``/``python`` blocks are extracted and run, in document order,
against one live ``lmq serve`` started by the test. The examples name the default ports
(9876, 10911, 1883), so the server runs on them inside a private network namespace
(``unshare -n``, needs root) and every example is run in that namespace too
(``nsenter --net``). Without namespaces the test uses the default ports if they are free,
else it skips and says why.

Markers, in a comment on the lines just before a block:

* ``<!-- not run: REASON -->``: the block is skipped (a server, docker, a benchmark, a
  placeholder); the reason is required.
* ``<!-- prints: TEXT -->``: the block's standard output must contain TEXT.

Blocks run in document order on one server, so a later block may read what an earlier one
sent (docs/client.md's pull example reads the messages its first example sent); run the
whole module, not one block with -k.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.ports import port_free

ROOT = Path(__file__).resolve().parents[2]
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
DEFAULT_PORTS = (9876, 10911, 1883, 9100)  # 9100: metrics + dashboard (docs/dashboard.md)
RUN_LANGS = {"sh", "bash", "python"}
BLOCK_TIMEOUT = 120

FENCE = re.compile(r"^```(\w*)\s*$")
MARKER = re.compile(r"<!--\s*(not run|prints):\s*(.*?)\s*-->")


@dataclass
class Block:
    path: Path
    line: int
    lang: str
    code: str
    skip: str | None
    prints: list[str]

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def extract_blocks(path: Path) -> list[Block]:
    """Top-level fenced blocks with their markers (indented fences are not examples)."""
    blocks: list[Block] = []
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start, lang = i, m.group(1)
        j = i + 1
        while j < len(lines) and not FENCE.match(lines[j]):
            j += 1
        if lang in RUN_LANGS:
            skip, prints = None, []
            k = start - 1
            while k >= 0 and (not lines[k].strip() or MARKER.search(lines[k])):
                for kind, text in MARKER.findall(lines[k]):
                    if kind == "not run":
                        skip = text
                    else:
                        prints.append(text)
                k -= 1
            blocks.append(Block(path, start + 1, lang, "\n".join(lines[start + 1:j]) + "\n",
                                skip, prints))
        i = j + 1
    return blocks


ALL_BLOCKS = [b for path in DOC_FILES for b in extract_blocks(path)]


def test_every_skipped_block_gives_a_reason():
    assert ALL_BLOCKS, "no examples found"
    for block in ALL_BLOCKS:
        assert block.skip is None or len(block.skip) >= 5, f"{block.name}: reason too short"


def _can_unshare() -> bool:
    if os.geteuid() != 0 or not all(shutil.which(t) for t in ("unshare", "nsenter", "ip")):
        return False
    return subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def live_server(tmp_path_factory):
    """(prefix, env, cwd): run a command in the server's network with `prefix + argv`."""
    work = tmp_path_factory.mktemp("doc-examples")
    bindir = work / "bin"
    bindir.mkdir()
    shim = bindir / "lmq"  # `lmq` of this checkout, whatever is pip-installed
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m lmq "$@"\n')
    shim.chmod(0o755)
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}",
               PYTHONPATH=f"{ROOT}:{os.environ.get('PYTHONPATH', '')}".rstrip(":"),
               HOME=str(work), PYTHONUNBUFFERED="1")
    env.pop("NAMESRV_ADDR", None)
    serve = [sys.executable, "-m", "lmq", "serve", "--data-dir", str(work / "data"),
             "--metrics-port", "9100"]
    log = open(work / "server.log", "wb")
    if _can_unshare():
        proc = subprocess.Popen(
            ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *serve],
            cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT)
        prefix = ["nsenter", f"--net=/proc/{proc.pid}/ns/net"]
    elif all(port_free(p, "127.0.0.1") for p in DEFAULT_PORTS):
        proc = subprocess.Popen(serve, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT)
        prefix = []
    else:
        pytest.skip("the examples name the default ports 9876/10911/1883, which are in use, "
                    "and no private network namespace is available (needs root + unshare)")
    try:
        deadline = time.monotonic() + 60
        while True:  # until the broker has registered with the name server
            r = subprocess.run([*prefix, "lmq", "admin", "clusterList", "--json"], env=env,
                               cwd=work, capture_output=True, text=True, timeout=30)
            if r.returncode == 0 and "10911" in r.stdout:
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail("lmq serve did not come up:\n"
                            + (work / "server.log").read_text(errors="replace")[-3000:])
            time.sleep(0.5)
        yield prefix, env, work
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.mark.parametrize("block", ALL_BLOCKS, ids=[b.name for b in ALL_BLOCKS])
def test_doc_example_runs(block: Block, live_server):
    if block.skip is not None:
        pytest.skip(f"marked not run: {block.skip}")
    prefix, env, cwd = live_server
    if block.lang == "python":
        argv = [sys.executable, "-c", block.code]
    else:
        argv = ["bash", "-e", "-o", "pipefail", "-x", "-c", block.code]
    r = subprocess.run([*prefix, *argv], env=env, cwd=cwd, capture_output=True, text=True,
                       timeout=BLOCK_TIMEOUT)
    assert r.returncode == 0, f"{block.name} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
    assert "Traceback" not in r.stderr, r.stderr
    for text in block.prints:
        assert text in r.stdout, f"{block.name} did not print {text!r}:\n{r.stdout}"
