"""`lmq admin group update/show` against a real name server and broker: FIFO on and off
(UPDATE_AND_CREATE_SUBSCRIPTIONGROUP consumeMessageOrderly, docs/pop.md), other settings
kept, errors."""

from __future__ import annotations

import json

from lmq.cli import main
from tests.core.client.conftest import threaded_cluster  # noqa: F401 - the fixture


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["admin", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_group_fifo_on_and_off(threaded_cluster, capsys):  # noqa: F811
    ns = threaded_cluster["addr"]
    broker = threaded_cluster["cluster"].brokers[0]
    groups = broker.subscription_group_manager

    code, out, err = run(capsys, "group", "show", "FifoG", "-n", ns)
    assert code == 1 and "no config" in err

    code, out, err = run(capsys, "group", "update", "FifoG", "--fifo", "-n", ns)
    assert code == 0, err
    assert "fifo=True" in out
    assert groups.table["FifoG"].consume_message_orderly is True

    code, out, _ = run(capsys, "group", "show", "FifoG", "-n", ns)
    assert code == 0
    assert out.splitlines()[0].split()[:2] == ["BROKER", "FIFO"]
    assert out.splitlines()[1].split()[1] == "True"

    # Other settings survive an update that only switches FIFO off.
    groups.table["FifoG"].retry_max_times = 3
    code, out, err = run(capsys, "group", "update", "FifoG", "--no-fifo", "-n", ns)
    assert code == 0, err
    assert groups.table["FifoG"].consume_message_orderly is False
    assert groups.table["FifoG"].retry_max_times == 3
    code, out, _ = run(capsys, "group", "show", "FifoG", "-n", ns, "--json")
    configs = json.loads(out)["configs"]
    assert [c["consumeMessageOrderly"] for c in configs.values()] == [False]

    code, _, err = run(capsys, "group", "update", "bad group!", "--fifo", "-n", ns)
    assert code == 2 and err.startswith("lmq admin: error:")
