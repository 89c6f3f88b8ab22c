#!/usr/bin/env bash
# Renders docs/RESULTS.md and docs/BASELINES.md from the recorded reports in docs/results/ (docs/audit.md, "The
# results pages").
#
#   bash docs/results/regenerate.sh            # render the pages from the recorded reports (fast, deterministic)
#   bash docs/results/regenerate.sh --record   # first run every recorded report's command again on this machine
#                                              # (`aiv audit --rerun`; for kernel.json the kernel microbenchmark,
#                                              # `cargo bench --bench kernel`), replacing the reports, then render
#
# --record runs them one after the other (a few minutes each on the twin runtime). The cross-host report needs root
# and iproute2; mooncake-ascend needs tests/support/mooncake_npu.sh and tests/support/twin_cann_libs.sh to have run.
# Without them the audit records the section or the path as not run, with the reason. Record on a quiet machine: the
# pages state the load average at each report's start.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$repo"
case "${1:-}" in
    "" | --record) ;;
    *)
        echo "usage: bash docs/results/regenerate.sh [--record]" >&2
        exit 2
        ;;
esac

cargo build --release --quiet --bin aiv
aiv=target/release/aiv

# Waits (at most 3 minutes) for the 1-minute load average to fall below 1, so that a recording does not start under
# the load the previous one made.
settle() {
    for _ in $(seq 36); do
        if awk '{ exit !($1 < 1.0) }' /proc/loadavg; then
            return
        fi
        sleep 5
    done
}

if [[ "${1:-}" == "--record" ]]; then
    for report in docs/results/*.json; do
        settle
        name="$(basename "$report" .json)"
        out="target/results/$name"
        rm -rf "$out"
        echo "regenerate.sh: recording $name (load average: $(cut -d' ' -f1-3 /proc/loadavg))" >&2
        if [[ "$name" == kernel ]]; then
            mkdir -p "$out"
            AIV_BENCH_REPORT="$repo/$out/report.json" cargo bench --quiet --bench kernel
        else
            "$aiv" audit --rerun "$report" --out "$out"
        fi
        # Stored whole, without the indentation (it is most of the file's size).
        python3 -c 'import json, sys
report = json.load(open(sys.argv[1]))
with open(sys.argv[2], "w") as out:
    json.dump(report, out, ensure_ascii=False, separators=(",", ":"))
    out.write("\n")' "$out/report.json" "$report"
    done
fi
"$aiv" audit --results-pages docs/results
