"""An `lmq` sink whose driver commit misbehaves once while the marker file
`<checkpointLocation>.fail-next-commit` exists (its content says how):

* ``raise`` (or empty): the commit raises before doing anything — the in-process stand-in
  for a driver crash between the tasks' writes and the commit;
* ``hang-before``: it writes ``<marker>.reached`` and hangs before doing anything;
* ``hang-after-record``: it stores the batch's commit record, writes ``<marker>.reached``
  and hangs before ending the transactions;
* ``hang-after-commit``: it commits the batch, writes ``<marker>.reached`` and hangs, so
  Spark never writes the batch to its commit log.

The hanging modes let a test kill -9 the driver at exactly that point.
"""

from __future__ import annotations

import os
import time

from spark_sinks import LmqDataSource
from spark_sinks.conn import client_for
from spark_sinks.sink import LmqStreamWriter, _all_chunks, _producer, parse_sink_options
from spark_sinks.txn import write_record


def marker_for(checkpoint: str) -> str:
    return checkpoint + ".fail-next-commit"


def _hang(marker: str) -> None:
    with open(marker + ".reached", "w") as f:
        f.write("reached")
    while True:
        time.sleep(1)


class FaultyStreamWriter(LmqStreamWriter):
    def commit(self, messages, batchId: int) -> None:
        marker = marker_for(self.opts.checkpoint or "")
        if os.path.exists(marker):
            with open(marker) as f:
                mode = f.read().strip() or "raise"
            os.unlink(marker)
            if mode == "hang-before":
                _hang(marker)
            if mode == "hang-after-record":
                opts = self.opts
                client = client_for(opts.namesrv, opts.request_timeout)
                client.call(write_record, client.instance, _producer(opts).target,
                            opts.commit_topic, self.query, batchId, _all_chunks(messages))
                _hang(marker)
            if mode == "hang-after-commit":
                super().commit(messages, batchId)
                _hang(marker)
            raise RuntimeError(f"injected failure before committing batch {batchId}")
        super().commit(messages, batchId)


class FaultyLmqDataSource(LmqDataSource):
    @classmethod
    def name(cls) -> str:
        return "lmq_faulty"

    def streamWriter(self, schema, overwrite):
        return FaultyStreamWriter(parse_sink_options(self.options), schema)
