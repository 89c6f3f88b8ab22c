#!/usr/bin/env bash
# Compares the three device paths on the CPU twin: aiv (AIV direct-drive) against the Host-submitted
# baselines adxl and ubshmem, two engines on two twin devices of one process (`aiv bench --protocol P`), and prints
# one markdown row per run: throughput, the memcpy reference of the same run, p50/p99 batch latency, Host CPU time
# per transfer from the transfers' evidence, and the whole process's Host CPU per transfer (every Host thread).
#
#   benches/baselines.sh                    # latency mode: batch 1, 1 thread (latency = per-transfer latency)
#   BATCH=16 THREADS=2 benches/baselines.sh # throughput mode
#
# Knobs (environment): DURATION (s, default 2), BLOCKS ("4096 65536 1048576 16777216"), PROTOCOLS
# ("aiv adxl ubshmem"), OPERATION (write), BATCH (1), THREADS (1), RUNS (3), SECTION_CLOCK (monotonic: how sections
# that never sleep are timed, see `aiv bench --help`; thread for the thread CPU clock), AIV (path of the aiv binary,
# default target/release/aiv, built if missing).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
duration="${DURATION:-2}"
blocks="${BLOCKS:-4096 65536 1048576 16777216}"
protocols="${PROTOCOLS:-aiv adxl ubshmem}"
operation="${OPERATION:-write}"
batch="${BATCH:-1}"
threads="${THREADS:-1}"
runs="${RUNS:-3}"
section_clock="${SECTION_CLOCK:-monotonic}"
target_dir="${CARGO_TARGET_DIR:-$repo/target}"
aiv="${AIV:-$target_dir/release/aiv}"
if [[ ! -x "$aiv" ]]; then
  (cd "$repo" && cargo build --release --bin aiv)
fi

echo "| run | block | protocol | GB/s | memcpy GB/s | p50 us | p99 us | host CPU ns/transfer | whole-process host CPU ns/transfer | clock readings/transfer x ns (thread CPU + monotonic) | API calls/transfer |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
for run in $(seq 1 "$runs"); do
  for block in $blocks; do
    # Each thread's batch needs its own blocks; keep the buffer at least 64 MiB.
    buffer=$((block * batch * threads))
    ((buffer < 67108864)) && buffer=67108864
    for protocol in $protocols; do
      out="$("$aiv" bench --protocol "$protocol" --operation "$operation" --batch_size "$batch" \
        --threads "$threads" --block_size "$block" --buffer_size "$buffer" --duration "$duration" --section_clock "$section_clock" 2>&1)"
      echo "$out" | awk -v run="$run" -v block="$block" -v protocol="$protocol" '
        /^evidence:/ { for (i = 1; i <= NF; i++) { if ($i == "host" && $(i+1) == "device-API") api = $(i-1) } }
        /^host CPU per transfer, whole process:/ { for (i = 1; i <= NF; i++) { if ($i == "process:") process = $(i+1);
                                                                               if ($i == "path:") cpu = $(i+1) } }
        /^latency per batch:/ { p50 = $5; p99 = $8 }
        /^host CPU accounting:/ { for (i = 1; i <= NF; i++) { if ($i == "thread-CPU") thread = $(i-1) " x " $(i+4);
                                                              if ($i == "monotonic-clock") mono = $(i-1) " x " $(i+3) }
                                  clock = thread " + " mono }
        /^reference: memcpy/ { memcpy = $3 }
        /^Test completed:/ { gbps = $(NF-1) }
        END { printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", run, block, protocol, gbps, memcpy, p50, p99, cpu, process, clock, api }'
    done
  done
done
