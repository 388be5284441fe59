"""spockwire on Spark: a streaming/batch data source over a replication slot, the Parquet staging as a
DataFrame, `apply_changes` to Delta/Parquet/in-memory tables, and distributed decoding of frame files.

    import spockwire.spark as sws
    sws.register(spark)                     # spark.readStream.format("spockwire") ...
    changes = sws.read_staging(spark, "staging/", "public.orders")
    sws.apply_changes(changes, target="/data/orders", format="delta", keys=["id"])   # stored_as_scd_type=1|2
    df = sws.decode_frame_file(spark, "capture.spwf", table="public.orders")
    events = sws.autocdc_changes(changes, keys=["id"])   # for create_auto_cdc_flow (AUTO CDC)
    sws.collect_state("/data/orders", before=(lsn, seq))   # no change before (lsn, seq) can arrive any more

See docs/spark.md.
"""
from __future__ import annotations

from typing import Any

__all__ = ["register", "apply_changes", "apply_to_dataframe", "decode_frame_file", "read_staging",
           "read_staging_stream", "select_table", "scd2_columns", "ApplyMetrics", "autocdc_changes", "CHANGE_COLUMNS",
           "collect_state", "first_position"]


def register(spark: Any, *, check_workers: bool = True) -> None:
    """Register the ``spockwire`` and ``spockwire_staging`` data sources and the ``spockwire_apply`` streaming sink
    with a SparkSession (a Spark Connect session too).

    First, unless `check_workers` is False or the session is a Spark Connect client's, one tiny Python task checks
    that Spark's Python workers import this spockwire and what it needs there (numpy, pyarrow, psycopg2, the
    compiled decoder): if they cannot, or import another version, :class:`~spockwire.errors.SparkEnvironmentError`
    says so in one line that names the worker interpreter and the fix (``PYSPARK_PYTHON``). The check runs once
    per Spark application."""
    from .environment import is_connect
    from .datasource import SpockwireDataSource
    from .environment import check_workers as check
    from .sink import ApplySink
    from .staging import StagingDataSource

    if check_workers and not is_connect(spark):
        check(spark)

    spark.dataSource.register(SpockwireDataSource)
    spark.dataSource.register(StagingDataSource)
    spark.dataSource.register(ApplySink)


def __getattr__(name: str) -> Any:
    if name in ("apply_changes", "apply_to_dataframe", "select_table", "scd2_columns", "ApplyMetrics"):
        from . import apply
        return getattr(apply, name)
    if name == "autocdc_changes":
        from .autocdc import autocdc_changes
        return autocdc_changes
    if name == "CHANGE_COLUMNS":
        from .schema import CHANGE_COLUMNS
        return CHANGE_COLUMNS
    if name == "collect_state":
        from .maintenance import collect_state
        return collect_state
    if name == "first_position":
        from .resolve import first_position
        return first_position
    if name == "decode_frame_file":
        from .distributed import decode_frame_file
        return decode_frame_file
    if name in ("read_staging", "read_staging_stream"):
        from . import staging
        return getattr(staging, name)
    raise AttributeError(name)
