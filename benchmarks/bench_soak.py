"""Soak: the pipeline job over many micro-batches of mixed changes, with state collection and compaction on.

    python -m pytest benchmarks/bench_soak.py -o python_files='bench_*.py'

``python -m spockwire.spark.job ... --master local[2]`` runs as a child process (benchmarks/bench_pipeline.py's
``Job``) on a table of SPOCKWIRE_BENCH_SOAK_ROWS rows (bench_pipeline's 7-column table ``t``), snapshot first. Then
SPOCKWIRE_BENCH_SOAK_BATCHES times one transaction of SPOCKWIRE_BENCH_SOAK_CHANGES changes (60% updates and 20%
deletes of keys spread over the table, 20% inserts of new keys; every SPOCKWIRE_BENCH_SOAK_TRUNCATE_EVERY-th a
TRUNCATE and the table filled again with new keys), each waited for: one micro-batch per transaction. The job's
maintenance is on: OPTIMIZE (Z-order by the key) every SPOCKWIRE_BENCH_SOAK_OPTIMIZE_EVERY micro-batches and at
SPOCKWIRE_BENCH_SOAK_SMALL_FILES small files, state collection with it, VACUUM at the job's default retention.

Recorded per micro-batch, from the job's JSON line (benchmarks/results/soak.json, or SPOCKWIRE_BENCH_SOAK_OUT): its
apply seconds (the batch's own ``seconds``: reading the micro-batch, resolving, the Delta commits and the
maintenance step), the maintenance step's seconds, the table's data files, the state's files and rows after the
step. Asserted: the median of the last 50 batches within 1.5x the median of batches 50-100 (with fewer than 500
batches: the last tenth against the second tenth), the files and state rows bounded (the files at most the small-file
threshold or their maximum over batches 50-100, the state rows at most the deletes of the batches between two
collections), and at the end the Delta table equal to the source table.
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import statistics
import time
from typing import Any

import pytest

from benchmarks.bench_pipeline import ROWS_SQL, TABLE_SQL, Job, check_equal

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _env(name: str, default: str) -> str:
    return os.environ.get("SPOCKWIRE_BENCH_SOAK_" + name, default)


ROWS = int(_env("ROWS", "50000"))
BATCHES = int(_env("BATCHES", "500"))
CHANGES = int(_env("CHANGES", "1000"))
TRUNCATE_EVERY = int(_env("TRUNCATE_EVERY", "100"))
OPTIMIZE_EVERY = int(_env("OPTIMIZE_EVERY", "50"))
SMALL_FILES = int(_env("SMALL_FILES", "32"))
MASTER = _env("MASTER", "local[2]")
OUT = _env("OUT", str(ROOT / "benchmarks" / "results" / "soak.json"))
BATCH_TIMEOUT = float(_env("BATCH_TIMEOUT", "300"))
pytestmark = pytest.mark.timeout(int(_env("TIMEOUT", "14400")))

#: one micro-batch's transaction: `changes` changes on `tbl` (60% updates and 20% deletes of keys picked by a hash of
#: the batch number, 20% inserts of new keys from the sequence <tbl>_ids), or a TRUNCATE and `refill` new rows
SOAK_SQL = """
CREATE SEQUENCE IF NOT EXISTS {name}_ids START {start};
CREATE OR REPLACE FUNCTION soak_batch(tbl regclass, k bigint, changes int, truncate bool, refill int)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE ids text := tbl::text || '_ids';
BEGIN
  IF truncate THEN
    EXECUTE format('TRUNCATE %s', tbl);
    EXECUTE format('INSERT INTO %s SELECT i, i %% 1000, i / 100.0, ''refill '' || $1, now(), true, i / 3.0 '
                   'FROM (SELECT nextval(%L) i FROM generate_series(1, $2)) s', tbl, ids) USING k, refill;
    RETURN;
  END IF;
  EXECUTE format('UPDATE %s SET b = b + 1, c = c + 0.01, d = ''update '' || $1, e = e + interval ''1 second'', '
                 'f = NOT f, g = g * 1.5 WHERE id IN (SELECT id FROM %s ORDER BY md5(id::text || $1) LIMIT $2)',
                 tbl, tbl) USING k, changes * 3 / 5;
  EXECUTE format('DELETE FROM %s WHERE id IN (SELECT id FROM %s ORDER BY md5(id::text || ''d'' || $1) LIMIT $2)',
                 tbl, tbl) USING k, changes / 5;
  EXECUTE format('INSERT INTO %s SELECT i, i %% 1000, i / 100.0, ''insert '' || $1, now(), true, i / 3.0 '
                 'FROM (SELECT nextval(%L) i FROM generate_series(1, $2)) s', tbl, ids) USING k, changes / 5;
END $$;
"""


def soak_setup(execute: Any, name: str, rows: int) -> None:
    """The soak's table `name` (bench_pipeline's shape, `rows` rows) and its transaction function."""
    execute(TABLE_SQL.format(name=name))
    execute(ROWS_SQL.format(name=name, rows=rows))
    execute(SOAK_SQL.format(name=name, start=rows + 1))


def soak_batch(execute: Any, name: str, k: int, changes: int, truncate: bool, refill: int) -> None:
    execute(f"SELECT soak_batch('{name}', {int(k)}, {int(changes)}, {bool(truncate)}, {int(refill)})")


class _Work:
    """What bench_pipeline's Job needs of its pipeline: the work folder and the DSN."""

    def __init__(self, work: str, dsn: str) -> None:
        self.work, self.dsn = work, dsn


def summary(batches: list[dict], window: int = 50) -> dict:
    """Medians of the apply seconds over batches `window`-2 `window` and the last `window`, and the maxima of files
    and state rows."""
    def med(part: list[dict], key: str = "seconds") -> float | None:
        vals = [b[key] for b in part if b.get(key) is not None]
        return round(statistics.median(vals), 3) if vals else None

    early, late = batches[window:2 * window], batches[-window:]
    out = {"batches": len(batches), "window": window, "median_s_early": med(early), "median_s_last": med(late),
           "median_maintenance_s_early": med(early, "maintenance_s"),
           "median_maintenance_s_last": med(late, "maintenance_s")}
    for key in ("files", "state_files", "state_rows"):
        out[f"max_{key}"] = max((b[key] for b in batches if b.get(key) is not None), default=None)
        out[f"max_{key}_early"] = max((b[key] for b in early if b.get(key) is not None), default=None)
        out[f"max_{key}_last"] = max((b[key] for b in late if b.get(key) is not None), default=None)
    out["optimized"] = sum(1 for b in batches if b.get("optimized"))
    out["state_collected"] = sum(b.get("state_collected") or 0 for b in batches)
    return out


@pytest.mark.benchmark(group="soak")
def test_soak(benchmark, tmp_path_factory):
    from spockwire.testing import PostgresCluster

    window = min(50, BATCHES // 10)
    assert window >= 2, "the flatness check compares the second tenth of the batches with the last: 20 or more"
    work = str(tmp_path_factory.mktemp("soak"))
    load = [os.getloadavg()]
    with PostgresCluster({"shared_buffers": "256MB", "max_wal_size": "4GB"}, major=15) as pg:
        db = pg.create_database("bench_soak")
        soak_setup(lambda sql: pg.execute(sql, dbname=db), "t", ROWS)
        pg.execute("CREATE PUBLICATION pub FOR TABLE t", dbname=db)
        job = Job(_Work(work, pg.dsn(dbname=db)), "soak", "t", slot="s_soak", until_caught_up=False,
                  extra=("--optimize-every", str(OPTIMIZE_EVERY), "--optimize-small-files", str(SMALL_FILES)))
        batches: list[dict] = []

        def run() -> None:
            job.start()
            try:
                # the snapshot: every row in, then one micro-batch per transaction
                seen = 0
                got = 0
                while got < ROWS:
                    seen, _t, rec = job.wait_line(lambda r: "batch" in r, seen, BATCH_TIMEOUT)
                    seen += 1
                    got += int(rec.get("snapshot_rows", 0))
                for k in range(BATCHES):
                    truncate = TRUNCATE_EVERY > 0 and k % TRUNCATE_EVERY == TRUNCATE_EVERY - 1
                    t0 = time.time()
                    soak_batch(lambda sql: pg.execute(sql, dbname=db), "t", k, CHANGES, truncate, ROWS)
                    i, at, rec = job.wait_line(lambda r: "batch" in r and sum(r.get("rows", {}).values()), seen,
                                               BATCH_TIMEOUT)
                    seen = i + 1
                    m = (rec.get("maintenance") or {}).get("public.t", {})
                    batches.append({"batch": rec["batch"], "k": k, "truncate": truncate,
                                    "rows": sum(rec["rows"].values()), "seconds": rec.get("seconds"),
                                    "read_seconds": rec.get("read_seconds"), "maintenance_s": m.get("seconds"),
                                    "files": m.get("files"), "state_files": m.get("state_files"),
                                    "state_rows": m.get("state_rows"), "optimized": m.get("optimized"),
                                    "state_collected": m.get("state_collected"),
                                    "commit_to_line_s": round(at - t0, 3)})
                    if k % 50 == 49:
                        load.append(os.getloadavg())
            finally:
                job.interrupt()

        benchmark.pedantic(run, rounds=1, iterations=1)
        final_rows = check_equal(pg.dsn(dbname=db), "t", job.path())
        disk_files = sum(len(f) for _r, _d, f in os.walk(job.path()))
        result = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rows": ROWS, "changes": CHANGES,
                  "truncate_every": TRUNCATE_EVERY, "optimize_every": OPTIMIZE_EVERY, "small_files": SMALL_FILES,
                  "master": MASTER, "loadavg": [[round(x, 2) for x in la] for la in load],
                  "final_rows": final_rows, "files_on_disk": disk_files, "summary": summary(batches, window),
                  "batches": batches}
        os.makedirs(os.path.dirname(OUT), exist_ok=True)
        with open(OUT, "w") as fh:
            json.dump(result, fh, indent=1)
        benchmark.extra_info.update({"soak": {k: v for k, v in result.items() if k != "batches"}})
        print("\nsoak:", json.dumps(result["summary"]))
        if not os.environ.get("SPOCKWIRE_BENCH_SOAK_KEEP"):
            shutil.rmtree(work, ignore_errors=True)
    s = result["summary"]
    assert s["median_s_last"] <= 1.5 * s["median_s_early"], s
    bound = SMALL_FILES + 1
    assert s["max_files_last"] <= max(s["max_files_early"], bound), s
    assert s["max_state_files_last"] <= max(s["max_state_files_early"], bound), s
    # the state holds at most the deletes (and truncates) of the micro-batches since its last collection
    every = min(n for n in (OPTIMIZE_EVERY, SMALL_FILES, BATCHES) if n > 0)
    assert s["max_state_rows"] <= (every + 1) * (CHANGES // 5 + 1) + 1, s
