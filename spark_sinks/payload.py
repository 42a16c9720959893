"""Payload helpers: decode the binary ``value`` column into a struct by a schema.

    from spark_sinks.payload import from_msgpack, from_json
    schema = "device string, ts long, temperature double, humidity double, battery int"
    df.select(from_msgpack("value", schema).alias("r")).select("r.*")

``from_msgpack`` is an Arrow UDF: Spark hands each Python worker whole Arrow batches of
values and gets a struct array back, so there is no per-row UDF call. Each value must be
a msgpack map; fields are matched by name, missing fields are null and extra keys are
ignored. A value that is not msgpack, not a map, or whose fields do not fit the schema
gives a null struct (like ``from_json`` in its default PERMISSIVE mode), never a failed
task. ``from_json`` is Spark's own ``from_json`` on the value cast to a string.
"""

from __future__ import annotations

import msgpack
import pyarrow as pa
from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import DataType, StructType


def _schema(schema: str | StructType) -> StructType:
    if isinstance(schema, StructType):
        return schema
    parsed = DataType.fromDDL(schema)
    if not isinstance(parsed, StructType):
        raise ValueError(f"schema must be a struct, not {schema!r}")
    return parsed


def _unpack(raw: bytes | None):
    if raw is None:
        return None
    try:
        obj = msgpack.unpackb(raw, raw=False, timestamp=3)
    except Exception:  # malformed, truncated, extra bytes, bad UTF-8: a null row
        return None
    return obj if isinstance(obj, dict) else None


def decode_msgpack_array(values: pa.Array, arrow_type: pa.StructType) -> pa.Array:
    """A struct array of `arrow_type` from a binary array of msgpack maps (null where a
    value does not decode or does not fit)."""
    objs = [_unpack(v) for v in values.to_pylist()]
    try:
        return pa.array(objs, type=arrow_type)
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        pass
    out = []  # some value does not fit: find it (the slow path only runs on bad input)
    for obj in objs:
        try:
            pa.array([obj], type=arrow_type)
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            obj = None
        out.append(obj)
    return pa.array(out, type=arrow_type)


def from_msgpack(col: Column | str, schema: str | StructType) -> Column:
    """A struct column decoded from the msgpack maps in binary column `col` (module doc)."""
    from pyspark.sql.functions import arrow_udf
    from pyspark.sql.pandas.types import to_arrow_type

    struct = _schema(schema)
    arrow_type = to_arrow_type(struct)

    @arrow_udf(struct)
    def _decode(values: pa.Array) -> pa.Array:
        return decode_msgpack_array(values, arrow_type)

    return _decode(F.col(col) if isinstance(col, str) else col)


def from_json(col: Column | str, schema: str | StructType, **options: str) -> Column:
    """A struct column parsed from the JSON text in binary (UTF-8) or string column `col`."""
    c = F.col(col) if isinstance(col, str) else col
    return F.from_json(c.cast("string"), _schema(schema), options or None)


__all__ = ["decode_msgpack_array", "from_json", "from_msgpack"]
