//! Request smuggling and framing: ambiguous messages are refused with 400 and the connection
//! closes, so nothing after them is ever read as a second request; the origin never sees a
//! request the client did not send as one.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

mod support;

use std::time::Duration;

use support::*;

/// Each of these must give 400 and close, and the origin must see no request at all.
const REFUSED: &[(&str, &[u8])] = &[
    (
        "cl+te",
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: a\r\n\r\n",
    ),
    (
        "te+cl",
        b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 6\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: a\r\n\r\n",
    ),
    (
        "differing cl",
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\nContent-Length: 40\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: a\r\n\r\n",
    ),
    (
        "cl list",
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0, 40\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: a\r\n\r\n",
    ),
    (
        "te not last chunked",
        b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n",
    ),
    (
        "te chunked twice",
        b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    ),
    (
        "te with space before colon",
        b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding : chunked\r\n\r\n0\r\n\r\n",
    ),
    (
        "te obs-fold",
        b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:\r\n chunked\r\n\r\n0\r\n\r\n",
    ),
    (
        "te in http/1.0",
        b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    ),
    (
        "bare cr in value",
        b"GET / HTTP/1.1\r\nHost: a\r\nX: a\rGET /smuggled HTTP/1.1\r\n\r\n",
    ),
    ("nul in value", b"GET / HTTP/1.1\r\nHost: a\r\nX: a\x00b\r\n\r\n"),
    ("missing host", b"GET / HTTP/1.1\r\nX: a\r\n\r\n"),
    ("two hosts", b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"),
    ("bad host", b"GET / HTTP/1.1\r\nHost: a/b@c\r\n\r\n"),
    ("space in target", b"GET /a b HTTP/1.1\r\nHost: a\r\n\r\n"),
    ("negative cl", b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n"),
    ("plus cl", b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +5\r\n\r\nhello"),
];

#[test]
fn ambiguous_requests_are_refused_and_close() {
    let origin = Origin::ok("ok");
    let proxy = Proxy::to(origin.addr, "");
    for (name, bytes) in REFUSED {
        let mut c = proxy.connect();
        c.send(bytes);
        let r = c
            .read_response(false)
            .unwrap_or_else(|| panic!("{name}: no response"));
        assert_eq!(r.status, 400, "{name}: {}", r.text());
        assert_eq!(r.header("connection"), Some("close"), "{name}");
        assert!(
            c.read_response(false).is_none(),
            "{name}: a second response followed"
        );
    }
    assert!(
        origin.requests().is_empty(),
        "the origin saw {:?}",
        origin.requests()
    );
}

/// Malformed chunked bodies: the head is valid, so the request started upstream; the body
/// error ends it with 400 and the client connection closes. Nothing after the bad chunk is
/// ever taken for a request.
#[test]
fn malformed_chunked_bodies_are_refused() {
    let cases: &[(&str, &[u8])] = &[
        ("bad size", b"zz\r\nhello\r\n0\r\n\r\n"),
        ("size with lf only", b"5\nhello\r\n0\r\n\r\n"),
        (
            "missing data crlf",
            b"5\r\nhelloGET /smuggled HTTP/1.1\r\nHost: a\r\n\r\n",
        ),
        ("oversized size", b"11111111111111111\r\n"),
        ("bad trailer", b"0\r\nbad trailer\r\n\r\n"),
        ("chunk ext with lf", b"5;a\nb\r\nhello\r\n0\r\n\r\n"),
    ];
    let origin = Origin::ok("ok");
    let proxy = Proxy::to(origin.addr, "");
    for (name, body) in cases {
        let mut c = proxy.connect();
        c.send(b"POST /chunked HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n");
        c.send(body);
        let r = c
            .read_response(false)
            .unwrap_or_else(|| panic!("{name}: no response"));
        assert_eq!(r.status, 400, "{name}: {}", r.text());
        assert!(
            c.is_closed(Duration::from_secs(3)),
            "{name}: connection stays open"
        );
    }
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        origin.requests().iter().all(|r| r.target != "/smuggled"),
        "smuggled request reached the origin"
    );
}

/// The upstream gets normalized framing: one Content-Length or `chunked`, never the client's
/// spelling.
#[test]
fn framing_is_normalized_upstream() {
    let origin = Origin::ok("ok");
    let proxy = Proxy::to(origin.addr, "");
    let mut c = proxy.connect();
    c.send(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 003\r\n\r\nabc");
    assert_eq!(c.read_response(false).unwrap().status, 200);
    let seen = origin.last();
    assert_eq!(seen.headers_named("content-length"), vec!["3"]);
    assert_eq!(seen.body, b"abc");

    c.send(
        b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: ChUnKeD\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    );
    assert_eq!(c.read_response(false).unwrap().status, 200);
    let seen = origin.last();
    assert_eq!(seen.headers_named("transfer-encoding"), vec!["chunked"]);
    assert_eq!(seen.body, b"abc");
}

/// Upstream responses with stray bytes after the body are not reused: the stray bytes must
/// never become the next client's response.
#[test]
fn stray_bytes_after_a_response_are_not_relayed() {
    let origin = Origin::start(|req| {
        if req.target == "/stray" {
            Reply::Raw(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nforged".to_vec())
        } else {
            Reply::text(200, "real")
        }
    });
    let proxy = Proxy::to(origin.addr, "workers = 1\n");
    let mut c = proxy.connect();
    assert_eq!(c.get("/stray").body, b"ok");
    for _ in 0..3 {
        assert_eq!(c.get("/next").body, b"real");
    }
}

/// Request split at every byte: the result is the same as sent whole.
#[test]
fn request_split_at_every_byte_is_proxied_intact() {
    let origin = Origin::start(|req| {
        Reply::text(
            200,
            &format!("{} {}", req.target, String::from_utf8_lossy(&req.body)),
        )
    });
    let proxy = Proxy::to(origin.addr, "");
    let req = b"POST /split?x=1 HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nX-Y: z\r\n\r\n4\r\nwiki\r\n5\r\npedia\r\n0\r\n\r\n";
    for cut in [1usize, 5, 16, 17, 30, 60, 70, 75, 80, req.len() - 1] {
        let mut c = proxy.connect();
        c.stream.set_nodelay(true).unwrap();
        c.send(&req[..cut]);
        std::thread::sleep(Duration::from_millis(15));
        c.send(&req[cut..]);
        let r = c.read_response(false).unwrap();
        assert_eq!(r.text(), "/split?x=1 wikipedia", "cut at {cut}");
    }
}

/// A 204 never carries Content-Length (RFC 9110 §8.6), even where an upstream gave one; a
/// response to HEAD and a 304 keep the length the body would have had.
#[test]
fn bodiless_responses_state_a_length_only_where_one_is_allowed() {
    let origin = Origin::start(|req| {
        let status = match req.target.as_str() {
            "/204" => "204 No Content",
            "/304" => "304 Not Modified",
            _ => "200 OK",
        };
        Reply::Raw(format!("HTTP/1.1 {status}\r\nContent-Length: 5\r\n\r\n").into_bytes())
    });
    let proxy = Proxy::to(origin.addr, "workers = 1\n");
    let mut c = proxy.connect();
    assert_bodiless_lengths(&mut c);
    // The connection stayed in step.
    assert_eq!(c.get("/204").status, 204);
}

/// An upstream response head that arrives a byte at a time (an interim response first) is
/// read whole and relayed once complete (the interim one too).
#[test]
fn an_upstream_head_trickling_in_byte_by_byte_is_relayed_whole() {
    let origin = raw_origin(|mut s| {
        let _ = s.set_nodelay(true);
        loop {
            let head = read_head_raw(&mut s);
            if head.is_empty() {
                return;
            }
            let resp = b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nX-A: b\r\nContent-Length: 2\r\n\r\nok";
            for b in resp {
                if std::io::Write::write_all(&mut s, &[*b]).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_micros(300));
            }
        }
    });
    let proxy = Proxy::to(origin, "workers = 1\n");
    let mut c = proxy.connect();
    for _ in 0..2 {
        c.send(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n");
        let hints = c.read_response(false).expect("the interim response");
        assert_eq!(hints.status, 103);
        assert_eq!(hints.header("link"), Some("</a>"));
        let r = c.read_response(false).expect("the final response");
        assert_eq!(r.status, 200);
        assert_eq!(r.header("x-a"), Some("b"));
        assert_eq!(r.body, b"ok");
    }
}

/// A malformed line in an upstream's response head is seen as soon as the line is complete,
/// not when the head ends or the response timeout passes.
#[test]
fn a_malformed_upstream_head_line_is_refused_before_the_head_ends() {
    let origin = raw_origin(|mut s| {
        if read_head_raw(&mut s).is_empty() {
            return;
        }
        let _ = std::io::Write::write_all(&mut s, b"HTTP/1.1 200 OK\r\n");
        std::thread::sleep(Duration::from_millis(50));
        let _ = std::io::Write::write_all(&mut s, b"Bad\x01Name: x\r\n");
        std::thread::sleep(Duration::from_secs(5));
    });
    let proxy = Proxy::to(origin, "workers = 1\n");
    assert_prompt_502(&mut proxy.connect());
}
