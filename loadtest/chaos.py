#!/usr/bin/env python3
"""Chaos run: three origins behind ringway, wrk at 64 connections for 30 s; one origin is
killed (SIGKILL) at 10 s and started again at 20 s.

Reports non-2xx responses and socket errors per second (they may only appear inside the
detection window right after the kill, never after it), how long the window lasted, and how
soon after its restart the origin got traffic again (it must be within the health check's
healthy threshold: healthy_threshold x interval, plus one probe's time).

    loadtest/chaos.sh [--no-build] [--duration 30]
"""

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

from common import scrape, wait_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ORIGINS = [19201, 19202, 19203]
VICTIM = 1  # index into ORIGINS
LISTEN, ADMIN = 18281, 19291
HC_INTERVAL_MS, HEALTHY_THRESHOLD, UNHEALTHY_THRESHOLD = 500, 2, 2


def config():
    eps = ", ".join(f'"127.0.0.1:{p}"' for p in ORIGINS)
    return f"""workers = 1
cpus = [1]
log_level = "warn"
[admin]
address = "127.0.0.1:{ADMIN}"
[[listeners]]
address = "127.0.0.1:{LISTEN}"
backlog = 4096
[[upstreams]]
name = "origins"
endpoints = [{eps}]
connect_timeout = "1s"
health_check = {{ path = "/health", interval = "{HC_INTERVAL_MS}ms", timeout = "250ms", healthy_threshold = {HEALTHY_THRESHOLD}, unhealthy_threshold = {UNHEALTHY_THRESHOLD} }}
outlier = {{ consecutive_failures = 3, base_ejection = "5s", max_ejection = "30s" }}
retries = {{ attempts = 3, retry_on = ["connect_failure", "reset"], backoff_base = "2ms", backoff_max = "20ms" }}
[[routes]]
path_prefix = "/"
proxy = "origins"
"""


def series(metrics, name, labels):
    """The value of the one series of `name` carrying every label of `labels` (others may
    be there too: endpoints also carry `authority`). A series that is not there fails the run:
    read as zero, it would pass for "no traffic"."""
    found = [v for k, v in metrics.items()
             if k.startswith(name + "{") and all(label in k for label in labels)]
    if len(found) != 1:
        raise SystemExit(f"chaos: {len(found)} series of {name} with {', '.join(labels)}")
    return found[0]


def start_origin(port):
    return subprocess.Popen(
        ["taskset", "-c", "0", os.path.join(ROOT, "target/release/examples/origin"), f"127.0.0.1:{port}"],
        stderr=subprocess.DEVNULL,
    )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument("--duration", type=int, default=30)
    args = ap.parse_args()
    if subprocess.run(["which", "wrk"], stdout=subprocess.DEVNULL).returncode != 0:
        subprocess.run("apt-get install -y wrk", shell=True, check=True)
    if not args.no_build:
        subprocess.run("cargo build --release --bin ringway --example origin", shell=True, cwd=ROOT,
                       check=True, stdout=subprocess.DEVNULL)
    d = args.duration
    kill_at, restart_at = d / 3, 2 * d / 3
    work = tempfile.mkdtemp(prefix="ringway-chaos-")
    path = os.path.join(work, "ringway.toml")
    with open(path, "w") as f:
        f.write(config())
    origins, ringway = [], None
    victim = ('upstream="origins"', f'endpoint="127.0.0.1:{ORIGINS[VICTIM]}"')
    samples = []  # (t, victim requests, victim healthy)
    try:
        origins = [start_origin(p) for p in ORIGINS]
        for p in ORIGINS:
            assert wait_port(p), f"origin {p} did not start"
        ringway = subprocess.Popen([os.path.join(ROOT, "target/release/ringway"), "--config", path],
                                   stderr=open(os.path.join(work, "ringway.log"), "w"))
        assert wait_port(LISTEN), "ringway did not start"
        wrk = subprocess.Popen(["taskset", "-c", "0", "wrk", "-t2", "-c64", f"-d{d}s", "-s",
                                os.path.join(ROOT, "loadtest/chaos.lua"), f"http://127.0.0.1:{LISTEN}/"],
                               stdout=subprocess.PIPE, text=True)
        t0 = time.time()
        stop = threading.Event()

        def sample():
            while not stop.is_set():
                try:
                    m = scrape(LISTEN)
                    samples.append((time.time() - t0, series(m, "ringway_endpoint_requests_total", victim),
                                    series(m, "ringway_endpoint_healthy", victim)))
                except OSError:
                    pass
                time.sleep(0.1)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        time.sleep(max(0.0, kill_at - (time.time() - t0)))
        origins[VICTIM].send_signal(signal.SIGKILL)
        origins[VICTIM].wait()
        killed = time.time() - t0
        time.sleep(max(0.0, restart_at - (time.time() - t0)))
        origins[VICTIM] = start_origin(ORIGINS[VICTIM])
        restarted = time.time() - t0
        out, _ = wrk.communicate(timeout=d + 60)
        stop.set()
        sampler.join(timeout=2)
        final = scrape(LISTEN)
    finally:
        for p in origins + ([ringway] if ringway else []):
            if p and p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in origins + ([ringway] if ringway else []):
            try:
                p.wait(timeout=10)
            except Exception:
                p.kill()

    seconds = []
    for line in out.splitlines():
        m = re.match(r"SECOND (\d+) (\d+) (\d+)", line)
        if m:
            seconds.append(tuple(int(x) for x in m.groups()))
    errors = re.search(r"ERRORS (.*)", out)
    total = re.search(r"(\d+) requests in", out)
    print(f"chaos run: 3 origins, wrk -c64 -d{d}s; origin :{ORIGINS[VICTIM]} killed at {killed:.1f}s, "
          f"restarted at {restarted:.1f}s")
    print(f"requests: {total.group(1) if total else '?'}; socket errors: {errors.group(1) if errors else '?'}")
    print("second  2xx      non-2xx")
    for s, ok, bad in seconds:
        mark = "  <- kill" if s == int(killed) else ("  <- restart" if s == int(restarted) else "")
        print(f"{s:6d}  {ok:7d}  {bad:7d}{mark}")
    up = 'upstream="origins"'
    failures = {k.split('class="')[1].rstrip('"}'): int(v) for k, v in final.items()
                if k.startswith(f"ringway_upstream_failures_total{{{up}") and v}
    retries = int(final.get("ringway_upstream_retries_total{%s}" % up, 0))
    ejections = int(final.get("ringway_upstream_ejections_total{%s}" % up, 0))
    p99 = int(final.get('ringway_upstream_latency_microseconds{%s,quantile="0.99"}' % up, 0))
    print(f"ringway: {retries} retries, {ejections} ejections, failed attempts by class {failures}, "
          f"upstream latency p99 {p99} us")
    bad_seconds = [s for s, _, b in seconds if b > 0]
    non2xx = sum(b for _, _, b in seconds)
    if bad_seconds:
        print(f"non-2xx: {non2xx} in seconds {bad_seconds[0]}..{bad_seconds[-1]} "
              f"(window {bad_seconds[-1] - bad_seconds[0] + 1} s, starting {bad_seconds[0] - killed:+.1f} s from the kill)")
    else:
        print("non-2xx: 0 (retries hid the failure from every client)")
    # Traffic back to the restarted origin.
    before = [r for t, r, _ in samples if t <= restarted]
    base = before[-1] if before else 0.0
    back = next((t for t, r, _ in samples if t > restarted and r > base), None)
    healthy_at = next((t for t, _, h in samples if t > restarted and h == 1.0), None)
    bound = HEALTHY_THRESHOLD * HC_INTERVAL_MS / 1000 + 0.5
    if back is None:
        print("the restarted origin got no traffic")
    else:
        print(f"restarted origin: healthy after {healthy_at - restarted:.2f} s, traffic after "
              f"{back - restarted:.2f} s (healthy threshold {HEALTHY_THRESHOLD} x {HC_INTERVAL_MS} ms + one probe: {bound:.1f} s)")
    after_window = [s for s in bad_seconds if s > killed + 5]
    ok = not after_window and back is not None and back - restarted <= bound
    if after_window:
        print(f"FAIL: non-2xx after the detection window, in seconds {after_window}")
    if back is None or back - restarted > bound:
        print("FAIL: the restarted origin did not get traffic within its healthy threshold")
    print("PASS" if ok else "FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
