"""A Spark driver program for the crash tests: copies topic IN to topic OUT through the lmq
source and the (fault-injecting) lmq sink, Trigger.AvailableNow, then exits 0.

    python -m tests.spark.driver_job NAMESRV IN OUT CHECKPOINT MAX_PER_TRIGGER
"""

from __future__ import annotations

import sys


def main(namesrv: str, src: str, out: str, checkpoint: str, per_trigger: str) -> None:
    from tests.spark.conftest import make_spark
    from tests.spark.faulty import FaultyLmqDataSource

    spark = make_spark("lmq-crash-driver", master="local[1]")
    spark.dataSource.register(FaultyLmqDataSource)
    df = (spark.readStream.format("lmq").option("lmq.namesrv", namesrv)
          .option("subscribe", src).option("startingOffsets", "earliest")
          .option("maxOffsetsPerTrigger", per_trigger).load())
    q = (df.selectExpr("value", "key").writeStream.format("lmq_faulty")
         .option("lmq.namesrv", namesrv).option("topic", out)
         .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    q.awaitTermination()
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:6])
