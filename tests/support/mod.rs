//! Test support: ringway in-process on loopback, origins written here (blocking std sockets and
//! threads, parsed with httparse, independent of ringway's own codec), and a byte-exact client.
#![allow(
    dead_code,
    unreachable_pub,
    clippy::disallowed_methods,
    clippy::disallowed_types
)] // tests may block and lock

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use ringway::Server;

/// A running ringway and its first listener's address.
pub struct Proxy {
    pub server: Option<Server>,
    pub addr: SocketAddr,
}

impl Proxy {
    /// Starts ringway with `extra` TOML plus one listener on an ephemeral loopback port and
    /// (unless `extra` sets `workers`) 2 unpinned workers.
    pub fn start(extra: &str) -> Proxy {
        // Top-level keys of `extra` must come before any table: it goes first, the listener last.
        let workers = if extra.contains("workers =") {
            ""
        } else {
            "workers = 2\n"
        };
        let text = format!(
            "{workers}cpus = []\nlog_level = \"warn\"\n{extra}\n[[listeners]]\naddress = \"127.0.0.1:0\"\n"
        );
        let gen = ringway::config::compile(&text, "test.toml").expect("test config compiles");
        ringway::observe::log::init("warn");
        let server = Server::start(gen).expect("ringway starts");
        let addr = server.local_addrs()[0];
        Proxy {
            server: Some(server),
            addr,
        }
    }

    /// A proxy with one upstream `up` at `origin` and a catch-all route to it.
    pub fn to(origin: SocketAddr, extra: &str) -> Proxy {
        Proxy::start(&format!(
            "{extra}\n[[upstreams]]\nname = \"up\"\nendpoints = [\"{origin}\"]\n\
             [[routes]]\npath_prefix = \"/\"\nproxy = \"up\"\n"
        ))
    }

    pub fn connect(&self) -> Client {
        Client::connect(self.addr)
    }

    /// Graceful shutdown, waiting for the workers.
    pub fn stop(&mut self) {
        if let Some(s) = self.server.take() {
            s.shutdown();
            s.join();
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A parsed response.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn headers_named(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
            .collect()
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The JSON error envelope's code (crude extraction, enough for tests).
    pub fn error_code(&self) -> Option<String> {
        let t = self.text();
        let i = t.find("\"code\":\"")? + 8;
        let j = t[i..].find('"')?;
        Some(t[i..i + j].to_string())
    }
}

/// A blocking client on one connection.
pub struct Client {
    pub stream: TcpStream,
    reader: BufReader<TcpStream>,
}

impl Client {
    pub fn connect(addr: SocketAddr) -> Client {
        let stream = TcpStream::connect(addr).expect("connect to ringway");
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let reader = BufReader::new(stream.try_clone().unwrap());
        Client { stream, reader }
    }

    pub fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("write to ringway");
    }

    /// Sends `GET path` with Host `h` on this connection and reads the response.
    pub fn get(&mut self, path: &str) -> Response {
        self.send(format!("GET {path} HTTP/1.1\r\nHost: test\r\n\r\n").as_bytes());
        self.read_response(false).expect("a response")
    }

    /// Reads one response; `head_request` when it answers a HEAD. `None` if the connection
    /// closed before a status line.
    pub fn read_response(&mut self, head_request: bool) -> Option<Response> {
        read_response(&mut self.reader, head_request)
    }

    /// Reads until EOF; what remains unread on the connection.
    pub fn read_to_end(&mut self) -> Vec<u8> {
        let mut rest = Vec::new();
        let _ = self.reader.read_to_end(&mut rest);
        rest
    }

    /// Whether the server closed the connection (EOF within `wait`).
    pub fn is_closed(&mut self, wait: Duration) -> bool {
        self.stream.set_read_timeout(Some(wait)).unwrap();
        let mut b = [0u8; 1];
        let closed = matches!(self.reader.read(&mut b), Ok(0))
            || matches!(self.reader.read(&mut b), Err(ref e) if e.kind() == std::io::ErrorKind::ConnectionReset);
        self.stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        closed
    }
}

/// `GET /` on `c` is answered 502 (an invalid upstream response) within 2 s: at once, not
/// after a response timeout.
pub fn assert_prompt_502(c: &mut Client) {
    let started = Instant::now();
    let r = c.get("/");
    assert_eq!(r.status, 502, "{}", r.text());
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}

/// Through an upstream that states `content-length: 5` on every response (`/204` a 204, `/304`
/// a 304, anything else a 200, all without a body): a 204 reaches the client without the
/// length, a 304 and a response to HEAD with it.
pub fn assert_bodiless_lengths(c: &mut Client) {
    for (method, path, status, length) in [
        ("GET", "/204", 204, None),
        ("HEAD", "/204", 204, None),
        ("GET", "/304", 304, Some("5")),
        ("HEAD", "/200", 200, Some("5")),
    ] {
        c.send(format!("{method} {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes());
        let r = c.read_response(true).expect("a response");
        assert_eq!(r.status, status, "{method} {path}");
        assert_eq!(r.header("content-length"), length, "{method} {path}");
    }
}

/// Reads one HTTP/1.1 response (Content-Length, chunked or until close).
pub fn read_response<R: BufRead>(r: &mut R, head_request: bool) -> Option<Response> {
    let mut head = Vec::new();
    loop {
        let mut line = Vec::new();
        let n = r.read_until(b'\n', &mut line).ok()?;
        if n == 0 {
            return None;
        }
        let blank = line == b"\r\n";
        head.extend_from_slice(&line);
        if blank && head.len() > 2 {
            break;
        }
    }
    let mut hdrs = [httparse::EMPTY_HEADER; 128];
    let mut resp = httparse::Response::new(&mut hdrs);
    resp.parse(&head).ok()?;
    let status = resp.code?;
    let headers: Vec<(String, String)> = resp
        .headers
        .iter()
        .map(|h| {
            (
                h.name.to_string(),
                String::from_utf8_lossy(h.value).into_owned(),
            )
        })
        .collect();
    let find = |n: &str| {
        headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(n))
            .map(|(_, v)| v.clone())
    };
    let mut body = Vec::new();
    if !(head_request || status == 204 || status == 304 || (100..200).contains(&status)) {
        if find("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
            body = read_chunked(r)?;
        } else if let Some(n) = find("content-length") {
            let n: usize = n.trim().parse().ok()?;
            body = vec![0; n];
            r.read_exact(&mut body).ok()?;
        } else {
            r.read_to_end(&mut body).ok()?;
        }
    }
    Some(Response {
        status,
        headers,
        body,
    })
}

fn read_chunked<R: BufRead>(r: &mut R) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let mut line = String::new();
        r.read_line(&mut line).ok()?;
        let size = usize::from_str_radix(line.trim().split(';').next()?, 16).ok()?;
        if size == 0 {
            // Trailers until the empty line.
            loop {
                let mut t = String::new();
                if r.read_line(&mut t).ok()? == 0 || t == "\r\n" {
                    return Some(body);
                }
            }
        }
        let start = body.len();
        body.resize(start + size, 0);
        r.read_exact(&mut body[start..]).ok()?;
        let mut crlf = [0u8; 2];
        r.read_exact(&mut crlf).ok()?;
    }
}

/// A request as an origin saw it.
#[derive(Debug, Clone)]
pub struct SeenRequest {
    pub method: String,
    pub target: String,
    pub version: u8,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// Which connection (0-based, in accept order) it came on.
    pub conn: usize,
    /// Whether the body came chunked.
    pub chunked: bool,
}

impl SeenRequest {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn headers_named(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
            .collect()
    }
}

/// What an origin handler answers.
pub enum Reply {
    /// A complete response: status, headers, body (Content-Length added unless present or
    /// chunked is asked for with a `transfer-encoding: chunked` header).
    Full(u16, Vec<(String, String)>, Vec<u8>),
    /// Raw bytes written as they are, then the connection stays open for the next request.
    Raw(Vec<u8>),
    /// Raw bytes, then close.
    RawClose(Vec<u8>),
    /// Sleep, then answer.
    Delay(Duration, Box<Reply>),
}

impl Reply {
    pub fn text(status: u16, body: &str) -> Reply {
        Reply::Full(status, vec![], body.as_bytes().to_vec())
    }
}

type Handler = dyn Fn(&SeenRequest) -> Reply + Send + Sync;

/// A keep-alive HTTP/1.1 origin on a loopback port.
pub struct Origin {
    pub addr: SocketAddr,
    pub seen: Arc<Mutex<Vec<SeenRequest>>>,
    pub connections: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl Origin {
    pub fn start(handler: impl Fn(&SeenRequest) -> Reply + Send + Sync + 'static) -> Origin {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        listener.set_nonblocking(true).unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let connections = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let handler: Arc<Handler> = Arc::new(handler);
        {
            let (seen, connections, stop) = (seen.clone(), connections.clone(), stop.clone());
            thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((s, _)) => {
                            s.set_nonblocking(false).unwrap();
                            let id = connections.fetch_add(1, Ordering::SeqCst);
                            let (seen, handler) = (seen.clone(), handler.clone());
                            thread::spawn(move || serve_origin_conn(s, id, seen, handler));
                        }
                        Err(_) => thread::sleep(Duration::from_millis(2)),
                    }
                }
            });
        }
        Origin {
            addr,
            seen,
            connections,
            stop,
        }
    }

    /// An origin answering 200 with `body` to everything.
    pub fn ok(body: &'static str) -> Origin {
        Origin::start(move |_| Reply::text(200, body))
    }

    pub fn requests(&self) -> Vec<SeenRequest> {
        self.seen.lock().unwrap().clone()
    }

    pub fn last(&self) -> SeenRequest {
        self.requests()
            .last()
            .cloned()
            .expect("the origin saw a request")
    }

    pub fn connection_count(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

impl Drop for Origin {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn serve_origin_conn(
    s: TcpStream,
    id: usize,
    seen: Arc<Mutex<Vec<SeenRequest>>>,
    handler: Arc<Handler>,
) {
    let mut w = s.try_clone().unwrap();
    let mut r = BufReader::new(s);
    while let Some(req) = read_request(&mut r, id) {
        seen.lock().unwrap().push(req.clone());
        let mut reply = handler(&req);
        while let Reply::Delay(d, next) = reply {
            thread::sleep(d);
            reply = *next;
        }
        let ok = match reply {
            Reply::Full(status, headers, body) => {
                let mut out = format!("HTTP/1.1 {status} X\r\n").into_bytes();
                let chunked = headers.iter().any(|(n, v)| {
                    n.eq_ignore_ascii_case("transfer-encoding") && v.eq_ignore_ascii_case("chunked")
                });
                let has_len = headers
                    .iter()
                    .any(|(n, _)| n.eq_ignore_ascii_case("content-length"));
                for (n, v) in &headers {
                    out.extend_from_slice(format!("{n}: {v}\r\n").as_bytes());
                }
                let bodiless = req.method == "HEAD" || status == 204 || status == 304;
                if !chunked && !has_len && status != 204 && status != 304 {
                    out.extend_from_slice(format!("content-length: {}\r\n", body.len()).as_bytes());
                }
                out.extend_from_slice(b"\r\n");
                if !bodiless {
                    if chunked {
                        for piece in body.chunks(7000) {
                            out.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
                            out.extend_from_slice(piece);
                            out.extend_from_slice(b"\r\n");
                        }
                        out.extend_from_slice(b"0\r\n\r\n");
                    } else {
                        out.extend_from_slice(&body);
                    }
                }
                w.write_all(&out).is_ok()
            }
            Reply::Raw(bytes) => w.write_all(&bytes).is_ok(),
            Reply::RawClose(bytes) => {
                let _ = w.write_all(&bytes);
                let _ = w.flush();
                return;
            }
            Reply::Delay(..) => unreachable!(),
        };
        if !ok {
            return;
        }
    }
}

/// Reads one request as an origin (httparse + simple framing).
pub fn read_request<R: BufRead>(r: &mut R, conn: usize) -> Option<SeenRequest> {
    let mut head = Vec::new();
    loop {
        let mut line = Vec::new();
        if r.read_until(b'\n', &mut line).ok()? == 0 {
            return None;
        }
        let blank = line == b"\r\n";
        head.extend_from_slice(&line);
        if blank && head.len() > 2 {
            break;
        }
    }
    let mut hdrs = [httparse::EMPTY_HEADER; 128];
    let mut req = httparse::Request::new(&mut hdrs);
    req.parse(&head).ok()?;
    let headers: Vec<(String, String)> = req
        .headers
        .iter()
        .map(|h| {
            (
                h.name.to_string(),
                String::from_utf8_lossy(h.value).into_owned(),
            )
        })
        .collect();
    let find = |n: &str| {
        headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(n))
            .map(|(_, v)| v.clone())
    };
    let chunked = find("transfer-encoding").is_some();
    let body = if chunked {
        read_chunked(r)?
    } else if let Some(n) = find("content-length") {
        let mut b = vec![0; n.parse().ok()?];
        r.read_exact(&mut b).ok()?;
        b
    } else {
        Vec::new()
    };
    Some(SeenRequest {
        method: req.method?.to_string(),
        target: req.path?.to_string(),
        version: req.version?,
        headers,
        body,
        conn,
        chunked,
    })
}

/// A raw origin: each accepted connection is handed to `f` (on its own thread).
pub fn raw_origin(f: impl Fn(TcpStream) + Send + Sync + 'static) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let f = Arc::new(f);
    thread::spawn(move || {
        for s in listener.incoming().flatten() {
            let f = f.clone();
            thread::spawn(move || f(s));
        }
    });
    addr
}

/// An upstream sending 103 Early Hints, then its answer, on every connection.
/// Asserts that `GET /` through ringway at `addr` reaches an HTTP/1.1 client as the interim
/// response `hint` (its head up to the blank line), then a 200 with body `ok`, and an HTTP/1.0
/// client as the 200 alone.
pub fn assert_interim_reaches_http11_only(addr: SocketAddr, hint: &str) {
    let mut c = Client::connect(addr);
    c.send(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
    let back = String::from_utf8(c.read_to_end()).unwrap();
    assert!(
        back.starts_with(&format!("{hint}\r\n\r\nHTTP/1.1 200 OK\r\n")),
        "{back}"
    );
    assert!(back.ends_with("\r\n\r\nok"), "{back}");
    let mut c = Client::connect(addr);
    c.send(b"GET / HTTP/1.0\r\nHost: a\r\n\r\n");
    let back = String::from_utf8(c.read_to_end()).unwrap();
    assert!(back.starts_with("HTTP/1.1 200 OK\r\n"), "{back}");
}

pub fn early_hints_origin() -> SocketAddr {
    raw_origin(|mut s| {
        while !read_head_raw(&mut s).is_empty() {
            let _ = std::io::Write::write_all(
                &mut s,
                b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\nX-Hop: 1\r\n\
                  Content-Length: 40\r\nConnection: X-Hop\r\n\r\nHTTP/1.1 100 Continue\r\n\r\n\
                  HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
            );
        }
    })
}

/// Reads a request head (through the empty line) from a raw stream.
pub fn read_head_raw(s: &mut TcpStream) -> Vec<u8> {
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match s.read(&mut b) {
            Ok(1) => head.push(b[0]),
            _ => break,
        }
    }
    head
}

/// Asserts that no exchange of a keep-alive connection, timed in order, waited for a delayed
/// ACK (Linux delays one by up to 40 ms). A new connection acknowledges at once anyway: the
/// first two exchanges are not judged.
pub fn assert_no_delayed_ack(times: &[Duration]) {
    let slow = times
        .iter()
        .skip(2)
        .filter(|t| **t >= Duration::from_millis(30))
        .count();
    assert_eq!(slow, 0, "exchanges slowed by a delayed ACK: {times:?}");
}

/// A port on which nothing listens (bound then released), on 127.0.0.2: every other
/// socket of the tests is on 127.0.0.1, so a test running beside this one cannot be given
/// the released port for a listener of its own (which made a "closed" upstream answer 200).
pub fn closed_port() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.2:0").unwrap();
    l.local_addr().unwrap()
}

/// A listener whose accept queue is full: it drops further SYNs, so connecting to `addr`
/// hangs until the connector gives up. Kept so while this lives.
pub struct Unanswering {
    pub addr: SocketAddr,
    _listener: TcpListener,
    _fillers: Vec<socket2::Socket>,
}

pub fn unanswering() -> Unanswering {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    socket2::SockRef::from(&listener).listen(0).unwrap();
    let addr = listener.local_addr().unwrap();
    let mut fillers = Vec::new();
    for _ in 0..8 {
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        s.set_nonblocking(true).unwrap();
        let _ = s.connect(&addr.into());
        fillers.push(s);
    }
    std::thread::sleep(Duration::from_millis(100));
    Unanswering {
        addr,
        _listener: listener,
        _fillers: fillers,
    }
}

/// FNV-1a 64: a cheap fingerprint for comparing large bodies.
pub fn fnv(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for &b in data {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

/// Deterministic pseudo-random bytes.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Polls `cond` until true or `timeout`.
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + timeout;
    while Instant::now() < end {
        if cond() {
            return true;
        }
        thread::sleep(Duration::from_millis(10));
    }
    cond()
}

/// Scrapes /metrics into a name{labels} → value map.
pub fn metrics(addr: SocketAddr) -> HashMap<String, f64> {
    let mut c = Client::connect(addr);
    let resp = c.get("/metrics");
    assert_eq!(resp.status, 200);
    resp.text()
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

/// The sum of every series of metric `name` (all label sets), 0 when there is none.
pub fn metric_sum(addr: SocketAddr, name: &str) -> f64 {
    metrics(addr)
        .iter()
        .filter(|(k, _)| k.as_str() == name || k.starts_with(&format!("{name}{{")))
        .map(|(_, v)| v)
        .sum()
}

/// One request to the admin listener (plain threads, one request per connection): the status
/// and the body.
pub fn admin(addr: SocketAddr, method: &str, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(
        format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\n\r\n").as_bytes(),
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let status = text[9..12].parse().unwrap();
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    (status, body)
}

/// Writes `text` as the config in `dir` and starts ringway from that file (reloads then read
/// it again); returns the server and its first listener's address.
pub fn start_in(dir: &Dir, text: &str) -> (Server, SocketAddr) {
    dir.write(text);
    let gen = ringway::config::load(&dir.config()).expect("config compiles");
    ringway::observe::log::init("error");
    let server = Server::start(gen).expect("starts");
    let addr = server.local_addrs()[0];
    (server, addr)
}

/// A scratch directory for config files, removed when dropped.
pub struct Dir(pub std::path::PathBuf);

impl Dir {
    pub fn new(name: &str) -> Dir {
        let d = std::env::temp_dir().join(format!("ringway-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }

    pub fn config(&self) -> std::path::PathBuf {
        self.0.join("ringway.toml")
    }

    /// Replaces the config atomically (write then rename), as editors and deploy tools do.
    pub fn write(&self, text: &str) {
        self.write_file("ringway.toml", text.as_bytes());
    }

    /// Replaces `name` in the directory atomically; returns its path.
    pub fn write_file(&self, name: &str, bytes: &[u8]) -> std::path::PathBuf {
        let path = self.0.join(name);
        let tmp = self.0.join(format!("{name}.tmp"));
        std::fs::write(&tmp, bytes).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
        path
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A tokio current-thread runtime (h2, tonic and hyper run on tokio in the tests).
pub fn tokio_rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A server on a loopback port, on its own thread and tokio runtime: `serve` runs as a task
/// for each accepted connection.
pub fn tokio_server<F, Fut>(serve: F) -> SocketAddr
where
    F: Fn(tokio::net::TcpStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    listener.set_nonblocking(true).unwrap();
    thread::spawn(move || {
        tokio_rt().block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            loop {
                if let Ok((tcp, _)) = listener.accept().await {
                    tokio::spawn(serve(tcp));
                }
            }
        });
    });
    addr
}

/// The bytes an HTTP/2 client sends to open a connection and GET `path` on stream 1: the
/// preface, SETTINGS, then HEADERS with END_STREAM | END_HEADERS (GET, `:scheme` https when
/// `tls`, else http, then literal fields with indexed names: `:path`, `:authority`).
/// `wide_open`: every window as wide as HTTP/2 allows (an `INITIAL_WINDOW_SIZE` setting and a
/// connection WINDOW_UPDATE of 2^31 - 1), so that only the socket holds the response back.
pub fn raw_h2_get(path: &[u8], authority: &[u8], tls: bool, wide_open: bool) -> Vec<u8> {
    raw_h2_get_with(path, authority, tls, wide_open, &[])
}

/// [`raw_h2_get`] with more `fields` after `:authority` (literals with literal names, no
/// Huffman coding; each name and value shorter than 127 bytes).
pub fn raw_h2_get_with(
    path: &[u8],
    authority: &[u8],
    tls: bool,
    wide_open: bool,
    fields: &[(&[u8], &[u8])],
) -> Vec<u8> {
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    if wide_open {
        let max = 0x7fff_ffffu32;
        out.extend_from_slice(&[0, 0, 6, 0x4, 0, 0, 0, 0, 0, 0, 0x4]);
        out.extend_from_slice(&max.to_be_bytes());
        out.extend_from_slice(&[0, 0, 4, 0x8, 0, 0, 0, 0, 0]);
        out.extend_from_slice(&(max - 65_535).to_be_bytes());
    } else {
        out.extend_from_slice(&[0, 0, 0, 0x4, 0, 0, 0, 0, 0]);
    }
    let scheme = if tls { 0x87 } else { 0x86 };
    let mut block = vec![0x82, scheme, 0x04, path.len() as u8];
    block.extend_from_slice(path);
    block.extend_from_slice(&[0x01, authority.len() as u8]);
    block.extend_from_slice(authority);
    for (name, value) in fields {
        block.extend_from_slice(&[0x00, name.len() as u8]);
        block.extend_from_slice(name);
        block.push(value.len() as u8);
        block.extend_from_slice(value);
    }
    out.extend_from_slice(&[0, 0, block.len() as u8, 1, 0x5, 0, 0, 0, 1]);
    out.extend_from_slice(&block);
    out
}

/// Reads `s` to its end after `wait`: the bytes read, and how the reading ended (`None`: end
/// of stream, else the error's kind).
pub fn read_to_end_after(s: &mut impl Read, wait: Duration) -> (usize, Option<std::io::ErrorKind>) {
    std::thread::sleep(wait);
    let mut buf = vec![0u8; 1 << 20];
    let mut got = 0;
    loop {
        match s.read(&mut buf) {
            Ok(0) => return (got, None),
            Ok(n) => got += n,
            Err(e) => return (got, Some(e.kind())),
        }
    }
}

/// Floods `addr` from one connection for 2 s (`preface`, then `chunk` again and again, its
/// answers read and dropped) while another client asks for `/` on a new connection every
/// 100 ms; the slowest of those answers (each must be a 200), and the bytes the flood wrote.
pub fn served_during_flood(addr: SocketAddr, preface: &[u8], chunk: Vec<u8>) -> (Duration, usize) {
    let mut flood = TcpStream::connect(addr).unwrap();
    let mut sink = flood.try_clone().unwrap();
    let closer = flood.try_clone().unwrap();
    thread::spawn(move || {
        let mut buf = [0u8; 65536];
        while matches!(sink.read(&mut buf), Ok(n) if n > 0) {}
    });
    let preface = preface.to_vec();
    let flooding = thread::spawn(move || {
        flood.write_all(&preface).unwrap();
        let until = Instant::now() + Duration::from_secs(2);
        let mut sent = 0usize;
        while Instant::now() < until && flood.write_all(&chunk).is_ok() {
            sent += chunk.len();
        }
        sent
    });
    thread::sleep(Duration::from_millis(200));
    let mut slowest = Duration::ZERO;
    for _ in 0..10 {
        let started = Instant::now();
        let r = Client::connect(addr).get("/");
        assert_eq!(r.status, 200);
        slowest = slowest.max(started.elapsed());
        thread::sleep(Duration::from_millis(100));
    }
    let sent = flooding.join().unwrap();
    let _ = closer.shutdown(std::net::Shutdown::Both);
    (slowest, sent)
}
