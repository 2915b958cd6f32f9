//! HTTP/2 inbound over real sockets with the h2 crate as the client (on a tokio current-thread
//! runtime): h2c by prior knowledge and h2 by ALPN over TLS, to HTTP/1.1 origins; concurrent
//! streams, large bodies both ways, a slow reader with a tiny window, CONNECT refused, rapid
//! reset and CONTINUATION floods that leave ringway serving, GOAWAY on shutdown, and 421.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn rt() -> tokio::runtime::Runtime {
    tokio_rt()
}

type Client = h2::client::SendRequest<Bytes>;

async fn h2c(addr: SocketAddr) -> Client {
    h2c_with(addr, h2::client::Builder::new()).await
}

async fn h2c_with(addr: SocketAddr, builder: h2::client::Builder) -> Client {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (client, conn) = builder.handshake(tcp).await.expect("h2c handshake");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client
}

/// One request; (status, headers, body).
async fn request(
    client: &mut Client,
    method: &str,
    uri: &str,
    body: Option<Vec<u8>>,
) -> (u16, http::HeaderMap, Vec<u8>) {
    let req = http::Request::builder()
        .method(method)
        .uri(uri)
        .body(())
        .unwrap();
    let mut c = client.clone().ready().await.unwrap();
    let (resp, mut send) = c.send_request(req, body.is_none()).unwrap();
    if let Some(body) = body {
        for piece in body.chunks(16 * 1024) {
            send.reserve_capacity(piece.len());
            let mut left = Bytes::copy_from_slice(piece);
            while !left.is_empty() {
                let cap = std::future::poll_fn(|cx| send.poll_capacity(cx))
                    .await
                    .unwrap()
                    .unwrap();
                let n = cap.min(left.len());
                send.send_data(left.split_to(n), false).unwrap();
            }
        }
        send.send_data(Bytes::new(), true).unwrap();
    }
    let resp = resp.await.expect("a response");
    let (parts, mut body) = resp.into_parts();
    let mut out = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.unwrap();
        let _ = body.flow_control().release_capacity(chunk.len());
        out.extend_from_slice(&chunk);
    }
    (parts.status.as_u16(), parts.headers, out)
}

fn echo_origin() -> Origin {
    Origin::start(|r| {
        if r.target.starts_with("/big/") {
            let n: usize = r.target[5..].parse().unwrap();
            return Reply::Full(200, vec![], pattern(n, 42));
        }
        Reply::Full(
            200,
            vec![
                ("x-host".into(), r.header("host").unwrap_or("").into()),
                ("x-cookie".into(), r.header("cookie").unwrap_or("").into()),
                (
                    "x-proto".into(),
                    r.header("x-forwarded-proto").unwrap_or("").into(),
                ),
            ],
            r.body.clone(),
        )
    })
}

#[test]
fn h2c_requests_reach_an_http1_origin_with_host_and_cookies_mapped() {
    let origin = echo_origin();
    // :authority routes (a host route) and is the Host sent on with preserve_host.
    let proxy = Proxy::start(&format!(
        "[[upstreams]]\nname = \"up\"\nendpoints = [\"{}\"]\n\
         [[routes]]\nhost = \"example.test\"\npath_prefix = \"/\"\nproxy = \"up\"\npreserve_host = true\n\
         [[routes]]\npath_prefix = \"/\"\nrespond = {{ status = 404, body = \"other\" }}\n",
        origin.addr
    ));
    rt().block_on(async {
        let mut c = h2c(proxy.addr).await;
        let req = http::Request::builder()
            .method("GET")
            .uri("http://example.test:8080/hello?x=1")
            .header("cookie", "a=1")
            .header("cookie", "b=2")
            .body(())
            .unwrap();
        let (resp, _) = c
            .clone()
            .ready()
            .await
            .unwrap()
            .send_request(req, true)
            .unwrap();
        let resp = resp.await.unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.headers()["x-host"], "example.test:8080");
        assert_eq!(resp.headers()["x-cookie"], "a=1; b=2");
        assert_eq!(resp.headers()["x-proto"], "http");
        assert!(resp.headers().contains_key("x-request-id"));
        assert!(!resp.headers().contains_key("connection"));
        // A local answer (no route needed) and the JSON envelope for a 404.
        let (status, _, body) = request(&mut c, "GET", "http://x/healthz", None).await;
        assert_eq!(
            (status, body.as_slice()),
            (200, &b"{\"status\":\"ok\"}"[..])
        );
        // A Host that names another authority makes the request malformed (RFC 9113 §8.3.1).
        let req = http::Request::builder()
            .uri("http://example.test:8080/other")
            .header("host", "elsewhere.test")
            .body(())
            .unwrap();
        let mut ready = c.clone().ready().await.unwrap();
        let resp = ready.send_request(req, true).unwrap().0.await.unwrap();
        assert_eq!(resp.status(), 400);
    });
    assert_eq!(origin.last().target, "/hello?x=1");
    let m = metrics(proxy.addr);
    assert_eq!(m["ringway_h2_connections_total"], 1.0);
    assert!(m["ringway_h2_streams_total"] >= 2.0);
}

/// Client connections open (the scrape's own included), summed over workers.
fn connections_active(addr: SocketAddr) -> f64 {
    metrics(addr)["ringway_connections_active"]
}

/// [`connections_active`] from within the tokio runtime of the test's client.
async fn connections_active_now(addr: SocketAddr) -> f64 {
    tokio::task::spawn_blocking(move || connections_active(addr))
        .await
        .unwrap()
}

#[test]
fn an_h2c_connection_counts_as_open_until_it_closes() {
    // Served in a task of its own after its preface is detected, it is counted open there
    // (against `max_connections`) until it ends.
    let origin = echo_origin();
    let proxy = Proxy::to(origin.addr, "");
    assert_eq!(connections_active(proxy.addr), 1.0, "the scrape's own");
    let addr = proxy.addr;
    rt().block_on(async move {
        let mut c = h2c(addr).await;
        let (status, _, _) = request(&mut c, "GET", "http://t/x", None).await;
        assert_eq!(status, 200);
        // (The first scrape's connection may still be closing on another worker.)
        let open = tokio::task::spawn_blocking(move || {
            wait_until(Duration::from_secs(5), || connections_active(addr) == 2.0)
        })
        .await
        .unwrap();
        assert!(
            open,
            "the h2c connection and the scrape: {}",
            connections_active_now(addr).await
        );
    });
    // The runtime and its connection are gone.
    let closed = wait_until(Duration::from_secs(5), || connections_active(addr) == 1.0);
    assert!(closed, "{}", connections_active(addr));
}

#[test]
fn concurrent_streams_and_large_bodies_both_ways() {
    let origin = echo_origin();
    let proxy = Proxy::to(origin.addr, "");
    rt().block_on(async {
        let c = h2c(proxy.addr).await;
        let mut tasks = Vec::new();
        for i in 0..50u64 {
            let mut c = c.clone();
            tasks.push(tokio::spawn(async move {
                let body = pattern(1000 + i as usize * 37, i);
                let (status, _, got) =
                    request(&mut c, "POST", "http://x/echo", Some(body.clone())).await;
                assert_eq!(status, 200);
                assert_eq!(fnv(&got), fnv(&body));
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        // 3 MiB up (no content-length: chunked to the origin) and 5 MiB down.
        let mut c2 = c.clone();
        let up = pattern(3 << 20, 7);
        let (status, _, got) = request(&mut c2, "PUT", "http://x/echo", Some(up.clone())).await;
        assert_eq!((status, fnv(&got)), (200, fnv(&up)));
        let (status, _, got) = request(&mut c2, "GET", "http://x/big/5242880", None).await;
        assert_eq!((status, got.len()), (200, 5 << 20));
        assert_eq!(fnv(&got), fnv(&pattern(5 << 20, 42)));
    });
    assert!(
        origin.requests().iter().any(|r| r.chunked),
        "an unknown length goes chunked"
    );
}

/// A GET of `uri` over a new h2c connection whose streams grant `window` bytes (the
/// connection 64 KiB); the response body, once its head came.
async fn windowed_get(addr: SocketAddr, window: u32, uri: &str) -> h2::RecvStream {
    let mut b = h2::client::Builder::new();
    b.initial_window_size(window)
        .initial_connection_window_size(65_535);
    let c = h2c_with(addr, b).await;
    let req = http::Request::builder().uri(uri).body(()).unwrap();
    let (resp, _) = c.ready().await.unwrap().send_request(req, true).unwrap();
    resp.await.unwrap().into_body()
}

#[test]
fn a_slow_reader_with_a_tiny_window_gets_everything_in_order() {
    let origin = echo_origin();
    let proxy = Proxy::to(origin.addr, "");
    rt().block_on(async {
        let mut body = windowed_get(proxy.addr, 1024, "http://x/big/2000000").await;
        let mut got = Vec::new();
        while let Some(chunk) = body.data().await {
            let chunk = chunk.unwrap();
            assert!(chunk.len() <= 1024, "no DATA beyond the window");
            got.extend_from_slice(&chunk);
            if got.len() < 64 * 1024 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            let _ = body.flow_control().release_capacity(chunk.len());
        }
        assert_eq!(fnv(&got), fnv(&pattern(2_000_000, 42)));
    });
}

#[test]
fn connect_is_refused_and_floods_leave_ringway_serving() {
    let origin = echo_origin();
    let proxy = Proxy::to(origin.addr, "");
    rt().block_on(async {
        // CONNECT: no tunnels over HTTP/2.
        let mut c = h2c(proxy.addr).await;
        let req = http::Request::builder()
            .method("CONNECT")
            .uri("example.test:443")
            .body(())
            .unwrap();
        let (resp, _) = c
            .clone()
            .ready()
            .await
            .unwrap()
            .send_request(req, true)
            .unwrap();
        let resp = resp.await.unwrap();
        assert_eq!(resp.status(), 501);

        // Rapid reset: open streams and cancel them at once, many times.
        let flood = h2c(proxy.addr).await;
        let mut closed = false;
        for _ in 0..2000 {
            let Ok(mut f) = flood.clone().ready().await else {
                closed = true;
                break;
            };
            let req = http::Request::builder()
                .uri("http://x/big/1000000")
                .body(())
                .unwrap();
            match f.send_request(req, true) {
                Ok((resp, mut send)) => {
                    send.send_reset(h2::Reason::CANCEL);
                    drop(resp);
                }
                Err(_) => {
                    closed = true;
                    break;
                }
            }
            tokio::task::yield_now().await;
        }
        let _ = closed; // h2 may absorb resets it accepted in time; serving on is what counts

        // CONTINUATION flood: an endless header block, raw frames.
        let mut raw = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
        raw.write_all(ringway::h2::PREFACE).await.unwrap();
        raw.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).await.unwrap(); // empty SETTINGS
                                                                    // HEADERS on stream 1 without END_HEADERS: ":method: GET" (indexed 2).
        raw.write_all(&[0, 0, 1, 1, 0x1, 0, 0, 0, 1, 0x82])
            .await
            .unwrap();
        let value = vec![b'a'; 4000];
        let mut cut = false;
        for _ in 0..2000 {
            // Literal without indexing, new name "x", 4000-byte value (HPACK, 2-byte length).
            let mut block = vec![0x00, 0x01, b'x', 0x7f, 0xa1, 0x1e];
            block.extend_from_slice(&value);
            let len = block.len();
            let mut frame = vec![
                (len >> 16) as u8,
                (len >> 8) as u8,
                len as u8,
                9,
                0,
                0,
                0,
                0,
                1,
            ];
            frame.extend_from_slice(&block);
            if raw.write_all(&frame).await.is_err() {
                cut = true;
                break;
            }
        }
        if !cut {
            let mut buf = vec![0u8; 65536];
            let read = tokio::time::timeout(Duration::from_secs(5), async {
                loop {
                    match raw.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(_) => {}
                    }
                }
            })
            .await;
            assert!(
                read.is_ok(),
                "the CONTINUATION flood's connection was not closed"
            );
        }

        // Still serving: the first connection and a new one.
        let (status, _, _) = request(&mut c, "GET", "http://x/after", None).await;
        assert_eq!(status, 200);
        let mut fresh = h2c(proxy.addr).await;
        let (status, _, _) = request(&mut fresh, "GET", "http://x/after", None).await;
        assert_eq!(status, 200);
    });
}

#[test]
fn shutdown_sends_goaway_and_lets_streams_finish() {
    let origin = Origin::start(|_| {
        Reply::Delay(
            Duration::from_millis(400),
            Box::new(Reply::text(200, "late")),
        )
    });
    let mut proxy = Proxy::to(origin.addr, "");
    let addr = proxy.addr;
    let server = proxy.server.take().unwrap();
    rt().block_on(async {
        let c = h2c(addr).await;
        let req = http::Request::builder()
            .uri("http://x/slow")
            .body(())
            .unwrap();
        let (resp, _) = c
            .clone()
            .ready()
            .await
            .unwrap()
            .send_request(req, true)
            .unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        server.shutdown();
        let resp = resp.await.expect("the in-flight stream completes");
        assert_eq!(resp.status(), 200);
        let mut body = resp.into_body();
        let mut got = Vec::new();
        while let Some(chunk) = body.data().await {
            got.extend_from_slice(&chunk.unwrap());
        }
        assert_eq!(got, b"late");
        // After GOAWAY no new stream is accepted.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let refused = match c.clone().ready().await {
            Err(_) => true,
            Ok(mut c) => {
                let req = http::Request::builder().uri("http://x/").body(()).unwrap();
                match c.send_request(req, true) {
                    Err(_) => true,
                    Ok((resp, _)) => resp.await.is_err(),
                }
            }
        };
        assert!(refused, "a stream was accepted after GOAWAY");
    });
    server.join();
}

#[test]
fn h2_over_tls_by_alpn_with_421() {
    let dir = Dir::new("h2-tls");
    let ck = rcgen::generate_simple_self_signed(vec!["a.test".to_string()]).unwrap();
    dir.write_file("a.pem", ck.cert.pem().as_bytes());
    dir.write_file("a.key", ck.key_pair.serialize_pem().as_bytes());
    let origin = echo_origin();
    let text = format!(
        "workers = 1\ncpus = []\nlog_level = \"warn\"\n[[listeners]]\naddress = \"127.0.0.1:0\"\n\
         [listeners.tls]\ncert = \"a.pem\"\nkey = \"a.key\"\n\
         [[listeners]]\naddress = \"127.0.0.2:0\"\n\
         [[upstreams]]\nname = \"up\"\nendpoints = [\"{}\"]\n[[routes]]\npath_prefix = \"/\"\nproxy = \"up\"\n",
        origin.addr
    );
    dir.write(&text);
    ringway::observe::log::init("warn");
    let server = ringway::Server::start(ringway::config::load(&dir.config()).unwrap()).unwrap();
    let (addr, plain) = (server.local_addrs()[0], server.local_addrs()[1]);
    let der = ck.cert.der().clone();
    rt().block_on(async move {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(der).unwrap();
        let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from("a.test").unwrap();
        let tls = connector.connect(name, tcp).await.expect("TLS handshake");
        assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
        let (client, conn) = h2::client::handshake(tls).await.expect("h2 over TLS");
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let mut c = client;
        let (status, headers, _) = request(&mut c, "GET", "https://a.test/x", None).await;
        assert_eq!(status, 200);
        assert_eq!(headers["x-proto"], "https");
        let (status, _, body) = request(&mut c, "GET", "https://other.test/x", None).await;
        assert_eq!(status, 421, "{}", String::from_utf8_lossy(&body));
        let big = pattern(1 << 20, 3);
        let (status, _, got) =
            request(&mut c, "POST", "https://a.test/echo", Some(big.clone())).await;
        assert_eq!((status, fnv(&got)), (200, fnv(&big)));
        // Served in a task of its own after the handshake, it counts as open (against
        // `max_connections`) until it ends.
        let open = connections_active_now(plain).await;
        assert_eq!(open, 2.0, "the h2 connection and the scrape");
    });
    let closed = wait_until(Duration::from_secs(5), || connections_active(plain) == 1.0);
    assert!(closed, "{}", connections_active(plain));
    server.shutdown();
    server.join();
}

#[test]
fn an_idle_connection_gets_goaway_after_the_idle_timeout_but_a_busy_one_does_not() {
    let origin = Origin::ok("ok");
    let proxy = Proxy::to(origin.addr, "[http]\nidle_timeout = \"1s\"\n");
    rt().block_on(async {
        let tcp = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
        let (mut idle, conn) = h2::client::handshake(tcp).await.unwrap();
        let idle_conn = tokio::spawn(conn);
        let (status, _, _) = request(&mut idle, "GET", "http://x/", None).await;
        assert_eq!(status, 200);

        // A connection with a request every 300 ms stays open past the timeout.
        let mut busy = h2c(proxy.addr).await;
        let started = std::time::Instant::now();
        while started.elapsed() < Duration::from_millis(3500) {
            let (status, _, _) = request(&mut busy, "GET", "http://x/", None).await;
            assert_eq!(status, 200, "the busy connection is still served");
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        // The idle one was closed by then (GOAWAY, then the close).
        let ended = tokio::time::timeout(Duration::from_millis(500), idle_conn).await;
        assert!(ended.is_ok(), "the idle connection is still open");
    });
}

#[test]
fn a_peer_that_never_answers_the_goaway_ping_is_closed_anyway() {
    use std::io::{Read, Write};
    let origin = Origin::ok("ok");
    let proxy = Proxy::to(origin.addr, "[http]\nidle_timeout = \"1s\"\n");
    // A raw h2c client: preface and an empty SETTINGS, then it reads and answers nothing.
    let mut s = std::net::TcpStream::connect(proxy.addr).unwrap();
    s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let started = std::time::Instant::now();
    let mut all = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => all.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!("not closed: {e} after {:?}", started.elapsed()),
        }
    }
    let elapsed = started.elapsed();
    // Frame types the server sent: 9-byte headers, length then type.
    let mut types = Vec::new();
    let mut at = 0;
    while at + 9 <= all.len() {
        let len = u32::from_be_bytes([0, all[at], all[at + 1], all[at + 2]]) as usize;
        types.push(all[at + 3]);
        at += 9 + len;
    }
    assert!(types.contains(&0x7), "a GOAWAY came first: {types:?}");
    assert!(types.contains(&0x6), "with its PING: {types:?}");
    assert!(
        elapsed >= Duration::from_millis(1500) && elapsed < Duration::from_secs(6),
        "closed after {elapsed:?}"
    );
}

/// Sends `GET uri` on `c` (ending the request with its head unless `open`); the response
/// future and the request's send half.
fn get(
    c: &mut h2::client::SendRequest<Bytes>,
    uri: &str,
    open: bool,
) -> (h2::client::ResponseFuture, h2::SendStream<Bytes>) {
    let mut req = http::Request::builder().uri(uri);
    if open {
        req = req.header("content-length", "0");
    }
    c.send_request(req.body(()).unwrap(), !open).unwrap()
}

/// `send_timeout` bounds a stall, not a whole write: a reader slower than a block per
/// `send_timeout` but never stopping gets the whole body.
#[test]
fn a_slow_but_steady_reader_is_not_cut_by_the_send_timeout() {
    let origin = echo_origin();
    let proxy = Proxy::to(origin.addr, "[http]\nsend_timeout = \"500ms\"\n");
    rt().block_on(async {
        let started = std::time::Instant::now();
        let mut body = windowed_get(proxy.addr, 4096, "http://x/big/196608").await;
        let mut got = Vec::new();
        // About 80 KiB/s: a 64 KiB block takes 0.8 s to leave, longer than the timeout.
        while let Some(chunk) = body.data().await {
            let chunk = chunk.expect("no reset: the reader never stalls");
            got.extend_from_slice(&chunk);
            tokio::time::sleep(Duration::from_millis(50)).await;
            let _ = body.flow_control().release_capacity(chunk.len());
        }
        assert_eq!(fnv(&got), fnv(&pattern(196_608, 42)));
        let took = started.elapsed();
        assert!(
            took > Duration::from_millis(1500),
            "slower than the timeout: {took:?}"
        );
    });
}

#[test]
fn reset_streams_free_their_slots_when_their_exchanges_are_cancelled() {
    let origin = Origin::start(|r| {
        if r.target == "/slow" {
            Reply::Delay(
                Duration::from_millis(1500),
                Box::new(Reply::text(200, "slow")),
            )
        } else {
            Reply::text(200, "fast")
        }
    });
    let proxy = Proxy::to(origin.addr, "[http2]\nmax_concurrent_streams = 4\n");
    rt().block_on(async {
        let c = h2c(proxy.addr).await;
        // Open a slow exchange, wait until it reached the origin, reset it: four times, as
        // many as the stream limit.
        let started = std::time::Instant::now();
        for i in 1..=4 {
            let mut s = c.clone().ready().await.unwrap();
            let (resp, mut send) = get(&mut s, "http://x/slow", false);
            // (the client's connection runs on this thread: wait without blocking it)
            let deadline = std::time::Instant::now() + Duration::from_secs(2);
            while origin.requests().len() < i && std::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            assert_eq!(origin.requests().len(), i);
            send.send_reset(h2::Reason::CANCEL);
            drop(resp);
        }
        // Each reset ends its exchange at once (the upstream request is abandoned), so the
        // streams are free again long before the origin would have answered; while an
        // exchange runs, its stream still counts, however the client treated the stream.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut c = c.clone();
        let (status, _, body) = request(&mut c, "GET", "http://x/fast", None).await;
        assert_eq!((status, body.as_slice()), (200, &b"fast"[..]));
        assert!(
            started.elapsed() < Duration::from_millis(1400),
            "answered only after {:?}: the cancelled exchanges held their streams",
            started.elapsed()
        );
    });
}

#[test]
fn a_reset_during_a_retrys_pause_ends_the_exchange_without_the_retry() {
    // `/r` goes to an upstream that answers 503, retried after a pause of up to an hour; the
    // gateway takes one request at a time. A client that resets its stream during the pause
    // ends the exchange (and frees its place) at once, and the retry is never sent.
    let bad = Origin::start(|_| Reply::text(503, "bad"));
    let ok = Origin::ok("ok");
    let proxy = Proxy::start(&format!(
        "workers = 1\n[gateway]\nmax_concurrent_requests = 1\n\
         [[upstreams]]\nname = \"r\"\nendpoints = [\"{}\"]\n\
         retries = {{ attempts = 2, retry_on = [\"5xx\"], backoff_base = \"1h\", backoff_max = \"1h\", total_timeout = \"2h\" }}\n\
         [[upstreams]]\nname = \"ok\"\nendpoints = [\"{}\"]\n\
         [[routes]]\npath_prefix = \"/r\"\nproxy = \"r\"\n\
         [[routes]]\npath_prefix = \"/\"\nproxy = \"ok\"\n",
        bad.addr, ok.addr
    ));
    rt().block_on(async {
        let mut c = h2c(proxy.addr).await;
        let req = http::Request::builder().uri("http://x/r").body(()).unwrap();
        let mut ready = c.clone().ready().await.unwrap();
        let (_resp, mut stream) = ready.send_request(req, true).unwrap();
        for _ in 0..250 {
            if !bad.requests().is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(bad.requests().len(), 1, "the first attempt");
        tokio::time::sleep(Duration::from_millis(200)).await;
        stream.send_reset(h2::Reason::CANCEL);
        let mut status = 0;
        for _ in 0..50 {
            status = request(&mut c, "GET", "http://x/ok", None).await.0;
            if status == 200 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(status, 200, "the gateway's place was given back");
    });
    assert_eq!(bad.requests().len(), 1, "no retry");
}

#[test]
fn a_reset_while_the_response_is_awaited_cancels_the_upstream_request() {
    // An origin that takes one request, never answers, and reports when ringway closes.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<&str>();
    std::thread::spawn(move || {
        use std::io::Read;
        let Ok((mut s, _)) = listener.accept() else {
            return;
        };
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut head = Vec::new();
        let mut buf = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            match s.read(&mut buf) {
                Ok(n) if n > 0 => head.extend_from_slice(&buf[..n]),
                _ => return,
            }
        }
        let _ = tx.send("request");
        let closed = match s.read(&mut buf) {
            Ok(n) => n == 0,
            Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
        };
        let _ = tx.send(if closed { "closed" } else { "open" });
    });
    // (the response timeout is 15 s by default)
    let proxy = Proxy::to(addr, "");
    rt().block_on(async {
        let c = h2c(proxy.addr).await;
        let mut s = c.clone().ready().await.unwrap();
        let (resp, mut send) = get(&mut s, "http://x/never", false);
        let next = |within: Duration| {
            let rx = &rx;
            async move {
                let deadline = std::time::Instant::now() + within;
                loop {
                    if let Ok(m) = rx.try_recv() {
                        return Some(m);
                    }
                    if std::time::Instant::now() > deadline {
                        return None;
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        };
        assert_eq!(next(Duration::from_secs(3)).await, Some("request"));
        let cancelled = std::time::Instant::now();
        send.send_reset(h2::Reason::CANCEL);
        drop(resp);
        assert_eq!(
            next(Duration::from_secs(3)).await,
            Some("closed"),
            "the upstream connection of a cancelled request is closed"
        );
        assert!(
            cancelled.elapsed() < Duration::from_secs(1),
            "{:?}",
            cancelled.elapsed()
        );
        let aborts = proxy.addr;
        let aborts =
            tokio::task::spawn_blocking(move || metric_sum(aborts, "ringway_client_aborts_total"));
        assert_eq!(aborts.await.unwrap(), 1.0);
        // The client's connection serves on.
        let mut c2 = c.clone().ready().await.unwrap();
        let (resp, _send) = get(&mut c2, "http://x/again", false);
        let resp = resp.await.expect("an answer, not a broken connection");
        // (the origin is gone by now: an error status)
        assert!(resp.status().is_server_error(), "{}", resp.status());
    });
}

#[test]
fn a_stream_carries_one_exchange_even_when_its_request_never_ends() {
    let origin = Origin::ok("fast");
    let proxy = Proxy::to(origin.addr, "[http2]\nmax_concurrent_streams = 2\n");
    rt().block_on(async {
        let c = h2c(proxy.addr).await;
        // Requests whose streams the client never ends (the body is empty by its
        // Content-Length), answered, then reset: nothing of them may linger.
        for _ in 0..2 {
            let mut s = c.clone().ready().await.unwrap();
            let (resp, mut send) = get(&mut s, "http://x/a", true);
            let resp = resp.await.unwrap();
            assert_eq!(resp.status(), 200);
            let mut body = resp.into_body();
            while let Some(chunk) = body.data().await {
                chunk.unwrap();
            }
            send.send_reset(h2::Reason::CANCEL);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut c = c.clone();
        let (status, _, _) = request(&mut c, "GET", "http://x/b", None).await;
        assert_eq!(status, 200, "the earlier streams' exchanges are over");
    });
}

#[test]
fn a_client_that_grants_no_window_is_reset_after_the_send_timeout() {
    let origin = echo_origin();
    let proxy = Proxy::to(origin.addr, "[http]\nsend_timeout = \"1s\"\n");
    rt().block_on(async {
        let mut b = h2::client::Builder::new();
        b.initial_window_size(0);
        let mut c = h2c_with(proxy.addr, b).await;
        let started = std::time::Instant::now();
        let (resp, _send) = get(&mut c, "http://x/big/100000", false);
        let resp = resp.await.unwrap();
        assert_eq!(resp.status(), 200);
        let mut body = resp.into_body();
        let end = tokio::time::timeout(Duration::from_secs(10), body.data())
            .await
            .expect("the stream ends");
        let err = end.expect("an outcome").expect_err("a reset, not data");
        assert_eq!(err.reason(), Some(h2::Reason::CANCEL), "{err}");
        let elapsed = started.elapsed();
        assert!(elapsed >= Duration::from_millis(900), "{elapsed:?}");
    });
}

/// The whole frame at the front of `bytes`: (type, flags, stream id, payload); `None` while
/// part of it has yet to arrive.
fn frame(bytes: &[u8]) -> Option<(u8, u8, u32, &[u8])> {
    let head = bytes.get(..9)?;
    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    let payload = bytes.get(9..9 + len)?;
    let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
    Some((head[3], head[4], stream, payload))
}

/// Reads frames from `s` until a DATA frame ends stream 1; the DATA bytes of stream 1. Between
/// reads that find the socket drained, it pauses `pause` (a slow reader, not a stalled one).
fn read_raw_h2c_body(s: &mut std::net::TcpStream, pause: Duration) -> usize {
    use std::io::Read;
    let mut all = Vec::new();
    let (mut at, mut body) = (0, 0);
    let mut buf = vec![0u8; 1 << 20];
    s.set_nonblocking(true).unwrap();
    let started = std::time::Instant::now();
    loop {
        while let Some((kind, flags, stream, payload)) = frame(&all[at..]) {
            at += 9 + payload.len();
            match (kind, stream) {
                (0x0, 1) => {
                    body += payload.len();
                    if flags & 0x1 != 0 {
                        return body;
                    }
                }
                (0x3, 1) => panic!("stream reset after {body} bytes"),
                _ => {}
            }
        }
        all.drain(..at);
        at = 0;
        match s.read(&mut buf) {
            Ok(0) => panic!("connection closed after {body} bytes"),
            Ok(n) => all.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                assert!(started.elapsed() < Duration::from_secs(30), "{body} bytes");
                std::thread::sleep(pause);
            }
            Err(e) => panic!("{e} after {body} bytes"),
        }
    }
}

#[test]
fn a_client_that_stops_reading_loses_its_connection_after_the_send_timeout() {
    let origin = echo_origin();
    let proxy = Proxy::to(
        origin.addr,
        "[http]\nsend_timeout = \"2s\"\nidle_timeout = \"60s\"\n",
    );
    // Responses far larger than the sockets' buffers, with every window open: only the socket
    // holds them back. One client reads nothing; the other reads slowly, pausing 200 ms each
    // time it has drained the socket.
    let path = b"/big/33554432";
    let mut stalled = raw_h2c_send_get_with(proxy.addr, path, true);
    let mut slow = raw_h2c_send_get_with(proxy.addr, path, true);
    let started = std::time::Instant::now();
    assert_eq!(
        read_raw_h2c_body(&mut slow, Duration::from_millis(200)),
        32 << 20
    );
    // The stalled client's connection was reset (not kept until `idle_timeout`): what it
    // reads ends in the reset, with the rest of the body not there. (Checked once a second,
    // the stall is seen 2 to 4 s after it began.)
    let wait = Duration::from_secs(6).saturating_sub(started.elapsed());
    stalled
        .set_read_timeout(Some(Duration::from_secs(3)))
        .unwrap();
    let (got, end) = read_to_end_after(&mut stalled, wait);
    assert_eq!(
        end,
        Some(std::io::ErrorKind::ConnectionReset),
        "not reset, after {got} bytes"
    );
    assert!(got < 32 << 20, "{got}");
}

#[test]
fn empty_bodies_end_with_the_headers_and_bad_trailer_fields_are_dropped() {
    let origin = Origin::start(|r| match r.target.as_str() {
        "/empty" => Reply::Full(200, vec![], Vec::new()),
        _ => Reply::Raw(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\
              te: gzip\r\nconnection: x\r\nx-t: 1\r\n\r\n"
                .to_vec(),
        ),
    });
    let proxy = Proxy::to(origin.addr, "");
    rt().block_on(async {
        let mut c = h2c(proxy.addr).await;
        // Content-Length 0: END_STREAM on HEADERS (a gRPC trailers-only answer needs that).
        let (resp, _send) = get(&mut c, "http://x/empty", false);
        let resp = resp.await.unwrap();
        assert_eq!(resp.status(), 200);
        assert!(resp.body().is_end_stream(), "no DATA frame after the head");
        // Trailer fields HTTP/2 cannot carry are left out, the rest arrive.
        let (resp, _send) = get(&mut c, "http://x/trailers", false);
        let mut body = resp.await.unwrap().into_body();
        let mut data = Vec::new();
        while let Some(chunk) = body.data().await {
            data.extend_from_slice(&chunk.expect("no reset"));
        }
        assert_eq!(data, b"hello");
        let trailers = body.trailers().await.expect("no reset").expect("trailers");
        assert_eq!(trailers["x-t"], "1");
        assert!(!trailers.contains_key("te") && !trailers.contains_key("connection"));
    });
}

#[test]
fn a_close_delimited_response_cut_short_is_reset_not_ended() {
    let origin = raw_origin(|mut s| {
        use std::io::Write;
        read_head_raw(&mut s);
        let _ = s.write_all(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\npartial");
        std::thread::sleep(Duration::from_secs(3)); // stalls, then closes
    });
    let proxy = Proxy::start(&format!(
        "[[upstreams]]\nname = \"up\"\nendpoints = [\"{origin}\"]\nread_timeout = \"500ms\"\n\
         [[routes]]\npath_prefix = \"/\"\nproxy = \"up\"\n"
    ));
    rt().block_on(async {
        let mut c = h2c(proxy.addr).await;
        let (resp, _send) = get(&mut c, "http://x/", false);
        let mut body = resp.await.unwrap().into_body();
        let mut data = Vec::new();
        let end = loop {
            match body.data().await {
                Some(Ok(chunk)) => data.extend_from_slice(&chunk),
                Some(Err(e)) => break Some(e),
                None => break None,
            }
        };
        assert_eq!(data, b"partial");
        let err = end.expect("a reset, not a clean end of a truncated body");
        assert_eq!(err.reason(), Some(h2::Reason::INTERNAL_ERROR), "{err}");
    });
}

/// Connects, sends the h2c preface, empty SETTINGS and one GET on stream 1 (HEADERS with
/// END_STREAM | END_HEADERS: GET, http, then literal fields with indexed names: `:path` and
/// `:authority: a.example`); the stream, to read the answer from.
fn raw_h2c_send_get(addr: SocketAddr, path: &[u8]) -> std::net::TcpStream {
    raw_h2c_send_get_with(addr, path, false)
}

/// [`raw_h2c_send_get`], with `wide_open`: every window as wide as HTTP/2 allows (see
/// [`raw_h2_get`]).
fn raw_h2c_send_get_with(addr: SocketAddr, path: &[u8], wide_open: bool) -> std::net::TcpStream {
    raw_h2c_send(addr, &raw_h2_get(path, b"a.example", false, wide_open))
}

/// A connection to `addr` that has sent `bytes`.
fn raw_h2c_send(addr: SocketAddr, bytes: &[u8]) -> std::net::TcpStream {
    use std::io::Write;
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(bytes).unwrap();
    s
}

/// One raw h2c request (GET, http, the given `:path`, `:authority: a.example`); the
/// response's outcome: `Ok(first HPACK byte of its HEADERS)` (the indexed `:status`), or
/// `Err(RST_STREAM error code)`.
fn raw_h2c_get(addr: SocketAddr, path: &[u8]) -> Result<u8, u32> {
    raw_h2c_get_with(addr, path, &[])
}

/// [`raw_h2c_get`] with more fields.
fn raw_h2c_get_with(addr: SocketAddr, path: &[u8], fields: &[(&[u8], &[u8])]) -> Result<u8, u32> {
    use std::io::Read;
    let mut s = raw_h2c_send(
        addr,
        &raw_h2_get_with(path, b"a.example", false, false, fields),
    );
    // Frames until a HEADERS or RST_STREAM on stream 1.
    let mut all = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let mut at = 0;
        while let Some((kind, _, stream, payload)) = frame(&all[at..]) {
            match kind {
                0x1 if stream == 1 => return Ok(payload[0]),
                0x3 if stream == 1 => {
                    return Err(u32::from_be_bytes([
                        payload[0], payload[1], payload[2], payload[3],
                    ]))
                }
                _ => {}
            }
            at += 9 + payload.len();
        }
        match s.read(&mut buf) {
            Ok(0) | Err(_) => panic!("no response: {all:?}"),
            Ok(n) => all.extend_from_slice(&buf[..n]),
        }
    }
}

#[test]
fn an_upgrade_field_makes_an_h2_request_malformed() {
    // RFC 9113 §8.2.2: connection-specific fields (Upgrade among them) make a request
    // malformed; its stream is reset with PROTOCOL_ERROR, and nothing reaches the upstream.
    let origin = Origin::ok("ok");
    let proxy = Proxy::to(origin.addr, "");
    let upgrade: &[(&[u8], &[u8])] = &[(b"upgrade", b"websocket")];
    assert_eq!(raw_h2c_get_with(proxy.addr, b"/ws", upgrade), Err(0x1));
    // The same request with an end-to-end field instead is served.
    let other: &[(&[u8], &[u8])] = &[(b"x-upgrade", b"websocket")];
    assert_eq!(raw_h2c_get_with(proxy.addr, b"/ws", other), Ok(0x88));
    assert_eq!(origin.requests().len(), 1);
}

#[test]
fn a_path_that_is_not_origin_form_is_rejected() {
    let origin = Origin::ok("ok");
    let proxy = Proxy::to(origin.addr, "");
    // The encoding is right: an origin-form path is served (:status 200, static index 8).
    assert_eq!(raw_h2c_get(proxy.addr, b"/x"), Ok(0x88));
    assert_eq!(origin.requests().len(), 1);
    // An absolute URI or a relative path: a malformed request (RFC 9113 §8.3.1), refused
    // with PROTOCOL_ERROR or 400 (static index 12), and never routed.
    for path in [&b"http://other.example/x"[..], b"x", b"*"] {
        let outcome = raw_h2c_get(proxy.addr, path);
        assert!(
            matches!(outcome, Err(0x1) | Ok(0x8c)),
            "{}: {outcome:?}",
            String::from_utf8_lossy(path)
        );
    }
    assert_eq!(origin.requests().len(), 1, "nothing more was routed");
}

/// Sends a POST with `expect: 100-continue` and no body yet; waits for the 100 (at most
/// `wait`), then sends the body. (whether a 100 came, status, body).
async fn expect_continue(client: &mut Client, uri: &str, wait: Duration) -> (bool, u16, Vec<u8>) {
    let req = http::Request::builder()
        .method("POST")
        .uri(uri)
        .header("expect", "100-continue")
        .header("content-length", "5")
        .body(())
        .unwrap();
    let mut c = client.clone().ready().await.unwrap();
    let (mut resp, mut send) = c.send_request(req, false).unwrap();
    let interim =
        tokio::time::timeout(wait, std::future::poll_fn(|cx| resp.poll_informational(cx))).await;
    let continued = matches!(interim, Ok(Some(Ok(ref r))) if r.status() == 100);
    send.send_data(Bytes::from_static(b"hello"), true).unwrap();
    let resp = resp.await.expect("a response");
    let (parts, mut body) = resp.into_parts();
    let mut out = Vec::new();
    while let Some(chunk) = body.data().await {
        out.extend_from_slice(&chunk.unwrap());
    }
    (continued, parts.status.as_u16(), out)
}

/// The 100 and the final answer can reach the stream together (a body already there, over
/// the route's limit: 100, then 413 at once); the answer is relayed, not lost.
#[test]
fn an_answer_right_behind_a_100_continue_reaches_the_h2_client() {
    let origin = echo_origin();
    let proxy = Proxy::start(&format!(
        "workers = 1\n[[upstreams]]\nname = \"h1\"\nendpoints = [\"{}\"]\n\
         [[routes]]\npath_prefix = \"/\"\nproxy = \"h1\"\nlimits = {{ max_body_bytes = 10 }}\n",
        origin.addr
    ));
    rt().block_on(async {
        let mut c = h2c(proxy.addr).await;
        for _ in 0..3 {
            let req = http::Request::builder()
                .method("POST")
                .uri("http://x/up")
                .header("expect", "100-continue")
                .body(())
                .unwrap();
            let mut ready = c.clone().ready().await.unwrap();
            let (resp, mut send) = ready.send_request(req, false).unwrap();
            // The body goes with the head, without waiting for the 100.
            send.send_data(Bytes::from(vec![b'x'; 100]), true).unwrap();
            let resp = tokio::time::timeout(Duration::from_secs(5), resp)
                .await
                .expect("an answer in time")
                .expect("an answer, not a reset");
            assert_eq!(resp.status(), 413);
        }
        // The connection serves on.
        let (status, _, _) = request(&mut c, "GET", "http://x/after", None).await;
        assert_eq!(status, 200);
    });
    assert_eq!(
        origin.requests().len(),
        1,
        "only the GET reached the origin"
    );
}

#[test]
fn an_h2_client_expecting_100_continue_gets_it_before_sending_its_body() {
    let origin = echo_origin();
    let h2_origin = tokio_server(|tcp| async move {
        let Ok(mut conn) = h2::server::handshake(tcp).await else {
            return;
        };
        while let Some(Ok((req, mut respond))) = conn.accept().await {
            tokio::spawn(async move {
                let mut body = req.into_body();
                let mut got = Vec::new();
                while let Some(Ok(chunk)) = body.data().await {
                    let _ = body.flow_control().release_capacity(chunk.len());
                    got.extend_from_slice(&chunk);
                }
                let resp = http::Response::builder().status(200).body(()).unwrap();
                if let Ok(mut send) = respond.send_response(resp, false) {
                    let _ = send.send_data(Bytes::from(got), true);
                }
            });
        }
    });
    let proxy = Proxy::start(&format!(
        "workers = 1\n[[upstreams]]\nname = \"h1\"\nendpoints = [\"{}\"]\n\
         [[upstreams]]\nname = \"h2\"\nprotocol = \"h2c\"\nendpoints = [\"{h2_origin}\"]\n\
         [[routes]]\npath_prefix = \"/h2/\"\nproxy = \"h2\"\n\
         [[routes]]\npath_prefix = \"/\"\nproxy = \"h1\"\n",
        origin.addr
    ));
    rt().block_on(async {
        let mut c = h2c(proxy.addr).await;
        for uri in ["http://x/h1/up", "http://x/h2/up"] {
            let (continued, status, body) =
                expect_continue(&mut c, uri, Duration::from_secs(3)).await;
            assert!(continued, "{uri}: no 100 Continue");
            assert_eq!((status, body.as_slice()), (200, &b"hello"[..]), "{uri}");
        }
    });
}

/// The frames of stream 1 of one raw h2c GET (`:authority: a.example`), through the one
/// that ends it: (type, flags, payload length).
fn raw_h2c_frames(addr: SocketAddr, path: &[u8]) -> Vec<(u8, u8, usize)> {
    use std::io::Read;
    let mut s = raw_h2c_send_get(addr, path);
    let mut all = Vec::new();
    let mut frames = Vec::new();
    let mut at = 0;
    let mut buf = [0u8; 4096];
    loop {
        while let Some((kind, flags, stream, payload)) = frame(&all[at..]) {
            let len = payload.len();
            at += 9 + len;
            if stream == 1 {
                frames.push((kind, flags, len));
                if flags & 0x1 != 0 || kind == 0x3 {
                    return frames;
                }
            }
        }
        match s.read(&mut buf) {
            Ok(0) | Err(_) => panic!("stream 1 did not end: {frames:?}"),
            Ok(n) => all.extend_from_slice(&buf[..n]),
        }
    }
}

#[test]
fn an_upstreams_early_hints_reach_an_h2_client_as_an_informational_headers_frame() {
    let proxy = Proxy::to(early_hints_origin(), "");
    assert_interim_then_final_frames(proxy.addr);
}

/// A raw h2c GET through ringway at `addr` gets HEADERS (the interim response), HEADERS (the
/// final one), and DATA with END_STREAM.
fn assert_interim_then_final_frames(addr: SocketAddr) {
    let frames = raw_h2c_frames(addr, b"/x");
    let kinds: Vec<(u8, u8)> = frames.iter().map(|f| (f.0, f.1)).collect();
    assert_eq!(
        kinds,
        vec![(0x1, 0x4), (0x1, 0x4), (0x0, 0x1)],
        "{frames:?}"
    );
}

#[test]
fn an_h2_upstreams_early_hints_reach_http11_and_h2_clients_but_not_http10_ones() {
    let h2_origin = tokio_server(|tcp| async move {
        let Ok(mut conn) = h2::server::handshake(tcp).await else {
            return;
        };
        while let Some(Ok((_req, mut respond))) = conn.accept().await {
            // A 100 (never passed on), then the hint, then the answer.
            for (status, link) in [(100, None), (103, Some("</a.css>; rel=preload"))] {
                let mut interim = http::Response::builder().status(status);
                if let Some(link) = link {
                    interim = interim.header("link", link);
                }
                let _ = respond.send_informational(interim.body(()).unwrap());
            }
            let resp = http::Response::builder()
                .status(200)
                .header("content-length", "2");
            if let Ok(mut send) = respond.send_response(resp.body(()).unwrap(), false) {
                let _ = send.send_data(Bytes::from_static(b"ok"), true);
            }
        }
    });
    let proxy = Proxy::start(&format!(
        "workers = 1\n[[upstreams]]\nname = \"h2\"\nprotocol = \"h2c\"\n\
         endpoints = [\"{h2_origin}\"]\n[[routes]]\npath_prefix = \"/\"\nproxy = \"h2\"\n"
    ));
    let hint = "HTTP/1.1 103 Early Hints\r\nlink: </a.css>; rel=preload";
    assert_interim_reaches_http11_only(proxy.addr, hint);
    assert_interim_then_final_frames(proxy.addr);
}

#[test]
fn a_small_response_is_one_headers_and_one_data_frame() {
    let origin = Origin::ok("hello");
    let proxy = Proxy::to(origin.addr, "");
    let frames = raw_h2c_frames(proxy.addr, b"/x");
    // HEADERS (END_HEADERS), then DATA with the 5 bytes and END_STREAM: no empty DATA after.
    assert_eq!(frames, vec![(0x1, 0x4, frames[0].2), (0x0, 0x1, 5)]);
}

#[test]
fn a_relayed_head_gets_the_proxys_framing_date_and_request_id_over_h2() {
    // The upstream's framing, connection fields and request id are its own; a date it sent
    // is kept (and not doubled), one it did not send is added.
    let origin = Origin::start(|r| {
        let dated = if r.target == "/dated" {
            "Date: Sun, 06 Nov 1994 08:49:37 GMT\r\n"
        } else {
            ""
        };
        let body = if r.method == "HEAD" { "" } else { "hello" };
        Reply::Raw(
            format!(
                "HTTP/1.1 203 Fine\r\nContent-Type: text/x\r\nConnection: X-Drop\r\n\
                 X-Drop: 1\r\nKeep-Alive: timeout=5\r\nX-Request-Id: from-upstream\r\n\
                 Set-Cookie: a=1\r\nSet-Cookie: b=2\r\n{dated}Content-Length: 5\r\n\r\n{body}"
            )
            .into_bytes(),
        )
    });
    let proxy = Proxy::to(origin.addr, "");
    rt().block_on(async {
        let mut c = h2c(proxy.addr).await;
        for (method, path) in [("GET", "/"), ("GET", "/dated"), ("HEAD", "/")] {
            let uri = format!("http://a.example{path}");
            let (status, h, body) = request(&mut c, method, &uri, None).await;
            assert_eq!(status, 203, "{method} {path}");
            assert_eq!(h["content-type"], "text/x");
            assert_eq!(h["content-length"], "5", "{method}: the length is stated");
            let cookies: Vec<_> = h.get_all("set-cookie").iter().collect();
            assert_eq!(cookies, ["a=1", "b=2"]);
            for gone in ["connection", "keep-alive", "x-drop", "transfer-encoding"] {
                assert!(!h.contains_key(gone), "{gone} is connection-specific");
            }
            let ids: Vec<_> = h.get_all("x-request-id").iter().collect();
            assert_eq!(ids.len(), 1, "one request id: {ids:?}");
            assert_ne!(ids[0], "from-upstream", "the proxy's request id");
            let dates: Vec<_> = h.get_all("date").iter().collect();
            assert_eq!(dates.len(), 1, "one date: {dates:?}");
            if path == "/dated" {
                assert_eq!(dates[0], "Sun, 06 Nov 1994 08:49:37 GMT");
            } else {
                let date = dates[0].to_str().expect("visible ASCII");
                assert!(
                    httpdate::parse_http_date(date).is_ok(),
                    "the proxy's date: {date:?}"
                );
            }
            let want: &[u8] = if method == "HEAD" { b"" } else { b"hello" };
            assert_eq!(body, want, "{method} {path}");
        }
    });
}

#[test]
fn a_connection_flooding_frames_does_not_hold_the_worker_from_others() {
    // One h2c client writes PRIORITY frames (which need no answer) as fast as it can for 2 s,
    // and reads whatever comes back; meanwhile other clients are answered at once: the
    // flooding connection's task gives the worker up now and then, though its socket never
    // runs dry.
    let proxy = Proxy::start(
        "workers = 1\n[[routes]]\npath_prefix = \"/\"\nrespond = { status = 200, body = \"ok\" }",
    );
    let priority = b"\0\0\x05\x02\0\0\0\0\x01\0\0\0\0\x10";
    let chunk = priority
        .iter()
        .copied()
        .cycle()
        .take(priority.len() * 4096)
        .collect();
    let (slowest, sent) = served_during_flood(
        proxy.addr,
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0",
        chunk,
    );
    assert!(
        sent > 16 << 20,
        "the flood was too slow to tell: {sent} bytes"
    );
    assert!(
        slowest < Duration::from_millis(300),
        "a request waited {slowest:?}"
    );
}
