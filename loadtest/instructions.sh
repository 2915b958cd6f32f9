#!/usr/bin/env bash
# Instructions per proxied request, counted by callgrind: a deterministic before/after measure
# for small changes to the hot path, where timed runs on a shared machine are too noisy.
#
#   loadtest/instructions.sh [--requests N] BINARY [BINARY...]
#
# For each binary and each mode (HTTP/1.1 keep-alive GET /, 16 connections; h2c GET /, 16
# connections x 10 streams) it starts the project's origin and the binary under callgrind on the
# epoll driver (valgrind does not follow io_uring), warms up with 2,000 requests, then counts
# the user-space instructions of the next N (default 20,000) and prints them per request, with
# the share spent in memcpy/memmove. Kernel time is not counted.
#
# Read it as a ratio between builds measured the same way, not as a cost: valgrind counts each
# byte of a `rep movsb` copy as one instruction, so large copies weigh more here than on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."

N=20000
if [ "${1:-}" = "--requests" ]; then
    N=$2
    shift 2
fi
[ $# -ge 1 ] || { sed -n 2,13p "$0"; exit 2; }

need=()
command -v valgrind >/dev/null || need+=(valgrind)
command -v h2load >/dev/null || need+=(nghttp2-client)
if [ ${#need[@]} -gt 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
[ -x target/release/examples/origin ] || cargo build --release --example origin

WORK=$(mktemp -d)
PORT=18091
ORIGIN_PORT=19091
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT

cat >"$WORK/ringway.toml" <<EOF
workers = 1
log_level = "warn"

[[listeners]]
address = "127.0.0.1:$PORT"

[[upstreams]]
name = "origin"
endpoints = ["127.0.0.1:$ORIGIN_PORT"]
pool_max_idle = 1024

[[routes]]
path_prefix = "/"
proxy = "origin"
EOF

target/release/examples/origin "127.0.0.1:$ORIGIN_PORT" >/dev/null 2>&1 &
pids+=($!)

wait_port() {
    for _ in $(seq 1 200); do
        (echo >"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
        sleep 0.1
    done
    echo "nothing listens on port $1" >&2
    return 1
}
wait_port "$ORIGIN_PORT"

load() { # mode count
    case $1 in
        h1) h2load -t1 -c16 --h1 -n "$2" "http://127.0.0.1:$PORT/" ;;
        h2c) h2load -t1 -c16 -m10 -n "$2" "http://127.0.0.1:$PORT/" ;;
    esac
}

printf '%-40s %-5s %12s %12s\n' binary mode instr/req memcpy
for bin in "$@"; do
    for mode in h1 h2c; do
        rm -f "$WORK"/cg.*
        MONOIO_FORCE_LEGACY_DRIVER=1 RUST_LOG=warn valgrind --tool=callgrind --instr-atstart=no \
            --callgrind-out-file="$WORK/cg.%p" "$bin" --config "$WORK/ringway.toml" \
            >/dev/null 2>"$WORK/valgrind.log" &
        rp=$!
        pids+=($rp)
        wait_port "$PORT"
        load "$mode" 2000 >/dev/null
        callgrind_control -i on "$rp" >/dev/null 2>&1
        out=$(load "$mode" "$N")
        callgrind_control -i off "$rp" >/dev/null 2>&1
        callgrind_control -d "$rp" >/dev/null 2>&1
        kill "$rp"
        wait "$rp" 2>/dev/null || true
        if ! grep -q "^requests: $N total, $N started, $N done, $N succeeded" <<<"$out"; then
            echo "$bin $mode: not every request succeeded:" >&2
            grep "^requests:" <<<"$out" >&2
            exit 1
        fi
        # The dump taken while the requests ran (the file with a part number).
        dump=$(ls "$WORK"/cg.*.1)
        report=$(callgrind_annotate --inclusive=no --tree=none "$dump" 2>/dev/null)
        total=$(awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1; exit}' <<<"$report")
        copy=$(awk '/__mem(cpy|move)_[a-z0-9_]+ \[/ {gsub(",", "", $1); s += $1} END {print s + 0}' <<<"$report")
        printf '%-40s %-5s %12d %11.1f%%\n' "$bin" "$mode" $((total / N)) \
            "$(awk -v c="$copy" -v t="$total" 'BEGIN {print 100 * c / t}')"
    done
done
