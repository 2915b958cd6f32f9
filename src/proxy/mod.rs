//! The request path: one task per client connection runs the HTTP/1.1 lifecycle.
//!
//! ```text
//! ReadHead ─► Parse ─► Reserved? ─► Route ─► respond | forward ─► KeepAlive | Close
//! ```
//!
//! Ownership: a [`ClientConn`] belongs to its connection task; the worker's state is reached
//! through `Rc<Worker>`. Every failure before a response head reached the client becomes one
//! classified response (`respond.rs`); a failure after it closes the connection. One request,
//! at most one response.

mod forward;
mod forward_h2;
pub mod gone;
pub mod io;
mod reserved;
pub mod respond;
pub mod tunnel;

use std::net::SocketAddr;
use std::pin::pin;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use monoio::io::AsyncWriteRent;
use monoio::net::TcpStream;

use crate::buf::Block;
use crate::error::ErrorKind;
use crate::http1::{
    check_partial, may_complete_head, parse_request, request_from_parts, BodyFraming,
    ChunkedDecoder, HeaderKind, Method, RequestHead, ResponseHead, Version,
};
use crate::net::client::{ClientStream, Peer};
use crate::observe::access_log::{Outcome, Pending, Request};
use crate::observe::metrics::add;
use crate::observe::request_id::RequestId;
use crate::route::{Action, HeaderLookup, RouteRequest, MAX_LOCAL_HEADERS};
use crate::tls::{TlsListener, TlsStream};
use crate::worker::deadline;
use crate::worker::event::or_event;
use crate::worker::{Admitted, CoreGen, Worker};
use io::{read_by, IdleWait};

/// Largest request body read and thrown away to keep a connection open after a local
/// response; a larger one closes the connection instead.
pub const DISCARD_MAX_BYTES: u64 = 256 * 1024;

/// How long a closing connection keeps reading (and discarding) what the client still sends,
/// so that our response is not destroyed by a reset (lingering close).
pub const LINGER_TIME: Duration = Duration::from_secs(2);

/// Most bytes read during a lingering close.
pub const LINGER_MAX_BYTES: usize = 256 * 1024;

/// A client connection.
#[derive(Debug)]
pub struct ClientConn {
    stream: ClientStream,
    /// Read buffer: request heads and body bytes. `None` only after an operation holding it
    /// was cancelled; the connection then closes.
    rbuf: Option<Block>,
    head: RequestHead,
    resp: ResponseHead,
    peer: Peer,
    accepted: Instant,
    /// Unread client bytes may follow: close with a lingering close.
    linger: bool,
    /// The parsed head's bytes are still at the front of `rbuf`.
    head_pending: bool,
    /// The client pipelined: a request of it was read while another was still unanswered.
    pipelined: bool,
    /// The protocols the current request offers to upgrade to (see [`Offered`]).
    offered: Offered,
    /// A response was cut short: the connection is reset on close, never lingered.
    aborted: bool,
    /// A 101 went to the client: the connection continues as this tunnel. (Boxed: 160 bytes
    /// written at the start of every HTTP/2 stream's exchange, for the rare upgrade.)
    tunnel: Option<Box<tunnel::Tunnel>>,
    /// TLS with `strict_sni`: a request for another host than the SNI name gets 421.
    strict_sni: bool,
    /// The listener it came from (not for an HTTP/2 stream: its connection watches that).
    listener: Option<Admitted>,
    /// What the access log says of the exchange in progress.
    log: ExchangeLog,
    /// Cancels an idle wait's read to give its block back (`http.idle_buffer_release`).
    idle_cancel: io::IdleCancel,
    /// Counts the connection closed when it drops (last: after the socket closed). `None`
    /// for an HTTP/2 stream.
    guard: Option<ConnGuard>,
}

impl ClientConn {
    /// Whether the connection ends after the exchange in progress: the worker drains, or a
    /// reload removed its listener or changed its terms.
    pub(crate) fn winding_down(&self, w: &Worker) -> bool {
        w.draining() || self.listener.as_ref().is_some_and(Admitted::retired)
    }
}

/// What the access log says of an exchange, gathered as it runs (reset for each request, and
/// kept whether or not the log is on: a few stores).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ExchangeLog {
    /// The status of the response head sent (0: none).
    pub(crate) status: u16,
    /// Bytes written to the client for the response (for an HTTP/2 stream, those of its
    /// body: the h2 crate encodes the head).
    pub(crate) sent: u64,
    /// The route's upstream, by index in the generation.
    pub(crate) upstream: Option<usize>,
    /// The endpoint of the last attempt.
    pub(crate) endpoint: Option<SocketAddr>,
    /// The failure an error response answered, or that cut the response short.
    pub(crate) error: Option<ErrorKind>,
}

impl ExchangeLog {
    /// `bytes` of the response went out, its head with `status` among them.
    pub(crate) fn wrote(&mut self, status: u16, bytes: u64) {
        self.status = status;
        self.sent += bytes;
    }

    /// A write to the client failed: it went away (unless a failure was already recorded).
    pub(crate) fn client_left(&mut self) {
        self.error.get_or_insert(ErrorKind::ClientClosed);
    }
}

impl ClientConn {
    /// Whether the client pipelined on this connection: now (the read buffer holds bytes
    /// past the current request, once its body is out of it: `body_taken`, no body or one
    /// buffered whole) or before. Such a client wants the answers to all it sent, even if it
    /// shut down its side after sending (as `printf ... | nc -N` does).
    fn pipelines(&mut self, head_len: usize, body_taken: bool) -> bool {
        let head = if self.head_pending { head_len } else { 0 };
        if body_taken && self.rbuf.as_ref().is_some_and(|b| b.len() > head) {
            self.pipelined = true;
        }
        self.pipelined
    }

    /// Drops the current request head from the read buffer (once).
    fn consume_head(&mut self, len: usize) {
        if self.head_pending {
            if let Some(rbuf) = self.rbuf.as_mut() {
                rbuf.consume(len);
            }
            self.head_pending = false;
        }
    }
}

/// The protocols an upgrade request offers (its `Upgrade` tokens, `h2c` aside), kept past
/// its head as fingerprints: a 101 may only switch to protocols among them (RFC 9110 §7.8).
/// The first [`Offered::MAX`] are kept; a 101 naming a later one is refused.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Offered {
    hashes: [u64; Offered::MAX],
    len: u8,
}

impl Offered {
    const MAX: usize = 4;

    fn hash(token: &[u8]) -> u64 {
        token.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
            (h ^ u64::from(b.to_ascii_lowercase())).wrapping_mul(0x0100_0000_01b3)
        })
    }

    /// The fingerprints of `tokens`.
    pub(crate) fn of<'a>(tokens: impl Iterator<Item = &'a [u8]>) -> Self {
        let mut o = Offered::default();
        for t in tokens.take(Self::MAX) {
            o.hashes[usize::from(o.len)] = Self::hash(t);
            o.len += 1;
        }
        o
    }

    /// Whether `token` (case aside) was offered.
    pub(crate) fn contains(&self, token: &[u8]) -> bool {
        let h = Self::hash(token);
        self.hashes[..usize::from(self.len)].contains(&h)
    }
}

/// What the rest of the exchange needs to know about the request once its head bytes are
/// gone from the buffer.
#[derive(Debug, Clone, Copy)]
pub struct ReqInfo {
    /// Method.
    pub method: Method,
    /// Client's HTTP version.
    pub version: Version,
    /// Client allows persistence.
    pub keep_alive: bool,
    /// Body framing.
    pub framing: BodyFraming,
    /// Client waits for `100 Continue` before sending the body.
    pub expect_continue: bool,
    /// Request id.
    pub rid: RequestId,
    /// A gRPC call: HTTP/2 with an `application/grpc` content type (see
    /// [`crate::h2::grpc::is_grpc_content_type`]). Its errors are
    /// trailers-only responses with `grpc-status`, not the JSON envelope.
    pub grpc: bool,
    /// Its `grpc-timeout`, as a deadline.
    pub grpc_deadline: Option<Instant>,
}

/// A client connection counted open (`Worker::connection_opened`, at accept): counted closed
/// when this drops, in whichever task the connection ends.
pub struct ConnGuard(Rc<Worker>);

impl Drop for ConnGuard {
    fn drop(&mut self) {
        self.0.connection_closed();
    }
}

impl std::fmt::Debug for ConnGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ConnGuard")
    }
}

/// Serves one client connection until it closes, after its TLS handshake when `tls` is set.
/// The worker counted it open at accept (`Worker::connection_opened`); its [`ConnGuard`]
/// counts it closed when it ends, in this task or in the one an HTTP/2 connection moves to.
pub async fn serve_connection(
    w: Rc<Worker>,
    stream: TcpStream,
    peer: SocketAddr,
    tls: Option<Arc<TlsListener>>,
    admitted: Admitted,
) {
    let guard = ConnGuard(w.clone());
    let _ = stream.set_nodelay(true);
    let strict_sni = tls.as_ref().is_some_and(|t| t.strict_sni);
    let stream = match tls {
        None => ClientStream::Plain(stream),
        Some(t) => {
            use std::os::fd::AsRawFd;
            let fd = stream.as_raw_fd();
            match TlsStream::accept(stream, t.config.clone(), t.handshake_timeout).await {
                Ok(s) if s.alpn() == Some(crate::h2::ALPN_H2) => {
                    add(&w.metrics().tls_handshakes, 1);
                    // A task of its own, sized for HTTP/2 (see `serve_h2_tls`).
                    let w2 = w.clone();
                    crate::worker::runtime::spawn_large(move || {
                        serve_h2_tls(w2, s, peer, strict_sni, admitted, guard)
                    });
                    return;
                }
                Ok(s) => {
                    add(&w.metrics().tls_handshakes, 1);
                    ClientStream::Tls(Box::new(s), fd)
                }
                Err(e) => {
                    add(&w.metrics().tls_handshake_failures, 1);
                    tracing::debug!(peer = %peer, error = %e, "TLS handshake failed");
                    return;
                }
            }
        }
    };
    serve_client(
        w,
        stream,
        Peer::new(peer),
        strict_sni,
        Some(admitted),
        Some(guard),
    )
    .await;
}

/// Serves an h2c connection, counted open while it runs (`guard`).
async fn serve_h2c(
    w: Rc<Worker>,
    io: Box<crate::h2::io::Prefixed>,
    info: crate::h2::ConnInfo,
    _guard: Option<ConnGuard>,
) {
    crate::h2::serve(w, io, info).await;
}

/// Continues a TLS connection that agreed on HTTP/2 in poll style for the h2 crate, in a
/// task of its own: the task of the handshake, whose future is sized for the HTTP/1.1
/// request path, ends (an idle HTTP/2 connection held both). Counted open while it runs
/// (`_guard`).
async fn serve_h2_tls(
    w: Rc<Worker>,
    s: TlsStream,
    peer: SocketAddr,
    strict_sni: bool,
    admitted: Admitted,
    _guard: ConnGuard,
) {
    let sni: Option<Rc<str>> = s.sni().map(Rc::from);
    let Some((tls, tcp, pending)) = s.into_parts() else {
        return;
    };
    let Ok(poll) = tcp.try_into_poll_io() else {
        return;
    };
    let io = Box::new(crate::h2::io::PollTls::new(poll, tls, pending));
    let info = crate::h2::ConnInfo {
        peer: Peer::new(peer),
        sni,
        tls: true,
        strict_sni,
        listener: Some(admitted),
    };
    crate::h2::serve(w, io, info).await;
}

/// The HTTP/1.1 request loop of one client connection: a TCP or TLS one, or one HTTP/2
/// stream as a virtual HTTP/1.1 connection (`ClientStream::Virtual`, see `h2::bridge`; not
/// counted as a connection: its HTTP/2 connection is).
///
/// The connection's state is put together before the future and captured by it, and the
/// loop is an `async` block: an `async fn` would hold the arguments in slots of their own,
/// move them into its locals at the first poll and then into the state (with hundreds of
/// HTTP/2 streams in flight, each line of a stream's state written is a cache miss).
pub fn serve_client(
    w: Rc<Worker>,
    stream: ClientStream,
    client: Peer,
    strict_sni: bool,
    listener: Option<Admitted>,
    guard: Option<ConnGuard>,
) -> impl std::future::Future<Output = ()> {
    let peer = client.addr;
    let mut conn = ClientConn {
        strict_sni,
        listener,
        stream,
        rbuf: Some(w.pool.take()),
        head: RequestHead::default(),
        resp: ResponseHead::default(),
        peer: client,
        accepted: w.now(),
        linger: false,
        head_pending: false,
        pipelined: false,
        offered: Offered::default(),
        aborted: false,
        tunnel: None,
        log: ExchangeLog::default(),
        idle_cancel: io::IdleCancel::default(),
        guard,
    };
    async move {
        let mut fair = crate::worker::fair::FairShare::default();
        let mut first = true;
        loop {
            match read_head(&w, &mut conn, first).await {
                HeadRead::Ready => {}
                HeadRead::Closed => break,
                HeadRead::H2c => {
                    let ClientConn {
                        stream,
                        rbuf,
                        listener,
                        guard,
                        ..
                    } = conn;
                    let (ClientStream::Plain(tcp), Some(rbuf)) = (stream, rbuf) else {
                        return;
                    };
                    let Ok(poll) = tcp.try_into_poll_io() else {
                        return;
                    };
                    // The bytes read so far are replayed to h2; the block goes back.
                    let io = Box::new(crate::h2::io::Prefixed::new(rbuf.data().to_vec(), poll));
                    drop(rbuf);
                    let info = crate::h2::ConnInfo {
                        peer: client,
                        sni: None,
                        tls: false,
                        strict_sni: false,
                        listener,
                    };
                    // A task of its own, sized for HTTP/2: this one's future, sized for the
                    // HTTP/1.1 request path, is freed as it returns (an idle HTTP/2
                    // connection held both).
                    crate::worker::runtime::spawn_large(move || serve_h2c(w, io, info, guard));
                    return;
                }
                HeadRead::Rejected(kind) => {
                    let rid = w.ids.next();
                    tracing::debug!(peer = %peer, kind = kind.code(), "request rejected");
                    let cg = w.current();
                    let line = w
                        .logs_requests()
                        .then(|| begin_line(&w, &conn, &rid, false));
                    conn.log = ExchangeLog::default();
                    respond::error(&w, &cg, &mut conn, kind, None, &rid, true).await;
                    if let Some(mut line) = line {
                        line.outcome(&outcome(&cg, &conn.log));
                        finish_line(&w, &conn, line);
                    }
                    conn.linger = true;
                    break;
                }
            }
            first = false;
            let client_keep_alive = conn.head.keep_alive;
            let cg = w.current();
            let mut line = None;
            conn.log = ExchangeLog::default();
            let keep = dispatch(&w, &cg, &mut conn, &mut line).await;
            if let Some(line) = line.as_mut() {
                line.outcome(&outcome(&cg, &conn.log));
            }
            drop(cg);
            if let Some(t) = conn.tunnel.take() {
                let idle = w.gen().http.tunnel_idle_timeout;
                let ClientConn {
                    stream, rbuf, log, ..
                } = conn;
                let pending = rbuf.filter(|b| !b.is_empty());
                let sent = Box::pin(tunnel::run(&w, stream, pending, *t, idle)).await;
                // A tunnel's line is written when it closes, with the bytes it carried.
                if let Some(line) = line {
                    w.log_finish(line, log.status, log.sent + sent);
                }
                return;
            }
            if let Some(line) = line {
                finish_line(&w, &conn, line);
            }
            if matches!(conn.stream, ClientStream::Virtual(_)) {
                break; // an HTTP/2 stream carries one exchange
            }
            if !keep || conn.winding_down(&w) {
                // A client that did not ask to close may have pipelined more: read it away before
                // closing, or the kernel answers it with a reset that can destroy our response.
                conn.linger |=
                    client_keep_alive || conn.rbuf.as_ref().is_some_and(|b| !b.is_empty());
                break;
            }
            if fair.turn() {
                fair.look(&w).await;
            }
        }
        if conn.aborted {
            return;
        }
        if conn.linger {
            linger_close(&w, conn).await;
        } else if conn.stream.is_tls() {
            // A TLS connection ends with close_notify: a response delimited by the close (an
            // HTTP/1.0 client's) is then told apart from one cut short. Bounded, as in
            // `linger_close`.
            let _ = deadline::timeout(LINGER_TIME, conn.stream.shutdown()).await;
        }
    }
}

enum HeadRead {
    Ready,
    Closed,
    /// The HTTP/2 connection preface on a cleartext connection (h2c, prior knowledge).
    H2c,
    Rejected(ErrorKind),
}

/// Reads until a complete request head is buffered (pipelined bytes first).
///
/// Deadlines: a connection's first request must arrive whole within `header_timeout` of the
/// accept; later ones may wait `idle_timeout` for their first byte (and close quietly on
/// shutdown), then get `header_timeout` for the rest. A first request is read even while
/// draining: its connection came from the accept queue and is answered (with `close`), not reset.
async fn read_head(w: &Worker, conn: &mut ClientConn, first: bool) -> HeadRead {
    let mut head_deadline = first.then(|| conn.accepted + w.gen().http.header_timeout);
    // Leading bytes of the buffered data already known not to end a head.
    let mut scanned = 0;
    let mut ack = crate::net::sys::QuickAck::default();
    loop {
        // The generation in force, looked at again after each wait: an idle connection does
        // not keep an old one alive (nor its timeouts) after a reload.
        let cg = w.current();
        let http = &cg.gen.http;
        let Some(mut rbuf) = conn.rbuf.take() else {
            return HeadRead::Closed;
        };
        if !rbuf.is_empty() {
            let data = rbuf.data();
            // h2c by prior knowledge: the HTTP/2 preface opens a cleartext connection. A
            // part of it so far is not parsed as HTTP/1.1 (it would be a 505): read on.
            let preface =
                first && matches!(conn.stream, ClientStream::Plain(_)) && cg.gen.http2.enabled && {
                    let n = data.len().min(crate::h2::PREFACE.len());
                    data[..n] == crate::h2::PREFACE[..n]
                };
            if preface && data.len() >= crate::h2::PREFACE.len() {
                conn.rbuf = Some(rbuf);
                return HeadRead::H2c;
            }
            // A head ringway wrote itself (an HTTP/2 stream's, the connection's only one) is
            // read from its known parts once all of it is here.
            let written = match &conn.stream {
                ClientStream::Virtual(v) if first => {
                    v.take_written().filter(|h| h.len <= data.len())
                }
                _ => None,
            };
            let parsed = if preface {
                Ok(None)
            } else if let Some(written) = written {
                request_from_parts(data, &written, &http.limits, &mut conn.head).map(Some)
            } else if may_complete_head(data, scanned) {
                parse_request(data, &http.limits, &mut conn.head)
            } else {
                check_partial(data, &http.limits).map(|()| None)
            };
            match parsed {
                Ok(Some(_)) => {
                    conn.rbuf = Some(rbuf);
                    conn.head_pending = true;
                    return HeadRead::Ready;
                }
                Ok(None) => scanned = data.len(),
                Err(e) => {
                    tracing::debug!(error = %e, "invalid request head");
                    conn.rbuf = Some(rbuf);
                    return HeadRead::Rejected(e.into());
                }
            }
            head_deadline.get_or_insert_with(|| w.now() + http.header_timeout);
        }
        w.head_block(&mut rbuf);
        if rbuf.spare() == 0 {
            rbuf.compact();
            if rbuf.spare() == 0 {
                conn.rbuf = Some(rbuf);
                return HeadRead::Rejected(ErrorKind::HeadTooLarge);
            }
        }
        let partial = !rbuf.is_empty();
        if partial {
            // The head came in pieces: the rest must not wait for a delayed ACK (see
            // `quickack`).
            ack.before_wait(conn.stream.socket_fd());
        }
        let idle_timeout = http.idle_timeout;
        let (header_timeout, idle_release) = (http.header_timeout, http.idle_buffer_release);
        drop(cg);
        let (res, buf) = match head_deadline {
            Some(deadline) => pin!(read_by(&mut conn.stream, rbuf, deadline, &w.pool)).await,
            None => {
                // An idle keep-alive connection: closed on shutdown, or when its listener
                // goes or changes terms (during the exchange before, or while it waits:
                // shutdown stops every listener too).
                if conn.winding_down(w) {
                    return HeadRead::Closed;
                }
                let deadline = w.now() + idle_timeout;
                let retire = match &conn.listener {
                    Some(l) => l.retire_event(),
                    None => &w.shutdown,
                };
                if let ClientStream::Tls(tls, _) = &mut conn.stream {
                    // A TLS connection gives its block back while it waits, and waits for
                    // its next plaintext inside its TLS state: the socket read fills the
                    // ciphertext buffer it keeps anyway, so this costs no operation more,
                    // and idle TLS connections hold no head block each. (A cleartext one
                    // can only cancel its read after a while, at a cost: below.)
                    drop(rbuf);
                    let readable = pin!(tls.wait_readable());
                    match or_event(retire, deadline::within(deadline, readable)).await {
                        Some(Some(Ok(()))) => {
                            // Bytes came: a block for them, and the head's time starts.
                            conn.rbuf = Some(w.pool.take());
                            head_deadline = Some(w.now() + header_timeout);
                            continue;
                        }
                        _ => return HeadRead::Closed,
                    }
                }
                let release = idle_release.map(|d| w.now() + d).filter(|r| *r < deadline);
                if let (ClientStream::Plain(tcp), Some(release)) = (&mut conn.stream, release) {
                    let wait =
                        io::release_idle(tcp, rbuf, release, deadline, &mut conn.idle_cancel);
                    match or_event(retire, pin!(wait)).await {
                        Some(IdleWait::Read(res, buf)) => (res, buf),
                        Some(IdleWait::Ready) => {
                            // Bytes came: a block for them, and the head's time starts.
                            conn.rbuf = Some(w.pool.take());
                            head_deadline = Some(w.now() + header_timeout);
                            continue;
                        }
                        Some(IdleWait::Over) | None => return HeadRead::Closed,
                    }
                } else {
                    // Pinned here: `or_event` would move a future given by value.
                    match or_event(
                        retire,
                        pin!(read_by(&mut conn.stream, rbuf, deadline, &w.pool)),
                    )
                    .await
                    {
                        Some(r) => r,
                        None => return HeadRead::Closed,
                    }
                }
            }
        };
        conn.rbuf = Some(buf);
        match res {
            Ok(0) => return HeadRead::Closed,
            Ok(n) => add(&w.metrics().bytes_in, n as u64),
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut && partial => {
                return HeadRead::Rejected(ErrorKind::RequestTimeout)
            }
            Err(_) => return HeadRead::Closed,
        }
    }
}

/// Starts the access log line of the request in `conn` (`parsed`: its head is; a request
/// rejected before has no method, host or target).
fn begin_line(w: &Worker, conn: &ClientConn, rid: &RequestId, parsed: bool) -> Pending {
    let head = &conn.head;
    let src = conn.rbuf.as_ref().map_or(&[][..], |b| b.data());
    let (method, host, target) = if parsed {
        (
            head.method_span.get(src),
            head.host.get(src),
            head.target.get(src),
        )
    } else {
        (&[][..], &[][..], &[][..])
    };
    let protocol = match &conn.stream {
        ClientStream::Virtual(_) => "HTTP/2",
        _ if parsed && head.version == Version::Http10 => "HTTP/1.0",
        _ => "HTTP/1.1",
    };
    w.log_begin(&Request {
        request_id: rid.as_bytes(),
        client: conn.peer.addr,
        protocol,
        method,
        host,
        target,
    })
}

/// Adds the finished access log line of the exchange in `conn`. An HTTP/2 stream's goes to
/// the stream's side, which adds what the client got once it has it (`h2::stream`).
fn finish_line(w: &Worker, conn: &ClientConn, line: Pending) {
    match &conn.stream {
        ClientStream::Virtual(v) => v.hand_line(line),
        _ => w.log_finish(line, conn.log.status, conn.log.sent),
    }
}

/// Where the exchange in `log` went, for its access log line.
fn outcome<'a>(cg: &'a CoreGen, log: &ExchangeLog) -> Outcome<'a> {
    Outcome {
        upstream: log
            .upstream
            .and_then(|i| cg.gen.upstreams.get(i))
            .map(|u| u.name.as_str()),
        endpoint: log.endpoint,
        error: log.error.map(|k| k.code()),
    }
}

/// Handles one parsed request on the generation in force when it arrived (`cg`); returns
/// whether the connection may serve another. Starts the request's access log `line` when
/// the log is on.
async fn dispatch(
    w: &Rc<Worker>,
    cg: &Rc<CoreGen>,
    conn: &mut ClientConn,
    line: &mut Option<Pending>,
) -> bool {
    let keep = dispatch_on(w, cg, conn, line).await;
    w.request_done(cg);
    keep
}

/// Whether a request for `host` (port and a final dot ignored, any case) came on a TLS
/// connection whose SNI name is another one (RFC 9110 §15.5.20: 421): certificates are chosen by
/// SNI, so such a request could reach a host whose certificate the client never checked. A
/// request without a host (HTTP/1.0) names no other one: it takes the routes of no host.
fn misdirected(sni: Option<&str>, host: &[u8]) -> bool {
    let Some(sni) = sni else {
        return false;
    };
    if host.is_empty() {
        return false;
    }
    let (host, _) = crate::http1::head::split_host_port(host);
    let host = host.strip_suffix(b".").unwrap_or(host);
    !host.eq_ignore_ascii_case(sni.trim_end_matches('.').as_bytes())
}

/// Header fields of a parsed request head, for route criteria and hash keys.
struct HeadView<'a> {
    head: &'a RequestHead,
    src: &'a [u8],
    /// For route criteria: whether the peer is a trusted proxy. The forwarding fields are
    /// then seen as the upstream will see them: `X-Real-IP` never (ringway sets it), and
    /// `X-Forwarded-*` and `Forwarded` only from a trusted peer (ringway replaces or drops
    /// an untrusted peer's). `None`: every field as sent.
    trusted: Option<bool>,
}

impl HeaderLookup for HeadView<'_> {
    fn values<'s>(&'s self, name: &'s [u8]) -> impl Iterator<Item = &'s [u8]> + 's {
        self.head
            .headers
            .iter()
            .filter(move |h| h.name.get(self.src).eq_ignore_ascii_case(name))
            .filter(move |h| {
                let Some(trusted) = self.trusted else {
                    return true;
                };
                match h.kind {
                    HeaderKind::XRealIp | HeaderKind::ForwardedAlias => false,
                    HeaderKind::XForwardedFor
                    | HeaderKind::XForwardedProto
                    | HeaderKind::Forwarded
                    | HeaderKind::XForwardedOrigin => trusted && !h.hop,
                    _ => true,
                }
            })
            .map(|h| h.value.get(self.src))
    }
}

async fn dispatch_on(
    w: &Rc<Worker>,
    cg: &Rc<CoreGen>,
    conn: &mut ClientConn,
    line: &mut Option<Pending>,
) -> bool {
    let Some(rbuf) = conn.rbuf.as_ref() else {
        return false;
    };
    let src = rbuf.data();
    let head = &conn.head;
    let rid = head
        .find(HeaderKind::XRequestId)
        .and_then(|h| RequestId::from_inbound(h.value.get(src)))
        .unwrap_or_else(|| w.ids.next());
    if w.logs_requests() {
        *line = Some(begin_line(w, conn, &rid, true));
    }
    // (Decided by the HTTP/2 side from the stream's content type.)
    let grpc = conn.stream.is_grpc();
    let grpc_deadline = if grpc {
        head.headers
            .iter()
            .find(|h| h.name.get(src).eq_ignore_ascii_case(b"grpc-timeout"))
            .and_then(|h| crate::h2::grpc::parse_timeout(h.value.get(src)))
            // The clock's time, not the worker's tick (up to 25 ms behind): a short deadline
            // must not be cut short.
            .map(|d| Instant::now() + d)
    } else {
        None
    };
    let offered = if head.upgrade {
        Offered::of(head.upgrade_protocols(src))
    } else {
        Offered::default()
    };
    let info = ReqInfo {
        method: head.method,
        version: head.version,
        keep_alive: head.keep_alive,
        framing: head.framing,
        expect_continue: head.expect_continue,
        rid,
        grpc,
        grpc_deadline,
    };
    let path = head.routed_path(src);
    let head_len = head.len;

    if let Some(endpoint) = reserved::match_path(path).filter(|_| cg.gen.http.reserved_paths) {
        return reserved::answer(w, cg, conn, endpoint, &info, head_len).await;
    }
    if conn.strict_sni && misdirected(conn.stream.sni(), head.host.get(src)) {
        tracing::debug!(request_id = ?rid.as_str(), "host differs from the TLS server name");
        return answer_local(
            w,
            cg,
            conn,
            &info,
            head_len,
            Answer::Error(ErrorKind::Misdirected),
        )
        .await;
    }

    let view = HeadView {
        head,
        src,
        trusted: Some(forward::peer_trusted(cg, conn)),
    };
    let req = RouteRequest {
        method: head.method_span.get(src),
        host: head.host.get(src),
        path,
        query: head.query.get(src),
        headers: &view,
    };
    // `OPTIONS *` (asterisk form) asks about the server, not a resource: no route serves it
    // (a catch-all regex would otherwise match `*` and send it upstream as a path).
    let found = if path == b"*" {
        None
    } else {
        let mut scratch = cg.scratch.borrow_mut();
        cg.gen.routes.lookup(&req, &mut scratch.route)
    };
    let Some(m) = found else {
        tracing::debug!(request_id = ?rid.as_str(), "no route");
        return answer_local(
            w,
            cg,
            conn,
            &info,
            head_len,
            Answer::Error(ErrorKind::NoRoute),
        )
        .await;
    };
    let route = m.route;
    if let Some(mt) = &route.maintenance {
        return answer_local(w, cg, conn, &info, head_len, Answer::Maintenance(mt)).await;
    }
    if route
        .limits
        .max_head_bytes
        .is_some_and(|max| head_len > max)
    {
        return answer_local(
            w,
            cg,
            conn,
            &info,
            head_len,
            Answer::Error(ErrorKind::HeadTooLarge),
        )
        .await;
    }
    // A declared body beyond the route's limit is refused before any of it is read, whatever
    // the route does (a chunked one is measured as it streams to an upstream; a local answer
    // reads and drops a bounded body).
    let max_body = route.limits.max_body(cg.gen.http.max_request_body_bytes);
    if let (Some(max), BodyFraming::Length(n)) = (max_body, info.framing) {
        if n > max {
            let too_large = Answer::Error(ErrorKind::BodyTooLarge);
            return answer_local(w, cg, conn, &info, head_len, too_large).await;
        }
    }
    match &route.action {
        Action::Respond(local) => {
            let mut fields: [(&[u8], &[u8]); MAX_LOCAL_HEADERS] = [(&[], &[]); MAX_LOCAL_HEADERS];
            let n = local.headers.len().min(MAX_LOCAL_HEADERS);
            for (slot, (k, v)) in fields.iter_mut().zip(local.headers.iter()) {
                *slot = (k.as_bytes(), v.as_bytes());
            }
            let resp = respond::Local {
                status: local.status,
                content_type: None,
                headers: &fields[..n],
                body: &local.body,
            };
            answer_local(w, cg, conn, &info, head_len, Answer::Local(resp)).await
        }
        Action::Redirect(rd) => {
            let mut location = w.pool.take();
            let tls = conn.stream.is_tls();
            let written = rd.write_location(
                head.host.get(src),
                path,
                head.query.get(src),
                tls,
                |piece| location.put(piece),
            );
            if written.is_err() {
                return answer_local(
                    w,
                    cg,
                    conn,
                    &info,
                    head_len,
                    Answer::Error(ErrorKind::UriTooLong),
                )
                .await;
            }
            let fields: [(&[u8], &[u8]); 1] = [(b"location", location.data())];
            let resp = respond::Local {
                status: rd.status,
                content_type: None,
                headers: &fields,
                body: b"",
            };
            answer_local(w, cg, conn, &info, head_len, Answer::Local(resp)).await
        }
        Action::Proxy(action) => {
            conn.offered = offered;
            forward::proxy(w, cg, conn, &info, route, action, m.params).await
        }
    }
}

/// A response ringway writes itself.
#[derive(Debug)]
enum Answer<'a> {
    /// The error envelope.
    Error(ErrorKind),
    /// A route in maintenance: 503 with Retry-After and the operator's message.
    Maintenance(&'a crate::route::Maintenance),
    /// A ready response.
    Local(respond::Local<'a>),
}

/// Answers a request locally, then reads and discards its body (bounded) so the connection can
/// go on; closes it when the body is too large to discard or the client waits for 100-continue.
async fn answer_local(
    w: &Worker,
    cg: &CoreGen,
    conn: &mut ClientConn,
    info: &ReqInfo,
    head_len: usize,
    answer: Answer<'_>,
) -> bool {
    conn.consume_head(head_len);
    let discardable = match info.framing {
        BodyFraming::None | BodyFraming::Length(0) => true,
        BodyFraming::Length(n) => n <= DISCARD_MAX_BYTES && !info.expect_continue,
        BodyFraming::Chunked => !info.expect_continue,
        BodyFraming::UntilClose => false,
    };
    let mut keep = info.keep_alive && discardable && !conn.winding_down(w);
    if let Answer::Error(kind) = answer {
        keep &= !kind.closes_downstream();
    }
    let sent = match answer {
        Answer::Error(kind) => {
            respond::error(w, cg, conn, kind, Some(info), &info.rid, !keep).await
        }
        Answer::Maintenance(m) => respond::maintenance(w, cg, conn, m, info, !keep).await,
        Answer::Local(resp) => respond::send(w, cg, conn, resp, Some(info), &info.rid, !keep).await,
    };
    if !sent {
        return false;
    }
    if !keep {
        conn.linger = info.framing.has_body();
        return false;
    }
    if discard_body(w, cg, conn, info.framing).await {
        true
    } else {
        conn.linger = true;
        false
    }
}

/// Reads and drops a request body of at most [`DISCARD_MAX_BYTES`].
async fn discard_body(
    w: &Worker,
    cg: &CoreGen,
    conn: &mut ClientConn,
    framing: BodyFraming,
) -> bool {
    let mut remaining = match framing {
        BodyFraming::None | BodyFraming::Length(0) => return true,
        BodyFraming::Length(n) => n,
        BodyFraming::Chunked => u64::MAX,
        BodyFraming::UntilClose => return false,
    };
    let mut decoder = ChunkedDecoder::new();
    let mut total = 0u64;
    loop {
        let Some(mut rbuf) = conn.rbuf.take() else {
            return false;
        };
        if rbuf.is_empty() {
            let deadline = w.now() + cg.gen.http.body_timeout;
            if remaining != u64::MAX {
                rbuf.limit_next_read(remaining.min(usize::MAX as u64) as usize);
            }
            let (res, buf) = pin!(read_by(&mut conn.stream, rbuf, deadline, &w.pool)).await;
            rbuf = buf;
            match res {
                Ok(0) | Err(_) => {
                    conn.rbuf = Some(rbuf);
                    return false;
                }
                Ok(n) => add(&w.metrics().bytes_in, n as u64),
            }
        }
        let consumed = if framing == BodyFraming::Chunked {
            let data = rbuf.data();
            let mut used = 0;
            while used < data.len() && !decoder.is_done() {
                match decoder.step(&data[used..]) {
                    Ok(step) => used += step.bytes(),
                    Err(_) => {
                        conn.rbuf = Some(rbuf);
                        return false;
                    }
                }
            }
            used
        } else {
            let n = (rbuf.len() as u64).min(remaining) as usize;
            remaining -= n as u64;
            n
        };
        rbuf.consume(consumed);
        total += consumed as u64;
        conn.rbuf = Some(rbuf);
        let done = if framing == BodyFraming::Chunked {
            decoder.is_done()
        } else {
            remaining == 0
        };
        if done {
            return true;
        }
        if total > DISCARD_MAX_BYTES {
            return false;
        }
    }
}

/// Half-closes, then reads and drops what the client still sends for a short while, so that the
/// response written last is not lost to a reset.
async fn linger_close(w: &Worker, mut conn: ClientConn) {
    // Bounded: over TLS the shutdown writes close_notify, which a client that reads nothing
    // would never take.
    let _ = deadline::timeout(LINGER_TIME, conn.stream.shutdown()).await;
    if matches!(conn.stream, ClientStream::Virtual(_)) {
        // An HTTP/2 stream has no kernel reset to guard against; its request side ends with
        // the stream.
        return;
    }
    let deadline = w.now() + LINGER_TIME;
    let mut buf = conn.rbuf.take().unwrap_or_else(|| w.pool.take());
    let mut total = 0;
    while total < LINGER_MAX_BYTES {
        buf.clear();
        let (res, b) = pin!(read_by(&mut conn.stream, buf, deadline, &w.pool)).await;
        buf = b;
        match res {
            Ok(0) | Err(_) => break,
            Ok(n) => total += n,
        }
    }
}
