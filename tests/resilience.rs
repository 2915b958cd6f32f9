//! Upstream resilience and admission over real loopback sockets, with fault-injecting origins:
//! balancer distributions, retries and what is never retried, the retry budget, the circuit
//! breaker across workers, active and passive health, drain, connection limits and queueing,
//! the per-endpoint token bucket, the gateway concurrency cap with priorities, and permits
//! returning to zero.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // tests block and lock

mod support;

use std::collections::HashMap;
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use support::*;

/// A proxy with one upstream `up` over `endpoints` (TOML array items) with `upstream_extra`
/// keys, a catch-all route, and `top` before everything (top-level keys, `[gateway]`).
fn proxy_over(top: &str, endpoints: &[String], upstream_extra: &str) -> Proxy {
    Proxy::start(&format!(
        "{top}\n[admin]\naddress = \"127.0.0.1:0\"\n[[upstreams]]\nname = \"up\"\nendpoints = [{}]\n{upstream_extra}\n[[routes]]\npath_prefix = \"/\"\nproxy = \"up\"\n",
        endpoints.join(", ")
    ))
}

fn quoted(addrs: &[SocketAddr]) -> Vec<String> {
    addrs.iter().map(|a| format!("\"{a}\"")).collect()
}

fn admin_addr(p: &Proxy) -> SocketAddr {
    p.server.as_ref().unwrap().admin_addr().unwrap()
}

fn endpoint_metric(p: &Proxy, name: &str, ep: SocketAddr) -> f64 {
    let key = format!("{name}{{upstream=\"up\",endpoint=\"{ep}\",authority=\"{ep}\"}}");
    metrics(p.addr).get(&key).copied().unwrap_or(f64::NAN)
}

/// Whether active health marks `ep` healthy (1.0) or not (0.0) within 5 s.
fn health_becomes(p: &Proxy, ep: SocketAddr, value: f64) -> bool {
    wait_until(Duration::from_secs(5), || {
        endpoint_metric(p, "ringway_endpoint_healthy", ep) == value
    })
}

fn upstream_metric(p: &Proxy, name: &str) -> f64 {
    metrics(p.addr)
        .get(&format!("{name}{{upstream=\"up\"}}"))
        .copied()
        .unwrap_or(f64::NAN)
}

/// Sends `n` GETs over `conns` keep-alive connections (round robin); counts bodies.
fn spread(p: &Proxy, n: usize, conns: usize, path: &str) -> HashMap<String, usize> {
    let mut clients: Vec<Client> = (0..conns).map(|_| p.connect()).collect();
    let mut counts = HashMap::new();
    for i in 0..n {
        let r = clients[i % conns].get(path);
        assert_eq!(r.status, 200, "{}", r.text());
        *counts.entry(r.text()).or_insert(0) += 1;
    }
    counts
}

#[test]
fn rotating_balancers_honour_weights_and_share_a_drained_endpoints_turn() {
    for balancer in ["round_robin", "least_conn"] {
        let origins = [Origin::ok("a"), Origin::ok("b"), Origin::ok("c")];
        let eps: Vec<String> = origins
            .iter()
            .zip([2, 1, 1])
            .map(|(o, w)| format!("{{ address = \"{}\", weight = {w} }}", o.addr))
            .collect();
        let p = proxy_over("workers = 1", &eps, &format!("balancer = \"{balancer}\""));
        let counts = spread(&p, 400, 1, "/");
        let share = |c: &HashMap<String, usize>, n: &str| c.get(n).copied().unwrap_or(0);
        assert_eq!(
            [
                share(&counts, "a"),
                share(&counts, "b"),
                share(&counts, "c")
            ],
            [200, 100, 100],
            "{balancer}"
        );
        // b drained: its turn goes to a and c by their weights, not all to its neighbour c.
        let (status, body) = admin(
            admin_addr(&p),
            "POST",
            &format!("/-/upstreams/up/endpoints/{}/drain", origins[1].addr),
        );
        assert_eq!(status, 200, "{body}");
        let counts = spread(&p, 300, 1, "/");
        assert_eq!(
            [
                share(&counts, "a"),
                share(&counts, "b"),
                share(&counts, "c")
            ],
            [200, 0, 100],
            "{balancer}"
        );
    }
}

#[test]
fn a_slow_upload_does_not_make_its_endpoint_look_slow() {
    // `fast` answers at once; `slow` takes 50 ms for everything. The default balancer
    // (p2c_ewma) sends a request to the endpoint with the lower latency estimate; with
    // equal in-flight counts and two endpoints, that is all of them.
    let fast = Origin::ok("fast");
    let slow = Origin::start(|_| {
        Reply::Delay(
            Duration::from_millis(50),
            Box::new(Reply::text(200, "slow")),
        )
    });
    let p = proxy_over("workers = 1", &quoted(&[fast.addr, slow.addr]), "");
    // A body trickling up for a second: the client's pace, not the endpoint's. Uploads go
    // on until one lands on `fast` (at most two: once `slow` has an estimate, `fast`, with
    // none or a lower one, wins).
    let mut uploads = Vec::new();
    while uploads.last().map(String::as_str) != Some("fast") {
        assert!(uploads.len() < 2, "uploads went to {uploads:?}");
        let mut c = p.connect();
        c.send(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n");
        for _ in 0..10 {
            std::thread::sleep(Duration::from_millis(100));
            c.send(b"x");
        }
        let r = c.read_response(false).unwrap();
        assert_eq!(r.status, 200);
        uploads.push(r.text());
    }
    // Had the second of upload counted as `fast`'s latency, `slow` (50 ms) would look the
    // cheaper and take every request; `fast` keeps them but for `slow`'s first probe.
    let counts = spread(&p, 20, 1, "/");
    let got = counts.get("fast").copied().unwrap_or(0);
    assert!(
        got >= 15,
        "fast took {got} of 20 after the upload: {counts:?}"
    );
}

#[test]
fn weighted_3_2_1_is_within_2_percent_over_6000_requests() {
    let origins = [Origin::ok("a"), Origin::ok("b"), Origin::ok("c")];
    let eps: Vec<String> = origins
        .iter()
        .zip([3, 2, 1])
        .map(|(o, w)| format!("{{ address = \"{}\", weight = {w} }}", o.addr))
        .collect();
    let p = proxy_over("", &eps, "balancer = \"weighted\"");
    let counts = spread(&p, 6000, 4, "/");
    for (name, want) in [("a", 3000.0), ("b", 2000.0), ("c", 1000.0)] {
        let got = counts.get(name).copied().unwrap_or(0) as f64;
        assert!(
            (got - want).abs() <= 6000.0 * 0.02,
            "{name}: {got} vs {want} ({counts:?})"
        );
    }
}

#[test]
fn round_robin_is_even_and_least_conn_avoids_the_busy_endpoint() {
    let origins = [Origin::ok("a"), Origin::ok("b"), Origin::ok("c")];
    let addrs: Vec<SocketAddr> = origins.iter().map(|o| o.addr).collect();
    let p = proxy_over("", &quoted(&addrs), "balancer = \"round_robin\"");
    let counts = spread(&p, 600, 3, "/");
    for name in ["a", "b", "c"] {
        let got = counts.get(name).copied().unwrap_or(0) as f64;
        assert!((got - 200.0).abs() <= 12.0, "{counts:?}");
    }
    drop(p);

    // least_conn: `slow` holds requests; with one of them in flight on the only worker,
    // every other request goes to `fast`.
    let release = Arc::new(AtomicBool::new(false));
    let r2 = release.clone();
    let slow = Origin::start(move |_| {
        while !r2.load(Ordering::SeqCst) {
            thread::sleep(Duration::from_millis(2));
        }
        Reply::text(200, "slow")
    });
    let fast = Origin::ok("fast");
    let p = proxy_over(
        "workers = 1",
        &quoted(&[slow.addr, fast.addr]),
        "balancer = \"least_conn\"",
    );
    let addr = p.addr;
    // Park requests until one is held by `slow`.
    let parked: Vec<_> = (0..2)
        .map(|_| thread::spawn(move || Client::connect(addr).get("/").text()))
        .collect();
    assert!(wait_until(Duration::from_secs(5), || !slow
        .requests()
        .is_empty()));
    let counts = spread(&p, 50, 2, "/");
    assert_eq!(counts.get("fast"), Some(&50), "{counts:?}");
    release.store(true, Ordering::SeqCst);
    for h in parked {
        assert!(!h.join().unwrap().is_empty());
    }
}

#[test]
fn p2c_ewma_prefers_the_faster_endpoint() {
    let slow = Origin::start(|_| {
        Reply::Delay(
            Duration::from_millis(15),
            Box::new(Reply::text(200, "slow")),
        )
    });
    let fast = Origin::ok("fast");
    let p = proxy_over("workers = 1", &quoted(&[slow.addr, fast.addr]), "");
    let counts = spread(&p, 200, 2, "/");
    let fast_n = counts.get("fast").copied().unwrap_or(0);
    assert!(
        fast_n >= 170,
        "p2c_ewma sends most traffic to the fast endpoint: {counts:?}"
    );
}

#[test]
fn p2c_ewma_does_not_prefer_an_endpoint_that_fails_fast() {
    // Beside an endpoint answering 200 after 5 ms: one answering 503 at once, then a closed
    // port. (5xx is neither retried nor ejected by default; retries are off here.) A failure
    // counts as a slow sample: after its first failure, the failing endpoint is avoided
    // rather than preferred for answering fast.
    let failing = Origin::start(|_| Reply::text(503, "failing"));
    let healthy =
        Origin::start(|_| Reply::Delay(Duration::from_millis(5), Box::new(Reply::text(200, "ok"))));
    for bad in [failing.addr, closed_port()] {
        let endpoints = quoted(&[bad, healthy.addr]);
        let p = proxy_over("workers = 1", &endpoints, "retries = { attempts = 1 }");
        let mut c = p.connect();
        let mut failed = 0;
        for _ in 0..40 {
            let r = c.get("/");
            if r.status != 200 {
                failed += 1;
                c = p.connect();
            }
        }
        assert!(failed <= 2, "{bad}: {failed} of 40 requests failed");
    }
}

#[test]
fn hash_balancers_are_sticky_and_spread() {
    let origins = [Origin::ok("a"), Origin::ok("b"), Origin::ok("c")];
    let addrs: Vec<SocketAddr> = origins.iter().map(|o| o.addr).collect();

    // ip_hash: one client address, one endpoint.
    let p = proxy_over("", &quoted(&addrs), "balancer = \"ip_hash\"");
    let counts = spread(&p, 30, 3, "/");
    assert_eq!(counts.len(), 1, "{counts:?}");
    drop(p);

    // cookie_hash: the same cookie sticks; different cookies spread.
    let p = proxy_over(
        "",
        &quoted(&addrs),
        "balancer = { type = \"cookie_hash\", cookie = \"sid\" }",
    );
    let mut c = p.connect();
    let mut by_sid: HashMap<u32, String> = HashMap::new();
    let mut seen = HashMap::new();
    for round in 0..3 {
        for sid in 0..60u32 {
            c.send(
                format!("GET / HTTP/1.1\r\nHost: x\r\nCookie: a=1; sid={sid}\r\n\r\n").as_bytes(),
            );
            let body = c.read_response(false).unwrap().text();
            if round == 0 {
                *seen.entry(body.clone()).or_insert(0) += 1;
                by_sid.insert(sid, body);
            } else {
                assert_eq!(by_sid[&sid], body, "sid {sid} moved");
            }
        }
    }
    assert_eq!(seen.len(), 3, "60 cookies reach every endpoint: {seen:?}");
}

/// Which endpoint each of `keys` header values reaches.
fn placements(p: &Proxy, keys: u32) -> Vec<String> {
    let mut c = p.connect();
    (0..keys)
        .map(|k| {
            c.send(format!("GET / HTTP/1.1\r\nHost: x\r\nX-User: user-{k}\r\n\r\n").as_bytes());
            c.read_response(false).unwrap().text()
        })
        .collect()
}

#[test]
fn consistent_hash_moves_about_one_nth_of_keys_when_an_endpoint_leaves() {
    let names = ["a", "b", "c", "d", "e"];
    let origins: Vec<Origin> = names.iter().map(|n| Origin::ok(n)).collect();
    let addrs: Vec<SocketAddr> = origins.iter().map(|o| o.addr).collect();
    let p = proxy_over(
        "",
        &quoted(&addrs),
        "balancer = { type = \"consistent_hash\", header = \"x-user\" }",
    );
    let keys = 2000;
    let before = placements(&p, keys);
    assert_eq!(before, placements(&p, keys), "sticky");
    // Endpoint `c` leaves rotation.
    let (status, _) = admin(
        admin_addr(&p),
        "POST",
        &format!("/-/upstreams/up/endpoints/{}/drain", addrs[2]),
    );
    assert_eq!(status, 200);
    let after = placements(&p, keys);
    let mut moved = 0;
    for (b, a) in before.iter().zip(&after) {
        assert_ne!(a, "c");
        if a != b {
            assert_eq!(b, "c", "only keys of the endpoint that left move");
            moved += 1;
        }
    }
    let share = f64::from(moved) / f64::from(keys);
    assert!(share <= 1.0 / names.len() as f64 + 0.05, "moved {share}");
    // Back in rotation: the keys return home.
    admin(
        admin_addr(&p),
        "POST",
        &format!("/-/upstreams/up/endpoints/{}/undrain", addrs[2]),
    );
    assert_eq!(before, placements(&p, keys));
}

/// Two origins: `bad` answers `status` to everything, `good` 200 "good". The proxy retries
/// `retry_on` and balances round robin, on one worker so the first pick is deterministic.
fn retry_setup(status: u16, retries: &str) -> (Origin, Origin, Proxy) {
    let bad = Origin::start(move |_| Reply::text(status, "bad"));
    let good =
        Origin::start(|r| Reply::text(200, &format!("good:{}", String::from_utf8_lossy(&r.body))));
    let p = proxy_over(
        "workers = 1",
        &quoted(&[bad.addr, good.addr]),
        &format!("balancer = \"round_robin\"\noutlier = {{ consecutive_failures = 0 }}\nretries = {{ {retries} }}"),
    );
    (bad, good, p)
}

#[test]
fn a_refused_reconnect_after_a_stale_pooled_connection_is_a_connect_failure() {
    // `gone` answers one request, then closes its listener and the connection: the pooled
    // connection is stale, and connecting again is refused.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let gone = listener.local_addr().unwrap();
    thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut buf = [0u8; 4096];
        let mut got = Vec::new();
        while !got.windows(4).any(|w| w == b"\r\n\r\n") {
            match std::io::Read::read(&mut s, &mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
        drop(listener);
        let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\ngone");
        drop(s);
    });
    let good = Origin::ok("good");
    // `gone` weighs 3, so the first two requests go to it.
    let p = proxy_over(
        "workers = 1",
        &[
            format!("{{ address = \"{gone}\", weight = 3 }}"),
            format!("\"{}\"", good.addr),
        ],
        "balancer = \"round_robin\"\noutlier = { consecutive_failures = 0 }\n\
         retries = { attempts = 2, retry_on = [\"connect_failure\"], backoff_base = \"1ms\", backoff_max = \"2ms\" }",
    );
    let mut c = p.connect();
    assert_eq!(c.get("/").text(), "gone");
    // At once (a pooled connection idle under 10 ms is reused unchecked): the request finds
    // it closed, the new connection is refused, and that is a connect failure, retried.
    let r = c.get("/");
    assert_eq!((r.status, r.text().as_str()), (200, "good"));
}

#[test]
fn a_retry_that_could_not_begin_before_the_total_timeout_is_not_made() {
    // The pause before a retry is drawn up to an hour: the retry would begin past the 2 s
    // total timeout (but for a draw under 2 s: 1 in 1,800), so it is not made at all, and
    // the upstream's own answer goes to the client at once.
    let (bad, good, p) = retry_setup(
        503,
        "attempts = 2, retry_on = [\"5xx\"], backoff_base = \"1h\", backoff_max = \"1h\", \
         total_timeout = \"2s\"",
    );
    let started = std::time::Instant::now();
    let r = p.connect().get("/");
    assert_eq!((r.status, r.text().as_str()), (503, "bad"));
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    assert_eq!((bad.requests().len(), good.requests().len()), (1, 0));
    assert_eq!(upstream_metric(&p, "ringway_upstream_retries_total"), 0.0);
}

#[test]
fn the_total_timeout_runs_from_the_end_of_a_buffered_body() {
    // The body arrives 600 ms after the head, past the 300 ms total timeout: that upload is
    // the client's time, and the request still has its full budget once the body is in.
    let origin = Origin::start(|r| Reply::text(200, &String::from_utf8_lossy(&r.body)));
    let p = proxy_over(
        "workers = 1",
        &quoted(&[origin.addr]),
        "retries = { attempts = 2, buffer_max_bytes = 1024, total_timeout = \"300ms\" }",
    );
    let mut c = p.connect();
    c.send(b"PUT /u HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhe");
    thread::sleep(Duration::from_millis(600));
    c.send(b"llo");
    let r = c.read_response(false).expect("a response");
    assert_eq!((r.status, r.text().as_str()), (200, "hello"));
}

#[test]
fn a_request_whose_total_timeout_passed_while_queued_is_not_sent() {
    let release = Arc::new(AtomicBool::new(false));
    let origin = gated(&release, "ok");
    let p = proxy_over(
        "workers = 1",
        &quoted(&[origin.addr]),
        "max_connections = 1\nmax_pending = 1\nconnect_timeout = \"5s\"\n\
         retries = { attempts = 1, total_timeout = \"1s\" }",
    );
    let addr = p.addr;
    // A POST's body streams: its wait for the head is not bounded by the total timeout.
    let first = thread::spawn(move || {
        let mut c = Client::connect(addr);
        c.send(b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nx");
        c.read_response(false).map(|r| r.status)
    });
    assert!(wait_until(Duration::from_secs(5), || origin
        .requests()
        .len()
        == 1));
    let queued = thread::spawn(move || Client::connect(addr).get("/b"));
    assert!(wait_until(Duration::from_secs(5), || {
        admin(admin_addr(&p), "GET", "/-/upstreams")
            .1
            .contains("\"pending\":1")
    }));
    // The queued request's total timeout passes in line: it is answered 504 then, without
    // being sent (not 503 at `connect_timeout`), and the endpoint, which did nothing wrong,
    // stays in rotation.
    let r = queued.join().unwrap();
    assert_eq!(
        (r.status, r.error_code().as_deref()),
        (504, Some("upstream_timeout"))
    );
    release.store(true, Ordering::SeqCst);
    assert_eq!(first.join().unwrap(), Some(200));
    assert_eq!(origin.requests().len(), 1, "the late request was sent");
    let blamed = metric_sum(p.addr, "ringway_upstream_failures_total");
    assert_eq!(blamed, 0.0, "the endpoint was charged a failure");
    assert_eq!(p.connect().get("/c").status, 200);
}

#[test]
fn a_retry_goes_to_a_different_endpoint() {
    let bad = Origin::start(|_| Reply::text(503, "bad"));
    let good = Origin::ok("good");
    // `bad` weighs 3: the rotation itself would give it the retry's turn too, so only the
    // retry's rule (another endpoint) sends the one retry allowed to `good`.
    let p = proxy_over(
        "workers = 1",
        &[
            format!("{{ address = \"{}\", weight = 3 }}", bad.addr),
            format!("\"{}\"", good.addr),
        ],
        "balancer = \"round_robin\"\noutlier = { consecutive_failures = 0 }\n\
         retries = { attempts = 2, retry_on = [\"gateway_error\"], backoff_base = \"1ms\", backoff_max = \"2ms\" }",
    );
    let mut c = p.connect();
    for _ in 0..10 {
        let r = c.get("/");
        assert_eq!((r.status, r.text().as_str()), (200, "good"));
    }
    let first_on_bad = bad.requests().len();
    assert!(first_on_bad >= 5, "{first_on_bad}");
    assert_eq!(good.requests().len(), 10);
    assert_eq!(
        upstream_metric(&p, "ringway_upstream_retries_total"),
        first_on_bad as f64
    );
}

#[test]
fn connect_failures_and_resets_are_retried_by_default() {
    let dead = closed_port();
    let resets = raw_origin(|mut s| {
        let _ = read_head_raw(&mut s);
        // Close without answering.
    });
    let good = Origin::ok("good");
    let p = proxy_over(
        "workers = 1",
        &quoted(&[dead, resets, good.addr]),
        "balancer = \"round_robin\"\noutlier = { consecutive_failures = 0 }\nretries = { attempts = 3 }",
    );
    let mut c = p.connect();
    for _ in 0..9 {
        assert_eq!(c.get("/").text(), "good");
    }
}

#[test]
fn post_and_patch_are_not_retried_and_bodies_replay_only_from_the_buffer() {
    let (bad, good, p) = retry_setup(503, "attempts = 2, retry_on = [\"gateway_error\"]");
    let mut c = p.connect();
    // Round robin: the first attempt of the 1st, 3rd, ... request goes to `bad`.
    c.send(b"POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello");
    assert_eq!(
        c.read_response(false).unwrap().status,
        503,
        "POST is not retried"
    );
    assert_eq!(c.get("/").status, 200); // to good
    c.send(b"PATCH /p HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello");
    assert_eq!(
        c.read_response(false).unwrap().status,
        503,
        "PATCH is not retried"
    );
    assert_eq!((bad.requests().len(), good.requests().len()), (2, 1));
    drop((bad, good, p));

    // retry_post with a replay buffer: POST is retried with its body; PATCH still never.
    let (bad, good, p) = retry_setup(
        503,
        "attempts = 2, retry_on = [\"gateway_error\"], retry_post = true, buffer_max_bytes = 1024",
    );
    let mut c = p.connect();
    c.send(b"POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello");
    let r = c.read_response(false).unwrap();
    assert_eq!((r.status, r.text().as_str()), (200, "good:hello"));
    assert_eq!(good.last().body, b"hello");
    assert_eq!(c.get("/").status, 200); // to good
    c.send(b"PATCH /p HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello");
    assert_eq!(
        c.read_response(false).unwrap().status,
        503,
        "PATCH is never retried"
    );
    // A body sent in two pieces with Expect: 100-continue is buffered and replayed too.
    c.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"); // to good
    assert_eq!(c.read_response(false).unwrap().status, 200);
    c.send(b"PUT /p HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\nExpect: 100-continue\r\n\r\n");
    let interim = c.read_response(false).unwrap();
    assert_eq!(interim.status, 100);
    c.send(b"01234");
    thread::sleep(Duration::from_millis(20));
    c.send(b"56789");
    let r = c.read_response(false).unwrap();
    assert_eq!((r.status, r.text().as_str()), (200, "good:0123456789"));
    assert_eq!(bad.last().body, b"0123456789");
}

#[test]
fn a_streamed_body_is_not_replayed() {
    let (bad, good, p) = retry_setup(
        503,
        "attempts = 2, retry_on = [\"gateway_error\"], buffer_max_bytes = 1024",
    );
    let mut c = p.connect();
    // PUT is idempotent, but 100 KB is over the replay buffer: it streams, and once streamed
    // it cannot be sent again.
    let body = pattern(100_000, 7);
    c.send(
        format!(
            "PUT /big HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .as_bytes(),
    );
    c.send(&body);
    let r = c.read_response(false).unwrap();
    assert_eq!(r.status, 503);
    assert_eq!(bad.requests().len(), 1);
    assert_eq!(bad.last().body.len(), body.len());
    assert!(good.requests().is_empty());
    // Within the buffer it is replayed.
    assert_eq!(c.get("/").status, 200);
    c.send(b"PUT /small HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc");
    let r = c.read_response(false).unwrap();
    assert_eq!((r.status, r.text().as_str()), (200, "good:abc"));
}

#[test]
fn retries_stop_when_the_budget_is_spent() {
    let bad = Origin::start(|_| Reply::text(503, "bad"));
    let p = proxy_over(
        "workers = 1",
        &quoted(&[bad.addr]),
        "outlier = { consecutive_failures = 0 }\nretries = { attempts = 2, retry_on = [\"gateway_error\"], backoff_base = \"1ms\", backoff_max = \"1ms\" }\nretry_budget = { percent = 0, min_per_second = 1, max_concurrent = 10 }",
    );
    let mut c = p.connect();
    for _ in 0..30 {
        assert_eq!(c.get("/").status, 503);
    }
    // 0% of requests plus 1/s over the 10 s window: 10 retries, then the failures go to the
    // client as they are.
    assert_eq!(bad.requests().len(), 40);
    assert_eq!(upstream_metric(&p, "ringway_upstream_retries_total"), 10.0);
    assert_eq!(
        upstream_metric(&p, "ringway_upstream_retry_budget_exhausted_total"),
        20.0
    );
}

#[test]
fn breaker_opens_half_opens_with_its_probe_count_across_workers_and_closes() {
    // 0: fail with 500; 1: answer 200 after 300 ms.
    let mode = Arc::new(AtomicU16::new(0));
    let m2 = mode.clone();
    let origin = Origin::start(move |_| match m2.load(Ordering::SeqCst) {
        0 => Reply::text(500, "down"),
        _ => Reply::Delay(Duration::from_millis(300), Box::new(Reply::text(200, "up"))),
    });
    let p = proxy_over(
        "workers = 2",
        &quoted(&[origin.addr]),
        "outlier = { consecutive_failures = 0 }\nretries = { attempts = 1 }\nbreaker = { failure_threshold = 3, open_duration = \"1s\", half_open_max = 2 }",
    );
    let mut c = p.connect();
    for _ in 0..3 {
        assert_eq!(c.get("/").status, 500);
    }
    let r = c.get("/");
    assert_eq!(r.status, 503);
    assert_eq!(r.error_code().as_deref(), Some("upstream_circuit_open"));
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(
        origin.requests().len(),
        3,
        "an open circuit sends nothing upstream"
    );
    assert_eq!(upstream_metric(&p, "ringway_upstream_breaker_state"), 1.0);

    // Half-open: of 8 concurrent requests on many connections (both workers), exactly 2 are
    // probes; the rest are refused while the probes are out.
    thread::sleep(Duration::from_millis(1100));
    mode.store(1, Ordering::SeqCst);
    let addr = p.addr;
    let handles: Vec<_> = (0..8)
        .map(|_| {
            thread::spawn(move || {
                let r = Client::connect(addr).get("/");
                (r.status, r.error_code())
            })
        })
        .collect();
    let results: Vec<(u16, Option<String>)> =
        handles.into_iter().map(|h| h.join().unwrap()).collect();
    let ok = results.iter().filter(|r| r.0 == 200).count();
    let refused = results
        .iter()
        .filter(|r| r.1.as_deref() == Some("upstream_circuit_open"))
        .count();
    assert_eq!((ok, refused), (2, 6), "{results:?}");
    assert_eq!(origin.requests().len(), 5);
    // The probes succeeded: closed.
    assert_eq!(upstream_metric(&p, "ringway_upstream_breaker_state"), 0.0);
    for _ in 0..4 {
        assert_eq!(c.get("/").status, 200);
    }
}

#[test]
fn a_half_open_probe_is_decided_by_its_response_head_not_its_body() {
    // 0: fail with 500; 1: the probe: a 200 head and the start of a body that then stalls
    // (a stream, a long download); 2: answer 200.
    let mode = Arc::new(AtomicU16::new(0));
    let m2 = mode.clone();
    let origin = Origin::start(move |_| match m2.load(Ordering::SeqCst) {
        0 => Reply::text(500, "down"),
        1 => {
            m2.store(2, Ordering::SeqCst);
            Reply::Raw(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nab".to_vec())
        }
        _ => Reply::text(200, "up"),
    });
    let p = proxy_over(
        "workers = 1",
        &quoted(&[origin.addr]),
        // The stalled body ends by the read timeout (the proxy's stop waits for it).
        "outlier = { consecutive_failures = 0 }\nretries = { attempts = 1 }\nread_timeout = \"3s\"\nbreaker = { failure_threshold = 3, open_duration = \"1s\", half_open_max = 1 }",
    );
    let mut c = p.connect();
    for _ in 0..3 {
        assert_eq!(c.get("/").status, 500);
    }
    assert_eq!(c.get("/").status, 503);
    thread::sleep(Duration::from_millis(1100));
    mode.store(1, Ordering::SeqCst);
    let mut probe = TcpStream::connect(p.addr).unwrap();
    probe
        .write_all(b"GET /stream HTTP/1.1\r\nhost: x\r\n\r\n")
        .unwrap();
    let head = read_head_raw(&mut probe);
    assert!(head.starts_with(b"HTTP/1.1 200"), "{head:?}");
    // The probe's body is still open, and the circuit is closed already: the next request
    // goes upstream instead of being refused as a second probe.
    assert_eq!(upstream_metric(&p, "ringway_upstream_breaker_state"), 0.0);
    let r = Client::connect(p.addr).get("/");
    assert_eq!((r.status, r.text()), (200, "up".to_string()));
    drop(probe);
}

#[test]
fn active_health_checks_take_an_endpoint_out_and_bring_it_back() {
    let health = Arc::new(AtomicU16::new(200));
    let h2 = health.clone();
    let flaky = Origin::start(move |r| {
        if r.target == "/health" {
            Reply::text(h2.load(Ordering::SeqCst), "")
        } else {
            Reply::text(200, "flaky")
        }
    });
    let steady =
        Origin::start(|r| Reply::text(200, if r.target == "/health" { "" } else { "steady" }));
    let p = proxy_over(
        "workers = 1",
        &quoted(&[flaky.addr, steady.addr]),
        "balancer = \"round_robin\"\nhealth_check = { path = \"/health\", interval = \"50ms\", timeout = \"500ms\", healthy_threshold = 2, unhealthy_threshold = 2 }",
    );
    // In rotation from its first passing check.
    assert!(health_becomes(&p, flaky.addr, 1.0));
    health.store(503, Ordering::SeqCst);
    assert!(health_becomes(&p, flaky.addr, 0.0));
    let counts = spread(&p, 20, 2, "/");
    assert_eq!(counts.get("steady"), Some(&20), "{counts:?}");
    let (_, json) = admin(admin_addr(&p), "GET", "/-/upstreams");
    assert!(
        json.contains(&format!("\"address\":\"{}\",", flaky.addr)),
        "{json}"
    );
    assert!(json.contains("\"healthy\":false"), "{json}");

    health.store(200, Ordering::SeqCst);
    assert!(health_becomes(&p, flaky.addr, 1.0));
    let counts = spread(&p, 20, 2, "/");
    assert_eq!(counts.get("flaky"), Some(&10), "{counts:?}");
}

#[test]
fn an_endpoint_takes_no_request_before_its_first_check_passes() {
    // One endpoint fails its checks from the start (a service still booting); the other
    // passes them. Checks every 5 s: one round is all the test has.
    let booting = Origin::start(|r| {
        if r.target == "/health" {
            Reply::text(503, "")
        } else {
            Reply::text(200, "booting")
        }
    });
    let steady =
        Origin::start(|r| Reply::text(200, if r.target == "/health" { "" } else { "steady" }));
    let p = proxy_over(
        "workers = 1",
        &quoted(&[booting.addr, steady.addr]),
        "balancer = \"round_robin\"\nhealth_check = { path = \"/health\", interval = \"5s\", timeout = \"500ms\" }",
    );
    // Vouched for by one check (not `healthy_threshold`'s two): in rotation.
    assert!(health_becomes(&p, steady.addr, 1.0));
    let counts = spread(&p, 20, 2, "/");
    assert_eq!(counts.get("steady"), Some(&20), "{counts:?}");
    assert_eq!(
        endpoint_metric(&p, "ringway_endpoint_healthy", booting.addr),
        0.0
    );
}

#[test]
fn a_probe_that_runs_to_its_timeout_holds_up_no_other_endpoints_checks() {
    // One endpoint accepts connections (the kernel completes them) and never answers: each
    // of its probes runs to its 2 s timeout. The other, probed every 100 ms, is probed at
    // that pace all the same.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let steady = Origin::start(|_| Reply::text(200, ""));
    let p = proxy_over(
        "workers = 1",
        &quoted(&[silent.local_addr().unwrap(), steady.addr]),
        "health_check = { path = \"/health\", interval = \"100ms\", timeout = \"2s\" }",
    );
    std::thread::sleep(Duration::from_millis(1500));
    let probes = steady.seen.lock().unwrap().len();
    assert!(probes >= 8, "{probes} probes in 1.5 s at a 100 ms interval");
    drop(p);
}

#[test]
fn an_endpoint_whose_checks_pass_again_gets_traffic_at_once_from_p2c_ewma() {
    // While down, the flaky endpoint answers 503 to requests as well as to its checks: each
    // failed attempt is a 1 s latency sample, which would keep the peak-EWMA balancer away
    // from it for tens of seconds after it recovered.
    let up = Arc::new(AtomicBool::new(true));
    let up2 = up.clone();
    let flaky = Origin::start(move |_| {
        if up2.load(Ordering::SeqCst) {
            Reply::text(200, "flaky")
        } else {
            Reply::text(503, "down")
        }
    });
    let steady = Origin::start(|_| Reply::text(200, "steady"));
    let p = proxy_over(
        "workers = 1",
        &quoted(&[flaky.addr, steady.addr]),
        "outlier = { consecutive_failures = 0 }\nretries = { attempts = 1 }\nhealth_check = { path = \"/health\", interval = \"50ms\", timeout = \"500ms\", healthy_threshold = 2, unhealthy_threshold = 2 }",
    );
    up.store(false, Ordering::SeqCst);
    let mut client = p.connect();
    let mut failed = 0;
    for _ in 0..20 {
        if client.get("/").status == 503 {
            failed += 1;
        }
    }
    assert!(failed > 0, "the flaky endpoint was never tried while down");
    assert!(health_becomes(&p, flaky.addr, 0.0));
    up.store(true, Ordering::SeqCst);
    assert!(health_becomes(&p, flaky.addr, 1.0));
    let counts = spread(&p, 20, 1, "/");
    assert!(counts.get("flaky").is_some_and(|&n| n > 0), "{counts:?}");
}

#[test]
fn a_mid_body_abort_ejects_the_endpoint() {
    let broken = raw_origin(|mut s| {
        let _ = read_head_raw(&mut s);
        let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\nonly ten..");
        // Then close: the body is cut short.
    });
    let good = Origin::ok("good");
    let p = proxy_over(
        "workers = 1",
        &quoted(&[broken, good.addr]),
        "balancer = \"round_robin\"\noutlier = { consecutive_failures = 1, base_ejection = \"30s\" }",
    );
    let mut c = p.connect();
    c.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    let _ = c.read_to_end(); // truncated, then reset
    assert_eq!(endpoint_metric(&p, "ringway_endpoint_ejected", broken), 1.0);
    assert_eq!(
        metrics(p.addr)[&format!(
            "ringway_endpoint_failures_total{{upstream=\"up\",endpoint=\"{broken}\",authority=\"{broken}\",class=\"mid_body\"}}"
        )],
        1.0
    );
    let counts = spread(&p, 10, 2, "/");
    assert_eq!(counts.get("good"), Some(&10), "{counts:?}");
}

#[test]
fn drained_endpoints_take_no_new_requests_and_every_drained_means_503() {
    let a = Origin::ok("a");
    let b = Origin::ok("b");
    let p = proxy_over("", &quoted(&[a.addr, b.addr]), "");
    let admin_at = admin_addr(&p);
    let (status, body) = admin(
        admin_at,
        "POST",
        &format!("/-/upstreams/up/endpoints/{}/drain", a.addr),
    );
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"drained\":true"));
    let counts = spread(&p, 20, 2, "/");
    assert_eq!(counts.get("b"), Some(&20));
    admin(
        admin_at,
        "POST",
        &format!("/-/upstreams/up/endpoints/{}/drain", b.addr),
    );
    let r = p.connect().get("/");
    assert_eq!(
        (r.status, r.error_code().as_deref()),
        (503, Some("no_upstream_endpoint"))
    );
    let (_, json) = admin(admin_at, "GET", "/-/upstreams");
    assert_eq!(json.matches("\"drained\":true").count(), 2, "{json}");
    admin(
        admin_at,
        "POST",
        &format!("/-/upstreams/up/endpoints/{}/undrain", a.addr),
    );
    assert_eq!(p.connect().get("/").text(), "a");
    // Unknown names and wrong methods get clear answers.
    assert_eq!(
        admin(
            admin_at,
            "POST",
            "/-/upstreams/nope/endpoints/1.2.3.4:5/drain"
        )
        .0,
        404
    );
    assert_eq!(
        admin(
            admin_at,
            "POST",
            "/-/upstreams/up/endpoints/1.2.3.4:5/drain"
        )
        .0,
        404
    );
    assert_eq!(
        admin(
            admin_at,
            "GET",
            &format!("/-/upstreams/up/endpoints/{}/drain", a.addr)
        )
        .0,
        405
    );
}

/// An origin that holds each request until `release` is set.
fn gated(release: &Arc<AtomicBool>, body: &'static str) -> Origin {
    let r = release.clone();
    Origin::start(move |_| {
        while !r.load(Ordering::SeqCst) {
            thread::sleep(Duration::from_millis(2));
        }
        Reply::text(200, body)
    })
}

#[test]
fn connection_limits_queue_within_max_pending_then_shed() {
    let release = Arc::new(AtomicBool::new(false));
    let origin = gated(&release, "ok");
    let p = proxy_over(
        "workers = 1",
        &quoted(&[origin.addr]),
        "max_connections = 1\nmax_pending = 1\nconnect_timeout = \"5s\"",
    );
    let addr = p.addr;
    let first = thread::spawn(move || Client::connect(addr).get("/").status);
    assert!(wait_until(Duration::from_secs(5), || origin
        .requests()
        .len()
        == 1));
    let queued = thread::spawn(move || Client::connect(addr).get("/").status);
    assert!(wait_until(Duration::from_secs(5), || {
        admin(admin_addr(&p), "GET", "/-/upstreams")
            .1
            .contains("\"pending\":1")
    }));
    let r = p.connect().get("/");
    assert_eq!(
        (r.status, r.error_code().as_deref()),
        (503, Some("upstream_saturated"))
    );
    assert!(r.header("retry-after").is_none());
    release.store(true, Ordering::SeqCst);
    assert_eq!(first.join().unwrap(), 200);
    assert_eq!(
        queued.join().unwrap(),
        200,
        "the queued request got the freed connection"
    );
    assert_eq!(origin.connection_count(), 1, "one connection at most");
}

#[test]
fn requests_waiting_for_a_connection_are_served_in_the_order_they_came() {
    // One connection, held by the first request; seven more come one after another, each in
    // line before the next is sent. Once the first is answered, the origin sees the others in
    // the order they came (they used to race for each freed connection, every one on its own
    // 2 ms timer).
    let release = Arc::new(AtomicBool::new(false));
    let origin = gated(&release, "ok");
    let p = proxy_over(
        "workers = 1",
        &quoted(&[origin.addr]),
        "max_connections = 1\nmax_pending = 16\nconnect_timeout = \"10s\"",
    );
    let addr = p.addr;
    let mut clients = Vec::new();
    for i in 0..8 {
        let path = format!("/{i}");
        clients.push(thread::spawn(move || {
            Client::connect(addr).get(&path).status
        }));
        let in_line = format!("\"pending\":{i}");
        assert!(
            wait_until(Duration::from_secs(5), || if i == 0 {
                origin.requests().len() == 1
            } else {
                admin(admin_addr(&p), "GET", "/-/upstreams")
                    .1
                    .contains(&in_line)
            }),
            "request {i} did not get in line"
        );
    }
    release.store(true, Ordering::SeqCst);
    for c in clients {
        assert_eq!(c.join().unwrap(), 200);
    }
    let paths: Vec<String> = origin.requests().iter().map(|r| r.target.clone()).collect();
    let came: Vec<String> = (0..8).map(|i| format!("/{i}")).collect();
    assert_eq!(paths, came);
    assert_eq!(origin.connection_count(), 1, "one connection at most");
}

#[test]
fn requests_waiting_for_an_http2_stream_are_sent_in_the_order_they_came() {
    // An h2c origin taking one stream at a time, holding every answer until released; one
    // connection. The first request is taken, the second queues on the connection (h2 holds
    // it until the stream limit lets it open), the others wait in line.
    let release = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let (r, s) = (release.clone(), seen.clone());
    let origin = tokio_server(move |tcp| {
        let (release, seen) = (r.clone(), s.clone());
        async move {
            let Ok(mut conn) = h2::server::Builder::new()
                .max_concurrent_streams(1)
                .handshake::<_, bytes::Bytes>(tcp)
                .await
            else {
                return;
            };
            while let Some(Ok((req, mut respond))) = conn.accept().await {
                seen.lock().unwrap().push(req.uri().path().to_string());
                let release = release.clone();
                tokio::spawn(async move {
                    while !release.load(Ordering::SeqCst) {
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    }
                    let resp = http::Response::builder().status(200).body(()).unwrap();
                    let _ = respond.send_response(resp, true);
                });
            }
        }
    });
    let p = proxy_over(
        "workers = 1",
        &quoted(&[origin]),
        "protocol = \"h2c\"\nh2_connections = 1\nmax_connections = 1\nmax_pending = 16\n\
         connect_timeout = \"10s\"",
    );
    let addr = p.addr;
    let upstreams = || admin(admin_addr(&p), "GET", "/-/upstreams").1;
    let mut clients = Vec::new();
    for i in 0..8 {
        let path = format!("/{i}");
        clients.push(thread::spawn(move || {
            Client::connect(addr).get(&path).status
        }));
        let placed = || match i {
            0 => seen.lock().unwrap().len() == 1,
            1 => upstreams().contains("\"in_flight\":2"),
            _ => upstreams().contains(&format!("\"pending\":{}", i - 1)),
        };
        assert!(
            wait_until(Duration::from_secs(5), placed),
            "request {i} was not placed: {}",
            upstreams()
        );
    }
    release.store(true, Ordering::SeqCst);
    for c in clients {
        assert_eq!(c.join().unwrap(), 200);
    }
    let came: Vec<String> = (0..8).map(|i| format!("/{i}")).collect();
    assert_eq!(*seen.lock().unwrap(), came);
}

#[test]
fn an_idle_connection_on_one_worker_does_not_shut_out_the_others() {
    // One connection allowed across two workers, pooled for a minute: each request comes on
    // a new client connection, so both workers serve some. The worker that holds the idle
    // connection gives it up for a request waiting on the other, well before the wait for a
    // connection (3 s) runs out.
    let origin = Origin::ok("ok");
    let p = proxy_over(
        "workers = 2",
        &quoted(&[origin.addr]),
        "max_connections = 1\nconnect_timeout = \"3s\"\npool_idle_timeout = \"60s\"",
    );
    for i in 0..20 {
        let started = Instant::now();
        let r = p.connect().get("/");
        assert_eq!(r.status, 200, "request {i}: {}", r.text());
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "request {i} waited {:?}",
            started.elapsed()
        );
    }
}

#[test]
fn a_client_gone_while_queued_for_a_connection_is_dropped_not_sent() {
    let release = Arc::new(AtomicBool::new(false));
    let origin = gated(&release, "ok");
    let p = proxy_over(
        "workers = 1\n[http]\nclient_close_check = \"100ms\"",
        &quoted(&[origin.addr]),
        "max_connections = 1\nmax_pending = 1\nconnect_timeout = \"5s\"",
    );
    let addr = p.addr;
    let first = thread::spawn(move || Client::connect(addr).get("/a").status);
    assert!(wait_until(Duration::from_secs(5), || origin
        .requests()
        .len()
        == 1));
    // Queued behind the held request, then gone.
    let mut gone = std::net::TcpStream::connect(addr).unwrap();
    gone.write_all(b"GET /b HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    assert!(wait_until(Duration::from_secs(5), || {
        admin(admin_addr(&p), "GET", "/-/upstreams")
            .1
            .contains("\"pending\":1")
    }));
    drop(gone);
    // Its place in the queue is given up within the close check (not at connect_timeout).
    assert!(
        wait_until(Duration::from_secs(2), || {
            admin(admin_addr(&p), "GET", "/-/upstreams")
                .1
                .contains("\"pending\":0")
        }),
        "the gone client's request stayed queued"
    );
    let queued = thread::spawn(move || Client::connect(addr).get("/c").status);
    assert!(wait_until(Duration::from_secs(5), || {
        admin(admin_addr(&p), "GET", "/-/upstreams")
            .1
            .contains("\"pending\":1")
    }));
    release.store(true, Ordering::SeqCst);
    assert_eq!(first.join().unwrap(), 200);
    assert_eq!(queued.join().unwrap(), 200);
    let paths: Vec<String> = origin.requests().iter().map(|r| r.target.clone()).collect();
    assert_eq!(paths, ["/a", "/c"], "nothing sent for the client that went");
}

#[test]
fn an_empty_token_bucket_makes_the_endpoint_ineligible() {
    let origin = Origin::ok("ok");
    let p = proxy_over(
        "workers = 1",
        &quoted(&[origin.addr]),
        "rate_limit = { max_rps = 5, burst = 1 }\nmax_pending = 0",
    );
    let mut c = p.connect();
    let statuses: Vec<u16> = (0..10).map(|_| c.get("/").status).collect();
    let ok = statuses.iter().filter(|&&s| s == 200).count();
    assert!(
        (2..=3).contains(&ok),
        "burst 1 plus the token due now: {statuses:?}"
    );
    thread::sleep(Duration::from_millis(450));
    assert_eq!(c.get("/").status, 200, "tokens come back at 5/s");
}

#[test]
fn the_cap_sheds_low_priority_first_while_high_priority_is_admitted() {
    let release = Arc::new(AtomicBool::new(false));
    let origin = gated(&release, "ok");
    let p = Proxy::start(&format!(
        "[gateway]\nmax_concurrent_requests = 10\n[[upstreams]]\nname = \"up\"\nendpoints = [\"{}\"]\n\
         [[routes]]\npath_prefix = \"/low\"\nproxy = \"up\"\npriority_class = 2\n\
         [[routes]]\npath_prefix = \"/high\"\nproxy = \"up\"\npriority_class = 9\n",
        origin.addr
    ));
    let addr = p.addr;
    // 9 low-priority requests fill the unreserved share (10 - 10%).
    let low: Vec<_> = (0..9)
        .map(|_| thread::spawn(move || Client::connect(addr).get("/low").status))
        .collect();
    assert!(wait_until(Duration::from_secs(5), || origin
        .requests()
        .len()
        == 9));
    let r = p.connect().get("/low");
    assert_eq!(
        (r.status, r.error_code().as_deref()),
        (503, Some("gateway_saturated"))
    );
    assert!(r.header("retry-after").is_none());
    // The reserved slot still admits high priority.
    let high = thread::spawn(move || Client::connect(addr).get("/high").status);
    assert!(wait_until(Duration::from_secs(5), || origin
        .requests()
        .len()
        == 10));
    // Now the cap is full for everyone.
    assert_eq!(p.connect().get("/high").status, 503);
    let m = metrics(p.addr);
    assert_eq!(m["ringway_gateway_requests_in_flight"], 10.0);
    assert_eq!(m["ringway_gateway_shed_total{priority_class=\"2\"}"], 1.0);
    assert_eq!(m["ringway_gateway_shed_total{priority_class=\"9\"}"], 1.0);
    release.store(true, Ordering::SeqCst);
    for h in low {
        assert_eq!(h.join().unwrap(), 200);
    }
    assert_eq!(high.join().unwrap(), 200);
    assert!(wait_until(Duration::from_secs(5), || metrics(p.addr)
        ["ringway_gateway_requests_in_flight"]
        == 0.0));
}

#[test]
fn permits_return_to_zero_after_10000_requests_with_random_disconnects() {
    let origin = Origin::start(|r| {
        if r.target.ends_with("slow") {
            Reply::Delay(Duration::from_millis(3), Box::new(Reply::text(200, "slow")))
        } else {
            Reply::text(200, "ok")
        }
    });
    let p = proxy_over(
        "[gateway]\nmax_concurrent_requests = 64",
        &quoted(&[origin.addr]),
        "max_connections = 16\nbreaker = { failure_threshold = 1000 }",
    );
    let addr = p.addr;
    let done = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let done = done.clone();
            thread::spawn(move || {
                let mut x = t.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
                let mut c = Client::connect(addr);
                for _ in 0..1250 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    match x % 10 {
                        // Ask, then leave before the answer.
                        0 => {
                            let mut s = TcpStream::connect(addr).unwrap();
                            let _ = s.write_all(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n");
                        }
                        // Promise a body, send part of it, leave.
                        1 => {
                            let mut s = TcpStream::connect(addr).unwrap();
                            let _ = s.write_all(
                                b"POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc",
                            );
                        }
                        _ => {
                            let r = c.get(if x % 3 == 0 { "/slow" } else { "/" });
                            assert!(r.status == 200 || r.status == 503, "{}", r.status);
                            if r.header("connection") == Some("close") {
                                c = Client::connect(addr);
                            }
                        }
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(done.load(Ordering::Relaxed), 10_000);
    let settled = wait_until(Duration::from_secs(10), || {
        let m = metrics(addr);
        m["ringway_gateway_requests_in_flight"] == 0.0
            && m[&format!(
                "ringway_endpoint_in_flight{{upstream=\"up\",endpoint=\"{0}\",authority=\"{0}\"}}",
                origin.addr
            )] == 0.0
    });
    let (_, json) = admin(admin_addr(&p), "GET", "/-/upstreams");
    assert!(settled, "{json}");
    assert!(
        json.contains("\"pending\":0,\"active_retries\":0"),
        "{json}"
    );
    assert!(json.contains("\"in_flight\":0"), "{json}");
    let start = Instant::now();
    let connections_ok = wait_until(Duration::from_secs(5), || {
        let m = metrics(addr);
        m[&format!(
            "ringway_endpoint_connections{{upstream=\"up\",endpoint=\"{0}\",authority=\"{0}\"}}",
            origin.addr
        )] <= 16.0
    });
    assert!(
        connections_ok,
        "connection slots are given back ({:?})",
        start.elapsed()
    );
}

#[test]
fn endpoints_whose_checks_hang_cannot_keep_other_upstreams_from_being_checked() {
    // 64 endpoints that take connections and never answer, as many as probes run at once,
    // listed first; an upstream after them with one sound endpoint. Its first check comes at
    // once, among the first endpoints of each upstream (before, they took every probe thread
    // again each time theirs ended, and it was never checked: out of rotation for good).
    let silent: Vec<std::net::TcpListener> = (0..64)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    let hung: Vec<String> = silent
        .iter()
        .map(|l| format!("\"{}\"", l.local_addr().unwrap()))
        .collect();
    let origin = Origin::ok("ok");
    let check = "health_check = { path = \"/\", interval = \"1s\", timeout = \"3s\" }";
    let p = Proxy::start(&format!(
        "workers = 1\n[[upstreams]]\nname = \"hung\"\nendpoints = [{}]\n{check}\n\
         [[upstreams]]\nname = \"up\"\nendpoints = [\"{}\"]\n{check}\n\
         [[routes]]\npath_prefix = \"/\"\nproxy = \"up\"\n",
        hung.join(", "),
        origin.addr
    ));
    assert!(
        health_becomes(&p, origin.addr, 1.0),
        "the sound endpoint was never checked"
    );
    assert_eq!(p.connect().get("/").status, 200);
    drop(silent);
}

#[test]
fn upstream_latency_is_exported_as_a_summary_and_a_histogram() {
    let origin = Origin::ok("ok");
    let p = proxy_over("workers = 1", &quoted(&[origin.addr]), "");
    for _ in 0..3 {
        assert_eq!(p.connect().get("/").status, 200);
    }
    // Published by the worker about once a second.
    let count = |name: &str| metric_sum(p.addr, &format!("{name}{{upstream=\"up\"}}"));
    assert!(wait_until(Duration::from_secs(5), || count(
        "ringway_upstream_latency_seconds_count"
    ) == 3.0));
    assert_eq!(count("ringway_upstream_latency_microseconds_count"), 3.0);
    let inf = metric_sum(
        p.addr,
        "ringway_upstream_latency_seconds_bucket{upstream=\"up\",le=\"+Inf\"}",
    );
    assert_eq!(inf, 3.0);
    // Loopback answers within a second.
    let one_s = metric_sum(
        p.addr,
        "ringway_upstream_latency_seconds_bucket{upstream=\"up\",le=\"1\"}",
    );
    assert_eq!(one_s, 3.0);
}

#[test]
fn health_probes_spread_by_their_jitter() {
    let times = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = times.clone();
    let origin = Origin::start(move |r| {
        if r.target == "/health" {
            seen.lock().unwrap().push(Instant::now());
        }
        Reply::text(200, "ok")
    });
    let _p = proxy_over(
        "workers = 1",
        &quoted(&[origin.addr]),
        "health_check = { path = \"/health\", interval = \"200ms\", timeout = \"500ms\", \
         jitter_percent = 100 }",
    );
    assert!(wait_until(Duration::from_secs(15), || times
        .lock()
        .unwrap()
        .len()
        >= 13));
    let t = times.lock().unwrap().clone();
    let gaps: Vec<Duration> = t.windows(2).map(|w| w[1] - w[0]).collect();
    let (min, max) = (*gaps.iter().min().unwrap(), *gaps.iter().max().unwrap());
    // Never before the interval; spread over up to another interval (the checker looks every
    // 50 ms): twelve gaps of a fixed wait would sit within one look of each other.
    // (Measured where the probes land: a probe's start-up and connect are in the gaps.)
    assert!(min >= Duration::from_millis(150), "{gaps:?}");
    assert!(max - min >= Duration::from_millis(60), "{gaps:?}");
}
