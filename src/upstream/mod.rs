//! Upstreams as one worker sees them: endpoints, the balancer, the keep-alive pools and the
//! worker's share of the cross-core upstream state.
//!
//! Ownership: one [`UpstreamRt`] per upstream per worker and generation (`RefCell`/`Cell`,
//! never `Send`). What must outlive a generation on this worker (an endpoint's idle pool,
//! in-flight count and latency estimate; the upstream's retry-budget window and latency
//! histogram) sits behind an `Rc` that the next generation adopts when the upstream and
//! endpoint stay, so a reload changes routes without cooling pools or forgetting latencies.
//! Cross-core state (health, ejection, drain, breaker, connection counts) lives in
//! [`state`], shared through `Arc` and kept across reloads by the control thread.
//!
//! Invariant: a connection is handed to [`UpstreamRt::release`] only after its response
//! completed exactly and neither side asked to close (the caller's duty, see
//! `proxy/forward.rs`).
//! Not here: resolving names (control thread), deciding what to forward or retry (proxy).

pub mod balancer;
pub mod h2pool;
pub mod pool;
pub mod queue;
pub mod state;

use std::cell::{Cell, RefCell};
use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use crate::config::{UpstreamConfig, UpstreamProtocol};
use crate::net;
use crate::observe::metrics::add;
use crate::shared::ResolvedEndpoint;

pub use balancer::{Balancer, Endpoints};
pub use pool::{IdlePool, UpConn};
pub use queue::WaitQueue;
pub use state::{Admit, EndpointState, FailureClass, UpstreamState};

/// The TLS handshake toward an endpoint (SNI and verification for its host, or the
/// configured `server_name`).
pub(crate) async fn tls_connect(
    tls: &crate::tls::client::UpstreamTls,
    authority: &str,
    stream: monoio::net::TcpStream,
    timeout: Duration,
) -> io::Result<crate::tls::TlsStream> {
    let name = tls
        .name_for(authority)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    crate::tls::TlsStream::connect(stream, tls.config.clone(), name, timeout).await
}

/// Length of the retry-budget window, in one-second slots.
pub const BUDGET_WINDOW_SECS: usize = 10;

/// A pooled connection idle for less than this is handed to a replayable request without the
/// `MSG_PEEK` check (a syscall per request otherwise, 3% of the proxy's CPU at saturation):
/// under load connections come back within a millisecond. The check still runs after an
/// exchange whose response had no body (where broken servers send bytes nobody asked for),
/// for requests that cannot be sent again, and on connections idle longer (idle-timeout
/// closes and the 408s before them come seconds later). An unchecked connection that turns
/// out closed, or answers with bytes that are no response, costs the request one resend on
/// a new connection.
pub const UNCHECKED_IDLE: std::time::Duration = std::time::Duration::from_millis(10);

/// One endpoint on one worker.
#[derive(Debug)]
pub struct EndpointRt {
    /// Cross-core state.
    pub state: Arc<EndpointState>,
    addr: SocketAddr,
    authority: Arc<str>,
    weight: Cell<u32>,
    idle: RefCell<IdlePool>,
    in_flight: Cell<u32>,
    /// Peak-EWMA latency estimate (ns) and when it was last updated.
    ewma: Cell<(f64, Option<Instant>)>,
    /// Smooth weighted round robin's current weight.
    wrr: Cell<i64>,
    /// HTTP/2 connections (upstreams with `protocol = "h2c"`).
    pub h2: h2pool::H2Pool,
}

impl EndpointRt {
    fn new(r: &ResolvedEndpoint) -> Self {
        EndpointRt {
            state: r.state.clone(),
            addr: r.addr,
            authority: r.authority.clone(),
            weight: Cell::new(r.weight),
            idle: RefCell::new(IdlePool::default()),
            in_flight: Cell::new(0),
            ewma: Cell::new((0.0, None)),
            wrr: Cell::new(0),
            h2: h2pool::H2Pool::default(),
        }
    }

    /// The endpoint address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `host:port` as configured.
    pub fn authority(&self) -> &str {
        &self.authority
    }

    /// Counts an attempt in flight on `worker` until the returned guard drops; its end wakes
    /// the first of `up`'s requests waiting for a connection here (in its generation).
    pub fn begin(self: &Rc<Self>, worker: usize, up: &UpstreamRt) -> InFlight {
        let n = self.in_flight.get() + 1;
        self.in_flight.set(n);
        let stats = self.state.stats(worker);
        stats.in_flight.store(u64::from(n), Ordering::Relaxed);
        add(&stats.requests, 1);
        InFlight {
            ep: self.clone(),
            worker,
            queue: up.queue.clone(),
        }
    }

    /// Folds a latency sample into the peak-EWMA estimate.
    pub fn observe_latency(&self, sample: Duration, now: Instant) {
        let (estimate, at) = self.ewma.get();
        let elapsed = at.map_or(0.0, |t| now.saturating_duration_since(t).as_secs_f64());
        let next = balancer::peak_ewma(estimate, sample.as_nanos() as f64, elapsed);
        self.ewma.set((next, Some(now)));
    }
}

/// An attempt in flight on an endpoint (see [`EndpointRt::begin`]).
#[derive(Debug)]
pub struct InFlight {
    ep: Rc<EndpointRt>,
    worker: usize,
    queue: Rc<WaitQueue>,
}

impl InFlight {
    /// The endpoint.
    pub fn endpoint(&self) -> &Rc<EndpointRt> {
        &self.ep
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let n = self.ep.in_flight.get().saturating_sub(1);
        self.ep.in_flight.set(n);
        self.ep
            .state
            .stats(self.worker)
            .in_flight
            .store(u64::from(n), Ordering::Relaxed);
        // Its connection or stream is free (pooled or closed by now: the woken request runs
        // after this one's task yields).
        self.queue.wake_first();
    }
}

/// What an upstream keeps on this worker across generations.
#[derive(Debug)]
pub struct UpstreamLocal {
    /// Requests and retries per one-second slot of the budget window, and the slot's second.
    window: RefCell<[(u64, u64); BUDGET_WINDOW_SECS]>,
    second: Cell<u64>,
    /// This worker's latencies to the upstream, from its first response on (none before: a
    /// worker that never sends to an upstream holds no histogram for it).
    latency: RefCell<Option<Histogram<u64>>>,
    latency_dirty: Cell<bool>,
    /// The copy published last time, reused for the next publication.
    latency_spare: RefCell<Option<Arc<Histogram<u64>>>>,
    /// This worker's share of `UpstreamState::pending`.
    pub pending: Cell<u32>,
}

impl UpstreamLocal {
    fn new() -> Self {
        UpstreamLocal {
            window: RefCell::new([(0, 0); BUDGET_WINDOW_SECS]),
            second: Cell::new(0),
            latency: RefCell::new(None),
            latency_dirty: Cell::new(false),
            latency_spare: RefCell::new(None),
            pending: Cell::new(0),
        }
    }

    fn slot(&self) -> usize {
        (self.second.get() % BUDGET_WINDOW_SECS as u64) as usize
    }

    fn totals(&self) -> (u64, u64) {
        self.window
            .borrow()
            .iter()
            .fold((0, 0), |(r, t), s| (r + s.0, t + s.1))
    }
}

/// Which endpoints a pick must avoid: those already tried by this request (by identity).
#[derive(Debug, Default)]
pub struct Tried {
    ids: [usize; 16],
    len: usize,
}

impl Tried {
    /// Adds an endpoint (beyond 16 the oldest entries stay; attempts are at most 10).
    pub fn add(&mut self, ep: &EndpointRt) {
        if self.len < self.ids.len() {
            self.ids[self.len] = Arc::as_ptr(&ep.state) as usize;
            self.len += 1;
        }
    }

    fn contains(&self, ep: &EndpointRt) -> bool {
        let id = Arc::as_ptr(&ep.state) as usize;
        self.ids[..self.len].contains(&id)
    }
}

/// Why no endpoint was picked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PickError {
    /// No endpoint in rotation (none resolved, or all drained).
    NoEndpoints,
    /// Endpoints are in rotation but all are at their connection limit or out of tokens.
    Busy,
}

/// Why no connection could be had on a picked endpoint.
#[derive(Debug)]
pub enum ConnectError {
    /// The endpoint reached its connection limit since it was picked.
    Busy,
    /// The connection failed.
    Failed(io::Error),
    /// The endpoint did not accept the connection within the connect timeout.
    TimedOut,
}

/// A worker's view of one upstream in one generation.
#[derive(Debug)]
pub struct UpstreamRt {
    /// The configuration.
    pub cfg: UpstreamConfig,
    /// Cross-core state.
    pub shared: Arc<UpstreamState>,
    /// State kept across generations on this worker.
    pub local: Rc<UpstreamLocal>,
    /// This generation's requests waiting for a connection, in line. Those of an earlier
    /// generation, which pick under its limits and endpoints, keep their own line: a reload
    /// that raised `max_connections` or added endpoints is not held up behind them.
    pub queue: Rc<WaitQueue>,
    worker: usize,
    endpoints: RefCell<Vec<Rc<EndpointRt>>>,
    balancer: RefCell<Balancer>,
}

struct View<'a> {
    eps: &'a [Rc<EndpointRt>],
    tried: &'a Tried,
    skip: Option<usize>,
    allow_tried: bool,
    /// Health and ejection count (false: fail open, every endpoint is out).
    strict: bool,
    max_connections: u32,
    /// `h2_connections` when the endpoints speak HTTP/2.
    h2_connections: Option<usize>,
    bucket: Option<(crate::config::RateLimitConfig, u64)>,
    now_ms: u64,
    now: Instant,
}

impl View<'_> {
    fn in_rotation(&self, ep: &EndpointRt) -> bool {
        !ep.state.drained.load(Ordering::Relaxed)
    }

    fn healthy(&self, ep: &EndpointRt) -> bool {
        ep.state.healthy.load(Ordering::Relaxed) && !ep.state.ejected(self.now_ms)
    }

    fn has_room(&self, ep: &EndpointRt) -> bool {
        let conn_ok = match self.h2_connections {
            Some(n) => ep.h2.has_room(n, &ep.state, self.max_connections),
            None => {
                !ep.idle.borrow().is_empty() || ep.state.has_connection_room(self.max_connections)
            }
        };
        conn_ok
            && self
                .bucket
                .is_none_or(|(cfg, now_ns)| ep.state.bucket_allows(&cfg, now_ns))
    }
}

impl Endpoints for View<'_> {
    fn len(&self) -> usize {
        self.eps.len()
    }

    fn eligible(&self, i: usize) -> bool {
        let ep = &self.eps[i];
        Some(i) != self.skip
            && (self.allow_tried || !self.tried.contains(ep))
            && self.in_rotation(ep)
            && (!self.strict || self.healthy(ep))
            && self.has_room(ep)
    }

    fn weight(&self, i: usize) -> u32 {
        self.eps[i].weight.get()
    }

    fn in_flight(&self, i: usize) -> u32 {
        self.eps[i].in_flight.get()
    }

    fn latency_ns(&self, i: usize) -> f64 {
        let ep = &self.eps[i];
        let (estimate, Some(at)) = ep.ewma.get() else {
            return 0.0;
        };
        let age = self.now.saturating_duration_since(at);
        // An estimate from before the endpoint last came back into rotation is forgotten: the
        // failures that took it out (each a `FAILURE_PENALTY` sample) would otherwise keep it
        // from traffic for tens of seconds after its checks pass or its ejection ends. It
        // starts again as a new endpoint does.
        let sampled_ms = self.now_ms.saturating_sub(age.as_millis() as u64);
        if sampled_ms < ep.state.back_since(self.now_ms) {
            ep.ewma.set((0.0, None));
            return 0.0;
        }
        balancer::decayed(estimate, age.as_secs_f64())
    }

    fn current_weight(&self, i: usize) -> &Cell<i64> {
        &self.eps[i].wrr
    }
}

/// Whether a connection made for upstream config `a` may serve requests of `b` (the same
/// upstream in another generation): same protocol, the same TLS settings by content, and for
/// HTTP/2 the same settings its driver took when the connection was made (windows,
/// keep-alive, idle timeout, PING patience).
pub fn same_connections(a: &UpstreamConfig, b: &UpstreamConfig) -> bool {
    let h2 = |u: &UpstreamConfig| {
        (
            u.h2_stream_window,
            u.h2_connection_window,
            u.h2_keepalive,
            u.pool_idle_timeout,
            u.connect_timeout,
        )
    };
    a.protocol == b.protocol && a.tls == b.tls && (!a.protocol.is_h2() || h2(a) == h2(b))
}

impl UpstreamRt {
    /// The runtime state for `cfg` with its resolved `endpoints` and cross-core `shared`
    /// state, on worker `worker`; adopts what `previous` (the same upstream in the previous
    /// generation on this worker) kept.
    pub fn new(
        cfg: &UpstreamConfig,
        shared: Arc<UpstreamState>,
        endpoints: &[ResolvedEndpoint],
        worker: usize,
        previous: Option<&UpstreamRt>,
    ) -> Self {
        let local = previous
            .filter(|p| Arc::ptr_eq(&p.shared, &shared))
            .map_or_else(|| Rc::new(UpstreamLocal::new()), |p| p.local.clone());
        let carried: Vec<Rc<EndpointRt>> = previous
            .map(|p| p.endpoints.borrow().clone())
            .unwrap_or_default();
        // Connections made under another protocol or TLS setting (TLS turned on, another CA,
        // verification turned back on) must not serve the new generation's requests.
        let reconnect = previous.is_some_and(|p| !same_connections(&p.cfg, cfg));
        if reconnect {
            for ep in &carried {
                ep.idle.borrow_mut().clear();
                ep.h2.clear();
            }
        }
        let rt = UpstreamRt {
            balancer: RefCell::new(Balancer::new(&cfg.balancer, worker, &[])),
            cfg: cfg.clone(),
            shared,
            local,
            queue: Rc::new(WaitQueue::default()),
            worker,
            endpoints: RefCell::new(carried),
        };
        rt.set_endpoints(endpoints);
        rt
    }

    /// Replaces the endpoint list, keeping the per-worker state (idle pool, in-flight count,
    /// latency) of endpoints still present; idle connections of endpoints that left close.
    pub fn set_endpoints(&self, resolved: &[ResolvedEndpoint]) {
        let mut current = self.endpoints.borrow_mut();
        let mut next = Vec::with_capacity(resolved.len());
        for r in resolved {
            let kept = current
                .iter()
                .position(|e| Arc::ptr_eq(&e.state, &r.state))
                .map(|i| current.swap_remove(i));
            let ep = kept.unwrap_or_else(|| Rc::new(EndpointRt::new(r)));
            ep.weight.set(r.weight);
            ep.idle.borrow_mut().trim(self.cfg.pool_max_idle);
            next.push(ep);
        }
        for gone in current.drain(..) {
            gone.idle.borrow_mut().clear();
            gone.h2.clear();
        }
        let keys: Vec<(String, u32)> = next
            .iter()
            .map(|e| (format!("{}#{}", e.addr, e.authority), e.weight.get()))
            .collect();
        *self.balancer.borrow_mut() = Balancer::new(&self.cfg.balancer, self.worker, &keys);
        *current = next;
    }

    /// Idle pooled connections across endpoints.
    pub fn idle_count(&self) -> usize {
        self.endpoints
            .borrow()
            .iter()
            .map(|e| e.idle.borrow().len())
            .sum()
    }

    /// Whether the balancer wants a hash key from the request.
    pub fn needs_key(&self) -> bool {
        self.balancer.borrow().needs_key()
    }

    /// A pseudo-random number (backoff jitter).
    pub fn random(&self) -> u64 {
        self.balancer.borrow().random()
    }

    /// Picks an endpoint for an attempt: eligible (in rotation, healthy and not ejected, with
    /// connection room and a token) and not in `tried` when another one is. When no endpoint
    /// in rotation is healthy, health is ignored (fail open).
    pub fn pick(
        &self,
        key: Option<u64>,
        tried: &Tried,
        now_ms: u64,
        now: Instant,
        epoch: Instant,
    ) -> Result<Rc<EndpointRt>, PickError> {
        let eps = self.endpoints.borrow();
        if eps.is_empty() {
            return Err(PickError::NoEndpoints);
        }
        let balancer = self.balancer.borrow();
        let mut view = View {
            eps: &eps,
            tried,
            skip: None,
            allow_tried: false,
            strict: true,
            max_connections: self.cfg.max_connections,
            h2_connections: (self.cfg.protocol != UpstreamProtocol::Http1)
                .then_some(self.cfg.h2_connections),
            bucket: self
                .cfg
                .rate_limit
                .map(|r| (r, now.saturating_duration_since(epoch).as_nanos() as u64)),
            now_ms,
            now,
        };
        if !eps.iter().any(|e| view.in_rotation(e) && view.healthy(e)) {
            view.strict = false;
        }
        // A token bucket is spent only by the endpoint finally picked; when another worker
        // took the last token between the check and the take, the next candidate is tried.
        for _ in 0..eps.len() {
            view.allow_tried = false;
            let mut pick = balancer.pick(&view, key);
            if pick.is_none() {
                view.allow_tried = true;
                pick = balancer.pick(&view, key);
            }
            let Some(i) = pick else { break };
            let ep = &eps[i];
            match view.bucket {
                Some((cfg, now_ns)) if !ep.state.bucket_take(&cfg, now_ns) => {
                    view.skip = Some(i);
                }
                _ => return Ok(ep.clone()),
            }
        }
        if eps.iter().any(|e| view.in_rotation(e)) {
            Err(PickError::Busy)
        } else {
            Err(PickError::NoEndpoints)
        }
    }

    /// Undoes what [`Self::pick`] spent on `ep` (its rate-limit token) for a request that did
    /// not go to it after all: it had no connection or stream to spare, and the request waits.
    pub fn unpick(&self, ep: &EndpointRt, now: Instant, epoch: Instant) {
        if let Some(cfg) = &self.cfg.rate_limit {
            let now_ns = now.saturating_duration_since(epoch).as_nanos() as u64;
            ep.state.bucket_refund(cfg, now_ns);
        }
    }

    /// A connection to `ep`: a pooled one when there is one (unless `force_new`), else a new
    /// one within the endpoint's connection limit.
    ///
    /// A pooled connection is checked first (one non-blocking `MSG_PEEK`): one the upstream
    /// closed, or one with bytes nobody asked for (a late response, a 408 written before
    /// closing an idle connection), is dropped, so those bytes can never be read as the next
    /// request's response. The check is skipped for a `replayable` request (idempotent, no
    /// streamed body: sent again on a new connection if the pooled one turns out closed) on a
    /// connection idle for less than [`UNCHECKED_IDLE`], the steady state under load.
    pub async fn connect(
        &self,
        ep: &Rc<EndpointRt>,
        force_new: bool,
        replayable: bool,
        now: Instant,
    ) -> Result<UpConn, ConnectError> {
        if !force_new {
            if let Some(conn) = self.take_idle(ep, replayable, now) {
                return Ok(conn);
            }
        }
        let Some(slot) = state::ConnectionSlot::take(&ep.state, self.cfg.max_connections) else {
            return Err(ConnectError::Busy);
        };
        // Boxed: a connect's state (the TCP connect and a TLS handshake, about 3 KiB) would
        // otherwise be part of every request's state, where a pooled connection, the common
        // case, leaves it unused; one allocation per new connection instead.
        Box::pin(self.open(ep, slot)).await
    }

    /// A usable pooled connection to `ep`, if there is one (see [`Self::connect`]).
    fn take_idle(&self, ep: &EndpointRt, replayable: bool, now: Instant) -> Option<UpConn> {
        let mut idle = ep.idle.borrow_mut();
        while let Some((mut conn, idle_for)) = idle.pop(now, self.cfg.pool_idle_timeout) {
            let unchecked = replayable && idle_for < UNCHECKED_IDLE && !conn.check_before_reuse;
            if unchecked || conn.idle_usable() {
                conn.unchecked = unchecked;
                add(&self.shared.stats(self.worker).pool_hits, 1);
                return Some(conn);
            }
        }
        None
    }

    /// A new connection to `ep`, on `slot` under the connection limit.
    async fn open(
        &self,
        ep: &EndpointRt,
        slot: state::ConnectionSlot,
    ) -> Result<UpConn, ConnectError> {
        let stats = self.shared.stats(self.worker);
        // The slot goes to the connection (`UpConn` gives it back when dropped); a failed or
        // abandoned connect gives it back with `slot`.
        add(&stats.pool_misses, 1);
        // One `connect_timeout` for the TCP connect and the TLS handshake together.
        let started = std::time::Instant::now();
        let connected = match net::connect(ep.addr, self.cfg.connect_timeout).await {
            Ok(stream) => match &self.cfg.tls {
                None => Ok(UpConn::new(
                    stream,
                    ep.addr,
                    ep.authority.clone(),
                    ep.state.clone(),
                )),
                Some(tls) => {
                    use std::os::fd::AsRawFd;
                    let fd = stream.as_raw_fd();
                    let left = self.cfg.connect_timeout.saturating_sub(started.elapsed());
                    match tls_connect(tls, &ep.authority, stream, left).await {
                        Ok(s) => Ok(UpConn::new_tls(
                            s,
                            fd,
                            ep.addr,
                            ep.authority.clone(),
                            ep.state.clone(),
                        )),
                        Err(e) => Err(e),
                    }
                }
            },
            Err(e) => Err(e),
        };
        match connected {
            Ok(c) => {
                slot.hand_over();
                Ok(c)
            }
            Err(e) => {
                drop(slot);
                tracing::debug!(endpoint = %ep.addr, error = %e, "upstream connect failed");
                if e.kind() == io::ErrorKind::TimedOut {
                    Err(ConnectError::TimedOut)
                } else {
                    Err(ConnectError::Failed(e))
                }
            }
        }
    }

    /// Returns a connection whose exchange completed cleanly to its endpoint's idle pool (or
    /// closes it when the pool is full or the endpoint left the upstream).
    pub fn release(&self, mut conn: UpConn, now: Instant) {
        // Bytes beyond the response already taken in by TLS: never the next response. A
        // connection of an earlier generation whose TLS setting differs is not pooled either.
        if self.cfg.pool_max_idle == 0
            || conn.read.holds_unread()
            || conn.read.is_tls() != self.cfg.tls.is_some()
            || (self.local.pending.get() == 0 && self.others_waiting())
        {
            return;
        }
        let eps = self.endpoints.borrow();
        if let Some(ep) = eps.iter().find(|e| conn.belongs_to(&e.state)) {
            conn.mark_reused();
            ep.idle.borrow_mut().push(conn, now, self.cfg.pool_max_idle);
        }
    }

    /// Counts a request (first attempt) in the budget window and the upstream's metrics.
    pub fn count_request(&self) {
        let slot = self.local.slot();
        self.local.window.borrow_mut()[slot].0 += 1;
        add(&self.shared.stats(self.worker).requests, 1);
    }

    /// Counts a retry in the budget window.
    pub fn count_retry(&self) {
        let slot = self.local.slot();
        self.local.window.borrow_mut()[slot].1 += 1;
    }

    /// Whether the retry budget allows one more retry now: retries in the window stay within
    /// `percent` of requests plus `min_per_second` per second, summed over every worker.
    pub fn budget_allows_retry(&self) -> bool {
        let b = &self.cfg.retry_budget;
        let (r_local, t_local) = self.local.totals();
        let (r_other, t_other) = self.shared.window_totals(self.worker);
        let (requests, retries) = (r_local + r_other, t_local + t_other);
        let allowed = requests * u64::from(b.percent) / 100
            + u64::from(b.min_per_second) * BUDGET_WINDOW_SECS as u64;
        retries < allowed
    }

    /// Records the time to a response head.
    pub fn record_latency(&self, d: Duration) {
        let mut latency = self.local.latency.borrow_mut();
        let latency = latency.get_or_insert_with(|| {
            // The first on this worker: the published copy and the spare are made now too,
            // so that publishing, once a second from here on, swaps them and never allocates.
            let empty = state::new_histogram();
            let mut spare = None;
            self.shared.publish_latency(self.worker, &empty, &mut spare);
            *self.local.latency_spare.borrow_mut() = Some(Arc::new(empty.clone()));
            empty
        });
        let _ = latency.record(
            (d.as_micros() as u64).clamp(state::LATENCY_RANGE_US.0, state::LATENCY_RANGE_US.1),
        );
        self.local.latency_dirty.set(true);
    }

    /// This upstream's ejected endpoints, and how many may be (`max_ejection_percent`).
    pub fn ejection_budget(&self, max_percent: u32, now_ms: u64) -> (u64, u64) {
        let eps = self.endpoints.borrow();
        state::ejection_budget(eps.iter().map(|e| &*e.state), max_percent, now_ms)
    }

    /// Periodic work (the worker's tick): rolls the budget window to second `second` and
    /// publishes this worker's figures; publishes the latency histogram when `publish`.
    pub fn tick(&self, second: u64, publish_latency: bool) {
        let local = &self.local;
        if local.second.get() != second {
            let mut window = local.window.borrow_mut();
            let gap = second.saturating_sub(local.second.get());
            for k in 1..=gap.min(BUDGET_WINDOW_SECS as u64) {
                window[((local.second.get() + k) % BUDGET_WINDOW_SECS as u64) as usize] = (0, 0);
            }
            local.second.set(second);
        }
        let (r, t) = local.totals();
        let slot = &self.shared.window[self.worker % self.shared.window.len()];
        slot[0].store(r, Ordering::Relaxed);
        slot[1].store(t, Ordering::Relaxed);
        if publish_latency && local.latency_dirty.replace(false) {
            if let Some(latency) = &*local.latency.borrow() {
                self.shared.publish_latency(
                    self.worker,
                    latency,
                    &mut local.latency_spare.borrow_mut(),
                );
            }
        }
    }

    /// Closes idle connections older than the pool idle timeout; while requests on other
    /// workers wait for a connection under `max_connections`, one more per endpoint and tick
    /// (an idle connection here holds a slot one of them needs), HTTP/2 ones without a
    /// stream included.
    pub fn reap(&self, now: Instant) {
        let give_up_one = self.others_waiting();
        for ep in self.endpoints.borrow().iter() {
            let mut idle = ep.idle.borrow_mut();
            idle.reap(now, self.cfg.pool_idle_timeout);
            if give_up_one {
                let keep = idle.len().saturating_sub(1);
                idle.trim(keep);
                ep.h2.close_one_idle();
            }
        }
    }

    /// Whether requests on other workers wait for a connection under `max_connections`: the
    /// cap counts open connections, idle ones too, so this worker's idle pool could otherwise
    /// shut them out until it idles out.
    fn others_waiting(&self) -> bool {
        self.cfg.max_connections > 0
            && self.shared.pending.load(Ordering::Relaxed) > self.local.pending.get()
    }

    /// Closes every idle connection (shutdown).
    pub fn clear_idle(&self) {
        for ep in self.endpoints.borrow().iter() {
            ep.idle.borrow_mut().clear();
        }
    }

    /// A stream on an HTTP/2 connection to `ep` (upstreams with `protocol = "h2c"`).
    pub async fn h2_stream(
        &self,
        ep: &Rc<EndpointRt>,
        max_head: usize,
    ) -> Result<(h2::client::SendRequest<bytes::Bytes>, h2pool::StreamSlot), ConnectError> {
        let had = ep.h2.len();
        let r = ep
            .h2
            .stream(
                ep.addr,
                &ep.authority,
                &ep.state,
                h2pool::Limits {
                    conns: self.cfg.h2_connections,
                    total: self.cfg.max_connections,
                    connect_timeout: self.cfg.connect_timeout,
                    stream_window: self.cfg.h2_stream_window,
                    connection_window: self.cfg.h2_connection_window,
                    keepalive: self.cfg.h2_keepalive,
                    idle: self.cfg.pool_idle_timeout,
                    max_head,
                },
                self.cfg.tls.as_deref(),
            )
            .await;
        let stats = self.shared.stats(self.worker);
        if ep.h2.len() > had {
            add(&stats.pool_misses, 1);
        } else if r.is_ok() {
            add(&stats.pool_hits, 1);
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upstream(keys: &str) -> UpstreamConfig {
        let gen = crate::config::compile(
            &format!(
                "[[listeners]]\naddress = \"127.0.0.1:0\"\n[[upstreams]]\nname = \"u\"\nendpoints = [\"127.0.0.1:1\"]\n{keys}\n"
            ),
            "t",
        )
        .unwrap();
        gen.upstreams[0].clone()
    }

    /// A connect abandoned mid-way (its future dropped: a task that panicked, a worker
    /// stopping) gives its slot under `max_connections` back: HTTP/1.1 over TLS, whose
    /// handshake the silent peer here never answers; and an HTTP/2 connection whose driver
    /// task is dropped (h2's handshake does not wait for the peer).
    #[test]
    fn an_abandoned_connect_gives_its_connection_slot_back() {
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = silent.local_addr().unwrap();
        for keys in [
            "max_connections = 1\ntls = { insecure_skip_verify = true }",
            "max_connections = 1\nprotocol = \"h2c\"",
        ] {
            let cfg = upstream(keys);
            let state = Arc::new(EndpointState::new(addr, Arc::from("x:1"), 1));
            let endpoint = ResolvedEndpoint {
                addr,
                authority: Arc::from("x:1"),
                weight: 1,
                state: state.clone(),
            };
            let shared = Arc::new(UpstreamState::new("u", 1));
            let mut rt = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
                .enable_timer()
                .build()
                .unwrap();
            rt.block_on(async {
                let up = UpstreamRt::new(&cfg, shared, &[endpoint], 0, None);
                let ep = up.endpoints.borrow()[0].clone();
                let slow = Duration::from_millis(100);
                if cfg.protocol.is_h2() {
                    // (h2's handshake does not wait for the peer: the connection is made, and
                    // its driver task holds the slot until the runtime drops it.)
                    let connect = up.h2_stream(&ep, 16384);
                    let _ = monoio::time::timeout(slow, connect).await;
                } else {
                    let connect = up.connect(&ep, true, false, Instant::now());
                    assert!(
                        monoio::time::timeout(slow, connect).await.is_err(),
                        "{keys}"
                    );
                }
            });
            drop(rt);
            assert!(
                state.has_connection_room(1),
                "the slot stayed taken: {keys}"
            );
        }
        drop(silent);
    }

    #[test]
    fn http2_connections_are_kept_across_a_reload_only_with_their_drivers_settings() {
        let h2 = upstream("protocol = \"h2c\"");
        assert!(same_connections(
            &h2,
            &upstream("protocol = \"h2c\"\nretries = { attempts = 3 }")
        ));
        for changed in [
            "h2_stream_window = 65535",
            "h2_connection_window = 1048576",
            "h2_keepalive = \"10s\"",
            "pool_idle_timeout = \"5s\"",
            "connect_timeout = \"1s\"",
        ] {
            let other = upstream(&format!("protocol = \"h2c\"\n{changed}"));
            assert!(!same_connections(&h2, &other), "{changed}");
        }
        // HTTP/1.1 connections take none of those settings: they stay pooled.
        let h1 = upstream("");
        assert!(same_connections(
            &h1,
            &upstream("pool_idle_timeout = \"5s\"\nconnect_timeout = \"1s\"")
        ));
        assert!(!same_connections(&h1, &h2));
    }
}
