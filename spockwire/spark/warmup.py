"""Starting Spark's planning processes for the ``spockwire`` source while the job's session starts.

Spark plans a query that reads a Python data source in Python processes of its own, one kind per step: finding
the data sources installed, creating the source (its schema), planning its read. It starts each kind's daemon
(a fresh interpreter that imports pyspark) when a query first needs it, one after the other, and the read is
planned only when the first micro-batch is: on 2 cores, about 0.6-0.7 s per daemon, and another
0.4 s for the planning worker to import the stream reader's modules (pyarrow, the decoder), all of it on the
first micro-batch's path.

:func:`start_planning_warm_up` plans a read of a source that reads nothing (:class:`PlanningWarmUp`) in a thread
of the driver, beside the job's own start (its worker check, its query's start): Spark starts the three kinds
of planning process then, and keeps each one's worker idle for the query, which then finds them started and the
modules imported. Nothing of it reaches the server or a table.
"""
from __future__ import annotations

import logging
import threading
from typing import Any, Iterator

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from ..export.arrow import int64_sequence, repeated

__all__ = ["PlanningWarmUp", "start_apply_warm_up", "start_planning_warm_up"]

log = logging.getLogger("spockwire.pipeline")


class PlanningWarmUp(DataSource):
    """A source with no rows whose reader imports what the ``spockwire`` stream reader's planning imports."""

    @classmethod
    def name(cls) -> str:
        return "spockwire_planning_warm_up"

    def schema(self) -> str:
        return "warm_up int"

    def reader(self, schema: Any) -> "_NothingReader":
        return _NothingReader()


class _NothingReader(DataSourceReader):
    def __init__(self) -> None:
        # the modules the planning of a spockwire stream reader imports (SpockwireDataSource.streamReader)
        from . import source_reader  # noqa: F401

    def partitions(self) -> list[InputPartition]:
        return []

    def read(self, partition: InputPartition) -> Iterator[tuple]:
        return iter(())


def start_planning_warm_up(spark: Any) -> threading.Thread:
    """Plan a read of :class:`PlanningWarmUp` on `spark` (a classic session) in a daemon thread; the thread. Its
    failure is logged (at debug level) and changes nothing else: the query starts its planning processes itself
    then."""
    def plan() -> None:
        try:
            spark.dataSource.register(PlanningWarmUp)
            # the read is planned when its RDD's partitions are (no task runs)
            spark.read.format(PlanningWarmUp.name()).load()._jdf.queryExecution().toRdd().getNumPartitions()
        except Exception as exc:       # noqa: BLE001 - the query plans without it
            log.debug("the planning warm-up failed: %s", exc)

    thread = threading.Thread(target=plan, name="spockwire-planning-warm-up", daemon=True)
    thread.start()
    return thread


def start_apply_warm_up() -> threading.Thread:
    """Import what the driver's apply imports on its first use, and resolve two changes, in a daemon thread
    beside the JVM's start: the first micro-batch would otherwise pay for it (deltalake; pandas, which pyarrow's
    compute functions import when first given a Python value; numpy's lazily loaded modules): about 0.25 s on 2
    cores, measured on the resolution of the first batch. Its failure is logged (at debug level) and changes
    nothing else."""
    def warm() -> None:
        try:
            import pyarrow as pa

            from . import apply  # noqa: F401  (deltalake, delta_target, resolve)
            from .resolve import DEFAULT_SEQUENCE, Stored, make_plan, resolve

            changes = pa.table({"_change_type": repeated("update_postimage", 2, pa.string()),
                                "_commit_lsn": int64_sequence(10, 2), "_seq": int64_sequence(0, 2),
                                "_commit_ts": repeated(0, 2, pa.timestamp("us", tz="UTC")),
                                "id": int64_sequence(1, 2), "v": int64_sequence(5, 2)})
            stored = pa.table({"id": int64_sequence(1, 1), "v": int64_sequence(0, 1),
                               "_commit_lsn": int64_sequence(1, 1), "_seq": int64_sequence(0, 1)})
            plan = make_plan(changes.column_names, ["id"], DEFAULT_SEQUENCE, 1, ["id", "v"])
            resolve(changes, plan, Stored(rows=stored), ["id", "v"])
        except Exception as exc:       # noqa: BLE001 - the first batch imports it then
            log.debug("the apply warm-up failed: %s", exc)

    thread = threading.Thread(target=warm, name="spockwire-apply-warm-up", daemon=True)
    thread.start()
    return thread
