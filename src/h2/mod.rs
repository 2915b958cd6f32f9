//! HTTP/2 inbound: h2 over TLS (ALPN `h2`) and h2c with prior knowledge (the connection
//! preface on a cleartext port), served with the h2 crate over monoio's poll-style I/O.
//!
//! ```text
//! connection task: handshake ─► accept streams (drives all frame I/O) ─► GOAWAY on drain/idle
//! stream task:     request ─► HTTP/1.1 head + its parts ─► virtual connection ─► proxy path
//!                  response ◄─ typed head + body bytes ◄─────────────┘ ─► HEADERS / DATA frames
//! ```
//!
//! (The request head is read from the parts it was written from, not tokenized again; a
//! relayed response's head comes typed; the proxy's own answers come as HTTP/1.1 bytes.)
//!
//! Every stream runs through the same request path as HTTP/1.1 (see [`bridge`]), so routes,
//! limits, admission, retries and error envelopes behave identically. Limits: concurrent
//! streams, header list size (which also bounds CONTINUATION frames), windows, and the reset
//! flood limits (CVE-2023-44487: pending-accept and local-error resets). Flow control runs end
//! to end: request DATA is acknowledged (window released) only when the proxy has taken it,
//! and response DATA is sent only against capacity the client granted.

pub mod bridge;
pub mod grpc;
pub mod io;

use std::cell::Cell;
use std::future::{poll_fn, Future};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use h2::server::SendResponse;
use h2::RecvStream;

use self::bridge::Read;
use crate::error::ErrorKind;
use crate::http1::{
    parse_response, BodyFraming, ChunkedDecoder, HeaderField, Method, ResponseEdits, ResponseHead,
    Span, Step, WrittenRequest, MAX_HEADERS_HARD_LIMIT,
};
use crate::observe::access_log::{Outcome, Request};
use crate::observe::metrics::add;
use crate::worker::Worker;

/// The client connection preface of HTTP/2 (RFC 9113 §3.4).
pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// ALPN protocol id of HTTP/2 over TLS.
pub const ALPN_H2: &[u8] = b"h2";

/// How often an idle connection's state is looked at.
const IDLE_CHECK: Duration = Duration::from_secs(1);

/// How long a connection told to go away (idle, or the worker draining) may stay open without
/// a stream, waiting for the peer to answer the GOAWAY's PING (at most `http.idle_timeout`);
/// a peer that never does (or is gone) is closed anyway.
const GOAWAY_GRACE: Duration = Duration::from_secs(5);

/// Where an HTTP/2 connection came from.
#[derive(Debug, Clone)]
pub struct ConnInfo {
    /// The client.
    pub peer: crate::net::client::Peer,
    /// The TLS SNI name, if any.
    pub sni: Option<Rc<str>>,
    /// Over TLS.
    pub tls: bool,
    /// 421 when a request's authority is not the SNI name.
    pub strict_sni: bool,
    /// The listener it came from: when its terms change or it is removed, the connection
    /// is told to go away.
    pub listener: Option<crate::worker::Admitted>,
}

/// Serves one HTTP/2 connection until it closes.
///
/// The transport comes boxed: a future keeps the slots of its arguments for its whole life,
/// so a transport passed by value (a TLS one is 1.3 KiB) would be held in this future twice,
/// there and inside the connection, by every idle connection.
pub async fn serve<T: io::Watched>(w: Rc<Worker>, io: Box<T>, info: ConnInfo) {
    let watch = io.watch();
    let gen = w.gen();
    let cfg = &gen.http2;
    let mut builder = h2::server::Builder::new();
    builder
        .max_concurrent_streams(cfg.max_concurrent_streams)
        .initial_window_size(cfg.initial_stream_window)
        .initial_connection_window_size(cfg.initial_connection_window)
        .max_frame_size(cfg.max_frame_size)
        .max_header_list_size(cfg.max_header_list_bytes)
        .max_pending_accept_reset_streams(cfg.max_pending_accept_reset_streams)
        .max_local_error_reset_streams(Some(cfg.max_local_error_reset_streams))
        .max_send_buffer_size(send_buffer_per_stream(cfg));
    let cfg_budget = cfg.max_buffered_bytes;
    // The settings it was set up with: a reload that changes them tells it to go away (the
    // client's next connection gets the new ones).
    let settings = cfg.clone();
    // Boxed: the handshake's state (the transport and the codec, being set up) would
    // otherwise stay part of the connection's future for its whole life.
    let handshake = Box::pin(monoio::time::timeout(
        gen.http.header_timeout,
        builder.handshake::<Box<T>, Bytes>(io),
    ))
    .await;
    let mut conn = match handshake {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            tracing::debug!(peer = %info.peer.addr, error = %e, "HTTP/2 handshake failed");
            return;
        }
        Err(_) => return,
    };
    add(&w.metrics().h2_connections, 1);
    let idle_timeout = gen.http.idle_timeout;
    let send_timeout = gen.http.send_timeout;
    let max_streams = cfg.max_concurrent_streams as usize;
    drop(gen);
    let info = Rc::new(info);
    let streams = Rc::new(StreamCount::new(cfg_budget));
    // One timer for the connection's life, re-armed when it fires (not one per stream).
    let mut check = std::pin::pin!(monoio::time::sleep(IDLE_CHECK));
    let mut shutdown = std::pin::pin!(w.shutdown.wait());
    let mut shutdown_seen = false;
    let mut idle_since = w.now();
    let mut closing = false;
    // When GOAWAY went out with no stream open; the connection is closed without waiting for
    // the peer's PING answer after `GOAWAY_GRACE`.
    let mut closing_idle_since = None;
    let mut forced = false;
    loop {
        if !closing
            && (w.draining()
                || info
                    .listener
                    .as_ref()
                    .is_some_and(crate::worker::Admitted::retired))
        {
            conn.graceful_shutdown();
            closing = true;
        }
        enum Next<T> {
            Stream(T),
            Shutdown,
            Check,
        }
        let next = poll_fn(|cx| {
            if let Poll::Ready(r) = conn.poll_accept(cx) {
                return Poll::Ready(Next::Stream(r));
            }
            if !shutdown_seen && shutdown.as_mut().poll(cx).is_ready() {
                shutdown_seen = true;
                return Poll::Ready(Next::Shutdown);
            }
            if check.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Next::Check);
            }
            Poll::Pending
        })
        .await;
        match next {
            Next::Stream(Some(Ok((req, mut respond)))) => {
                // A stream the client reset is closed for h2 at once, but its exchange runs
                // on until it notices (a wait for the response head ends at once; a connect
                // runs to its end): the limit counts exchanges, so that opening and resetting
                // streams in a loop cannot start unbounded upstream work.
                if streams.active.get() >= max_streams {
                    respond.send_reset(h2::Reason::REFUSED_STREAM);
                    continue;
                }
                streams.active.set(streams.active.get() + 1);
                add(&w.metrics().h2_streams, 1);
                let guard = StreamGuard(streams.clone());
                let (w, info) = (w.clone(), info.clone());
                crate::worker::runtime::spawn_large(move || {
                    stream_task(w, info, req, respond, guard)
                });
            }
            Next::Stream(Some(Err(e))) => {
                tracing::debug!(peer = %info.peer.addr, error = %e, "HTTP/2 connection error");
                break;
            }
            Next::Stream(None) => break,
            Next::Shutdown => {} // GOAWAY at the top of the loop
            Next::Check => {
                let now = w.now();
                // A peer whose socket accepts no byte for `send_timeout` is not coming back
                // for the rest: the connection ends (reset, so that the kernel drops what it
                // still holds for it), as an HTTP/1.1 write would. (Its streams, waiting for
                // room that never comes, are reset at about the same time; an idle
                // connection would close only after `idle_timeout`, and a client opening
                // streams would keep it busy.)
                if watch.stall.check(now) >= send_timeout {
                    tracing::debug!(
                        peer = %info.peer.addr,
                        "HTTP/2 client's socket accepted nothing for the send timeout; reset"
                    );
                    crate::net::sys::reset_on_close(watch.fd);
                    break;
                }
                // Idle: no stream open, and none opened or ended since the last check.
                let busy = streams.active.get() > 0 || streams.touched.replace(false);
                if busy {
                    idle_since = now;
                    closing_idle_since = None;
                } else if !closing && now.saturating_duration_since(idle_since) >= idle_timeout {
                    conn.graceful_shutdown();
                    closing = true;
                }
                if !closing && w.gen().http2 != settings {
                    conn.graceful_shutdown();
                    closing = true;
                }
                if closing && streams.active.get() == 0 {
                    let since = *closing_idle_since.get_or_insert(now);
                    if now.saturating_duration_since(since) >= GOAWAY_GRACE.min(idle_timeout) {
                        if forced {
                            break; // not even the abrupt close got through: drop it
                        }
                        conn.abrupt_shutdown(h2::Reason::NO_ERROR);
                        forced = true;
                    }
                }
                check
                    .as_mut()
                    .reset(monoio::time::Instant::now() + IDLE_CHECK);
            }
        }
    }
}

/// What h2 may queue for sending per stream (its `max_send_buffer_size`): a stream's share of
/// `http2.max_buffered_bytes` with every stream open, at least [`bridge::MIN_PIPE_BYTES`] and at
/// most the stream window. (h2 queues up to this much whatever window the client grants: a
/// client that grants a wide window and reads nothing would otherwise pin it per stream.)
fn send_buffer_per_stream(cfg: &crate::config::Http2Config) -> usize {
    let share = cfg.max_buffered_bytes / (cfg.max_concurrent_streams.max(1) as usize);
    share
        .max(bridge::MIN_PIPE_BYTES)
        .min(cfg.initial_stream_window as usize)
}

/// The streams of one connection: open now, and whether any opened or ended lately; and the
/// bytes their bridges may hold together.
#[derive(Debug)]
pub struct StreamCount {
    active: Cell<usize>,
    touched: Cell<bool>,
    /// `http2.max_buffered_bytes`: shared out among the open streams (see
    /// [`StreamCount::pipe_limit`]).
    budget: usize,
}

impl StreamCount {
    fn new(budget: usize) -> Self {
        StreamCount {
            active: Cell::new(0),
            touched: Cell::new(false),
            budget,
        }
    }

    /// The bytes each direction of a stream's bridge may hold now: an equal share of the
    /// connection's budget among its open streams, within [`bridge::MIN_PIPE_BYTES`] and
    /// [`bridge::PIPE_BYTES`]. A client that opens many streams and reads none of them pins
    /// a share each, not a full pipe each.
    pub fn pipe_limit(&self) -> usize {
        let open = self.active.get().max(1);
        (self.budget / open).clamp(bridge::MIN_PIPE_BYTES, bridge::PIPE_BYTES)
    }
}

/// Counts a stream in progress; its drop records the end.
struct StreamGuard(Rc<StreamCount>);

impl Drop for StreamGuard {
    fn drop(&mut self) {
        let c = &self.0;
        c.active.set(c.active.get().saturating_sub(1));
        c.touched.set(true);
    }
}

/// A refusal of a stream before it reaches the proxy path, as a complete HTTP/2 response: the
/// JSON error envelope, or for a gRPC call a trailers-only response with its `grpc-status`
/// (as the proxy path answers its errors).
fn local_error(
    respond: &mut SendResponse<Bytes>,
    w: &Worker,
    (req, client): (&http::request::Parts, std::net::SocketAddr),
    kind: ErrorKind,
    message: &str,
    grpc: bool,
) {
    let Some(status) = kind.status() else {
        return;
    };
    let rid = w.ids.next();
    let line = w.logs_requests().then(|| {
        let mut line = w.log_begin(&Request {
            request_id: rid.as_bytes(),
            client,
            protocol: "HTTP/2",
            method: req.method.as_str().as_bytes(),
            host: req.uri.authority().map_or("", |a| a.as_str()).as_bytes(),
            target: req
                .uri
                .path_and_query()
                .map_or("", |p| p.as_str())
                .as_bytes(),
        });
        line.outcome(&Outcome {
            error: Some(kind.code()),
            ..Outcome::default()
        });
        line
    });
    let builder = http::Response::builder().header("x-request-id", rid.as_str());
    let (resp, body) = if grpc {
        let resp = builder
            .status(200)
            .header("content-type", "application/grpc")
            .header("grpc-status", u16::from(grpc::status_for(kind)))
            .header("grpc-message", &*grpc::encode_message(message))
            .body(());
        (resp, None)
    } else {
        let body = format!(
            "{{\"error\":{{\"code\":\"{}\",\"message\":\"{message}\",\"request_id\":\"{}\"}}}}",
            kind.code(),
            rid.as_str()
        );
        let resp = builder
            .status(status)
            .header("content-type", "application/json")
            .header("content-length", body.len())
            .body(());
        (resp, Some(body))
    };
    let Ok(mut resp) = resp else {
        return;
    };
    if let Some(v) = resp.headers_mut().get_mut("x-request-id") {
        v.set_sensitive(true);
    }
    let status = resp.status().as_u16();
    // (status, DATA bytes) the client got.
    let mut got = (0, 0);
    if let Ok(mut send) = respond.send_response(resp, body.is_none()) {
        w.metrics().response(status);
        got.0 = status;
        if let Some(body) = body {
            let n = body.len() as u64;
            if send.send_data(Bytes::from(body), true).is_ok() {
                got.1 = n;
            }
        }
    }
    if let Some(line) = line {
        w.log_finish(line, got.0, got.1);
    }
}

/// Writes the HTTP/1.1 head of an HTTP/2 request, with where its parts are (the proxy reads
/// it from those, without tokenizing it again). `chunked`: the body length is unknown.
/// `None`: the request is malformed, its Host names another authority than `:authority`
/// (RFC 9113 §8.3.1).
fn h1_head(parts: &http::request::Parts, chunked: bool) -> Option<(BytesMut, WrittenRequest)> {
    let mut out = BytesMut::with_capacity(256 + parts.headers.len() * 32);
    let mut written = WrittenRequest::default();
    out.extend_from_slice(parts.method.as_str().as_bytes());
    written.method = span_from(&out, 0);
    out.extend_from_slice(b" ");
    let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let at = out.len();
    out.extend_from_slice(if target.is_empty() {
        b"/"
    } else {
        target.as_bytes()
    });
    written.target = span_from(&out, at);
    out.extend_from_slice(b" HTTP/1.1\r\n");
    // :authority replaces Host (RFC 9113 §8.3.1).
    let authority = parts.uri.authority().map(|a| a.as_str());
    if let Some(a) = authority {
        let field = begin_field(&mut out, b"host");
        out.extend_from_slice(a.as_bytes());
        end_field(&mut out, &mut written, field);
    }
    let mut cookies = 0;
    for (name, value) in &parts.headers {
        if name == http::header::COOKIE {
            cookies += 1;
            continue;
        }
        // TE (only `trailers` is allowed in HTTP/2) goes on to the proxy path, which keeps
        // `te: trailers` toward an HTTP/2 upstream (gRPC needs it) and, as a hop-by-hop
        // field, drops it toward HTTP/1.1.
        if let (true, Some(a)) = (name == http::header::HOST, authority) {
            if !value.as_bytes().eq_ignore_ascii_case(a.as_bytes()) {
                return None;
            }
            continue;
        }
        let field = begin_field(&mut out, name.as_str().as_bytes());
        out.extend_from_slice(value.as_bytes());
        end_field(&mut out, &mut written, field);
    }
    // Cookie fields split over several HTTP/2 fields become one (RFC 9113 §8.2.3).
    if cookies > 0 {
        let field = begin_field(&mut out, b"cookie");
        for (i, v) in parts
            .headers
            .get_all(http::header::COOKIE)
            .iter()
            .enumerate()
        {
            if i > 0 {
                out.extend_from_slice(b"; ");
            }
            out.extend_from_slice(v.as_bytes());
        }
        end_field(&mut out, &mut written, field);
    }
    if chunked {
        let field = begin_field(&mut out, b"transfer-encoding");
        out.extend_from_slice(b"chunked");
        end_field(&mut out, &mut written, field);
    }
    out.extend_from_slice(b"\r\n");
    written.len = out.len();
    Some((out, written))
}

/// The bytes of `out` from `from` on.
fn span_from(out: &BytesMut, from: usize) -> Span {
    Span {
        start: from as u32,
        len: (out.len() - from) as u32,
    }
}

/// Writes `name: `; the value follows, then [`end_field`]. The name's span and where the
/// value starts.
fn begin_field(out: &mut BytesMut, name: &[u8]) -> (Span, usize) {
    let at = out.len();
    out.extend_from_slice(name);
    let name = span_from(out, at);
    out.extend_from_slice(b": ");
    (name, out.len())
}

/// Ends the field [`begin_field`] started, and records it.
fn end_field(out: &mut BytesMut, written: &mut WrittenRequest, (name, at): (Span, usize)) {
    let value = span_from(out, at);
    out.extend_from_slice(b"\r\n");
    written.fields.push(HeaderField {
        name,
        value,
        ..HeaderField::default()
    });
}

/// One stream's exchange, as a future built by a call of its own: the caller's
/// `spawn_large` then has it written straight into the task's heap block (inlined, it is
/// built on the stack and copied there whole, about 10 KiB per stream). An `async` block
/// rather than an `async fn`: an `async fn` moves each argument from the future's argument
/// slots into slots of its own at its first poll, and with hundreds of streams in flight each
/// line of a stream's state written is a cache miss; the block uses what it captured where
/// it lies (the request is split before it, for the same reason).
#[inline(never)]
fn stream_task(
    w: Rc<Worker>,
    info: Rc<ConnInfo>,
    req: http::Request<RecvStream>,
    mut respond: SendResponse<Bytes>,
    guard: StreamGuard,
) -> impl Future<Output = ()> {
    let (parts, mut body) = req.into_parts();
    async move {
        let guard = guard;
        let grpc = parts
            .headers
            .get(http::header::CONTENT_TYPE)
            .is_some_and(|v| grpc::is_grpc_content_type(v.as_bytes()));
        // Extended CONNECT (the HTTP/2 way to tunnel) is not offered. (An `upgrade` field never
        // gets here: h2 resets a stream carrying one as malformed, RFC 9113 §8.2.2.)
        if parts.method == http::Method::CONNECT {
            local_error(
                &mut respond,
                &w,
                (&parts, info.peer.addr),
                ErrorKind::NotImplemented,
                "protocol upgrades are not supported over HTTP/2; use HTTP/1.1",
                grpc,
            );
            return;
        }
        // `:path` is origin-form, or `*` for OPTIONS (RFC 9113 §8.3.1): an absolute URI there
        // would route by a host other than `:authority`.
        let path = parts.uri.path_and_query().map_or("", |p| p.as_str());
        if !(path.starts_with('/') || path == "*" && parts.method == http::Method::OPTIONS) {
            local_error(
                &mut respond,
                &w,
                (&parts, info.peer.addr),
                ErrorKind::BadRequest,
                "the :path pseudo-header must be an absolute path",
                grpc,
            );
            return;
        }
        let head_request = parts.method == http::Method::HEAD;
        let chunked =
            !body.is_end_stream() && !parts.headers.contains_key(http::header::CONTENT_LENGTH);
        let Some((head, written)) = h1_head(&parts, chunked) else {
            local_error(
                &mut respond,
                &w,
                (&parts, info.peer.addr),
                ErrorKind::BadRequest,
                "the host field differs from the :authority pseudo-header",
                grpc,
            );
            return;
        };
        let (vconn, end) = bridge::pair(info.sni.clone(), info.tls, grpc, Some(guard.0.clone()));
        // The request head becomes the pipe's first bytes as it is (the proxy side is not running
        // yet; HTTP/2 bounds header lists).
        end.put_first(head, written);
        // One task runs the proxy side and both directions of the stream: one allocation per
        // stream, not two.
        // Built where it is pinned (a local moved into `pin!` is copied, about 7 KiB), and
        // without a wrapper future around it: each layer's first poll copies its arguments into
        // the state, and with hundreds of streams in flight every line of a stream's state
        // written is a cache miss.
        let mut proxy = std::pin::pin!(crate::proxy::serve_client(
            w.clone(),
            crate::net::client::ClientStream::Virtual(vconn),
            info.peer,
            info.strict_sni,
            None,
            None
        ));
        let mut up = std::pin::pin!(pump_request(&end, &mut body, chunked));
        let send_timeout = w.current().gen.http.send_timeout;
        let mut down = std::pin::pin!(relay_response(&end, respond, head_request, send_timeout));
        let (mut proxy_done, mut up_done, mut down_done) = (false, false, false);
        poll_fn(|cx| {
            if !proxy_done && proxy.as_mut().poll(cx).is_ready() {
                proxy_done = true;
            }
            if !down_done && down.as_mut().poll(cx).is_ready() {
                down_done = true;
                // Nothing more can reach the client: the proxy's writes fail from now on, so
                // an exchange the client abandoned ends (and resets its upstream stream); and
                // the request body stops mattering, so the proxy sees its end (it would wait for
                // bytes no longer pumped).
                end.close_read();
                end.close_write();
            }
            // The request body stops mattering once the response is complete.
            if !up_done && !down_done && up.as_mut().poll(cx).is_ready() {
                up_done = true;
            }
            if proxy_done && down_done {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await;
        // The exchange's line, with what the client got: the status of the HEADERS sent and the
        // DATA bytes (HPACK encodes the head; its bytes are not the proxy's to count).
        if let Some((line, status, sent)) = end.take_line() {
            w.log_finish(line, status, sent);
        }
    }
}

/// Request DATA into the proxy (chunk-framed when the length is unknown); the window is
/// released as the proxy takes the bytes.
async fn pump_request(end: &bridge::StreamEnd, body: &mut RecvStream, chunked: bool) {
    while let Some(data) = body.data().await {
        let Ok(data) = data else {
            // The client reset the stream: the proxy sees the body end early.
            end.close_write();
            return;
        };
        let n = data.len();
        if n == 0 {
            continue;
        }
        let ok = if chunked {
            let size = format!("{n:x}\r\n");
            end.write_all(size.as_bytes()).await
                && end.write_all(&data).await
                && end.write_all(b"\r\n").await
        } else {
            end.write_all(&data).await
        };
        if !ok {
            return;
        }
        let _ = body.flow_control().release_capacity(n);
    }
    if chunked && !end.write_all(b"0\r\n\r\n").await {
        return;
    }
    end.close_write();
}

/// The proxy's HTTP/1.1 response into HEADERS and DATA frames. A client's reset is watched
/// for from the start: it ends the proxy's wait for the upstream (see
/// [`crate::proxy::gone::unless_gone`]), so a cancelled request stops upstream too.
async fn relay_response(
    end: &bridge::StreamEnd,
    mut respond: SendResponse<Bytes>,
    head_request: bool,
    send_timeout: Duration,
) {
    let mut watch = ResetWatch::default();
    let mut buf = BytesMut::new();
    let mut rh = ResponseHead::default();
    let method = if head_request {
        Method::Head
    } else {
        Method::Get
    };
    // What was read is parsed before more is awaited: a final head may have come in the
    // same read as the 100 before it (the proxy side may be done and gone by then).
    let (resp, framing) = loop {
        match parse_response(&buf, MAX_HEADERS_HARD_LIMIT, method, &mut rh) {
            Ok(Some(len)) if (100..200).contains(&rh.status) => {
                // An informational HEADERS frame: ringway's own 100 Continue (its answer to
                // `expect: 100-continue`), or an upstream's interim response (103 Early
                // Hints) with its fields. (A 101 never comes this way: no upgrade over h2.)
                let interim = match rh.status {
                    100 => http::Response::builder().status(100).body(()).ok(),
                    101 => None,
                    _ => h2_response(&rh, &buf[..len], None, None),
                };
                buf.advance(len);
                if let Some(interim) = interim {
                    let _ = respond.send_informational(interim);
                }
                continue;
            }
            Ok(Some(len)) => {
                // A response the proxy wrote as bytes (its own answers: errors, redirects).
                watch.pause();
                let Some(resp) = h2_response(&rh, &buf[..len], None, None) else {
                    respond.send_reset(h2::Reason::INTERNAL_ERROR);
                    return;
                };
                buf.advance(len);
                break (resp, rh.framing);
            }
            Ok(None) => {}
            Err(_) => {
                respond.send_reset(h2::Reason::INTERNAL_ERROR);
                return;
            }
        }
        let next = read_unless_reset(end, &mut buf, &mut watch, |cx| respond.poll_reset(cx)).await;
        match next {
            Some(Read::Bytes) => {}
            // A relayed response, typed: only a part of a head could be left unparsed.
            Some(Read::Head(start)) if buf.is_empty() => {
                watch.pause();
                break (start.head, start.body);
            }
            Some(Read::Head(_)) => {
                respond.send_reset(h2::Reason::INTERNAL_ERROR);
                return;
            }
            // The client reset the stream while the response was awaited.
            None => return,
            Some(Read::End) => {
                // No response: the client went away (nothing can be sent).
                respond.send_reset(h2::Reason::CANCEL);
                return;
            }
        }
    };
    // An empty body ends with the HEADERS frame (gRPC's trailers-only responses must).
    let no_body = matches!(framing, BodyFraming::None | BodyFraming::Length(0));
    let status = resp.status().as_u16();
    let Ok(mut send) = respond.send_response(resp, no_body) else {
        return;
    };
    end.responded(status);
    if no_body {
        return;
    }
    let mut remaining = match framing {
        BodyFraming::Length(n) => n,
        _ => u64::MAX,
    };
    let mut decoder = ChunkedDecoder::new();
    let mut trailer_bytes = Vec::new();
    loop {
        // Data ready in `buf`: send what belongs to the body.
        let data = match framing {
            BodyFraming::Length(_) => {
                let n = (buf.len() as u64).min(remaining) as usize;
                remaining -= n as u64;
                take_front(&mut buf, n)
            }
            BodyFraming::Chunked => match dechunk(&mut decoder, &mut buf, &mut trailer_bytes) {
                Ok(data) => data,
                Err(()) => {
                    send.send_reset(h2::Reason::INTERNAL_ERROR);
                    return;
                }
            },
            _ => std::mem::take(&mut buf).freeze(),
        };
        // The last bytes of a Content-Length body end the stream in their own DATA frame
        // (not in an empty one after them: one frame less per response).
        let last = matches!(framing, BodyFraming::Length(_)) && remaining == 0;
        let n = data.len() as u64;
        if (!data.is_empty() || last) && !send_data(&mut send, data, last, send_timeout).await {
            return;
        }
        end.sent_data(n);
        if last {
            return;
        }
        // (A Content-Length body ended above.)
        let done = matches!(framing, BodyFraming::Chunked) && decoder.is_done();
        if done {
            // Trailer fields of a chunked body become HTTP/2 trailers (gRPC's status).
            let sent = trailers(&trailer_bytes).is_some_and(|map| send.send_trailers(map).is_ok());
            if !sent {
                let _ = send.send_data(Bytes::new(), true);
            }
            return;
        }
        // Sending may have left the stream's waker with h2's capacity wait: look again.
        watch.disarm();
        match read_unless_reset(end, &mut buf, &mut watch, |cx| send.poll_reset(cx)).await {
            Some(Read::Bytes) => {}
            None => return, // the client reset the stream
            Some(Read::End) if matches!(framing, BodyFraming::UntilClose) && !end.aborted() => {
                let _ = send.send_data(Bytes::new(), true);
                return;
            }
            Some(Read::Head(_)) | Some(Read::End) => {
                // Cut short upstream: the client must not take it for complete.
                send.send_reset(h2::Reason::INTERNAL_ERROR);
                return;
            }
        }
    }
}

/// The first `n` bytes of `buf`, taken out of it. All of them are taken as the buffer they
/// are in (a split would first make the buffer shared: an allocation per DATA frame).
fn take_front(buf: &mut BytesMut, n: usize) -> Bytes {
    if n == buf.len() {
        std::mem::take(buf).freeze()
    } else {
        buf.split_to(n).freeze()
    }
}

/// The proxy's next response bytes into `buf` (or its typed head, or their end), unless the
/// client resets the stream first (`None`): a cancelled call is noticed while the upstream is
/// quiet, not only at its next bytes.
async fn read_unless_reset(
    end: &bridge::StreamEnd,
    buf: &mut BytesMut,
    watch: &mut ResetWatch,
    mut reset: impl FnMut(&mut Context<'_>) -> Poll<Result<h2::Reason, h2::Error>>,
) -> Option<Read> {
    let mut read = std::pin::pin!(end.read_into(buf));
    poll_fn(|cx| {
        if let Poll::Ready(more) = read.as_mut().poll(cx) {
            return Poll::Ready(Some(more));
        }
        watch.poll(cx, &mut reset).map(|()| None)
    })
    .await
}

/// Watches an HTTP/2 stream for the client's reset while its task waits for other things,
/// at one `poll_reset` per registration rather than one per poll of the task (a stream's
/// task is polled for every step of its upstream exchange). h2 is handed a waker of the
/// watch's own: it wakes the task and notes that h2 (not the exchange) woke it, so that
/// only then is the stream looked at again.
#[derive(Default)]
struct ResetWatch {
    flag: Option<(Arc<ResetFlag>, Waker)>,
    /// h2 holds our waker and has not woken it since.
    armed: bool,
}

struct ResetFlag {
    woken: AtomicBool,
    /// Whether a wake reaches the task: not while the watch is not looked at (h2 keeps the
    /// last waker it was given, and wakes it for more than resets).
    live: AtomicBool,
    task: Waker,
}

impl Wake for ResetFlag {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Relaxed);
        if self.live.load(Ordering::Relaxed) {
            self.task.wake_by_ref();
        }
    }
}

impl ResetWatch {
    /// `Ready` once the stream was reset (or its connection failed).
    fn poll(
        &mut self,
        cx: &mut Context<'_>,
        reset: impl FnOnce(&mut Context<'_>) -> Poll<Result<h2::Reason, h2::Error>>,
    ) -> Poll<()> {
        let fresh = !matches!(&self.flag, Some((f, _)) if f.task.will_wake(cx.waker()));
        if fresh {
            let flag = Arc::new(ResetFlag {
                woken: AtomicBool::new(false),
                live: AtomicBool::new(true),
                task: cx.waker().clone(),
            });
            self.flag = Some((flag.clone(), Waker::from(flag)));
            self.armed = false;
        }
        let Some((flag, waker)) = &self.flag else {
            return Poll::Pending;
        };
        flag.live.store(true, Ordering::Relaxed);
        let woken = flag.woken.swap(false, Ordering::Relaxed);
        if self.armed && !woken {
            return Poll::Pending;
        }
        match reset(&mut Context::from_waker(waker)) {
            Poll::Ready(_) => Poll::Ready(()),
            Poll::Pending => {
                self.armed = true;
                Poll::Pending
            }
        }
    }

    /// Something else may have taken the stream's waker slot in h2 (a capacity wait): the
    /// next poll registers again.
    fn disarm(&mut self) {
        self.armed = false;
    }

    /// Not looked at until the next poll: h2's wakes meanwhile do not reach the task.
    fn pause(&self) {
        if let Some((flag, _)) = &self.flag {
            flag.live.store(false, Ordering::Relaxed);
        }
    }
}

/// The HTTP/2 response for a parsed HTTP/1.1 response head (`head` holds its bytes).
/// `edits`: the head is an upstream's, to be given the edits the proxy makes to a relayed
/// head ([`crate::http1::write_response_head`]'s: its own framing, date and request id);
/// without, it is the proxy's own response as written.
///
/// `date`: the worker's Date value, added to an upstream's head without one.
///
/// Connection-specific fields are left out, and the request id is never indexed by HPACK
/// (unique per response, it would only churn the connection's header table). Each value is
/// a copy of its own: HPACK's table keeps the values it indexes, and a value sharing a larger
/// buffer would keep all of it alive. `None` for a field HTTP/2 cannot carry.
pub fn h2_response(
    rh: &ResponseHead,
    head: &[u8],
    edits: Option<&ResponseEdits<'_>>,
    date: Option<http::HeaderValue>,
) -> Option<http::Response<()>> {
    use crate::http1::HeaderKind;
    use http::header::{CONTENT_LENGTH, DATE};
    let mut resp = http::Response::new(());
    *resp.status_mut() = http::StatusCode::from_u16(rh.status).ok()?;
    let map = resp.headers_mut();
    map.reserve(rh.headers.len() + 3);
    let mut dated = false;
    for h in &rh.headers {
        dated |= h.kind == HeaderKind::Date;
        // An upstream's head keeps what a relayed HTTP/1.1 head keeps; the proxy's own keeps
        // its framing length and request id.
        let kept = match edits {
            Some(_) => crate::http1::encode::kept_when_relayed(h),
            None => !h.hop && h.kind != HeaderKind::TransferEncoding,
        };
        if !kept {
            continue;
        }
        let mut value = http::HeaderValue::from_bytes(h.value.get(head)).ok()?;
        let name = if h.kind == HeaderKind::XRequestId {
            value.set_sensitive(true);
            http::HeaderName::from_static("x-request-id")
        } else {
            http::HeaderName::from_bytes(h.name.get(head)).ok()?
        };
        map.append(name, value);
    }
    if let Some(edits) = edits {
        if !dated {
            if let Some(date) = date {
                map.append(DATE, date);
            }
        }
        if let BodyFraming::Length(n) = edits.framing {
            // (`From<u64>` would allocate twice.)
            let mut digits = [0; 20];
            let n = crate::http1::encode::decimal(n, &mut digits);
            map.append(CONTENT_LENGTH, http::HeaderValue::from_bytes(n).ok()?);
        }
        let mut rid = http::HeaderValue::from_bytes(edits.request_id).ok()?;
        rid.set_sensitive(true);
        map.append(http::HeaderName::from_static("x-request-id"), rid);
    }
    Some(resp)
}

/// Decodes the chunked bytes at the front of `buf`: returns the chunk data, keeps trailer
/// field lines in `trailers`, and leaves an incomplete tail in `buf`.
fn dechunk(
    decoder: &mut ChunkedDecoder,
    buf: &mut BytesMut,
    trailers: &mut Vec<u8>,
) -> Result<Bytes, ()> {
    let mut data = BytesMut::new();
    let mut read = 0;
    while read < buf.len() && !decoder.is_done() {
        match decoder.step(&buf[read..]).map_err(|_| ())? {
            Step::Data(n) => {
                data.extend_from_slice(&buf[read..read + n]);
                read += n;
            }
            Step::Trailer(n) => {
                trailers.extend_from_slice(&buf[read..read + n]);
                read += n;
            }
            step => read += step.bytes(),
        }
    }
    buf.advance(read);
    Ok(data.freeze())
}

/// Trailer field lines (`name: value\r\n`...) as an HTTP/2 trailer map; `None` if there is none.
fn trailers(lines: &[u8]) -> Option<http::HeaderMap> {
    let mut map = http::HeaderMap::new();
    for line in lines.split(|&b| b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        // Connection-specific fields have no place in HTTP/2 (RFC 9113 §8.2.2), nor framing
        // and routing ones in trailers.
        if !crate::http1::HeaderKind::classify(line[..colon].trim_ascii()).fits_a_trailer() {
            continue;
        }
        let (Ok(name), Ok(value)) = (
            http::HeaderName::from_bytes(&line[..colon]),
            http::HeaderValue::from_bytes(line[colon + 1..].trim_ascii()),
        ) else {
            continue;
        };
        map.append(name, value);
    }
    (!map.is_empty()).then_some(map)
}

/// Why [`send_windowed`] stopped.
#[derive(Debug)]
pub enum SendFail {
    /// The stream is gone (reset, or the connection failed).
    Closed(Option<h2::Error>),
    /// The peer granted no window (or read nothing) for the allowed stall.
    Stalled,
}

/// Sends `data` on `send` as the peer's window allows (`end`: then ends the stream); each
/// wait for window is bounded by `stall`.
pub async fn send_windowed(
    send: &mut h2::SendStream<Bytes>,
    mut data: Bytes,
    end: bool,
    stall: Duration,
) -> Result<(), SendFail> {
    while !data.is_empty() {
        send.reserve_capacity(data.len());
        // Window already assigned to the stream is used as it is: h2 tells of capacity only
        // when it grows, and a reservation no larger than the one before (the byte a stream's
        // opening reserved, then a one-byte body) assigns nothing new, so a wait for that
        // would last until the stall bound.
        let held = send.capacity();
        if held > 0 {
            let piece = data.split_to(held.min(data.len()));
            send.send_data(piece, end && data.is_empty())
                .map_err(|e| SendFail::Closed(Some(e)))?;
            if data.is_empty() {
                return Ok(());
            }
            continue;
        }
        // Capacity at hand (the usual case) needs no timer.
        let now = poll_fn(|cx| Poll::Ready(send.poll_capacity(cx))).await;
        let cap = match now {
            Poll::Ready(c) => c,
            Poll::Pending => {
                // Boxed: the timer stays out of every stream's future (rarely needed).
                let wait = poll_fn(|cx| send.poll_capacity(cx));
                Box::pin(monoio::time::timeout(stall, wait))
                    .await
                    .map_err(|_| SendFail::Stalled)?
            }
        };
        let cap = match cap {
            Some(Ok(c)) => c,
            Some(Err(e)) => return Err(SendFail::Closed(Some(e))),
            None => return Err(SendFail::Closed(None)),
        };
        if cap == 0 {
            continue;
        }
        let piece = data.split_to(cap.min(data.len()));
        // The last piece carries END_STREAM itself (no empty DATA frame after it).
        send.send_data(piece, end && data.is_empty())
            .map_err(|e| SendFail::Closed(Some(e)))?;
        if data.is_empty() {
            return Ok(());
        }
    }
    if end {
        send.send_data(Bytes::new(), true)
            .map_err(|e| SendFail::Closed(Some(e)))?;
    }
    Ok(())
}

/// Sends response `data` to the client; false when the stream is gone, or reset because the
/// client granted no window (or read nothing) for `stall`.
async fn send_data(
    send: &mut h2::SendStream<Bytes>,
    data: Bytes,
    end_of_stream: bool,
    stall: Duration,
) -> bool {
    match send_windowed(send, data, end_of_stream, stall).await {
        Ok(()) => true,
        Err(SendFail::Closed(_)) => false,
        Err(SendFail::Stalled) => {
            send.send_reset(h2::Reason::CANCEL);
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::http1::{parse_request, request_from_parts, HeadLimits, RequestHead};

    fn response(raw: &[u8]) -> http::Response<()> {
        let mut rh = ResponseHead::default();
        let len = parse_response(raw, MAX_HEADERS_HARD_LIMIT, Method::Get, &mut rh)
            .unwrap()
            .unwrap();
        h2_response(&rh, &raw[..len], None, None).expect("convertible")
    }

    /// The head `h1_head` writes for `parts`, read both ways: parsed as bytes, and from the
    /// parts it recorded. The two agree (same answer, same head), whatever the limits.
    fn check_written(parts: &http::request::Parts, chunked: bool, limits: &HeadLimits) {
        let Some((bytes, written)) = h1_head(parts, chunked) else {
            // Refused only for a Host that names another authority.
            let authority = parts.uri.authority().expect("an :authority").as_str();
            let hosts = parts.headers.get_all(http::header::HOST);
            let other =
                |h: &http::HeaderValue| !h.as_bytes().eq_ignore_ascii_case(authority.as_bytes());
            assert!(hosts.iter().any(other), "{parts:?}");
            return;
        };
        assert_eq!(written.len, bytes.len());
        let mut parsed = RequestHead::default();
        let by_bytes = parse_request(&bytes, limits, &mut parsed);
        let mut read = RequestHead::default();
        let by_parts = request_from_parts(&bytes, &written, limits, &mut read);
        assert_eq!(
            by_bytes,
            by_parts.map(Some),
            "{:?}",
            String::from_utf8_lossy(&bytes)
        );
        if by_bytes.is_ok() {
            assert_eq!(format!("{parsed:?}"), format!("{read:?}"));
        }
    }

    fn request(method: &str, uri: &str, fields: &[(&str, &str)]) -> http::request::Parts {
        let mut b = http::Request::builder().method(method).uri(uri);
        for (n, v) in fields {
            b = b.header(*n, *v);
        }
        b.body(()).unwrap().into_parts().0
    }

    #[test]
    fn h2_queues_a_streams_share_of_the_budget_within_a_frame_and_the_window() {
        let cfg = |budget: usize, streams: u32, window: u32| crate::config::Http2Config {
            enabled: true,
            max_concurrent_streams: streams,
            initial_stream_window: window,
            initial_connection_window: 1 << 20,
            max_buffered_bytes: budget,
            max_frame_size: 16_384,
            max_header_list_bytes: 16_384,
            max_pending_accept_reset_streams: 20,
            max_local_error_reset_streams: 1024,
        };
        // The defaults: 1 MiB over 100 streams is below the floor.
        assert_eq!(send_buffer_per_stream(&cfg(1 << 20, 100, 262_144)), 16_384);
        assert_eq!(send_buffer_per_stream(&cfg(1 << 20, 8, 262_144)), 131_072);
        assert_eq!(send_buffer_per_stream(&cfg(1 << 30, 8, 262_144)), 262_144);
    }

    #[test]
    fn a_written_head_reads_as_its_bytes_parse() {
        let limits = HeadLimits::default();
        let get = request(
            "GET",
            "http://a.example:8080/p/q?x=1",
            &[("cookie", "a=1"), ("accept", " */* "), ("cookie", "b=2")],
        );
        check_written(&get, false, &limits);
        let post = request("POST", "/up", &[("content-type", "text/plain")]);
        check_written(&post, true, &limits);
        // Refusals agree too: a bad length, framing twice, an expectation, too many fields,
        // a request line too long.
        let bad = request("POST", "/", &[("content-length", "x")]);
        check_written(&bad, false, &limits);
        check_written(
            &request("POST", "/", &[("content-length", "3")]),
            true,
            &limits,
        );
        check_written(&request("GET", "/", &[("expect", "later")]), false, &limits);
        let few = HeadLimits {
            max_headers: 1,
            ..HeadLimits::default()
        };
        check_written(&get, false, &few);
        let short = HeadLimits {
            max_request_line_bytes: 8,
            max_headers: 1,
            ..HeadLimits::default()
        };
        check_written(&get, false, &short);
    }

    #[test]
    fn a_host_field_must_name_the_authority() {
        let head = |host: &str| {
            let parts = request("GET", "http://a.example:8080/", &[("host", host)]);
            h1_head(&parts, false).map(|(bytes, _)| bytes)
        };
        // Host names are case-insensitive; the head carries the authority once.
        let same = head("A.Example:8080").expect("the same authority");
        assert_eq!(&same[..], b"GET / HTTP/1.1\r\nhost: a.example:8080\r\n\r\n");
        assert_eq!(head("b.example:8080"), None);
        assert_eq!(head("a.example"), None);
        // Without an :authority, Host is the request's.
        let parts = request("GET", "/", &[("host", "b.example")]);
        let (bytes, _) = h1_head(&parts, false).expect("a head");
        assert_eq!(&bytes[..], b"GET / HTTP/1.1\r\nhost: b.example\r\n\r\n");
    }

    fn field_name() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("content-length".to_string()),
            Just("transfer-encoding".to_string()),
            Just("connection".to_string()),
            Just("expect".to_string()),
            Just("cookie".to_string()),
            Just("host".to_string()),
            Just("upgrade".to_string()),
            Just("x-forwarded-for".to_string()),
            Just("x-request-id".to_string()),
            "[a-z][a-z0-9-]{0,12}",
        ]
    }

    proptest! {
        #[test]
        fn written_heads_read_as_their_bytes_parse(
            method in prop_oneof![
                Just("GET".to_string()),
                Just("POST".to_string()),
                Just("HEAD".to_string()),
                "[A-Z]{1,8}",
            ],
            authority in proptest::option::of("[a-z0-9.-]{1,12}(:[0-9]{1,5})?"),
            path in "/[a-zA-Z0-9/._~%!$&'()*+,;=:@?-]{0,30}",
            fields in proptest::collection::vec(
                (field_name(), prop_oneof!["[0-9]{1,4}", "[ \t!-~]{0,16}"]),
                0..10,
            ),
            chunked in any::<bool>(),
            max_headers in prop_oneof![Just(3usize), Just(100)],
            max_line in prop_oneof![Just(16usize), Just(8192)],
            max_head in prop_oneof![Just(96usize), Just(16 * 1024)],
        ) {
            let uri = match &authority {
                Some(a) => format!("http://{a}{path}"),
                None => path,
            };
            let mut b = http::Request::builder().method(method.as_str()).uri(uri);
            for (n, v) in &fields {
                b = b.header(n.as_str(), v.as_str());
            }
            let Ok(req) = b.body(()) else {
                return Ok(());
            };
            let limits = HeadLimits {
                max_headers,
                max_request_line_bytes: max_line,
                max_head_bytes: max_head,
                encoded_slashes: false,
                path_parameters: false,
                reject_repeated_slashes: false,
            };
            check_written(&req.into_parts().0, chunked, &limits);
        }
    }

    /// The size of what `f` returns (a future's, for an `async fn`).
    fn returned_size<A, B, C, R>(_: fn(A, B, C) -> R) -> usize {
        std::mem::size_of::<R>()
    }

    #[test]
    fn a_connections_future_holds_its_transport_once_and_boxed() {
        // Every idle HTTP/2 connection holds this future. Its transport (a TLS one is 1.3
        // KiB) comes boxed, so the future's size does not depend on it; passed by value, it
        // was held twice (its argument slot and the connection), and the handshake's state
        // a third time: 9 KiB over TLS.
        let cleartext = returned_size(serve::<io::Prefixed>);
        let tls = returned_size(serve::<io::PollTls>);
        assert_eq!(cleartext, tls);
        assert!(tls <= 6 * 1024, "{tls} bytes");
    }

    #[test]
    fn take_front_takes_a_part_or_the_whole_buffer() {
        let mut buf = BytesMut::from(&b"hello world"[..]);
        assert_eq!(&take_front(&mut buf, 6)[..], b"hello ");
        assert_eq!(&buf[..], b"world");
        assert_eq!(&take_front(&mut buf, 5)[..], b"world");
        assert!(buf.is_empty());
        assert!(take_front(&mut buf, 0).is_empty());
    }

    #[test]
    fn response_heads_keep_end_to_end_fields_only() {
        let resp = response(
            b"HTTP/1.1 203 Fine\r\nContent-Type: text/plain\r\nConnection: close, X-Drop\r\n\
              Keep-Alive: timeout=5\r\nTransfer-Encoding: chunked\r\nSet-Cookie: a=1\r\n\
              Set-Cookie: b=2\r\nX-Request-Id: abc\r\nX-Drop: 1\r\n\r\n",
        );
        assert_eq!(resp.status(), 203);
        let h = resp.headers();
        assert_eq!(h["content-type"], "text/plain");
        let cookies: Vec<_> = h.get_all("set-cookie").iter().collect();
        assert_eq!(cookies, ["a=1", "b=2"]);
        for gone in ["connection", "keep-alive", "transfer-encoding", "x-drop"] {
            assert!(!h.contains_key(gone), "{gone} is connection-specific");
        }
        assert_eq!(h["x-request-id"], "abc");
        assert!(
            h["x-request-id"].is_sensitive(),
            "the request id is never indexed"
        );
        assert!(!h["content-type"].is_sensitive());
    }
}
