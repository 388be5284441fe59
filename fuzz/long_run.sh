#!/usr/bin/env bash
# A long fuzzing campaign: fuzz/run.sh again and again until SECONDS have passed, keeping the corpus, every
# finding (artifacts/) and a log; a finding ends one libFuzzer run, not the campaign.
#
#   fuzz/long_run.sh SECONDS WORK_DIR [--build DIR] [extra libFuzzer flags]
#
# WORK_DIR gets corpus/ (grows), seeds/ (fuzz/seeds.py), artifacts/ (crash-*, oom-*, timeout-*), log and
# summary.txt (runs, executions, findings). Put patterns of findings already reported, one a line, in
# $SPOCKWIRE_FUZZ_KNOWN to look past them (fuzz/README.md).
set -euo pipefail
cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.."
PYTHON="${PYTHON:-python3}"

TOTAL="$1"
WORK="$2"
shift 2
BUILD=(--build build/fuzz)
if [ "${1:-}" = "--build" ]; then
    BUILD=(--build "$2")
    shift 2
fi
mkdir -p "$WORK/corpus" "$WORK/artifacts"
[ -d "$WORK/seeds" ] || "$PYTHON" fuzz/seeds.py "$WORK/seeds" >/dev/null

start=$(date +%s)
runs=0
execs=0
findings=0
while :; do
    now=$(date +%s)
    left=$((TOTAL - (now - start)))
    [ "$left" -gt 10 ] || break
    runs=$((runs + 1))
    echo "=== run $runs, $left s left, $(date -u +%FT%TZ)" >>"$WORK/log"
    rc=0
    SPOCKWIRE_FUZZ_LAST="$WORK/last-input" fuzz/run.sh "${BUILD[@]}" -max_total_time="$left" -max_len=16384 -timeout=30 -rss_limit_mb=6144 \
        -malloc_limit_mb=256 -dict=fuzz/decoder.dict -print_final_stats=1 -artifact_prefix="$WORK/artifacts/" "$@" \
        "$WORK/corpus" "$WORK/seeds" >>"$WORK/log.run" 2>&1 || rc=$?
    n=$(grep -a 'stat::number_of_executed_units' "$WORK/log.run" | tail -1 | awk '{print $2}' || true)
    if [ -z "$n" ]; then   # killed before its final stats: count up to its last status line
        n=$(grep -a -o -E '^#[0-9]+' "$WORK/log.run" | tail -1 | tr -d '#' || true)
    fi
    execs=$((execs + ${n:-0}))
    if [ "$rc" -ne 0 ]; then
        findings=$((findings + 1))
        echo "finding (exit $rc):" >>"$WORK/log"
        grep -a -E 'Finding:|ERROR: AddressSanitizer|runtime error:|ERROR: libFuzzer|SUMMARY|Test unit written' \
            "$WORK/log.run" | head -8 >>"$WORK/log" || true
        cp "$WORK/log.run" "$WORK/artifacts/run-$runs.log"
        cp "$WORK/last-input" "$WORK/artifacts/last-input-run-$runs" 2>/dev/null || true
    fi
    grep -a -E '^#[0-9]+ +(DONE|pulse|NEW|REDUCE)' "$WORK/log.run" | tail -1 >>"$WORK/log" || true
    cat "$WORK/log.run" >>"$WORK/log.all"
    rm -f "$WORK/log.run"
    [ "$rc" -ne 0 ] && sleep 1
done
end=$(date +%s)
cat >"$WORK/summary.txt" <<SUMMARY
duration_s=$((end - start))
runs=$runs
executions=$execs
findings=$findings
corpus_files=$(ls "$WORK/corpus" | wc -l)
SUMMARY
cat "$WORK/summary.txt"
