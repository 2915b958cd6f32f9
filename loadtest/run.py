#!/usr/bin/env python3
"""ringway load test: ringway beside nginx and HAProxy (and the origin directly), one run.

Everything runs on loopback. The load generator (wrk, or oha for paced runs) and the origin are
pinned to LOADGEN_CPU, every proxy to PROXY_CPU, one worker/thread each. A round runs every
target once per scenario; rounds are interleaved and medians reported. Proxy CPU is read from
/proc/PID/task/*/schedstat (every thread of the proxy's processes) before and after each run;
machine-wide CPU from /proc/stat. Everything started is stopped by PID at the end.

See loadtest/README.md for how to read the output.
"""

import argparse
import datetime
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from common import rss_kib, wait_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HERE = os.path.join(ROOT, "loadtest")

PORTS = {
    "origin": 19000,
    "ringway": 18081,
    "nginx": 18082,
    "haproxy": 18083,
    "ringway-epoll": 18084,
    "ringway-off": 18085,
    "ringway-on": 18086,
    "baseline": 18087,
    "ringway-log": 18088,
    "nginx-log": 18089,
}

# Resilience features for the on/off comparison (issue: p2c_ewma, breaker, retries and the cap
# together must cost at most 5% more proxy CPU per request than all of them off).
FEATURES = {
    "ringway-off": {
        "gateway": "",
        "upstream": 'balancer = "round_robin"\noutlier = { consecutive_failures = 0 }\nretries = { attempts = 1 }\n',
    },
    "ringway-on": {
        "gateway": "[gateway]\nmax_concurrent_requests = 100000\n",
        "upstream": ('balancer = "p2c_ewma"\nbreaker = { failure_threshold = 5, open_duration = "30s", half_open_max = 2 }\n'
                     'retries = { attempts = 3, retry_on = ["connect_failure", "reset", "gateway_error"] }\n'),
    },
    # The access log on (a file in the work directory), against nginx with its own on.
    "ringway-log": {
        "gateway": '[access_log]\npath = "{WORK}/ringway-access.log"\n',
        "upstream": "",
    },
}

# nginx's access log for `nginx-log`: the fields of ringway's line, as JSON, buffered as
# ringway's is (64 KiB, written at least once a second).
NGINX_LOG = (
    "log_format rw escape=json '{\"time\":\"$time_iso8601\",\"request_id\":\"$request_id\","
    "\"client\":\"$remote_addr:$remote_port\",\"protocol\":\"$server_protocol\","
    "\"method\":\"$request_method\",\"host\":\"$host\",\"target\":\"$request_uri\","
    "\"status\":$status,\"bytes_sent\":$bytes_sent,\"duration\":$request_time,"
    "\"endpoint\":\"$upstream_addr\"}';\n"
    "  access_log {WORK}/nginx-access.log rw buffer=64k flush=1s;")

# Each proxy also listens for h2c (nginx and HAProxy need their own port; ringway detects the
# preface on its main one) and for TLS (h2 and http/1.1 by ALPN), at these offsets.
H2C_OFFSET = 100
TLS_OFFSET = 200

procs = []  # (name, Popen)


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def sh(cmd, **kw):
    return subprocess.run(cmd, shell=True, check=True, **kw)


def ensure_tools(need_oha):
    missing = [p for p, b in (("wrk", "wrk"), ("nginx-light", "nginx"), ("haproxy", "haproxy"), ("nghttp2-client", "h2load"), ("openssl", "openssl")) if not shutil.which(b) and not os.path.exists(f"/usr/sbin/{b}")]
    if missing:
        log(f"installing {' '.join(missing)} with apt-get")
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        subprocess.run("apt-get update -qq", shell=True, env=env)
        sh(f"apt-get install -y -qq {' '.join(missing)} >/dev/null", env=env)
        # The packages start system services on port 80; they are not ours to run.
        subprocess.run("systemctl stop nginx haproxy 2>/dev/null; pkill -f 'nginx: master process /usr/sbin/nginx' ; pkill -x haproxy", shell=True)
    if need_oha and not shutil.which("oha") and not os.path.exists(os.path.expanduser("~/.cargo/bin/oha")):
        log("installing oha (open-loop load generator for the paced run) with cargo install")
        sh("cargo install --locked oha >/dev/null 2>&1 || cargo install oha >/dev/null")


def oha_bin():
    return shutil.which("oha") or os.path.expanduser("~/.cargo/bin/oha")


def build():
    log("building ringway and the origin (release)")
    sh("cargo build --release --bin ringway --example origin", cwd=ROOT, stdout=subprocess.DEVNULL)


def start(name, cmd, cpu, env=None):
    p = subprocess.Popen(["taskset", "-c", str(cpu)] + cmd, stdout=subprocess.DEVNULL, stderr=open(os.path.join(WORK, name + ".log"), "w"), env=env, preexec_fn=os.setsid)
    procs.append((name, p))
    return p


def stop_all():
    for name, p in reversed(procs):
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.time() + 10
    for name, p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def pids_of(p):
    """The process and its children (nginx workers)."""
    pids = [p.pid]
    try:
        for task in os.listdir(f"/proc/{p.pid}/task"):
            with open(f"/proc/{p.pid}/task/{task}/children") as f:
                pids += [int(x) for x in f.read().split()]
    except OSError:
        pass
    return pids


def sched_stats(pids):
    """CPU nanoseconds and times put on a CPU, summed over every thread of `pids`
    (`/proc/PID/task/*/schedstat`: run time, wait time, timeslices)."""
    ns = runs = 0
    for pid in pids:
        try:
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                    fields = f.read().split()
                ns += int(fields[0])
                runs += int(fields[2])
        except (OSError, IndexError, ValueError):
            pass
    return ns, runs


def machine_busy_s():
    with open("/proc/stat") as f:
        parts = [int(x) for x in f.readline().split()[1:]]
    idle = parts[3] + parts[4]
    return (sum(parts) - idle) / os.sysconf("SC_CLK_TCK")


def tcp_out_segs():
    """TCP segments the whole machine has sent (`/proc/net/snmp`, Tcp OutSegs)."""
    with open("/proc/net/snmp") as f:
        rows = [line.split() for line in f if line.startswith("Tcp:")]
    return int(rows[1][rows[0].index("OutSegs")])


def parse_wrk(text):
    out = {}
    m = re.search(r"Requests/sec:\s+([\d.]+)", text)
    out["rps"] = float(m.group(1)) if m else 0.0
    m = re.search(r"(\d+) requests in", text)
    out["requests"] = int(m.group(1)) if m else 0
    for pct in ("50", "99"):
        m = re.search(rf"^\s+{pct}%\s+([\d.]+)(us|ms|s)\s*$", text, re.M)
        if m:
            v = float(m.group(1)) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[m.group(2)]
            out[f"p{pct}"] = v
    m = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    out["non2xx"] = int(m.group(1)) if m else 0
    m = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text)
    out["errors"] = sum(int(x) for x in m.groups()) if m else 0
    return out


def syscalls_during(pids, seconds):
    """Starts `perf stat` on the syscall tracepoint for `pids`; returns the Popen."""
    if not shutil.which("perf"):
        return None
    return subprocess.Popen(["perf", "stat", "-x,", "-e", "raw_syscalls:sys_enter", "-p", ",".join(map(str, pids)), "--", "sleep", str(seconds)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def syscalls_result(p):
    if p is None:
        return None
    try:
        _, err = p.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        return None
    for line in err.splitlines():
        parts = line.split(",")
        if len(parts) > 2 and "raw_syscalls" in line and parts[0].strip().isdigit():
            return int(parts[0])
    return None


def parse_h2load(text, log_path):
    out = {}
    m = re.search(r"finished in [^,]+, ([\d.]+) req/s", text)
    out["rps"] = float(m.group(1)) if m else 0.0
    m = re.search(r"requests: \d+ total, \d+ started, (\d+) done, (\d+) succeeded, (\d+) failed, (\d+) errored", text)
    out["requests"] = int(m.group(1)) if m else 0
    out["errors"] = int(m.group(3)) + int(m.group(4)) if m else 1
    m = re.search(r"status codes: (\d+) 2xx", text)
    # Streams still open when the duration ends count as started, not done: never negative.
    out["non2xx"] = max(0, out["requests"] - int(m.group(1))) if m else 0
    # Per-request times (microseconds, third column) from --log-file.
    try:
        with open(log_path) as f:
            times = sorted(int(line.split()[2]) for line in f if line.strip())
        if times:
            out["p50"] = times[len(times) // 2] / 1e3
            out["p99"] = times[min(len(times) - 1, int(len(times) * 0.99))] / 1e3
    except (OSError, ValueError, IndexError):
        pass
    return out


def run_one(target, port, scenario, pids):
    """One measured run against one target; returns a dict of figures."""
    scheme = "https" if scenario.get("tls") else "http"
    if scenario.get("tls"):
        port += TLS_OFFSET
    elif scenario.get("h2") and target in ("nginx", "nginx-log", "haproxy"):
        port += H2C_OFFSET
    url = f"{scheme}://127.0.0.1:{port}{scenario['path']}"
    d = scenario["duration"]
    (c0, r0), m0, s0 = sched_stats(pids), machine_busy_s(), tcp_out_segs()
    sc = syscalls_during(pids, max(1, d - 1)) if scenario.get("syscalls") and pids else None
    if scenario.get("h2"):
        log_path = os.path.join(WORK, "h2load.log")
        cmd = ["h2load", "-t1", "-c", str(scenario["conns"]), "-m", str(scenario["streams"]), "-D", str(d), "--log-file", log_path, url]
        res = subprocess.run(["taskset", "-c", str(LOADGEN_CPU)] + cmd, capture_output=True, text=True, timeout=d + 60)
        fig = parse_h2load(res.stdout, log_path)
    elif scenario.get("rate"):
        cmd = [oha_bin(), "-q", str(scenario["rate"]), "-c", str(scenario["conns"]), "-z", f"{d}s", "--latency-correction", "--no-tui", "--output-format", "json", "--disable-keepalive" if scenario.get("close") else "--http-version=1.1", url]
        res = subprocess.run(["taskset", "-c", str(LOADGEN_CPU)] + cmd, capture_output=True, text=True, timeout=d + 60)
        try:
            j = json.loads(res.stdout)
            lat = j.get("latencyPercentiles", {})
            summary = j.get("summary", {})
            codes = j.get("statusCodeDistribution", {})
            ok = sum(v for k, v in codes.items() if k.startswith("2"))
            # Requests still in flight when oha stops at its deadline are not failures.
            fig = {"rps": summary.get("requestsPerSec", 0.0), "requests": sum(codes.values()), "p50": lat.get("p50", 0) * 1e3, "p99": lat.get("p99", 0) * 1e3, "non2xx": sum(codes.values()) - ok, "errors": sum(n for e, n in j.get("errorDistribution", {}).items() if "aborted due to deadline" not in e)}
        except (ValueError, AttributeError):
            log(f"oha output not understood: {res.stdout[:200]} {res.stderr[:200]}")
            fig = {"rps": 0.0, "requests": 0, "non2xx": 0, "errors": 1}
    else:
        cmd = ["wrk", "-t1", f"-c{scenario['conns']}", f"-d{d}s", "--latency", url]
        if scenario.get("close"):
            cmd[1:1] = ["-H", "Connection: close"]
        if scenario.get("upload"):
            cmd[1:1] = ["-s", upload_script(scenario["upload"])]
        res = subprocess.run(["taskset", "-c", str(LOADGEN_CPU)] + cmd, capture_output=True, text=True, timeout=d + 60)
        fig = parse_wrk(res.stdout)
    (c1, r1), m1, s1 = sched_stats(pids), machine_busy_s(), tcp_out_segs()
    n = max(fig.get("requests", 0), 1)
    fig["cpu_us"] = (c1 - c0) / n / 1e3 if pids else None
    fig["machine_us"] = (m1 - m0) / n * 1e6
    fig["segs"] = (s1 - s0) / n
    fig["runs"] = (r1 - r0) / n if pids else None
    calls = syscalls_result(sc)
    fig["syscalls"] = calls / n / (max(1, d - 1) / d) if calls is not None else None
    return fig


def upload_script(size):
    """A wrk script that POSTs `size` bytes with each request; its path."""
    path = os.path.join(WORK, f"upload-{size}.lua")
    if not os.path.exists(path):
        with open(path, "w") as f:
            f.write(f'wrk.method = "POST"\nwrk.body = string.rep("x", {size})\n'
                    'wrk.headers["Content-Type"] = "application/octet-stream"\n')
    return path


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def paired_ratios(mine, theirs, key):
    """Round-by-round ratios of `key` (round i of one target against round i of the other).
    The two ran seconds apart, so a drift of the machine's speed between rounds cancels
    out of each ratio; their median and range show how far one run's ratio of medians can be
    trusted."""
    return [a[key] / b[key] for a, b in zip(mine, theirs)
            if a.get(key) is not None and b.get(key)]


def fmt(v, unit=""):
    if v is None:
        return "-"
    if unit == "rps":
        return f"{v:,.0f}"
    if unit == "ms":
        return f"{v:.2f}ms" if v >= 1 else f"{v * 1000:.0f}us"
    return f"{v:.2f}"


def main():
    global WORK, LOADGEN_CPU
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small-body c=64 and 1 MiB only, 3 rounds of 3 s (under 2 minutes)")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--duration", type=int, default=None, help="seconds per run")
    ap.add_argument("--scenarios", default=None, help="comma list: small16,small64,small256,paced,close,big,up1m,rss,h2c16x10,h2c64x10,h2c1m,h2tls16x10,https64,tlsnew")
    ap.add_argument("--targets", default="direct,ringway,nginx,haproxy,ringway-epoll",
                    help="comma list of direct, ringway, nginx, haproxy, ringway-epoll, "
                         "ringway-off / ringway-on (resilience features off / on, for their "
                         "cost), and ringway-log / nginx-log (each with its access log on)")
    ap.add_argument("--loadgen-cpu", type=int, default=0)
    ap.add_argument("--proxy-cpu", type=int, default=1)
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument("--ringway", default=None, metavar="BINARY",
                    help="the ringway binary of target `ringway` (default target/release/ringway; "
                         "scripts/pgo-build.sh makes target/pgo/ringway)")
    ap.add_argument("--baseline", default=None, metavar="BINARY",
                    help="another ringway binary (an earlier build) run as target `baseline` with the same "
                         "config, for before/after ratios of a change")
    args = ap.parse_args()
    LOADGEN_CPU = args.loadgen_cpu
    if args.quick:
        rounds, duration = args.rounds or 3, args.duration or 3
        scenarios = (args.scenarios or "small64,big").split(",")
    else:
        rounds, duration = args.rounds or 3, args.duration or 5
        scenarios = (args.scenarios or "small16,small64,small256,paced,close,big,up1m,rss,h2c16x10,h2c64x10,h2c1m,h2tls16x10,https64,tlsnew").split(",")
    targets = args.targets.split(",")
    if args.baseline and "baseline" not in targets:
        targets.append("baseline")

    ensure_tools("paced" in scenarios)
    if not args.no_build:
        build()
    WORK = tempfile.mkdtemp(prefix="ringway-loadtest-")
    # nginx's worker runs as an unprivileged user and buffers large responses to temporary
    # files under WORK: mkdtemp's 0700 would refuse them, and nginx cut those responses short.
    os.chmod(WORK, 0o755)
    started = time.time()
    try:
        results = run_all(args, targets, scenarios, rounds, duration)
    finally:
        stop_all()
        trim_access_logs(remove=True)
    report(results, targets, rounds, duration, time.time() - started)


def run_all(args, targets, scenarios, rounds, duration):
    pc = args.proxy_cpu
    origin = f"127.0.0.1:{PORTS['origin']}"
    # One certificate for every proxy's TLS listener (ECDSA P-256).
    sh(f"openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 -subj /CN=localhost "
       f"-addext subjectAltName=DNS:localhost,IP:127.0.0.1 -keyout {WORK}/key.pem -out {WORK}/cert.pem 2>/dev/null")
    with open(f"{WORK}/both.pem", "w") as f:
        f.write(open(f"{WORK}/cert.pem").read() + open(f"{WORK}/key.pem").read())
    start("origin", [os.path.join(ROOT, "target/release/examples/origin"), origin], LOADGEN_CPU)
    assert wait_port(PORTS["origin"]), "origin did not start"
    running = {"direct": None}

    def ringway_conf(port, features=None):
        path = os.path.join(WORK, f"ringway-{port}.toml")
        with open(os.path.join(HERE, "ringway.toml")) as f:
            text = (f.read().replace("{PORT}", str(port)).replace("{ORIGIN}", origin).replace("{CPU}", str(pc))
                    .replace("{WORK}", WORK).replace("{TLS_PORT}", str(port + TLS_OFFSET)))
        if features:
            gateway = features["gateway"].replace("{WORK}", WORK)
            text = text.replace("[http]\n", gateway + "[http]\n")
            text = text.replace("pool_max_idle = 1024\n", "pool_max_idle = 1024\n" + features["upstream"])
        with open(path, "w") as f:
            f.write(text)
        return path

    def templ(name, port, out_name=None, edit=lambda t: t):
        with open(os.path.join(HERE, name)) as f:
            text = edit(f.read())
            text = (text.replace("{PORT}", str(port)).replace("{ORIGIN}", origin).replace("{CPU}", str(pc))
                    .replace("{WORK}", WORK).replace("{MASK}", "1" + "0" * pc)
                    .replace("{H2C_PORT}", str(port + H2C_OFFSET)).replace("{TLS_PORT}", str(port + TLS_OFFSET)))
        path = os.path.join(WORK, out_name or name)
        with open(path, "w") as f:
            f.write(text)
        return path

    rw = os.path.abspath(args.ringway) if args.ringway else os.path.join(ROOT, "target/release/ringway")
    for t in targets:
        port = PORTS.get(t)
        if t == "ringway":
            running[t] = start(t, [rw, "--config", ringway_conf(port)], pc, env=dict(os.environ, RUST_LOG="warn"))
        elif t == "baseline":
            running[t] = start(t, [os.path.abspath(args.baseline), "--config", ringway_conf(port)], pc, env=dict(os.environ, RUST_LOG="warn"))
        elif t in FEATURES:
            running[t] = start(t, [rw, "--config", ringway_conf(port, FEATURES[t])], pc, env=dict(os.environ, RUST_LOG="warn"))
        elif t == "ringway-epoll":
            running[t] = start(t, [rw, "--config", ringway_conf(port)], pc, env=dict(os.environ, RUST_LOG="warn", MONOIO_FORCE_LEGACY_DRIVER="1"))
        elif t == "nginx":
            running[t] = start(t, ["nginx", "-c", templ("nginx.conf", port), "-p", WORK], pc)
        elif t == "nginx-log":
            def edit(text):
                text = text.replace("access_log off;", NGINX_LOG)
                for own in ("nginx.pid", "nginx-error.log", "nginx-body", "nginx-proxy"):
                    text = text.replace(own, own.replace("nginx", "nginx-log"))
                return text
            conf = templ("nginx.conf", port, "nginx-log.conf", edit)
            running[t] = start(t, ["nginx", "-c", conf, "-p", WORK], pc)
        elif t == "haproxy":
            running[t] = start(t, ["haproxy", "-f", templ("haproxy.cfg", port)], pc)
        if t != "direct" and not wait_port(port):
            raise SystemExit(f"{t} did not start; see {WORK}/{t}.log")
    port_of = lambda t: PORTS["origin"] if t == "direct" else PORTS[t]
    pids = lambda t: pids_of(running[t]) if running.get(t) else []

    # Warm every target up (pools, caches) before measuring.
    for t in targets:
        subprocess.run(["taskset", "-c", str(LOADGEN_CPU), "wrk", "-t1", "-c64", "-d1s", f"http://127.0.0.1:{port_of(t)}/"], capture_output=True)

    defs = {
        "h2c16x10": {"path": "/", "conns": 16, "streams": 10, "h2": True},
        "h2c64x10": {"path": "/", "conns": 64, "streams": 10, "h2": True},
        "h2c1m": {"path": "/1m", "conns": 16, "streams": 10, "h2": True},
        "h2tls16x10": {"path": "/", "conns": 16, "streams": 10, "h2": True, "tls": True},
        "https64": {"path": "/", "conns": 64, "tls": True},
        "tlsnew": {"path": "/", "conns": 64, "tls": True, "close": True},
        "small16": {"path": "/", "conns": 16},
        "small64": {"path": "/", "conns": 64, "syscalls": True},
        "small256": {"path": "/", "conns": 256},
        "close": {"path": "/", "conns": 64, "close": True},
        "big": {"path": "/1m", "conns": 16},
        "up1m": {"path": "/upload", "conns": 16, "upload": 1 << 20},
    }
    results = {}
    for sc_name in scenarios:
        if sc_name == "rss":
            results["rss"] = rss_check(running, targets)
            continue
        if sc_name == "paced":
            nginx_rps = median([r["rps"] for r in results.get("small64", {}).get("nginx", [])]) if "small64" in results else None
            if nginx_rps is None:
                probe = run_one("nginx", port_of("nginx"), {"path": "/", "conns": 64, "duration": 3}, [])
                nginx_rps = probe["rps"]
            scenario = {"path": "/", "conns": 64, "rate": max(100, int(nginx_rps * 0.15)), "duration": duration}
        else:
            scenario = dict(defs[sc_name], duration=duration)
        # The origin speaks cleartext HTTP/1.1 only: no `direct` row for HTTP/2 or TLS.
        sc_targets = [t for t in targets if not (t == "direct" and (scenario.get("h2") or scenario.get("tls")))]
        results[sc_name] = {t: [] for t in sc_targets}
        results[sc_name]["_scenario"] = scenario
        for r in range(rounds):
            for t in sc_targets:
                fig = run_one(t, port_of(t), scenario, pids(t))
                results[sc_name][t].append(fig)
                trim_access_logs()
                log(f"{sc_name} round {r + 1} {t}: {fig['rps']:,.0f} req/s p99 {fmt(fig.get('p99'), 'ms')} cpu {fmt(fig.get('cpu_us'))} us/req errors {fig.get('errors', 0)} non2xx {fig.get('non2xx', 0)}")
    return results


# The access logs of `ringway-log` and `nginx-log` (tens of MB a run): emptied after each run
# (both proxies append, so they go on writing at the new end) and removed at the end.
ACCESS_LOGS = ("ringway-access.log", "nginx-access.log")


def trim_access_logs(remove=False):
    for name in ACCESS_LOGS:
        path = os.path.join(WORK, name)
        if os.path.exists(path):
            if remove:
                os.remove(path)
            else:
                os.truncate(path, 0)


def rss_check(running, targets):
    """RSS of each ringway before and during a 1 GiB upload, a 1 GiB download, and a 1 GiB
    HTTP/2 (h2c) download by a reader slowed to 100 MB/s (flow control must hold the rest)."""
    out = {}
    for t in [x for x in targets if x.startswith("ringway")]:
        pid = running[t].pid
        port = PORTS[t]
        before = rss_kib(pid)
        peaks = {}
        for name, cmd in (("upload", f"head -c 1073741824 /dev/zero | curl -s -o /dev/null -w '%{{http_code}}' -T - -X POST http://127.0.0.1:{port}/upload"),
                          ("download", f"curl -s -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{port}/1g"),
                          ("h2 slow reader", f"curl -s --http2-prior-knowledge --limit-rate 100M -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{port}/1g")):
            peak = rss_kib(pid)
            p = subprocess.Popen(["taskset", "-c", str(LOADGEN_CPU), "sh", "-c", cmd], stdout=subprocess.PIPE, text=True)
            while p.poll() is None:
                peak = max(peak, rss_kib(pid))
                time.sleep(0.02)
            code = p.stdout.read().strip()
            if code != "200":
                log(f"rss check {t}: {name} gave {code}")
            peaks[name] = peak
        after = rss_kib(pid)
        out[t] = {"before_kib": before, "peaks": peaks, "after_kib": after}
        log(f"rss {t}: before {before} KiB, peaks {peaks} KiB, after {after} KiB")
    return out


def report(results, targets, rounds, duration, elapsed):
    lines = []
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines.append(f"ringway load test, {now}: {rounds} interleaved rounds of {duration} s, medians; "
                 f"loadgen+origin on CPU {LOADGEN_CPU}, each proxy alone on its CPU, 1 worker each; took {elapsed:.0f} s")
    lines.append("")
    for sc_name, per in results.items():
        if sc_name == "rss":
            lines.append("RSS across a 1 GiB upload, a 1 GiB download and a 1 GiB h2c download read at 100 MB/s (KiB):")
            for t, r in per.items():
                peaks = "  ".join(f"{k} peak {v} (+{(v - r['before_kib']) / 1024:.1f} MiB)" for k, v in r["peaks"].items())
                lines.append(f"  {t:14} before {r['before_kib']:>8}  {peaks}  after {r['after_kib']:>8}")
            lines.append("")
            continue
        sc = per["_scenario"]
        if sc.get("upload"):
            title = f"{sc_name}: POST {sc['path']} ({sc['upload'] >> 20} MiB body), {sc['conns']} connections"
        else:
            title = f"{sc_name}: GET {sc['path']}, {sc['conns']} connections"
        if sc.get("rate"):
            title += f", paced at {sc['rate']} req/s (oha, latency-corrected)"
        if sc.get("close"):
            title += ", Connection: close (new connection per request)"
        lines.append(title)
        big = sc["path"] == "/1m" or bool(sc.get("upload"))
        hdr = f"  {'target':14} {'req/s':>10} {'p50':>9} {'p99':>9} {'cpu us/req':>11} {'syscalls/req':>13} {'runs/req':>9} {'segs/req':>9} {'errors':>7}"
        if big:
            hdr += f" {'machine us/MiB':>15} {'added over direct':>18}"
        lines.append(hdr)
        med = {}
        shown = [t for t in targets if t in per]
        for t in shown:
            runs = per.get(t, [])
            m = {k: median([r.get(k) for r in runs]) for k in ("rps", "p50", "p99", "cpu_us", "syscalls", "runs", "segs", "machine_us")}
            m["errors"] = sum(r.get("errors", 0) + r.get("non2xx", 0) for r in runs)
            med[t] = m
        for t in shown:
            m = med[t]
            row = f"  {t:14} {fmt(m['rps'], 'rps'):>10} {fmt(m['p50'], 'ms'):>9} {fmt(m['p99'], 'ms'):>9} {fmt(m['cpu_us']):>11} {fmt(m['syscalls']):>13} {fmt(m['runs']):>9} {fmt(m['segs']):>9} {m['errors']:>7}"
            if big:
                added = None if t == "direct" or med.get("direct") is None or m["machine_us"] is None else m["machine_us"] - med["direct"]["machine_us"]
                row += f" {fmt(m['machine_us']):>15} {fmt(added):>18}"
            lines.append(row)
        for other in ("nginx", "haproxy"):
            if "ringway" in med and other in med and med[other]["cpu_us"]:
                r, o = med["ringway"], med[other]
                parts = [f"cpu {r['cpu_us'] / o['cpu_us']:.2f}", f"req/s {r['rps'] / o['rps']:.2f}" if o["rps"] else None,
                         f"p99 {r['p99'] / o['p99']:.2f}" if r.get("p99") and o.get("p99") else None]
                if big and "direct" in med and med["direct"]["machine_us"] is not None:
                    ra, oa = r["machine_us"] - med["direct"]["machine_us"], o["machine_us"] - med["direct"]["machine_us"]
                    if oa > 0:
                        parts.append(f"added machine cpu {ra / oa:.2f}")
                paired = paired_ratios(per["ringway"], per[other], "cpu_us")
                if len(paired) > 1:
                    lower = sum(1 for x in paired if x <= 1)
                    parts.append(f"cpu per round {median(paired):.2f} ({min(paired):.2f}-{max(paired):.2f}, "
                                 f"at or below in {lower} of {len(paired)})")
                lines.append(f"  ringway/{other}: " + ", ".join(p for p in parts if p))
        pairs = (("ringway-log", "ringway"), ("nginx-log", "nginx"), ("ringway-log", "nginx-log"))
        for a, b in pairs:
            if a in med and b in med and med[b]["cpu_us"]:
                paired = paired_ratios(per[a], per[b], "cpu_us")
                extra = ""
                if len(paired) > 1:
                    extra = (f", cpu per round {median(paired):.2f} "
                             f"({min(paired):.2f}-{max(paired):.2f})")
                lines.append(f"  {a}/{b}: cpu {med[a]['cpu_us'] / med[b]['cpu_us']:.2f}{extra}")
        if "direct" in med and "ringway" in med and med["direct"]["rps"]:
            lines.append(f"  ringway/direct: req/s {med['ringway']['rps'] / med['direct']['rps']:.2f}")
        lines.append("")
    text = "\n".join(lines)
    print(text)
    out_dir = os.path.join(HERE, "out")
    os.makedirs(out_dir, exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    with open(os.path.join(out_dir, f"results-{stamp}.txt"), "w") as f:
        f.write(text + "\n")
        f.write(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
