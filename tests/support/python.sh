#!/usr/bin/env bash
# Builds the Python package aiv_transport (maturin wheel of host/python) and installs it into a virtualenv,
# idempotently.
#
#   tests/support/python.sh                          # set up (if needed) and print the virtualenv path on stdout
#   AIV_PYTHON_VENV=DIR tests/support/python.sh      # use DIR instead of target/python-venv
#   AIV_PYTHON_RELEASE=1 tests/support/python.sh     # build the wheel with the release profile (default: debug)
#   PYTHON=python3.12 tests/support/python.sh        # the interpreter the virtualenv is made from (>= 3.9)
#
# What it does: creates the virtualenv when missing; installs maturin, pytest and numpy from PyPI when missing;
# builds the wheel with `maturin build` into target/python-wheels; installs it with --force-reinstall (so a rebuilt
# wheel is the one used); checks that `import aiv_transport` works. Everything it prints besides the final path goes
# to stderr, so callers can do
#   export AIV_TEST_PYTHON_VENV="$(tests/support/python.sh)"
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
venv="${AIV_PYTHON_VENV:-$repo/target/python-venv}"
python="${PYTHON:-python3}"
wheels="$repo/target/python-wheels"

log() { echo "python.sh: $*" >&2; }

if ! "$python" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 9) else 1)' 2>/dev/null; then
    log "$python is missing or older than Python 3.9 (set PYTHON to a Python >= 3.9)"
    exit 1
fi

if [[ ! -x "$venv/bin/python" ]]; then
    log "creating virtualenv $venv"
    "$python" -m venv "$venv" >&2
fi

missing=()
for tool in maturin pytest numpy; do
    if ! "$venv/bin/python" -m pip show "$tool" >/dev/null 2>&1; then
        missing+=("$tool")
    fi
done
if ((${#missing[@]})); then
    log "installing ${missing[*]}"
    # maturin >= 1.9.4 sets PYO3_BUILD_EXTENSION_MODULE, which the crate relies on (pyo3 0.30 has no
    # extension-module feature to do it).
    requirements=()
    for tool in "${missing[@]}"; do
        if [[ "$tool" == maturin ]]; then requirements+=("maturin>=1.9.4,<2"); else requirements+=("$tool"); fi
    done
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${requirements[@]}" >&2
fi

profile_flag=()
profile=debug
if [[ "${AIV_PYTHON_RELEASE:-0}" == 1 ]]; then
    profile_flag=(--release)
    profile=release
fi
log "building the wheel ($profile profile)"
rm -f "$wheels"/aiv_transport-*.whl
(cd "$repo" && "$venv/bin/maturin" build "${profile_flag[@]}" --interpreter "$venv/bin/python" --out "$wheels") >&2
shopt -s nullglob
built=("$wheels"/aiv_transport-*.whl)
shopt -u nullglob
if ((${#built[@]} != 1)); then
    log "expected one wheel in $wheels, found ${#built[@]}"
    exit 1
fi
log "installing ${built[0]##*/}"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps "${built[0]}" >&2

# The package must import from outside the source tree (the installed copy, not host/python).
(cd / && "$venv/bin/python" -c 'import aiv_transport, sys; assert "mooncake" not in sys.modules; print("python.sh: aiv_transport", aiv_transport.__version__, "imports", file=sys.stderr)')
echo "$venv"
