#!/usr/bin/env bash
# A throw-away etcd on loopback for the etcd metadata tests.
#
#   tests/support/etcd.sh start   installs Debian's etcd-server if `etcd` is missing, starts etcd on 127.0.0.1 with
#                                 free client and peer ports and a temporary data dir, and prints the endpoint
#                                 (127.0.0.1:PORT) as its last line. Starting again while it runs prints the same
#                                 endpoint.
#   tests/support/etcd.sh stop    stops it and deletes its data dir.
#
# Use it as:  export AIV_TEST_ETCD="$(tests/support/etcd.sh start | tail -n 1)"; cargo test; tests/support/etcd.sh stop
# State (pid, endpoint, log, data) lives in $AIV_ETCD_STATE_DIR (default: $TMPDIR/aiv-test-etcd).
set -euo pipefail

state_dir="${AIV_ETCD_STATE_DIR:-${TMPDIR:-/tmp}/aiv-test-etcd}"
pid_file="$state_dir/pid"
endpoint_file="$state_dir/endpoint"

log() { echo "etcd.sh: $*" >&2; }

running() {
    [[ -f "$pid_file" ]] && kill -0 "$(cat "$pid_file")" 2>/dev/null
}

port_in_use() {
    # A connect that succeeds means something listens there.
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

free_port() {
    local port tries=0
    while ((tries < 200)); do
        port=$((20000 + RANDOM % 20000))
        if ! port_in_use "$port"; then
            echo "$port"
            return 0
        fi
        tries=$((tries + 1))
    done
    log "no free port found on 127.0.0.1"
    return 1
}

install_etcd() {
    if command -v etcd >/dev/null 2>&1; then
        return 0
    fi
    log "etcd is missing: installing Debian's etcd-server"
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server >&2
    command -v etcd >/dev/null 2>&1 || { log "etcd-server installed but no etcd on PATH"; return 1; }
}

start() {
    if running; then
        cat "$endpoint_file"
        return 0
    fi
    install_etcd
    rm -rf "$state_dir"
    mkdir -p "$state_dir/data"
    local client_port peer_port
    client_port="$(free_port)"
    peer_port="$(free_port)"
    while [[ "$peer_port" == "$client_port" ]]; do peer_port="$(free_port)"; done
    local client_url="http://127.0.0.1:$client_port" peer_url="http://127.0.0.1:$peer_port"
    nohup etcd --name aiv-test --data-dir "$state_dir/data" \
        --listen-client-urls "$client_url" --advertise-client-urls "$client_url" \
        --listen-peer-urls "$peer_url" --initial-advertise-peer-urls "$peer_url" \
        --initial-cluster "aiv-test=$peer_url" --initial-cluster-state new \
        >"$state_dir/etcd.log" 2>&1 </dev/null &
    echo $! >"$pid_file"
    # Wait (at most 15 s) until the client port answers.
    local waited=0
    until port_in_use "$client_port"; do
        if ! running; then
            log "etcd exited at start; its log:"
            cat "$state_dir/etcd.log" >&2
            return 1
        fi
        if ((waited >= 150)); then
            log "etcd did not listen on $client_url within 15 s"
            stop
            return 1
        fi
        sleep 0.1
        waited=$((waited + 1))
    done
    echo "127.0.0.1:$client_port" >"$endpoint_file"
    log "etcd runs at $client_url (pid $(cat "$pid_file"), log $state_dir/etcd.log)"
    cat "$endpoint_file"
}

stop() {
    if running; then
        local pid
        pid="$(cat "$pid_file")"
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 50); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -9 "$pid" 2>/dev/null || true
        log "etcd (pid $pid) stopped"
    fi
    rm -rf "$state_dir"
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    *)
        echo "usage: $0 start|stop" >&2
        exit 2
        ;;
esac
