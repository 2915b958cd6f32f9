"""Helpers shared by the load test scripts: loopback HTTP/1.1 requests, port waits, RSS."""

import socket
import time


def http(port, method, path, timeout=5):
    """One request on its own connection: (status, body text)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.sendall(f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".encode())
    data = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    s.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head[9:12]), body.decode(errors="replace")


def scrape(port):
    """ringway's /metrics as {name{labels}: value}."""
    _, text = http(port, "GET", "/metrics", timeout=2)
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            k, _, v = line.rpartition(" ")
            try:
                out[k] = float(v)
            except ValueError:
                pass
    return out


def wait_port(port, timeout=15):
    """Waits until something accepts on 127.0.0.1:port."""
    end = time.time() + timeout
    while time.time() < end:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return True
        except OSError:
            time.sleep(0.02)
    return False


def rss_kib(pid):
    """The resident set size of process `pid`, in KiB (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0
