#!/usr/bin/env bash
# Sets up the real Mooncake Transfer Engine wheel for interop tests and benchmarks, idempotently.
#
#   tests/support/mooncake.sh            # set up (if needed) and print the virtualenv path on stdout
#   AIV_MOONCAKE_VENV=DIR tests/support/mooncake.sh   # use DIR instead of target/mooncake-venv
#
# What it installs: Debian's libibverbs1 and libnuma1 (the wheel's shared objects link them even for tcp), only
# when missing; a virtualenv with `mooncake-transfer-engine-non-cuda` from PyPI (pinned by MOONCAKE_WHEEL_VERSION,
# default below). Everything it prints besides the final path goes to stderr, so callers can do
#   export AIV_TEST_MOONCAKE_VENV="$(tests/support/mooncake.sh)"
# Nothing here runs a Mooncake binary.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
venv="${AIV_MOONCAKE_VENV:-$repo/target/mooncake-venv}"
wheel="mooncake-transfer-engine-non-cuda"
version="${MOONCAKE_WHEEL_VERSION:-0.3.13.post1}"
python="${PYTHON:-python3}"

log() { echo "mooncake.sh: $*" >&2; }

# shellcheck source=tests/support/debian.sh
source "$repo/tests/support/debian.sh"
ensure_debian_packages mooncake.sh libibverbs1 libnuma1

if [[ ! -x "$venv/bin/python" ]]; then
    log "creating virtualenv $venv"
    "$python" -m venv "$venv" >&2
fi
installed="$("$venv/bin/python" -m pip show "$wheel" 2>/dev/null | sed -n 's/^Version: //p' || true)"
if [[ "$installed" != "$version" ]]; then
    log "installing $wheel==$version (found: ${installed:-none})"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$wheel==$version" >&2
fi

# Check that the pieces the tests use are there and load.
package_dir="$("$venv/bin/python" -c 'import mooncake, os; print(os.path.dirname(mooncake.__file__))')"
for file in transfer_engine_bench http_metadata_server.py; do
    if [[ ! -e "$package_dir/$file" ]]; then
        log "the wheel has no $file under $package_dir"
        exit 1
    fi
done
chmod +x "$package_dir/transfer_engine_bench" 2>/dev/null || true
"$venv/bin/python" -c 'from mooncake.engine import TransferEngine' >&2
echo "$venv"
