"""`lmq admin` against a real name server and broker: output of every subcommand, JSON
mode, and one-line errors with non-zero exits."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from lmq.cli import main
from tests.core.client.cluster import REPO


@pytest.fixture(scope="module")
def ns(threaded_cluster):
    return threaded_cluster["addr"]


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["admin", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys, *argv: str):
    code, out, err = run(capsys, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def test_cluster_list(ns, capsys, threaded_cluster):
    code, out, _ = run(capsys, "clusterList", "-n", ns)
    assert code == 0
    assert out.splitlines()[0].split()[:4] == ["CLUSTER", "BROKER", "ID", "ADDRESS"]
    assert "DefaultCluster" in out and threaded_cluster["broker"] in out and " up " in out
    rows = run_json(capsys, "clusterList", "-n", ns)
    assert rows[0]["brokerName"] == "broker-a" and rows[0]["status"] == "up"


def test_topic_lifecycle(ns, capsys):
    code, out, _ = run(capsys, "topic", "create", "AdminT", "-r", "3", "-w", "3", "-n", ns)
    assert code == 0 and "AdminT" in out

    def listed():
        return "AdminT" in run_json(capsys, "topic", "list", "-n", ns)
    deadline = time.monotonic() + 10
    while not listed():
        assert time.monotonic() < deadline
        time.sleep(0.1)

    route = run_json(capsys, "topic", "route", "AdminT", "-n", ns)
    assert route["queueDatas"][0]["writeQueueNums"] == 3
    code, out, _ = run(capsys, "topic", "route", "AdminT", "-n", ns)
    assert "queues on broker-a: read 3, write 3, perm 6" in out

    code, out, _ = run(capsys, "topic", "update", "AdminT", "-r", "4", "-w", "4", "-n", ns)
    assert code == 0 and "updated" in out
    status = run_json(capsys, "topic", "status", "AdminT", "-n", ns)
    assert [r["queueId"] for r in status] == [0, 1, 2, 3]
    assert all(r["maxOffset"] == 0 for r in status)

    code, out, _ = run(capsys, "topic", "delete", "AdminT", "-n", ns)
    assert code == 0 and "deleted" in out
    assert "AdminT" not in run_json(capsys, "topic", "list", "-n", ns)


def test_send_lookup_progress_reset_and_tail(ns, capsys):
    assert run(capsys, "topic", "create", "MsgT", "-r", "2", "-w", "2", "-n", ns)[0] == 0
    sent = run_json(capsys, "send", "MsgT", "hello admin", "--tags", "T1", "--keys", "order-7 x",
                    "-p", "color=blue", "-n", ns)
    assert sent["status"] == "SEND_OK"

    by_id = run_json(capsys, "message", "id", sent["offsetMsgId"], "-n", ns)
    assert by_id[0]["body"] == "hello admin" and by_id[0]["properties"]["color"] == "blue"
    by_uniq = run_json(capsys, "message", "id", sent["msgId"], "-t", "MsgT", "-n", ns)
    assert by_uniq[0]["msgId"] == sent["msgId"]
    code, out, _ = run(capsys, "message", "key", "MsgT", "order-7", "-n", ns)
    assert code == 0 and "hello admin" in out and "T1 / order-7 x" in out

    # A group that consumed nothing yet: lag = everything; after a reset to "now": no lag.
    code, out, err = run(capsys, "consumer", "reset", "CG_ADMIN", "MsgT", "--time", "0", "-n", ns)
    assert code == 0, err
    progress = run_json(capsys, "consumer", "progress", "CG_ADMIN", "-t", "MsgT", "-n", ns)
    assert progress["totalLag"] == 1
    reset = run_json(capsys, "consumer", "reset", "CG_ADMIN", "MsgT", "--time", "now", "-n", ns)
    assert sum(r["newOffset"] for r in reset["queues"]) == 1
    progress = run_json(capsys, "consumer", "progress", "CG_ADMIN", "-t", "MsgT", "-n", ns)
    assert progress["totalLag"] == 0
    code, out, _ = run(capsys, "consumer", "progress", "CG_ADMIN", "-t", "MsgT", "-n", ns)
    assert "CONSUMER OFFSET" in out and "total" in out

    code, out, err = run(capsys, "tail", "MsgT", "--from-beginning", "-c", "1", "-n", ns)
    assert code == 0, err
    assert code == 0 and "hello admin" in out and "[T1]" in out
    code, out, _ = run(capsys, "tail", "%LMQ%nothing", "-d", "0.5", "-n", ns)
    assert code == 0 and out == ""


@pytest.mark.parametrize("argv,needle", [
    (["topic", "route", "NoSuchTopic"], "no route info for topic 'NoSuchTopic'"),
    (["topic", "status", "NoSuchTopic"], "no route info"),
    (["topic", "create", "bad topic!"], "illegal characters"),
    (["message", "id", "nothex"], "not an offset message id"),
    (["message", "key", "NoSuchTopic", "k"], "no route info"),
    (["topic", "delete", "NoSuchTopic"], "no route info"),
])
def test_errors_are_one_line_with_nonzero_exit(ns, capsys, argv, needle):
    code, out, err = run(capsys, *argv, "-n", ns)
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and err.startswith("lmq admin: error: ") and needle in err


def test_bad_arguments_exit_2(ns, capsys):
    code, _, err = run(capsys, "consumer", "reset", "G", "T", "--time", "soon", "-n", ns)
    assert code == 2 and err.count("\n") == 1 and "cannot read time" in err
    code, _, err = run(capsys, "topic", "list", "-n", "no-port")
    assert code == 2 and "bad name server address" in err
    with pytest.raises(SystemExit) as exc:
        main(["admin", "topic", "create"])
    assert exc.value.code == 2


def test_unreachable_name_server_via_the_real_entry_point():
    proc = subprocess.run([sys.executable, "-m", "lmq", "admin", "topic", "list", "-n", "127.0.0.1:1",
                           "--timeout", "1"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "no name server reachable" in proc.stderr
