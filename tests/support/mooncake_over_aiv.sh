#!/usr/bin/env bash
# Builds libllm_datadist.so over aiv (host/capi/cxx/adxl_over_aiv.cpp: Mooncake's adxl::AdxlEngine as this project's
# engine with protocol aiv, on libaiv_transport.so) into one directory with the twin runtime's other two CANN
# libraries, and prints its path on stdout, for LD_LIBRARY_PATH in front of a Mooncake command
# (docs/mooncake.md, "Mooncake's engine over aiv"):
#
#   libllm_datadist.so   adxl::AdxlEngine over aiv (links libaiv_transport.so, libascendcl.so, libmetadef.so)
#   libaiv_transport.so  the engine's C ABI, built with feature `cann` (it drives the libascendcl.so the process
#                        loaded, through the engine's cann backend)
#   libascendcl.so       the twin runtime (the cann-twin cdylib), from tests/support/twin_cann_libs.sh
#   libmetadef.so        ge::AscendString, from tests/support/twin_cann_libs.sh
#
#   tests/support/mooncake_over_aiv.sh                                # build (if needed) into target/mooncake-over-aiv
#   AIV_MOONCAKE_OVER_AIV_LIBS=DIR tests/support/mooncake_over_aiv.sh  # use DIR instead
#   LD_LIBRARY_PATH="$(tests/support/mooncake_over_aiv.sh)" python ...
#
# The C++ library is compiled with the system's g++ and libstdc++ (the cxx11 string ABI, as the wheel was), with
# -Wall -Wextra -Werror. Everything it prints besides the final path goes to stderr.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
out="${AIV_MOONCAKE_OVER_AIV_LIBS:-$repo/target/mooncake-over-aiv}"
cxx="${CXX:-g++}"

log() { echo "mooncake_over_aiv.sh: $*" >&2; }

for tool in "$cxx" cargo python3; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        log "needs $tool on PATH"
        exit 1
    fi
done

twin="$("$repo/tests/support/twin_cann_libs.sh" | tail -n 1)"
mkdir -p "$out"
for file in libascendcl.so libmetadef.so; do
    cp -f "$twin/$file" "$out/$file.tmp.$$"
    mv -f "$out/$file.tmp.$$" "$out/$file"
done

log "building libaiv_transport.so with feature cann"
(cd "$repo" && cargo build --quiet -p aiv-transport-capi --features cann >&2)
target_dir="$(cd "$repo" && cargo metadata --format-version 1 --no-deps |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')"
cp -f "$target_dir/debug/libaiv_transport.so" "$out/libaiv_transport.so.tmp.$$"
mv -f "$out/libaiv_transport.so.tmp.$$" "$out/libaiv_transport.so"

flags=(-std=c++17 -O2 -g -fPIC -Wall -Wextra -Werror)
log "compiling libllm_datadist.so (adxl::AdxlEngine over aiv) with $cxx"
"$cxx" "${flags[@]}" -shared -pthread -o "$out/libllm_datadist.so.tmp.$$" "$repo/host/capi/cxx/adxl_over_aiv.cpp" \
    -I"$repo/host/capi/include" -I"$repo/shmem-bindings/cann-twin/cxx" \
    -L"$out" -laiv_transport -lascendcl -lmetadef -ldl -Wl,-rpath,'$ORIGIN'
mv -f "$out/libllm_datadist.so.tmp.$$" "$out/libllm_datadist.so"
echo "$out"
