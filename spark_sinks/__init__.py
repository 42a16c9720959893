"""Spark connector for lmq: ``spark.read/readStream.format("lmq")`` and
``df.write/writeStream.format("lmq")`` on PySpark 4's Python Data Source API.

    from spark_sinks import register
    register(spark)                      # = spark.dataSource.register(LmqDataSource)
    df = spark.readStream.format("lmq").option("lmq.namesrv", "127.0.0.1:9876") \\
        .option("subscribe", "Orders").load()

See docs/spark.md for the options, the schema and the exactly-once sink.
"""

from __future__ import annotations

from pyspark.sql.datasource import DataSource
from pyspark.sql.types import StructType

from spark_sinks.options import (
    LmqDataLossError,
    LmqOptionError,
    include_headers,
    parse_source_options,
)
from spark_sinks.rows import schema_ddl

__all__ = ["LmqDataLossError", "LmqDataSource", "LmqOptionError", "register"]


class LmqDataSource(DataSource):
    """The ``lmq`` format (see the module docstring)."""

    @classmethod
    def name(cls) -> str:
        return "lmq"

    def schema(self) -> str:
        return schema_ddl(include_headers(self.options))

    def reader(self, schema: StructType):
        from spark_sinks.source import LmqBatchReader
        return LmqBatchReader(parse_source_options(self.options, streaming=False))

    def streamReader(self, schema: StructType):
        from spark_sinks.source import LmqStreamReader
        return LmqStreamReader(parse_source_options(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool):
        from spark_sinks.sink import LmqBatchWriter, parse_sink_options
        return LmqBatchWriter(parse_sink_options(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool):
        from spark_sinks.sink import LmqStreamWriter, parse_sink_options
        return LmqStreamWriter(parse_sink_options(self.options), schema)


def register(spark) -> None:
    """Make ``format("lmq")`` available in `spark` (once per session)."""
    spark.dataSource.register(LmqDataSource)
