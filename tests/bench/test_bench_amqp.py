"""`lmq bench amqp` measures what it claims: a tiny configuration against a real
`lmq serve` (and RabbitMQ when installed) delivers messages in every phase, and the
memory phase really declares its queues. No speed is judged here: the machine is shared."""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import shutil
import tempfile

import pytest

from gateway.amqp.methods import QueueDeclare
from lmq.bench import amqp
from lmq.bench._amqp_load import RawClient
from lmq.bench._amqp_servers import rabbitmq_installed, start_lmq_amqp, start_rabbitmq, stop_tree

pytestmark = pytest.mark.timeout(300)
TINY = ["--duration", "0.8", "--warmup", "0.2", "--runs", "1", "--pin", "off",
        "--declare-count", "50", "--window", "200", "--prefetch", "100"]


def _opts(*extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    amqp.add_arguments(parser)
    opts = parser.parse_args([*TINY, *extra])
    amqp._defaults(opts)
    return opts


@pytest.fixture(scope="module")
def tmp_dir():
    d = tempfile.mkdtemp(prefix="lmq-bench-amqp-test-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _check_phases(server, opts) -> dict:
    ctx = mp.get_context("fork")
    out = {ph: amqp.run_phase(ph, server, opts, (), ctx)
           for ph in ("single_raw", "single_pika", "fanout10", "queues10k")}
    for ph in ("single_raw", "single_pika", "fanout10"):
        assert "error" not in out[ph], out[ph]
        assert out[ph]["consumed_per_s"] > 0, (ph, out[ph])
        assert out[ph]["confirmed_per_s"] > 0, (ph, out[ph])
    # fan-out: every confirmed publish reaches ten queues.
    assert out["fanout10"]["consumed_per_s"] > out["fanout10"]["confirmed_per_s"]
    assert out["queues10k"]["queues"] == 50
    return out


def test_tiny_run_against_lmq_delivers_in_every_phase_and_cleans_up(tmp_dir):
    server = start_lmq_amqp(tmp_dir)
    try:
        _check_phases(server, _opts())
        # The phases delete what they declared: the queue names are free again.
        c = RawClient(server.host, server.port)
        ch = c.channel()
        ok = c.call(ch, QueueDeclare(queue="bench.single_raw"))
        c.close()
        assert ok.message_count == 0
    finally:
        stop_tree(server)


@pytest.mark.slow
@pytest.mark.skipif(rabbitmq_installed() is None, reason="RabbitMQ is not installed")
def test_tiny_run_against_rabbitmq(tmp_dir):
    started = start_rabbitmq(tmp_dir)
    assert started is not None
    server, epmd = started
    try:
        _check_phases(server, _opts())
    finally:
        stop_tree(server)
        stop_tree(epmd)


def test_command_prints_one_json_report(capsys):
    assert amqp.run(_opts("--json", "--phases", "single_raw")) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["results"]["lmq"]["single_raw"]["consumed_per_s"] > 0
