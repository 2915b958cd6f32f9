#!/usr/bin/env bash
# How much of each large task's future a run writes: the lines of a stream's (or a
# connection's) state that have to come back into the caches each time it runs again.
#
#   loadtest/footprint.sh [--requests N] [COMMIT]
#
# Builds ringway with the `footprint` feature (into target/footprint; COMMIT, when given, from
# a worktree of that commit, which must have the feature: e26fbe1 or later), starts the
# project's origin, and runs three loads, each against a ringway of its own: h2c GET (16
# connections x 10 streams, N requests, default 40,000), h2c POST of a small body, and HTTP/1.1
# GET (16 keep-alive connections for 3 s). When each ringway stops, it prints per future type
# the lines its tasks wrote (the mean over every task of the type) and a map of the future's
# lines: `#` written by at least three tasks in four, `+` by a quarter to three quarters, `,`
# by fewer, `.` by none. Deterministic to within a line for a given build and load: a measure
# for changes to the futures' layout, where timed runs are noise. The marker fill costs a
# memset per 4-16 KiB allocation: never time this build.
set -euo pipefail
cd "$(dirname "$0")/.."
source loadtest/lib.sh

N=40000
while [ $# -gt 0 ]; do
    case $1 in
        --requests) N=$2; shift 2 ;;
        -h|--help) sed -n 2,18p "$0"; exit 0 ;;
        *) break ;;
    esac
done
COMMIT=${1:-}

need=()
command -v h2load >/dev/null || need+=(nghttp2-client)
command -v wrk >/dev/null || need+=(wrk)
if [ ${#need[@]} -gt 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
[ -x target/release/examples/origin ] || cargo build --release --example origin

WORK=$(mktemp -d)
PORT=18191
ORIGIN_PORT=19191
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    if [ -n "$COMMIT" ]; then git worktree remove --force "$WORK/src" 2>/dev/null || true; fi
    rm -rf "$WORK"
}
trap cleanup EXIT

ROOT=$PWD
SRC=$ROOT
if [ -n "$COMMIT" ]; then
    git worktree add -q --detach "$WORK/src" "$COMMIT"
    SRC=$WORK/src
fi
(cd "$SRC" && CARGO_TARGET_DIR="$ROOT/target/footprint" \
    cargo build --release --features footprint -q)
BIN=$ROOT/target/footprint/release/ringway

ringway_config "$PORT" "$ORIGIN_PORT" >"$WORK/ringway.toml"

target/release/examples/origin "127.0.0.1:$ORIGIN_PORT" >/dev/null 2>&1 &
pids+=($!)
wait_port "$ORIGIN_PORT"
printf 'x%.0s' $(seq 1 200) >"$WORK/body"

# One ringway per load, so that each one's figures are its own: the last report of each
# future type, printed when the load is over and ringway has stopped.
phase() {
    local name=$1
    shift
    "$BIN" --config "$WORK/ringway.toml" 2>"$WORK/ringway.err" &
    local pid=$!
    pids+=("$pid")
    wait_port "$PORT"
    "$@" >/dev/null
    kill -TERM "$pid"
    wait "$pid" 2>/dev/null || true
    echo "== $name"
    awk '/^footprint: / { key = $0; sub(/: [0-9]+ bytes.*/, "", key); head[key] = $0; next }
         /^footprint map: / {
             map[key] = $0
             if (!(key in seen)) { seen[key] = 1; order[++n] = key }
         }
         END { for (i = 1; i <= n; i++) print head[order[i]] "\n" map[order[i]] }' \
        "$WORK/ringway.err"
}

echo "footprint of ${COMMIT:-the working tree}"
phase "h2c GET, 16 connections x 10 streams, $N requests" \
    h2load -c 16 -m 10 -n "$N" "http://127.0.0.1:$PORT/"
phase "h2c POST of 200 bytes, 16 connections x 10 streams, $N requests" \
    h2load -c 16 -m 10 -n "$N" -d "$WORK/body" "http://127.0.0.1:$PORT/"
phase "HTTP/1.1 GET, 16 keep-alive connections for 3 s" \
    wrk -t 1 -c 16 -d 3s "http://127.0.0.1:$PORT/"
