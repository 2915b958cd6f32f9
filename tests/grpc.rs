//! HTTP/2 upstreams and gRPC through ringway, over real sockets: an h2c origin written with the
//! h2 crate (on its own tokio thread) answers gRPC-shaped calls with trailers. Covered: unary
//! and server-streaming calls from an HTTP/2 client with trailers and TE passed through,
//! `grpc-timeout` as the deadline, trailers-only gRPC errors from the gateway, and HTTP/1.1
//! clients reaching an HTTP/2 upstream (trailers in a chunked trailer section).
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

mod support;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use support::*;

fn rt() -> tokio::runtime::Runtime {
    tokio_rt()
}

/// A gRPC message frame: uncompressed flag, 4-byte length, payload.
fn frame(payload: &[u8]) -> Vec<u8> {
    let mut f = vec![0u8];
    f.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// Nothing was counted against an upstream.
fn assert_no_upstream_failures(addr: SocketAddr) {
    let m = metrics(addr);
    assert!(
        m.iter()
            .all(|(k, v)| !k.starts_with("ringway_upstream_failures_total") || *v == 0.0),
        "{m:?}"
    );
}

/// An h2c origin: `/echo.Svc/Unary` answers with the request's frames and grpc-status 0;
/// `/echo.Svc/Stream` sends three messages 50 ms apart; `/echo.Svc/Slow` waits 2 s; anything
/// else is a plain 200 with a trailer `x-done: yes`. Each answer carries `x-te` and
/// `x-grpc-timeout` as the origin saw them.
fn h2_origin() -> SocketAddr {
    tokio_server(|tcp| async move {
        let Ok(mut conn) = h2::server::handshake(tcp).await else {
            return;
        };
        while let Some(Ok((req, respond))) = conn.accept().await {
            tokio::spawn(serve(req, respond));
        }
    })
}

async fn serve(req: http::Request<h2::RecvStream>, mut respond: h2::server::SendResponse<Bytes>) {
    let (parts, mut body) = req.into_parts();
    if parts.uri.path() == "/bidi.Svc/Hold" {
        // The head at once, then nothing until the caller goes.
        let resp = http::Response::builder()
            .status(200)
            .header("content-type", "application/grpc")
            .body(())
            .unwrap();
        if let Ok(mut send) = respond.send_response(resp, false) {
            let _ = std::future::poll_fn(|cx| send.poll_reset(cx)).await;
        }
        drop(body);
        return;
    }
    if parts.uri.path() == "/echo.Svc/SlowHead" {
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let te = parts
        .headers
        .get("te")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    let timeout = parts
        .headers
        .get("grpc-timeout")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    let mut input = Vec::new();
    while let Some(Ok(chunk)) = body.data().await {
        let _ = body.flow_control().release_capacity(chunk.len());
        input.extend_from_slice(&chunk);
    }
    if parts.uri.path() == "/many-fields" {
        let mut resp = http::Response::builder().status(200);
        for i in 0..300 {
            resp = resp.header(format!("x-f-{i}"), "v");
        }
        let _ = respond.send_response(resp.body(()).unwrap(), true);
        return;
    }
    if parts.uri.path() == "/echo.Svc/UnaryWithLength" {
        // A length with the head, then trailers (grpc-status) after the body.
        let resp = http::Response::builder()
            .status(200)
            .header("content-type", "application/grpc")
            .header("content-length", input.len())
            .body(())
            .unwrap();
        let mut send = respond.send_response(resp, false).unwrap();
        send.send_data(Bytes::from(input), false).unwrap();
        let mut trailers = http::HeaderMap::new();
        trailers.insert("grpc-status", "0".parse().unwrap());
        let _ = send.send_trailers(trailers);
        return;
    }
    let resp = http::Response::builder()
        .status(200)
        .header("content-type", "application/grpc")
        .header("x-te", te)
        .header("x-grpc-timeout", timeout)
        .body(())
        .unwrap();
    let mut send = respond.send_response(resp, false).unwrap();
    let path = parts.uri.path().to_string();
    let mut trailers = http::HeaderMap::new();
    match path.as_str() {
        "/echo.Svc/Unary" => {
            send.send_data(Bytes::from(input), false).unwrap();
            trailers.insert("grpc-status", "0".parse().unwrap());
            trailers.insert("grpc-message", "ok".parse().unwrap());
        }
        "/echo.Svc/Stream" => {
            for i in 0..3 {
                send.send_data(Bytes::from(frame(format!("msg {i}").as_bytes())), false)
                    .unwrap();
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            trailers.insert("grpc-status", "0".parse().unwrap());
        }
        "/echo.Svc/Slow" => {
            tokio::time::sleep(Duration::from_secs(2)).await;
            trailers.insert("grpc-status", "0".parse().unwrap());
        }
        _ => {
            send.send_data(
                Bytes::from(format!("plain {} {}", parts.method, input.len())),
                false,
            )
            .unwrap();
            trailers.insert("x-done", "yes".parse().unwrap());
            // Fields that frame or route a message: never relayed in a trailer section.
            trailers.insert("content-length", "99".parse().unwrap());
            trailers.insert("host", "elsewhere.example".parse().unwrap());
        }
    }
    let _ = send.send_trailers(trailers);
}

/// An h2c client connection to `addr` (its driver on a task of its own).
async fn h2c_client(addr: SocketAddr) -> h2::client::SendRequest<Bytes> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (client, conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client
}

fn proxy_to_h2(origin: SocketAddr) -> Proxy {
    Proxy::start(&format!(
        "workers = 1\n[[upstreams]]\nname = \"grpc\"\nprotocol = \"h2c\"\nendpoints = [\"{origin}\"]\n\
         [[routes]]\npath_prefix = \"/\"\nproxy = \"grpc\"\n"
    ))
}

/// One gRPC-shaped call over h2c through ringway: (status, headers, data, trailers, elapsed,
/// whether the response's HEADERS frame ended the stream).
async fn call(
    addr: SocketAddr,
    path: &str,
    body: &[u8],
    timeout: Option<&str>,
) -> (
    u16,
    http::HeaderMap,
    Vec<u8>,
    Option<http::HeaderMap>,
    Duration,
    bool,
) {
    let client = h2c_client(addr).await;
    let mut req = http::Request::builder()
        .method("POST")
        .uri(format!("http://svc.test{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    if let Some(t) = timeout {
        req = req.header("grpc-timeout", t);
    }
    let started = Instant::now();
    let mut c = client.ready().await.unwrap();
    let (resp, mut send) = c.send_request(req.body(()).unwrap(), false).unwrap();
    send.send_data(Bytes::copy_from_slice(body), true).unwrap();
    let resp = resp.await.unwrap();
    let (parts, mut rbody) = resp.into_parts();
    let head_ended = rbody.is_end_stream();
    let mut data = Vec::new();
    while let Some(chunk) = rbody.data().await {
        let chunk = chunk.unwrap();
        let _ = rbody.flow_control().release_capacity(chunk.len());
        data.extend_from_slice(&chunk);
    }
    let trailers = rbody.trailers().await.unwrap();
    (
        parts.status.as_u16(),
        parts.headers,
        data,
        trailers,
        started.elapsed(),
        head_ended,
    )
}

/// More fields than an HTTP/1.1 upstream's head may have: 502 to every client (an HTTP/2
/// client's stream was reset instead).
#[test]
fn an_h2_upstream_head_with_too_many_fields_is_a_bad_gateway() {
    let origin = h2_origin();
    let proxy = proxy_to_h2(origin);
    rt().block_on(async {
        let mut client = h2c_client(proxy.addr).await.ready().await.unwrap();
        let req = http::Request::get("http://svc.test/many-fields")
            .body(())
            .unwrap();
        let (resp, _) = client.send_request(req, true).unwrap();
        let resp = resp.await.expect("a response, not a reset");
        assert_eq!(resp.status(), 502);
    });
    let r = proxy.connect().get("/many-fields");
    assert_eq!(
        (r.status, r.error_code().as_deref()),
        (502, Some("upstream_invalid_response"))
    );
}

#[test]
fn a_calls_trailers_survive_a_response_with_a_length() {
    let origin = h2_origin();
    let proxy = proxy_to_h2(origin);
    rt().block_on(async {
        let msg = frame(b"hello");
        let (status, _, data, trailers, _, _) =
            call(proxy.addr, "/echo.Svc/UnaryWithLength", &msg, None).await;
        assert_eq!(status, 200);
        assert_eq!(data, msg);
        let trailers = trailers.expect("trailers");
        assert_eq!(trailers.get("grpc-status").unwrap(), "0");
    });
}

#[test]
fn unary_and_streaming_calls_keep_their_trailers() {
    let origin = h2_origin();
    let proxy = proxy_to_h2(origin);
    rt().block_on(async {
        let msg = frame(b"hello");
        let (status, headers, data, trailers, _, _) =
            call(proxy.addr, "/echo.Svc/Unary", &msg, Some("5S")).await;
        assert_eq!(status, 200);
        assert_eq!(headers["content-type"], "application/grpc");
        assert_eq!(
            headers["x-te"], "trailers",
            "TE: trailers reaches the server"
        );
        // The time left of the call's 5 s, in milliseconds.
        let left = headers["x-grpc-timeout"].to_str().unwrap();
        let ms: u64 = left.strip_suffix('m').unwrap().parse().unwrap();
        assert!((4000..=5000).contains(&ms), "{left}");
        assert_eq!(data, msg);
        let t = trailers.expect("trailers");
        assert_eq!(
            (
                t["grpc-status"].to_str().unwrap(),
                t["grpc-message"].to_str().unwrap()
            ),
            ("0", "ok")
        );

        let (status, _, data, trailers, elapsed, _) =
            call(proxy.addr, "/echo.Svc/Stream", &[], None).await;
        assert_eq!(status, 200);
        let expected: Vec<u8> = (0..3)
            .flat_map(|i| frame(format!("msg {i}").as_bytes()))
            .collect();
        assert_eq!(data, expected);
        assert_eq!(trailers.unwrap()["grpc-status"], "0");
        assert!(elapsed >= Duration::from_millis(100));
    });
}

#[test]
fn grpc_deadline_and_gateway_errors_are_trailers_only() {
    let origin = h2_origin();
    let proxy = proxy_to_h2(origin);
    rt().block_on(async {
        let (status, headers, data, trailers, elapsed, _) =
            call(proxy.addr, "/echo.Svc/Slow", &frame(b"x"), Some("200m")).await;
        assert_eq!(status, 200);
        // The server sent its headers at once and then nothing: the deadline ends the call
        // with DEADLINE_EXCEEDED in the trailers.
        let t = trailers.expect("trailers");
        assert_eq!(
            t["grpc-status"], "4",
            "DEADLINE_EXCEEDED: {headers:?} {t:?}"
        );
        assert!(data.is_empty());
        assert!(elapsed < Duration::from_millis(1500), "{elapsed:?}");
        // Nothing at all before the deadline: a trailers-only DEADLINE_EXCEEDED.
        let (status, headers, data, trailers, elapsed, head_ended) =
            call(proxy.addr, "/echo.Svc/SlowHead", &frame(b"x"), Some("200m")).await;
        assert_eq!(
            (status, headers["grpc-status"].to_str().unwrap()),
            (200, "4")
        );
        assert!(data.is_empty() && trailers.is_none(), "trailers-only");
        // gRPC clients read the status only from a HEADERS frame that ends the stream.
        assert!(head_ended, "END_STREAM on the trailers-only HEADERS");
        assert!(elapsed < Duration::from_millis(1500), "{elapsed:?}");
    });
    // No upstream at all: UNAVAILABLE, not a JSON envelope.
    let proxy = proxy_to_h2(closed_port());
    rt().block_on(async {
        let (status, headers, data, _, _, head_ended) =
            call(proxy.addr, "/echo.Svc/Unary", &frame(b"x"), None).await;
        assert_eq!(
            (status, headers["grpc-status"].to_str().unwrap()),
            (200, "14")
        );
        assert_eq!(headers["content-type"], "application/grpc");
        assert!(data.is_empty() && head_ended, "trailers-only");
    });
}

#[test]
fn the_upstream_is_told_the_time_left_of_its_attempt() {
    // A try timeout shorter than the call's own: the upstream hears of the try's.
    let proxy = proxy_to_h2_with(h2_origin(), "retries = { per_try_timeout = \"1s\" }");
    rt().block_on(async {
        let (status, headers, ..) =
            call(proxy.addr, "/echo.Svc/Unary", &frame(b"x"), Some("10S")).await;
        assert_eq!(status, 200);
        let left = headers["x-grpc-timeout"].to_str().unwrap();
        let ms: u64 = left.strip_suffix('m').unwrap().parse().unwrap();
        assert!((500..=1000).contains(&ms), "{left}");
        // Without a grpc-timeout of its own, the call gets none.
        let (_, headers, ..) = call(proxy.addr, "/echo.Svc/Unary", &frame(b"x"), None).await;
        assert_eq!(headers["x-grpc-timeout"], "");
    });
}

#[test]
fn a_calls_whole_deadline_reaches_the_upstream_past_the_response_timeout() {
    // `response_timeout` bounds only the wait for the response head, which a streaming call
    // gets long before it ends: a call with a minute to live is told so, not the second of
    // the head's wait (the upstream would end it then).
    let proxy = proxy_to_h2_with(h2_origin(), "response_timeout = \"1s\"");
    rt().block_on(async {
        let (status, headers, ..) =
            call(proxy.addr, "/echo.Svc/Unary", &frame(b"x"), Some("60S")).await;
        assert_eq!(status, 200);
        let left = headers["x-grpc-timeout"].to_str().unwrap();
        let ms: u64 = left.strip_suffix('m').unwrap().parse().unwrap();
        assert!((55_000..=60_000).contains(&ms), "{left}");
    });
}

#[test]
fn a_short_grpc_deadline_is_never_cut_short() {
    // The deadline counts from when the call came, by the clock: not from the worker's last
    // tick (up to 25 ms before), which would end a 50 ms call after 25.
    let proxy = proxy_to_h2(h2_origin());
    rt().block_on(async {
        for i in 0..12 {
            let (status, headers, .., elapsed, _) =
                call(proxy.addr, "/echo.Svc/SlowHead", &frame(b"x"), Some("50m")).await;
            let code = headers["grpc-status"].to_str().unwrap();
            assert_eq!((status, code), (200, "4"), "call {i}");
            assert!(
                elapsed >= Duration::from_millis(50),
                "call {i}: {elapsed:?}"
            );
            // Calls come at different points of the worker's tick.
            tokio::time::sleep(Duration::from_millis(7)).await;
        }
    });
}

#[test]
fn a_maintenance_message_reaches_a_grpc_client_percent_encoded() {
    let origin = h2_origin();
    let proxy = Proxy::start(&format!(
        "workers = 1\n[[upstreams]]\nname = \"up\"\nprotocol = \"h2c\"\nendpoints = [\"{origin}\"]\n\
         [[routes]]\npath_prefix = \"/\"\nproxy = \"up\"\n\
         maintenance = {{ message = \"zur\u{fc}ck um 14:00, 100%\", retry_after = \"60s\" }}\n"
    ));
    rt().block_on(async {
        let (status, headers, ..) = call(proxy.addr, "/echo.Svc/Unary", &frame(b"x"), None).await;
        assert_eq!(status, 200);
        assert_eq!(headers["grpc-status"], "14");
        assert_eq!(headers["grpc-message"], "zur%C3%BCck um 14:00, 100%25");
    });
}

#[test]
fn calls_ended_by_their_own_deadline_do_not_count_against_the_upstream() {
    let origin = h2_origin();
    // Two failures in a row would open the circuit.
    let proxy = Proxy::start(&format!(
        "workers = 1\n[[upstreams]]\nname = \"grpc\"\nprotocol = \"h2c\"\nendpoints = [\"{origin}\"]\n\
         breaker = {{ failure_threshold = 2 }}\n[[routes]]\npath_prefix = \"/\"\nproxy = \"grpc\"\n"
    ));
    rt().block_on(async {
        // Deadlines the calls' clients chose pass before the head, and after it.
        for path in ["/echo.Svc/SlowHead", "/echo.Svc/Slow"] {
            for _ in 0..3 {
                let (status, headers, _, trailers, _, _) =
                    call(proxy.addr, path, &frame(b"x"), Some("100m")).await;
                let grpc_status = trailers
                    .as_ref()
                    .and_then(|t| t.get("grpc-status"))
                    .or(headers.get("grpc-status"))
                    .map(|v| v.to_str().unwrap().to_string());
                assert_eq!((status, grpc_status.as_deref()), (200, Some("4")), "{path}");
            }
        }
        // The circuit stayed closed: the upstream did nothing wrong.
        let (status, _, _, trailers, _, _) =
            call(proxy.addr, "/echo.Svc/Unary", &frame(b"hi"), None).await;
        assert_eq!(status, 200);
        assert_eq!(trailers.expect("trailers")["grpc-status"], "0");
    });
}

#[test]
fn a_client_cancelling_a_bidirectional_call_does_not_count_against_the_upstream() {
    let origin = h2_origin();
    // Two failures in a row would open the circuit.
    let proxy = Proxy::start(&format!(
        "workers = 1\n[[upstreams]]\nname = \"grpc\"\nprotocol = \"h2c\"\nendpoints = [\"{origin}\"]\n\
         breaker = {{ failure_threshold = 2 }}\n[[routes]]\npath_prefix = \"/\"\nproxy = \"grpc\"\n"
    ));
    rt().block_on(async {
        for _ in 0..3 {
            // The response has begun while the request still streams; then the caller goes.
            let client = h2c_client(proxy.addr).await;
            let req = http::Request::builder()
                .method("POST")
                .uri("http://svc.test/bidi.Svc/Hold")
                .header("content-type", "application/grpc")
                .header("te", "trailers")
                .body(())
                .unwrap();
            let (resp, mut send) = client
                .ready()
                .await
                .unwrap()
                .send_request(req, false)
                .unwrap();
            send.send_data(Bytes::from(frame(b"x")), false).unwrap();
            assert_eq!(resp.await.unwrap().status(), 200);
            send.send_reset(h2::Reason::CANCEL);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let (status, _, _, trailers, _, _) =
            call(proxy.addr, "/echo.Svc/Unary", &frame(b"hi"), None).await;
        assert_eq!(status, 200);
        assert_eq!(
            trailers.expect("trailers")["grpc-status"],
            "0",
            "the circuit opened"
        );
    });
    assert_no_upstream_failures(proxy.addr);
}

#[test]
fn an_h2_clients_reset_while_a_quiet_response_streams_reaches_the_upstream_at_once() {
    // The origin sends a head and one DATA frame, then nothing: it reports when the stream
    // is reset.
    let (tx, rx) = std::sync::mpsc::channel::<Duration>();
    let tx = std::sync::Arc::new(std::sync::Mutex::new(tx));
    let origin = tokio_server(move |tcp| {
        let tx = tx.clone();
        async move {
            let Ok(mut conn) = h2::server::handshake(tcp).await else {
                return;
            };
            while let Some(Ok((_req, mut respond))) = conn.accept().await {
                let tx = tx.clone();
                tokio::spawn(async move {
                    let resp = http::Response::builder().status(200).body(()).unwrap();
                    let Ok(mut send) = respond.send_response(resp, false) else {
                        return;
                    };
                    let _ = send.send_data(Bytes::from_static(b"first"), false);
                    let sent = Instant::now();
                    let _ = std::future::poll_fn(|cx| send.poll_reset(cx)).await;
                    let _ = tx.lock().unwrap().send(sent.elapsed());
                });
            }
        }
    });
    let proxy = proxy_to_h2_with(origin, "read_timeout = \"5s\"");
    rt().block_on(async {
        let client = h2c_client(proxy.addr).await;
        let req = http::Request::builder()
            .uri("http://svc.test/quiet")
            .body(())
            .unwrap();
        let (resp, mut send) = client
            .ready()
            .await
            .unwrap()
            .send_request(req, true)
            .unwrap();
        let mut body = resp.await.unwrap().into_body();
        assert_eq!(&body.data().await.unwrap().unwrap()[..], b"first");
        send.send_reset(h2::Reason::CANCEL);
        tokio::time::sleep(Duration::from_millis(50)).await;
    });
    let after = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the upstream stream was reset");
    assert!(
        after < Duration::from_secs(1),
        "reset reached the upstream after {after:?}"
    );
    assert_no_upstream_failures(proxy.addr);
}

#[test]
fn http1_clients_reach_an_h2_upstream_with_trailers_in_chunked_form() {
    let origin = h2_origin();
    let proxy = proxy_to_h2(origin);
    let mut c = proxy.connect();
    let r = c.get("/plain");
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), "plain GET 0");
    // A body up, trailers down (chunked, for an HTTP/1.1 client).
    let mut s = std::net::TcpStream::connect(proxy.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(
        b"POST /plain HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
    )
    .unwrap();
    let mut all = Vec::new();
    s.read_to_end(&mut all).unwrap();
    let text = String::from_utf8_lossy(&all).to_ascii_lowercase();
    assert!(text.starts_with("http/1.1 200"), "{text}");
    assert!(text.contains("transfer-encoding: chunked\r\n"), "{text}");
    assert!(text.contains("plain post 5"), "{text}");
    assert!(text.ends_with("0\r\nx-done: yes\r\n\r\n"), "{text}");
    assert!(!text.contains("content-length: 99"), "{text}");
    assert!(!text.contains("elsewhere"), "{text}");
    // Keep-alive over several requests on one HTTP/2 connection upstream.
    for _ in 0..20 {
        assert_eq!(c.get("/plain").status, 200);
    }
    let m = metrics(proxy.addr);
    assert_eq!(
        m["ringway_upstream_pool_misses_total{upstream=\"grpc\"}"], 1.0,
        "{m:?}"
    );
}

#[test]
fn a_content_length_list_reaches_an_h2_upstream_as_one_value() {
    // `5, 5` frames an HTTP/1.1 body; in HTTP/2 it is malformed, and an upstream resetting
    // the stream for it would count against a healthy endpoint.
    let proxy = proxy_to_h2(h2_origin());
    for length in ["5, 5", "5\r\nContent-Length: 5"] {
        let mut c = proxy.connect();
        c.send(
            format!("POST /plain HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\nhello")
                .as_bytes(),
        );
        let r = c.read_response(false).unwrap();
        assert_eq!(r.status, 200, "{length:?}: {}", r.text());
        assert_eq!(r.text(), "plain POST 5");
    }
    assert_no_upstream_failures(proxy.addr);
}

#[test]
fn expect_100_continue_is_answered_before_a_body_goes_to_an_h2_upstream() {
    let origin = h2_origin();
    let proxy = proxy_to_h2(origin);
    let mut s = std::net::TcpStream::connect(proxy.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(
        b"POST /plain HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\
          Connection: close\r\n\r\n",
    )
    .unwrap();
    // The client waits for the interim answer before it sends its body.
    let mut interim = [0u8; 25];
    s.read_exact(&mut interim).unwrap();
    assert_eq!(&interim, b"HTTP/1.1 100 Continue\r\n\r\n");
    s.write_all(b"hello").unwrap();
    let mut all = Vec::new();
    s.read_to_end(&mut all).unwrap();
    let text = String::from_utf8_lossy(&all);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.contains("plain POST 5"), "{text}");
}

#[test]
fn an_h2_upstream_connection_told_to_go_away_takes_no_new_stream() {
    // Each connection: its first stream is answered after 1.5 s, and at once the connection
    // is told to go away (GOAWAY); later streams on it are refused by the h2 crate.
    let conns = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = conns.clone();
    let origin = tokio_server(move |tcp| {
        seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        async move {
            let Ok(mut conn) = h2::server::handshake(tcp).await else {
                return;
            };
            let mut first = true;
            while let Some(Ok((req, mut respond))) = conn.accept().await {
                let slow = std::mem::take(&mut first);
                if slow {
                    conn.graceful_shutdown();
                }
                tokio::spawn(async move {
                    if slow {
                        tokio::time::sleep(Duration::from_millis(1500)).await;
                    }
                    let _ = req;
                    let resp = http::Response::builder().status(200).body(()).unwrap();
                    if let Ok(mut send) = respond.send_response(resp, false) {
                        let _ = send.send_data(Bytes::from_static(b"done"), true);
                    }
                });
            }
        }
    });
    let proxy = proxy_to_h2(origin);
    let slow = {
        let addr = proxy.addr;
        std::thread::spawn(move || Client::connect(addr).get("/first"))
    };
    assert!(wait_until(Duration::from_secs(3), || conns
        .load(std::sync::atomic::Ordering::SeqCst)
        == 1));
    std::thread::sleep(Duration::from_millis(300)); // the GOAWAY has arrived
                                                    // A second request meanwhile goes to a fresh connection, not to the draining one.
    let r = proxy.connect().get("/second");
    assert_eq!((r.status, r.text().as_str()), (200, "done"));
    assert_eq!(conns.load(std::sync::atomic::Ordering::SeqCst), 2);
    let r = slow.join().unwrap();
    assert_eq!(r.status, 200, "the stream in flight ends normally");
}

/// Bytes of `/big` responses sent so far.
static BIG_SENT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// An h2c origin: `/big` streams 64 MiB (as the window allows), anything else is "small".
async fn serve_big_or_small(
    req: http::Request<h2::RecvStream>,
    mut respond: h2::server::SendResponse<Bytes>,
) {
    let resp = http::Response::builder().status(200).body(()).unwrap();
    let Ok(mut send) = respond.send_response(resp, false) else {
        return;
    };
    if req.uri().path() != "/big" {
        let _ = send.send_data(Bytes::from_static(b"small"), true);
        return;
    }
    let chunk = Bytes::from(vec![b'x'; 64 * 1024]);
    for _ in 0..1024 {
        send.reserve_capacity(chunk.len());
        let mut left = chunk.clone();
        while !left.is_empty() {
            match std::future::poll_fn(|cx| send.poll_capacity(cx)).await {
                Some(Ok(n)) if n > 0 => {
                    let piece = left.split_to(n.min(left.len()));
                    BIG_SENT.fetch_add(piece.len(), std::sync::atomic::Ordering::SeqCst);
                    if send.send_data(piece, false).is_err() {
                        return;
                    }
                }
                Some(Ok(_)) => {}
                _ => return,
            }
        }
    }
    let _ = send.send_data(Bytes::new(), true);
}

#[test]
fn a_client_that_stops_reading_does_not_stall_other_streams_of_its_upstream_connection() {
    let origin = tokio_server(|tcp| async move {
        let Ok(mut conn) = h2::server::handshake(tcp).await else {
            return;
        };
        while let Some(Ok((req, respond))) = conn.accept().await {
            tokio::spawn(serve_big_or_small(req, respond));
        }
    });
    // One connection: both requests share it.
    let proxy = Proxy::start(&format!(
        "workers = 1\n[[upstreams]]\nname = \"up\"\nprotocol = \"h2c\"\nh2_connections = 1\n\
         endpoints = [\"{origin}\"]\n[[routes]]\npath_prefix = \"/\"\nproxy = \"up\"\n"
    ));
    // A asks for 64 MiB and reads none of it: once the sockets' buffers are full, what its
    // stream was granted sits in ringway, and the origin stops (no window).
    let mut a = Client::connect(proxy.addr);
    a.send(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n");
    let load = || BIG_SENT.load(std::sync::atomic::Ordering::SeqCst);
    let give_up = Instant::now() + Duration::from_secs(20);
    let mut last = 0;
    loop {
        std::thread::sleep(Duration::from_millis(300));
        let now = load();
        if now > 0 && now == last || Instant::now() > give_up {
            break;
        }
        last = now;
    }
    assert!(load() < 64 << 20, "A's response stalled before its end");
    // B's response on the same upstream connection still flows.
    let started = Instant::now();
    let mut b = Client::connect(proxy.addr);
    b.stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let r = b.get("/small");
    assert_eq!((r.status, r.text().as_str()), (200, "small"));
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    drop(a);
}

/// An h2c origin whose first connection answers one request and then goes silent (reads
/// nothing, answers no PING) while staying open, like a peer behind a middlebox that dropped
/// the flow; later connections serve normally. Counts connections.
fn origin_going_silent() -> (SocketAddr, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let conns = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = conns.clone();
    let addr = tokio_server(move |tcp| {
        let n = seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        async move {
            let Ok(mut conn) = h2::server::handshake(tcp).await else {
                return;
            };
            if n == 0 {
                if let Some(Ok((req, respond))) = conn.accept().await {
                    tokio::spawn(serve_big_or_small(req, respond));
                }
                // Long enough to flush the answer, then never polled again.
                let _ = tokio::time::timeout(Duration::from_millis(100), conn.accept()).await;
                std::future::pending::<()>().await;
            }
            while let Some(Ok((req, respond))) = conn.accept().await {
                tokio::spawn(serve_big_or_small(req, respond));
            }
        }
    });
    (addr, conns)
}

fn proxy_to_h2_with(origin: SocketAddr, keys: &str) -> Proxy {
    Proxy::start(&format!(
        "workers = 1\n[[upstreams]]\nname = \"up\"\nprotocol = \"h2c\"\nh2_connections = 1\n\
         {keys}\nendpoints = [\"{origin}\"]\n[[routes]]\npath_prefix = \"/\"\nproxy = \"up\"\n"
    ))
}

#[test]
fn the_total_timeout_toward_an_h2_upstream_runs_from_the_end_of_a_buffered_body() {
    let proxy = proxy_to_h2_with(
        h2_origin(),
        "retries = { attempts = 2, buffer_max_bytes = 1024, total_timeout = \"300ms\" }",
    );
    let mut c = Client::connect(proxy.addr);
    c.send(b"PUT /u HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhe");
    std::thread::sleep(Duration::from_millis(600));
    c.send(b"llo");
    let r = c.read_response(false).expect("a response");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_no_upstream_failures(proxy.addr);
}

#[test]
fn an_idle_h2_connection_on_one_worker_does_not_shut_out_the_others() {
    // One connection allowed across two workers, kept for a minute without a stream: each
    // request comes on a new client connection, so both workers serve some, and the worker
    // holding the connection gives it up for a request waiting on the other.
    let proxy = Proxy::start(&format!(
        "workers = 2\n[[upstreams]]\nname = \"up\"\nprotocol = \"h2c\"\nendpoints = [\"{}\"]\n\
         max_connections = 1\nconnect_timeout = \"3s\"\npool_idle_timeout = \"60s\"\n\
         [[routes]]\npath_prefix = \"/\"\nproxy = \"up\"\n",
        h2_origin()
    ));
    for i in 0..20 {
        let started = Instant::now();
        let r = Client::connect(proxy.addr).get("/");
        assert_eq!(r.status, 200, "request {i}: {}", r.text());
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "request {i} waited {:?}",
            started.elapsed()
        );
    }
}

/// The silent origin's first connection answers `/a`, then `timeout` times a request out on
/// it; the PING that follows goes unanswered, so the connection is closed, and the next
/// request goes to a new one.
fn a_silent_connection_is_replaced_after(
    keys: &str,
    timeout: impl FnOnce(SocketAddr, &mut Client),
) {
    let (origin, conns) = origin_going_silent();
    let proxy = proxy_to_h2_with(origin, keys);
    let mut c = Client::connect(proxy.addr);
    assert_eq!(c.get("/a").status, 200);
    timeout(proxy.addr, &mut c);
    std::thread::sleep(Duration::from_millis(800));
    c.stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let r = c.get("/c");
    assert_eq!((r.status, r.text().as_str()), (200, "small"));
    assert_eq!(conns.load(std::sync::atomic::Ordering::SeqCst), 2);
}

#[test]
fn an_upstream_connection_silent_after_a_timeout_is_replaced() {
    a_silent_connection_is_replaced_after(
        "response_timeout = \"1s\"\nconnect_timeout = \"500ms\"",
        |_, c| assert_eq!(c.get("/b").status, 504),
    );
}

#[test]
fn a_call_whose_own_deadline_passes_on_a_silent_connection_gets_it_replaced() {
    // A gRPC call's deadline (shorter than the response timeout) passes on the silent
    // connection: that is the client's doing, but the connection must still answer a PING,
    // or calls with short deadlines would keep a dead one in the pool.
    a_silent_connection_is_replaced_after(
        "response_timeout = \"10s\"\nconnect_timeout = \"500ms\"",
        |addr, _| {
            let (status, headers, ..) =
                rt().block_on(call(addr, "/echo.Svc/Unary", &frame(b"x"), Some("300m")));
            assert_eq!(status, 200);
            assert_eq!(
                headers["grpc-status"], "4",
                "DEADLINE_EXCEEDED: {headers:?}"
            );
        },
    );
}

#[test]
fn with_keepalive_a_silent_upstream_connection_is_dropped_while_a_request_waits() {
    let (origin, conns) = origin_going_silent();
    let proxy = proxy_to_h2_with(
        origin,
        "h2_keepalive = \"300ms\"\nresponse_timeout = \"5s\"",
    );
    let mut c = Client::connect(proxy.addr);
    assert_eq!(c.get("/a").status, 200);
    std::thread::sleep(Duration::from_millis(200));
    // The PING sent while the request waits goes unanswered: the connection is closed, and
    // the request (refused before any response, and replayable) goes to a new one.
    let started = Instant::now();
    let r = c.get("/b");
    assert_eq!((r.status, r.text().as_str()), (200, "small"));
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(conns.load(std::sync::atomic::Ordering::SeqCst), 2);
}

#[test]
fn a_stream_the_upstream_refused_unprocessed_is_sent_again_even_for_post() {
    // The first stream is refused (REFUSED_STREAM: not processed, RFC 9113 §8.7).
    let (origin, streams) = origin_resetting(|n| (n == 0).then_some(h2::Reason::REFUSED_STREAM));
    let proxy = proxy_to_h2_with(origin, "");
    let mut c = Client::connect(proxy.addr);
    c.send(b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n");
    let r = c.read_response(false).expect("a response");
    assert_eq!((r.status, r.text().as_str()), (200, "small"));
    assert_eq!(streams.load(std::sync::atomic::Ordering::SeqCst), 2);
    // Nothing was held against the endpoint.
    assert_eq!(
        metric_sum(proxy.addr, "ringway_upstream_failures_total"),
        0.0
    );
}

/// An h2c origin that resets the `n`th stream it gets (counted over all its connections)
/// with `reset(n)` when that says so, and serves the others (`serve_big_or_small`); the
/// count of streams it got.
fn origin_resetting(
    reset: fn(usize) -> Option<h2::Reason>,
) -> (SocketAddr, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let streams = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = streams.clone();
    let addr = tokio_server(move |tcp| {
        let seen = seen.clone();
        async move {
            let Ok(mut conn) = h2::server::handshake(tcp).await else {
                return;
            };
            while let Some(Ok((req, mut respond))) = conn.accept().await {
                match reset(seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst)) {
                    Some(reason) => respond.send_reset(reason),
                    None => {
                        tokio::spawn(serve_big_or_small(req, respond));
                    }
                }
            }
        }
    });
    (addr, streams)
}

/// An h2c origin taking one stream at a time (MAX_CONCURRENT_STREAMS 1), each served by
/// `serve` on a task of its own.
fn one_stream_origin<F, Fut>(serve: F) -> SocketAddr
where
    F: Fn(http::Request<h2::RecvStream>, h2::server::SendResponse<Bytes>) -> Fut
        + Clone
        + Send
        + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    tokio_server(move |tcp| {
        let serve = serve.clone();
        async move {
            let Ok(mut conn) = h2::server::Builder::new()
                .max_concurrent_streams(1)
                .handshake::<_, Bytes>(tcp)
                .await
            else {
                return;
            };
            while let Some(Ok((req, respond))) = conn.accept().await {
                tokio::spawn(serve(req, respond));
            }
        }
    })
}

/// An h2c origin taking one stream at a time: `/hold` gets its head at once and the end of
/// its body 4 s later (a watch, say); anything else is `serve_big_or_small`.
fn holding_origin() -> SocketAddr {
    one_stream_origin(|req, mut respond| async move {
        if req.uri().path() != "/hold" {
            return serve_big_or_small(req, respond).await;
        }
        let resp = http::Response::builder().status(200).body(()).unwrap();
        let Ok(mut send) = respond.send_response(resp, false) else {
            return;
        };
        tokio::time::sleep(Duration::from_secs(4)).await;
        let _ = send.send_data(Bytes::from_static(b"held"), true);
    })
}

#[test]
fn requests_queued_behind_long_streams_time_out_without_blaming_the_upstream() {
    // The origin takes one stream at a time and holds the first (a watch, say); requests
    // queued behind it never reach it. Their timeouts are no failures of the upstream's:
    // before, two of them in a row had it ejected, healthy as it was.
    let origin = holding_origin();
    let proxy = proxy_to_h2_with(
        origin,
        "response_timeout = \"300ms\"\noutlier = { consecutive_failures = 2 }",
    );
    let mut a = Client::connect(proxy.addr);
    a.send(b"GET /hold HTTP/1.1\r\nHost: x\r\n\r\n");
    std::thread::sleep(Duration::from_millis(300));
    for request in [
        &b"GET /q1 HTTP/1.1\r\nHost: x\r\n\r\n"[..],
        b"PUT /q2 HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello",
        b"GET /q3 HTTP/1.1\r\nHost: x\r\n\r\n",
    ] {
        let mut c = Client::connect(proxy.addr);
        c.send(request);
        let r = c.read_response(false).expect("an answer");
        assert_eq!(r.status, 504);
    }
    assert_no_upstream_failures(proxy.addr);
    let ejections: f64 = metrics(proxy.addr)
        .iter()
        .filter(|(k, _)| k.starts_with("ringway_endpoint_ejections"))
        .map(|(_, v)| v)
        .sum();
    assert_eq!(ejections, 0.0);
}

#[test]
fn a_body_waiting_for_a_stream_slot_counts_against_the_response_timeout() {
    // The origin takes one stream at a time; `/hold` is held for 4 s.
    let origin = holding_origin();
    let proxy = proxy_to_h2_with(origin, "response_timeout = \"1s\"");
    let mut a = Client::connect(proxy.addr);
    a.send(b"GET /hold HTTP/1.1\r\nHost: x\r\n\r\n");
    std::thread::sleep(Duration::from_millis(300));
    // The PUT's stream is queued behind the held one: it fails by its response timeout (1 s),
    // not when the held stream ends (or after the send timeout its body writes would allow).
    let started = Instant::now();
    let mut b = Client::connect(proxy.addr);
    b.stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    b.send(b"PUT /x HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello");
    let r = b.read_response(false).expect("an answer in time");
    assert_eq!(r.status, 504);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn a_hash_key_whose_http2_endpoint_is_saturated_goes_to_one_with_room() {
    // Two origins taking one stream at a time, each held 500 ms; one connection to each,
    // so each has room for two streams (one open, one queued on it).
    let slow = |req, respond| async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        serve_big_or_small(req, respond).await
    };
    let (a, b) = (one_stream_origin(slow), one_stream_origin(slow));
    let proxy = Proxy::start(&format!(
        "workers = 1\n[[upstreams]]\nname = \"up\"\nprotocol = \"h2c\"\nh2_connections = 1\n\
         connect_timeout = \"200ms\"\n\
         balancer = {{ type = \"consistent_hash\", header = \"x-user\" }}\n\
         endpoints = [\"{a}\", \"{b}\"]\n[[routes]]\npath_prefix = \"/\"\nproxy = \"up\"\n"
    ));
    // Four requests of one key at once: its endpoint takes two, the other the rest (a
    // saturated endpoint is passed over, as an HTTP/1.1 one at its connection cap is),
    // instead of the rest waiting for it past the connect timeout (503).
    let calls: Vec<_> = (0..4)
        .map(|i| {
            let addr = proxy.addr;
            std::thread::sleep(Duration::from_millis(if i == 0 { 0 } else { 30 }));
            std::thread::spawn(move || {
                let mut c = Client::connect(addr);
                c.send(b"GET /x HTTP/1.1\r\nHost: x\r\nx-user: alice\r\n\r\n");
                c.read_response(false).map(|r| r.status)
            })
        })
        .collect();
    let statuses: Vec<_> = calls.into_iter().map(|c| c.join().unwrap()).collect();
    assert_eq!(statuses, vec![Some(200); 4]);
    // Each request was counted on one endpoint, once.
    let sent = metric_sum(proxy.addr, "ringway_endpoint_requests_total");
    assert_eq!(sent, 4.0);
}

#[test]
fn forwarded_for_named_in_connection_does_not_reach_an_http2_upstream() {
    // The origin answers with the x-forwarded-for it got.
    let origin = tokio_server(|tcp| async move {
        let Ok(mut conn) = h2::server::handshake(tcp).await else {
            return;
        };
        while let Some(Ok((req, mut respond))) = conn.accept().await {
            let xff = req.headers().get("x-forwarded-for").cloned();
            let mut resp = http::Response::builder().status(200);
            if let Some(v) = xff {
                resp = resp.header("x-seen-xff", v);
            }
            let _ = respond.send_response(resp.body(()).unwrap(), true);
        }
    });
    let proxy = Proxy::start(&format!(
        "workers = 1\n[gateway]\ntrusted_proxies = [\"127.0.0.1\"]\n\
         [[upstreams]]\nname = \"up\"\nprotocol = \"h2c\"\nendpoints = [\"{origin}\"]\n\
         [[routes]]\npath_prefix = \"/\"\nproxy = \"up\"\n"
    ));
    let mut c = Client::connect(proxy.addr);
    c.send(b"GET / HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: 1.2.3.4\r\n\r\n");
    let r = c.read_response(false).unwrap();
    assert_eq!(r.header("x-seen-xff"), Some("1.2.3.4, 127.0.0.1"));
    c.send(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: X-Forwarded-For\r\nX-Forwarded-For: 1.2.3.4\r\n\r\n");
    let r = c.read_response(false).unwrap();
    assert_eq!(r.header("x-seen-xff"), Some("127.0.0.1"));
}

#[test]
fn a_one_byte_body_reaches_an_http2_upstream_at_once() {
    // The first DATA piece of a stream is exactly the byte of window its opening reserved.
    let proxy = proxy_to_h2(h2_origin());
    for body in ["x", "xy"] {
        let started = Instant::now();
        let mut c = Client::connect(proxy.addr);
        c.stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        c.send(
            format!(
                "POST /plain HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        );
        let r = c.read_response(false).expect("an answer in time");
        assert_eq!(r.status, 200, "{body}");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
    }
}

#[test]
fn requests_waiting_for_a_stream_spend_no_rate_limit_tokens() {
    // One stream at a time; `/slow` holds it for 300 ms.
    let origin = one_stream_origin(|req, respond| async move {
        if req.uri().path() == "/slow" {
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        serve_big_or_small(req, respond).await
    });
    // Ten tokens at once, then two a second.
    let proxy = proxy_to_h2_with(origin, "rate_limit = { max_rps = 2, burst = 9 }");
    let slow: Vec<_> = (0..4)
        .map(|_| {
            let addr = proxy.addr;
            std::thread::spawn(move || Client::connect(addr).get("/slow").status)
        })
        .collect();
    for s in slow {
        assert_eq!(s.join().unwrap(), 200);
    }
    // Four requests spent four tokens, however long they waited for the stream.
    let started = Instant::now();
    let mut c = proxy.connect();
    for _ in 0..5 {
        assert_eq!(c.get("/fast").status, 200);
    }
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "{:?}: the bucket was spent by waiting requests",
        started.elapsed()
    );
}

#[test]
fn a_grpc_call_refused_before_its_head_is_parsed_gets_a_grpc_status() {
    let proxy = proxy_to_h2(h2_origin());
    rt().block_on(async {
        let client = h2c_client(proxy.addr).await;
        // More metadata entries than `http.max_headers` (100), small enough for HTTP/2.
        let mut req = http::Request::builder()
            .method("POST")
            .uri("http://svc.test/echo.Svc/Unary")
            .header("content-type", "application/grpc")
            .header("te", "trailers");
        for i in 0..120 {
            req = req.header(format!("x-m-{i}"), "1");
        }
        let mut c = client.ready().await.unwrap();
        let (resp, mut send) = c.send_request(req.body(()).unwrap(), false).unwrap();
        let _ = send.send_data(Bytes::from(frame(b"x")), true);
        let resp = resp.await.unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.headers()["content-type"], "application/grpc");
        assert_eq!(
            resp.headers()["grpc-status"],
            "8",
            "RESOURCE_EXHAUSTED: {:?}",
            resp.headers()
        );
        assert!(resp.body().is_end_stream(), "trailers-only");
    });
}

/// A gRPC stream ringway refuses itself before the proxy path (here a CONNECT) gets a gRPC
/// status too; gRPC-Web (its trailers travel in the body) is plain HTTP and gets the JSON
/// envelope.
#[test]
fn a_refused_grpc_stream_gets_a_grpc_status_and_grpc_web_the_envelope() {
    let proxy = proxy_to_h2(closed_port());
    rt().block_on(async {
        let client = h2c_client(proxy.addr).await;
        let req = http::Request::builder()
            .method("CONNECT")
            .uri("svc.test:443")
            .header("content-type", "application/grpc+proto")
            .body(())
            .unwrap();
        let mut c = client.clone().ready().await.unwrap();
        let (resp, _) = c.send_request(req, true).unwrap();
        let resp = resp.await.unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.headers()["content-type"], "application/grpc");
        assert_eq!(resp.headers()["grpc-status"], "13", "{:?}", resp.headers());
        assert!(resp.body().is_end_stream(), "trailers-only");

        let req = http::Request::builder()
            .method("POST")
            .uri("http://svc.test/echo.Svc/Unary")
            .header("content-type", "application/grpc-web+proto")
            .body(())
            .unwrap();
        let mut c = client.ready().await.unwrap();
        let (resp, _) = c.send_request(req, true).unwrap();
        let resp = resp.await.unwrap();
        assert_eq!(resp.status(), 502);
        assert_eq!(resp.headers()["content-type"], "application/json");
        assert!(resp.headers().get("grpc-status").is_none());
    });
}

#[test]
fn the_free_resend_of_a_refused_stream_leaves_the_retry_policy_its_attempts() {
    // Stream 1 is refused (unprocessed), stream 2 reset mid-way (a retryable reset),
    // stream 3 answered: with the default two attempts, the client gets the answer.
    let (origin, streams) = origin_resetting(|n| match n {
        0 => Some(h2::Reason::REFUSED_STREAM),
        1 => Some(h2::Reason::INTERNAL_ERROR),
        _ => None,
    });
    let proxy = proxy_to_h2_with(origin, "");
    let mut c = Client::connect(proxy.addr);
    let r = c.get("/x");
    assert_eq!((r.status, r.text().as_str()), (200, "small"));
    assert_eq!(streams.load(std::sync::atomic::Ordering::SeqCst), 3);
}

/// An h2c origin answering "small" to everything.
fn small_origin() -> SocketAddr {
    counted_small_origin().0
}

/// [`small_origin`], and the count of connections it accepted.
fn counted_small_origin() -> (SocketAddr, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let conns = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = conns.clone();
    let addr = tokio_server(move |tcp| {
        seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        async move {
            let Ok(mut conn) = h2::server::handshake(tcp).await else {
                return;
            };
            while let Some(Ok((req, respond))) = conn.accept().await {
                tokio::spawn(serve_big_or_small(req, respond));
            }
        }
    });
    (addr, conns)
}

#[test]
fn an_idle_upstream_connection_is_closed_and_its_slot_freed() {
    let origin = small_origin();
    let proxy = proxy_to_h2_with(origin, "pool_idle_timeout = \"200ms\"");
    let key = format!(
        "ringway_endpoint_connections{{upstream=\"up\",endpoint=\"{origin}\",authority=\"{origin}\"}}"
    );
    let mut c = Client::connect(proxy.addr);
    assert_eq!(c.get("/a").status, 200);
    assert_eq!(metrics(proxy.addr).get(&key).copied(), Some(1.0));
    // Busy, it stays.
    for _ in 0..5 {
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(c.get("/b").status, 200);
    }
    assert_eq!(metrics(proxy.addr).get(&key).copied(), Some(1.0));
    // Idle for two timeouts: closed.
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(metrics(proxy.addr).get(&key).copied(), Some(0.0));
    assert_eq!(c.get("/c").status, 200, "and a new one is made");
}

#[test]
fn a_worker_without_an_upstream_connection_waits_for_the_cap_to_let_it_open_one() {
    let origin = small_origin();
    // Two workers, one connection allowed across them: a worker that has none waits for
    // the other's to go idle (and be closed) instead of answering 503 at once.
    let proxy = Proxy::start(&format!(
        "workers = 2\n[[upstreams]]\nname = \"up\"\nprotocol = \"h2c\"\nmax_connections = 1\n\
         pool_idle_timeout = \"100ms\"\nconnect_timeout = \"3s\"\nendpoints = [\"{origin}\"]\n\
         [[routes]]\npath_prefix = \"/\"\nproxy = \"up\"\n"
    ));
    // New client connections spread over both workers (SO_REUSEPORT).
    for i in 0..10 {
        let mut c = Client::connect(proxy.addr);
        let r = c.get(&format!("/r{i}"));
        assert_eq!((r.status, r.text().as_str()), (200, "small"), "request {i}");
    }
}

/// An h2c origin taking one stream at a time. On its first connection `/hold` gets its head
/// at once and its end 1.5 s later, and 600 ms after `/hold` came the connection is told to
/// go away; other connections answer everything.
fn one_stream_origin_going_away() -> SocketAddr {
    let conns = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    tokio_server(move |tcp| {
        let first = conns.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0;
        async move {
            let Ok(mut conn) = h2::server::Builder::new()
                .max_concurrent_streams(1)
                .handshake::<_, Bytes>(tcp)
                .await
            else {
                return;
            };
            let mut away_at: Option<tokio::time::Instant> = None;
            loop {
                let next = match away_at {
                    Some(at) => tokio::select! {
                        n = conn.accept() => n,
                        _ = tokio::time::sleep_until(at) => {
                            conn.graceful_shutdown();
                            away_at = None;
                            continue;
                        }
                    },
                    None => conn.accept().await,
                };
                let Some(Ok((req, mut respond))) = next else {
                    return;
                };
                if first && req.uri().path() == "/hold" {
                    away_at = Some(tokio::time::Instant::now() + Duration::from_millis(600));
                    tokio::spawn(async move {
                        let resp = http::Response::builder().status(200).body(()).unwrap();
                        let Ok(mut send) = respond.send_response(resp, false) else {
                            return;
                        };
                        tokio::time::sleep(Duration::from_millis(1500)).await;
                        let _ = send.send_data(Bytes::from_static(b"held"), true);
                    });
                    continue;
                }
                tokio::spawn(serve_big_or_small(req, respond));
            }
        }
    })
}

#[test]
fn a_queued_stream_closed_by_a_goaway_is_sent_again_with_its_body() {
    let origin = one_stream_origin_going_away();
    let proxy = proxy_to_h2_with(origin, "");
    let mut a = Client::connect(proxy.addr);
    a.send(b"GET /hold HTTP/1.1\r\nHost: x\r\n\r\n");
    std::thread::sleep(Duration::from_millis(300));
    // Queued behind /hold when the GOAWAY comes: never processed, and its body (streamed)
    // not yet taken, so it goes to a new connection.
    let mut b = Client::connect(proxy.addr);
    b.stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    b.send(b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello");
    let r = b.read_response(false).expect("an answer");
    assert_eq!((r.status, r.text().as_str()), (200, "small"));
}

#[test]
fn a_grpc_deadline_passing_while_queued_is_not_an_upstream_failure() {
    let origin = one_stream_origin_going_away();
    let proxy = proxy_to_h2_with(origin, "");
    let mut a = Client::connect(proxy.addr);
    a.send(b"GET /hold HTTP/1.1\r\nHost: x\r\n\r\n");
    std::thread::sleep(Duration::from_millis(200));
    rt().block_on(async {
        let (status, headers, _, _, _, head_ended) =
            call(proxy.addr, "/echo.Svc/Unary", &frame(b"x"), Some("100m")).await;
        assert_eq!(
            (status, headers["grpc-status"].to_str().unwrap(), head_ended),
            (200, "4", true)
        );
    });
    assert_eq!(
        metric_sum(proxy.addr, "ringway_upstream_failures_total"),
        0.0
    );
}

/// An h2c origin whose `/huge` answer carries a 48 KiB header field; anything else is a small 200.
fn origin_with_a_huge_head() -> SocketAddr {
    tokio_server(|tcp| async move {
        let Ok(mut conn) = h2::server::handshake(tcp).await else {
            return;
        };
        while let Some(Ok((req, mut respond))) = conn.accept().await {
            let mut resp = http::Response::builder().status(200);
            if req.uri().path() == "/huge" {
                resp = resp.header("x-huge", "h".repeat(48 * 1024));
            }
            if let Ok(mut send) = respond.send_response(resp.body(()).unwrap(), false) {
                let _ = send.send_data(Bytes::from_static(b"small"), true);
            }
        }
    })
}

/// The head bound itself is advertised in SETTINGS (checked below, where a raw origin reads
/// them); here, what a client sees of an oversize head and that the connection goes on.
#[test]
fn an_h2_upstream_head_over_the_head_bound_is_an_invalid_response() {
    let origin = origin_with_a_huge_head();
    let proxy = proxy_to_h2(origin);
    let mut c = proxy.connect();
    let r = c.get("/huge");
    assert_eq!(r.status, 502, "{}", r.text());
    assert!(!r.text().contains("hhhh"), "{}", r.text());
    // Counted as an invalid response, and the next request is served.
    let m = metrics(proxy.addr);
    assert_eq!(
        m.get("ringway_upstream_failures_total{upstream=\"grpc\",class=\"invalid\"}"),
        Some(&1.0),
        "{m:?}"
    );
    let r = c.get("/small");
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), "small");
}

/// The settings of one SETTINGS frame payload: (identifier, value) pairs.
fn settings_of(payload: &[u8]) -> Vec<(u16, u32)> {
    payload
        .chunks_exact(6)
        .map(|s| {
            (
                u16::from_be_bytes([s[0], s[1]]),
                u32::from_be_bytes([s[2], s[3], s[4], s[5]]),
            )
        })
        .collect()
}

/// One frame from a raw HTTP/2 stream: (type, flags, stream, payload).
fn read_frame(s: &mut std::net::TcpStream) -> Option<(u8, u8, u32, Vec<u8>)> {
    let mut h = [0u8; 9];
    s.read_exact(&mut h).ok()?;
    let len = u32::from_be_bytes([0, h[0], h[1], h[2]]) as usize;
    let stream = u32::from_be_bytes([h[5] & 0x7f, h[6], h[7], h[8]]);
    let mut payload = vec![0u8; len];
    s.read_exact(&mut payload).ok()?;
    Some((h[3], h[4], stream, payload))
}

fn frame_bytes(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
    f.extend_from_slice(&[kind, flags]);
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

#[test]
fn an_h2_upstream_may_not_push_and_its_heads_are_bounded() {
    // A raw h2c origin: it records ringway's SETTINGS, answers the first request with a
    // PUSH_PROMISE, and reports what ringway did about it (the GOAWAY's error code).
    let (tx, rx) = std::sync::mpsc::channel::<(Vec<(u16, u32)>, Option<u32>)>();
    let tx = std::sync::Mutex::new(tx);
    let origin = raw_origin(move |mut s| {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut preface = [0u8; 24];
        if s.read_exact(&mut preface).is_err() {
            return;
        }
        let Some((4, _, 0, payload)) = read_frame(&mut s) else {
            return;
        };
        let settings = settings_of(&payload);
        s.write_all(&frame_bytes(4, 0, 0, &[])).unwrap(); // our SETTINGS
        s.write_all(&frame_bytes(4, 1, 0, &[])).unwrap(); // ACK of theirs
        let mut goaway = None;
        while let Some((kind, _, stream, payload)) = read_frame(&mut s) {
            if kind == 1 {
                // PUSH_PROMISE (END_HEADERS) for stream 2: GET http://x/ in HPACK (indexed
                // :method GET, :scheme http, :path /; :authority "x" as a literal).
                let mut p = 2u32.to_be_bytes().to_vec();
                p.extend_from_slice(&[0x82, 0x86, 0x84, 0x01, 0x01, b'x']);
                let _ = s.write_all(&frame_bytes(5, 4, stream, &p));
            }
            if kind == 7 && payload.len() >= 8 {
                goaway = Some(u32::from_be_bytes([
                    payload[4], payload[5], payload[6], payload[7],
                ]));
                break;
            }
        }
        let _ = tx.lock().unwrap().send((settings, goaway));
    });
    let proxy = proxy_to_h2_with(origin, "response_timeout = \"3s\"");
    assert_prompt_502(&mut proxy.connect());
    let (settings, goaway) = rx.recv_timeout(Duration::from_secs(5)).unwrap();
    // ENABLE_PUSH 0, MAX_CONCURRENT_STREAMS 0, a MAX_HEADER_LIST_SIZE no larger than the
    // HTTP/1.1 head bound's block.
    assert!(settings.contains(&(2, 0)), "{settings:?}");
    assert!(settings.contains(&(3, 0)), "{settings:?}");
    let list = settings.iter().find(|s| s.0 == 6).map(|s| s.1);
    assert!(
        list.is_some_and(|n| (16 * 1024..=64 * 1024).contains(&n)),
        "{settings:?}"
    );
    assert_eq!(goaway, Some(1), "PROTOCOL_ERROR");
    // A protocol violation the proxy's side caught is an invalid response, not a reset.
    let m = metrics(proxy.addr);
    assert_eq!(
        m.get("ringway_upstream_failures_total{upstream=\"up\",class=\"invalid\"}"),
        Some(&1.0),
        "{m:?}"
    );
}

/// An h2c origin for the body-and-head races: `/early` answers 413 at once and neither reads
/// nor releases the request body (the stream stays open, no reset); `/headfirst` sends its
/// head at once and the body's length once it has read it; `/interim/N` sends N 103
/// responses before a 200; anything else reads the whole body, then answers with its length.
fn origin_for_early_answers() -> SocketAddr {
    tokio_server(|tcp| async move {
        let Ok(mut conn) = h2::server::handshake(tcp).await else {
            return;
        };
        while let Some(Ok((req, mut respond))) = conn.accept().await {
            tokio::spawn(async move {
                let (parts, mut body) = req.into_parts();
                let path = parts.uri.path().to_string();
                if path == "/early" {
                    let resp = http::Response::builder().status(413).body(()).unwrap();
                    let _ = respond.send_response(resp, true);
                    tokio::time::sleep(Duration::from_secs(10)).await;
                    drop(body);
                    return;
                }
                if path == "/headfirst" {
                    // The head at once, then the body's length once it has all come.
                    let resp = http::Response::builder().status(200).body(()).unwrap();
                    let Ok(mut send) = respond.send_response(resp, false) else {
                        return;
                    };
                    let mut got = 0;
                    while let Some(Ok(chunk)) = body.data().await {
                        got += chunk.len();
                        let _ = body.flow_control().release_capacity(chunk.len());
                    }
                    let _ = send.send_data(Bytes::from(got.to_string()), true);
                    return;
                }
                if let Some(n) = path.strip_prefix("/interim/") {
                    for _ in 0..n.parse::<usize>().unwrap() {
                        let hint = http::Response::builder().status(103).body(()).unwrap();
                        let _ = respond.send_informational(hint);
                    }
                }
                let mut got = 0;
                while let Some(Ok(chunk)) = body.data().await {
                    got += chunk.len();
                    let _ = body.flow_control().release_capacity(chunk.len());
                }
                let resp = http::Response::builder().status(200).body(()).unwrap();
                if let Ok(mut send) = respond.send_response(resp, false) {
                    let _ = send.send_data(Bytes::from(got.to_string()), true);
                }
            });
        }
    })
}

#[test]
fn an_early_answer_from_an_h2_upstream_reaches_an_http1_client_while_its_body_is_unsent() {
    let proxy = proxy_to_h2_with(origin_for_early_answers(), "");
    let mut s = std::net::TcpStream::connect(proxy.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let started = Instant::now();
    // 4 MiB announced, 1 MiB sent: more than the upstream's windows take, and the rest never
    // comes while the answer is awaited.
    s.write_all(b"POST /early HTTP/1.1\r\nHost: x\r\nContent-Length: 4194304\r\n\r\n")
        .unwrap();
    let _ = s.write_all(&vec![b'b'; 1024 * 1024]);
    let mut r = std::io::BufReader::new(s);
    let resp = read_response(&mut r, false).expect("a response");
    assert_eq!(resp.status, 413);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    // The client's body was not all read: its connection closes after the answer (a reset
    // counts as closed; a read timing out does not).
    let mut rest = Vec::new();
    let end = r.read_to_end(&mut rest);
    assert!(
        end.as_ref().map_or_else(
            |e| !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
            |_| true
        ),
        "{end:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

/// An h2c origin granting no window to request bodies: `/early` answers 413 at once (the
/// stream stays open, no reset); anything else gets 1,000 103 responses, then nothing.
fn windowless_origin() -> SocketAddr {
    tokio_server(|tcp| async move {
        let Ok(mut conn) = h2::server::Builder::new()
            .initial_window_size(0)
            .handshake::<_, Bytes>(tcp)
            .await
        else {
            return;
        };
        while let Some(Ok((req, mut respond))) = conn.accept().await {
            tokio::spawn(async move {
                let (parts, body) = req.into_parts();
                if parts.uri.path() == "/early" {
                    let resp = http::Response::builder().status(413).body(()).unwrap();
                    let _ = respond.send_response(resp, true);
                } else {
                    for _ in 0..1000 {
                        let hint = http::Response::builder().status(103).body(()).unwrap();
                        let _ = respond.send_informational(hint);
                    }
                }
                tokio::time::sleep(Duration::from_secs(10)).await;
                drop(body);
            });
        }
    })
}

#[test]
fn an_upstream_granting_no_window_is_heard_while_the_body_waits_for_it() {
    let proxy = proxy_to_h2_with(windowless_origin(), "response_timeout = \"5s\"");
    // Its answer before any window is relayed at once (not a 504 after the response timeout);
    // its interim responses without end are taken off as they come and counted: beyond 16,
    // the answer is invalid (h2 would otherwise keep every one of them).
    for (path, status) in [("/early", 413), ("/flood", 502)] {
        let started = Instant::now();
        let mut c = proxy.connect();
        c.send(
            format!("PUT {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello").as_bytes(),
        );
        let r = c.read_response(false).expect("a response");
        assert_eq!(r.status, status, "{path}: {}", r.text());
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{path}: {:?}",
            started.elapsed()
        );
    }
}

#[test]
fn interim_responses_of_an_h2_upstream_are_relayed_and_bounded() {
    let proxy = proxy_to_h2_with(origin_for_early_answers(), "");
    let mut c = proxy.connect();
    // Each 103 goes on to the client; more than 16 make the upstream's answer invalid.
    for (n, relayed, status) in [(3, 3, 200), (40, 16, 502)] {
        c.send(format!("GET /interim/{n} HTTP/1.1\r\nHost: test\r\n\r\n").as_bytes());
        for _ in 0..relayed {
            assert_eq!(c.read_response(false).expect("a response").status, 103);
        }
        let r = c.read_response(false).expect("a response");
        assert_eq!(r.status, status, "{}", r.text());
    }
    let m = metrics(proxy.addr);
    assert_eq!(
        m.get("ringway_upstream_failures_total{upstream=\"up\",class=\"invalid\"}"),
        Some(&1.0),
        "{m:?}"
    );
}

#[test]
fn the_response_timeout_of_an_h2_upstream_runs_from_the_end_of_the_body() {
    // The body takes 1.5 s to arrive; the upstream answers as soon as it has it all.
    let proxy = proxy_to_h2_with(origin_for_early_answers(), "response_timeout = \"1s\"");
    let mut s = std::net::TcpStream::connect(proxy.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"POST /count HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        .unwrap();
    for _ in 0..3 {
        s.write_all(b"5\r\nhello\r\n").unwrap();
        std::thread::sleep(Duration::from_millis(500));
    }
    s.write_all(b"0\r\n\r\n").unwrap();
    let mut r = std::io::BufReader::new(s);
    let resp = read_response(&mut r, false).expect("a response");
    assert_eq!((resp.status, resp.text().as_str()), (200, "15"));
}

#[test]
fn bodiless_responses_from_an_h2_upstream_state_a_length_only_where_allowed() {
    let origin = tokio_server(|tcp| async move {
        let Ok(mut conn) = h2::server::handshake(tcp).await else {
            return;
        };
        while let Some(Ok((req, mut respond))) = conn.accept().await {
            let status = match req.uri().path() {
                "/204" => 204,
                "/304" => 304,
                _ => 200,
            };
            let resp = http::Response::builder()
                .status(status)
                .header("content-length", "5")
                .body(())
                .unwrap();
            let _ = respond.send_response(resp, true);
        }
    });
    let proxy = proxy_to_h2_with(origin, "");
    let mut c = proxy.connect();
    assert_bodiless_lengths(&mut c);
}

#[test]
fn an_h2_upstream_that_sends_its_head_before_reading_gets_the_whole_body() {
    let proxy = proxy_to_h2_with(origin_for_early_answers(), "read_timeout = \"3s\"");
    let mut s = std::net::TcpStream::connect(proxy.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let body = vec![b'b'; 1024 * 1024];
    s.write_all(b"POST /headfirst HTTP/1.1\r\nHost: x\r\nContent-Length: 1048576\r\n\r\n")
        .unwrap();
    s.write_all(&body).unwrap();
    let mut r = std::io::BufReader::new(s);
    let resp = read_response(&mut r, false).expect("a response");
    assert_eq!((resp.status, resp.text().as_str()), (200, "1048576"));
}

/// `n` client connections to `addr` that send `GET /x` together (after a barrier); their
/// threads, each ending with its response.
fn burst(addr: SocketAddr, n: usize) -> Vec<std::thread::JoinHandle<Response>> {
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(n));
    (0..n)
        .map(|_| {
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                let mut c = Client::connect(addr);
                barrier.wait();
                c.get("/x")
            })
        })
        .collect()
}

#[test]
fn a_burst_on_an_empty_pool_opens_at_most_h2_connections() {
    // Thirty requests at once on a worker with no upstream connection yet: connections
    // being opened count toward `h2_connections` (1 here), so the burst opens one, not one
    // each.
    let (origin, conns) = counted_small_origin();
    let proxy = proxy_to_h2_with(origin, "");
    for t in burst(proxy.addr, 30) {
        let r = t.join().unwrap();
        assert_eq!((r.status, r.text().as_str()), (200, "small"));
    }
    let opened = conns.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(opened, 1, "{opened} connections opened");
}

#[test]
fn a_stream_beyond_a_goaway_with_an_error_code_is_sent_again() {
    // The first connection answers the first stream with GOAWAY(ENHANCE_YOUR_CALM, last
    // stream 0): that stream was not processed whatever the code (RFC 9113 §6.8), so even a
    // POST goes again, on a new connection, and nothing is held against the endpoint.
    let conns = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = conns.clone();
    let origin = raw_origin(move |mut s| {
        let n = seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut preface = [0u8; 24];
        if s.read_exact(&mut preface).is_err() {
            return;
        }
        s.write_all(&frame_bytes(4, 0, 0, &[])).unwrap(); // our SETTINGS
        while let Some((kind, flags, stream, _)) = read_frame(&mut s) {
            if kind == 4 && flags & 1 == 0 {
                let _ = s.write_all(&frame_bytes(4, 1, 0, &[])); // ACK of theirs
            }
            if kind != 1 {
                continue;
            }
            if n == 0 {
                let mut p = 0u32.to_be_bytes().to_vec();
                p.extend_from_slice(&0xbu32.to_be_bytes());
                let _ = s.write_all(&frame_bytes(7, 0, 0, &p));
                std::thread::sleep(Duration::from_millis(300));
                return;
            }
            // :status 200 (static index 8), END_STREAM | END_HEADERS.
            let _ = s.write_all(&frame_bytes(1, 0x5, stream, &[0x88]));
        }
    });
    let proxy = proxy_to_h2_with(origin, "");
    let mut c = Client::connect(proxy.addr);
    c.send(b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n");
    let r = c.read_response(false).expect("a response");
    assert_eq!(r.status, 200);
    assert_eq!(conns.load(std::sync::atomic::Ordering::SeqCst), 2);
    assert_eq!(
        metric_sum(proxy.addr, "ringway_upstream_failures_total"),
        0.0
    );
}

#[test]
fn before_the_upstream_states_its_stream_limit_at_most_100_streams_go_out() {
    // 120 requests at once on a connection whose peer has not sent its SETTINGS yet: at most
    // 100 streams are opened (the limit to assume, RFC 9113 §6.5.2), the rest wait.
    let (tx, rx) = std::sync::mpsc::channel::<usize>();
    let tx = std::sync::Mutex::new(tx);
    let origin = raw_origin(move |mut s| {
        s.set_read_timeout(Some(Duration::from_millis(800)))
            .unwrap();
        let mut preface = [0u8; 24];
        if s.read_exact(&mut preface).is_err() {
            return;
        }
        let mut streams = Vec::new();
        // No SETTINGS of ours yet: count the streams opened meanwhile.
        while let Some((kind, _, stream, _)) = read_frame(&mut s) {
            if kind == 1 {
                streams.push(stream);
            }
        }
        let _ = tx.lock().unwrap().send(streams.len());
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        // MAX_CONCURRENT_STREAMS 1000, ACK of theirs; then answer every stream.
        let _ = s.write_all(&frame_bytes(4, 0, 0, &[0, 3, 0, 0, 0x03, 0xe8]));
        let _ = s.write_all(&frame_bytes(4, 1, 0, &[]));
        for id in streams {
            let _ = s.write_all(&frame_bytes(1, 0x5, id, &[0x88]));
        }
        while let Some((kind, _, stream, _)) = read_frame(&mut s) {
            if kind == 1 {
                let _ = s.write_all(&frame_bytes(1, 0x5, stream, &[0x88]));
            }
        }
    });
    let proxy = proxy_to_h2_with(origin, "");
    let clients = burst(proxy.addr, 120);
    let early = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    for t in clients {
        assert_eq!(t.join().unwrap().status, 200);
    }
    assert!(
        (1..=100).contains(&early),
        "{early} streams before SETTINGS"
    );
}

#[test]
fn streams_queued_behind_the_upstream_limit_are_bounded() {
    // The origin takes one stream at a time and holds each for 1.5 s. With one connection,
    // one stream runs, one more may queue on it (as many as the limit), and a third waits as
    // for a connection at the cap: 503 after connect_timeout, nothing held in h2's queue.
    let origin = one_stream_origin(|_, mut respond| async move {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let resp = http::Response::builder().status(200).body(()).unwrap();
        let _ = respond.send_response(resp, true);
    });
    let proxy = proxy_to_h2_with(origin, "connect_timeout = \"500ms\"");
    let started = Instant::now();
    let clients: Vec<_> = (0..3)
        .map(|i| {
            let addr = proxy.addr;
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(100 * i));
                let mut c = Client::connect(addr);
                let r = c.get("/hold");
                (r.status, r.error_code(), started.elapsed())
            })
        })
        .collect();
    let results: Vec<_> = clients.into_iter().map(|t| t.join().unwrap()).collect();
    assert_eq!(results[0].0, 200, "{results:?}");
    assert_eq!(results[1].0, 200, "queued, then served: {results:?}");
    assert_eq!(
        (results[2].0, results[2].1.as_deref()),
        (503, Some("upstream_saturated")),
        "{results:?}"
    );
    assert!(results[2].2 < Duration::from_millis(1400), "{results:?}");
}

/// A unary call with a 300 ms deadline through `addr` gets DEADLINE_EXCEEDED at about its
/// deadline (well before any `connect_timeout` of seconds).
fn a_300ms_call_ends_at_its_deadline(addr: SocketAddr) {
    let (status, headers, .., took, _) =
        rt().block_on(call(addr, "/echo.Svc/Unary", &frame(b"x"), Some("300m")));
    assert_eq!(
        (
            status,
            headers.get("grpc-status").map(|v| v.to_str().unwrap())
        ),
        (200, Some("4")),
        "{headers:?}"
    );
    assert!(
        took < Duration::from_millis(1500),
        "answered after {took:?}"
    );
}

#[test]
fn a_call_waiting_for_a_stream_ends_at_its_own_deadline() {
    // One connection, one stream at a time: one request holds it, one more is queued on it
    // behind the limit, and a call with a 300 ms deadline waits in line for a stream. It is
    // answered DEADLINE_EXCEEDED at its deadline, not UNAVAILABLE at `connect_timeout`.
    let proxy = proxy_to_h2_with(holding_origin(), "connect_timeout = \"5s\"");
    let holders: Vec<_> = (0..2)
        .map(|i| {
            let addr = proxy.addr;
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(100 * i));
                Client::connect(addr).get("/hold").status
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(400));
    a_300ms_call_ends_at_its_deadline(proxy.addr);
    for h in holders {
        assert_eq!(h.join().unwrap(), 200);
    }
    assert_no_upstream_failures(proxy.addr);
}

#[test]
fn a_call_ends_at_its_deadline_while_its_connection_is_being_made() {
    // connect_timeout is 5 s, the call's deadline 300 ms: it ends at its deadline, the
    // client's doing, not the endpoint's failure.
    let hole = unanswering();
    let proxy = proxy_to_h2_with(hole.addr, "connect_timeout = \"5s\"");
    a_300ms_call_ends_at_its_deadline(proxy.addr);
    assert_no_upstream_failures(proxy.addr);
}

#[test]
fn a_call_whose_upstream_connect_timed_out_is_unavailable() {
    // The call never reached a server: UNAVAILABLE, the code a client may retry on, not
    // DEADLINE_EXCEEDED (which tells it its own deadline passed).
    let hole = unanswering();
    let proxy = proxy_to_h2_with(hole.addr, "connect_timeout = \"300ms\"");
    let (status, headers, ..) =
        rt().block_on(call(proxy.addr, "/echo.Svc/Unary", &frame(b"x"), None));
    assert_eq!(
        (
            status,
            headers.get("grpc-status").map(|v| v.to_str().unwrap())
        ),
        (200, Some("14")),
        "{headers:?}"
    );
}

/// on a keep-alive connection, to an HTTP/2 upstream: ringway acknowledges the head at once,
/// so the body does not wait for a delayed ACK (up to 40 ms on Linux).
#[test]
fn a_body_written_apart_from_its_head_reaches_an_h2_upstream_without_a_delayed_ack() {
    let proxy = proxy_to_h2(h2_origin());
    let mut c = proxy.connect();
    let mut times = Vec::new();
    for _ in 0..8 {
        let t = Instant::now();
        c.send(b"POST /p HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\n");
        c.send(b"hello");
        let r = c.read_response(false).expect("a response");
        assert_eq!((r.status, r.text()), (200, "plain POST 5".to_string()));
        times.push(t.elapsed());
    }
    assert_no_delayed_ack(&times);
}
