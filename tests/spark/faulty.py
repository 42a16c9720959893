"""An `lmq` sink whose driver commit fails once while the marker file
`<checkpointLocation>.fail-next-commit` exists: the in-process stand-in for a driver crash
between the tasks' writes and the commit."""

from __future__ import annotations

import os

from spark_sinks import LmqDataSource
from spark_sinks.sink import LmqStreamWriter, parse_sink_options


def marker_for(checkpoint: str) -> str:
    return checkpoint + ".fail-next-commit"


class FaultyStreamWriter(LmqStreamWriter):
    def commit(self, messages, batchId: int) -> None:
        marker = marker_for(self.opts.checkpoint or "")
        if os.path.exists(marker):
            os.unlink(marker)
            raise RuntimeError(f"injected failure before committing batch {batchId}")
        super().commit(messages, batchId)


class FaultyLmqDataSource(LmqDataSource):
    @classmethod
    def name(cls) -> str:
        return "lmq_faulty"

    def streamWriter(self, schema, overwrite):
        return FaultyStreamWriter(parse_sink_options(self.options), schema)
