#!/usr/bin/env bash
# Run fuzz/fuzz_decoder.py under the ASan + UBSan + libFuzzer runtime, with the sanitizer build of the decoder.
#
#   fuzz/run.sh [--build DIR] [libFuzzer flags] CORPUS_DIR [SEED_DIR ...]    fuzz
#   fuzz/run.sh [--build DIR] --replay FILE...                               run inputs once, report findings
#
# DIR is a build made by `fuzz/build_sanitized.sh --out DIR` (default build/fuzz). The runtime preloaded is the
# one atheris ships (asan_with_fuzzer.so: clang's ASan and UBSan runtimes with libFuzzer); it is preloaded into
# this Python process only. PYTHONMALLOC=malloc puts Python objects on malloc, where ASan sees them.
# Settings already in the environment (ASAN_OPTIONS, UBSAN_OPTIONS, SPOCKWIRE_FUZZ_KNOWN) are kept.
set -euo pipefail
cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.."
PYTHON="${PYTHON:-python3}"

BUILD=build/fuzz
if [ "${1:-}" = "--build" ]; then
    BUILD="$2"
    shift 2
fi
MODULE="$(fuzz/build_sanitized.sh --out "$BUILD" --print)" || {
    echo "fuzz/run.sh: no sanitizer build in $BUILD: run fuzz/build_sanitized.sh --out $BUILD" >&2
    exit 2
}
RUNTIME="$("$PYTHON" -c 'import atheris, os; print(os.path.join(atheris.path(), "asan_with_fuzzer.so"))')" || {
    echo "fuzz/run.sh: atheris is not installed (pip install atheris)" >&2
    exit 2
}
[ -f "$RUNTIME" ] || { echo "fuzz/run.sh: $RUNTIME is missing from the atheris install" >&2; exit 2; }

export SPOCKWIRE_FUZZ_MODULE="$PWD/$MODULE"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=0}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
export PYTHONMALLOC=malloc
LD_PRELOAD="$RUNTIME" exec "$PYTHON" fuzz/fuzz_decoder.py "$@"
