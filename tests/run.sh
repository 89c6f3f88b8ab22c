#!/usr/bin/env bash
# The project's one test command (README, .ci/run): sets up what the tests need on a fresh machine, then runs
# formatting, lints and the whole test suite. Safe to run again; each setup step installs only what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n== %s\n' "$*"; }

step "toolchain"
cargo --version
c++ --version | head -n 1

step "format"
cargo fmt --all -- --check

step "lints"
cargo clippy --workspace --all-targets -- -D warnings

step "services: etcd on loopback (installs Debian's etcd-server if missing)"
AIV_TEST_ETCD="$(bash tests/support/etcd.sh start | tail -n 1)"
export AIV_TEST_ETCD
echo "etcd at $AIV_TEST_ETCD"

step "tests"
log=$(mktemp)
trap 'rm -f "$log"; bash tests/support/etcd.sh stop >/dev/null 2>&1 || true' EXIT
set +e
cargo test --workspace 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
# One closing line for the whole run: cargo prints a summary per test binary, the last of which is often an empty
# doc-test binary.
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i; if ($(i+1) ~ /^ignored/) s += $i } }
     END { printf "\ntests: %d passed, %d failed, %d skipped\n", p, f, s }' "$log"
exit "$status"
