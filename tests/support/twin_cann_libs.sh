#!/usr/bin/env bash
# Builds the twin's stand-ins for the three CANN libraries Mooncake's Ascend wheel links (docs/mooncake-npu-wheel.md
# sections 2 and 3) into one directory and prints its path on stdout, for LD_LIBRARY_PATH:
#
#   libascendcl.so      the cann-twin cdylib under CANN's file name (the ACL C functions)
#   libllm_datadist.so  adxl::AdxlEngine, from shmem-bindings/cann-twin/cxx/adxl_engine.cpp (links libascendcl.so)
#   libmetadef.so       ge::AscendString, from shmem-bindings/cann-twin/cxx/ascend_string.cpp
#
#   tests/support/twin_cann_libs.sh                         # build (if needed) into target/twin-cann-libs
#   AIV_TWIN_CANN_LIBS=DIR tests/support/twin_cann_libs.sh  # use DIR instead
#   AIV_MOONCAKE_NPU_VENV=DIR tests/support/twin_cann_libs.sh  # also check every CANN symbol the wheel installed
#                                                            # in DIR imports is defined (nm), and fail otherwise
#
# The C++ libraries are compiled with the system's g++ and libstdc++ (the cxx11 string ABI, as the wheel was).
# Everything it prints besides the final path goes to stderr:
#   export AIV_TEST_TWIN_CANN_LIBS="$(tests/support/twin_cann_libs.sh)"
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
out="${AIV_TWIN_CANN_LIBS:-$repo/target/twin-cann-libs}"
cxx_dir="$repo/shmem-bindings/cann-twin/cxx"
cxx="${CXX:-g++}"

log() { echo "twin_cann_libs.sh: $*" >&2; }

for tool in "$cxx" nm cargo python3; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        log "needs $tool on PATH"
        exit 1
    fi
done

mkdir -p "$out"
log "building the cann-twin cdylib"
(cd "$repo" && cargo build --quiet -p cann-twin --lib >&2)
target_dir="$(cd "$repo" && cargo metadata --format-version 1 --no-deps |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')"
cp -f "$target_dir/debug/libcann_twin.so" "$out/libascendcl.so.tmp"
mv -f "$out/libascendcl.so.tmp" "$out/libascendcl.so"

flags=(-std=c++17 -O2 -g -fPIC -Wall -Wextra -Werror)
log "compiling libmetadef.so and libllm_datadist.so with $cxx"
"$cxx" "${flags[@]}" -shared -o "$out/libmetadef.so" "$cxx_dir/ascend_string.cpp"
"$cxx" "${flags[@]}" -shared -pthread -o "$out/libllm_datadist.so" "$cxx_dir/adxl_engine.cpp" \
    -L"$out" -lascendcl -lmetadef -Wl,-rpath,'$ORIGIN'

# Optionally: every CANN symbol the installed wheel imports (strong or weak) must be defined by the three files.
if [[ -n "${AIV_MOONCAKE_NPU_VENV:-}" ]]; then
    package_dir="$("$AIV_MOONCAKE_NPU_VENV/bin/python" -c \
        'import importlib.util, os; print(os.path.dirname(importlib.util.find_spec("mooncake").origin))')"
    needed="$(for file in ascend_transport.so libtransfer_engine.so libmooncake_store.so; do
        [[ -f "$package_dir/$file" ]] && nm -D --undefined-only "$package_dir/$file"
    done | awk '{print $NF}' | grep -E '^(acl|_ZN4adxl|_ZN2ge|_ZNK2ge)' | sort -u)"
    defined="$(nm -D --defined-only "$out/libascendcl.so" "$out/libllm_datadist.so" "$out/libmetadef.so" |
        awk 'NF == 3 {print $3}' | sort -u)"
    missing="$(comm -23 <(echo "$needed") <(echo "$defined"))"
    if [[ -n "$missing" ]]; then
        log "not defined (needed by the wheel's libraries): $(echo "$missing" | tr '\n' ' ')"
        exit 1
    fi
fi
echo "$out"
