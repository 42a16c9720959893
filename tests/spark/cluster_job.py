"""A Spark driver program on a multi-process cluster (`local-cluster[2,1,1024]`: two
executor JVMs), with this project shipped to the executors as a zip (spark.submit.pyFiles)
rather than found on their path. Copies topic IN to topic OUT through format("lmq") and
prints one JSON line: rows written and where the executors imported spark_sinks from.

    python tests/spark/cluster_job.py NAMESRV ZIP IN OUT
"""

from __future__ import annotations

import json
import sys


def main(namesrv: str, zip_path: str, src: str, out: str) -> None:
    sys.path.insert(0, zip_path)            # the driver imports the shipped copy too
    from pyspark.sql import SparkSession

    from spark_sinks import register

    spark = (SparkSession.builder.master("local-cluster[2,1,1024]").appName("lmq-cluster")
             .config("spark.submit.pyFiles", zip_path)
             .config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)

    def where(_rows):
        import os

        import spark_sinks
        yield (spark_sinks.__file__, os.getpid())

    seen = spark.sparkContext.parallelize(range(4), 4).mapPartitions(where).collect()
    df = spark.read.format("lmq").option("lmq.namesrv", namesrv).option("subscribe", src).load()
    df.select("key", "value").repartition(2).write.format("lmq").option("lmq.namesrv", namesrv) \
        .option("topic", out).mode("append").save()
    back = spark.read.format("lmq").option("lmq.namesrv", namesrv).option("subscribe", out) \
        .load().select("value").collect()
    print(json.dumps({"written": sorted(r.value.decode() for r in back),
                      "executor_files": sorted({f for f, _ in seen}),
                      "executor_pids": len({p for _, p in seen})}))
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:5])
