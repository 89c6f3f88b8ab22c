#!/usr/bin/env bash
# Sets up Mooncake's real Ascend build (the PyPI wheel `mooncake-transfer-engine-npu`) in its own virtualenv,
# idempotently, for the CPU twin runtime.
#
#   tests/support/mooncake_npu.sh                          # set up (if needed), print the virtualenv path on stdout
#   AIV_MOONCAKE_NPU_VENV=DIR tests/support/mooncake_npu.sh  # use DIR instead of target/mooncake-npu-venv
#
# What it installs: the Debian packages the wheel's shared objects link besides the CANN libraries (libibverbs1,
# libnuma1, libcurl4, liblzma5; docs/mooncake-npu-wheel.md section 2), only when missing; a CPython 3.11 virtualenv
# with `mooncake-transfer-engine-npu` (cp311 only) and its Python dependencies, pinned by MOONCAKE_NPU_WHEEL_VERSION
# (default below).
# PYTHON picks the interpreter (default python3.11). Everything it prints besides the final path goes to stderr:
#   export AIV_TEST_MOONCAKE_NPU_VENV="$(tests/support/mooncake_npu.sh)"
#
# It does not import `mooncake.engine`: that module links libascendcl.so, libllm_datadist.so and libmetadef.so, which
# only CANN (or the twin runtime) provides. It checks the installed files instead. Nothing here runs a Mooncake binary.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
venv="${AIV_MOONCAKE_NPU_VENV:-$repo/target/mooncake-npu-venv}"
wheel="mooncake-transfer-engine-npu"
version="${MOONCAKE_NPU_WHEEL_VERSION:-0.3.13.post1}"
python="${PYTHON:-python3.11}"

log() { echo "mooncake_npu.sh: $*" >&2; }

# shellcheck source=tests/support/debian.sh
source "$repo/tests/support/debian.sh"
ensure_debian_packages mooncake_npu.sh libibverbs1 libnuma1 libcurl4 liblzma5

if [[ ! -x "$venv/bin/python" ]]; then
    if ! command -v "$python" >/dev/null 2>&1; then
        log "no $python on PATH: the wheel is built for CPython 3.11 only (set PYTHON to a 3.11 interpreter)"
        exit 1
    fi
    log "creating virtualenv $venv"
    "$python" -m venv "$venv" >&2
fi
# The wheel's tag is cp311: any other interpreter makes pip fail with "no matching distribution".
if ! "$venv/bin/python" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
    log "$venv is not a CPython 3.11 virtualenv; remove it or point AIV_MOONCAKE_NPU_VENV elsewhere"
    exit 1
fi
installed="$("$venv/bin/python" -m pip show "$wheel" 2>/dev/null | sed -n 's/^Version: //p' || true)"
if [[ "$installed" != "$version" ]]; then
    log "installing $wheel==$version (found: ${installed:-none})"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$wheel==$version" >&2
fi

# Check the pieces the twin runtime has to satisfy, without loading them. find_spec of the package only reads
# mooncake/__init__.py (pure Python); the extension modules are looked up as files.
package_dir="$("$venv/bin/python" -c \
    'import importlib.util, os; print(os.path.dirname(importlib.util.find_spec("mooncake").origin))')"
for file in engine.so ascend_transport.so libtransfer_engine.so __init__.py; do
    if [[ ! -f "$package_dir/$file" ]]; then
        log "the wheel has no $file under $package_dir"
        exit 1
    fi
done
shopt -s nullglob
transports=("$package_dir"/ascend_transport*.so)
shopt -u nullglob
if ((${#transports[@]} == 0)); then
    log "the wheel has no ascend_transport*.so under $package_dir"
    exit 1
fi
echo "$venv"
