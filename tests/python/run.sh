#!/usr/bin/env bash
# Runs the Python drop-in's pytest suite (tests/python) with the interpreter of the virtualenv AIV_TEST_PYTHON_VENV,
# which must have pytest, numpy and the package under test: `aiv_transport` (the wheel built from this repository),
# or, with AIV_PYTEST_ENGINE=mooncake, the real Mooncake wheel (tests/support/mooncake.sh makes such a virtualenv).
#
#   AIV_TEST_PYTHON_VENV=DIR tests/python/run.sh [pytest arguments]
#
# Environment the suite reads (tests/python/conftest.py says more): AIV_PYTEST_ENGINE (aiv_transport | mooncake),
# AIV_TEST_MOONCAKE_VENV (interop tests; tests/support/mooncake.sh), AIV_TEST_ETCD (etcd tests; tests/support/etcd.sh
# start), AIV_TEST_AIV_BIN (the aiv binary for the HTTP metadata server; default target/debug/aiv), AIV_PYTEST_SEED,
# CI=true (missing prerequisites fail instead of skipping).
set -euo pipefail
cd "$(dirname "$0")/../.."

if [[ -z "${AIV_TEST_PYTHON_VENV:-}" ]]; then
    echo "tests/python/run.sh: set AIV_TEST_PYTHON_VENV to a virtualenv with pytest, numpy and aiv_transport" >&2
    exit 2
fi
python="$AIV_TEST_PYTHON_VENV/bin/python"
if [[ ! -x "$python" ]]; then
    echo "tests/python/run.sh: AIV_TEST_PYTHON_VENV=$AIV_TEST_PYTHON_VENV has no executable bin/python" >&2
    exit 2
fi
exec "$python" -m pytest tests/python -q -p no:cacheprovider "$@"
