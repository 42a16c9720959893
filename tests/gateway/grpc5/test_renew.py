"""Auto-renew: a push consumer's message stays invisible while its listener works longer
than the invisible duration, and its ack (with the handle it was given) still counts."""

from __future__ import annotations

import pytest

from gateway.grpc5.config import GrpcConfig
from tests.gateway.grpc5.harness import GrpcCluster, drive, finish_driver, start_driver


@pytest.mark.slow  # ~17 s: a listener outlasting the invisible time, twice
def test_push_consumer_messages_are_renewed_while_the_listener_works(rmq5_python, tmp_path):
    config = GrpcConfig(port=0, auto_renew_invisible_s=2.0)
    with GrpcCluster(tmp_path, grpc=config) as c:
        c.create_topic("T_renew")
        drive(rmq5_python, endpoint=c.endpoint, op="simple", topic="T_renew",
              group="G_renew", want=0, await_s=1, then_empty=True)
        proc = start_driver(rmq5_python, endpoint=c.endpoint, op="push", topic="T_renew",
                            group="G_renew", want=1, sleep_s=5, deadline_s=20,
                            linger_s=4)
        try:
            assert '"ready"' in proc.stdout.readline()
            drive(rmq5_python, endpoint=c.endpoint, op="produce", topic="T_renew",
                  bodies=["slow"])
            got = finish_driver(proc)
        finally:
            proc.kill()
        # 5 s of work against 2 s of invisibility: renewed, never redelivered.
        assert [(m["body"], m["attempt"]) for m in got["messages"]] == [("slow", 1)]
        # ...and the ack with the first handle took: nothing is left to renew or receive.
        assert len(c.service.server.servicer.backend.renewer) == 0
        again = drive(rmq5_python, endpoint=c.endpoint, op="simple", topic="T_renew",
                      group="G_renew", want=0, await_s=1, then_empty=True)
        assert again["events"] == ["extra:0"]
