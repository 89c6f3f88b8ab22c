#!/usr/bin/env bash
# Fetches the PyPI wheel of MemFabric Hybrid (`memfabric-hybrid`) for the static inspection test over real wheels
# (tests/inspect.rs) and prints the wheel's path on its last line of stdout.
#
#   tests/support/memfabric.sh                      # download (if not cached) and print the wheel's path
#   MEMFABRIC_WHEEL_VERSION=X tests/support/memfabric.sh   # another version than the default below
#
# The wheel is downloaded with pip (no dependencies, nothing installed, nothing run) into the git-ignored cache
# directory (.aiv-cache, or $AIV_CACHE_DIR); a second run reuses it. It is only read, never committed. Everything it
# prints besides the final path goes to stderr, so callers can do
#   export AIV_TEST_MEMFABRIC_WHEEL="$(tests/support/memfabric.sh | tail -n 1)"
# Any failure exits non-zero with the reason on stderr.
set -euo pipefail
cd "$(dirname "$0")/../.."

version="${MEMFABRIC_WHEEL_VERSION:-1.3.0}"
cache="${AIV_CACHE_DIR:-.aiv-cache}/memfabric-hybrid-${version}"

log() { echo "memfabric.sh: $*" >&2; }

shopt -s nullglob
wheels=("$cache"/memfabric_hybrid-"${version}"-*.whl)
shopt -u nullglob
if ((${#wheels[@]} == 0)); then
    mkdir -p "$cache"
    log "downloading memfabric-hybrid==$version with pip (the wheel only)"
    # The x86_64 CPython 3.11 build is named explicitly, so the download does not depend on the local interpreter.
    if ! timeout 600 python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
        --python-version 3.11 --implementation cp --abi cp311 --platform manylinux_2_28_x86_64 \
        --timeout 60 --retries 3 --dest "$cache" "memfabric-hybrid==${version}" >&2; then
        log "could not download memfabric-hybrid==${version} with pip"
        exit 1
    fi
    shopt -s nullglob
    wheels=("$cache"/memfabric_hybrid-"${version}"-*.whl)
    shopt -u nullglob
    if ((${#wheels[@]} == 0)); then
        log "pip reported success but left no memfabric_hybrid-${version}-*.whl in $cache"
        exit 1
    fi
else
    log "using the cached wheel of memfabric-hybrid $version"
fi
realpath "${wheels[0]}"
