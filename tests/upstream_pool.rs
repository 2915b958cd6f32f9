//! Upstream keep-alive pools: reuse only after a clean exchange, stale connections detected,
//! replay only where it is safe.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::*;

/// An origin that answers each connection's first request with keep-alive, then closes the
/// connection after `linger`, counting connections and the requests each carried.
fn closing_origin(
    linger: Duration,
) -> (
    std::net::SocketAddr,
    Arc<AtomicUsize>,
    Arc<Mutex<Vec<String>>>,
) {
    let conns = Arc::new(AtomicUsize::new(0));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (c2, s2) = (conns.clone(), seen.clone());
    let addr = raw_origin(move |mut s: TcpStream| {
        c2.fetch_add(1, Ordering::SeqCst);
        let head = read_head_raw(&mut s);
        let text = String::from_utf8_lossy(&head).into_owned();
        let len: usize = text
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-length:")
                    .map(|v| v.trim().parse().unwrap())
            })
            .unwrap_or(0);
        let mut body = vec![0; len];
        s.read_exact(&mut body).unwrap();
        s2.lock()
            .unwrap()
            .push(text.lines().next().unwrap_or("").to_string());
        s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            .unwrap();
        std::thread::sleep(linger);
        // Dropping the stream closes it: the pooled connection is now stale.
    });
    (addr, conns, seen)
}

#[test]
fn a_stale_pooled_connection_is_not_used_for_a_request_with_a_body() {
    let (addr, conns, seen) = closing_origin(Duration::from_millis(20));
    let proxy = Proxy::to(addr, "workers = 1\n");
    let mut c = proxy.connect();
    assert_eq!(c.get("/first").status, 200);
    std::thread::sleep(Duration::from_millis(200)); // the origin has closed its end
    c.send(b"POST /second HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello");
    let r = c.read_response(false).unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(conns.load(Ordering::SeqCst), 2);
    assert_eq!(seen.lock().unwrap().len(), 2);
}

#[test]
fn an_idempotent_request_on_a_stale_connection_is_replayed_once() {
    // Idle 100 ms: the pooled connection is checked and found closed. Idle 0 ms (under
    // `UNCHECKED_IDLE`): it is used unchecked, fails before any response byte, and the
    // request goes once more on a new connection.
    for (linger, idle) in [(20, 100), (0, 0), (30, 0)] {
        let (addr, conns, seen) = closing_origin(Duration::from_millis(linger));
        let proxy = Proxy::to(addr, "workers = 1\n");
        let mut c = proxy.connect();
        for i in 0..5 {
            let r = c.get(&format!("/req{i}"));
            assert_eq!(r.status, 200, "request {i}: {}", r.text());
            std::thread::sleep(Duration::from_millis(idle));
        }
        assert_eq!(
            seen.lock().unwrap().len(),
            5,
            "each request reached the origin once (linger {linger}, idle {idle})"
        );
        assert_eq!(conns.load(Ordering::SeqCst), 5);
    }
}

#[test]
fn the_resend_on_a_stale_connection_fits_a_connection_cap_of_one() {
    // With one connection allowed, the stale one must give its slot back before the resend
    // asks for a new one: not a failure of the endpoint, not a retry.
    for linger in [0, 30] {
        let (addr, conns, seen) = closing_origin(Duration::from_millis(linger));
        let proxy = Proxy::start(&format!(
            "workers = 1\n[[upstreams]]\nname = \"up\"\nendpoints = [\"{addr}\"]\nmax_connections = 1\n\
             [[routes]]\npath_prefix = \"/\"\nproxy = \"up\"\n"
        ));
        let mut c = proxy.connect();
        for i in 0..5 {
            let r = c.get(&format!("/req{i}"));
            assert_eq!(r.status, 200, "request {i}: {}", r.text());
        }
        assert_eq!(seen.lock().unwrap().len(), 5);
        assert_eq!(conns.load(Ordering::SeqCst), 5);
        let count = |name: &str| metric_sum(proxy.addr, name);
        assert_eq!(
            count("ringway_upstream_failures_total"),
            0.0,
            "linger {linger}"
        );
        assert_eq!(
            count("ringway_upstream_retries_total"),
            0.0,
            "linger {linger}"
        );
    }
}

#[test]
fn connection_close_responses_are_not_pooled() {
    let origin = Origin::start(|_| {
        Reply::Full(
            200,
            vec![("connection".into(), "close".into())],
            b"bye".to_vec(),
        )
    });
    let proxy = Proxy::to(origin.addr, "workers = 1\n");
    let mut c = proxy.connect();
    for _ in 0..3 {
        let r = c.get("/");
        assert_eq!(r.body, b"bye");
        assert_eq!(
            r.header("connection"),
            None,
            "the upstream's close is hop-by-hop"
        );
    }
    assert_eq!(origin.connection_count(), 3);
}

#[test]
fn close_delimited_responses_are_relayed_until_eof() {
    let origin = Origin::start(|_| {
        Reply::RawClose(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nall of this, until close".to_vec(),
        )
    });
    let proxy = Proxy::to(origin.addr, "");
    let mut c = proxy.connect();
    let r = c.get("/");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("connection"), Some("close"));
    assert_eq!(r.body, b"all of this, until close");
}

#[test]
fn an_upstream_that_answers_before_reading_the_body_is_relayed() {
    // The origin refuses large uploads at once and closes, without reading the body.
    let addr = raw_origin(|mut s: TcpStream| {
        let _ = read_head_raw(&mut s);
        let _ = s.write_all(
            b"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 4\r\nConnection: close\r\n\r\nnope",
        );
        std::thread::sleep(Duration::from_millis(300));
    });
    let proxy = Proxy::to(addr, "");
    let mut c = proxy.connect();
    c.send(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 10000000\r\n\r\n");
    let chunk = vec![b'x'; 64 * 1024];
    let mut sent = 0;
    c.stream
        .set_write_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    while sent < 2_000_000 {
        if c.stream.write_all(&chunk).is_err() {
            break;
        }
        sent += chunk.len();
    }
    let r = c.read_response(false).expect("the upstream's early answer");
    assert_eq!(r.status, 413);
    assert_eq!(r.body, b"nope");
    assert_eq!(r.header("connection"), Some("close"));
}

#[test]
fn pools_are_per_endpoint_and_reused_round_robin() {
    let a = Origin::ok("a");
    let b = Origin::ok("b");
    let proxy = Proxy::start(&format!(
        "workers = 1\n[[upstreams]]\nname = \"up\"\nbalancer = \"round_robin\"\nendpoints = [\"{}\", \"{}\"]\n[[routes]]\npath_prefix = \"/\"\nproxy = \"up\"\n",
        a.addr, b.addr
    ));
    let mut c = proxy.connect();
    let mut bodies = Vec::new();
    for _ in 0..10 {
        bodies.push(c.get("/").text());
    }
    assert_eq!(bodies.iter().filter(|b| *b == "a").count(), 5, "{bodies:?}");
    assert_eq!(a.connection_count(), 1);
    assert_eq!(b.connection_count(), 1);
}

/// A connection idle for `UNCHECKED_IDLE` (10 ms) or more is checked before reuse.
#[test]
fn late_stray_bytes_on_an_idle_connection_never_answer_the_next_request() {
    let c2 = Arc::new(AtomicUsize::new(0));
    let addr = raw_origin(move |mut s: TcpStream| {
        let n = c2.fetch_add(1, Ordering::SeqCst);
        let _ = read_head_raw(&mut s);
        if n == 0 {
            // Answer, then (after ringway pooled the connection) write a forged response.
            s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                .unwrap();
            std::thread::sleep(Duration::from_millis(50));
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nforged");
            std::thread::sleep(Duration::from_secs(2));
        } else {
            s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nreal")
                .unwrap();
            std::thread::sleep(Duration::from_secs(2));
        }
    });
    let proxy = Proxy::to(addr, "workers = 1\n");
    let mut c = proxy.connect();
    assert_eq!(c.get("/").body, b"ok");
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(c.get("/").body, b"real");
}

/// An origin whose first connection answers its first request with `first`, then (2 ms
/// later) writes `stray` and signals; every other connection answers "real".
fn stray_origin(
    first: &'static [u8],
    stray: &'static [u8],
) -> (std::net::SocketAddr, std::sync::mpsc::Receiver<()>) {
    let (tx, rx) = std::sync::mpsc::channel();
    let tx = Mutex::new(tx);
    let n = Arc::new(AtomicUsize::new(0));
    let addr = raw_origin(move |mut s: TcpStream| {
        let first_conn = n.fetch_add(1, Ordering::SeqCst) == 0;
        loop {
            let head = read_head_raw(&mut s);
            if head.is_empty() {
                return;
            }
            if first_conn {
                s.write_all(first).unwrap();
                std::thread::sleep(Duration::from_millis(2));
                let _ = s.write_all(stray);
                let _ = tx.lock().unwrap().send(());
                std::thread::sleep(Duration::from_secs(2));
                return;
            }
            s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nreal")
                .unwrap();
        }
    });
    (addr, rx)
}

#[test]
fn a_body_after_a_bodiless_response_never_answers_the_next_request() {
    // A HEAD answered, then a forged response: the next request comes at once (well within
    // `UNCHECKED_IDLE`), but a connection whose last response had no body is checked anyway.
    let (addr, stray_sent) = stray_origin(
        b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nforged",
    );
    let proxy = Proxy::to(addr, "workers = 1\n");
    let mut c = proxy.connect();
    c.send(b"HEAD / HTTP/1.1\r\nHost: a\r\n\r\n");
    let r = c.read_response(true).unwrap();
    assert_eq!(r.status, 200);
    stray_sent.recv_timeout(Duration::from_secs(5)).unwrap();
    std::thread::sleep(Duration::from_millis(1));
    assert_eq!(c.get("/").body, b"real");
}

#[test]
fn stray_bytes_on_an_unchecked_connection_cost_a_resend_not_an_error() {
    // Garbage after a complete response, read as the next request's "response" on a
    // connection reused without the check: the request is sent again on a new connection.
    let (addr, stray_sent) = stray_origin(
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
        b"garbage that is no response\r\n\r\n",
    );
    let proxy = Proxy::to(addr, "workers = 1\n");
    let mut c = proxy.connect();
    assert_eq!(c.get("/").body, b"ok");
    stray_sent.recv_timeout(Duration::from_secs(5)).unwrap();
    let r = c.get("/");
    assert_eq!(
        (r.status, r.body.as_slice()),
        (200, &b"real"[..]),
        "{}",
        r.text()
    );
}

#[test]
fn a_response_written_past_its_content_length_never_answers_the_next_request() {
    // The first connection's first answer carries a second, complete response in the same
    // write, after a body longer than one read (a Content-Length that undercounts): the
    // connection must not be reused, even for a request that comes at once (where the
    // socket check is skipped).
    let n = Arc::new(AtomicUsize::new(0));
    let addr = raw_origin(move |mut s: TcpStream| {
        let first_conn = n.fetch_add(1, Ordering::SeqCst) == 0;
        loop {
            if read_head_raw(&mut s).is_empty() {
                return;
            }
            let answer = if first_conn {
                let mut a = b"HTTP/1.1 200 OK\r\nContent-Length: 300000\r\n\r\n".to_vec();
                a.extend_from_slice(&pattern(300_000, 7));
                a.extend_from_slice(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nevil");
                a
            } else {
                b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nreal".to_vec()
            };
            if s.write_all(&answer).is_err() {
                return;
            }
        }
    });
    let proxy = Proxy::to(addr, "workers = 1\n");
    let mut c = proxy.connect();
    assert_eq!(c.get("/").body, pattern(300_000, 7));
    assert_eq!(c.get("/").body, b"real");
}

#[test]
fn an_early_answer_to_a_buffered_body_is_relayed() {
    // A body buffered for replay (retries with buffer_max_bytes) goes up after its head;
    // the origin refuses it at once, reads none of it and closes: its 413 is the answer
    // (not a failed write, a 502, or a replay of the PUT).
    let conns = Arc::new(AtomicUsize::new(0));
    let seen = conns.clone();
    let addr = raw_origin(move |mut s: TcpStream| {
        seen.fetch_add(1, Ordering::SeqCst);
        let _ = read_head_raw(&mut s);
        let _ = s.write_all(
            b"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 4\r\nConnection: close\r\n\r\nnope",
        );
        std::thread::sleep(Duration::from_millis(300));
    });
    let proxy = Proxy::start(&format!(
        "workers = 1\n[[upstreams]]\nname = \"up\"\nendpoints = [\"{addr}\"]\n\
         retries = {{ attempts = 2, buffer_max_bytes = 16777216 }}\n\
         [[routes]]\npath_prefix = \"/\"\nproxy = \"up\"\n"
    ));
    let mut c = proxy.connect();
    let body = vec![b'x'; 8_000_000];
    c.send(b"PUT /x HTTP/1.1\r\nHost: a\r\nContent-Length: 8000000\r\n\r\n");
    c.stream.write_all(&body).unwrap();
    let r = c.read_response(false).expect("the upstream's early answer");
    assert_eq!((r.status, r.body.as_slice()), (413, &b"nope"[..]));
    assert_eq!(conns.load(Ordering::SeqCst), 1, "not replayed");
}

#[test]
fn a_buffered_body_answered_early_is_replayed_whole_and_the_client_kept() {
    // The first attempt's upstream answers 503 before it has the buffered body and reads
    // none of it; the retry sends the whole body again (from the buffer, never from the
    // client socket), and the client, whose body was read whole, keeps its connection.
    let conns = Arc::new(AtomicUsize::new(0));
    let seen = conns.clone();
    let addr = raw_origin(move |mut s: TcpStream| {
        let n = seen.fetch_add(1, Ordering::SeqCst);
        let head = String::from_utf8(read_head_raw(&mut s)).unwrap();
        if n == 0 {
            let _ = s.write_all(
                b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            );
            std::thread::sleep(Duration::from_millis(500));
            return;
        }
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .map_or(0, |v| v.trim().parse().unwrap());
        let mut body = vec![0u8; len];
        s.read_exact(&mut body).unwrap();
        let answer = format!("{}:{}", len, fnv(&body));
        let _ = s.write_all(
            format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{answer}",
                answer.len()
            )
            .as_bytes(),
        );
        // Any further request on this connection.
        let _ = read_head_raw(&mut s);
        let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nnext");
    });
    let proxy = Proxy::start(&format!(
        "workers = 1\n[[upstreams]]\nname = \"up\"\nendpoints = [\"{addr}\"]\n\
         retries = {{ attempts = 2, retry_on = [\"5xx\"], buffer_max_bytes = 16777216 }}\n\
         [[routes]]\npath_prefix = \"/\"\nproxy = \"up\"\n"
    ));
    let mut c = proxy.connect();
    let body = pattern(8_000_000, 3);
    c.send(b"PUT /x HTTP/1.1\r\nHost: a\r\nContent-Length: 8000000\r\n\r\n");
    c.stream.write_all(&body).unwrap();
    let r = c.read_response(false).expect("the retry's answer");
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), format!("8000000:{}", fnv(&body)));
    assert_eq!(
        r.header("connection"),
        None,
        "the client's body was read whole"
    );
    assert_eq!(c.get("/y").status, 200, "and its connection goes on");
    assert_eq!(
        conns.load(Ordering::SeqCst),
        2,
        "the retry's connection, which had the whole body, serves the next request"
    );
}

#[test]
fn a_request_answered_with_an_interim_response_is_not_sent_again_when_the_connection_closes() {
    // Each connection answers its first request, then answers the second with 103 Early
    // Hints and closes: the second was seen, it must not be sent again on a new connection.
    let seen_b = Arc::new(AtomicUsize::new(0));
    let b = seen_b.clone();
    let addr = raw_origin(move |mut s: TcpStream| {
        for _ in 0..2 {
            let head = read_head_raw(&mut s);
            if head.is_empty() {
                return;
            }
            if head.starts_with(b"DELETE /b ") {
                b.fetch_add(1, Ordering::SeqCst);
                let _ = s.write_all(b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>\r\n\r\n");
                std::thread::sleep(Duration::from_millis(100));
                return;
            }
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
        }
    });
    // No retry: a reset after a 103 may be retried as configured (`retry_on = ["reset"]`,
    // counted), but not sent again as if the pooled connection had closed before it.
    let proxy = Proxy::start(&format!(
        "[[upstreams]]\nname = \"up\"\nendpoints = [\"{addr}\"]\nretries = {{ attempts = 1 }}\n\
         [[routes]]\npath_prefix = \"/\"\nproxy = \"up\"\n"
    ));
    let mut c = proxy.connect();
    assert_eq!(c.get("/a").status, 200);
    // The next request goes on the pooled connection, which answers it with a 103 and closes.
    c.send(b"DELETE /b HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
    let back = String::from_utf8_lossy(&c.read_to_end()).into_owned();
    assert!(back.starts_with("HTTP/1.1 103 Early Hints\r\n"), "{back}");
    assert!(back.contains("\r\n\r\nHTTP/1.1 502 "), "{back}");
    assert_eq!(back.matches(" 103 ").count(), 1, "{back}");
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        seen_b.load(Ordering::SeqCst),
        1,
        "sent again after it was answered"
    );
}
