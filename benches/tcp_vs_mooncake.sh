#!/usr/bin/env bash
# Compares `aiv bench --protocol tcp` with Mooncake's transfer_engine_bench, identical flags, back to back, on
# loopback, and prints the throughput ratios.
#
#   benches/tcp_vs_mooncake.sh                       # in-process aiv (two engines), Mooncake over P2PHANDSHAKE
#   AIV_BENCH_MODE=http benches/tcp_vs_mooncake.sh   # both sides as two processes over Mooncake's HTTP metadata
#   AIV_BENCH_MODE=p2p benches/tcp_vs_mooncake.sh    # both sides as two processes over P2PHANDSHAKE
#
# Knobs (environment): DURATION (s, default 5), BLOCKS ("4096 65536 1048576"), OPERATIONS ("write read"),
# THREADS (2), BATCH (32), BUFFER (1073741824), MOONCAKE_ENV (extra VAR=value for the Mooncake processes, e.g.
# "MC_TCP_ENABLE_CONNECTION_POOL=1"), AIV_TCP_LANES (lanes per peer on the aiv side).
# Mooncake processes run with MC_TCP_BIND_ADDRESS=127.0.0.1 so that they listen on and advertise loopback.
# Only processes this script starts are stopped, by their pid.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
duration="${DURATION:-5}"
blocks="${BLOCKS:-4096 65536 1048576}"
operations="${OPERATIONS:-write read}"
threads="${THREADS:-2}"
batch="${BATCH:-32}"
buffer="${BUFFER:-1073741824}"
mode="${AIV_BENCH_MODE:-inproc}"
mooncake_env=(MC_TCP_BIND_ADDRESS=127.0.0.1 ${MOONCAKE_ENV:-})
case "$mode" in inproc | http | p2p) ;; *) echo "AIV_BENCH_MODE must be inproc, http or p2p" >&2; exit 2 ;; esac

venv="$("$repo/tests/support/mooncake.sh")"
package="$("$venv/bin/python" -c 'import mooncake, os; print(os.path.dirname(mooncake.__file__))')"
te_bench="$package/transfer_engine_bench"
(cd "$repo" && cargo build --release --quiet --bin aiv)
aiv="${CARGO_TARGET_DIR:-$repo/target}/release/aiv"

work="$(mktemp -d)"
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT

free_port() { "$venv/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# Waits (bounded) until FILE contains a line matching REGEX; prints the first match.
wait_line() {
    local file="$1" regex="$2" limit="${3:-30}" start=$SECONDS
    until grep -qE "$regex" "$file" 2>/dev/null; do
        if ((SECONDS - start > limit)); then echo "timed out waiting for /$regex/ in $file" >&2; cat "$file" >&2; exit 1; fi
        sleep 0.2
    done
    grep -m1 -E "$regex" "$file"
}

common=(--protocol tcp --threads "$threads" --batch_size "$batch" --buffer_size "$buffer" --duration "$duration")

if [[ "$mode" == http ]]; then
    port="$(free_port)"
    "$venv/bin/python" "$package/http_metadata_server.py" --host 127.0.0.1 --port "$port" --log-level WARNING \
        >"$work/metadata.log" 2>&1 &
    pids+=($!)
    metadata="http://127.0.0.1:$port/metadata"
    until (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do sleep 0.2; done
else
    metadata="P2PHANDSHAKE"
fi

# Mooncake's target, serving for the whole run.
mc_name="127.0.0.1:$(free_port)"
env "${mooncake_env[@]}" "$te_bench" --mode target --protocol tcp --metadata_server "$metadata" \
    --local_server_name "$mc_name" --device_name "" --buffer_size "$buffer" >"$work/mc-target.log" 2>&1 &
pids+=($!)
if [[ "$mode" == http ]]; then
    wait_line "$work/mc-target.log" "TcpTransport: listen on port" >/dev/null
else
    # P2P: the segment name is host:<actual RPC port>, printed by the target.
    mc_name="$(wait_line "$work/mc-target.log" "listening on 127\.0\.0\.1:[0-9]+" | grep -oE "127\.0\.0\.1:[0-9]+$")"
fi

# aiv's target as its own process (http, p2p); in-process mode runs both engines inside `aiv bench`.
aiv_segment=()
if [[ "$mode" == http || "$mode" == p2p ]]; then
    "$aiv" bench --mode target --protocol tcp --metadata_server "$metadata" \
        --local_server_name "127.0.0.1:$(free_port)" --buffer_size "$buffer" --duration 3600 >"$work/aiv-target.log" 2>&1 &
    pids+=($!)
    # The name peers open, as the target prints it (under P2PHANDSHAKE it may differ from the one given).
    aiv_name="$(wait_line "$work/aiv-target.log" "aiv bench target: segment" | awk '{print $5}')"
    aiv_segment=(--metadata_server "$metadata" --segment_id "$aiv_name" --local_server_name "127.0.0.1:$(free_port)")
fi

throughput() { grep -oE "Test completed: .*throughput [0-9.]+ GB/s" | grep -oE "[0-9.]+ GB/s$" | cut -d' ' -f1; }

echo "tcp on loopback: $threads threads, batch $batch, ${duration}s per run, buffer $buffer B, aiv mode $mode, Mooncake metadata ${metadata%%:*}"
printf "%-8s %-9s %12s %12s %8s\n" operation block aiv_GB/s mooncake_GB/s ratio
for block in $blocks; do
    for operation in $operations; do
        flags=("${common[@]}" --operation "$operation" --block_size "$block")
        aiv_out="$("$aiv" bench "${flags[@]}" "${aiv_segment[@]}" 2>&1)" || { echo "$aiv_out" >&2; exit 1; }
        aiv_gbps="$(throughput <<<"$aiv_out")"
        mc_out="$(env "${mooncake_env[@]}" "$te_bench" --mode initiator "${flags[@]}" --metadata_server "$metadata" \
            --local_server_name "127.0.0.1:$(free_port)" --device_name "" --segment_id "$mc_name" 2>&1)" \
            || { echo "$mc_out" >&2; exit 1; }
        mc_gbps="$(throughput <<<"$mc_out")"
        ratio="$(awk -v a="$aiv_gbps" -v m="$mc_gbps" 'BEGIN { if (m > 0) printf "%.2fx", a / m; else print "n/a" }')"
        printf "%-8s %-9s %12s %12s %8s\n" "$operation" "$block" "$aiv_gbps" "$mc_gbps" "$ratio"
    done
done
