"""A name server and broker with ACL on, on free ports, for the ACL tests."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from core.cluster import EmbeddedServer
from core.namesrv import NamesrvConfig
from tests.core.client.cluster import broker_config, free_port

ADMIN = ("lmqadmin", "admin-secret-1")
USER = ("producer1", "producer-secret")
GATEWAY = ("gateway1", "gateway-secret")

ACL_TOML = f"""
globalWhiteRemoteAddresses = []

[[accounts]]
accessKey = "{ADMIN[0]}"
secretKey = "{ADMIN[1]}"
admin = true

[[accounts]]
accessKey = "{USER[0]}"
secretKey = "{USER[1]}"
defaultTopicPerm = "DENY"
defaultGroupPerm = "SUB"
topicPerms = ["AclTopic=PUB|SUB", "SubOnly=SUB", "%LMQ%never=DENY"]
groupPerms = ["DeniedGroup=DENY"]

[[accounts]]
accessKey = "{GATEWAY[0]}"
secretKey = "{GATEWAY[1]}"
defaultTopicPerm = "PUB|SUB"
defaultGroupPerm = "PUB|SUB"
innerProperties = true
"""


@asynccontextmanager
async def acl_cluster(acl_text: str = ACL_TOML, services: list | None = None,
                      **broker_kw) -> AsyncIterator[EmbeddedServer]:
    """`lmq serve`'s name server and broker with ACL on; the broker registers with the
    admin account over TCP."""
    root = tempfile.mkdtemp(prefix="lmq-acl-test-")
    try:
        acl_file = os.path.join(root, "acl.toml")
        with open(acl_file, "w") as fh:
            fh.write(acl_text)
        kw = dict(acl_enable=True, acl_file=acl_file, namesrv_access_key=ADMIN[0],
                  namesrv_secret_key=ADMIN[1], auto_create_topic=True)
        kw.update(broker_kw)
        server = EmbeddedServer(
            broker_config(os.path.join(root, "data"), "broker-a", **kw),
            NamesrvConfig(host="127.0.0.1", port=free_port(), acl_enable=True,
                          acl_file=acl_file),
            services=services,
        )
        async with trio.open_nursery() as nursery:
            await nursery.start(server.serve)
            try:
                yield server
            finally:
                server.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
