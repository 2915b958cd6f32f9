//! Forwarding to HTTP/2 upstreams (`protocol = "h2c"`): the request parsed from HTTP/1.1 (a
//! client's, or an HTTP/2 stream's through the bridge) goes out as one stream on a pooled,
//! multiplexed connection, and the response comes back as HTTP/1.1 with its trailers in a
//! chunked trailer section (so gRPC's `grpc-status` survives to an HTTP/2 client).
//!
//! The attempt loop mirrors `forward::proxy`: the breaker before every attempt, a pick that
//! avoids endpoints tried, retries by the same policy and budget (a stream the upstream
//! did not process, refused or beyond its GOAWAY, is sent again whatever the method), a
//! wait for a connection like an HTTP/1.1 request's when every endpoint is at its limit,
//! passive health and the breaker fed with each outcome.

use std::cell::Cell;
use std::future::{poll_fn, Future};
use std::pin::{pin, Pin};
use std::rc::Rc;
use std::task::Poll;
use std::time::{Duration, Instant};

use bytes::Bytes;
use h2::RecvStream;
use monoio::io::AsyncReadRent;

use super::forward::{
    backoff, cancelled, fail, forwarding, interim_head, log_upstream, record, relayed_interim,
    rewrite_target, upstream_host, write_interim, AcquireFail, BodyPlan, Retry, RetrySlot,
    SlotWait, Ticket, Waited, MAX_INTERIM_RESPONSES,
};
use super::gone::{unless_gone, ClientGone};
use super::io::{race, read_by, write_all_by, Either, Stall};
use super::{respond, ClientConn, ReqInfo};
use crate::buf::Block;
use crate::error::{Error, ErrorKind, Side};
use crate::h2::bridge::VirtualReader;
use crate::http1::encode::{put_field, put_status_line, put_u64};
use crate::http1::{
    filter_in_place, BodyFraming, ChunkedDecoder, HeaderKind, Keep, Method, Version,
    MAX_HEADERS_HARD_LIMIT,
};
use crate::observe::metrics::add;
use crate::route::{Params, ProxyAction, Route};
use crate::upstream::h2pool::StreamSlot;
use crate::upstream::{
    Admit, ConnectError, EndpointRt, FailureClass, InFlight, PickError, Tried, UpstreamRt,
};
use crate::worker::deadline::{timeout_at, within};
use crate::worker::{CoreGen, Worker};

/// How long a bidirectional call's client may send nothing while its response streams down
/// (the response's own timeouts end the exchange first).
const QUIET_WHILE_RESPONDING: Duration = Duration::from_secs(24 * 3600);

/// What `forward::proxy` worked out before handing over.
pub(super) struct Plan {
    pub(super) key: Option<u64>,
    pub(super) method_retryable: bool,
    pub(super) total_deadline: Instant,
    pub(super) try_timeout: Duration,
    pub(super) read_timeout: Duration,
    pub(super) max_body: Option<u64>,
    pub(super) grpc_deadline: Option<Instant>,
}

/// The request as it goes upstream, built once per attempt (the authority may differ);
/// `:scheme` is `https` over TLS.
#[allow(clippy::too_many_arguments)]
fn build_request(
    tls: bool,
    cg: &CoreGen,
    conn: &ClientConn,
    info: &ReqInfo,
    (route, action, params): (&Route, &ProxyAction, &Params),
    authority: &str,
    grpc_timeout: Option<Duration>,
) -> Result<http::Request<()>, Error> {
    let bad =
        |why: &'static str| Error::new(ErrorKind::BadRequest, Side::Downstream).with_cause(why);
    let rbuf = conn.rbuf.as_ref().ok_or_else(|| bad("no request buffer"))?;
    let src = rbuf.data();
    let head = &conn.head;
    let mut scratch = cg.scratch.borrow_mut();
    let text = rewrite_target(&mut scratch, conn, src, route, action, params);
    let host = upstream_host(conn, src, action, authority);
    let (trusted, forwarded_proto) = forwarding(cg, conn);
    let mut uri = Vec::with_capacity(16 + host.len() + text.len() + head.query.len as usize);
    uri.extend_from_slice(if tls { b"https://" } else { b"http://" });
    uri.extend_from_slice(host);
    uri.extend_from_slice(text);
    uri.extend_from_slice(head.query.get(src));
    let mut b = http::Request::builder()
        .method(head.method_span.get(src))
        .uri(uri.as_slice())
        .version(http::Version::HTTP_2);
    let mut te_trailers = false;
    let mut xff = String::new();
    for h in &head.headers {
        let value = h.value.get(src);
        match h.kind {
            HeaderKind::Te => {
                te_trailers |= value
                    .split(|&c| c == b',')
                    .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"trailers"));
                continue;
            }
            HeaderKind::XForwardedFor => {
                // (Named in Connection, it was for the hop before: as if not sent.)
                if trusted && !h.hop && !value.is_empty() {
                    xff.push_str(&String::from_utf8_lossy(value));
                    xff.push_str(", ");
                }
                continue;
            }
            // The length is stated again below from the parsed framing: a list of equal
            // values (`5, 5`), valid for HTTP/1.1, is malformed in HTTP/2.
            HeaderKind::Host
            | HeaderKind::ContentLength
            | HeaderKind::Expect
            | HeaderKind::XRealIp
            | HeaderKind::XRequestId
            | HeaderKind::ForwardedAlias => continue,
            HeaderKind::XForwardedProto if !trusted => continue,
            HeaderKind::Forwarded | HeaderKind::XForwardedOrigin if !trusted => continue,
            _ if h.hop => continue,
            // Stated again below: the time left.
            _ if grpc_timeout.is_some()
                && h.name.get(src).eq_ignore_ascii_case(b"grpc-timeout") =>
            {
                continue
            }
            _ => {}
        }
        b = b.header(h.name.get(src), value);
    }
    if let Some(left) = grpc_timeout {
        b = b.header("grpc-timeout", crate::h2::grpc::format_timeout(left));
    }
    if let BodyFraming::Length(n) = head.framing {
        b = b.header(http::header::CONTENT_LENGTH, n);
    }
    if te_trailers {
        b = b.header("te", "trailers");
    }
    let peer = conn.peer.text();
    xff.push_str(peer);
    b = b.header("x-forwarded-for", xff).header("x-real-ip", peer);
    if let Some(proto) = forwarded_proto {
        b = b.header("x-forwarded-proto", proto);
    }
    let mut req = b
        .body(())
        .map_err(|_| bad("request not representable in HTTP/2"))?;
    // Unique per request: never indexed, or it would churn the connection's HPACK table.
    let mut rid = http::HeaderValue::from_str(info.rid.as_str())
        .map_err(|_| bad("request id not representable"))?;
    rid.set_sensitive(true);
    req.headers_mut()
        .insert(http::HeaderName::from_static("x-request-id"), rid);
    Ok(req)
}

/// Sends `data` as the upstream stream's window allows; a window withheld for `send_timeout`
/// fails the exchange (as a stalled write to an HTTP/1.1 upstream does).
async fn send_all(
    cg: &CoreGen,
    send: &mut h2::SendStream<Bytes>,
    data: Bytes,
    end: bool,
) -> Result<(), Error> {
    use crate::h2::SendFail;
    match crate::h2::send_windowed(send, data, end, cg.gen.http.send_timeout).await {
        Ok(()) => Ok(()),
        Err(SendFail::Closed(Some(e))) => {
            Err(Error::new(ErrorKind::UpstreamClosed, Side::Upstream).with_cause(e))
        }
        Err(SendFail::Closed(None)) => Err(Error::new(ErrorKind::UpstreamClosed, Side::Upstream)
            .with_cause("stream closed while sending")),
        Err(SendFail::Stalled) => Err(Error::new(ErrorKind::UpstreamTimeout, Side::Upstream)
            .with_cause("the upstream granted no window for the request body in time")),
    }
}

/// An endpoint (its in-flight count taken) and a stream on one of its connections, or why
/// there is no stream on it (a failed connect); `Err` when there is no endpoint to try, or
/// every one stayed at its limit as long as a request may wait (like an HTTP/1.1 request's
/// wait for a connection: a worker without a connection of its own waits for the cap across
/// workers to let it open one), and when the endpoint was picked. `Err(None)`: the client
/// went while the request waited.
#[allow(clippy::type_complexity)]
async fn acquire(
    w: &Worker,
    up: &UpstreamRt,
    key: Option<u64>,
    tried: &mut Tried,
    gone: Option<&ClientGone<'_>>,
    by: Instant,
) -> Result<
    (
        Rc<EndpointRt>,
        InFlight,
        Result<(h2::client::SendRequest<Bytes>, StreamSlot), Error>,
        Instant,
    ),
    AcquireFail,
> {
    let mut wait = SlotWait::by(by);
    loop {
        let now = Instant::now();
        match wait.pick(up, key, tried, w, now) {
            Some(Ok(ep)) => {
                let inflight = ep.begin(w.id, up);
                // The connect too ends by the request's own deadline (unblamed).
                let stream = {
                    let opening = std::pin::pin!(up.h2_stream(&ep, w.pool.block_size()));
                    within(by, opening).await
                };
                let Some(stream) = stream else {
                    return Err(AcquireFail::Deadline);
                };
                let err = match stream {
                    Ok(stream) => {
                        tried.add(&ep);
                        return Ok((ep, inflight, Ok(stream), now));
                    }
                    Err(ConnectError::Busy) => {
                        // At the cap across workers, or every stream taken: wait (the token
                        // is not spent), first in line.
                        up.unpick(&ep, now, w.shared.epoch);
                        wait.lost_it();
                        None
                    }
                    Err(e) => Some(super::forward::connect_error(&ep, e)),
                };
                if let Some(err) = err {
                    tried.add(&ep);
                    return Ok((ep, inflight, Err(err), now));
                }
            }
            Some(Err(PickError::NoEndpoints)) => return Err(AcquireFail::NoEndpoints),
            Some(Err(PickError::Busy)) | None => {}
        }
        match wait.wait(w, up, gone).await {
            Waited::Again => {}
            Waited::GiveUp => return Err(AcquireFail::Saturated),
            Waited::Deadline => return Err(AcquireFail::Deadline),
            Waited::ClientGone => return Err(AcquireFail::ClientGone),
        }
    }
}

/// Waits until `send` may carry DATA: open (not queued behind the peer's stream limit) with
/// some window (`true`), or closed before that (`false`: its response says why).
async fn stream_open(send: &mut h2::SendStream<Bytes>) -> Result<bool, h2::Error> {
    send.reserve_capacity(1);
    std::future::poll_fn(|cx| loop {
        match send.poll_capacity(cx) {
            std::task::Poll::Ready(Some(Ok(0))) => continue,
            std::task::Poll::Ready(Some(Ok(_))) => return std::task::Poll::Ready(Ok(true)),
            std::task::Poll::Ready(Some(Err(e))) => return std::task::Poll::Ready(Err(e)),
            std::task::Poll::Ready(None) => return std::task::Poll::Ready(Ok(false)),
            std::task::Poll::Pending => return std::task::Poll::Pending,
        }
    })
    .await
}

/// Whether an early response head has a body still to come (END_STREAM not yet seen).
fn still_to_stream(resp: &Option<HeadResult>) -> bool {
    matches!(resp, Some(Ok(r)) if !r.body().is_end_stream())
}

/// `head` by `deadline` (`None`: whenever it comes); `None` when the deadline passed first.
async fn head_by(head: Pin<&mut FinalHead>, deadline: Option<Instant>) -> Option<HeadResult> {
    match deadline {
        Some(d) => within(d, head).await,
        None => Some(head.await),
    }
}

/// Why an HTTP/2 upstream's response head did not come.
#[derive(Debug)]
enum HeadFail {
    /// The stream or the connection failed.
    H2(h2::Error),
    /// More interim (1xx) responses than an upstream may send.
    Interim,
}

type HeadResult = Result<http::Response<RecvStream>, HeadFail>;

/// The final response head of an HTTP/2 upstream stream. Interim (1xx) responses are taken
/// off as they come (the h2 crate queues them on the stream until it is polled), at most
/// `MAX_INTERIM_RESPONSES`, as from an HTTP/1.1 upstream; awaited as a future, none is
/// passed on (see [`FinalHead::poll_next`]).
struct FinalHead {
    resp: h2::client::ResponseFuture,
    interim: usize,
    /// Interim responses to pass on, taken off while they could not be (see
    /// [`Self::drain_interim`]); at most `MAX_INTERIM_RESPONSES`.
    held: std::collections::VecDeque<http::Response<()>>,
}

/// What came next on an HTTP/2 upstream stream ([`FinalHead::poll_next`]).
enum NextHead {
    /// An interim response to pass on to the client.
    Interim(http::Response<()>),
    /// The final response head, or why none came.
    Final(HeadResult),
}

impl FinalHead {
    /// The next response head: the final one or, with `relay`, an interim one the client is
    /// to get too (`relayed_interim`). The other interim responses are taken off and counted.
    fn poll_next(&mut self, cx: &mut std::task::Context<'_>, relay: bool) -> Poll<NextHead> {
        if relay {
            if let Some(r) = self.held.pop_front() {
                return Poll::Ready(NextHead::Interim(r));
            }
        }
        if self.interim > MAX_INTERIM_RESPONSES {
            return Poll::Ready(NextHead::Final(Err(HeadFail::Interim)));
        }
        loop {
            match self.resp.poll_informational(cx) {
                Poll::Ready(Some(Ok(r))) => {
                    self.interim += 1;
                    if self.interim > MAX_INTERIM_RESPONSES {
                        return Poll::Ready(NextHead::Final(Err(HeadFail::Interim)));
                    }
                    if relay && relayed_interim(r.status().as_u16()) {
                        return Poll::Ready(NextHead::Interim(r));
                    }
                }
                Poll::Ready(Some(Err(e))) => {
                    return Poll::Ready(NextHead::Final(Err(HeadFail::H2(e))));
                }
                Poll::Ready(None) | Poll::Pending => break,
            }
        }
        let head = std::task::ready!(Pin::new(&mut self.resp).poll(cx));
        Poll::Ready(NextHead::Final(head.map_err(HeadFail::H2)))
    }
}

impl FinalHead {
    /// Takes interim responses off while nothing else polls the head (the request waits for
    /// window, a 1xx goes to a slow client): h2 keeps every one it receives until taken, so
    /// an upstream sending them without end would otherwise grow memory without bound. They
    /// are counted (beyond [`MAX_INTERIM_RESPONSES`] the head fails when next polled), and
    /// those to pass on are held for [`Self::poll_next`]. `true` once what comes next is the
    /// final head, or the stream's end or error (left for the next poll), or the count ran
    /// over.
    fn drain_interim(&mut self, cx: &mut std::task::Context<'_>) -> bool {
        loop {
            if self.interim > MAX_INTERIM_RESPONSES {
                return true;
            }
            match self.resp.poll_informational(cx) {
                Poll::Ready(Some(Ok(r))) => {
                    self.interim += 1;
                    if self.interim <= MAX_INTERIM_RESPONSES && relayed_interim(r.status().as_u16())
                    {
                        self.held.push_back(r);
                    }
                }
                Poll::Ready(Some(Err(_))) | Poll::Ready(None) => return true,
                Poll::Pending => return false,
            }
        }
    }
}

impl Future for FinalHead {
    type Output = HeadResult;

    fn poll(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<Self::Output> {
        loop {
            // (No interim response is asked for.)
            if let NextHead::Final(head) = std::task::ready!(self.poll_next(cx, false)) {
                return Poll::Ready(head);
            }
        }
    }
}

/// The wait for the final response head once the request is all sent: interim responses
/// (103 Early Hints) go on to an HTTP/1.1 or HTTP/2 client as they come (RFC 9110 §15.2), as
/// from an HTTP/1.1 upstream, `relayed` counting them over all attempts. Each one restarts
/// the wait (`deadline`: when it ends, from now). `Ok(None)`: the deadline passed; `Err`:
/// the client went away, or writing to it failed.
#[allow(clippy::too_many_arguments)]
async fn head_after_body<'w>(
    w: &'w Worker,
    cg: &CoreGen,
    conn: &mut ClientConn,
    info: &ReqInfo,
    mut head: Pin<&mut FinalHead>,
    deadline: impl Fn(&Worker) -> Instant,
    gone: &mut Option<ClientGone<'w>>,
    pipelined: bool,
    relayed: &mut usize,
) -> Result<Option<HeadResult>, Error> {
    loop {
        let relay = info.version != Version::Http10 && *relayed < MAX_INTERIM_RESPONSES;
        let resp = {
            let mut next = pin!(poll_fn(|cx| head.poll_next(cx, relay)));
            let next = pin!(within(deadline(w), next.as_mut()));
            match unless_gone(gone.as_ref(), next).await {
                None => return Err(cancelled()),
                Some(None) => return Ok(None),
                Some(Some(NextHead::Final(head))) => return Ok(Some(head)),
                Some(Some(NextHead::Interim(resp))) => resp,
            }
        };
        *relayed += 1;
        let status = resp.status();
        let fields = resp
            .headers()
            .iter()
            .map(|(n, v)| (n.as_str().as_bytes(), v.as_bytes()));
        let reason = status.canonical_reason().unwrap_or("").as_bytes();
        let Some(out) = interim_head(w, status.as_u16(), reason, fields) else {
            continue;
        };
        // (The watch on the client lets go of it for the write.) Interim responses that
        // come meanwhile are taken off, to go on after it.
        drop(gone.take());
        {
            let mut write = pin!(write_interim(w, cg, conn, out));
            let mut draining = true;
            poll_fn(|cx| {
                if let Poll::Ready(r) = write.as_mut().poll(cx) {
                    return Poll::Ready(r);
                }
                if draining {
                    draining = !head.drain_interim(cx);
                }
                Poll::Pending
            })
            .await?;
        }
        *gone = ClientGone::of(w, cg, &conn.stream, pipelined);
    }
}

/// Streams the client's request body (after the head, in `rbuf`, then from `stream`) into
/// `send`. `client_fd`: the client's socket (`None` for an HTTP/2 stream), acknowledged at once
/// when the body did not come whole with the head.
#[allow(clippy::too_many_arguments)]
async fn pump_body<S: AsyncReadRent>(
    w: &Worker,
    cg: &CoreGen,
    stream: &mut S,
    client_fd: Option<std::os::fd::RawFd>,
    rbuf: &mut Option<Block>,
    framing: BodyFraming,
    max_body: Option<u64>,
    send: &mut h2::SendStream<Bytes>,
    responding: &Cell<bool>,
) -> Result<(), Error> {
    let mut remaining = match framing {
        BodyFraming::Length(n) => n,
        BodyFraming::Chunked => u64::MAX,
        _ => 0,
    };
    let mut decoder = ChunkedDecoder::new();
    let mut ack = crate::net::sys::QuickAck::default();
    loop {
        let done = match framing {
            BodyFraming::Chunked => decoder.is_done(),
            _ => remaining == 0,
        };
        if done {
            return send_all(cg, send, Bytes::new(), true).await;
        }
        let Some(mut buf) = rbuf.take() else {
            return Err(Error::new(ErrorKind::ClientClosed, Side::Downstream));
        };
        if buf.is_empty() {
            // The rest of the body must not wait for a delayed ACK (`quickack`).
            ack.before_wait(client_fd);
            w.body_block(&mut buf);
            if framing != BodyFraming::Chunked {
                buf.limit_next_read(remaining.min(usize::MAX as u64) as usize);
            }
            // While the response streams down (a bidirectional call), a quiet client is
            // bounded by the response's own timeouts: the relay ends, and this pump with it.
            let deadline = if responding.get() {
                w.now() + QUIET_WHILE_RESPONDING
            } else {
                w.now() + cg.gen.http.body_timeout
            };
            let (res, b) = pin!(read_by(stream, buf, deadline, &w.pool)).await;
            buf = b;
            match res {
                Ok(0) => {
                    *rbuf = Some(buf);
                    return Err(Error::new(ErrorKind::ClientClosed, Side::Downstream)
                        .with_cause("client closed before the end of the request body"));
                }
                Ok(n) => add(&w.metrics().bytes_in, n as u64),
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut && responding.get() => {
                    // The read began before the response did: read again, without the
                    // body timeout (only duplex pumps read a virtual connection, where a
                    // cancelled read took nothing).
                    *rbuf = Some(buf);
                    continue;
                }
                Err(e) => {
                    *rbuf = Some(buf);
                    return Err(if e.kind() == std::io::ErrorKind::TimedOut {
                        Error::new(ErrorKind::RequestTimeout, Side::Downstream).with_cause(e)
                    } else {
                        Error::client_io(e)
                    });
                }
            }
        }
        let (kept, consumed) = if framing == BodyFraming::Chunked {
            match filter_in_place(&mut decoder, buf.data_mut(), Keep::DataOnly) {
                Ok(r) => r,
                Err(e) => {
                    *rbuf = Some(buf);
                    return Err(Error::new(ErrorKind::BadRequest, Side::Downstream).with_cause(e));
                }
            }
        } else {
            let n = (buf.len() as u64).min(remaining) as usize;
            remaining -= n as u64;
            (n, n)
        };
        if max_body.is_some_and(|max| decoder.data_total() > max) {
            *rbuf = Some(buf);
            return Err(Error::new(ErrorKind::BodyTooLarge, Side::Downstream));
        }
        let data = Bytes::copy_from_slice(&buf.data()[..kept]);
        buf.consume(consumed);
        w.head_block(&mut buf);
        *rbuf = Some(buf);
        if !data.is_empty() {
            send_all(cg, send, data, false).await?;
        }
    }
}

/// A request body streamed up while the response is already coming down: it owns what it
/// needs (a second reader of the HTTP/2 client's stream, the read buffer, the upstream send
/// half), so it can run on beside the relay. A client-side failure resets the upstream stream;
/// gives back the read buffer.
type DuplexPump<'a> = Pin<Box<dyn Future<Output = (Result<(), Error>, Option<Block>)> + 'a>>;

#[allow(clippy::too_many_arguments)]
fn duplex_pump<'a>(
    w: &'a Worker,
    cg: &'a CoreGen,
    mut reader: VirtualReader,
    mut rbuf: Option<Block>,
    framing: BodyFraming,
    max_body: Option<u64>,
    mut send: h2::SendStream<Bytes>,
    responding: &'a Cell<bool>,
) -> DuplexPump<'a> {
    Box::pin(async move {
        let r = pump_body(
            w,
            cg,
            &mut reader,
            None,
            &mut rbuf,
            framing,
            max_body,
            &mut send,
            responding,
        )
        .await;
        if let Err(e) = &r {
            if e.side() != Side::Upstream {
                send.send_reset(h2::Reason::CANCEL);
            }
        }
        (r, rbuf)
    })
}

/// Why an attempt ended without a response to relay.
enum Attempt {
    /// The response head, and the stream's hold on its connection.
    Response(
        http::Response<RecvStream>,
        crate::upstream::h2pool::StreamSlot,
    ),
    Failed(Error, FailureClass),
    /// The upstream did not process the request (REFUSED_STREAM, or a stream beyond its
    /// graceful GOAWAY): no failure of the endpoint, and safe to send again.
    Unprocessed(Error),
    /// Refused here (the endpoint's connection cap): says nothing about the endpoint.
    Local(Error),
    Client(Error),
}

/// Forwards the request in `conn` to HTTP/2 upstream `up`; returns whether the client
/// connection may go on.
#[allow(clippy::too_many_arguments)]
pub(super) async fn proxy(
    w: &Worker,
    cg: &CoreGen,
    conn: &mut ClientConn,
    info: &ReqInfo,
    route: &Route,
    action: &ProxyAction,
    params: &Params,
    up: &UpstreamRt,
    body: BodyPlan,
    plan: Plan,
) -> bool {
    let head_len = conn.head.len;
    let stats = up.shared.stats(w.id);
    let mut body_read = !matches!(body, BodyPlan::Streamed);
    let mut body_touched = false;
    // When the last of a streamed body went up (an endpoint's latency counts from there).
    let mut body_sent_at: Option<Instant> = None;
    let mut tried = Tried::default();
    // Whether the free resend of a request the upstream did not process was used.
    let mut resent = false;
    let mut attempts = 0u32;
    let mut retry_slot: Option<RetrySlot<'_>> = None;
    // Set when the response head came while the request body was still streaming up; the
    // rest of that body then streams beside the relay.
    let responding = Cell::new(false);
    let mut duplex_rest: Option<DuplexPump<'_>>;
    // Interim responses passed on to the client, over all attempts.
    let mut relayed = 0;
    // How long a half-open probe may take before its round is stale (see `Breaker::admit`).
    let try_ms = plan.try_timeout.as_millis() as u64;
    let (ticket, inflight, resp, stream_slot) = loop {
        duplex_rest = None;
        attempts += 1;
        conn.log.endpoint = None;
        let mut ticket = Ticket {
            breaker: &up.shared.breaker,
            admit: up.shared.breaker.admit(&up.cfg.breaker, w.now_ms(), try_ms),
            recorded: false,
        };
        if let Admit::Reject(secs) = ticket.admit {
            add(&stats.circuit_open, 1);
            conn.consume_head(head_len);
            let close = !body_read || !info.keep_alive || conn.winding_down(w);
            let sent =
                respond::error_retry_after(w, cg, conn, ErrorKind::CircuitOpen, secs, info, close)
                    .await;
            return sent && !close;
        }
        let retry = Retry {
            w,
            up,
            attempts,
            method_retryable: plan.method_retryable,
            total_deadline: plan.total_deadline,
        };
        let streamed = matches!(body, BodyPlan::Streamed);
        let gone = super::forward::queue_watch(w, cg, conn, streamed);
        // The wait for a stream ends by the total timeout, or by a gRPC call's deadline.
        let by = plan
            .grpc_deadline
            .map_or(plan.total_deadline, |g| g.min(plan.total_deadline));
        let acquired = acquire(w, up, plan.key, &mut tried, gone.as_ref(), by).await;
        drop(gone);
        let (ep, inflight, picked, started) = match acquired {
            Ok(x) => {
                conn.log.endpoint = Some(x.0.addr());
                x
            }
            Err(e) => {
                conn.consume_head(head_len);
                let err = match e {
                    AcquireFail::ClientGone => cancelled(),
                    AcquireFail::NoEndpoints => Error::new(ErrorKind::NoEndpoint, Side::Upstream),
                    AcquireFail::Deadline
                        if plan.grpc_deadline.is_some_and(|g| g < plan.total_deadline) =>
                    {
                        Error::new(ErrorKind::UpstreamTimeout, Side::Upstream).with_cause(
                            "the call's grpc-timeout passed while it waited for a stream",
                        )
                    }
                    AcquireFail::Deadline => super::forward::unsent_timeout(),
                    AcquireFail::Saturated => {
                        add(&stats.saturated, 1);
                        Error::new(ErrorKind::UpstreamSaturated, Side::Upstream)
                    }
                    // (A connect's failure comes back as the attempt's, with its endpoint.)
                    AcquireFail::Connect(_, e) => e,
                };
                return fail(w, cg, conn, info, err, !body_read).await;
            }
        };
        // An endpoint's latency runs from its pick (`started`: a connect counts, a wait for a
        // stream slot does not), or from the end of a streamed body, to the response head.
        let outcome: Attempt = 'attempt: {
            let (sender, slot) = match picked {
                Ok(x) => x,
                Err(err) => break 'attempt Attempt::Failed(err, FailureClass::Connect),
            };
            let reset = |e: h2::Error| {
                // A GOAWAY reaches, as an error, only the streams above its last stream id
                // (those at or below it end as the connection does): whatever its error
                // code, those were not processed (RFC 9113 §6.8).
                let unprocessed = e.is_remote()
                    && (e.reason() == Some(h2::Reason::REFUSED_STREAM) || e.is_go_away());
                if unprocessed {
                    let err = Error::new(ErrorKind::UpstreamClosed, Side::Upstream);
                    return Attempt::Unprocessed(err.with_cause(e));
                }
                // Reset or closed by our side of the connection: the upstream broke the
                // protocol or a limit (a push, an oversize head), as an invalid HTTP/1.1
                // response would.
                if e.is_library() {
                    let err = Error::new(ErrorKind::UpstreamInvalid, Side::Upstream);
                    return Attempt::Failed(err.with_cause(e), FailureClass::Invalid);
                }
                let err = Error::new(ErrorKind::UpstreamClosed, Side::Upstream).with_cause(e);
                Attempt::Failed(err, FailureClass::Reset)
            };
            // Before the request is sent, an error our side raised is about the connection
            // (closed for another stream's violation): this request was not processed.
            let unsent = |e: h2::Error| {
                if e.is_library() {
                    let err = Error::new(ErrorKind::UpstreamClosed, Side::Upstream);
                    Attempt::Unprocessed(err.with_cause(e))
                } else {
                    reset(e)
                }
            };
            let mut sender = match sender.ready().await {
                Ok(s) => s,
                Err(e) => break 'attempt unsent(e),
            };
            let now = w.now();
            if plan.total_deadline <= now {
                break 'attempt Attempt::Local(super::forward::unsent_timeout());
            }
            let limit = (now + plan.try_timeout).min(plan.total_deadline);
            // The call's own grpc-timeout ends first: its passing is the client's doing.
            let call_deadline = plan.grpc_deadline.filter(|&g| g <= limit);
            let head_deadline = call_deadline.unwrap_or(limit);
            // A call with a grpc-timeout tells the upstream the time it has left (after the
            // queue, earlier attempts and their backoffs), as gRPC servers expect of a proxy:
            // the whole call's, which a streaming call spends long after its response head.
            // An explicit `per_try_timeout` caps it, as Envoy caps it (the operator's bound on
            // one attempt, set knowing the calls it serves); `response_timeout`, a default
            // that bounds only the wait for the head, does not. Read off the clock, not the worker's tick: short
            // deadlines are common. A call whose deadline passed before it could be sent is
            // not sent.
            let grpc_timeout = plan.grpc_deadline.map(|g| {
                let left = g.saturating_duration_since(Instant::now());
                up.cfg.retries.per_try_timeout.map_or(left, |t| left.min(t))
            });
            if grpc_timeout.is_some_and(|t| t.is_zero()) {
                let err = Error::new(ErrorKind::UpstreamTimeout, Side::Upstream);
                break 'attempt Attempt::Local(err.with_cause("the call's grpc-timeout passed"));
            }
            let req = match build_request(
                up.cfg.tls.is_some(),
                cg,
                conn,
                info,
                (route, action, params),
                ep.authority(),
                grpc_timeout,
            ) {
                Ok(r) => r,
                Err(e) => break 'attempt Attempt::Client(e),
            };
            let end_stream = matches!(body, BodyPlan::None);
            let (resp, mut stream) = match sender.send_request(req, end_stream) {
                Ok(x) => x,
                Err(e) => break 'attempt unsent(e),
            };
            let pipelined = conn.pipelines(head_len, !matches!(body, BodyPlan::Streamed));
            let mut gone = ClientGone::of(w, cg, &conn.stream, pipelined);
            // A deadline passing: the call's own grpc-timeout is the client's doing, not a
            // failure of the upstream (neither the breaker nor outlier detection hears of
            // it, and it is not retried: DEADLINE_EXCEEDED to the client). Nor is a stream
            // taken beyond the peer's stream limit timing out: it may have waited, unsent,
            // behind long streams all along (as a request waiting for a connection at
            // `max_connections` would have, which is no failure either).
            let queued = slot.queued();
            let timed_out = |cause: &'static str| {
                let err = Error::new(ErrorKind::UpstreamTimeout, Side::Upstream);
                if call_deadline.is_some() {
                    Attempt::Local(err.with_cause("the call's grpc-timeout passed"))
                } else if queued {
                    Attempt::Local(err.with_cause(
                        "no response head in time, on a stream queued behind the upstream's \
                         stream limit",
                    ))
                } else {
                    Attempt::Failed(err.with_cause(cause), FailureClass::Timeout)
                }
            };
            let mut head = std::pin::pin!(FinalHead {
                resp,
                interim: 0,
                held: std::collections::VecDeque::new(),
            });
            let too_many_interim = || {
                let err = Error::new(ErrorKind::UpstreamInvalid, Side::Upstream);
                let err = err.with_cause("too many interim responses");
                Attempt::Failed(err, FailureClass::Invalid)
            };
            if !end_stream {
                // A stream queued behind the peer's stream limit gets no window until it
                // opens: that wait counts against the response deadline, not against the
                // (longer) send timeout of each body write. An answer that comes meanwhile
                // ends the wait (the body's send below meets it: an early answer), and
                // interim responses are taken off as they come.
                let mut open = std::pin::pin!(stream_open(&mut stream));
                let open_or_answer = poll_fn(|cx| {
                    if let Poll::Ready(r) = open.as_mut().poll(cx) {
                        return Poll::Ready(r);
                    }
                    if head.drain_interim(cx) {
                        return Poll::Ready(Ok(true));
                    }
                    Poll::Pending
                });
                let open_or_answer = std::pin::pin!(open_or_answer);
                let opened =
                    timeout_at(head_deadline, unless_gone(gone.as_ref(), open_or_answer)).await;
                match opened {
                    Ok(Some(Ok(true))) => {}
                    Ok(Some(Ok(false))) => {
                        // Closed while queued (refused, or beyond a GOAWAY): its response
                        // says how, and no body byte was taken yet (it may be sent again).
                        break 'attempt match timeout_at(head_deadline, head.as_mut()).await {
                            Ok(Ok(r)) => Attempt::Response(r, slot),
                            Ok(Err(HeadFail::H2(e))) => reset(e),
                            Ok(Err(HeadFail::Interim)) => too_many_interim(),
                            Err(_) => {
                                slot.suspect();
                                timed_out("no response head in time")
                            }
                        };
                    }
                    Ok(Some(Err(e))) => break 'attempt reset(e),
                    Ok(None) => break 'attempt Attempt::Client(cancelled()),
                    Err(_) => {
                        // Streams that never end may be a dead connection's.
                        slot.suspect();
                        break 'attempt timed_out(
                            "no stream free on the upstream connection in time",
                        );
                    }
                }
            }
            // While the body goes up, only the call's own deadline bounds the wait for the
            // head (each body read and write has its own timeout); the response timeout runs
            // from the end of the body, as for an HTTP/1.1 upstream.
            let after_body = |w: &Worker| {
                call_deadline.unwrap_or_else(|| {
                    let d = w.now() + plan.try_timeout;
                    if matches!(body, BodyPlan::Streamed) {
                        d
                    } else {
                        d.min(plan.total_deadline)
                    }
                })
            };
            // What the wait for the response head came to (`None`: its deadline passed).
            let head_outcome = |r: Option<HeadResult>| match r {
                None => {
                    // The connection may be dead without a word: it must answer a PING now,
                    // or it is closed (see `h2pool`). Also when the call's own deadline
                    // passed: calls whose deadlines are all shorter than the response timeout
                    // would otherwise keep a dead connection in the pool.
                    slot.suspect();
                    timed_out("no response head in time")
                }
                Some(Err(HeadFail::H2(e))) => reset(e),
                Some(Err(HeadFail::Interim)) => too_many_interim(),
                Some(Ok(r)) => Attempt::Response(r, slot),
            };
            let duplex = match body {
                BodyPlan::Streamed => conn.stream.virtual_reader(),
                _ => None,
            };
            let resp = if let Some(reader) = duplex {
                // An HTTP/2 client's body streams up while the response may already stream
                // down (gRPC bidirectional calls need both at once).
                conn.consume_head(head_len);
                body_touched = true;
                if let Err(e) = super::forward::send_continue(w, cg, conn, info).await {
                    stream.send_reset(h2::Reason::CANCEL);
                    break 'attempt Attempt::Client(e);
                }
                let rbuf = conn.rbuf.take();
                let mut pump = duplex_pump(
                    w,
                    cg,
                    reader,
                    rbuf,
                    info.framing,
                    plan.max_body,
                    stream,
                    &responding,
                );
                let during = head_by(head.as_mut(), call_deadline);
                let first = race(pump.as_mut(), std::pin::pin!(during)).await;
                match first {
                    Either::Left((r, rbuf)) => {
                        conn.rbuf = rbuf;
                        body_read = r.is_ok();
                        body_sent_at = Some(Instant::now());
                        if let Err(e) = r {
                            if e.side() != Side::Upstream {
                                break 'attempt Attempt::Client(e);
                            }
                        }
                        None
                    }
                    Either::Right(resp) => {
                        responding.set(true);
                        duplex_rest = Some(pump);
                        Some(resp)
                    }
                }
            } else {
                // The body goes up while the head is watched for: an upstream may answer
                // (413, 401, ...) before it has taken the whole body. A complete early answer
                // leaves the rest of the body unsent (the client's connection closes after the
                // response when its body was not all read), as with an HTTP/1.1 upstream; one
                // whose body is still to come (a handler that sends its head, then reads the
                // request) gets the rest of the request first: an HTTP/1.1 client cannot
                // send and receive at once here. An upstream that wants no more resets the
                // stream (NO_ERROR), which ends the sending.
                let early = match &body {
                    BodyPlan::None => None,
                    BodyPlan::Buffered(b) => {
                        let send = send_all(cg, &mut stream, Bytes::copy_from_slice(b), true);
                        let mut send = std::pin::pin!(send);
                        let during = head_by(head.as_mut(), call_deadline);
                        match race(send.as_mut(), std::pin::pin!(during)).await {
                            Either::Left(sent) => sent.err(),
                            Either::Right(resp) => {
                                if still_to_stream(&resp) {
                                    // (A failure to send the rest shows in the response.)
                                    let _ = send.await;
                                }
                                break 'attempt head_outcome(resp);
                            }
                        }
                    }
                    BodyPlan::Streamed => {
                        conn.consume_head(head_len);
                        body_touched = true;
                        if let Err(e) = super::forward::send_continue(w, cg, conn, info).await {
                            stream.send_reset(h2::Reason::CANCEL);
                            break 'attempt Attempt::Client(e);
                        }
                        let client_fd = conn.stream.socket_fd();
                        let pump = pump_body(
                            w,
                            cg,
                            &mut conn.stream,
                            client_fd,
                            &mut conn.rbuf,
                            info.framing,
                            plan.max_body,
                            &mut stream,
                            &responding,
                        );
                        let mut pump = std::pin::pin!(pump);
                        let during = head_by(head.as_mut(), call_deadline);
                        match race(pump.as_mut(), std::pin::pin!(during)).await {
                            Either::Left(r) => {
                                body_read = r.is_ok();
                                body_sent_at = Some(Instant::now());
                                r.err()
                            }
                            Either::Right(resp) => {
                                if still_to_stream(&resp) {
                                    let r = pump.await;
                                    body_read = r.is_ok();
                                    if let Err(e) = r {
                                        if e.side() != Side::Upstream {
                                            break 'attempt Attempt::Client(e);
                                        }
                                    }
                                }
                                break 'attempt head_outcome(resp);
                            }
                        }
                    }
                };
                if let Some(e) = early {
                    if e.side() != Side::Upstream {
                        stream.send_reset(h2::Reason::CANCEL);
                        break 'attempt Attempt::Client(e);
                    }
                    // The upstream stopped taking the body: it may have answered already.
                }
                None
            };
            // `None`: the request is all sent and its head still to come. A client's reset
            // ends the wait (and the upstream stream with it).
            let resp = match resp {
                Some(resp) => resp,
                None => {
                    let after = head_after_body(
                        w,
                        cg,
                        conn,
                        info,
                        head.as_mut(),
                        after_body,
                        &mut gone,
                        pipelined,
                        &mut relayed,
                    );
                    match after.await {
                        Ok(r) => r,
                        Err(e) => break 'attempt Attempt::Client(e),
                    }
                }
            };
            head_outcome(resp)
        };
        match outcome {
            Attempt::Response(r, slot) => {
                let done = Instant::now();
                let from = body_sent_at.map_or(started, |t| t.max(started));
                let elapsed = done.saturating_duration_since(from);
                ep.observe_latency(elapsed, done);
                up.record_latency(elapsed);
                let status = r.status().as_u16();
                let again = if status >= 500 {
                    let class = FailureClass::Status5xx;
                    retry.allowed(class, status, !body_touched, &mut retry_slot)
                } else {
                    None
                };
                if let Some(pause) = again {
                    drop(inflight);
                    record(w, up, &ep, ticket, Err(FailureClass::Status5xx));
                    match backoff(w, cg, conn, info, streamed, pause).await {
                        Ok(()) => continue,
                        Err(keep) => return keep,
                    }
                }
                ticket.settle_probe(&up.cfg.breaker, status, w.now_ms());
                break (ticket, inflight, r, slot);
            }
            Attempt::Failed(err, class) => {
                drop(inflight);
                record(w, up, &ep, ticket, Err(class));
                log_upstream(info, &up.cfg.name, Some(ep.addr()), &err);
                if let Some(pause) = retry.allowed(class, 0, !body_touched, &mut retry_slot) {
                    match backoff(w, cg, conn, info, streamed, pause).await {
                        Ok(()) => continue,
                        Err(keep) => return keep,
                    }
                }
                conn.consume_head(head_len);
                return fail(w, cg, conn, info, err, !body_read).await;
            }
            Attempt::Unprocessed(err) => {
                // Not the endpoint's failure: nothing recorded. Sent again once for free
                // (like a request on a stale pooled HTTP/1.1 connection), then by the policy.
                drop(inflight);
                drop(ticket);
                tracing::debug!(request_id = ?info.rid.as_str(), error = %err, "the upstream did not process the request; sending it again");
                if !body_touched && !resent {
                    resent = true;
                    attempts -= 1; // not an attempt of the retry policy
                    continue;
                }
                let again = match body_touched {
                    false => retry.allowed_unprocessed(true, &mut retry_slot),
                    true => None,
                };
                if let Some(pause) = again {
                    match backoff(w, cg, conn, info, streamed, pause).await {
                        Ok(()) => continue,
                        Err(keep) => return keep,
                    }
                }
                log_upstream(info, &up.cfg.name, Some(ep.addr()), &err);
                conn.consume_head(head_len);
                return fail(w, cg, conn, info, err, !body_read).await;
            }
            Attempt::Local(err) => {
                // Neither the breaker nor outlier detection hears of it (the ticket's drop
                // gives a probe back).
                drop(inflight);
                drop(ticket);
                conn.consume_head(head_len);
                return fail(w, cg, conn, info, err, !body_read).await;
            }
            Attempt::Client(err) => {
                conn.consume_head(head_len);
                return fail(w, cg, conn, info, err, true).await;
            }
        }
    };
    conn.consume_head(head_len);
    drop(retry_slot);
    let ep = inflight.endpoint().clone();
    let status = resp.status().as_u16();
    // Why the client's side of a bidirectional exchange failed, if it did: the relay then
    // ends with that (the upstream stream was reset for it), not with an upstream failure.
    let client_failed = Cell::new(None);
    let (keep, upstream_failure) = match duplex_rest {
        None => relay(w, cg, conn, info, resp, body_read, &plan, &client_failed).await,
        Some(mut pump) => {
            // The body goes on streaming up beside the relay, and is abandoned (its stream
            // reset) if the response completes first. The connection (one HTTP/2 stream)
            // closes after.
            let relay = relay(w, cg, conn, info, resp, false, &plan, &client_failed);
            let mut relay = std::pin::pin!(relay);
            let mut pumping = true;
            poll_fn(|cx| {
                if pumping {
                    if let Poll::Ready((r, _)) = pump.as_mut().poll(cx) {
                        pumping = false;
                        if let Err(e) = r {
                            if e.side() != Side::Upstream {
                                client_failed.set(Some(e.kind()));
                            }
                        }
                    }
                }
                relay.as_mut().poll(cx)
            })
            .await
        }
    };
    drop(inflight);
    if upstream_failure == Some(FailureClass::Timeout) {
        // A body that stalled may be a dead connection's (see `h2pool`).
        stream_slot.suspect();
    }
    let outcome = if status >= 500 {
        Err(FailureClass::Status5xx)
    } else {
        upstream_failure.map_or(Ok(()), Err)
    };
    record(w, up, &ep, ticket, outcome);
    keep
}

/// Writes the response to the client as HTTP/1.1; returns (keep the client connection, the
/// upstream's failure if it failed mid-way). `client_failed`: the request body's pump failed
/// on the client's side (and reset the upstream stream), so the response ends for that.
#[allow(clippy::too_many_arguments)]
async fn relay(
    w: &Worker,
    cg: &CoreGen,
    conn: &mut ClientConn,
    info: &ReqInfo,
    resp: http::Response<RecvStream>,
    body_read: bool,
    plan: &Plan,
    client_failed: &Cell<Option<ErrorKind>>,
) -> (bool, Option<FailureClass>) {
    let (parts, mut body) = resp.into_parts();
    let status = parts.status.as_u16();
    let http10 = info.version == Version::Http10;
    let bodiless = info.method == Method::Head || status == 204 || status == 304;
    let length = parts
        .headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| crate::http1::body::parse_content_length(v.as_bytes()));
    #[derive(PartialEq, Clone, Copy)]
    enum Out {
        None,
        Length,
        Chunked,
        Close,
    }
    let out_framing = if bodiless || body.is_end_stream() && length.is_none() {
        Out::None
    } else if length.is_some() && (!info.grpc || http10) {
        // (A gRPC call's response goes chunked even with a length: its status comes in the
        // trailers, which only a chunked body carries on.)
        Out::Length
    } else if !http10 {
        Out::Chunked
    } else {
        Out::Close
    };
    let keep_client =
        info.keep_alive && body_read && !conn.winding_down(w) && out_framing != Out::Close;
    let mut out = w.pool.take();
    let head = (|| {
        put_status_line(&mut out, status, b"")?;
        for (name, value) in &parts.headers {
            if name == http::header::CONTENT_LENGTH
                || name == http::header::CONNECTION
                || name == http::header::TRANSFER_ENCODING
                || name.as_str() == "x-request-id"
                || name.as_str() == "keep-alive"
            {
                continue;
            }
            put_field(&mut out, name.as_str().as_bytes(), value.as_bytes())?;
        }
        // A proxy with a clock dates a response that comes without (RFC 9110 §6.6.1).
        if !parts.headers.contains_key(http::header::DATE) {
            put_field(&mut out, b"date", &w.date())?;
        }
        let stated = crate::http1::bodiless_length_stated(info.method, status);
        match (out_framing, length) {
            (Out::Length, Some(n)) | (Out::None, Some(n))
                if out_framing == Out::Length || stated =>
            {
                out.put(b"content-length: ")?;
                put_u64(&mut out, n)?;
                out.put(b"\r\n")?;
            }
            (Out::Chunked, _) => put_field(&mut out, b"transfer-encoding", b"chunked")?,
            (Out::None, None) if !bodiless => put_field(&mut out, b"content-length", b"0")?,
            _ => {}
        }
        if !keep_client {
            put_field(&mut out, b"connection", b"close")?;
        } else if http10 {
            put_field(&mut out, b"connection", b"keep-alive")?;
        }
        put_field(&mut out, b"x-request-id", info.rid.as_bytes())?;
        out.put(b"\r\n")
    })();
    // As many fields as an HTTP/1.1 upstream's head may have, ringway's own among them: an
    // HTTP/2 client's side parses the head again.
    let too_many = parts.headers.len() + OWN_FIELDS > MAX_HEADERS_HARD_LIMIT;
    if head.is_err() || too_many {
        let err = Error::new(ErrorKind::UpstreamInvalid, Side::Upstream)
            .with_cause("response head too large to relay");
        let sent = fail(w, cg, conn, info, err, !body_read).await;
        return (sent, Some(FailureClass::Invalid));
    }
    if !keep_client {
        conn.linger = !body_read;
    }
    w.metrics().response(status);
    let stall = Stall::new(w.now(), cg.gen.http.send_timeout);
    let len = out.len() as u64;
    let (res, _) = pin!(write_all_by(&mut conn.stream, out, stall, &w.pool)).await;
    if res.is_err() {
        return client_left(conn);
    }
    add(&w.metrics().bytes_out, len);
    conn.log.wrote(status, len);
    if out_framing == Out::None {
        return (keep_client, None);
    }
    // Body: DATA frames as they come, each written before the next is taken (and only then
    // is the window given back to the upstream). An HTTP/2 client's reset ends the wait at
    // once (dropping `body` then resets the upstream stream): a quiet stream is not held
    // until its next DATA or the read timeout. (A socket is not watched here: a closed one
    // fails the next write.)
    let gone = conn.stream.gone_watch().map(ClientGone::Stream);
    loop {
        let stall = w.now() + plan.read_timeout;
        // The call's own grpc-timeout ending first is the client's doing, not a failure.
        let call_deadline = plan.grpc_deadline.filter(|&g| g <= stall);
        let idle = call_deadline.unwrap_or(stall);
        let next = timeout_at(idle, body.data());
        let Some(next) = unless_gone(gone.as_ref(), std::pin::pin!(next)).await else {
            conn.aborted = true;
            return client_left(conn);
        };
        let counted = !(call_deadline.is_some() && next.is_err());
        let failed = match next {
            Ok(Some(Ok(c))) => Ok(c),
            Ok(None) => break,
            Ok(Some(Err(e))) => match client_failed.get() {
                Some(kind) => Err(Error::new(kind, Side::Downstream)
                    .with_cause("the request body failed on the client's side")),
                None => Err(Error::new(ErrorKind::UpstreamClosed, Side::Upstream).with_cause(e)),
            },
            Err(_) if call_deadline.is_some() => {
                Err(Error::new(ErrorKind::UpstreamTimeout, Side::Upstream)
                    .with_cause("the call's grpc-timeout passed"))
            }
            Err(_) => Err(Error::new(ErrorKind::UpstreamTimeout, Side::Upstream)
                .with_cause("response body stalled")),
        };
        let chunk = match failed {
            Ok(c) => c,
            Err(e) if info.grpc && out_framing == Out::Chunked => {
                // A gRPC call ends with a status, also when it fails half-way: the deadline
                // (or the upstream) ended it.
                let (keep, class) = grpc_end(w, cg, conn, info, e).await;
                return (keep, class.filter(|_| counted));
            }
            Err(e) => {
                let (keep, class) = cut_short(w, conn, info, e);
                return (keep, class.filter(|_| counted));
            }
        };
        let n = chunk.len();
        if n == 0 {
            continue;
        }
        if write_piece(w, cg, conn, &chunk, out_framing == Out::Chunked)
            .await
            .is_err()
        {
            return client_left(conn);
        }
        let _ = body.flow_control().release_capacity(n);
    }
    let trailers = if out_framing == Out::Chunked {
        match body.trailers().await {
            Ok(t) => t,
            Err(e) => {
                return cut_short(
                    w,
                    conn,
                    info,
                    Error::new(ErrorKind::UpstreamClosed, Side::Upstream).with_cause(e),
                )
            }
        }
    } else {
        None
    };
    if out_framing == Out::Chunked {
        let mut end = w.pool.take();
        let written = (|| {
            end.put(b"0\r\n")?;
            if let Some(t) = &trailers {
                for (name, value) in t {
                    let name = name.as_str().as_bytes();
                    if HeaderKind::classify(name).fits_a_trailer() {
                        put_field(&mut end, name, value.as_bytes())?;
                    }
                }
            }
            end.put(b"\r\n")
        })();
        if written.is_err() {
            return cut_short(
                w,
                conn,
                info,
                Error::new(ErrorKind::UpstreamInvalid, Side::Upstream)
                    .with_cause("trailers too large"),
            );
        }
        let stall = Stall::new(w.now(), cg.gen.http.send_timeout);
        let (res, _) = pin!(write_all_by(&mut conn.stream, end, stall, &w.pool)).await;
        if res.is_err() {
            return client_left(conn);
        }
    }
    (keep_client, None)
}

/// The client went away mid-response: nothing to count against the upstream.
fn client_left(conn: &mut ClientConn) -> (bool, Option<FailureClass>) {
    conn.log.client_left();
    (false, None)
}

/// Fields a relayed head gets from ringway, at most: date, framing, connection, request id.
const OWN_FIELDS: usize = 4;

/// Writes one DATA frame's bytes to the client, chunk-framed when asked.
async fn write_piece(
    w: &Worker,
    cg: &CoreGen,
    conn: &mut ClientConn,
    data: &[u8],
    chunked: bool,
) -> Result<(), ()> {
    let mut rest = data;
    let mut first = true;
    while !rest.is_empty() || first {
        let mut b: Block = w.body_pool.take();
        if chunked && first {
            let mut digits = [0u8; 20];
            let _ = b.put(hex(data.len() as u64, &mut digits));
            let _ = b.put(b"\r\n");
        }
        first = false;
        let n = rest.len().min(b.spare().saturating_sub(2));
        let _ = b.put(&rest[..n]);
        rest = &rest[n..];
        if chunked && rest.is_empty() {
            let _ = b.put(b"\r\n");
        }
        let len = b.len() as u64;
        let stall = Stall::to_client(&conn.stream, w.now(), cg.gen.http.send_timeout);
        let (res, _) = pin!(write_all_by(&mut conn.stream, b, stall, &w.body_pool)).await;
        res.map_err(|_| ())?;
        add(&w.metrics().bytes_out, len);
        conn.log.sent += len;
    }
    Ok(())
}

fn hex(mut v: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b"0123456789abcdef"[(v & 15) as usize];
        v >>= 4;
        if v == 0 {
            break;
        }
    }
    &buf[i..]
}

/// Ends a gRPC response whose body failed with trailers carrying the gRPC status.
async fn grpc_end(
    w: &Worker,
    cg: &CoreGen,
    conn: &mut ClientConn,
    info: &ReqInfo,
    e: Error,
) -> (bool, Option<FailureClass>) {
    let class = failure_class(&e);
    conn.log.error = Some(e.kind());
    tracing::debug!(request_id = ?info.rid.as_str(), error = %e, "gRPC response ended with a status");
    let mut digits = [0u8; 20];
    let code = crate::http1::encode::decimal(
        u64::from(crate::h2::grpc::status_for(e.kind())),
        &mut digits,
    );
    let mut end = w.pool.take();
    let written = (|| {
        end.put(b"0\r\n")?;
        put_field(&mut end, b"grpc-status", code)?;
        put_field(&mut end, b"grpc-message", e.kind().message().as_bytes())?;
        end.put(b"\r\n")
    })();
    if written.is_err() {
        return cut_short(w, conn, info, e);
    }
    let stall = Stall::new(w.now(), cg.gen.http.send_timeout);
    let _ = pin!(write_all_by(&mut conn.stream, end, stall, &w.pool)).await;
    (false, class)
}

/// The response was cut short: reset the client connection so it cannot pass for complete.
fn cut_short(
    w: &Worker,
    conn: &mut ClientConn,
    info: &ReqInfo,
    e: Error,
) -> (bool, Option<FailureClass>) {
    let _ = w;
    conn.stream.abort();
    conn.aborted = true;
    conn.log.error = Some(e.kind());
    if e.side() == Side::Upstream {
        tracing::warn!(request_id = ?info.rid.as_str(), error = %e, "upstream failed mid-body; client connection truncated");
    } else {
        tracing::debug!(request_id = ?info.rid.as_str(), error = %e, "client failed mid-exchange; connection closed");
    }
    (false, failure_class(&e))
}

/// What an exchange that ended half-way counts as against its endpoint: nothing when the
/// client's side failed.
fn failure_class(e: &Error) -> Option<FailureClass> {
    match (e.side(), e.kind()) {
        (Side::Upstream, ErrorKind::UpstreamTimeout) => Some(FailureClass::Timeout),
        (Side::Upstream, _) => Some(FailureClass::MidBody),
        _ => None,
    }
}
