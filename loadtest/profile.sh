#!/usr/bin/env bash
# Where a proxy's CPU time goes under load, sampled: kernel against user space, CPU time per
# request split the same way, and the hottest functions.
#
#   loadtest/profile.sh [--seconds S] [--connections N] [--graph] TARGET MODE [BINARY]
#
# TARGET is ringway, nginx or haproxy; MODE is h1 (GET /, N keep-alive connections, default 64;
# run.sh's small16, small64 and small256 are N = 16, 64, 256), h2c (GET /, N connections x 10
# streams, default 16: run.sh's h2c16x10; 64 is its h2c64x10) or paced (GET /, 64 keep-alive
# connections held at RATE requests/s by oha, default 3300: run.sh's unsaturated scenario); BINARY
# is the ringway to run (default target/release/ringway). The pinning is run.sh's: load generator
# and origin on CPU 0, the proxy alone on CPU 1, one worker. The proxy's process is sampled with
# `perf record -e cpu-clock` (the software clock: it works on virtual machines without hardware
# counters) for S seconds (default 5) in the middle of a load of S + 4 seconds.
#
# --graph records call chains too and adds the functions by time spent in them and in what
# they called (how the kernel's share divides: sends, receives, the ring's own work).
#
# Read it beside another target's or build's profile taken minutes apart, as ratios: perf's
# own overhead inflates the absolute figures, and this machine's speed drifts over the day.
set -euo pipefail
cd "$(dirname "$0")/.."
source loadtest/lib.sh

SECONDS_SAMPLED=5
CONNS=64
GRAPH=
while [ $# -gt 0 ]; do
    case $1 in
        --seconds) SECONDS_SAMPLED=$2; shift 2 ;;
        --connections) CONNS=$2; CONNS_SET=$2; shift 2 ;;
        --graph) GRAPH=-g; shift ;;
        *) break ;;
    esac
done
[ $# -ge 2 ] || { sed -n 2,20p "$0"; exit 2; }
TARGET=$1
MODE=$2
BIN=${3:-target/release/ringway}

need=()
command -v perf >/dev/null || need+=(linux-perf)
command -v h2load >/dev/null || need+=(nghttp2-client)
[ "$TARGET" = nginx ] && ! command -v nginx >/dev/null && [ ! -x /usr/sbin/nginx ] && need+=(nginx-light)
[ "$TARGET" = haproxy ] && ! command -v haproxy >/dev/null && [ ! -x /usr/sbin/haproxy ] && need+=(haproxy)
if [ ${#need[@]} -gt 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
[ -x target/release/examples/origin ] || cargo build --release --example origin

WORK=$(mktemp -d /tmp/ringway-profile.XXXXXX)
chmod 755 "$WORK" # nginx's unprivileged worker writes its temporary files under it
PORT=18351
H2C_PORT=18352
TLS_PORT=18353
ORIGIN=127.0.0.1:19351
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    [ -f "$WORK/nginx.pid" ] && kill "$(cat "$WORK/nginx.pid")" 2>/dev/null
    # KEEP_PERF=FILE keeps the samples, for `perf report -i FILE` beyond the summary.
    [ -n "${KEEP_PERF:-}" ] && [ -f "$WORK/perf.data" ] && cp "$WORK/perf.data" "$KEEP_PERF"
    rm -rf "$WORK"
    true
}
trap cleanup EXIT

template() { # file -> the file with run.sh's placeholders filled in
    sed -e "s|{PORT}|$PORT|g; s|{H2C_PORT}|$H2C_PORT|g; s|{TLS_PORT}|$TLS_PORT|g" \
        -e "s|{ORIGIN}|$ORIGIN|g; s|{CPU}|1|g; s|{MASK}|10|g; s|{WORK}|$WORK|g" "$1"
}

taskset -c 0 target/release/examples/origin "$ORIGIN" >/dev/null 2>&1 &
pids+=($!)
wait_port "${ORIGIN##*:}"

# The templates' TLS listeners need a certificate (not used here).
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 \
    -subj "/CN=localhost" -keyout "$WORK/key.pem" -out "$WORK/cert.pem" >/dev/null 2>&1
cat "$WORK/cert.pem" "$WORK/key.pem" >"$WORK/both.pem"
url_port=$PORT
case $TARGET in
ringway)
    template loadtest/ringway.toml >"$WORK/ringway.toml"
    taskset -c 1 "$BIN" --config "$WORK/ringway.toml" >/dev/null 2>&1 &
    pids+=($!)
    ;;
haproxy)
    template loadtest/haproxy.cfg >"$WORK/haproxy.cfg"
    taskset -c 1 haproxy -f "$WORK/haproxy.cfg" >/dev/null 2>&1 &
    pids+=($!)
    [ "$MODE" = h2c ] && url_port=$H2C_PORT
    ;;
nginx)
    mkdir -p "$WORK/nginx-body" "$WORK/nginx-proxy"
    template loadtest/nginx.conf >"$WORK/nginx.conf"
    nginx -c "$WORK/nginx.conf" -p "$WORK" >/dev/null 2>&1 &
    pids+=($!)
    [ "$MODE" = h2c ] && url_port=$H2C_PORT
    ;;
*) echo "unknown target $TARGET" >&2; exit 2 ;;
esac
wait_port "$url_port"
sleep 0.5
case $TARGET in
ringway | haproxy) proxy_pids=${pids[-1]} ;;
nginx) proxy_pids=$(pgrep -d, -P "$(cat "$WORK/nginx.pid")") ;;
esac

load_seconds=$((SECONDS_SAMPLED + 4))
case $MODE in
h1) load=(h2load -t1 -c"$CONNS" --h1 -D "$load_seconds" "http://127.0.0.1:$url_port/") ;;
h2c) load=(h2load -t1 -c"${CONNS_SET:-16}" -m10 -D "$load_seconds" "http://127.0.0.1:$url_port/") ;;
paced)
    oha=$(command -v oha || echo "$HOME/.cargo/bin/oha")
    load=("$oha" -q "${RATE:-3300}" -c 64 -z "${load_seconds}s" --no-tui --http-version=1.1
        "http://127.0.0.1:$url_port/")
    ;;
*) echo "unknown mode $MODE" >&2; exit 2 ;;
esac
taskset -c 0 "${load[@]}" >"$WORK/load.txt" 2>&1 &
load_pid=$!
sleep 2
perf record -q ${GRAPH} -e cpu-clock -o "$WORK/perf.data" -p "$proxy_pids" \
    -- sleep "$SECONDS_SAMPLED" >/dev/null 2>&1
wait "$load_pid"

if [ "$MODE" = paced ]; then
    rps=$(awk '/Requests\/sec:/ {print $2}' "$WORK/load.txt")
    # Requests in flight when oha stops at its deadline are not failures.
    errors=$(sed -n '/^Error distribution/,$p' "$WORK/load.txt")
    if grep '^ *\[' <<<"$errors" | grep -vq "deadline"; then
        echo "the load had failures:" >&2
        echo "$errors" >&2
        exit 1
    fi
else
    rps=$(awk '/^finished in/ {gsub(",", "", $4); print $4}' "$WORK/load.txt")
    grep -q "^requests: .* 0 failed, 0 errored" "$WORK/load.txt" \
        || { echo "the load had failures:" >&2; grep "^requests:" "$WORK/load.txt" >&2; exit 1; }
fi
report() { perf report -i "$WORK/perf.data" --no-children -g none --stdio "$@" 2>/dev/null | grep -v '^#' | grep -v '^$'; }
ns=$(perf report -i "$WORK/perf.data" --stdio 2>/dev/null | awk '/^# Event count/ {print $NF}')
kernel=$(report --sort dso | awk '/\[kernel/ {gsub("%", "", $1); print $1}')
echo "$TARGET $MODE: $rps req/s over the load; ${SECONDS_SAMPLED} s sampled"
awk -v ns="$ns" -v rps="$rps" -v s="$SECONDS_SAMPLED" -v k="${kernel:-0}" 'BEGIN {
    per = ns / 1000 / (rps * s)
    printf "CPU per request %.2f us: kernel %.1f%% (%.2f us), user space %.1f%% (%.2f us)\n",
        per, k, per * k / 100, 100 - k, per * (100 - k) / 100
}'
# (`head` closes the pipe early: perf's SIGPIPE is no failure.)
echo "hottest functions (self time):"
report --sort dso,sym | head -25 || true
if [ -n "$GRAPH" ]; then
    echo "functions by time in them and in what they called:"
    report --children --sort dso,sym | head -50 || true
fi
