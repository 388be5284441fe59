#!/usr/bin/env bash
# Run pytest with AddressSanitizer + UndefinedBehaviorSanitizer loaded into the Python process, for an extension
# built with SPOCKWIRE_SANITIZE=1:
#
#   SPOCKWIRE_SANITIZE=1 SPOCKWIRE_REQUIRE_EXT=1 python3 setup.py build_ext --inplace
#   scripts/asan-pytest.sh tests [PYTEST ARGS...]
#
# The ASan runtime is preloaded into this Python only: LD_PRELOAD is removed from the environment before pytest
# starts, so the PostgreSQL servers and other programs the tests start do not inherit it (an uninstrumented
# postgres with libasan preloaded hangs). PYTHONMALLOC=malloc routes Python objects through malloc so ASan sees
# reads past the end of bytes/bytearray buffers. --capture=sys keeps pytest from swallowing the sanitizer's report
# (written straight to file descriptor 2 just before the process aborts).
set -euo pipefail
cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.."

asan_runtime="$(gcc -print-file-name=libasan.so)"
if [ ! -e "$asan_runtime" ]; then
    echo "asan-pytest: libasan.so not found (gcc -print-file-name=libasan.so gave '$asan_runtime')" >&2
    exit 1
fi

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=0}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
export PYTHONMALLOC=malloc
export SPOCKWIRE_REQUIRE_EXT=1

LD_PRELOAD="$asan_runtime" exec "${PYTHON:-python3}" -c '
import os, sys
os.environ.pop("LD_PRELOAD", None)
import pytest
sys.exit(pytest.main(["--capture=sys", *sys.argv[1:]]))
' "$@"
