"""The ceilings of `lmq bench spark`: a synthetic in-memory Python data source with the lmq
source's schema, and a Python writer that drops its rows (format ``lmqbench_synth``).

The reader yields, per partition, Arrow record batches of 32 rows (one pull's worth), built
once in memory: generating the data costs nothing, so its rate is what Spark itself costs a
Python source on this machine. The writer takes its rows as Arrow record batches (as the
lmq sink does) and keeps nothing.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    InputPartition,
    WriterCommitMessage,
)

ROWS_PER_BATCH = 32


@dataclass(frozen=True)
class _Part(InputPartition):
    index: int
    rows: int


def _template(rows: int, size: int, index: int):
    import pyarrow as pa

    from spark_sinks.rows import ARROW_SCHEMA

    ms = 1_700_000_000_000
    ts = pa.array([ms * 1000] * rows, pa.int64()).cast(pa.timestamp("us", tz="UTC"))
    cols = [pa.array([f"k{i}" for i in range(rows)]), pa.array([os.urandom(size)] * rows),
            pa.array(["BenchSynth"] * rows), pa.array([index] * rows, pa.int32()),
            pa.array(range(rows), pa.int64()), pa.array(["broker-a"] * rows), ts, ts,
            pa.array(["t"] * rows), pa.array([f"{i:032X}" for i in range(rows)]),
            pa.array([[("UNIQ_KEY", f"{i:032X}"), ("KEYS", f"k{i}")] for i in range(rows)],
                     pa.map_(pa.string(), pa.string())),
            pa.nulls(rows, pa.string()), pa.nulls(rows, pa.int32()), pa.nulls(rows, pa.bool_())]
    return pa.RecordBatch.from_arrays(cols, schema=ARROW_SCHEMA)


class _Reader(DataSourceReader):
    def __init__(self, rows: int, partitions: int, size: int) -> None:
        self.rows, self.nparts, self.size = rows, partitions, size

    def partitions(self) -> list[_Part]:
        per, extra = divmod(self.rows, self.nparts)
        return [_Part(i, per + (i < extra)) for i in range(self.nparts)]

    def read(self, partition: _Part) -> Iterator:
        full = _template(ROWS_PER_BATCH, self.size, partition.index)
        left = partition.rows
        while left > 0:
            n = min(left, ROWS_PER_BATCH)
            yield full if n == ROWS_PER_BATCH else full.slice(0, n)
            left -= n


@dataclass
class _Done(WriterCommitMessage):
    rows: int


class _Writer(DataSourceArrowWriter):
    """Takes the Arrow record batches Spark hands a Python writer (as the lmq sink does)
    and drops them."""

    def write(self, iterator) -> _Done:
        n = 0
        for rb in iterator:
            n += rb.num_rows
        return _Done(n)

    def commit(self, messages) -> None:
        return None

    def abort(self, messages) -> None:
        return None


class SynthSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "lmqbench_synth"

    def schema(self) -> str:
        from spark_sinks.rows import SOURCE_SCHEMA_DDL
        return SOURCE_SCHEMA_DDL

    def reader(self, schema) -> _Reader:
        o = self.options
        return _Reader(int(o.get("rows", "1000")), int(o.get("partitions", "2")),
                       int(o.get("size", "256")))

    def writer(self, schema, overwrite: bool) -> _Writer:
        return _Writer()
