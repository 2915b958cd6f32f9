//! HTTP/2 connections to one endpoint on one worker: a few, multiplexed.
//!
//! Each connection has a driver task (the h2 crate's connection future, which does all its
//! I/O) and counts its open streams; a request takes the least loaded connection that has a
//! stream to spare under the peer's SETTINGS, or opens another up to `h2_connections`. A
//! connection whose driver ended (GOAWAY, error, peer close) is dropped from the pool.
//!
//! A peer gone without a word (a power loss, a middlebox that dropped the flow) would take
//! every stream until TCP gave up, for many minutes. So when a request times out on a
//! connection, its driver sends a PING, and closes the connection unless the PONG comes
//! within `connect_timeout`; with `h2_keepalive`, it also sends one at that interval while
//! streams are open. (Not on idle connections: gRPC servers count PINGs without calls as
//! abuse and answer them with GOAWAY.)

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use h2::client::SendRequest;

use super::state::{ConnectionSlot, EndpointState};
use super::ConnectError;
use crate::net;

/// Connection limits for [`H2Pool::stream`].
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// HTTP/2 connections per endpoint on this worker.
    pub conns: usize,
    /// Connections per endpoint across workers (0: unlimited).
    pub total: u32,
    /// Time for the TCP connect and the TLS handshake together, and for the HTTP/2 handshake.
    pub connect_timeout: Duration,
    /// Receive window granted to each stream.
    pub stream_window: u32,
    /// Receive window of the whole connection.
    pub connection_window: u32,
    /// PING interval while streams are open, and how long such a PING may go unanswered.
    pub keepalive: Option<Duration>,
    /// A connection without a stream for this long is closed.
    pub idle: Duration,
    /// Largest response head (header list size, RFC 9113 §6.5.2) taken from the upstream: the
    /// bound an HTTP/1.1 upstream's head has (the worker's head block).
    pub max_head: usize,
}

/// What a connection's users and its driver share.
#[derive(Debug, Default)]
struct Shared {
    /// Streams in flight.
    streams: Cell<usize>,
    /// The driver ended: no new stream.
    closed: Cell<bool>,
    /// Streams ever taken (the driver tells an idle connection by it).
    taken: Cell<u64>,
    /// A request timed out: the driver is to make sure the peer still answers.
    suspect: Cell<bool>,
    /// The driver, to be woken for `suspect`.
    driver: RefCell<Option<std::task::Waker>>,
}

/// The HTTP/2 handshake on `io`, and its driver task (which gives the endpoint's connection
/// slot back and marks the connection closed when it ends).
async fn handshake<T>(
    io: T,
    limits: &Limits,
    slot: ConnectionSlot,
) -> Result<(SendRequest<Bytes>, Rc<Shared>), std::io::Error>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + 'static,
{
    // A stream's window bounds what one slow client holds of its response; the connection's
    // is larger, so that a few slow clients do not stall every other stream on it.
    let mut builder = h2::client::Builder::new();
    // The upstream may not push (nothing would take the promised responses) nor open streams
    // of its own, and its heads are bounded as an HTTP/1.1 upstream's are: without these, a
    // PUSH_PROMISE flood or one 16 MiB header list is held in memory.
    // Until the peer's SETTINGS come, at most 100 streams (RFC 9113 §6.5.2 advises no lower
    // limit; h2's own default is unbounded): a burst on a new connection is not sent past a
    // limit the peer has yet to state, only to be refused.
    builder
        .initial_max_send_streams(100)
        .initial_window_size(limits.stream_window)
        .initial_connection_window_size(limits.connection_window)
        .enable_push(false)
        .max_concurrent_streams(0)
        .max_header_list_size(u32::try_from(limits.max_head).unwrap_or(u32::MAX));
    let (send, mut connection) =
        match crate::worker::deadline::timeout(limits.connect_timeout, builder.handshake(io)).await
        {
            Ok(Ok(pair)) => pair,
            Ok(Err(e)) => return Err(std::io::Error::other(e)),
            Err(_) => return Err(std::io::ErrorKind::TimedOut.into()),
        };
    let ping = connection.ping_pong();
    let shared = Rc::new(Shared::default());
    let s = shared.clone();
    let (every, patience, idle) = (limits.keepalive, limits.connect_timeout, limits.idle);
    drop(crate::worker::runtime::spawn_isolated(async move {
        // Given back when the driver ends, or if it panics (its task drops it then).
        let slot = slot;
        match drive(connection, ping, &s, every, patience, idle).await {
            Ok(()) => {}
            Err(Ended::Error(e)) => {
                tracing::debug!(error = %e, "upstream HTTP/2 connection ended");
            }
            Err(Ended::Unanswered) => {
                tracing::warn!("upstream HTTP/2 connection closed: a PING went unanswered");
            }
        }
        s.closed.set(true);
        s.driver.borrow_mut().take();
        drop(slot);
    }));
    Ok((send, shared))
}

/// Sends a PING and registers for its PONG (the connection's next poll flushes it): when it
/// must be answered by; `None` when the connection is closing (its own poll ends the driver).
fn send_ping(
    ping: &mut h2::PingPong,
    cx: &mut std::task::Context<'_>,
    answer_within: Duration,
    now: std::time::Instant,
) -> Option<std::time::Instant> {
    ping.send_ping(h2::Ping::opaque()).ok()?;
    let _ = ping.poll_pong(cx);
    Some(now + answer_within)
}

/// Why a connection's driver stopped early.
enum Ended {
    Error(h2::Error),
    /// A PING went unanswered in time.
    Unanswered,
}

/// Runs `connection` to its end. A PING goes out when a user marks the connection suspect
/// (answer within `patience`) and, with `every`, at that interval while streams are open
/// (answer within `every`); one at a time. A PING unanswered in time gives up on the
/// connection (dropping it closes the socket, and its streams fail). A connection that
/// carried no stream for `idle` is closed too (`Ok`): its slot under the upstream's
/// `max_connections` goes back for any worker to use.
async fn drive<T>(
    mut connection: h2::client::Connection<T, Bytes>,
    ping: Option<h2::PingPong>,
    shared: &Shared,
    every: Option<Duration>,
    patience: Duration,
    idle: Duration,
) -> Result<(), Ended>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use std::future::Future;
    use std::task::Poll;
    use std::time::Instant;
    let Some(mut ping) = ping else {
        return connection.await.map_err(Ended::Error);
    };
    let start = Instant::now();
    // What the timer waits for; the clock is read only when something happens.
    let mut pong_by: Option<Instant> = None;
    let mut next_ping = every.map(|e| start + e);
    let mut next_idle = start + idle;
    let mut last_taken = shared.taken.get();
    let first = next_ping.map_or(next_idle, |p| p.min(next_idle));
    let mut timer = std::pin::pin!(monoio::time::sleep_until(monoio::time::Instant::from_std(
        first
    )));
    let mut poll_conn = |cx: &mut std::task::Context<'_>| {
        std::pin::Pin::new(&mut connection)
            .poll(cx)
            .map(|r| r.map_err(Ended::Error))
    };
    std::future::poll_fn(|cx| {
        if let Poll::Ready(r) = poll_conn(cx) {
            return Poll::Ready(r);
        }
        let mut rearm = false;
        if pong_by.is_some() {
            if let Poll::Ready(Ok(_)) = ping.poll_pong(cx) {
                pong_by = None;
                rearm = true;
            }
            // (An error: the connection failed, and its own poll says why.)
        }
        if shared.suspect.replace(false) {
            let now = Instant::now();
            pong_by = match pong_by {
                None => send_ping(&mut ping, cx, patience, now),
                // A keep-alive PING is out already: it must be answered as soon.
                Some(by) => Some(by.min(now + patience)),
            };
            rearm = true;
        }
        loop {
            if rearm {
                let mut at = next_idle;
                for d in [pong_by, next_ping].into_iter().flatten() {
                    at = at.min(d);
                }
                timer.as_mut().reset(monoio::time::Instant::from_std(at));
            }
            if timer.as_mut().poll(cx).is_pending() {
                break;
            }
            let now = Instant::now();
            if pong_by.is_some_and(|d| now >= d) {
                return Poll::Ready(Err(Ended::Unanswered));
            }
            if let (Some(d), Some(e)) = (next_ping, every) {
                if now >= d {
                    next_ping = Some(now + e);
                    if shared.streams.get() > 0 && pong_by.is_none() {
                        pong_by = send_ping(&mut ping, cx, e, now);
                    }
                }
            }
            if now >= next_idle {
                let taken = shared.taken.get();
                if shared.streams.get() == 0 && taken == last_taken {
                    return Poll::Ready(Ok(()));
                }
                last_taken = taken;
                next_idle = now + idle;
            }
            rearm = true;
        }
        if pong_by.is_some() {
            // Flush a PING just queued.
            if let Poll::Ready(r) = poll_conn(cx) {
                return Poll::Ready(r);
            }
        }
        let mut driver = shared.driver.borrow_mut();
        if !driver.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            *driver = Some(cx.waker().clone());
        }
        Poll::Pending
    })
    .await
}

/// Whether the connection can take no new stream (a GOAWAY came, or it failed, or its
/// stream ids ran out), though its driver may still run for the streams in flight.
fn refuses_streams(send: &SendRequest<Bytes>) -> bool {
    let mut probe = send.clone();
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    // A fresh handle has no stream pending open: readiness is the connection's state.
    matches!(probe.poll_ready(&mut cx), std::task::Poll::Ready(Err(_)))
}

/// Whether a stream may still queue on `c` (h2 holds it until the peer's limit lets it
/// open): at most as many as the limit itself. Beyond, the request waits as for an HTTP/1.1
/// connection at the cap (`Busy`: within `max_pending` and `connect_timeout`), so the queue
/// of a saturated upstream stays bounded.
fn may_queue(c: &Conn) -> bool {
    c.streams() < c.send.current_max_send_streams().saturating_mul(2)
}

/// One HTTP/2 connection.
#[derive(Debug)]
struct Conn {
    send: SendRequest<Bytes>,
    shared: Rc<Shared>,
}

impl Conn {
    /// A handle to send one request on, holding one of this connection's stream counts.
    fn take_stream(&self) -> (SendRequest<Bytes>, StreamSlot) {
        let s = &self.shared;
        let queued = s.streams.get() >= self.send.current_max_send_streams();
        s.streams.set(s.streams.get() + 1);
        s.taken.set(s.taken.get().wrapping_add(1));
        (self.send.clone(), StreamSlot(s.clone(), queued))
    }

    fn streams(&self) -> usize {
        self.shared.streams.get()
    }

    fn closed(&self) -> bool {
        self.shared.closed.get()
    }
}

/// An endpoint's HTTP/2 connections on this worker.
#[derive(Debug, Default)]
pub struct H2Pool {
    conns: RefCell<Vec<Conn>>,
    /// Connections being opened: they count toward `h2_connections` (a burst on an empty
    /// pool opens as many as that, not one per request).
    connecting: Cell<usize>,
}

/// A connection being opened, counted in [`H2Pool::connecting`] until dropped.
struct Connecting<'a>(&'a Cell<usize>);

impl<'a> Connecting<'a> {
    fn new(count: &'a Cell<usize>) -> Self {
        count.set(count.get() + 1);
        Connecting(count)
    }
}

impl Drop for Connecting<'_> {
    fn drop(&mut self) {
        self.0.set(self.0.get().saturating_sub(1));
    }
}

/// A stream's hold on its connection's count, given back when dropped.
#[derive(Debug)]
pub struct StreamSlot(Rc<Shared>, bool);

impl StreamSlot {
    /// Whether the stream was taken beyond the peer's stream limit: h2 holds it, unsent,
    /// until another stream ends (see [`may_queue`]). Its request timing out may never have
    /// reached the upstream, busy with long streams: no failure of the upstream's.
    pub fn queued(&self) -> bool {
        self.1
    }

    /// The stream timed out: the connection is to prove its peer still answers (a PING),
    /// or be closed.
    pub fn suspect(&self) {
        let s = &self.0;
        s.suspect.set(true);
        if let Some(w) = s.driver.borrow_mut().take() {
            w.wake();
        }
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let s = &self.0.streams;
        s.set(s.get().saturating_sub(1));
    }
}

impl H2Pool {
    /// Open connections.
    pub fn len(&self) -> usize {
        self.conns.borrow().len()
    }

    /// Whether none is open.
    pub fn is_empty(&self) -> bool {
        self.conns.borrow().is_empty()
    }

    /// Whether [`H2Pool::stream`] could give a stream now, without a wait: a connection
    /// with a stream free or room in its queue (see [`may_queue`]), or room for a new one
    /// (`max_conns` on this worker, `total` across workers). A balancer passes over an
    /// endpoint without room, as over an HTTP/1.1 endpoint at its connection cap: a request
    /// goes to one that has room, or waits for one (a hash key's endpoint included).
    pub fn has_room(&self, max_conns: usize, state: &EndpointState, total: u32) -> bool {
        let conns = self.conns.borrow();
        let mut open = 0;
        for c in conns.iter().filter(|c| !c.closed()) {
            if may_queue(c) {
                return true;
            }
            open += 1;
        }
        open + self.connecting.get() < max_conns && state.has_connection_room(total)
    }

    /// Closes one connection that carries no stream, if there is one: its slot under
    /// `max_connections` goes to a request another worker has waiting (its driver ends when
    /// the handle is gone).
    pub fn close_one_idle(&self) {
        let mut conns = self.conns.borrow_mut();
        if let Some(i) = conns.iter().position(|c| c.streams() == 0 && !c.closed()) {
            conns.swap_remove(i);
        }
    }

    /// Closes every connection (their drivers end when the handles are gone).
    pub fn clear(&self) {
        self.conns.borrow_mut().clear();
    }

    /// A handle to send one request on, and its stream slot: the least loaded connection
    /// with room under the peer's stream limit, else a new one (up to `max_conns`, those
    /// being opened included), else the least loaded anyway (h2 queues the stream until one
    /// is free; see [`may_queue`]). `Busy` when there is none yet and no other may be opened,
    /// or the queues are full (the caller waits and asks again, as for an HTTP/1.1
    /// connection).
    pub async fn stream(
        &self,
        addr: std::net::SocketAddr,
        authority: &str,
        state: &Arc<EndpointState>,
        limits: Limits,
        tls: Option<&crate::tls::client::UpstreamTls>,
    ) -> Result<(SendRequest<Bytes>, StreamSlot), ConnectError> {
        let Limits {
            conns: max_conns,
            total: max_conns_total,
            connect_timeout,
            ..
        } = limits;
        let pick = loop {
            let mut conns = self.conns.borrow_mut();
            conns.retain(|c| !c.closed());
            let at_limit = conns.len() + self.connecting.get() >= max_conns;
            let best = (0..conns.len()).min_by_key(|&i| conns[i].streams());
            let Some(i) = best else {
                if at_limit {
                    return Err(ConnectError::Busy);
                }
                break None;
            };
            let c = &conns[i];
            let full = c.streams() >= c.send.current_max_send_streams();
            if full && !at_limit {
                break None;
            }
            // A connection told to go away keeps running for its streams in flight, but
            // takes no new one: out of the pool with it.
            if refuses_streams(&c.send) {
                c.shared.closed.set(true);
                continue;
            }
            if full {
                // Every connection is full: before a stream queues on one, those told to go
                // away (not the least loaded, so not looked at above) leave, and a new
                // connection may take their place.
                let before = conns.len();
                conns.retain(|c| !refuses_streams(&c.send));
                if conns.len() < before {
                    continue;
                }
                if !may_queue(&conns[i]) {
                    return Err(ConnectError::Busy);
                }
            }
            break Some(conns[i].take_stream());
        };
        if let Some(p) = pick {
            return Ok(p);
        }
        let Some(slot) = ConnectionSlot::take(state, max_conns_total) else {
            // At the endpoint's connection cap (across workers): share a connection this
            // worker has, h2 queues the stream until the peer allows it; refuse only with none.
            let conns = self.conns.borrow();
            let open = conns
                .iter()
                .filter(|c| !c.closed() && !refuses_streams(&c.send));
            return match open.min_by_key(|c| c.streams()) {
                Some(c) if may_queue(c) => Ok(c.take_stream()),
                _ => Err(ConnectError::Busy),
            };
        };
        let _connecting = Connecting::new(&self.connecting);
        // One `connect_timeout` for the TCP connect and the TLS handshake together.
        let started = std::time::Instant::now();
        let tcp = match net::connect(addr, connect_timeout).await {
            Ok(s) => s,
            Err(e) => {
                // (`slot` is given back as this returns, here and on every failure below.)
                return Err(if e.kind() == std::io::ErrorKind::TimedOut {
                    ConnectError::TimedOut
                } else {
                    ConnectError::Failed(e)
                });
            }
        };
        let failed = |e: std::io::Error| {
            if e.kind() == std::io::ErrorKind::TimedOut {
                ConnectError::TimedOut
            } else {
                ConnectError::Failed(e)
            }
        };
        let handshake = match tls {
            None => {
                let io = tcp.try_into_poll_io().map_err(|(e, _)| failed(e))?;
                handshake(io, &limits, slot).await
            }
            Some(tls) => {
                let left = connect_timeout.saturating_sub(started.elapsed());
                let s = super::tls_connect(tls, authority, tcp, left)
                    .await
                    .map_err(failed)?;
                if s.alpn() != Some(&b"h2"[..]) {
                    return Err(failed(std::io::Error::other(
                        "the upstream did not agree on HTTP/2 (ALPN h2)",
                    )));
                }
                let (conn, tcp, pending) = s
                    .into_parts()
                    .ok_or_else(|| failed(std::io::Error::other("TLS session split")))?;
                let io = tcp.try_into_poll_io().map_err(|(e, _)| failed(e))?;
                handshake(
                    crate::h2::io::PollTls::new(io, conn, pending),
                    &limits,
                    slot,
                )
                .await
            }
        };
        let (send, shared) = handshake.map_err(failed)?;
        let conn = Conn { send, shared };
        let stream = conn.take_stream();
        self.conns.borrow_mut().push(conn);
        Ok(stream)
    }
}
