#!/usr/bin/env bash
# Run every benchmark and write BENCHMARKS.md (benchmarks are not part of the test command):
#
#   scripts/bench.sh [PYTEST ARGS...]
#
# Builds the extension in place, captures the workloads on first use (cached under out/bench-cache/), runs
# benchmarks/bench_*.py with pytest-benchmark into out/bench.json, then benchmarks/report.py writes BENCHMARKS.md.
# bench_connection.py is skipped because bench_e2e.py runs its tests on its own slot, next to the no-op callback.
#
# Needs: the packages of scripts/setup-machine.sh (they include the table reader's peers of bench_snapshot.py:
# adbc-driver-postgresql, adbc-driver-manager, connectorx), plus `pip install pypgoutput orjson` for the Python peers.
# The Node peer runs when `node` and `npm` exist: the npm package is installed into out/node once.
# Environment:
#   PYTHON=python3                 interpreter
#   SPOCKWIRE_BENCH_NODE=0         do not install or run the Node peer
#   SPOCKWIRE_BENCH_SCALE=1        multiplies the captured workloads' row counts (0.05 for a quick look)
#   SPOCKWIRE_BENCH_ROWS=1000000   rows of the end-to-end workload
#   SPOCKWIRE_BENCH_SNAPSHOT_ROWS=1000000   rows of the table bench_snapshot.py reads (read_table vs ADBC, connectorx)
#   SPOCKWIRE_BENCH_OUT=BENCHMARKS.md
set -euo pipefail
cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.."

PYTHON="${PYTHON:-python3}"
NODE_PACKAGE="pg-logical-replication@2.5.0"
mkdir -p out

"$PYTHON" setup.py -q build_ext --inplace

if [ "${SPOCKWIRE_BENCH_NODE:-1}" != "0" ] && command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 \
        && [ ! -d out/node/node_modules/pg-logical-replication ]; then
    npm install --prefix out/node --no-audit --no-fund --loglevel=error "$NODE_PACKAGE" \
        || echo "bench: npm install $NODE_PACKAGE failed; the Node peer will be skipped" >&2
fi

"$PYTHON" -m pytest benchmarks -o python_files='bench_*.py' --ignore=benchmarks/bench_connection.py \
    --benchmark-json=out/bench.json --benchmark-columns=min,median,rounds "$@"
"$PYTHON" benchmarks/report.py out/bench.json --out "${SPOCKWIRE_BENCH_OUT:-BENCHMARKS.md}"
