#!/usr/bin/env bash
# Instructions per proxied request, counted by callgrind: a deterministic before/after measure
# for small changes to the hot path, where timed runs on a shared machine are too noisy.
#
#   loadtest/instructions.sh [--requests N] [--cache] [--ll BYTES] [--modes LIST] [--keep DIR]
#                            TARGET...
#
# A TARGET is a ringway binary, or `nginx` or `haproxy` (one process with one worker thread
# each; the essentials of the timed run's configs: upstream keep-alive, no access log). For
# each target and each mode (HTTP/1.1 keep-alive GET /, 16 connections; h2c GET /, 16
# connections x 10 streams; https, asked for with --modes: HTTP/1.1 keep-alive GET / over TLS,
# 16 connections, the same certificate for every target) it starts the project's origin and the target under callgrind
# (ringway on the epoll driver: valgrind does not follow io_uring), warms up with 2,000
# requests, then counts the user-space instructions of the next N (default 20,000) and prints
# them per request, with the share spent in memcpy/memmove. Kernel time is not counted.
# --cache adds callgrind's cache and branch model (about twice as slow): per request, misses
# in the L1 instruction cache, the L1 data cache (reads + writes) and the last level, and
# mispredicted conditional + indirect branches. A model (no prefetcher, the host's cache
# sizes), for comparing targets and builds, not a measurement of the CPU.
# --keep DIR keeps each run's callgrind dump as DIR/<target>-<mode>.out, for
# `callgrind_annotate --inclusive=yes --tree=none FILE` (where the instructions go).
# --ll BYTES sets the model's last level (16-way, 64-byte lines) to BYTES: 1048576 models a
# 1 MiB L2, the level whose misses grow with the streams in flight (each stream's state is
# cold by the time it runs again). --modes picks the modes (default "h1 h2c"); h2c64 is h2c
# at 64 connections x 10 streams.
#
# Read it as a ratio between targets measured the same way, not as a cost: valgrind counts each
# byte of a `rep movsb` copy as one instruction, so large copies weigh more here than on the
# CPU; and it says nothing of the kernel's share, which the proxies pay about alike.
set -euo pipefail
cd "$(dirname "$0")/.."
source loadtest/lib.sh

N=20000
CACHE=
LL=
MODES="h1 h2c"
KEEP=
while [ $# -gt 0 ]; do
    case $1 in
        --requests) N=$2; shift 2 ;;
        --cache) CACHE=1; shift ;;
        --ll) LL=$2; shift 2 ;;
        --modes) MODES=$2; shift 2 ;;
        --keep) KEEP=$2; shift 2 ;;
        *) break ;;
    esac
done
[ $# -ge 1 ] || { sed -n 2,28p "$0"; exit 2; }
sim=()
[ -n "$CACHE" ] && sim=(--cache-sim=yes --branch-sim=yes)
[ -n "$CACHE" ] && [ -n "$LL" ] && sim+=(--LL="$LL",16,64)

need=()
command -v valgrind >/dev/null || need+=(valgrind)
command -v h2load >/dev/null || need+=(nghttp2-client)
for t in "$@"; do
    case $t in
        nginx) command -v nginx >/dev/null || need+=(nginx-light) ;;
        haproxy) command -v haproxy >/dev/null || need+=(haproxy) ;;
    esac
done
if [ ${#need[@]} -gt 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
[ -x target/release/examples/origin ] || cargo build --release --example origin

WORK=$(mktemp -d)
chmod 755 "$WORK" # nginx's unprivileged worker writes its temporary files under it
PORT=18091
ORIGIN_PORT=19091
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT

TLS_PORT=$((PORT + 2))
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
    -subj /CN=localhost -addext subjectAltName=DNS:localhost \
    -keyout "$WORK/key.pem" -out "$WORK/cert.pem" 2>/dev/null
cat "$WORK/cert.pem" "$WORK/key.pem" >"$WORK/both.pem"
{
    ringway_config "$PORT" "$ORIGIN_PORT"
    printf '\n[[listeners]]\naddress = "127.0.0.1:%s"\n[listeners.tls]\ncert = "%s"\nkey = "%s"\nstrict_sni = false\n' \
        "$TLS_PORT" "$WORK/cert.pem" "$WORK/key.pem"
} >"$WORK/ringway.toml"

# One process each, in the foreground: callgrind counts the process it started.
cat >"$WORK/nginx.conf" <<EOF
worker_processes 1;
daemon off;
master_process off;
pid $WORK/nginx.pid;
error_log $WORK/nginx-error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 1000000;
  client_body_temp_path $WORK/nginx-body;
  proxy_temp_path $WORK/nginx-proxy;
  upstream origin { server 127.0.0.1:$ORIGIN_PORT; keepalive 1024; keepalive_requests 1000000; }
  server {
    listen 127.0.0.1:$PORT;
    location / { proxy_pass http://origin; proxy_http_version 1.1; proxy_set_header Connection ""; }
  }
  server {
    listen 127.0.0.1:$((PORT + 1)) http2;
    location / { proxy_pass http://origin; proxy_http_version 1.1; proxy_set_header Connection ""; }
  }
  server {
    listen 127.0.0.1:$TLS_PORT ssl;
    ssl_certificate $WORK/cert.pem;
    ssl_certificate_key $WORK/key.pem;
    location / { proxy_pass http://origin; proxy_http_version 1.1; proxy_set_header Connection ""; }
  }
}
EOF
cat >"$WORK/haproxy.cfg" <<EOF
global
  nbthread 1
  maxconn 4096
defaults
  mode http
  option http-keep-alive
  http-reuse always
  timeout connect 5s
  timeout client 60s
  timeout server 60s
frontend f
  bind 127.0.0.1:$PORT
  bind 127.0.0.1:$((PORT + 1)) proto h2
  bind 127.0.0.1:$TLS_PORT ssl crt $WORK/both.pem alpn http/1.1
  default_backend b
backend b
  server origin 127.0.0.1:$ORIGIN_PORT
EOF
mkdir -p "$WORK/nginx-body" "$WORK/nginx-proxy"

target/release/examples/origin "127.0.0.1:$ORIGIN_PORT" >/dev/null 2>&1 &
pids+=($!)

wait_port "$ORIGIN_PORT"

load() { # mode count port
    case $1 in
        h1) h2load -t1 -c16 --h1 -n "$2" "http://127.0.0.1:$3/" ;;
        h2c) h2load -t1 -c16 -m10 -n "$2" "http://127.0.0.1:$3/" ;;
        h2c64) h2load -t1 -c64 -m10 -n "$2" "http://127.0.0.1:$3/" ;;
        https) h2load -t1 -c16 --h1 -n "$2" "https://127.0.0.1:$3/" ;;
    esac
}

if [ -n "$CACHE" ]; then
    printf '%-40s %-5s %12s %12s %9s %9s %7s %11s\n' target mode instr/req memcpy \
        L1i-miss L1d-miss LL-miss mispredict
else
    printf '%-40s %-5s %12s %12s\n' target mode instr/req memcpy
fi
for bin in "$@"; do
    case $bin in
        nginx) cmd=(nginx -c "$WORK/nginx.conf" -p "$WORK") ;;
        haproxy) cmd=(haproxy -db -f "$WORK/haproxy.cfg") ;;
        *) cmd=("$bin" --config "$WORK/ringway.toml") ;;
    esac
    for mode in $MODES; do
        rm -f "$WORK"/cg.*
        # ringway serves h2c on its HTTP/1.1 port (told apart by the preface); the others on
        # a port of their own.
        port=$PORT
        case $bin in nginx | haproxy) [ "$mode" != h1 ] && port=$((PORT + 1)) ;; esac
        [ "$mode" = https ] && port=$TLS_PORT
        MONOIO_FORCE_LEGACY_DRIVER=1 RUST_LOG=warn valgrind --tool=callgrind --instr-atstart=no \
            "${sim[@]}" --callgrind-out-file="$WORK/cg.%p" "${cmd[@]}" \
            >/dev/null 2>"$WORK/valgrind.log" &
        rp=$!
        pids+=($rp)
        if ! wait_port "$port"; then
            tail -n 20 "$WORK/valgrind.log" "$WORK/nginx-error.log" >&2 2>/dev/null || true
            exit 1
        fi
        load "$mode" 2000 "$port" >/dev/null
        callgrind_control -i on "$rp" >/dev/null 2>&1
        out=$(load "$mode" "$N" "$port")
        callgrind_control -i off "$rp" >/dev/null 2>&1
        callgrind_control -d "$rp" >/dev/null 2>&1
        kill "$rp"
        wait "$rp" 2>/dev/null || true
        pids=("${pids[0]}") # the origin's; a reaped PID is not killed again at exit
        if ! grep -q "^requests: $N total, $N started, $N done, $N succeeded" <<<"$out"; then
            echo "$bin $mode: not every request succeeded:" >&2
            grep "^requests:" <<<"$out" >&2
            exit 1
        fi
        # The dump taken while the requests ran (the file with a part number).
        dump=$(ls "$WORK"/cg.*.1)
        if [ -n "$KEEP" ]; then
            mkdir -p "$KEEP"
            cp "$dump" "$KEEP/$(basename "$bin")-$mode.out"
        fi
        report=$(callgrind_annotate --inclusive=no --tree=none "$dump" 2>/dev/null)
        total=$(awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1; exit}' <<<"$report")
        copy=$(awk '/__mem(cpy|move)_[a-z0-9_]+ \[/ {gsub(",", "", $1); s += $1} END {print s + 0}' <<<"$report")
        share=$(awk -v c="$copy" -v t="$total" 'BEGIN {print 100 * c / t}')
        if [ -z "$CACHE" ]; then
            printf '%-40s %-5s %12d %11.1f%%\n' "$bin" "$mode" $((total / N)) "$share"
            continue
        fi
        # The model's totals, in the order asked for, per request.
        events=I1mr,D1mr,D1mw,ILmr,DLmr,DLmw,Bcm,Bim
        read -r i1 d1r d1w llI llR llW bc bi < <(callgrind_annotate --show=$events "$dump" \
            2>/dev/null | awk '/PROGRAM TOTALS/ {
                for (i = 1; i <= NF; i++) if ($i ~ /^[0-9,]+$/) { gsub(",", "", $i); printf "%s ", $i }
                print ""; exit }')
        printf '%-40s %-5s %12d %11.1f%% %9d %9d %7d %11d\n' "$bin" "$mode" $((total / N)) \
            "$share" $((i1 / N)) $(((d1r + d1w) / N)) $(((llI + llR + llW) / N)) \
            $(((bc + bi) / N))
    done
done
