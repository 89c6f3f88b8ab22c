#!/usr/bin/env bash
# Fetches the CANN ACL and HCCL headers for the ABI conformance test and prints the include root on stdout.
#
# The headers come from the torch-npu wheel on PyPI (torch_npu/include/third_party/{acl,hccl}/inc). The wheel is
# downloaded with pip into the git-ignored cache directory (.aiv-cache, or $AIV_CACHE_DIR) and only the header
# directories are unpacked; nothing of it is ever committed. A second run reuses the cache. Any failure exits
# non-zero with the reason on stderr.
set -euo pipefail
cd "$(dirname "$0")/.."

version="${AIV_TORCH_NPU_VERSION:-2.14.0}"
cache="${AIV_CACHE_DIR:-.aiv-cache}/torch-npu-${version}"
include="$cache/torch_npu/include"

if [[ -f "$include/third_party/acl/inc/acl/acl.h" && -f "$include/third_party/hccl/inc/hccl/hccl.h" ]]; then
    echo "using cached headers of torch-npu $version" >&2
    realpath "$include"
    exit 0
fi

mkdir -p "$cache/wheel"
echo "downloading torch-npu $version with pip (headers only are kept)" >&2
# The headers are the same in every build of a release; the x86_64 CPython 3.11 wheel is named explicitly so the
# download does not depend on the local interpreter or architecture.
if ! timeout 600 python3 -m pip download --quiet --no-deps --only-binary=:all: \
    --python-version 3.11 --implementation cp --abi cp311 --platform manylinux_2_28_x86_64 \
    --timeout 60 --retries 3 --dest "$cache/wheel" "torch-npu==${version}" >&2; then
    echo "ERROR: could not download torch-npu==${version} with pip; the ABI check needs its headers." >&2
    echo "       A developer without registry access may skip the check with AIV_SKIP_ABI=1 (refused in CI)." >&2
    exit 1
fi

wheel="$(ls "$cache"/wheel/torch_npu-"${version}"-*.whl | head -n 1)"
python3 - "$wheel" "$cache" <<'PY'
import sys
import zipfile

wheel, destination = sys.argv[1], sys.argv[2]
prefixes = ("torch_npu/include/third_party/acl/inc/", "torch_npu/include/third_party/hccl/inc/")
with zipfile.ZipFile(wheel) as archive:
    members = [name for name in archive.namelist() if name.startswith(prefixes) and not name.endswith("/")]
    if not members:
        sys.exit(f"{wheel} has no ACL/HCCL headers under {prefixes}")
    archive.extractall(destination, members=members)
print(f"unpacked {len(members)} header files", file=sys.stderr)
PY
rm -f "$cache"/wheel/*.whl
realpath "$include"
