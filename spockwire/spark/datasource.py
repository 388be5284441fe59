"""The ``spockwire`` Spark data source: changes of a logical replication slot, batch and streaming.

    spockwire.spark.register(spark)
    df = (spark.readStream.format("spockwire")
          .option("dsn", "host=db dbname=shop user=cdc").option("slot", "orders_cdc")
          .option("plugin", "pgoutput").option("publication", "orders_pub")
          .option("table", "public.orders").load())

Offsets are LSNs (``{"lsn": "16/B374D848"}``). A micro-batch holds the transactions committed in
``[start, end)``; its single partition peeks the slot up to `end` with ``pg_logical_slot_peek_binary_changes``
(replayable: nothing moves), decodes on the executor and yields Arrow record batches. Once Spark has committed a
batch to the checkpoint, the slot is advanced with ``pg_replication_slot_advance``. The planning peeks only a
small window at the batch's start (`slot.plan_end`), so the server decodes each range about once; see
docs/spark-internals.md, "How a micro-batch is planned".

Options (all strings, as Spark passes them):

| option | meaning |
|---|---|
| dsn | libpq connection string, reachable from the driver and the executors (required); without a password |
| password | the password (Spark redacts this option in plans, the UI and event logs); or PGPASSFILE / PGPASSWORD |
| slot | logical replication slot (required) |
| plugin | pgoutput (default), pglogical_output / pglogical, spock_output / spock |
| publication | pgoutput publication name(s), comma-separated |
| replicationSets | pglogical/spock replication sets, comma-separated (default: ``default``) |
| table / tables | one table (``schema.name``) / several tables, comma-separated (multi-table layout) |
| binary | true: ask the plugin for the types' binary send format (default false) |
| protoVersion | pgoutput protocol version (default: the server's highest) |
| types | auto (default: typed values when the decoder has them) / typed / raw |
| createSlot | true: create the slot when it does not exist (default false) |
| failoverSlot | streaming: true: make the slot a failover slot (PostgreSQL 17+: created so, or switched over) |
| requireFailoverSafety | streaming, with failoverSlot: fail while no standby would hold the slot after a failover (default: a warning) |
| maxChangesPerBatch | streaming: about this many plugin messages per micro-batch, estimated from a sample at its start |
| maxWalBytesPerBatch | streaming: at most this many bytes of WAL per micro-batch (with maxChangesPerBatch: the smaller) |
| idleAdvanceBytes | streaming: move the slot over this much WAL without output for the tables (default 16 MiB) |
| idleAdvanceSeconds | streaming: ... or over any WAL without output found by this many seconds of plannings (default 10) |
| onDivergence | streaming: ``repair`` (default: a snapshot reads the tables again) or ``stop``, when a promoted standby never had changes already read |
| splitWalBytes | a range over at least this much WAL is read as two partitions side by side (default 16 MiB; 0: never) |
| startingLsn / endingLsn | batch reads: the range (default: the slot's position / the server's flush LSN) |
| startingPosition | streaming: ``slot`` (default, the slot's position) or ``snapshot`` (rows first: snapshot.py) |
| snapshotChunkPages | snapshot: table pages per Spark task (default 4096) |
| snapshotChunksPerBatch | snapshot: tasks per micro-batch (default 8) |
| snapshotTaskSlots | snapshot: the task slots the micro-batches run on (the pipeline job: Spark's default parallelism); a table is cut into a multiple of them, of equal size (default 1) |
| pluginOption.NAME | any extra output-plugin option, passed as is |
| stagingPath | a folder: each task writes its changes there as Arrow files, one per table and shape (a table described again with other columns starts a new file), and the DataFrame holds one row per file (see batch_files.py; the pipeline job reads them), so the rows never pass through the JVM |
| allTables | `true` (with stagingPath): every table the stream sends is read, those `tables` names and any other (a table added to the publication later) |
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource

from .manifest import MANIFEST_SCHEMA
from .source_options import STARTING_POSITIONS, options_to_spec, staging_path

if TYPE_CHECKING:
    from .slot import SlotSpec
    from .source_reader import SpockwireBatchReader, SpockwireStreamReader

# Spark's planning processes import this module to create the source and read its schema: it loads neither pyarrow
# nor the decoder (source_reader.py does, which the readers come from)

__all__ = ["SpockwireDataSource", "options_to_spec", "STARTING_POSITIONS"]


class SpockwireDataSource(DataSource):
    """``spark.read/readStream.format("spockwire")``: changes of one slot for one or more tables."""

    @classmethod
    def name(cls) -> str:
        return "spockwire"

    def _spec(self) -> SlotSpec:
        return options_to_spec(self.options)

    def schema(self) -> Any:
        if staging_path(self.options):
            return MANIFEST_SCHEMA
        from .source_reader import data_schema

        return data_schema(self._spec(), self.options)

    def reader(self, schema: Any) -> "SpockwireBatchReader":
        from .source_reader import SpockwireBatchReader, data_schema

        spec = self._spec()
        return SpockwireBatchReader(spec, data_schema(spec, self.options) if staging_path(self.options) else schema,
                                    self.options)

    def streamReader(self, schema: Any) -> "SpockwireStreamReader":
        from .source_reader import SpockwireStreamReader, data_schema

        spec = self._spec()
        return SpockwireStreamReader(spec, data_schema(spec, self.options) if staging_path(self.options) else schema,
                                     self.options)
