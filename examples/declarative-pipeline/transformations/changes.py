"""spockwire as the source of a declarative pipeline: one slot's changes of several tables, starting with the
tables' rows (a snapshot), applied to one Delta table per source table by the spockwire_apply sink
(spockwire.spark.apply_changes on each micro-batch: SCD type 1, plus an SCD type 2 history table)."""
from pyspark import pipelines as dp

import spockwire.spark as sws

sws.register(spark)  # noqa: F821 - `spark` is the pipeline's session, given to every definitions file

conf = spark.conf  # noqa: F821
tables = dict(item.split("=", 1) for item in conf.get("spockwire.tables").split(";") if item.strip())

dp.create_sink("lake", format="spockwire_apply",
               options={"path": conf.get("spockwire.target"), "history": "true",
                        **{f"keys.{table}": keys for table, keys in tables.items()}})


@dp.append_flow(target="lake")
def changes():
    return (spark.readStream.format("spockwire")  # noqa: F821
            .option("dsn", conf.get("spockwire.dsn"))
            .option("slot", conf.get("spockwire.slot"))
            .option("publication", conf.get("spockwire.publication"))
            .option("tables", ",".join(tables))
            .option("startingPosition", "snapshot")   # the tables' rows first, then their changes
            .load())
