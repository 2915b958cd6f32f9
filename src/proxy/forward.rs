//! Forwarding one request to an upstream and relaying the response.
//!
//! ```text
//! limits ─► acquire (pool | connect) ─► send head ─► [100 Continue] ─► pump body ∥ read response head
//!        ─► send response head ─► relay body ─► pool or close
//! ```
//!
//! Framing is relayed as received (after validation): a Content-Length body byte for byte, a
//! chunked body chunk for chunk without its chunk extensions (to HTTP/1.0 clients with the
//! framing removed, close-delimited), a close-delimited body until EOF. Nothing is collected:
//! each block read is written before the next read, so a slow reader slows the sender
//! (backpressure by construction).
//!
//! Reuse: the upstream connection goes back to the pool only when the request body was sent
//! completely, the response completed exactly with no stray bytes after it, and neither side
//! asked to close. A request that failed on a *reused* connection before any response byte
//! arrived is sent once more on a new connection, if it has no body and its method is
//! idempotent (RFC 9110 §9.2.2).

use std::future::poll_fn;
use std::io as stdio;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::pin::pin;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::task::Poll;
use std::time::{Duration, Instant};

use super::gone::{unless_gone, ClientGone};
use super::io::{
    race, read_by, write_all_by, write_front_by, write_static_by, Either, Stall, WholeSegments,
};
use super::tunnel::Tunnel;
use super::{respond, ClientConn, ReqInfo};
use crate::buf::Block;
use crate::config::{BalancerConfig, BreakerConfig, HashKey, HIGH_PRIORITY_CLASS};
use crate::error::{Error, ErrorKind, Side};
use crate::http1::encode::{put_field, put_status_line, ForwardedFor};
use crate::http1::{
    filter_in_place, parse_response, write_request_head, write_response_head, BodyFraming,
    ChunkedDecoder, HeaderKind, Keep, Method, RequestEdits, ResponseEdits, ResponseHead, Version,
    MAX_HEADERS_HARD_LIMIT,
};
use crate::net::client::{ClientStream, ReadHalf, WriteHalf};
use crate::net::sys::QuickAck;
use crate::observe::metrics::add;
use crate::route::criteria::{parse_cookies, HeaderLookup};
use crate::route::{rewrite_path, Params, ProxyAction, Route};
use crate::shared::Admission;
use crate::upstream::balancer::hash_key;
use crate::upstream::state::Breaker;
use crate::upstream::{
    Admit, ConnectError, EndpointRt, FailureClass, InFlight, PickError, Tried, UpConn, UpstreamRt,
    UpstreamState,
};
use crate::worker::{CoreGen, Worker};

/// Interim (1xx) responses skipped before the final one; more is an invalid upstream.
pub(super) const MAX_INTERIM_RESPONSES: usize = 16;

const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// How the response body travels to the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Relay {
    /// No body.
    None,
    /// Exactly this many bytes.
    Length(u64),
    /// Chunked, relayed chunk for chunk (extensions dropped).
    Chunked,
    /// Chunked from the upstream, data only to the (HTTP/1.0) client, close-delimited.
    Dechunk,
    /// Until the upstream closes.
    UntilClose,
}

/// How the request body reaches the upstream.
pub(super) enum BodyPlan {
    /// No body.
    None,
    /// Read whole before the first attempt (a Content-Length body within
    /// `retries.buffer_max_bytes`): replayed on retries.
    Buffered(Vec<u8>),
    /// Streamed from the client during the first attempt; once any of it left, no retry.
    Streamed,
}

/// Progress of a streamed body.
#[derive(Default)]
struct BodyState {
    /// Bytes of it may have reached an upstream.
    touched: bool,
    /// All of it was read from the client (a buffered body: before the first attempt).
    done: bool,
    /// All of it reached the upstream that answered (an upstream may answer before it has
    /// a buffered body whole: its connection is not reused, the client's may be).
    sent: bool,
    /// When the last of a streamed body went up: an endpoint's latency is counted from
    /// there, not from the start of a slow client's upload.
    sent_at: Option<Instant>,
}

/// A proxied request's slot of the gateway cap, returned when dropped (on every path).
struct Permit<'a>(&'a Admission);

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        self.0.release();
    }
}

/// A request waiting for a connection, one of `max_pending` across workers until dropped
/// (from its first wait to the end of its `acquire`, connecting included).
struct Pending<'a>(&'a UpstreamRt);

impl<'a> Pending<'a> {
    /// Counts a request whose place in the shared count is taken already.
    fn new(up: &'a UpstreamRt) -> Self {
        up.local.pending.set(up.local.pending.get() + 1);
        Pending(up)
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        let local = &self.0.local.pending;
        local.set(local.get() - 1);
        self.0.shared.pending.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A waiting request's place in its worker's line ([`crate::upstream::WaitQueue`]), given up
/// when dropped.
struct Place<'a> {
    up: &'a UpstreamRt,
    ticket: u64,
}

impl<'a> Place<'a> {
    /// At the back of the line, or at its front (see [`crate::upstream::WaitQueue::join`]).
    fn new(up: &'a UpstreamRt, front: bool) -> Self {
        let ticket = up.queue.join(front);
        Place { up, ticket }
    }
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        self.up.queue.leave(self.ticket);
    }
}

/// A retry in progress (the concurrent part of the retry budget), ended when dropped.
pub(super) struct RetrySlot<'a>(pub(super) &'a UpstreamState);

impl Drop for RetrySlot<'_> {
    fn drop(&mut self) {
        self.0.retry_done();
    }
}

/// The breaker's word on one attempt; a half-open probe permit goes back when the attempt
/// ends without an outcome (a local rejection, the client leaving).
pub(super) struct Ticket<'a> {
    pub(super) breaker: &'a Breaker,
    pub(super) admit: Admit,
    pub(super) recorded: bool,
}

impl Ticket<'_> {
    /// A half-open probe is decided by its response head: its status answers whether the
    /// upstream is back, and a long body (a stream, a download) must not hold the circuit
    /// half-open (refusing everyone else) until it ends. The rest of the exchange then counts
    /// like any admitted request's.
    pub(super) fn settle_probe(&mut self, cfg: &BreakerConfig, status: u16, now_ms: u64) {
        if let Admit::Probe(_) = self.admit {
            self.breaker.record(cfg, self.admit, status < 500, now_ms);
            self.admit = Admit::Allow;
        }
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        if !self.recorded {
            self.breaker.release_probe(self.admit);
        }
    }
}

/// Takes a slot of the gateway cap for a route of `class`; `Ok(None)` when there is no cap.
fn admit<'a>(
    w: &'a Worker,
    gen: &crate::config::Generation,
    class: u8,
) -> Result<Option<Permit<'a>>, ()> {
    let cap = gen.gateway.max_concurrent_requests;
    if cap == 0 {
        return Ok(None);
    }
    let limit = if class >= HIGH_PRIORITY_CLASS {
        cap
    } else {
        cap - gen.gateway.high_priority_reserve.min(cap)
    };
    if w.shared.admission.try_acquire(limit) {
        Ok(Some(Permit(&w.shared.admission)))
    } else {
        add(&w.metrics().shed[usize::from(class.min(10))], 1);
        Err(())
    }
}

/// The hash key of the request for hash balancers.
pub(super) fn request_key(kind: &BalancerConfig, conn: &ClientConn) -> Option<u64> {
    let src = conn.rbuf.as_ref()?.data();
    let view = super::HeadView {
        head: &conn.head,
        src,
        trusted: None,
    };
    let value = match kind {
        BalancerConfig::IpHash | BalancerConfig::ConsistentHash(HashKey::ClientIp) => {
            return Some(match conn.peer.ip() {
                std::net::IpAddr::V4(ip) => hash_key(&ip.octets()),
                std::net::IpAddr::V6(ip) => hash_key(&ip.octets()),
            })
        }
        BalancerConfig::CookieHash(name)
        | BalancerConfig::ConsistentHash(HashKey::Cookie(name)) => view
            .values(b"cookie")
            .flat_map(parse_cookies)
            .find(|(n, _)| *n == name.as_bytes())
            .map(|(_, v)| v),
        BalancerConfig::ConsistentHash(HashKey::Header(name)) => {
            view.values(name.as_bytes()).next()
        }
        _ => None,
    };
    value.map(hash_key)
}

/// What decides whether an attempt that failed is tried again.
pub(super) struct Retry<'a> {
    pub(super) w: &'a Worker,
    pub(super) up: &'a UpstreamRt,
    /// Attempts made so far (the failed one included).
    pub(super) attempts: u32,
    pub(super) method_retryable: bool,
    pub(super) total_deadline: Instant,
}

impl<'a> Retry<'a> {
    /// Whether a failure of `class` (`status` for a 5xx) may be retried: attempts left,
    /// method and body allow it (`replayable`), time left, `retry_on` wants it, and the
    /// retry budget has room (counted when it does; `slot` holds the concurrent retry).
    /// `Some`: the pause before the retry ([`backoff`]).
    pub(super) fn allowed(
        &self,
        class: FailureClass,
        status: u16,
        replayable: bool,
        slot: &mut Option<RetrySlot<'a>>,
    ) -> Option<Duration> {
        if !self.method_retryable || !retry_wanted(&self.up.cfg.retries.retry_on, class, status) {
            return None;
        }
        self.admit(replayable, slot)
    }

    /// Whether a request the upstream did not process (an HTTP/2 stream it refused, or one
    /// beyond its GOAWAY: RFC 9113 §8.7) may be sent again: whatever its method, it is not
    /// a second execution; attempts, body, time and budget still rule.
    pub(super) fn allowed_unprocessed(
        &self,
        replayable: bool,
        slot: &mut Option<RetrySlot<'a>>,
    ) -> Option<Duration> {
        self.admit(replayable, slot)
    }

    /// A retry that would begin, after its pause, at or past the total deadline is not made:
    /// it could only time out (blamed on a sound endpoint) or repeat the request for nothing.
    fn admit(&self, replayable: bool, slot: &mut Option<RetrySlot<'a>>) -> Option<Duration> {
        let (w, up) = (self.w, self.up);
        let policy = &up.cfg.retries;
        if self.attempts >= policy.attempts || !replayable {
            return None;
        }
        let pause = self.pause();
        if w.now() + pause >= self.total_deadline {
            return None;
        }
        let stats = up.shared.stats(w.id);
        if !up.budget_allows_retry()
            || (slot.is_none() && !up.shared.retry_begin(up.cfg.retry_budget.max_concurrent))
        {
            add(&stats.budget_exhausted, 1);
            return None;
        }
        if slot.is_none() {
            *slot = Some(RetrySlot(&up.shared));
        }
        up.count_retry();
        add(&stats.retries, 1);
        Some(pause)
    }

    /// The pause before the next attempt: exponential backoff (`backoff_base` doubling per
    /// attempt, at most `backoff_max`) with full jitter.
    fn pause(&self) -> Duration {
        let p = &self.up.cfg.retries;
        let shift = self.attempts.saturating_sub(1).min(20);
        let cap = p.backoff_base.saturating_mul(1 << shift).min(p.backoff_max);
        let cap_us = cap.as_micros() as u64;
        if cap_us == 0 {
            return Duration::ZERO;
        }
        Duration::from_micros(self.up.random() % (cap_us + 1))
    }
}

/// Which failures of an attempt a retry is allowed for, by the upstream's `retry_on`.
fn retry_wanted(on: &crate::config::RetryOn, class: FailureClass, status: u16) -> bool {
    match class {
        FailureClass::Connect => on.connect_failure,
        FailureClass::Reset => on.reset,
        FailureClass::Timeout | FailureClass::Invalid => on.status_5xx || on.gateway_error,
        FailureClass::Status5xx => {
            on.status_5xx || (on.gateway_error && (502..=504).contains(&status))
        }
        FailureClass::MidBody => false,
    }
}

/// The failure class of an error that ended an attempt before a response head.
pub(super) fn failure_class(kind: ErrorKind) -> FailureClass {
    match kind {
        ErrorKind::UpstreamConnect | ErrorKind::UpstreamConnectTimeout => FailureClass::Connect,
        ErrorKind::UpstreamTimeout => FailureClass::Timeout,
        ErrorKind::UpstreamInvalid => FailureClass::Invalid,
        _ => FailureClass::Reset,
    }
}

/// Feeds an attempt's outcome to the metrics, passive health and the breaker.
pub(super) fn record(
    w: &Worker,
    up: &UpstreamRt,
    ep: &EndpointRt,
    mut ticket: Ticket<'_>,
    outcome: Result<(), FailureClass>,
) {
    let now_ms = w.now_ms();
    if let Err(class) = outcome {
        up.shared.stats(w.id).failure(class);
        ep.state.stats(w.id).failure(class);
        ep.observe_latency(
            crate::upstream::balancer::FAILURE_PENALTY,
            std::time::Instant::now(),
        );
    }
    if let Some(o) = &up.cfg.outlier {
        match outcome {
            Ok(()) => ep.state.record_success(),
            Err(class) if class != FailureClass::Status5xx || o.on_5xx => {
                if ep.state.record_failure(o, now_ms, || {
                    up.ejection_budget(o.max_ejection_percent, now_ms)
                }) {
                    add(&up.shared.stats(w.id).ejections, 1);
                    tracing::warn!(
                        upstream = %up.cfg.name,
                        endpoint = %ep.addr(),
                        failure = class.label(),
                        "endpoint ejected after consecutive failures"
                    );
                }
            }
            Err(_) => {}
        }
    }
    ticket.recorded = true;
    up.shared
        .breaker
        .record(&up.cfg.breaker, ticket.admit, outcome.is_ok(), now_ms);
}

/// Whether a request may be sent once more on a new connection after a pooled one turned out
/// closed before any response byte: idempotent (RFC 9110 §9.2.2), and no body streamed from
/// the client (it cannot be read twice).
fn resendable(info: &ReqInfo, body: &BodyPlan) -> bool {
    info.method.is_idempotent() && !matches!(body, BodyPlan::Streamed)
}

/// Why no connection was had for an attempt.
pub(super) enum AcquireFail {
    /// No endpoint in rotation.
    NoEndpoints,
    /// All busy and the queue full, or the wait ran out.
    Saturated,
    /// The request's own deadline passed while it waited (its total timeout).
    Deadline,
    /// Connecting to the picked endpoint failed.
    Connect(InFlight, Error),
    /// The client went while the request waited for a connection.
    ClientGone,
}

/// Picks an endpoint and gets a connection to it; waits (as one of `max_pending`) while
/// every endpoint is at its connection limit, unless the client goes (`gone`) or the request's
/// own deadline (`by`) passes first. With the
/// connection comes when the endpoint was picked (its latency counts from there: a connect
/// is the endpoint's, a wait for a slot is not).
async fn acquire(
    w: &Worker,
    up: &UpstreamRt,
    key: Option<u64>,
    replayable: bool,
    tried: &mut Tried,
    gone: Option<&ClientGone<'_>>,
    by: Instant,
) -> Result<(InFlight, UpConn, Instant), AcquireFail> {
    let mut wait = SlotWait::by(by);
    loop {
        let now = Instant::now();
        match wait.pick(up, key, tried, w, now) {
            Some(Ok(ep)) => {
                let inflight = ep.begin(w.id, up);
                // The connect too ends by the request's own deadline (unblamed: the endpoint
                // may only be slower than the request could wait).
                let connected = {
                    let connect = std::pin::pin!(up.connect(&ep, false, replayable, now));
                    crate::worker::deadline::within(by, connect).await
                };
                let Some(connected) = connected else {
                    return Err(AcquireFail::Deadline);
                };
                match connected {
                    Ok(c) => {
                        tried.add(&ep);
                        return Ok((inflight, c, now));
                    }
                    Err(ConnectError::Busy) => {
                        // Taken by another worker meanwhile: the token is not spent.
                        up.unpick(&ep, now, w.shared.epoch);
                        wait.lost_it();
                    }
                    Err(e) => {
                        tried.add(&ep);
                        return Err(AcquireFail::Connect(inflight, connect_error(&ep, e)));
                    }
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

/// What one poll interval of a [`SlotWait`] came to.
pub(super) enum Waited {
    /// Look for a connection again.
    Again,
    /// The queue is full, or the wait ran out (`connect_timeout`).
    GiveUp,
    /// The request's own deadline passed first.
    Deadline,
    /// The client went meanwhile: the request is dropped, not sent.
    ClientGone,
}

/// The watch on a client while its request waits for a connection: an HTTP/2 stream's
/// reset, or a socket's close (`http.client_close_check`). Not the socket of a body still to
/// be read: a client that shuts down its side after an upload is no close.
pub(super) fn queue_watch<'a>(
    w: &'a Worker,
    cg: &CoreGen,
    conn: &mut ClientConn,
    streamed: bool,
) -> Option<ClientGone<'a>> {
    if streamed && conn.stream.socket_fd().is_some() {
        return None;
    }
    let pipelined = conn.pipelines(conn.head.len, !streamed);
    ClientGone::of(w, cg, &conn.stream, pipelined)
}

/// A request's wait for a connection while every endpoint is at its limit: in this worker's
/// line for the upstream (first come, first served: [`crate::upstream::WaitQueue`]) within
/// `max_pending`, up to `connect_timeout` or the request's own deadline, whichever comes
/// first (a request whose total timeout or gRPC deadline passed in line is answered then, not
/// when the line would have let it go). The first in line looks again when a request to the
/// upstream ends here, and every [`PENDING_POLL`] (connections free up on any worker).
/// HTTP/1.1 and HTTP/2 upstreams wait alike.
#[derive(Default)]
pub(super) struct SlotWait<'a> {
    /// Its count among `max_pending`, held until the wait ends (also while it connects: a
    /// request that lost its connection to another worker waits again without being
    /// refused by a full queue).
    pending: Option<Pending<'a>>,
    /// Its place in line, given up when it picks.
    place: Option<Place<'a>>,
    /// When the wait ends: `connect_timeout` after the request first joined the line, or
    /// `by`.
    until: Option<Instant>,
    /// The request's own deadline.
    by: Option<Instant>,
    /// It left the line with an endpoint that then had no connection to spare after all
    /// (another worker took it): it goes back to the front.
    lost: bool,
}

impl<'a> SlotWait<'a> {
    /// A wait that ends by `by` at the latest.
    pub(super) fn by(by: Instant) -> Self {
        SlotWait {
            by: Some(by),
            ..SlotWait::default()
        }
    }

    /// Picks an endpoint, unless requests on this worker waited before this one (`None`: it
    /// waits its turn). A pick takes the request out of line.
    pub(super) fn pick(
        &mut self,
        up: &UpstreamRt,
        key: Option<u64>,
        tried: &Tried,
        w: &Worker,
        now: Instant,
    ) -> Option<Result<Rc<EndpointRt>, PickError>> {
        let turn = match &self.place {
            None => up.queue.is_empty(),
            Some(p) => up.queue.is_first(p.ticket),
        };
        if !turn {
            return None;
        }
        let picked = up.pick(key, tried, w.now_ms(), now, w.shared.epoch);
        if picked.is_ok() {
            self.place = None;
        }
        Some(picked)
    }

    /// The picked endpoint had no connection to spare after all: the request waits again,
    /// first in line.
    pub(super) fn lost_it(&mut self) {
        self.lost = true;
    }

    /// Waits until the request's turn to look again, at most one poll interval when first in
    /// line (less if the client goes: `gone`).
    pub(super) async fn wait(
        &mut self,
        w: &Worker,
        up: &'a UpstreamRt,
        gone: Option<&ClientGone<'_>>,
    ) -> Waited {
        let by = self.by;
        let until = *self.until.get_or_insert_with(|| {
            let t = w.now() + up.cfg.connect_timeout;
            by.map_or(t, |b| b.min(t))
        });
        let now = w.now();
        if now >= until {
            return if by.is_some_and(|b| b <= now) {
                Waited::Deadline
            } else {
                Waited::GiveUp
            };
        }
        if self.pending.is_none() {
            let max = up.cfg.max_pending;
            let queued = up
                .shared
                .pending
                .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |n| {
                    (n < max).then_some(n + 1)
                })
                .is_ok();
            if !queued {
                return Waited::GiveUp;
            }
            self.pending = Some(Pending::new(up));
        }
        let ticket = match &self.place {
            Some(p) => p.ticket,
            None => {
                let p = Place::new(up, std::mem::take(&mut self.lost));
                let ticket = p.ticket;
                self.place = Some(p);
                ticket
            }
        };
        let queue = &up.queue;
        // Those behind the first need no timer of their own: they are woken in turn.
        let pause = if queue.is_first(ticket) {
            PENDING_POLL.min(until - w.now())
        } else {
            until - w.now()
        };
        let mut sleep = std::pin::pin!(crate::worker::deadline::sleep(pause));
        let turn = poll_fn(|cx| {
            if queue.poll_turn(ticket, cx).is_ready() {
                return Poll::Ready(());
            }
            std::future::Future::poll(sleep.as_mut(), cx)
        });
        match unless_gone(gone, std::pin::pin!(turn)).await {
            Some(()) => Waited::Again,
            None => Waited::ClientGone,
        }
    }
}

/// The answer to a request whose total timeout passed before it could be sent: a gateway
/// timeout of the request's own, which neither the breaker nor outlier detection hears of.
pub(super) fn unsent_timeout() -> Error {
    Error::new(ErrorKind::UpstreamTimeout, Side::Upstream)
        .with_cause("total_timeout passed before the request could be sent")
}

/// How often a request waiting for a connection looks again.
const PENDING_POLL: Duration = Duration::from_millis(2);

/// Forwards the request in `conn` to upstream `upstream`; returns whether the client
/// connection may serve another request.
pub(super) async fn proxy(
    w: &Worker,
    cg: &Rc<CoreGen>,
    conn: &mut ClientConn,
    info: &ReqInfo,
    route: &Route,
    action: &ProxyAction,
    params: Params,
) -> bool {
    let gen = &cg.gen;
    conn.log.upstream = Some(action.upstream);
    let Some(up) = cg.upstreams.get(action.upstream) else {
        // invariant: validate.rs only compiles routes naming existing upstreams.
        return fail(
            w,
            cg,
            conn,
            info,
            Error::new(ErrorKind::Internal, Side::Internal),
            true,
        )
        .await;
    };
    // A regex rewrite splices pieces of the path: what it makes must not mean another path
    // to the upstream (`/api..` rewritten to `/v2/..`). Prefix rewrites keep whole segments.
    if matches!(action.rewrite, crate::route::PathRewrite::Regex(_)) {
        let ambiguous = conn.rbuf.as_ref().and_then(|rbuf| {
            let mut scratch = cg.scratch.borrow_mut();
            let text = rewrite_target(&mut scratch, conn, rbuf.data(), route, action, &params);
            crate::http1::head::path_ambiguity(text)
        });
        if let Some(why) = ambiguous {
            let err = Error::new(ErrorKind::BadRequest, Side::Downstream)
                .with_cause(format!("rewritten path refused: {why}"));
            return fail(w, cg, conn, info, err, true).await;
        }
    }
    if conn.head.upgrade && conn.winding_down(w) {
        // A tunnel opened now would be cut at once (a draining worker closes its tunnels): a
        // WebSocket session the backend accepted, dropped without a close frame. Refused
        // before the upstream sees it, the client goes to another instance. (Nor does a
        // connection whose listener went or changed terms start a session that would outlive
        // them.)
        conn.consume_head(conn.head.len);
        let err = Error::new(ErrorKind::ShuttingDown, Side::Internal);
        return fail(w, cg, conn, info, err, true).await;
    }
    let head_len = conn.head.len;
    // (A declared length beyond it was answered before: `proxy::dispatch_on`.)
    let max_body = route.limits.max_body(gen.http.max_request_body_bytes);
    let response_timeout = action.response_timeout.unwrap_or(up.cfg.response_timeout);
    let read_timeout = action.read_timeout.unwrap_or(up.cfg.read_timeout);
    let has_body = info.framing.has_body();

    // Admission: after the route, before the upstream pick.
    let Ok(_permit) = admit(w, gen, route.priority_class) else {
        conn.consume_head(head_len);
        return fail(
            w,
            cg,
            conn,
            info,
            Error::new(ErrorKind::GatewaySaturated, Side::Internal),
            has_body,
        )
        .await;
    };
    up.count_request();
    let stats = up.shared.stats(w.id);
    let policy = &up.cfg.retries;
    let method_retryable = match info.method {
        Method::Post => policy.retry_post,
        m => m.is_idempotent(),
    };
    let try_timeout = policy.per_try_timeout.unwrap_or(response_timeout);
    // How long a half-open probe may take before its round is stale (see `Breaker::admit`).
    let try_ms = try_timeout.as_millis() as u64;
    let key = if up.needs_key() {
        request_key(&up.cfg.balancer, conn)
    } else {
        None
    };

    let body = match info.framing {
        f if !f.has_body() => BodyPlan::None,
        BodyFraming::Length(n)
            if method_retryable && policy.attempts > 1 && n <= policy.buffer_max_bytes as u64 =>
        {
            // (Within `buffer_max_bytes`, at most 64 MiB: it fits a usize.)
            match collect_body(w, cg, conn, info, head_len, n as usize).await {
                Ok(b) => BodyPlan::Buffered(b),
                Err(e) => {
                    conn.consume_head(head_len);
                    return fail(w, cg, conn, info, e, true).await;
                }
            }
        }
        _ => BodyPlan::Streamed,
    };
    // From the whole request (a buffered body's upload is the client's time, not the
    // upstream's), over every wait for a connection, attempt and pause.
    let total_deadline = w.now() + policy.total_timeout;
    if up.cfg.protocol.is_h2() {
        let plan = super::forward_h2::Plan {
            key,
            method_retryable,
            total_deadline,
            try_timeout,
            read_timeout,
            max_body,
            grpc_deadline: info.grpc_deadline,
        };
        // Boxed: an HTTP/2 exchange's future is larger than an HTTP/1.1 one's, and held
        // inline it would make every request's future that large (moved and zeroed per
        // request).
        return Box::pin(super::forward_h2::proxy(
            w, cg, conn, info, route, action, &params, up, body, plan,
        ))
        .await;
    }
    let mut bstate = BodyState {
        touched: false,
        done: !matches!(body, BodyPlan::Streamed),
        sent: false,
        sent_at: None,
    };

    let mut tried = Tried::default();
    let mut attempts = 0u32;
    let mut retry_slot: Option<RetrySlot<'_>> = None;
    let (ticket, inflight, mut upc, ubuf) = loop {
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
            tracing::debug!(request_id = ?info.rid.as_str(), upstream = %up.cfg.name, "circuit open");
            let close = !bstate.done || !info.keep_alive || conn.winding_down(w);
            if !bstate.done {
                conn.linger = true;
            }
            let sent =
                respond::error_retry_after(w, cg, conn, ErrorKind::CircuitOpen, secs, info, close)
                    .await;
            return sent && !close;
        }

        let mut may_retry = |class: FailureClass, status: u16, replayable: bool| {
            Retry {
                w,
                up,
                attempts,
                method_retryable,
                total_deadline,
            }
            .allowed(class, status, replayable, &mut retry_slot)
        };

        let replayable = resendable(info, &body);
        let streamed = matches!(body, BodyPlan::Streamed);
        let gone = queue_watch(w, cg, conn, streamed);
        let acquired = acquire(
            w,
            up,
            key,
            replayable,
            &mut tried,
            gone.as_ref(),
            total_deadline,
        )
        .await;
        drop(gone);
        let (inflight, upc, started) = match acquired {
            Ok(x) => {
                conn.log.endpoint = Some(x.0.endpoint().addr());
                x
            }
            Err(AcquireFail::ClientGone) => {
                conn.consume_head(head_len);
                return fail(w, cg, conn, info, cancelled(), true).await;
            }
            Err(AcquireFail::NoEndpoints) => {
                conn.consume_head(head_len);
                let err = Error::new(ErrorKind::NoEndpoint, Side::Upstream)
                    .with_cause("no endpoint in rotation");
                log_upstream(info, &up.cfg.name, None, &err);
                return fail(w, cg, conn, info, err, !bstate.done).await;
            }
            Err(AcquireFail::Saturated) => {
                add(&stats.saturated, 1);
                conn.consume_head(head_len);
                let err = Error::new(ErrorKind::UpstreamSaturated, Side::Internal);
                return fail(w, cg, conn, info, err, !bstate.done).await;
            }
            Err(AcquireFail::Deadline) => {
                conn.consume_head(head_len);
                return fail(w, cg, conn, info, unsent_timeout(), !bstate.done).await;
            }
            Err(AcquireFail::Connect(inflight, err)) => {
                let ep = inflight.endpoint().clone();
                conn.log.endpoint = Some(ep.addr());
                drop(inflight);
                record(w, up, &ep, ticket, Err(FailureClass::Connect));
                log_upstream(info, &up.cfg.name, Some(ep.addr()), &err);
                if let Some(pause) = may_retry(FailureClass::Connect, 0, !bstate.touched) {
                    match backoff(w, cg, conn, info, streamed, pause).await {
                        Ok(()) => continue,
                        Err(keep) => return keep,
                    }
                }
                conn.consume_head(head_len);
                return fail(w, cg, conn, info, err, !bstate.done).await;
            }
        };
        if total_deadline <= w.now() {
            // The total timeout ran out while the request waited for a connection: it is not
            // sent (it could only time out at once, blamed on a sound endpoint).
            up.release(upc, Instant::now());
            drop(inflight);
            drop(ticket);
            conn.consume_head(head_len);
            return fail(w, cg, conn, info, unsent_timeout(), !bstate.done).await;
        }
        // An endpoint's latency runs from its pick (`started`: a connect counts, a wait for a
        // connection slot does not), or from the end of a streamed body, to the response head.
        let head_deadline = |w: &Worker| {
            let d = w.now() + try_timeout;
            if matches!(body, BodyPlan::Streamed) {
                d
            } else {
                d.min(total_deadline)
            }
        };
        let outcome = exchange(
            w,
            cg,
            conn,
            info,
            route,
            action,
            &params,
            up,
            &inflight,
            upc,
            &body,
            &mut bstate,
            &head_deadline,
            max_body,
        )
        .await;
        let ep = inflight.endpoint().clone();
        match outcome {
            Exchange::Head(upc, ubuf) => {
                let done = Instant::now();
                let from = bstate.sent_at.map_or(started, |t| t.max(started));
                let elapsed = done.saturating_duration_since(from);
                ep.observe_latency(elapsed, done);
                up.record_latency(elapsed);
                let status = conn.resp.status;
                let retry = if status >= 500 {
                    may_retry(FailureClass::Status5xx, status, !bstate.touched)
                } else {
                    None
                };
                if let Some(pause) = retry {
                    drop(upc);
                    drop(inflight);
                    record(w, up, &ep, ticket, Err(FailureClass::Status5xx));
                    tracing::debug!(request_id = ?info.rid.as_str(), upstream = %up.cfg.name, endpoint = %ep.addr(), status, "retrying after a 5xx response");
                    match backoff(w, cg, conn, info, streamed, pause).await {
                        Ok(()) => continue,
                        Err(keep) => return keep,
                    }
                }
                ticket.settle_probe(&up.cfg.breaker, status, w.now_ms());
                break (ticket, inflight, upc, ubuf);
            }
            Exchange::Failed(err) => {
                drop(inflight);
                let class = failure_class(err.kind());
                record(w, up, &ep, ticket, Err(class));
                log_upstream(info, &up.cfg.name, Some(ep.addr()), &err);
                if let Some(pause) = may_retry(class, 0, !bstate.touched) {
                    match backoff(w, cg, conn, info, streamed, pause).await {
                        Ok(()) => continue,
                        Err(keep) => return keep,
                    }
                }
                conn.consume_head(head_len);
                return fail(w, cg, conn, info, err, !bstate.done).await;
            }
            Exchange::Local(err) => {
                // Neither the breaker nor outlier detection hears of it (the ticket's drop
                // gives a probe back).
                drop(inflight);
                drop(ticket);
                add(&stats.saturated, 1);
                conn.consume_head(head_len);
                return fail(w, cg, conn, info, err, !bstate.done).await;
            }
            Exchange::HeadTooLarge => {
                conn.consume_head(head_len);
                return fail(
                    w,
                    cg,
                    conn,
                    info,
                    Error::new(ErrorKind::HeadTooLarge, Side::Downstream),
                    true,
                )
                .await;
            }
            Exchange::Client(err) => {
                conn.consume_head(head_len);
                return fail(w, cg, conn, info, err, true).await;
            }
        }
    };
    conn.consume_head(head_len);
    drop(retry_slot);

    let status = conn.resp.status;
    // Built in place (`pin!`), as the exchange's other large steps: a future awaited by
    // value is put together on the stack and copied into this one's state, 1.5–4 KiB per
    // request each.
    let relayed = pin!(relay_response(
        w,
        cg,
        conn,
        info,
        &up.cfg.name,
        read_timeout,
        &mut upc,
        ubuf,
        bstate,
    ))
    .await;
    let ep = inflight.endpoint().clone();
    let outcome = if status >= 500 {
        Err(FailureClass::Status5xx)
    } else {
        relayed.upstream_failure.map_or(Ok(()), Err)
    };
    if let Some(pending) = relayed.tunnel {
        record(w, up, &ep, ticket, outcome);
        // The request's permits end here; the tunnel holds the two connections, and counts
        // as in flight on the endpoint.
        add(&w.metrics().tunnels_opened, 1);
        conn.tunnel = Some(Box::new(Tunnel {
            upstream: upc,
            pending,
            in_flight: inflight,
        }));
        return false;
    }
    drop(inflight);
    record(w, up, &ep, ticket, outcome);
    match relayed.reuse {
        Some(reuse) => {
            if reuse.upstream {
                let mut upc = upc;
                upc.set_check_before_reuse(conn.resp.framing == BodyFraming::None);
                w.release_upstream(cg, action.upstream, upc);
            }
            reuse.client
        }
        None => false,
    }
}

/// Waits out a retry's `pause` (the worker serves other connections meanwhile). `Err`: the
/// client went away during it (an HTTP/2 stream's reset, a closed socket), so the retry is
/// not sent and the exchange ends here, with whether the connection is kept.
pub(super) async fn backoff(
    w: &Worker,
    cg: &CoreGen,
    conn: &mut ClientConn,
    info: &ReqInfo,
    streamed: bool,
    pause: Duration,
) -> Result<(), bool> {
    if pause.is_zero() {
        return Ok(());
    }
    let gone = queue_watch(w, cg, conn, streamed);
    let sleep = pin!(crate::worker::deadline::sleep(pause));
    if unless_gone(gone.as_ref(), sleep).await.is_some() {
        return Ok(());
    }
    drop(gone);
    conn.consume_head(conn.head.len);
    Err(fail(w, cg, conn, info, cancelled(), true).await)
}

/// What [`collect_body`] reserves before any of the body came.
const COLLECT_FIRST_BYTES: usize = 64 * 1024;

/// Reads a whole Content-Length body of `n` bytes (within the replay buffer limit) into
/// memory, leaving the request head at the front of the read buffer.
pub(super) async fn collect_body(
    w: &Worker,
    cg: &CoreGen,
    conn: &mut ClientConn,
    info: &ReqInfo,
    head_len: usize,
    n: usize,
) -> Result<Vec<u8>, Error> {
    // Grown as the bytes come, not reserved as declared: heads declaring `buffer_max_bytes`
    // (up to 64 MiB) on many connections, with no body to follow, reserve nothing.
    let mut body = Vec::with_capacity(n.min(COLLECT_FIRST_BYTES));
    let mut continued = false;
    let mut ack = QuickAck::default();
    loop {
        let Some(mut rbuf) = conn.rbuf.take() else {
            return Err(Error::new(ErrorKind::ClientClosed, Side::Downstream));
        };
        let avail = rbuf.len().saturating_sub(head_len);
        let take = avail.min(n - body.len());
        body.extend_from_slice(&rbuf.data()[head_len..head_len + take]);
        rbuf.remove(head_len, take);
        if body.len() == n {
            conn.rbuf = Some(rbuf);
            return Ok(body);
        }
        if info.expect_continue && !continued && body.is_empty() {
            continued = true;
            let deadline = w.now() + cg.gen.http.send_timeout;
            if write_static_by(&mut conn.stream, CONTINUE, deadline)
                .await
                .is_err()
            {
                conn.rbuf = Some(rbuf);
                return Err(Error::new(ErrorKind::ClientClosed, Side::Downstream));
            }
            add(&w.metrics().bytes_out, CONTINUE.len() as u64);
        }
        rbuf.compact();
        rbuf.limit_next_read(n - body.len());
        // The body did not come whole with its head (see `quickack`).
        ack.before_wait(conn.stream.socket_fd());
        let deadline = w.now() + cg.gen.http.body_timeout;
        let (res, b) = pin!(read_by(&mut conn.stream, rbuf, deadline, &w.pool)).await;
        conn.rbuf = Some(b);
        match res {
            Ok(0) => {
                return Err(Error::new(ErrorKind::ClientClosed, Side::Downstream)
                    .with_cause("client closed before the end of the request body"))
            }
            Ok(k) => add(&w.metrics().bytes_in, k as u64),
            Err(e) if e.kind() == stdio::ErrorKind::TimedOut => {
                return Err(Error::new(ErrorKind::RequestTimeout, Side::Downstream).with_cause(e))
            }
            Err(e) => return Err(Error::client_io(e)),
        }
    }
}

/// A new connection to send a request again on, its stale predecessor dropped first (so that
/// a connection cap counts its slot as free); otherwise how the exchange ends: `failed` (the
/// stale connection's error) when connecting fails, a local refusal at the cap.
async fn reconnect(w: &Worker, up: &UpstreamRt, inflight: &InFlight) -> Result<UpConn, Exchange> {
    let ep = inflight.endpoint();
    match up.connect(ep, true, false, w.now()).await {
        Ok(c) => Ok(c),
        Err(ConnectError::Busy) => Err(Exchange::Local(Error::new(
            ErrorKind::UpstreamSaturated,
            Side::Internal,
        ))),
        // The connect's own failure (a refused or timed-out connect, retried as one), not
        // the stale connection's close.
        Err(e) => Err(Exchange::Failed(connect_error(ep, e))),
    }
}

/// The error of a failed connect to `ep` (`Busy` is no failure: callers wait or refuse).
pub(super) fn connect_error(ep: &EndpointRt, e: ConnectError) -> Error {
    match e {
        ConnectError::TimedOut => Error::new(ErrorKind::UpstreamConnectTimeout, Side::Upstream)
            .with_cause(format!("connect to {} timed out", ep.addr())),
        ConnectError::Failed(e) => Error::new(ErrorKind::UpstreamConnect, Side::Upstream)
            .with_cause(format!("connect to {}: {e}", ep.addr())),
        ConnectError::Busy => Error::new(ErrorKind::UpstreamSaturated, Side::Internal),
    }
}

/// Whether an upstream's interim response of `status` goes on to the client: any but a
/// 100 Continue (ringway answers `Expect` itself, and sent its own) and a 101 (an upgrade's
/// final answer).
pub(super) fn relayed_interim(status: u16) -> bool {
    (102..200).contains(&status)
}

/// An interim response head written as HTTP/1.1 (for an HTTP/2 client, the stream's bridge
/// reads it back into a HEADERS frame); `None` when it is larger than a block (it is only a
/// hint: left out).
pub(super) fn interim_head<'a>(
    w: &Worker,
    status: u16,
    reason: &[u8],
    fields: impl Iterator<Item = (&'a [u8], &'a [u8])>,
) -> Option<Block> {
    let mut out = w.pool.take();
    put_status_line(&mut out, status, reason).ok()?;
    // No framing field: a 1xx has no body (RFC 9110 §8.6), and a client that believed a
    // length would take the next response's bytes for it.
    for (name, value) in fields {
        if matches!(
            HeaderKind::classify(name),
            HeaderKind::ContentLength | HeaderKind::TransferEncoding
        ) {
            continue;
        }
        put_field(&mut out, name, value).ok()?;
    }
    out.put(b"\r\n").ok()?;
    Some(out)
}

/// Writes an interim response head ([`interim_head`]) to the client.
pub(super) async fn write_interim(
    w: &Worker,
    cg: &CoreGen,
    conn: &mut ClientConn,
    out: Block,
) -> Result<(), Error> {
    let len = out.len() as u64;
    let stall = Stall::to_client(&conn.stream, w.now(), cg.gen.http.send_timeout);
    let (res, _) = pin!(write_all_by(&mut conn.stream, out, stall, &w.pool)).await;
    res.map_err(Error::client_io)?;
    add(&w.metrics().bytes_out, len);
    conn.log.sent += len;
    Ok(())
}

/// How one attempt on a connection ended.
enum Exchange {
    /// A final response head is at the front of the block.
    Head(UpConn, Block),
    /// The upstream failed before a response head.
    Failed(Error),
    /// Refused here (the endpoint's connection cap): says nothing about the endpoint.
    Local(Error),
    /// The rewritten request head does not fit a block.
    HeadTooLarge,
    /// The client failed while its body was streamed.
    Client(Error),
}

/// Sends the request on `upc` and reads the response head. A pooled connection that turns
/// out closed before any response byte is replaced once by a new connection to the same
/// endpoint, when the request can be sent again (idempotent, body none or buffered).
#[allow(clippy::too_many_arguments)]
async fn exchange(
    w: &Worker,
    cg: &CoreGen,
    conn: &mut ClientConn,
    info: &ReqInfo,
    route: &Route,
    action: &ProxyAction,
    params: &Params,
    up: &UpstreamRt,
    inflight: &InFlight,
    mut upc: UpConn,
    body: &BodyPlan,
    bstate: &mut BodyState,
    head_deadline: &dyn Fn(&Worker) -> Instant,
    max_body: Option<u64>,
) -> Exchange {
    let head_len = conn.head.len;
    let mut fresh = !upc.is_reused();
    let resend_ok = resendable(info, body);
    // A client gone (an HTTP/2 stream reset, a socket closed: `proxy::gone`) ends the wait
    // for the response head, and the upstream request with it.
    let pipelined = conn.pipelines(head_len, !matches!(body, BodyPlan::Streamed));
    let mut gone = ClientGone::of(w, cg, &conn.stream, pipelined);
    // Interim responses passed on to the client, over all attempts.
    let mut interim = 0;
    loop {
        let mut ubuf = w.pool.take();
        if encode_request(cg, conn, info, &upc, route, action, params, &mut ubuf).is_err() {
            return Exchange::HeadTooLarge;
        }
        let mut rest: &[u8] = &[];
        match body {
            BodyPlan::None => {}
            BodyPlan::Buffered(b) => {
                let n = b.len().min(ubuf.spare());
                let _ = ubuf.put(&b[..n]);
                rest = &b[n..];
            }
            BodyPlan::Streamed => {
                // The head leaves the buffer now, and a small body that is already here
                // rides along in the same write.
                conn.consume_head(head_len);
                bstate.touched = true;
                if let (BodyFraming::Length(n), Some(rbuf)) = (info.framing, conn.rbuf.as_mut()) {
                    // (A length beyond usize, on a 32-bit target, is never here whole.)
                    let n = usize::try_from(n).unwrap_or(usize::MAX);
                    if rbuf.len() >= n && ubuf.spare() >= n {
                        let _ = ubuf.put(&rbuf.data()[..n]);
                        rbuf.consume(n);
                        bstate.done = true;
                    }
                }
            }
        }

        let stall = Stall::new(w.now(), cg.gen.http.send_timeout);
        let (res, buf) = pin!(write_all_by(&mut upc.write, ubuf, stall, &w.pool)).await;
        let mut ubuf = buf;
        if let Err(e) = res {
            let err = Error::upstream_io(e);
            if !fresh && resend_ok && err.kind().retryable(true) {
                tracing::debug!(endpoint = %upc.addr(), "stale pooled connection; sending again on a new one");
                drop(upc);
                match reconnect(w, up, inflight).await {
                    Ok(c) => {
                        upc = c;
                        fresh = true;
                        continue;
                    }
                    Err(end) => return end,
                }
            }
            return Exchange::Failed(err);
        }
        ubuf.clear();

        let mut all_sent = true;
        let result = if !rest.is_empty() {
            let (result, sent) = pin!(send_rest_and_read_head(
                w,
                &mut upc,
                rest,
                cg.gen.http.send_timeout,
                ubuf,
                &mut conn.resp,
                info.method,
                head_deadline,
                gone.as_ref(),
            ))
            .await;
            all_sent = sent;
            result
        } else if bstate.done {
            // The request is all sent: interim responses (103 Early Hints) go on to an
            // HTTP/1.1 or HTTP/2 client as they come (RFC 9110 §15.2).
            let fd = upc.fd();
            let relay = info.version != Version::Http10;
            loop {
                let head = pin!(read_response_head(
                    w,
                    &mut upc.read,
                    fd,
                    ubuf,
                    &mut conn.resp,
                    info.method,
                    Some(head_deadline(w)),
                    gone.as_ref(),
                    relay,
                ))
                .await;
                let mut b = match head {
                    Ok(b) if relayed_interim(conn.resp.status) => b,
                    other => break other,
                };
                interim += 1;
                if interim > MAX_INTERIM_RESPONSES {
                    break Err(HeadError {
                        error: Error::new(ErrorKind::UpstreamInvalid, Side::Upstream)
                            .with_cause("too many interim responses"),
                        got_bytes: true,
                    });
                }
                // (The watch on the client lets go of it for the write.)
                drop(gone.take());
                // Without its connection-specific fields.
                let head = b.data();
                let fields = conn.resp.headers.iter().filter(|h| !h.hop);
                let fields = fields.map(|h| (h.name.get(head), h.value.get(head)));
                let reason = conn.resp.reason.get(head);
                if let Some(out) = interim_head(w, conn.resp.status, reason, fields) {
                    if let Err(e) = write_interim(w, cg, conn, out).await {
                        return Exchange::Client(e);
                    }
                }
                gone = ClientGone::of(w, cg, &conn.stream, pipelined);
                b.consume(conn.resp.len);
                ubuf = b;
            }
        } else {
            match pin!(send_body_and_read_head(
                w,
                cg,
                conn,
                info,
                &mut upc,
                ubuf,
                head_deadline,
                max_body,
                gone.as_ref(),
            ))
            .await
            {
                BodyOutcome::Sent(result, at) => {
                    bstate.done = true;
                    bstate.sent_at = Some(at);
                    result
                }
                BodyOutcome::Interrupted(result) => result,
                BodyOutcome::ClientFailed(err) => return Exchange::Client(err),
            }
        };
        match result {
            Ok(ubuf) => {
                // Answered before it had all of a buffered body: that upstream connection
                // is not reused. (The body stays whole in its buffer, and `done`: a retry
                // sends all of it again from there.)
                bstate.sent = bstate.done && all_sent;
                return Exchange::Head(upc, ubuf);
            }
            Err(HeadError { error, .. }) if error.side() == Side::Downstream => {
                return Exchange::Client(error);
            }
            Err(HeadError { error, got_bytes }) => {
                // An interim response came before the failure: the upstream had the request
                // (it is not sent again on a new connection, whatever came next).
                let answered = got_bytes || interim > 0;
                // Bytes that are no response on a connection reused without the idle check
                // were stray bytes from before this request: it was never answered.
                let stray = interim == 0
                    && upc.is_unchecked()
                    && error.kind() == ErrorKind::UpstreamInvalid;
                if !fresh && resend_ok && ((!answered && error.kind().retryable(true)) || stray) {
                    tracing::debug!(endpoint = %upc.addr(), "pooled connection closed before responding; sending again on a new one");
                    drop(upc);
                    match reconnect(w, up, inflight).await {
                        Ok(c) => {
                            upc = c;
                            fresh = true;
                            continue;
                        }
                        Err(end) => return end,
                    }
                }
                return Exchange::Failed(error);
            }
        }
    }
}

/// Writes the rest of a buffered body (what did not fit the head's block) while watching
/// for the response head: an upstream may answer (413, 401, ...) and stop reading before it
/// has the whole body, and that answer is relayed rather than a failed write. Returns the
/// head's outcome and whether all of the body went out.
#[allow(clippy::too_many_arguments)]
async fn send_rest_and_read_head(
    w: &Worker,
    upc: &mut UpConn,
    rest: &[u8],
    send_timeout: Duration,
    ubuf: Block,
    resp: &mut ResponseHead,
    method: Method,
    head_deadline: &dyn Fn(&Worker) -> Instant,
    gone: Option<&ClientGone<'_>>,
) -> (Result<Block, HeadError>, bool) {
    let fd = upc.fd();
    let UpConn { read, write, .. } = upc;
    let mut send = std::pin::pin!(write_bytes(w, write, rest, send_timeout));
    let mut head = std::pin::pin!(read_response_head(
        w, read, fd, ubuf, resp, method, None, gone, false
    ));
    match race(send.as_mut(), head.as_mut()).await {
        Either::Left(Ok(())) => (
            await_head(head.as_mut(), head_deadline(w), None).await,
            true,
        ),
        Either::Left(Err(e)) => {
            // The upstream stopped reading; it may have answered first (a connection that
            // was closed answers nothing, and the request may be sent again).
            tracing::debug!(error = %e, "upstream stopped reading the buffered request body");
            (
                await_head(head.as_mut(), head_deadline(w), None).await,
                false,
            )
        }
        Either::Right(result) => (result, false),
    }
}

/// Writes `bytes` (a buffered body beyond the head block) through pooled blocks.
async fn write_bytes(
    w: &Worker,
    up: &mut WriteHalf,
    mut bytes: &[u8],
    send_timeout: Duration,
) -> stdio::Result<()> {
    while !bytes.is_empty() {
        let mut b = w.body_pool.take();
        let n = bytes.len().min(b.spare());
        let _ = b.put(&bytes[..n]);
        bytes = &bytes[n..];
        let (res, _) = pin!(write_all_by(
            up,
            b,
            Stall::new(w.now(), send_timeout),
            &w.body_pool
        ))
        .await;
        res?;
    }
    Ok(())
}

/// The request path after the route's rewrite (in the worker's scratch text).
pub(super) fn rewrite_target<'s>(
    scratch: &'s mut crate::worker::ctx::Scratch,
    conn: &ClientConn,
    src: &[u8],
    route: &Route,
    action: &ProxyAction,
    params: &Params,
) -> &'s [u8] {
    let head = &conn.head;
    let path = head.routed_path(src);
    let crate::worker::ctx::Scratch { text, captures, .. } = scratch;
    rewrite_path(
        &action.rewrite,
        path,
        params,
        route.param_names(),
        captures.get_mut(route.index).and_then(Option::as_mut),
        text,
    );
    text.as_slice()
}

/// The Host (or `:authority`) sent upstream: the client's with `preserve_host`, else the
/// endpoint's `authority`.
pub(super) fn upstream_host<'a>(
    conn: &ClientConn,
    src: &'a [u8],
    action: &ProxyAction,
    authority: &'a str,
) -> &'a [u8] {
    if action.preserve_host && conn.head.host.len > 0 {
        conn.head.host.get(src)
    } else {
        authority.as_bytes()
    }
}

/// Whether the peer is a trusted proxy (its forwarding fields are kept), and the
/// X-Forwarded-Proto to set (`None`: keep a trusted peer's).
pub(super) fn forwarding(cg: &CoreGen, conn: &ClientConn) -> (bool, Option<&'static [u8]>) {
    let trusted = peer_trusted(cg, conn);
    // (A field the peer lists in Connection was for ringway alone: it is as if not sent.)
    let keep_proto = trusted
        && conn
            .head
            .headers
            .iter()
            .any(|h| h.kind == HeaderKind::XForwardedProto && !h.hop);
    let proto: Option<&'static [u8]> = match (keep_proto, conn.stream.is_tls()) {
        (true, _) => None,
        (false, true) => Some(b"https"),
        (false, false) => Some(b"http"),
    };
    (trusted, proto)
}

/// Whether the client is one of `gateway.trusted_proxies` (its forwarding fields stand).
pub(super) fn peer_trusted(cg: &CoreGen, conn: &ClientConn) -> bool {
    cg.gen
        .gateway
        .trusted_proxies
        .iter()
        .any(|net| net.contains(&conn.peer.ip()))
}

/// Writes the upstream request head into `out`: the route's path rewrite, the Host, the
/// forwarding fields.
#[allow(clippy::too_many_arguments)]
fn encode_request(
    cg: &CoreGen,
    conn: &ClientConn,
    info: &ReqInfo,
    upc: &UpConn,
    route: &Route,
    action: &ProxyAction,
    params: &Params,
    out: &mut Block,
) -> Result<(), crate::buf::Full> {
    let Some(rbuf) = conn.rbuf.as_ref() else {
        return Err(crate::buf::Full);
    };
    let src = rbuf.data();
    let head = &conn.head;
    let host = upstream_host(conn, src, action, upc.authority());
    let (trusted, forwarded_proto) = forwarding(cg, conn);
    let peer = conn.peer.text().as_bytes();
    let mut scratch = cg.scratch.borrow_mut();
    let text = rewrite_target(&mut scratch, conn, src, route, action, params);
    let edits = RequestEdits {
        target: [text, head.query.get(src), b""],
        host,
        forwarded_for: if trusted {
            ForwardedFor::Append(peer)
        } else {
            ForwardedFor::Replace(peer)
        },
        real_ip: peer,
        forwarded_proto,
        keep_forwarded: trusted,
        request_id: info.rid.as_bytes(),
        upgrade: head.upgrade,
    };
    write_request_head(src, head, &edits, out)
}

enum BodyOutcome {
    /// The whole body went upstream (at the instant given); then the response head (or its
    /// failure).
    Sent(Result<Block, HeadError>, Instant),
    /// The upstream answered, or failed, before the body was sent completely.
    Interrupted(Result<Block, HeadError>),
    /// The client failed (went away, too slow, body too large or malformed).
    ClientFailed(Error),
}

/// `100 Continue` to a client that waits for it before sending its body (RFC 9110 §10.1.1),
/// when the body is about to be read and none of it has come yet.
pub(super) async fn send_continue(
    w: &Worker,
    cg: &CoreGen,
    conn: &mut ClientConn,
    info: &ReqInfo,
) -> Result<(), Error> {
    if info.expect_continue && conn.rbuf.as_ref().is_some_and(Block::is_empty) {
        let deadline = w.now() + cg.gen.http.send_timeout;
        if write_static_by(&mut conn.stream, CONTINUE, deadline)
            .await
            .is_err()
        {
            return Err(Error::new(ErrorKind::ClientClosed, Side::Downstream));
        }
        add(&w.metrics().bytes_out, CONTINUE.len() as u64);
    }
    Ok(())
}

/// Streams the request body upstream while watching for the response head: an upstream may
/// answer (413, 401, ...) before it has read the whole body.
#[allow(clippy::too_many_arguments)]
async fn send_body_and_read_head(
    w: &Worker,
    cg: &CoreGen,
    conn: &mut ClientConn,
    info: &ReqInfo,
    upc: &mut UpConn,
    ubuf: Block,
    head_deadline: &dyn Fn(&Worker) -> Instant,
    max_body: Option<u64>,
    gone: Option<&ClientGone<'_>>,
) -> BodyOutcome {
    if let Err(e) = send_continue(w, cg, conn, info).await {
        return BodyOutcome::ClientFailed(e);
    }
    let ClientConn {
        stream, rbuf, resp, ..
    } = conn;
    let up_fd = upc.plain_fd();
    let fd = upc.fd();
    let UpConn { read, write, .. } = upc;
    let mut pump = std::pin::pin!(pump_request_body(
        w,
        cg,
        stream,
        rbuf,
        write,
        up_fd,
        info.framing,
        max_body
    ));
    // The client is watched only once its body has gone up: one that shuts down its side
    // after its upload (as `nc -N` does) is no close while the upload is still under way.
    let mut head = std::pin::pin!(read_response_head(
        w,
        read,
        fd,
        ubuf,
        resp,
        info.method,
        None,
        None,
        false
    ));
    let outcome = race(pump.as_mut(), head.as_mut()).await;
    if let Some(g) = gone {
        g.restart(w.now());
    }
    match outcome {
        Either::Left(Ok(())) => {
            let at = Instant::now();
            BodyOutcome::Sent(await_head(head.as_mut(), head_deadline(w), gone).await, at)
        }
        Either::Left(Err(e)) if e.side() == Side::Upstream => {
            // The upstream stopped reading; it may have answered first.
            tracing::debug!(error = %e, "upstream stopped reading the request body");
            BodyOutcome::Interrupted(await_head(head.as_mut(), head_deadline(w), gone).await)
        }
        Either::Left(Err(e)) => BodyOutcome::ClientFailed(e),
        Either::Right(result) => BodyOutcome::Interrupted(result),
    }
}

/// `head` by `deadline`; a client that goes meanwhile (`gone`) ends the wait.
async fn await_head<F>(
    head: std::pin::Pin<&mut F>,
    deadline: Instant,
    gone: Option<&ClientGone<'_>>,
) -> Result<Block, HeadError>
where
    F: std::future::Future<Output = Result<Block, HeadError>>,
{
    let timed = crate::worker::deadline::within(deadline, head);
    match unless_gone(gone, std::pin::pin!(timed)).await {
        Some(Some(r)) => r,
        None => Err(HeadError {
            error: cancelled(),
            got_bytes: true,
        }),
        Some(None) => Err(HeadError {
            error: Error::new(ErrorKind::UpstreamTimeout, Side::Upstream)
                .with_cause("no response head in time"),
            got_bytes: true,
        }),
    }
}

/// Sends the rest of the request body from the client to the upstream (`up_fd`: its socket,
/// when cleartext).
#[allow(clippy::too_many_arguments)]
async fn pump_request_body(
    w: &Worker,
    cg: &CoreGen,
    client: &mut ClientStream,
    rbuf: &mut Option<Block>,
    up: &mut WriteHalf,
    up_fd: Option<RawFd>,
    framing: BodyFraming,
    max_body: Option<u64>,
) -> Result<(), Error> {
    let http = &cg.gen.http;
    let mut seg = WholeSegments::default();
    let mut remaining = match framing {
        BodyFraming::Length(n) => n,
        BodyFraming::Chunked => u64::MAX,
        BodyFraming::None | BodyFraming::UntilClose => return Ok(()),
    };
    let mut decoder = ChunkedDecoder::new();
    let mut ack = QuickAck::default();
    loop {
        let mut buf = rbuf.take().unwrap_or_else(|| w.pool.take());
        if buf.is_empty() {
            // The body did not come whole with its head: the rest must not wait for a
            // delayed ACK (see `quickack`).
            ack.before_wait(client.socket_fd());
            w.body_block(&mut buf);
            let spare = buf.spare();
            let mut limit = match framing {
                BodyFraming::Chunked => usize::MAX,
                _ => remaining.min(usize::MAX as u64) as usize,
            };
            if let Some(whole) = seg.limit(spare) {
                limit = limit.min(whole);
            }
            if limit != usize::MAX {
                buf.limit_next_read(limit);
            }
            let deadline = w.now() + http.body_timeout;
            let (res, b) = pin!(read_by(client, buf, deadline, &w.pool)).await;
            buf = b;
            match res {
                Ok(0) => {
                    *rbuf = Some(buf);
                    return Err(Error::new(ErrorKind::ClientClosed, Side::Downstream)
                        .with_cause("client closed before the end of the request body"));
                }
                Ok(n) => {
                    add(&w.metrics().bytes_in, n as u64);
                    seg.after_read(n, spare, || up_fd.and_then(crate::net::sys::segment_size));
                }
                Err(e) if e.kind() == stdio::ErrorKind::TimedOut => {
                    *rbuf = Some(buf);
                    return Err(
                        Error::new(ErrorKind::RequestTimeout, Side::Downstream).with_cause(e)
                    );
                }
                Err(e) => {
                    *rbuf = Some(buf);
                    return Err(Error::client_io(e));
                }
            }
        }
        // Chunked: relayed without chunk extensions and trailer fields, which are dropped: a
        // backend that merges trailers into headers must not receive forwarding fields
        // ringway did not set.
        let (n, skipped) = if framing == BodyFraming::Chunked {
            match filter_in_place(&mut decoder, buf.data_mut(), Keep::NoTrailers) {
                Ok((kept, consumed)) => (kept, consumed - kept),
                Err(e) => {
                    *rbuf = Some(buf);
                    return Err(Error::new(ErrorKind::BadRequest, Side::Downstream).with_cause(e));
                }
            }
        } else {
            let n = (buf.len() as u64).min(remaining) as usize;
            remaining -= n as u64;
            (n, 0)
        };
        if max_body.is_some_and(|max| decoder.data_total() > max) {
            *rbuf = Some(buf);
            return Err(Error::new(ErrorKind::BodyTooLarge, Side::Downstream));
        }
        let stall = Stall::new(w.now(), http.send_timeout);
        let (res, mut b) = pin!(write_front_by(up, buf, n, stall, &w.pool)).await;
        if let Err(e) = res {
            *rbuf = Some(b);
            return Err(Error::upstream_io(e));
        }
        b.consume(skipped);
        *rbuf = Some(b);
        let done = if framing == BodyFraming::Chunked {
            decoder.is_done()
        } else {
            remaining == 0
        };
        if done {
            if let Some(b) = rbuf.as_mut() {
                w.head_block(b);
            }
            return Ok(());
        }
    }
}

/// Whether the bytes of `buf` after `from` complete a line.
fn ends_a_line(buf: &[u8], from: usize) -> bool {
    buf.get(from..).is_some_and(|new| new.contains(&b'\n'))
}

/// A failure to get a response head, and whether any response byte had arrived.
struct HeadError {
    error: Error,
    got_bytes: bool,
}

/// The error of an exchange whose HTTP/2 client reset its stream before the response head.
pub(super) fn cancelled() -> Error {
    Error::new(ErrorKind::ClientClosed, Side::Downstream)
        .with_cause("the client cancelled the request")
}

/// Reads until a final (non-1xx) response head is buffered at the front of the returned block.
/// A client that goes meanwhile (`gone`) ends the wait with a downstream `ClientClosed`.
/// `up_fd`: the socket under `up`, acknowledged at once when the head comes in pieces.
/// `relay_interim`: an interim response to pass on ([`relayed_interim`]) is returned too.
#[allow(clippy::too_many_arguments)]
async fn read_response_head(
    w: &Worker,
    up: &mut ReadHalf,
    up_fd: RawFd,
    mut ubuf: Block,
    resp: &mut ResponseHead,
    method: Method,
    deadline: Option<Instant>,
    gone: Option<&ClientGone<'_>>,
    relay_interim: bool,
) -> Result<Block, HeadError> {
    let mut got_bytes = false;
    let mut ack = QuickAck::default();
    let mut interim = 0;
    // Bytes of `ubuf` already parsed as an incomplete head (0: none yet, parse at once): a
    // head that trickles in is parsed again only once a read completes a line (which may end
    // the head, or show a malformed line at once).
    let mut scanned = 0;
    let err = |kind, got_bytes, cause: &'static str| HeadError {
        error: Error::new(kind, Side::Upstream).with_cause(cause),
        got_bytes,
    };
    loop {
        if !ubuf.is_empty() && (scanned == 0 || ends_a_line(ubuf.data(), scanned)) {
            match parse_response(ubuf.data(), MAX_HEADERS_HARD_LIMIT, method, resp) {
                Ok(Some(len)) => {
                    if relay_interim && relayed_interim(resp.status) {
                        // At the front of `ubuf`, for the caller to pass on.
                        return Ok(ubuf);
                    }
                    if (100..200).contains(&resp.status) && resp.status != 101 {
                        // Other interim responses are not relayed: a 100 Continue (ringway
                        // answers Expect itself), or any while the request body still goes up.
                        interim += 1;
                        if interim > MAX_INTERIM_RESPONSES {
                            return Err(err(
                                ErrorKind::UpstreamInvalid,
                                true,
                                "too many interim responses",
                            ));
                        }
                        ubuf.consume(len);
                        scanned = 0;
                        continue;
                    }
                    return Ok(ubuf);
                }
                Ok(None) => scanned = ubuf.len(),
                Err(e) => {
                    return Err(HeadError {
                        error: Error::new(ErrorKind::UpstreamInvalid, Side::Upstream).with_cause(e),
                        got_bytes: true,
                    })
                }
            }
        }
        if ubuf.spare() == 0 {
            ubuf.compact();
            if ubuf.spare() == 0 {
                return Err(err(
                    ErrorKind::UpstreamInvalid,
                    true,
                    "response head too large",
                ));
            }
        }
        if got_bytes {
            // The head came in pieces: the rest must not wait for a delayed ACK.
            ack.before_wait(Some(up_fd));
        }
        let mut read = std::pin::pin!(async {
            match deadline {
                Some(d) => pin!(read_by(up, ubuf, d, &w.pool)).await,
                None => {
                    use monoio::io::AsyncReadRent;
                    up.read(ubuf).await
                }
            }
        });
        let read = unless_gone(gone, read.as_mut()).await;
        let Some((res, buf)) = read else {
            return Err(HeadError {
                error: cancelled(),
                got_bytes,
            });
        };
        ubuf = buf;
        match res {
            Ok(0) => {
                return Err(err(
                    ErrorKind::UpstreamClosed,
                    got_bytes,
                    "upstream closed before a complete response head",
                ))
            }
            Ok(_) => got_bytes = true,
            Err(e) if e.kind() == stdio::ErrorKind::TimedOut => {
                return Err(HeadError {
                    error: Error::new(ErrorKind::UpstreamTimeout, Side::Upstream).with_cause(e),
                    got_bytes,
                })
            }
            Err(e) => {
                return Err(HeadError {
                    error: Error::upstream_io(e),
                    got_bytes,
                })
            }
        }
    }
}

/// What may be reused after the exchange.
struct Reuse {
    client: bool,
    upstream: bool,
}

/// How relaying a response went.
struct Relayed {
    /// `None` when the exchange failed after the response started (the client connection
    /// must close).
    reuse: Option<Reuse>,
    /// The upstream's fault, if it failed (for passive health and the breaker).
    upstream_failure: Option<FailureClass>,
    /// A 101 went to the client: the connections become a tunnel; upstream bytes that came
    /// with the 101 and did not fit behind it.
    tunnel: Option<Block>,
}

impl Relayed {
    /// An invalid response answered with an error before any byte went out; `sent`: the
    /// client connection may go on.
    fn invalid(sent: bool) -> Relayed {
        Relayed {
            reuse: sent.then_some(Reuse {
                client: true,
                upstream: false,
            }),
            upstream_failure: Some(FailureClass::Invalid),
            tunnel: None,
        }
    }
}

/// Relays a 101 to an upgrade request: its head with the Upgrade protocols and
/// `Connection: upgrade`, and whatever the upstream sent after it; the connections then become
/// a tunnel (`proxy::tunnel`), started by the connection task.
async fn switch_protocols(
    w: &Worker,
    cg: &CoreGen,
    conn: &mut ClientConn,
    info: &ReqInfo,
    mut ubuf: Block,
) -> Relayed {
    let mut out = w.body_pool.take();
    let date = w.date();
    let edits = ResponseEdits {
        framing: BodyFraming::None,
        connection: None,
        request_id: info.rid.as_bytes(),
        upgrade: true,
        date: &date,
    };
    let written = write_response_head(ubuf.data(), &conn.resp, &edits, &mut out);
    ubuf.consume(conn.resp.len);
    if written.is_err() {
        return Relayed::invalid(false);
    }
    // Tunnel bytes that came with the 101 go right behind it (as many as fit; the rest
    // first thing in the tunnel).
    out.put_from(&mut ubuf);
    let stall = Stall::new(w.now(), cg.gen.http.send_timeout);
    let len = out.len() as u64;
    w.metrics().response(101);
    let (res, _) = pin!(write_all_by(&mut conn.stream, out, stall, &w.pool)).await;
    if res.is_err() {
        conn.log.client_left();
        return Relayed {
            reuse: None,
            upstream_failure: None,
            tunnel: None,
        };
    }
    add(&w.metrics().bytes_out, len);
    conn.log.wrote(101, len);
    Relayed {
        reuse: None,
        upstream_failure: None,
        tunnel: Some(ubuf),
    }
}

/// Sends the response head and relays the body.
#[allow(clippy::too_many_arguments)]
async fn relay_response(
    w: &Worker,
    cg: &CoreGen,
    conn: &mut ClientConn,
    info: &ReqInfo,
    up_name: &str,
    read_timeout: std::time::Duration,
    upc: &mut UpConn,
    mut ubuf: Block,
    bstate: BodyState,
) -> Relayed {
    // `body_read`: nothing of the request is left on the client connection;
    // `body_sent`: the upstream connection has all of it.
    let (body_read, body_sent) = (bstate.done, bstate.sent);
    let resp = &conn.resp;
    if resp.status == 101 {
        // A 101 names the protocols switched to, among those the request offered (RFC 9110
        // §7.8): one naming none is no switch (a backend reflecting a status, say), and a
        // tunnel opened on it, or on one the client did not ask for, would carry the
        // client's next bytes past routing as something it never agreed to.
        let names_protocol = {
            let mut named = crate::http1::head::upgrade_protocols(&resp.headers, ubuf.data());
            named.next().is_some_and(|p| conn.offered.contains(p))
                && named.all(|p| conn.offered.contains(p))
        };
        if conn.head.upgrade && body_sent && names_protocol {
            return switch_protocols(w, cg, conn, info, ubuf).await;
        }
        // Only a forwarded upgrade may be answered with 101 (and only once the request body
        // is complete: what follows is no longer HTTP).
        let err =
            Error::new(ErrorKind::UpstreamInvalid, Side::Upstream).with_cause("unexpected 101");
        log_upstream(info, up_name, Some(upc.addr()), &err);
        return Relayed::invalid(fail(w, cg, conn, info, err, !body_read).await);
    }
    let http10 = info.version == Version::Http10;
    let (relay, out_framing) = match resp.framing {
        BodyFraming::None => {
            let declared = if crate::http1::bodiless_length_stated(info.method, resp.status) {
                resp.content_length
                    .map_or(BodyFraming::None, BodyFraming::Length)
            } else {
                BodyFraming::None
            };
            (Relay::None, declared)
        }
        BodyFraming::Length(n) => (Relay::Length(n), BodyFraming::Length(n)),
        BodyFraming::Chunked if http10 => (Relay::Dechunk, BodyFraming::None),
        BodyFraming::Chunked => (Relay::Chunked, BodyFraming::Chunked),
        BodyFraming::UntilClose => (Relay::UntilClose, BodyFraming::None),
    };
    let keep_client = info.keep_alive
        && body_read
        && !conn.winding_down(w)
        && !matches!(relay, Relay::Dechunk | Relay::UntilClose);
    let connection: Option<&[u8]> = if !keep_client {
        Some(b"close")
    } else if http10 {
        Some(b"keep-alive")
    } else {
        None
    };
    let status = resp.status;
    let upstream_keep_alive = resp.keep_alive;

    let mut out = w.pool.take();
    let date = w.date();
    let edits = ResponseEdits {
        framing: out_framing,
        connection,
        request_id: info.rid.as_bytes(),
        upgrade: false,
        date: &date,
    };
    // An HTTP/2 stream takes the head typed (it would only parse the bytes back); it is
    // handed over with the first body bytes, below.
    let typed = match &conn.stream {
        ClientStream::Virtual(_) => {
            crate::h2::h2_response(resp, ubuf.data(), Some(&edits), w.date_value())
        }
        _ => None,
    };
    if typed.is_none() && write_response_head(ubuf.data(), resp, &edits, &mut out).is_err() {
        let err = Error::new(ErrorKind::UpstreamInvalid, Side::Upstream)
            .with_cause("response head too large to relay");
        log_upstream(info, up_name, Some(upc.addr()), &err);
        return Relayed::invalid(fail(w, cg, conn, info, err, !body_read).await);
    }
    ubuf.consume(resp.len);
    if !keep_client {
        conn.linger = !body_read;
    }

    let mut relay_state = RelayState {
        remaining: match relay {
            Relay::Length(n) => n,
            _ => 0,
        },
        decoder: ChunkedDecoder::new(),
        sent: 0,
    };
    // The first body bytes ride with the head when they fit.
    if let Err(e) = relay_state.fill_head_block(relay, &mut ubuf, &mut out) {
        // Nothing was sent yet, but the head is already committed to this response.
        log_upstream(info, up_name, Some(upc.addr()), &e);
        return Relayed::invalid(fail(w, cg, conn, info, e, !body_read).await);
    }
    let mut sent = Ok(());
    if let (Some(head), ClientStream::Virtual(v)) = (typed, &conn.stream) {
        let body = match relay {
            Relay::None => BodyFraming::None,
            Relay::Length(n) => BodyFraming::Length(n),
            Relay::Chunked => BodyFraming::Chunked,
            Relay::Dechunk | Relay::UntilClose => BodyFraming::UntilClose,
        };
        sent = v.put_head(crate::h2::bridge::HeadStart { head, body });
    }
    let stall = Stall::new(w.now(), cg.gen.http.send_timeout);
    let len = out.len() as u64;
    w.metrics().response(status);
    if sent.is_ok() && !out.is_empty() {
        sent = pin!(write_all_by(&mut conn.stream, out, stall, &w.pool))
            .await
            .0;
    }
    if sent.is_err() {
        conn.log.client_left();
        return Relayed {
            reuse: None,
            upstream_failure: None,
            tunnel: None,
        };
    }
    add(&w.metrics().bytes_out, len);
    conn.log.wrote(status, len);

    let up_fd = upc.fd();
    let relayed = relay_state
        .relay_rest(
            w,
            cg,
            relay,
            &mut upc.read,
            up_fd,
            &mut conn.stream,
            ubuf,
            read_timeout,
        )
        .await;
    conn.log.sent += relay_state.sent;
    match relayed {
        // (A close-delimited body has no leftovers: it ends at the close.)
        Ok(leftover) if leftover > 0 => {
            tracing::warn!(
                request_id = ?info.rid.as_str(),
                upstream = up_name,
                bytes = leftover,
                "upstream sent bytes beyond its response; its connection is not reused"
            );
            Relayed {
                reuse: Some(Reuse {
                    client: keep_client,
                    upstream: false,
                }),
                upstream_failure: None,
                tunnel: None,
            }
        }
        Ok(_) => Relayed {
            reuse: Some(Reuse {
                client: keep_client,
                upstream: upstream_keep_alive && body_sent && !matches!(relay, Relay::UntilClose),
            }),
            upstream_failure: None,
            tunnel: None,
        },
        Err(e) => {
            conn.log.error = Some(e.kind());
            let upstream_failure = (e.side() == Side::Upstream).then(|| {
                if e.kind() == ErrorKind::UpstreamInvalid {
                    FailureClass::Invalid
                } else {
                    FailureClass::MidBody
                }
            });
            // The response is cut short: reset the client connection (an HTTP/2 client's
            // stream) rather than close it, so that even a close-delimited body cannot pass
            // for complete. Whichever side failed: a write to a client that reads too slowly
            // times out with the client still there.
            conn.stream.abort();
            conn.aborted = true;
            if e.side() == Side::Upstream {
                tracing::warn!(
                    request_id = ?info.rid.as_str(),
                    upstream = up_name,
                    endpoint = %upc.addr(),
                    error = %e,
                    "upstream failed mid-body; client connection truncated"
                );
            }
            Relayed {
                reuse: None,
                upstream_failure,
                tunnel: None,
            }
        }
    }
}

struct RelayState {
    remaining: u64,
    decoder: ChunkedDecoder,
    /// Body bytes written to the client by `relay_rest`.
    sent: u64,
}

impl RelayState {
    /// Moves the body bytes already read (as many as fit) into the head block.
    fn fill_head_block(
        &mut self,
        relay: Relay,
        ubuf: &mut Block,
        out: &mut Block,
    ) -> Result<(), Error> {
        match relay {
            Relay::None | Relay::Dechunk => Ok(()),
            Relay::Length(_) => {
                let n = (ubuf.len() as u64)
                    .min(self.remaining)
                    .min(out.spare() as u64) as usize;
                let _ = out.put(&ubuf.data()[..n]);
                ubuf.consume(n);
                self.remaining -= n as u64;
                Ok(())
            }
            Relay::Chunked => {
                let avail = ubuf.len().min(out.spare());
                let (n, consumed) = self.filter(&mut ubuf.data_mut()[..avail], Keep::Framed)?;
                let _ = out.put(&ubuf.data()[..n]);
                ubuf.consume(consumed);
                Ok(())
            }
            Relay::UntilClose => {
                out.put_from(ubuf);
                Ok(())
            }
        }
    }

    fn filter(&mut self, data: &mut [u8], keep: Keep) -> Result<(usize, usize), Error> {
        filter_in_place(&mut self.decoder, data, keep)
            .map_err(|e| Error::new(ErrorKind::UpstreamInvalid, Side::Upstream).with_cause(e))
    }

    fn done(&self, relay: Relay) -> bool {
        match relay {
            Relay::None => true,
            Relay::Length(_) => self.remaining == 0,
            Relay::Chunked | Relay::Dechunk => self.decoder.is_done(),
            Relay::UntilClose => false,
        }
    }

    /// Relays the rest of the body; returns how many stray bytes followed it (non-zero: the
    /// upstream connection is not reusable).
    #[allow(clippy::too_many_arguments)]
    async fn relay_rest(
        &mut self,
        w: &Worker,
        cg: &CoreGen,
        relay: Relay,
        up: &mut ReadHalf,
        up_fd: RawFd,
        client: &mut ClientStream,
        mut ubuf: Block,
        read_timeout: std::time::Duration,
    ) -> Result<usize, Error> {
        let send_timeout = cg.gen.http.send_timeout;
        let mut seg = WholeSegments::default();
        let mut ack = QuickAck::default();
        loop {
            if !ubuf.is_empty() {
                // (bytes to write from the front, bytes to drop after them)
                let (n, skip) = match relay {
                    Relay::None => (0, 0),
                    Relay::Length(_) => {
                        let n = (ubuf.len() as u64).min(self.remaining) as usize;
                        self.remaining -= n as u64;
                        (n, 0)
                    }
                    Relay::Chunked | Relay::Dechunk => {
                        let keep = if relay == Relay::Chunked {
                            Keep::Framed
                        } else {
                            Keep::DataOnly
                        };
                        let (kept, consumed) = self.filter(ubuf.data_mut(), keep)?;
                        (kept, consumed - kept)
                    }
                    Relay::UntilClose => (ubuf.len(), 0),
                };
                if n > 0 {
                    let stall = Stall::to_client(client, w.now(), send_timeout);
                    let (res, b) = pin!(write_front_by(client, ubuf, n, stall, &w.pool)).await;
                    ubuf = b;
                    res.map_err(Error::client_io)?;
                    add(&w.metrics().bytes_out, n as u64);
                    self.sent += n as u64;
                }
                ubuf.consume(skip);
            }
            if self.done(relay) {
                return Ok(ubuf.len());
            }
            if !ubuf.is_empty() {
                // The start of a trailer field line, taken only whole (`Keep::Framed`): the
                // next read goes after it, and a line longer than a block is refused.
                ubuf.compact();
                if ubuf.spare() == 0 {
                    return Err(Error::new(ErrorKind::UpstreamInvalid, Side::Upstream)
                        .with_cause("a trailer field line longer than a buffer block"));
                }
            }
            // The body did not come whole with its head: the rest must not wait for a
            // delayed ACK (see `quickack`).
            ack.before_wait(Some(up_fd));
            if client.takes_large_blocks() {
                w.body_block(&mut ubuf);
            }
            // Reads are not capped at the body's end: bytes an upstream sends beyond its
            // Content-Length in the same write show up here as leftovers, and the
            // connection is not reused (they would pass for the next request's response).
            let spare = ubuf.spare();
            if let Some(whole) = seg.limit(spare).filter(|_| ubuf.is_empty()) {
                ubuf.limit_next_read(whole);
            }
            let deadline = w.now() + read_timeout;
            let (res, b) = pin!(read_by(up, ubuf, deadline, &w.pool)).await;
            ubuf = b;
            match res {
                Ok(0) if relay == Relay::UntilClose => return Ok(0),
                Ok(0) => {
                    return Err(Error::new(ErrorKind::UpstreamClosed, Side::Upstream)
                        .with_cause("upstream closed before the end of the response body"))
                }
                Ok(n) => seg.after_read(n, spare, || client.segment_size()),
                Err(e) if e.kind() == stdio::ErrorKind::TimedOut => {
                    return Err(Error::new(ErrorKind::UpstreamTimeout, Side::Upstream).with_cause(e))
                }
                Err(e) => return Err(Error::upstream_io(e)),
            }
        }
    }
}

/// Answers an error before any response byte went out. `request_unread`: the request body was
/// not (completely) read, so the connection closes. Returns whether the connection may go on.
pub(super) async fn fail(
    w: &Worker,
    cg: &CoreGen,
    conn: &mut ClientConn,
    info: &ReqInfo,
    err: Error,
    request_unread: bool,
) -> bool {
    let kind = err.kind();
    if kind == ErrorKind::ClientClosed {
        add(&w.metrics().client_aborts, 1);
    }
    let close =
        request_unread || kind.closes_downstream() || !info.keep_alive || conn.winding_down(w);
    if request_unread && info.framing.has_body() {
        conn.linger = true;
    }
    let sent = respond::error(w, cg, conn, kind, Some(info), &info.rid, close).await;
    sent && !close
}

pub(super) fn log_upstream(
    info: &ReqInfo,
    upstream: &str,
    endpoint: Option<SocketAddr>,
    err: &Error,
) {
    tracing::warn!(
        request_id = ?info.rid.as_str(),
        upstream,
        endpoint = ?endpoint,
        kind = err.kind().code(),
        error = %err,
        "upstream request failed"
    );
}
