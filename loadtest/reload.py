#!/usr/bin/env python3
"""Reload under load: wrk at 64 connections against ringway while its config is rewritten and
reloaded 20 times (POST /-/reload): routes added, removed and changed. Passes when wrk saw no
socket error and no non-2xx answer, and after each reload the new routes answered.

    loadtest/reload.sh [--no-build] [--reloads N]
"""

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

from common import http, wait_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ORIGIN, LISTEN, ADMIN = 19100, 18181, 19901


def config(k):
    load = ('[[routes]]\npath_prefix = "/load"\nproxy = "origin"\n' if k % 2 == 0
            else f'[[routes]]\npath_prefix = "/load"\nrespond = {{ status = 200, body = "local-{k}" }}\n')
    return (f'workers = 1\ncpus = [1]\nlog_level = "warn"\n[admin]\naddress = "127.0.0.1:{ADMIN}"\n'
            f'[[listeners]]\naddress = "127.0.0.1:{LISTEN}"\nbacklog = 4096\n'
            f'[[upstreams]]\nname = "origin"\nendpoints = ["127.0.0.1:{ORIGIN}"]\n'
            f'{load}'
            f'[[routes]]\npath = "/probe"\nrespond = {{ status = 200, body = "gen-{k}" }}\n'
            f'[[routes]]\npath = "/added-{k}"\nrespond = {{ status = 200, body = "added" }}\n')


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument("--reloads", type=int, default=20)
    args = ap.parse_args()
    if not args.no_build:
        subprocess.run("cargo build --release --bin ringway --example origin", shell=True, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    work = tempfile.mkdtemp(prefix="ringway-reload-")
    path = os.path.join(work, "ringway.toml")

    def write(k):
        with open(path + ".tmp", "w") as f:
            f.write(config(k))
        os.rename(path + ".tmp", path)

    write(0)
    procs = []
    try:
        procs.append(subprocess.Popen(["taskset", "-c", "0", os.path.join(ROOT, "target/release/examples/origin"), f"127.0.0.1:{ORIGIN}"], stderr=subprocess.DEVNULL))
        procs.append(subprocess.Popen([os.path.join(ROOT, "target/release/ringway"), "--config", path], stderr=open(os.path.join(work, "ringway.log"), "w")))
        wait_port(LISTEN)
        duration = max(10, args.reloads // 2 + 5)
        wrk = subprocess.Popen(["taskset", "-c", "0", "wrk", "-t1", "-c64", f"-d{duration}s", f"http://127.0.0.1:{LISTEN}/load"], stdout=subprocess.PIPE, text=True)
        time.sleep(1)
        failures, apply_ms = [], []
        for k in range(1, args.reloads + 1):
            time.sleep(0.3)
            write(k)
            t0 = time.time()
            status, body = http(ADMIN, "POST", "/-/reload")
            if status != 200:
                failures.append(f"reload {k}: admin answered {status} {body}")
                continue
            while time.time() - t0 < 2:
                if http(LISTEN, "GET", "/probe")[1] == f"gen-{k}":
                    break
                time.sleep(0.005)
            else:
                failures.append(f"reload {k}: /probe never answered gen-{k}")
            apply_ms.append((time.time() - t0) * 1000)
            if http(LISTEN, "GET", f"/added-{k}")[0] != 200:
                failures.append(f"reload {k}: the added route does not answer")
            if k > 1 and http(LISTEN, "GET", f"/added-{k - 1}")[0] != 404:
                failures.append(f"reload {k}: the removed route still answers")
        out, _ = wrk.communicate(timeout=duration + 30)
        requests = int(re.search(r"(\d+) requests in", out).group(1))
        non2xx = int(m.group(1)) if (m := re.search(r"Non-2xx or 3xx responses: (\d+)", out)) else 0
        errors = sum(int(x) for x in m.groups()) if (m := re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)) else 0
        print(f"{args.reloads} reloads under wrk -c64: {requests} requests, {non2xx} non-2xx, {errors} socket errors; "
              f"new routes answering {min(apply_ms):.0f}-{max(apply_ms):.0f} ms after the reload request")
        if non2xx or errors:
            failures.append(f"wrk saw {non2xx} non-2xx and {errors} socket errors")
        for f in failures:
            print("FAIL:", f)
        return 1 if failures else 0
    finally:
        for p in reversed(procs):
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


if __name__ == "__main__":
    sys.exit(main())
