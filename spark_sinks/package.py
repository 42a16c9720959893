"""A zip of this project's Python code for Spark executors (docs/spark.md, "On a cluster").

    python -m spark_sinks.package lmq-spark.zip
    spark-submit --master spark://host:7077 --py-files lmq-spark.zip my_job.py

The zip holds the packages the connector imports on executors (`core`, `gateway`,
`spark_sinks`), Python files only: the store's optional C speedups are not needed by the
connector's client side (it falls back to their Python versions). Third-party dependencies
(trio, pyarrow, msgpack...) are not in it: install them on the nodes, or ship a packed
environment (see docs/spark.md).
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

PACKAGES = ("core", "gateway", "spark_sinks")
_ROOT = Path(__file__).resolve().parents[1]


def build_zip(dest: str | Path) -> Path:
    """Write the zip to `dest`; returns its path."""
    dest = Path(dest)
    with zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as zf:
        for pkg in PACKAGES:
            for path in sorted((_ROOT / pkg).rglob("*.py")):
                if "__pycache__" not in path.parts:
                    zf.write(path, path.relative_to(_ROOT).as_posix())
    return dest


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m spark_sinks.package OUT.zip")
    print(build_zip(sys.argv[1]))
