#!/usr/bin/env bash
# Build spockwire.wire._decoder for fuzzing: clang, AddressSanitizer + UndefinedBehaviorSanitizer
# (SPOCKWIRE_SANITIZE=1 in setup.py) and libFuzzer coverage instrumentation (-fsanitize=fuzzer-no-link), so atheris
# is guided by the C decoder's branches as well as by the Python code.
#
#   fuzz/build_sanitized.sh [--out DIR]           build (or refresh) DIR/lib/spockwire/wire/_decoder*.so and print
#                                                 its path (DIR: build/fuzz)
#   fuzz/build_sanitized.sh [--out DIR] --print   print the path of the built module; non-zero when missing
#
# SPOCKWIRE_FUZZ_EXTRA_CFLAGS is appended after setup.py's own flags, e.g. "-fno-sanitize=pointer-overflow" for a
# long run that must look past a known report (build it into its own --out directory).
#
# Everything goes under build/fuzz/ (objects, the module) and build/cython/sanitize/ (generated C), so the normal
# in-place build that the test suite imports (spockwire/wire/_decoder*.so) is left alone. The fuzzer loads the
# module from build/fuzz/lib by path (see fuzz/fuzz_decoder.py); the Python code comes from the source tree.
#
# Needs: clang (Debian package `clang`), atheris (pip; its wheel ships the ASan+UBSan+libFuzzer runtime
# asan_with_fuzzer.so that the fuzzer preloads), Cython and numpy.
set -euo pipefail
cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.."

PYTHON="${PYTHON:-python3}"
OUT=build/fuzz
PRINT=0
while [ $# -gt 0 ]; do
    case "$1" in
        --out) OUT="$2"; shift 2 ;;
        --print) PRINT=1; shift ;;
        *) echo "build_sanitized: unknown argument $1" >&2; exit 2 ;;
    esac
done
LIB="$OUT/lib"
SUFFIX="$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')"
MODULE="$LIB/spockwire/wire/_decoder$SUFFIX"

if [ "$PRINT" = 1 ]; then
    [ -f "$MODULE" ] || exit 1
    echo "$MODULE"
    exit 0
fi

CC="${CC:-clang}"
if ! command -v "$CC" >/dev/null 2>&1; then
    echo "build_sanitized: $CC not found: install it (Debian: apt-get install clang)" >&2
    exit 1
fi

# Only the decoder is fuzzed, so only it is built: setup.py runs as usual (its build_ext command, flags and mode
# stamps) with its extension list narrowed to spockwire.wire._decoder (it would also build the libpq pump).
mkdir -p "$OUT"
FORCE=()
if [ "$(cat "$OUT/extra-cflags" 2>/dev/null || echo none)" != "${SPOCKWIRE_FUZZ_EXTRA_CFLAGS:-}" ]; then
    FORCE=(--force)   # objects built with other extra flags must not be reused
fi
status=0
SPOCKWIRE_SANITIZE=1 SPOCKWIRE_REQUIRE_EXT=1 \
CC="$CC" LDSHARED="$CC -shared" CFLAGS="-fsanitize=fuzzer-no-link ${CFLAGS:-}" \
    "$PYTHON" - build_ext "${FORCE[@]}" -b "$LIB" -t "$OUT/temp" >"$OUT/build.log" 2>&1 <<'PY' || status=$?
import os
import sys

import setuptools

_setup = setuptools.setup


def decoder_only(**kwargs):
    kwargs["ext_modules"] = [e for e in kwargs["ext_modules"] if e.name == "spockwire.wire._decoder"]
    extra = os.environ.get("SPOCKWIRE_FUZZ_EXTRA_CFLAGS", "").split()
    for ext in kwargs["ext_modules"]:
        ext.extra_compile_args += extra
        ext.extra_link_args += extra
    return _setup(**kwargs)


setuptools.setup = decoder_only
sys.argv = ["setup.py", *sys.argv[1:]]
with open("setup.py") as f:
    exec(compile(f.read(), "setup.py", "exec"), {"__name__": "__main__", "__file__": "setup.py"})
PY
if [ "$status" -ne 0 ] || [ ! -f "$MODULE" ]; then
    cat "$OUT/build.log" >&2
    echo "build_sanitized: building $MODULE failed" >&2
    exit 1
fi
printf '%s' "${SPOCKWIRE_FUZZ_EXTRA_CFLAGS:-}" >"$OUT/extra-cflags"
echo "$MODULE"
