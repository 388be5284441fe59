"""spockwire on Spark: a streaming/batch data source over a replication slot, the Parquet staging as a
DataFrame, `apply_changes` to Delta/Parquet/in-memory tables, and distributed decoding of frame files.

The names below other than `register` are imported when first used (PySpark is imported only then)."""
from typing import Any

from .apply import ApplyMetrics as ApplyMetrics, apply_changes as apply_changes, \
    apply_to_dataframe as apply_to_dataframe, select_table as select_table
from .distributed import decode_frame_file as decode_frame_file
from .resolve import scd2_columns as scd2_columns
from .staging import read_staging as read_staging, read_staging_stream as read_staging_stream

__all__: list[str]


def register(spark: Any) -> None:
    """Register the ``spockwire`` and ``spockwire_staging`` data sources with a SparkSession."""
