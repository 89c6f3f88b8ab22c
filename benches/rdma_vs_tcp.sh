#!/usr/bin/env bash
# The aiv RDMA route against tcp between two hosts: two network namespaces joined by one veth pair, an `aiv bench`
# target in one and the initiator in the other, the same flags for both protocols, rounds alternating tcp and aiv.
# Prints, per block size, each protocol's median bandwidth and Host CPU per transfer (whole process, the twin's
# device threads excluded), and the ratios aiv/tcp against the bar aiv is held to: bandwidth >= 0.8x tcp's (both are
# bandwidth-bound at 1 MiB) and Host CPU per transfer <= 0.1x tcp's (aiv's kernel, not the Host, builds and submits
# the transfers).
#
# Twin runtime: the RDMA route runs on the twin NIC (a CPU model carried over TCP between the namespaces), so these
# are figures of the model on this machine, unverified on hardware. Needs root (ip netns) and a release build
# (cargo build --release). docs/multihost.md.
#
#   sudo bash benches/rdma_vs_tcp.sh                 # 1 MiB and 64 KiB, 3 rounds of 3 s per protocol
#   ROUNDS=5 SECONDS_PER_RUN=5 SIZES="1048576" bash benches/rdma_vs_tcp.sh
#   OPERATION=read sudo bash benches/rdma_vs_tcp.sh  # RDMA READ (the audit's --cross-host measures both)
set -euo pipefail

AIV=${AIV:-target/release/aiv}
ROUNDS=${ROUNDS:-3}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-3}
SIZES=${SIZES:-"1048576 65536"}
BATCH=${BATCH:-8}
THREADS=${THREADS:-2}
BUFFER=${BUFFER:-268435456}
OPERATION=${OPERATION:-write}
case "$OPERATION" in write | read) ;; *) echo "rdma_vs_tcp: OPERATION must be write or read, not $OPERATION" >&2; exit 2 ;; esac

[ "$(id -u)" = 0 ] || { echo "rdma_vs_tcp: needs root (network namespaces)" >&2; exit 2; }
command -v ip >/dev/null || { echo "rdma_vs_tcp: needs ip (Debian package iproute2)" >&2; exit 2; }
[ -x "$AIV" ] || { echo "rdma_vs_tcp: $AIV not found: run cargo build --release first" >&2; exit 2; }
command -v python3 >/dev/null || { echo "rdma_vs_tcp: needs python3 to read the JSON results" >&2; exit 2; }

tag="aivrt$$"
ns_a="$tag-a"
ns_b="$tag-b"
addr_a=10.233.7.1
addr_b=10.233.7.2
work=$(mktemp -d)
target_pid=""

cleanup() {
    if [ -n "$target_pid" ]; then kill "$target_pid" 2>/dev/null || true; wait "$target_pid" 2>/dev/null || true; fi
    # Whatever still runs in the namespaces goes with them.
    for ns in "$ns_a" "$ns_b"; do
        ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
        ip netns del "$ns" 2>/dev/null || true
    done
    rm -rf "$work"
}
trap cleanup EXIT INT TERM

ip netns add "$ns_a"
ip netns add "$ns_b"
ip link add "$tag-va" type veth peer name "$tag-vb"
ip link set "$tag-va" netns "$ns_a"
ip link set "$tag-vb" netns "$ns_b"
ip -n "$ns_a" addr add "$addr_a/24" dev "$tag-va"
ip -n "$ns_b" addr add "$addr_b/24" dev "$tag-vb"
for ns in "$ns_a" "$ns_b"; do
    ip -n "$ns" link set lo up
done
ip -n "$ns_a" link set "$tag-va" up
ip -n "$ns_b" link set "$tag-vb" up

# Starts a target of protocol $1 in namespace b; sets target_pid and segment (its segment name). Called directly,
# not in a command substitution: a subshell's target_pid would be lost, and the target never stopped.
start_target() {
    local proto=$1 log="$work/target-$1.log"
    ip netns exec "$ns_b" env -u MOONCAKE_CONFIG_PATH "$AIV" bench --mode target --protocol "$proto" \
        --metadata_server P2PHANDSHAKE --local_server_name "$addr_b" --buffer_size "$BUFFER" >"$log" 2>&1 &
    target_pid=$!
    for _ in $(seq 1 200); do
        if grep -q "serving" "$log"; then
            segment=$(sed -n 's/.*segment \([^ ]*\) serving.*/\1/p' "$log" | head -1)
            return 0
        fi
        kill -0 "$target_pid" 2>/dev/null || break
        sleep 0.1
    done
    echo "rdma_vs_tcp: the $proto target did not start:" >&2
    cat "$log" >&2
    return 1
}

stop_target() {
    kill "$target_pid" 2>/dev/null || true
    wait "$target_pid" 2>/dev/null || true
    target_pid=""
}

# One initiator run: prints "<bytes per second> <process Host CPU ns per transfer> <failed batches>".
run_initiator() {
    local proto=$1 segment=$2 size=$3 out="$work/run.json"
    ip netns exec "$ns_a" env -u MOONCAKE_CONFIG_PATH timeout $((SECONDS_PER_RUN + 60)) "$AIV" bench \
        --protocol "$proto" --metadata_server P2PHANDSHAKE --local_server_name "$addr_a" --segment_id "$segment" \
        --operation "$OPERATION" --block_size "$size" --batch_size "$BATCH" --threads "$THREADS" \
        --buffer_size "$BUFFER" --duration "$SECONDS_PER_RUN" --json >"$out" 2>"$work/run.err" || {
        echo "rdma_vs_tcp: the $proto initiator failed:" >&2
        cat "$work/run.err" >&2
        return 1
    }
    python3 - "$out" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
r, t = d["result"], d["evidence"]["per_transfer"]
cpu = t.get("process_host_cpu_ns")
print(r["bytes_per_second"], cpu if cpu is not None else "nan", r["failed_batches"])
EOF
}

echo "rdma_vs_tcp: $ROUNDS rounds of ${SECONDS_PER_RUN} s per protocol and size, batch $BATCH, $THREADS threads," \
    "${OPERATION^^}, namespaces $ns_a ($addr_a) -> $ns_b ($addr_b) over one veth pair; twin runtime"
results="$work/results"
: >"$results"
for size in $SIZES; do
    for round in $(seq 1 "$ROUNDS"); do
        for proto in tcp aiv; do
            start_target "$proto"
            line=$(run_initiator "$proto" "$segment" "$size")
            stop_target
            echo "  size $size round $round $proto: $line"
            echo "$size $proto $line" >>"$results"
        done
    done
done

python3 - "$results" <<'EOF'
import statistics, sys
rows = [line.split() for line in open(sys.argv[1]) if line.strip()]
for size in dict.fromkeys(r[0] for r in rows):
    med = {}
    for proto in ("tcp", "aiv"):
        bw = [float(r[2]) for r in rows if r[0] == size and r[1] == proto]
        cpu = [float(r[3]) for r in rows if r[0] == size and r[1] == proto]
        failed = sum(int(r[4]) for r in rows if r[0] == size and r[1] == proto)
        med[proto] = (statistics.median(bw), statistics.median(cpu), failed)
        print(f"size {size} {proto}: {med[proto][0] / 1e9:.3f} GB/s, Host CPU {med[proto][1] / 1e3:.1f} us per transfer"
              f" (whole process), failed batches {failed}")
    bw_ratio = med["aiv"][0] / med["tcp"][0]
    cpu_ratio = med["aiv"][1] / med["tcp"][1]
    print(f"size {size} aiv/tcp: bandwidth {bw_ratio:.2f} (bar >= 0.8: {'met' if bw_ratio >= 0.8 else 'NOT met'}),"
          f" Host CPU {cpu_ratio:.3f} (bar <= 0.1: {'met' if cpu_ratio <= 0.1 else 'NOT met'})")
EOF
