//! HTTP/1.1 proxying over real loopback sockets: persistence, pipelining, bodies in both
//! directions, forwarded headers, hop-by-hop stripping and the local answers.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

mod support;

use std::thread;
use std::time::Duration;

use support::*;

#[test]
fn keep_alive_reuses_one_upstream_connection() {
    let origin = Origin::ok("hello");
    let proxy = Proxy::to(origin.addr, "");
    let mut c = proxy.connect();
    for _ in 0..10 {
        let r = c.get("/x");
        assert_eq!(r.status, 200);
        assert_eq!(r.body, b"hello");
    }
    assert_eq!(origin.requests().len(), 10);
    assert_eq!(
        origin.connection_count(),
        1,
        "one upstream connection for 10 requests"
    );
}

#[test]
fn pipelined_requests_are_answered_in_order() {
    let origin = Origin::start(|req| Reply::text(200, &req.target));
    let proxy = Proxy::to(origin.addr, "");
    let mut c = proxy.connect();
    c.send(
        b"GET /one HTTP/1.1\r\nHost: a\r\n\r\nGET /two HTTP/1.1\r\nHost: a\r\n\r\n\
          POST /three HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabcGET /four HTTP/1.1\r\nHost: a\r\n\r\n",
    );
    for want in ["/one", "/two", "/three", "/four"] {
        let r = c.read_response(false).expect("response");
        assert_eq!(r.text(), want);
    }
    assert_eq!(origin.requests()[2].body, b"abc");
}

#[test]
fn chunked_bodies_both_ways() {
    let origin = Origin::start(|req| {
        Reply::Full(
            200,
            vec![("transfer-encoding".into(), "chunked".into())],
            req.body.iter().rev().copied().collect(),
        )
    });
    let proxy = Proxy::to(origin.addr, "");
    let mut c = proxy.connect();
    c.send(b"POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n");
    let r = c.read_response(false).unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.header("transfer-encoding"), Some("chunked"));
    assert_eq!(r.body, b"dlrow olleh");
    let seen = origin.last();
    assert!(seen.chunked);
    assert_eq!(seen.body, b"hello world");
    // The connection goes on.
    assert_eq!(c.get("/again").status, 200);
}

#[test]
fn ten_mib_upload_and_download_are_intact() {
    const SIZE: usize = 10 * 1024 * 1024;
    let download = pattern(SIZE, 7);
    let expected = fnv(&download);
    let origin = Origin::start(move |req| {
        if req.method == "POST" {
            Reply::text(200, &format!("{}:{}", req.body.len(), fnv(&req.body)))
        } else {
            Reply::Full(200, vec![], download.clone())
        }
    });
    let proxy = Proxy::to(origin.addr, "");
    let mut c = proxy.connect();

    let upload = pattern(SIZE, 9);
    c.send(format!("POST /up HTTP/1.1\r\nHost: a\r\nContent-Length: {SIZE}\r\n\r\n").as_bytes());
    c.send(&upload);
    let r = c.read_response(false).unwrap();
    assert_eq!(r.text(), format!("{SIZE}:{}", fnv(&upload)));

    let r = c.get("/down");
    assert_eq!(r.body.len(), SIZE);
    assert_eq!(fnv(&r.body), expected);

    // Chunked upload of the same size.
    c.send(b"POST /up HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n");
    for piece in upload.chunks(100_000) {
        c.send(format!("{:x}\r\n", piece.len()).as_bytes());
        c.send(piece);
        c.send(b"\r\n");
    }
    c.send(b"0\r\n\r\n");
    let r = c.read_response(false).unwrap();
    assert_eq!(r.text(), format!("{SIZE}:{}", fnv(&upload)));
}

/// A TCP-level socket option of `stream`, read into a `T` (plain old data).
fn tcp_option<T>(stream: &std::net::TcpStream, name: libc::c_int) -> T {
    use std::os::fd::AsRawFd;
    // SAFETY: only used with libc's plain-old-data types (ints, tcp_info): all zeroes is a
    // valid value of each.
    let mut value: T = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<T>() as libc::socklen_t;
    // SAFETY: `value` and `len` are valid and writable, of the size passed; the fd is open.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::IPPROTO_TCP,
            name,
            (&mut value as *mut T).cast(),
            &mut len,
        )
    };
    assert_eq!(
        rc,
        0,
        "getsockopt({name}): {}",
        std::io::Error::last_os_error()
    );
    value
}

/// TCP segments with data the client's socket received, and its segment size.
fn data_segments_in(stream: &std::net::TcpStream) -> (u32, u32) {
    let info: libc::tcp_info = tcp_option(stream, libc::TCP_INFO);
    let mss: libc::c_int = tcp_option(stream, libc::TCP_MAXSEG);
    (info.tcpi_data_segs_in, mss as u32)
}

#[test]
fn a_large_body_reaches_the_client_in_whole_segments() {
    // Relayed a 64 KiB block at a time as read, each block would leave as a full segment and
    // a short one (loopback's MSS is 65,483): twice the packets. Reads are cut to whole
    // segments once a large body streams.
    const SIZE: usize = 16 * 1024 * 1024;
    let body = pattern(SIZE, 5);
    let expected = fnv(&body);
    let origin = Origin::start(move |_| Reply::Full(200, vec![], body.clone()));
    let proxy = Proxy::to(origin.addr, "");
    let mut c = proxy.connect();
    let (before, _) = data_segments_in(&c.stream);
    let r = c.get("/big");
    assert_eq!(r.body.len(), SIZE);
    assert_eq!(fnv(&r.body), expected);
    let (after, mss) = data_segments_in(&c.stream);
    let segs = u64::from(after - before);
    let whole = (SIZE as u64).div_ceil(u64::from(mss));
    // Whole segments but for the first window's (the receive window opens as it goes) and
    // the reads that found less than a block waiting; unaligned is about 2x.
    assert!(
        segs * 10 <= whole * 14 + 200,
        "{segs} segments for {whole} whole ones (mss {mss})"
    );
}

#[test]
fn forwarded_headers_from_an_untrusted_peer_are_replaced() {
    let origin = Origin::ok("ok");
    let proxy = Proxy::to(origin.addr, "");
    let mut c = proxy.connect();
    c.send(b"GET / HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: 6.6.6.6\r\nX-Real-IP: 6.6.6.6\r\nX-Forwarded-Proto: https\r\nX-Forwarded-Host: evil.example\r\nX-Forwarded-Port: 1\r\nX-Forwarded-Prefix: /evil\r\n\r\n");
    assert_eq!(c.read_response(false).unwrap().status, 200);
    let seen = origin.last();
    assert_eq!(seen.headers_named("x-forwarded-for"), vec!["127.0.0.1"]);
    assert_eq!(seen.headers_named("x-real-ip"), vec!["127.0.0.1"]);
    assert_eq!(seen.headers_named("x-forwarded-proto"), vec!["http"]);
    // What a backend builds its own URLs from is not the client's to choose.
    for name in ["x-forwarded-host", "x-forwarded-port", "x-forwarded-prefix"] {
        assert!(seen.headers_named(name).is_empty(), "{name}");
    }
}

#[test]
fn a_relayed_response_without_a_date_gets_one_and_one_with_a_date_keeps_it() {
    let origin = Origin::start(|r| {
        if r.target == "/dated" {
            Reply::Full(
                200,
                vec![("Date".into(), "Mon, 30 Nov 2026 01:02:03 GMT".into())],
                b"d".to_vec(),
            )
        } else {
            Reply::text(200, "u")
        }
    });
    let proxy = Proxy::to(origin.addr, "");
    let mut c = proxy.connect();
    let r = c.get("/undated");
    let dates: Vec<&(String, String)> = r
        .headers
        .iter()
        .filter(|(k, _)| k.eq_ignore_ascii_case("date"))
        .collect();
    assert_eq!(dates.len(), 1, "{:?}", r.headers);
    assert!(
        dates[0].1.ends_with(" GMT") && dates[0].1.len() == 29,
        "{dates:?}"
    );
    let r = c.get("/dated");
    let dates: Vec<&str> = r
        .headers
        .iter()
        .filter(|(k, _)| k.eq_ignore_ascii_case("date"))
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(dates, ["Mon, 30 Nov 2026 01:02:03 GMT"]);
}

#[test]
fn forwarded_headers_from_a_trusted_peer_are_appended() {
    let origin = Origin::ok("ok");
    let proxy = Proxy::to(
        origin.addr,
        "[gateway]\ntrusted_proxies = [\"127.0.0.0/8\"]\n",
    );
    let mut c = proxy.connect();
    c.send(b"GET / HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: 1.1.1.1, 2.2.2.2\r\nX-Forwarded-For: 3.3.3.3\r\nX-Real-IP: 9.9.9.9\r\nX-Forwarded-Proto: https\r\nX-Forwarded-Host: app.example\r\n\r\n");
    assert_eq!(c.read_response(false).unwrap().status, 200);
    let seen = origin.last();
    assert_eq!(seen.headers_named("x-forwarded-host"), vec!["app.example"]);
    assert_eq!(
        seen.headers_named("x-forwarded-for"),
        vec!["1.1.1.1, 2.2.2.2, 3.3.3.3, 127.0.0.1"]
    );
    assert_eq!(seen.headers_named("x-real-ip"), vec!["127.0.0.1"]);
    assert_eq!(seen.headers_named("x-forwarded-proto"), vec!["https"]);

    // Without an inbound chain, the chain is the peer.
    c.send(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n");
    c.read_response(false).unwrap();
    assert_eq!(
        origin.last().headers_named("x-forwarded-for"),
        vec!["127.0.0.1"]
    );
    assert_eq!(
        origin.last().headers_named("x-forwarded-proto"),
        vec!["http"]
    );

    // Fields the peer lists in Connection were for ringway alone: as if not sent.
    c.send(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: X-Forwarded-For, X-Forwarded-Proto\r\nX-Forwarded-For: 1.1.1.1\r\nX-Forwarded-Proto: https\r\n\r\n");
    c.read_response(false).unwrap();
    let seen = origin.last();
    assert_eq!(seen.headers_named("x-forwarded-for"), vec!["127.0.0.1"]);
    assert_eq!(seen.headers_named("x-forwarded-proto"), vec!["http"]);
}

#[test]
fn request_id_is_kept_when_valid_and_generated_otherwise() {
    let origin = Origin::ok("ok");
    let proxy = Proxy::to(origin.addr, "");
    let mut c = proxy.connect();
    c.send(b"GET / HTTP/1.1\r\nHost: a\r\nX-Request-Id: my-id-1\r\n\r\n");
    let r = c.read_response(false).unwrap();
    assert_eq!(r.header("x-request-id"), Some("my-id-1"));
    assert_eq!(origin.last().header("x-request-id"), Some("my-id-1"));

    let long = "x".repeat(129);
    c.send(format!("GET / HTTP/1.1\r\nHost: a\r\nX-Request-Id: {long}\r\n\r\n").as_bytes());
    let r = c.read_response(false).unwrap();
    let id = r.header("x-request-id").unwrap().to_string();
    assert_eq!(id.len(), 32);
    assert_eq!(
        origin.last().headers_named("x-request-id"),
        vec![id.as_str()]
    );
}

#[test]
fn hop_by_hop_fields_are_stripped_both_ways() {
    let origin = Origin::start(|_| {
        Reply::Full(
            200,
            vec![
                ("Connection".into(), "X-Up-Secret, keep-alive".into()),
                ("X-Up-Secret".into(), "1".into()),
                ("Keep-Alive".into(), "timeout=5".into()),
                ("Proxy-Connection".into(), "x".into()),
                ("Upgrade".into(), "h2c".into()),
                ("X-Kept".into(), "yes".into()),
            ],
            b"ok".to_vec(),
        )
    });
    let proxy = Proxy::to(origin.addr, "");
    let mut c = proxy.connect();
    c.send(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: keep-alive, X-Secret\r\nX-Secret: s\r\nKeep-Alive: 300\r\nTE: trailers\r\nUpgrade: websocket\r\nProxy-Connection: keep-alive\r\nX-Fine: 1\r\n\r\n");
    let r = c.read_response(false).unwrap();
    assert_eq!(r.status, 200);
    for gone in [
        "connection",
        "x-up-secret",
        "keep-alive",
        "proxy-connection",
        "upgrade",
    ] {
        assert_eq!(r.header(gone), None, "response kept {gone}");
    }
    assert_eq!(r.header("x-kept"), Some("yes"));
    let seen = origin.last();
    for gone in [
        "connection",
        "x-secret",
        "keep-alive",
        "te",
        "upgrade",
        "proxy-connection",
    ] {
        assert_eq!(seen.header(gone), None, "request kept {gone}");
    }
    assert_eq!(seen.header("x-fine"), Some("1"));
}

#[test]
fn host_is_the_upstream_authority_unless_preserved() {
    let origin = Origin::ok("ok");
    let proxy = Proxy::start(&format!(
        "[[upstreams]]\nname = \"up\"\nendpoints = [\"{0}\"]\n\
         [[routes]]\npath_prefix = \"/keep/\"\nproxy = \"up\"\npreserve_host = true\n\
         [[routes]]\npath_prefix = \"/api/\"\nproxy = \"up\"\nstrip_prefix = \"/api\"\n",
        origin.addr
    ));
    let mut c = proxy.connect();
    c.send(b"GET /api/v1/x?q=1 HTTP/1.1\r\nHost: public.example\r\n\r\n");
    assert_eq!(c.read_response(false).unwrap().status, 200);
    let seen = origin.last();
    assert_eq!(seen.header("host"), Some(origin.addr.to_string().as_str()));
    assert_eq!(seen.target, "/v1/x?q=1");

    c.send(b"GET /keep/y HTTP/1.1\r\nHost: public.example\r\n\r\n");
    assert_eq!(c.read_response(false).unwrap().status, 200);
    let seen = origin.last();
    assert_eq!(seen.header("host"), Some("public.example"));
    assert_eq!(seen.target, "/keep/y");
}

#[test]
fn absolute_form_target_is_sent_in_origin_form() {
    let origin = Origin::ok("ok");
    let proxy = Proxy::start(&format!(
        "[[upstreams]]\nname = \"up\"\nendpoints = [\"{0}\"]\n\
         [[routes]]\nhost = \"example.com\"\npath_prefix = \"/\"\nproxy = \"up\"\npreserve_host = true\n",
        origin.addr
    ));
    let mut c = proxy.connect();
    c.send(b"GET http://Example.com:8080/p?x HTTP/1.1\r\nHost: ignored.example\r\n\r\n");
    let r = c.read_response(false).unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let seen = origin.last();
    assert_eq!(seen.target, "/p?x");
    assert_eq!(seen.header("host"), Some("Example.com:8080"));
}

#[test]
fn http10_clients_get_close_unless_keep_alive_and_no_chunked() {
    let origin = Origin::start(|req| {
        if req.target == "/chunked" {
            Reply::Full(
                200,
                vec![("transfer-encoding".into(), "chunked".into())],
                b"chunky body".to_vec(),
            )
        } else {
            Reply::text(200, "plain")
        }
    });
    let proxy = Proxy::to(origin.addr, "");

    let mut c = proxy.connect();
    c.send(b"GET /x HTTP/1.0\r\n\r\n");
    let r = c.read_response(false).unwrap();
    assert_eq!(r.body, b"plain");
    assert_eq!(r.header("connection"), Some("close"));
    assert!(c.is_closed(Duration::from_secs(2)));

    let mut c = proxy.connect();
    c.send(b"GET /x HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
    let r = c.read_response(false).unwrap();
    assert_eq!(r.header("connection"), Some("keep-alive"));
    c.send(b"GET /chunked HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
    let r = c.read_response(false).unwrap();
    assert_eq!(
        r.header("transfer-encoding"),
        None,
        "no chunked to HTTP/1.0"
    );
    assert_eq!(r.header("connection"), Some("close"));
    assert_eq!(r.body, b"chunky body");
    // The upstream side is HTTP/1.1 all the same.
    assert_eq!(origin.last().version, 1);
}

#[test]
fn expect_100_continue_is_answered_before_the_body() {
    let origin = Origin::start(|req| Reply::text(200, &String::from_utf8_lossy(&req.body)));
    let proxy = Proxy::to(origin.addr, "");
    let mut c = proxy.connect();
    c.send(b"PUT /u HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n");
    let interim = c.read_response(false).unwrap();
    assert_eq!(interim.status, 100);
    c.send(b"hello");
    let r = c.read_response(false).unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.body, b"hello");
    assert_eq!(origin.last().header("expect"), None);
}

#[test]
fn head_and_bodiless_responses_carry_no_body() {
    let origin = Origin::start(|req| match req.target.as_str() {
        "/204" => Reply::Full(204, vec![], vec![]),
        "/304" => Reply::Full(304, vec![], vec![]),
        _ => Reply::text(200, "twelve bytes"),
    });
    let proxy = Proxy::to(origin.addr, "");
    let mut c = proxy.connect();
    c.send(b"HEAD /x HTTP/1.1\r\nHost: a\r\n\r\n");
    let r = c.read_response(true).unwrap();
    assert_eq!(r.header("content-length"), Some("12"));
    assert!(r.body.is_empty());
    assert_eq!(c.get("/204").status, 204);
    assert_eq!(c.get("/304").status, 304);
    // Nothing stray was left on the connection: the next response parses.
    assert_eq!(c.get("/x").body, b"twelve bytes");
}

#[test]
fn respond_routes_and_reserved_paths() {
    let proxy = Proxy::start(
        "[[routes]]\npath_prefix = \"/hi\"\nrespond = { status = 201, body = \"hello\", headers = { \"x-a\" = \"b\" } }\n",
    );
    let mut c = proxy.connect();
    let r = c.get("/hi");
    assert_eq!(
        (r.status, r.text().as_str(), r.header("x-a")),
        (201, "hello", Some("b"))
    );
    assert!(r.header("date").is_some());
    assert!(r.header("x-request-id").is_some());
    let r = c.get("/healthz");
    assert_eq!((r.status, r.text().as_str()), (200, "{\"status\":\"ok\"}"));
    let r = c.get("/readyz");
    assert_eq!(r.status, 200);
    // A respond route consumes a small body and keeps the connection.
    c.send(b"POST /hi HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\n\r\nbody");
    assert_eq!(c.read_response(false).unwrap().status, 201);
    c.send(
        b"POST /hi HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    );
    assert_eq!(c.read_response(false).unwrap().status, 201);
    assert_eq!(c.get("/hi").status, 201);

    let m = metrics(proxy.addr);
    assert!(m["ringway_responses_total{class=\"2xx\"}"] >= 6.0, "{m:?}");
    assert!(m["ringway_connections_active"] >= 1.0);
}

#[test]
fn metrics_count_pool_hits_and_connects() {
    let origin = Origin::ok("ok");
    let proxy = Proxy::to(origin.addr, "workers = 1\n");
    let mut c = proxy.connect();
    for _ in 0..5 {
        c.get("/");
    }
    let m = metrics(proxy.addr);
    assert_eq!(
        m["ringway_upstream_pool_misses_total{upstream=\"up\"}"], 1.0,
        "{m:?}"
    );
    assert!(m["ringway_upstream_pool_hits_total{upstream=\"up\"}"] >= 4.0);
    assert_eq!(m["ringway_upstream_requests_total{upstream=\"up\"}"], 5.0);
    let ep = format!(
        "upstream=\"up\",endpoint=\"{0}\",authority=\"{0}\"",
        origin.addr
    );
    assert_eq!(m[&format!("ringway_endpoint_requests_total{{{ep}}}")], 5.0);
    assert_eq!(m[&format!("ringway_endpoint_connections{{{ep}}}")], 1.0);
    assert_eq!(m[&format!("ringway_endpoint_healthy{{{ep}}}")], 1.0);
    assert_eq!(m["ringway_upstream_breaker_state{upstream=\"up\"}"], 0.0);
    assert!(m["ringway_client_bytes_received_total"] > 0.0);
    assert!(m["ringway_client_bytes_sent_total"] > 0.0);
}

#[test]
fn driver_matches_the_environment() {
    let proxy = Proxy::start("");
    let m = metrics(proxy.addr);
    let driver = if uring_expected() {
        "io_uring"
    } else {
        "epoll"
    };
    let key = format!(
        "ringway_info{{version=\"{}\",driver=\"{driver}\"}}",
        env!("CARGO_PKG_VERSION")
    );
    assert_eq!(m.get(&key), Some(&1.0), "{m:?}");
}

#[test]
fn driver_epoll_from_the_config() {
    let proxy = Proxy::start("driver = \"epoll\"");
    let key = format!(
        "ringway_info{{version=\"{}\",driver=\"epoll\"}}",
        env!("CARGO_PKG_VERSION")
    );
    assert_eq!(metrics(proxy.addr).get(&key), Some(&1.0));
    let server = proxy.server.as_ref().expect("running");
    assert_eq!(server.driver().name(), "epoll");
}

#[test]
fn driver_io_uring_is_io_uring_or_no_start() {
    let available = uring_expected();
    let text = "workers = 1\ncpus = []\ndriver = \"io_uring\"\n\
                [[listeners]]\naddress = \"127.0.0.1:0\"\n";
    let gen = ringway::config::compile(text, "test.toml").expect("compiles");
    match ringway::Server::start(gen) {
        Ok(server) => {
            assert!(available, "started without io_uring");
            assert_eq!(server.driver().name(), "io_uring");
            server.shutdown();
            server.join();
        }
        Err(e) => {
            assert!(!available, "io_uring available, yet: {e}");
            assert!(e.to_string().contains("driver = \"io_uring\""), "{e}");
        }
    }
}

/// Whether `driver = "auto"` should come up on io_uring in this test run.
fn uring_expected() -> bool {
    let forced = std::env::var("MONOIO_FORCE_LEGACY_DRIVER")
        .is_ok_and(|v| matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "yes"));
    !forced && monoio_uring_available()
}

fn monoio_uring_available() -> bool {
    std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled")
        .map(|v| v.trim() == "0")
        .unwrap_or(true)
}

#[test]
fn spoofable_forwarding_fields_do_not_pass_from_untrusted_peers() {
    let origin = Origin::ok("ok");
    let proxy = Proxy::to(origin.addr, "");
    let mut c = proxy.connect();
    c.send(b"GET / HTTP/1.1\r\nHost: a\r\nX_Forwarded_For: 6.6.6.6\r\nX_Real_IP: 6.6.6.6\r\nx-forwarded_proto: https\r\nForwarded: for=6.6.6.6;proto=https\r\nX_Custom: kept\r\n\r\n");
    assert_eq!(c.read_response(false).unwrap().status, 200);
    let seen = origin.last();
    for (name, value) in &seen.headers {
        assert!(
            !value.contains("6.6.6.6"),
            "{name}: {value} reached the origin"
        );
    }
    assert_eq!(seen.header("x_custom"), Some("kept"));

    // A trusted peer's Forwarded is kept; underscore spellings never are.
    let proxy = Proxy::to(
        origin.addr,
        "[gateway]\ntrusted_proxies = [\"127.0.0.1\"]\n",
    );
    let mut c = proxy.connect();
    c.send(
        b"GET / HTTP/1.1\r\nHost: a\r\nX_Forwarded_For: 6.6.6.6\r\nForwarded: for=5.5.5.5\r\n\r\n",
    );
    assert_eq!(c.read_response(false).unwrap().status, 200);
    let seen = origin.last();
    assert_eq!(seen.header("forwarded"), Some("for=5.5.5.5"));
    assert_eq!(seen.header("x_forwarded_for"), None);
}

#[test]
fn request_trailers_are_not_forwarded() {
    use std::io::Read;
    let (tx, rx) = std::sync::mpsc::channel();
    let addr = raw_origin(move |mut s| {
        let mut got = read_head_raw(&mut s);
        let mut b = [0u8; 1];
        while !got.ends_with(b"0\r\n\r\n") {
            if s.read(&mut b).unwrap_or(0) == 0 {
                break;
            }
            got.push(b[0]);
        }
        let _ = std::io::Write::write_all(&mut s, b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
        let _ = tx.send(got);
    });
    let proxy = Proxy::to(addr, "");
    let mut c = proxy.connect();
    c.send(b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nX-Forwarded-For: 6.6.6.6\r\nX-Sum: 1\r\n\r\n");
    assert_eq!(c.read_response(false).unwrap().status, 200);
    let got = String::from_utf8(rx.recv_timeout(Duration::from_secs(5)).unwrap()).unwrap();
    assert!(got.ends_with("3\r\nabc\r\n0\r\n\r\n"), "{got}");
    assert!(!got.contains("6.6.6.6"), "{got}");
}

#[test]
fn chunk_extensions_are_not_relayed_either_way() {
    use std::io::Read;
    let (tx, rx) = std::sync::mpsc::channel();
    let addr = raw_origin(move |mut s| {
        let mut got = read_head_raw(&mut s);
        let head = got.len();
        let mut b = [0u8; 1];
        while !got[head..].ends_with(b"\r\n\r\n") {
            if s.read(&mut b).unwrap_or(0) == 0 {
                break;
            }
            got.push(b[0]);
        }
        let _ = std::io::Write::write_all(
            &mut s,
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\
              4 ;up=\"a;b\"\r\nbody\r\n0;end\r\n\r\n",
        );
        let _ = tx.send(got);
    });
    let proxy = Proxy::to(addr, "");
    let mut c = proxy.connect();
    c.send(
        b"POST / HTTP/1.1\r\nHost: a\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n\
             3;name=value\r\nabc\r\n2\t;x\r\nde\r\n0;last=1\r\n\r\n",
    );
    let got = String::from_utf8(rx.recv_timeout(Duration::from_secs(5)).unwrap()).unwrap();
    assert!(
        got.ends_with("\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"),
        "{got}"
    );
    let back = String::from_utf8(c.read_to_end()).unwrap();
    assert!(back.ends_with("\r\n\r\n4\r\nbody\r\n0\r\n\r\n"), "{back}");
}

#[test]
fn relayed_trailers_keep_only_fields_a_trailer_may_carry() {
    let addr = raw_origin(move |mut s| {
        let _ = read_head_raw(&mut s);
        // The trailer section comes in two writes, split inside a field line.
        for (i, part) in [
            &b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nbody\r\n0\r\n\
               X-Sum: 1\r\nContent-Le"[..],
            b"ngth: 999\r\nHost: evil\r\nTransfer-Encoding: gzip\r\nX-Tail: 2\r\n\r\n",
        ]
        .into_iter()
        .enumerate()
        {
            if i > 0 {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = std::io::Write::write_all(&mut s, part);
        }
    });
    let proxy = Proxy::to(addr, "");
    let mut c = proxy.connect();
    c.send(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
    let back = String::from_utf8(c.read_to_end()).unwrap();
    assert!(
        back.ends_with("\r\n\r\n4\r\nbody\r\n0\r\nX-Sum: 1\r\nX-Tail: 2\r\n\r\n"),
        "{back}"
    );
}

#[test]
fn interim_responses_reach_http11_clients_but_not_http10_ones() {
    let proxy = Proxy::to(early_hints_origin(), "");
    // The 103 with its end-to-end fields; the upstream's 100 is not passed on.
    let hint = "HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload";
    assert_interim_reaches_http11_only(proxy.addr, hint);
}

#[test]
fn configured_204_has_no_length_and_keeps_the_connection() {
    let proxy = Proxy::start("[[routes]]\npath_prefix = \"/\"\nrespond = { status = 204 }\n");
    let mut c = proxy.connect();
    for _ in 0..3 {
        let r = c.get("/");
        assert_eq!(r.status, 204);
        assert_eq!(r.header("content-length"), None);
    }
}

/// Peers with Nagle's algorithm on (std's sockets, as many backends and clients) that write
/// a head and its body apart: the body is held back until the head is acknowledged, and on a
/// keep-alive connection Linux delays that ACK by up to 40 ms. ringway acknowledges at once
/// when it waits for the rest of a message: each exchange takes well under the delay, with
/// the request's head split too.
#[test]
fn heads_and_bodies_written_apart_do_not_wait_for_a_delayed_ack() {
    use std::io::{BufReader, Read, Write};
    use std::time::Instant;

    let origin = raw_origin(|mut s| loop {
        if read_head_raw(&mut s).is_empty() {
            return;
        }
        let mut body = [0u8; 5];
        if s.read_exact(&mut body).is_err()
            || s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n")
                .is_err()
            || s.write_all(&body).is_err()
        {
            return;
        }
    });
    let proxy = Proxy::to(origin, "");
    let mut c = std::net::TcpStream::connect(proxy.addr).unwrap();
    let mut r = BufReader::new(c.try_clone().unwrap());
    let mut times = Vec::new();
    for i in 0..8 {
        let t = Instant::now();
        if i % 2 == 0 {
            c.write_all(b"POST /x HTTP/1.1\r\nHost: a\r\n").unwrap();
            c.write_all(b"Content-Length: 5\r\n\r\n").unwrap();
        } else {
            c.write_all(b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\n")
                .unwrap();
        }
        c.write_all(b"hello").unwrap();
        let resp = read_response(&mut r, false).expect("a response");
        assert_eq!((resp.status, resp.text()), (200, "hello".to_string()));
        times.push(t.elapsed());
    }
    assert_no_delayed_ack(&times);
}

#[test]
fn a_client_pipelining_without_pause_does_not_hold_the_worker_from_others() {
    // One client writes pipelined GETs as fast as it can for 2 s and reads the answers;
    // meanwhile other clients are answered at once.
    let proxy = Proxy::start(
        "workers = 1\n[[routes]]\npath_prefix = \"/\"\nrespond = { status = 200, body = \"ok\" }",
    );
    let one = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    let chunk = one.iter().copied().cycle().take(one.len() * 2048).collect();
    let (slowest, sent) = served_during_flood(proxy.addr, b"", chunk);
    assert!(
        sent > 1 << 20,
        "the flood was too slow to tell: {sent} bytes"
    );
    assert!(
        slowest < Duration::from_millis(300),
        "a request waited {slowest:?}"
    );
}

/// Bytes of head blocks in use and idle in the pools, on every worker, as of their last
/// second.
fn head_blocks(addr: std::net::SocketAddr) -> (f64, f64) {
    let m = metrics(addr);
    let get = |state: &str| {
        m.get(&format!(
            "ringway_buffer_bytes{{pool=\"head\",state=\"{state}\"}}"
        ))
        .copied()
        .expect("the head pool's gauge")
    };
    (get("in_use"), get("idle"))
}

#[test]
fn idle_keep_alive_connections_give_their_head_blocks_back_when_asked() {
    const CONNS: usize = 24;
    let origin = Origin::start(|req| Reply::text(200, &req.target));
    for release in ["50ms", "off"] {
        let proxy = Proxy::to(
            origin.addr,
            &format!("[http]\nidle_buffer_release = \"{release}\"\n"),
        );
        let mut conns: Vec<Client> = (0..CONNS).map(|_| proxy.connect()).collect();
        for c in &mut conns {
            assert_eq!(c.get("/first").text(), "/first");
        }
        // Each head block is at least 16 KiB: the idle connections' blocks show as in use,
        // or as idle in the pool once given back. (The gauges are set once a second; they
        // read 0 before, and a sample may come before the release.)
        let held = (CONNS * 16 * 1024) as f64;
        let mut blocks = (0.0, 0.0);
        let settled = wait_until(Duration::from_secs(5), || {
            blocks = head_blocks(proxy.addr);
            match release {
                "off" => blocks.0 >= held,
                _ => blocks.1 >= held && blocks.0 < held / 4.0,
            }
        });
        assert!(settled, "{release}: {blocks:?}");
        if release == "off" {
            // And they keep holding them.
            thread::sleep(Duration::from_millis(1500));
            let blocks = head_blocks(proxy.addr);
            assert!(
                blocks.0 >= held,
                "every idle connection holds its block: {blocks:?}"
            );
        }
        // They serve what comes after, a head sent whole or in pieces.
        for (i, c) in conns.iter_mut().enumerate() {
            if i % 2 == 0 {
                assert_eq!(c.get("/second").text(), "/second");
            } else {
                c.send(b"GET /sec");
                thread::sleep(Duration::from_millis(20));
                c.send(b"ond HTTP/1.1\r\nHost: test\r\n\r\n");
                let r = c.read_response(false).expect("a response");
                assert_eq!(r.text(), "/second");
            }
        }
    }
}

#[test]
fn requests_that_come_as_an_idle_read_is_cancelled_are_served_whole() {
    // Pauses around the release time (the worker's clock moves in 25 ms ticks, so a read is
    // cancelled anywhere up to 20 ms after it began): requests come both before and after
    // the release, and now and then just as a read is cancelled, when a read the kernel
    // completed meanwhile must keep its bytes.
    let origin = Origin::start(|req| Reply::text(200, &req.target));
    let proxy = Proxy::to(origin.addr, "[http]\nidle_buffer_release = \"20ms\"\n");
    let mut c = proxy.connect();
    for i in 0..120u64 {
        thread::sleep(Duration::from_micros(17_000 + (i * 797) % 6_000));
        let path = format!("/r{i}");
        assert_eq!(c.get(&path).text(), path);
    }
}
