#!/usr/bin/env bash
# Run every benchmark, write BENCHMARKS.md and the charts (benchmarks are not part of the test command):
#
#   scripts/bench.sh [PYTEST ARGS...]
#
# Builds the extension in place, captures the workloads on first use (cached under out/bench-cache/), runs
# benchmarks/bench_*.py with pytest-benchmark into out/bench.json and keeps the run in benchmarks/results/
# (benchmarks/runs.py: a full run as bench_run.json, the pipeline's measurements as pipeline_run.json, the
# many-tables benchmark's as many_tables_run.json, the hot-keys benchmark's as hot_keys.json); then
# benchmarks/report.py writes BENCHMARKS.md and benchmarks/charts.py the SVG charts in docs/images/, both from the
# kept runs (a run of some benchmarks only, with PYTEST ARGS, updates only what it holds: the pipeline, e.g.
# `scripts/bench.sh -k bench_pipeline` -- a path among the ARGS adds to benchmarks/ instead of narrowing it; a run
# at other sizes than the defaults, e.g. SPOCKWIRE_BENCH_SCALE=0.05, is not kept).
# bench_connection.py is skipped because bench_e2e.py runs its tests on its own slot, next to the no-op callback.
#
# Every peer is required: a missing one stops the run with a non-zero exit before anything is measured (and a peer
# that fails during the run fails its benchmark, so no BENCHMARKS.md with a dropped column is written). Peers: the
# packages of scripts/setup-machine.sh (adbc-driver-postgresql, adbc-driver-manager, connectorx, pypgoutput,
# orjson; the Python >= 3.12 interpreter out/peer312 with pgoutput-decoder, made here if missing), `node` and `npm`
# (the npm package is installed into out/node once) and pg_recvlogical (PostgreSQL 15's and the embedded 18's).
# Every figure in BENCHMARKS.md is the median of its rounds (benchmarks/report.py).
# Environment:
#   PYTHON=python3                 interpreter
#   SPOCKWIRE_BENCH_SCALE=1        multiplies the captured workloads' row counts (0.05 for a quick look)
#   SPOCKWIRE_BENCH_WORKLOADS=     comma-separated decode-only workloads to run (default: all six), e.g. toast,wide
#   SPOCKWIRE_BENCH_ROWS=1000000   rows of the end-to-end workload
#   SPOCKWIRE_BENCH_SNAPSHOT_ROWS=1000000   rows of the table bench_snapshot.py reads (read_table vs ADBC, connectorx)
#   The Spark pipeline into Delta (benchmarks/bench_pipeline.py: python -m spockwire.spark.job on local[2] as a child
#   process, started 15 times; at the defaults about 15-20 minutes on two cores for a job that meets its targets, most
#   of it the job's own starts and stops and the 3-minute lag run; a job at a few thousand changes/s takes hours):
#   SPOCKWIRE_BENCH_PIPELINE_ROWS=1000000         rows of the table snapshotted, then changed
#   SPOCKWIRE_BENCH_PIPELINE_CHANGES=2000000      changes of the backlog applied with and without --history
#   SPOCKWIRE_BENCH_PIPELINE_SMALL_CHANGES=500000 changes of the secondary backlog (0: not run)
#   SPOCKWIRE_BENCH_PIPELINE_BIG_ROWS=10000000    rows of the large table snapshotted (the rate as tables grow)
#   SPOCKWIRE_BENCH_PIPELINE_BIG_CHANGES=5000000  changes of the backlog applied under the batch bound (peak RSS)
#   SPOCKWIRE_BENCH_PIPELINE_MAX_WAL_BYTES=67108864   that bound: the source's maxWalBytesPerBatch
#   SPOCKWIRE_BENCH_PIPELINE_LAG_SECONDS=180      how long the writers run in the lag test
#   SPOCKWIRE_BENCH_PIPELINE_LAG_RATE=20000       their pace, changes/s (transactions of 1,000)
#   SPOCKWIRE_BENCH_PIPELINE_FIXED_ROUNDS=5       one-change and empty micro-batches measured
#   SPOCKWIRE_BENCH_PIPELINE_ANCHOR_ROUNDS=3      rounds of the read_table and write_deltalake anchors
#   SPOCKWIRE_BENCH_PIPELINE_EMPTY_ROUNDS=5       runs of each empty-source command (the job's fixed cost)
#   SPOCKWIRE_BENCH_PIPELINE_SNAPSHOT_ROUNDS=7    pairs of runs (empty source, table) of the 1,000,000-row snapshot
#   SPOCKWIRE_BENCH_PIPELINE_BIG_SNAPSHOT_ROUNDS=3   runs of the 10,000,000-row snapshot
#   SPOCKWIRE_BENCH_PIPELINE_CHANGE_ROUNDS=5      runs of each backlog job (all but the last from copies)
#   SPOCKWIRE_BENCH_PIPELINE_JOB_TIMEOUT=3600     seconds a job run (or the lag test's catch-up) may take before the
#                                                 benchmark fails; SPOCKWIRE_BENCH_PIPELINE_KEEP=1 keeps its folders
#   e.g. a quick look: ROWS=20000 CHANGES=10000 BIG_ROWS=50000 BIG_CHANGES=20000 LAG_SECONDS=10 LAG_RATE=5000
#   Many tables under pgbench (benchmarks/bench_many_tables.py: the job with no --table over a publication of
#   pgbench's 3 keyed tables and 100 small ones, while `pgbench -c 4 -n -T` and a paced writer run, one migration at
#   a third of the run; about 5-6 minutes; kept as benchmarks/results/many_tables_run.json, the lag chart
#   docs/images/bench_many_tables.svg; SPOCKWIRE_BENCH_PIPELINE_JOB_TIMEOUT and _KEEP apply to it too):
#   SPOCKWIRE_BENCH_MANY_SECONDS=180      how long pgbench and the writer run
#   SPOCKWIRE_BENCH_MANY_SCALE=10         pgbench -i -s (10: pgbench_accounts holds 1,000,000 rows)
#   SPOCKWIRE_BENCH_MANY_TABLES=100       small tables small_000 ... (at least 8: small_007 is migrated)
#   SPOCKWIRE_BENCH_MANY_ROWS=1000        rows of each small table
#   SPOCKWIRE_BENCH_MANY_WRITER_RATE=200  the writer's pace, transactions/s (1-3 rows of a random small table each)
#   e.g. a quick look: SECONDS=20 SCALE=1 TABLES=10
#   SPOCKWIRE_BENCH_OUT=BENCHMARKS.md
set -euo pipefail
cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.."

PYTHON="${PYTHON:-python3}"
# numpy's OpenBLAS starts a spinning thread per core on import; on a two-core machine it takes cycles from the
# decoders being measured (it showed in perf profiles of the decode loop) while no benchmark does linear algebra
export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}"
NODE_PACKAGE="pg-logical-replication@2.5.0"
mkdir -p out

"$PYTHON" setup.py -q build_ext --inplace

missing=()
for module in pypgoutput orjson adbc_driver_postgresql adbc_driver_manager connectorx; do
    "$PYTHON" -c "import $module" 2>/dev/null || missing+=("python module $module (pip install)")
done
command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 || missing+=("node and npm")
[ -x /usr/lib/postgresql/15/bin/pg_recvlogical ] || command -v pg_recvlogical >/dev/null 2>&1 \
    || missing+=("pg_recvlogical (postgresql-15)")
if [ ! -x out/peer312/bin/python ] || ! out/peer312/bin/python -c "import pgoutput_decoder, psycopg2" 2>/dev/null; then
    PYTHON="$PYTHON" bash scripts/setup-machine.sh --peer-venv out/peer312 \
        || missing+=("out/peer312: Python >= 3.12 with pgoutput-decoder (scripts/setup-machine.sh --peer-venv)")
fi
if [ ${#missing[@]} -eq 0 ] && [ ! -d out/node/node_modules/pg-logical-replication ]; then
    npm install --prefix out/node --no-audit --no-fund --loglevel=error "$NODE_PACKAGE" \
        || missing+=("npm package $NODE_PACKAGE")
fi
if [ ${#missing[@]} -gt 0 ]; then
    printf 'bench: peer missing: %s\n' "${missing[@]}" >&2
    echo "bench: every peer is part of BENCHMARKS.md; install the missing ones (scripts/setup-machine.sh)" >&2
    exit 1
fi

"$PYTHON" -m pytest benchmarks -o python_files='bench_*.py' --ignore=benchmarks/bench_connection.py \
    --benchmark-json=out/bench.json --benchmark-columns=min,median,rounds "$@"
"$PYTHON" benchmarks/report.py --out "${SPOCKWIRE_BENCH_OUT:-BENCHMARKS.md}"
MPLBACKEND=Agg "$PYTHON" -m benchmarks.charts
