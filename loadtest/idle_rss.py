"""Memory per idle keep-alive connection: ringway's RSS growth over N idle connections.

    python3 loadtest/idle_rss.py [--conns 2000] [--body BYTES] [--http 'KEY = VALUE']
                                 [--binary target/release/ringway]

Starts the project's origin and ringway (loadtest/ringway.toml), opens N cleartext
connections that each make one request and then sit idle, and reads ringway's VmRSS; then
the same with a fresh ringway for each of TLS, h2c (prior knowledge) and HTTP/2 over TLS
(ALPN h2). Prints the growth per connection in KiB. With --body, each HTTP/1.1 connection's
request is a POST of that many bytes (what a connection keeps after carrying traffic: the
pages its buffers were written in). --http adds a line to ringway's [http] table (say
'idle_buffer_release = "1s"'; the script then waits 3.5 s before it reads the RSS, for the block pools to free what they do not keep). Build first
(`cargo build --release --bin ringway --example origin`). Everything runs on loopback,
bounded by N; what it started is stopped and its temporary directory removed.
"""

import argparse
import os
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import time

from common import rss_kib, wait_port

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
ORIGIN_PORT, PORT = 19500, 19501


def h1_request(body):
    """A function making one HTTP/1.1 request on a connection (a POST of `body` bytes when
    not 0), which returns once its answer's first bytes came."""
    def request(c):
        if body:
            c.sendall(b"POST / HTTP/1.1\r\nHost: localhost\r\nContent-Length: %d\r\n\r\n" % body
                      + b"x" * body)
        else:
            c.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
        c.recv(4096)
    return request


def recv_exact(c, n):
    data = b""
    while len(data) < n:
        more = c.recv(n - len(data))
        if not more:
            raise ConnectionError("closed")
        data += more
    return data


def h2_request(c):
    """The HTTP/2 preface and one GET / on stream 1 (HPACK: :method GET, :path /, :scheme
    http from the static table, :authority localhost); returns once the stream ended. The
    server's SETTINGS are acknowledged."""
    authority = b"localhost"
    block = b"\x82\x84\x86\x41" + bytes([len(authority)]) + authority
    headers = len(block).to_bytes(3, "big") + b"\x01\x05" + (1).to_bytes(4, "big") + block
    c.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00" + headers)
    while True:
        head = recv_exact(c, 9)
        length, kind, flags = int.from_bytes(head[:3], "big"), head[3], head[4]
        stream = int.from_bytes(head[5:9], "big") & 0x7FFFFFFF
        recv_exact(c, length)
        if kind == 4 and not flags & 1:
            c.sendall(b"\x00\x00\x00\x04\x01\x00\x00\x00\x00")
        if stream == 1 and kind in (0, 1) and flags & 1:
            return


def idle_growth(pid, n, connect, request, settle):
    """RSS growth per connection (KiB) over `n` connections made by `connect`, each idle
    after one `request`."""
    before = rss_kib(pid)
    conns = []
    try:
        for _ in range(n):
            c = connect()
            request(c)
            conns.append(c)
        time.sleep(settle)
        return (rss_kib(pid) - before) / n
    finally:
        for c in conns:
            c.close()
        time.sleep(0.5)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--conns", type=int, default=2000)
    ap.add_argument("--body", type=int, default=0)
    ap.add_argument("--http", default="", help="a line added to ringway's [http] table")
    ap.add_argument("--binary", default=os.path.join(ROOT, "target/release/ringway"))
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="ringway-idle-")
    subprocess.run(
        f"openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 -subj /CN=localhost "
        f"-addext subjectAltName=DNS:localhost -keyout {work}/key.pem -out {work}/cert.pem",
        shell=True, check=True, stderr=subprocess.DEVNULL)
    def config(port):
        """A config on `port` (cleartext) and `port + 1` (TLS)."""
        with open(os.path.join(HERE, "ringway.toml")) as f:
            conf = (f.read().replace("{PORT}", str(port)).replace("{TLS_PORT}", str(port + 1))
                    .replace("{ORIGIN}", f"127.0.0.1:{ORIGIN_PORT}").replace("{CPU}", "1").replace("{WORK}", work)
                    .replace("[http]\n", f"[http]\n{args.http}\n"))
        path = os.path.join(work, f"ringway-{port}.toml")
        with open(path, "w") as f:
            f.write(conf)
        return path

    origin = subprocess.Popen([os.path.join(ROOT, "target/release/examples/origin"), f"127.0.0.1:{ORIGIN_PORT}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    def tls_context(alpn):
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        ctx.set_alpn_protocols([alpn])
        return ctx
    ctx, ctx_h2 = tls_context("http/1.1"), tls_context("h2")
    # A fresh process (on ports of its own: a killed ring lets go of its sockets a little
    # later) for each kind: memory the first kind's connections gave back would be reused by
    # the second's.
    kinds = [
        ("cleartext", PORT, lambda: socket.create_connection(("127.0.0.1", PORT)), h1_request(args.body)),
        ("TLS", PORT + 10, lambda: ctx.wrap_socket(socket.create_connection(("127.0.0.1", PORT + 11)),
                                                   server_hostname="localhost"), h1_request(args.body)),
        ("h2c", PORT + 20, lambda: socket.create_connection(("127.0.0.1", PORT + 20)), h2_request),
        ("h2 TLS", PORT + 30, lambda: ctx_h2.wrap_socket(socket.create_connection(("127.0.0.1", PORT + 31)),
                                                         server_hostname="localhost"), h2_request),
    ]
    results = []
    try:
        for name, port, connect, request in kinds:
            proxy = subprocess.Popen([args.binary, "--config", config(port)], stdout=subprocess.DEVNULL,
                                     stderr=open(os.path.join(work, name + ".log"), "w"),
                                     env=dict(os.environ, RUST_LOG="warn"))
            try:
                if not (wait_port(ORIGIN_PORT) and wait_port(port) and wait_port(port + 1)):
                    sys.exit(f"ringway or the origin did not start; see {work}/{name}.log")
                time.sleep(0.5)  # the workers take over the bound sockets
                results.append(f"{name} {idle_growth(proxy.pid, args.conns, connect, request, 3.5 if args.http else 0.5):.1f} KiB")
            finally:
                proxy.kill()
                proxy.wait()
        after = f" after a {args.body}-byte POST (HTTP/1.1)" if args.body else ""
        print(f"{os.path.basename(args.binary)}: {args.conns} idle keep-alive connections{after}, RSS growth per "
              f"connection: {', '.join(results)}")
    finally:
        origin.kill()
        origin.wait()
        shutil.rmtree(work, ignore_errors=True)

if __name__ == "__main__":
    main()
