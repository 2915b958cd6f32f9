//! Protocol upgrades and long responses over real sockets: a WebSocket echo through ringway
//! (handshake, frames both ways, close handshake), raw 101 tunnels with bytes riding along
//! the handshake, `h2c` never tunnelled, an upgrade the upstream declines, and server-sent
//! events flushed as they come.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

mod support;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use support::*;
use tungstenite::Message;

fn ws_origin() -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    thread::spawn(move || {
        for s in listener.incoming().flatten() {
            thread::spawn(move || {
                let Ok(mut ws) = tungstenite::accept(s) else {
                    return;
                };
                while let Ok(msg) = ws.read() {
                    match msg {
                        Message::Text(t) => {
                            let _ = ws.send(Message::Text(format!("echo: {t}")));
                        }
                        Message::Binary(b) => {
                            let _ = ws.send(Message::Binary(b));
                        }
                        Message::Close(_) => {}
                        _ => {}
                    }
                }
            });
        }
    });
    addr
}

#[test]
fn a_websocket_echoes_through_ringway_and_closes_cleanly() {
    let origin = ws_origin();
    let proxy = Proxy::to(origin, "");
    let stream = TcpStream::connect(proxy.addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let url = format!("ws://{}/chat", proxy.addr);
    let (mut ws, resp) =
        tungstenite::client(url.as_str(), stream).expect("handshake through ringway");
    assert_eq!(resp.status(), 101);
    assert!(resp.headers().get("x-request-id").is_some());
    ws.send(Message::Text("hello".into())).unwrap();
    assert_eq!(ws.read().unwrap(), Message::Text("echo: hello".into()));
    let big = pattern(300_000, 3);
    ws.send(Message::Binary(big.clone())).unwrap();
    assert_eq!(ws.read().unwrap(), Message::Binary(big));
    ws.close(None).unwrap();
    // The close handshake completes: the server's Close frame comes back, then the end.
    loop {
        match ws.read() {
            Ok(Message::Close(_)) | Ok(_) => continue,
            Err(tungstenite::Error::ConnectionClosed) => break,
            Err(e) => panic!("close handshake: {e}"),
        }
    }
    let m = metrics(proxy.addr);
    assert_eq!(m["ringway_tunnels_opened_total"], 1.0);
}

/// A raw upstream: answers the upgrade with 101 plus `hello` in the same write, then echoes
/// until the client half-closes, then says `bye` and closes.
fn raw_tunnel_origin() -> (
    std::net::SocketAddr,
    std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
) {
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let s2 = seen.clone();
    let addr = raw_origin(move |mut s| {
        let head = read_head_raw(&mut s);
        *s2.lock().unwrap() = head;
        s.write_all(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x-echo\r\nConnection: Upgrade\r\nX-Extra: 1\r\n\r\nhello")
            .unwrap();
        let mut buf = [0u8; 4096];
        loop {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => s.write_all(&buf[..n]).unwrap(),
            }
        }
        let _ = s.write_all(b"bye");
    });
    (addr, seen)
}

#[test]
fn a_raw_upgrade_tunnels_bytes_both_ways_with_half_close() {
    let (origin, seen) = raw_tunnel_origin();
    let proxy = Proxy::to(origin, "");
    let mut c = TcpStream::connect(proxy.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    // Bytes right behind the request ride into the tunnel.
    let request: &[u8] = b"GET /t HTTP/1.1\r\nHost: x\r\nUpgrade: x-echo, h2c\r\n\
        Connection: keep-alive, Upgrade\r\nKeep-Alive: 5\r\n\r\nearly";
    c.write_all(request).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !got.ends_with(b"helloearly") {
        let n = c.read(&mut buf).unwrap();
        assert!(n > 0, "closed early: {:?}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&got).to_string();
    assert!(text.starts_with("HTTP/1.1 101 "), "{text}");
    let lower = text.to_ascii_lowercase();
    assert!(
        lower.contains("upgrade: x-echo\r\n") && lower.contains("connection: upgrade\r\n"),
        "{text}"
    );
    assert!(
        lower.contains("x-extra: 1\r\n") && !lower.contains("content-length"),
        "{text}"
    );
    // The upstream saw the upgrade without h2c and without the other hop-by-hop fields.
    let head = String::from_utf8_lossy(&seen.lock().unwrap()).to_ascii_lowercase();
    assert!(head.contains("upgrade: x-echo\r\n"), "{head}");
    assert!(head.contains("connection: upgrade\r\n"), "{head}");
    assert!(
        !head.contains("h2c") && !head.contains("keep-alive"),
        "{head}"
    );
    // Both ways, then a half-close: the upstream still gets to answer.
    c.write_all(b"ping").unwrap();
    let mut four = [0u8; 4];
    c.read_exact(&mut four).unwrap();
    assert_eq!(&four, b"ping");
    c.shutdown(std::net::Shutdown::Write).unwrap();
    let mut rest = Vec::new();
    c.read_to_end(&mut rest).unwrap();
    assert_eq!(rest, b"bye");
    // Each client byte counts once, the early ones too. (Each look at the metrics is a
    // request of its own, counted before its answer: two looks tell its size.)
    let received = || metrics(proxy.addr)["ringway_client_bytes_received_total"];
    let (first, second) = (received(), received());
    let tunnelled = (request.len() + b"ping".len()) as f64;
    assert_eq!(first - (second - first), tunnelled);
}

#[test]
fn a_tunnel_counts_as_in_flight_on_its_endpoint_while_it_lasts() {
    // least_conn and p2c_ewma read this count: a WebSocket session is load.
    let (origin, _) = raw_tunnel_origin();
    let proxy = Proxy::to(origin, "");
    let key = format!(
        "ringway_endpoint_in_flight{{upstream=\"up\",endpoint=\"{origin}\",authority=\"{origin}\"}}"
    );
    let mut c = TcpStream::connect(proxy.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    c.write_all(b"GET /t HTTP/1.1\r\nHost: x\r\nUpgrade: x-echo\r\nConnection: Upgrade\r\n\r\n")
        .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !got.ends_with(b"hello") {
        let n = c.read(&mut buf).unwrap();
        assert!(n > 0, "closed early");
        got.extend_from_slice(&buf[..n]);
    }
    assert_eq!(metrics(proxy.addr).get(&key).copied(), Some(1.0));
    // The tunnel ends: so does its count.
    c.shutdown(std::net::Shutdown::Write).unwrap();
    let mut rest = Vec::new();
    c.read_to_end(&mut rest).unwrap();
    assert!(wait_until(Duration::from_secs(2), || metrics(proxy.addr)
        .get(&key)
        .copied()
        == Some(0.0)));
}

#[test]
fn h2c_is_never_tunnelled_and_a_declined_upgrade_stays_http() {
    // An h2c-only upgrade is not forwarded; a 101 to it is an invalid response.
    let (origin, seen) = raw_tunnel_origin();
    let proxy = Proxy::to(origin, "");
    let mut c = proxy.connect();
    c.send(b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: h2c\r\nConnection: Upgrade, HTTP2-Settings\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n\r\n");
    let r = c.read_response(false).unwrap();
    assert_eq!(r.status, 502);
    let head = String::from_utf8_lossy(&seen.lock().unwrap()).to_ascii_lowercase();
    assert!(
        !head.contains("upgrade") && !head.contains("http2-settings"),
        "{head}"
    );

    // The upstream answers an upgrade request with a plain response: the connection goes on.
    let origin = Origin::start(|r| Reply::text(200, r.header("upgrade").unwrap_or("none")));
    let proxy = Proxy::to(origin.addr, "");
    let mut c = proxy.connect();
    c.send(b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n");
    let r = c.read_response(false).unwrap();
    assert_eq!((r.status, r.text().as_str()), (200, "websocket"));
    assert_eq!(c.get("/again").status, 200);
    // Without `upgrade` in Connection the field is not an upgrade and is not forwarded.
    c.send(b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n\r\n");
    assert_eq!(c.read_response(false).unwrap().text(), "none");
}

#[test]
fn an_idle_tunnel_is_closed_after_tunnel_idle_timeout() {
    let (origin, _) = raw_tunnel_origin();
    let proxy = Proxy::to(origin, "[http]\ntunnel_idle_timeout = \"300ms\"\n");
    let mut c = TcpStream::connect(proxy.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    c.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: x-echo\r\nConnection: upgrade\r\n\r\n")
        .unwrap();
    let started = Instant::now();
    let mut all = Vec::new();
    let _ = c.read_to_end(&mut all);
    let took = started.elapsed();
    assert!(String::from_utf8_lossy(&all).ends_with("hello"));
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_secs(3),
        "{took:?}"
    );
}

#[test]
fn server_sent_events_are_flushed_as_they_come() {
    let addr = raw_origin(|mut s| {
        let _ = read_head_raw(&mut s);
        let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n");
        let _ = s.write_all(b"d\r\ndata: first\n\n\r\n");
        thread::sleep(Duration::from_millis(800));
        let _ = s.write_all(b"e\r\ndata: second\n\n\r\n0\r\n\r\n");
    });
    let proxy = Proxy::to(addr, "");
    let mut c = TcpStream::connect(proxy.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let started = Instant::now();
    c.write_all(b"GET /events HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n")
        .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !String::from_utf8_lossy(&got).contains("data: first") {
        let n = c.read(&mut buf).unwrap();
        assert!(n > 0);
        got.extend_from_slice(&buf[..n]);
    }
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "the first event waited for the rest: {:?}",
        started.elapsed()
    );
    while !String::from_utf8_lossy(&got).contains("0\r\n\r\n") {
        let n = c.read(&mut buf).unwrap();
        assert!(n > 0);
        got.extend_from_slice(&buf[..n]);
    }
    assert!(String::from_utf8_lossy(&got).contains("data: second"));
}

#[test]
fn a_101_that_names_no_protocol_opens_no_tunnel() {
    // A backend that answers 101 without an Upgrade field (reflecting a status, say) and
    // keeps speaking HTTP: no tunnel, or the client's next request would pass unrouted.
    let origin = raw_origin(|mut s| {
        let _ = read_head_raw(&mut s);
        let _ = s.write_all(b"HTTP/1.1 101 Switching Protocols\r\n\r\n");
        std::thread::sleep(Duration::from_secs(2));
    });
    let proxy = Proxy::to(origin, "");
    let mut c = proxy.connect();
    c.send(b"GET /ws HTTP/1.1\r\nHost: a\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n");
    let r = c.read_response(false).expect("a response");
    assert_eq!(r.status, 502, "{}", r.text());
    assert_eq!(r.error_code().as_deref(), Some("upstream_invalid_response"));
}

#[test]
fn a_shutdown_closes_open_tunnels_at_once() {
    // A tunnel has no natural end the drain could wait for: the worker closes it when it
    // begins to shut down, instead of holding the exit for the whole shutdown timeout.
    let (origin, _) = raw_tunnel_origin();
    let mut proxy = Proxy::to(origin, "shutdown_timeout = \"20s\"\n");
    let mut c = TcpStream::connect(proxy.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: x-echo\r\nConnection: upgrade\r\n\r\n")
        .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !got.ends_with(b"hello") {
        let n = c.read(&mut buf).unwrap();
        assert!(n > 0);
        got.extend_from_slice(&buf[..n]);
    }
    let started = Instant::now();
    proxy.stop();
    let took = started.elapsed();
    assert!(took < Duration::from_secs(3), "shutdown took {took:?}");
    let mut rest = Vec::new();
    let _ = c.read_to_end(&mut rest);
}

#[test]
fn an_upgrade_that_arrives_during_a_shutdown_is_refused_before_the_upstream() {
    // The tunnel would be closed as soon as it opened: 503, and the backend never accepts a
    // session that would be dropped without a close.
    let (origin, seen) = raw_tunnel_origin();
    let mut proxy = Proxy::to(
        origin,
        "workers = 1\n[http]\nmax_connections = 1\n\
         [[routes]]\npath_prefix = \"/plain\"\nrespond = { status = 200 }",
    );
    // An idle keep-alive connection holds the only place; the upgrade waits in the queue.
    let mut idle = proxy.connect();
    assert_eq!(idle.get("/plain").status, 200);
    let mut queued = TcpStream::connect(proxy.addr).unwrap();
    queued
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: x-echo\r\nConnection: upgrade\r\n\r\n")
        .unwrap();
    queued
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    std::thread::sleep(Duration::from_millis(100));
    seen.lock().unwrap().clear();
    let server = proxy.server.take().unwrap();
    server.shutdown();
    let mut got = Vec::new();
    let _ = queued.read_to_end(&mut got);
    assert!(
        got.starts_with(b"HTTP/1.1 503"),
        "{:?}",
        String::from_utf8_lossy(&got)
    );
    assert!(seen.lock().unwrap().is_empty(), "the upstream saw it");
    server.join();
    drop(idle);
}

#[test]
fn a_101_to_a_protocol_the_client_did_not_offer_opens_no_tunnel() {
    // The client asks for websocket; the upstream switches to something else.
    let origin = raw_origin(|mut s| {
        let _ = read_head_raw(&mut s);
        let _ = s.write_all(
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x-other\r\nConnection: Upgrade\r\n\r\n",
        );
        let mut buf = [0u8; 64];
        let _ = s.read(&mut buf);
    });
    let proxy = Proxy::to(origin, "");
    let mut c = proxy.connect();
    c.send(b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n");
    let r = c.read_response(false).expect("an answer");
    assert_eq!(r.status, 502, "{}", r.text());
}
