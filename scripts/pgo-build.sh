#!/usr/bin/env bash
# A profile-guided (PGO) release build of ringway: the way to build the binary you run.
#
#   scripts/pgo-build.sh [OUT]        # default OUT: target/pgo/ringway; about 8 minutes
#
# 1. Builds an instrumented ringway (target/pgo-gen).
# 2. Trains it for about 35 s on loopback, with the project's origin and the load test's config
#    (loadtest/ringway.toml, one worker): HTTP/1.1 keep-alive, h2c, HTTPS and HTTP/2 over TLS
#    with small bodies, 1 MiB bodies, and a new connection (and TLS handshake) per request.
# 3. Builds ringway again with that profile (target/pgo-use): the compiler lays out and inlines
#    the code for the paths the training took. The result is copied to OUT.
#
# Measured (loadtest/instructions.sh, callgrind): 0.87x the instructions per proxied HTTP/1.1
# request of a plain `cargo build --release` and 0.81x per h2c request (loadtest/RESULTS.md).
# Needs llvm-profdata from rustup's llvm-tools component (installed when missing) and h2load,
# wrk and openssl (installed with apt-get when missing).
set -euo pipefail
cd "$(dirname "$0")/.."
source loadtest/lib.sh
OUT=${1:-target/pgo/ringway}

sysroot=$(rustc --print sysroot)
profdata() { ls "$sysroot"/lib/rustlib/*/bin/llvm-profdata 2>/dev/null | head -1; }
if [ -z "$(profdata)" ]; then
    rustup component add llvm-tools-preview >/dev/null
fi
PROFDATA=$(profdata)
[ -n "$PROFDATA" ] || { echo "llvm-profdata not found: rustup component add llvm-tools-preview" >&2; exit 1; }
need=()
command -v h2load >/dev/null || need+=(nghttp2-client)
command -v wrk >/dev/null || need+=(wrk)
command -v openssl >/dev/null || need+=(openssl)
if [ ${#need[@]} -gt 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

WORK=$(mktemp -d /tmp/ringway-pgo.XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT

echo "== instrumented build (target/pgo-gen)"
RUSTFLAGS="${RUSTFLAGS:-} -Cprofile-generate=$WORK/build-profiles" CARGO_TARGET_DIR=target/pgo-gen \
    cargo build --release --locked --bin ringway
cargo build --release --locked --example origin

echo "== training"
PORT=18371
TLS_PORT=18373
ORIGIN=127.0.0.1:19371
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 \
    -subj "/CN=localhost" -keyout "$WORK/key.pem" -out "$WORK/cert.pem" >/dev/null 2>&1
cpu=$(($(nproc) > 1 ? 1 : 0))
sed -e "s|{PORT}|$PORT|g; s|{TLS_PORT}|$TLS_PORT|g; s|{ORIGIN}|$ORIGIN|g" \
    -e "s|{CPU}|$cpu|g; s|{WORK}|$WORK|g" loadtest/ringway.toml >"$WORK/ringway.toml"
target/release/examples/origin "$ORIGIN" >/dev/null 2>&1 &
pids+=($!)
LLVM_PROFILE_FILE="$WORK/train/ringway-%p.profraw" \
    target/pgo-gen/release/ringway --config "$WORK/ringway.toml" >"$WORK/ringway.log" 2>&1 &
ringway=$!
pids+=($ringway)
for port in "${ORIGIN##*:}" "$PORT" "$TLS_PORT"; do
    wait_port "$port"
done
http=http://127.0.0.1:$PORT
https=https://127.0.0.1:$TLS_PORT
run() { "$@" >"$WORK/load.log" 2>&1 || { cat "$WORK/load.log" >&2; exit 1; }; }
run h2load -t1 -c64 --h1 -D 6 "$http/"
run h2load -t1 -c16 -m10 -D 6 "$http/"
run wrk -t1 -c64 -d5s "$https/"
run h2load -t1 -c16 -m10 -D 5 "$https/"
run h2load -t1 -c16 --h1 -D 4 "$http/1m"
run h2load -t1 -c16 -m10 -D 3 "$http/1m"
run wrk -t1 -c64 -d3s -H "Connection: close" "$http/"
run wrk -t1 -c16 -d3s -H "Connection: close" "$https/"
# The profile is written when ringway exits (SIGTERM drains, then exits).
kill -TERM "$ringway"
wait "$ringway" || true
"$PROFDATA" merge -o "$WORK/ringway.profdata" "$WORK"/train/ringway-*.profraw

echo "== optimized build (target/pgo-use)"
RUSTFLAGS="${RUSTFLAGS:-} -Cprofile-use=$WORK/ringway.profdata" \
    CARGO_TARGET_DIR=target/pgo-use cargo build --release --locked --bin ringway
mkdir -p "$(dirname "$OUT")"
cp target/pgo-use/release/ringway "$OUT"
echo "profile-guided build: $OUT"
