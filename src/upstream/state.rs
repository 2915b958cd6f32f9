//! Cross-core upstream state: the few atomics every worker must agree on.
//!
//! Ownership: built by the control thread (at start and on reloads, kept by upstream name and
//! endpoint address so state survives reloads and DNS changes), shared through `Arc` with every
//! worker. Each field says why it is cross-core. Hot-path cost: reads are relaxed loads; writes
//! happen on failures, connection opens/closes and half-open probes, not on every success.
//!
//! Times are milliseconds since the server's epoch (`Shared::epoch`), from the worker's coarse
//! clock.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwapOption;
use crossbeam_utils::CachePadded;
use hdrhistogram::Histogram;

use crate::config::{BreakerConfig, OutlierConfig, RateLimitConfig};

/// Failure classes, as counted in metrics and fed to passive health and the breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureClass {
    /// The connection could not be made (refused, unreachable, connect timeout).
    Connect,
    /// No response head within the (per-try) response timeout.
    Timeout,
    /// The connection closed or was reset before a complete response head.
    Reset,
    /// The response was not valid HTTP.
    Invalid,
    /// A 5xx response.
    Status5xx,
    /// The response body was cut short (closed, reset or stalled mid-body).
    MidBody,
}

impl FailureClass {
    /// Every class, in metric index order.
    pub const ALL: [FailureClass; 6] = [
        FailureClass::Connect,
        FailureClass::Timeout,
        FailureClass::Reset,
        FailureClass::Invalid,
        FailureClass::Status5xx,
        FailureClass::MidBody,
    ];

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            FailureClass::Connect => "connect",
            FailureClass::Timeout => "timeout",
            FailureClass::Reset => "reset",
            FailureClass::Invalid => "invalid",
            FailureClass::Status5xx => "5xx",
            FailureClass::MidBody => "mid_body",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// One worker's counters for one endpoint (single writer: that worker; read at scrape).
#[derive(Debug, Default)]
pub struct EndpointStats {
    /// Attempts sent to this endpoint.
    pub requests: AtomicU64,
    /// Failed attempts, by [`FailureClass`].
    pub failures: [AtomicU64; 6],
    /// Attempts in flight on this worker now (a gauge).
    pub in_flight: AtomicU64,
}

impl EndpointStats {
    /// Counts a failure of `class`.
    pub fn failure(&self, class: FailureClass) {
        crate::observe::metrics::add(&self.failures[class.index()], 1);
    }
}

/// One worker's counters for one upstream (single writer: that worker; read at scrape).
#[derive(Debug, Default)]
pub struct UpstreamStats {
    /// Requests routed to this upstream, counted once when admitted (retries not included).
    pub requests: AtomicU64,
    /// Retries admitted.
    pub retries: AtomicU64,
    /// Retries refused because the budget was spent.
    pub budget_exhausted: AtomicU64,
    /// Requests refused because the circuit was open.
    pub circuit_open: AtomicU64,
    /// Requests refused by `max_pending` or a connection wait that timed out.
    pub saturated: AtomicU64,
    /// Attempts served on a pooled connection.
    pub pool_hits: AtomicU64,
    /// Attempts that opened a new connection.
    pub pool_misses: AtomicU64,
    /// Failed attempts, by [`FailureClass`].
    pub failures: [AtomicU64; 6],
    /// Endpoints this worker ejected.
    pub ejections: AtomicU64,
}

impl UpstreamStats {
    /// Counts a failure of `class`.
    pub fn failure(&self, class: FailureClass) {
        crate::observe::metrics::add(&self.failures[class.index()], 1);
    }
}

/// Lowest and highest latency the histograms track, in microseconds.
pub const LATENCY_RANGE_US: (u64, u64) = (1, 3_600_000_000);

/// One endpoint's shared state.
#[derive(Debug)]
pub struct EndpointState {
    /// Address.
    pub addr: SocketAddr,
    /// `host:port` as configured.
    pub authority: Arc<str>,
    /// Active health: flipped by the health checker after its thresholds.
    pub healthy: AtomicBool,
    /// Taken out of rotation by an operator (admin API); in-flight requests finish.
    pub drained: AtomicBool,
    /// Passive health: failures in a row, from any worker.
    pub consecutive_failures: AtomicU32,
    /// Ejected until this time (0: not ejected).
    pub ejected_until: AtomicU64,
    /// How many times it was ejected (the ejection time grows with it).
    pub ejections: AtomicU32,
    /// When active health last brought it back, or stopped vouching against it (a reload
    /// removed the checks): ms since the shared epoch; 0: never.
    readmitted_ms: AtomicU64,
    /// Open connections across workers, for the per-endpoint connection limit.
    pub connections: AtomicU32,
    /// GCRA theoretical arrival time (ns since epoch) of the per-endpoint token bucket.
    bucket_tat: AtomicU64,
    /// Per-worker counters: metrics must be summed on any core.
    pub stats: Box<[CachePadded<EndpointStats>]>,
}

impl EndpointState {
    /// A new endpoint, healthy and in rotation.
    pub fn new(addr: SocketAddr, authority: Arc<str>, workers: usize) -> Self {
        EndpointState {
            addr,
            authority,
            healthy: AtomicBool::new(true),
            drained: AtomicBool::new(false),
            consecutive_failures: AtomicU32::new(0),
            ejected_until: AtomicU64::new(0),
            ejections: AtomicU32::new(0),
            readmitted_ms: AtomicU64::new(0),
            connections: AtomicU32::new(0),
            bucket_tat: AtomicU64::new(0),
            stats: (0..workers.max(1))
                .map(|_| CachePadded::new(EndpointStats::default()))
                .collect(),
        }
    }

    /// Whether passive health has it ejected at `now_ms`.
    pub fn ejected(&self, now_ms: u64) -> bool {
        let until = self.ejected_until.load(Ordering::Relaxed);
        until != 0 && now_ms < until
    }

    /// Active health passed again at `now_ms`: back in rotation, with its failure run and any
    /// ejection forgotten.
    pub fn readmit(&self, now_ms: u64) {
        self.healthy.store(true, Ordering::Relaxed);
        self.ejected_until.store(0, Ordering::Relaxed);
        self.consecutive_failures.store(0, Ordering::Relaxed);
        self.readmitted_ms.store(now_ms, Ordering::Relaxed);
    }

    /// Active health checks no longer vouch against it (a reload removed them) as of `now_ms`.
    pub fn unchecked(&self, now_ms: u64) {
        if !self.healthy.swap(true, Ordering::Relaxed) {
            self.readmitted_ms.store(now_ms, Ordering::Relaxed);
        }
    }

    /// When it last came back into rotation, as of `now_ms` (ms since the shared epoch; 0 if
    /// it never left): its health checks passing again, or an ejection that has ended.
    /// Latency samples from before then say nothing about the endpoint as it is now.
    pub fn back_since(&self, now_ms: u64) -> u64 {
        let until = self.ejected_until.load(Ordering::Relaxed);
        let ejection_end = if until <= now_ms { until } else { 0 };
        self.readmitted_ms.load(Ordering::Relaxed).max(ejection_end)
    }

    /// Records a success: resets the failure run (without a write when there is none).
    pub fn record_success(&self) {
        if self.consecutive_failures.load(Ordering::Relaxed) != 0 {
            self.consecutive_failures.store(0, Ordering::Relaxed);
        }
    }

    /// Records a failure; ejects the endpoint when the run reaches the threshold and the
    /// upstream's ejection budget allows (`budget`: its ejected endpoints and how many may
    /// be). Returns whether it ejected.
    pub fn record_failure(
        &self,
        cfg: &OutlierConfig,
        now_ms: u64,
        budget: impl Fn() -> (u64, u64),
    ) -> bool {
        let run = self.consecutive_failures.fetch_add(1, Ordering::Relaxed) + 1;
        if run < cfg.consecutive_failures || self.ejected(now_ms) {
            return false;
        }
        let (ejected, allowed) = budget();
        if ejected >= allowed {
            return false;
        }
        // The multiplier decays: one step for each `base_ejection` the endpoint has spent
        // back in rotation since its last ejection ended (an endpoint that failed once a day
        // is not held out for `max_ejection` forever after).
        let base = cfg.base_ejection.as_millis() as u64;
        let last_until = self.ejected_until.load(Ordering::Relaxed);
        if last_until != 0 && now_ms < last_until {
            // Another worker ejected it since the look above.
            return false;
        }
        let healthy_steps = now_ms.saturating_sub(last_until) / base.max(1);
        let decayed =
            u64::from(self.ejections.load(Ordering::Relaxed)).saturating_sub(healthy_steps);
        let n = decayed as u32 + 1;
        let time = base
            .saturating_mul(u64::from(n))
            .min(cfg.max_ejection.as_millis() as u64);
        // Claimed with the deadline: of two workers whose runs reach the threshold together,
        // one ejects (the other would count a second ejection, doubling the first).
        if self
            .ejected_until
            .compare_exchange(
                last_until,
                now_ms + time.max(1),
                Ordering::Relaxed,
                Ordering::Relaxed,
            )
            .is_err()
        {
            return false;
        }
        let before = self.ejections.swap(n, Ordering::Relaxed);
        // Another worker may have ejected another endpoint between the look and the store:
        // look again (this one counted now), and step back when the two together went past
        // the budget. (Both may step back; their runs stay at the threshold, and the next
        // failure tries again.)
        let (ejected, allowed) = budget();
        if ejected > allowed {
            self.ejected_until.store(last_until, Ordering::Relaxed);
            self.ejections.store(before, Ordering::Relaxed);
            return false;
        }
        self.consecutive_failures.store(0, Ordering::Relaxed);
        true
    }

    /// Takes a connection slot when under `max` (0: unlimited). The slot is given back by
    /// [`EndpointState::close_connection`].
    pub fn open_connection(&self, max: u32) -> bool {
        if max == 0 {
            self.connections.fetch_add(1, Ordering::Relaxed);
            return true;
        }
        self.connections
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| {
                (c < max).then_some(c + 1)
            })
            .is_ok()
    }

    /// Gives a connection slot back.
    pub(crate) fn close_connection(&self) {
        let _ = self
            .connections
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| {
                Some(c.saturating_sub(1))
            });
    }

    /// Whether a new connection would be under `max` (0: unlimited).
    pub fn has_connection_room(&self, max: u32) -> bool {
        max == 0 || self.connections.load(Ordering::Relaxed) < max
    }

    /// Token bucket (GCRA on one word, exact across cores): whether a request may go now.
    pub fn bucket_allows(&self, cfg: &RateLimitConfig, now_ns: u64) -> bool {
        self.bucket_settle(cfg, now_ns) <= now_ns + cfg.burst_ns()
    }

    /// Spends one token; false when the bucket is empty.
    pub fn bucket_take(&self, cfg: &RateLimitConfig, now_ns: u64) -> bool {
        self.bucket_settle(cfg, now_ns);
        let interval = cfg.interval_ns();
        let limit = now_ns + cfg.burst_ns();
        self.bucket_tat
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |tat| {
                let start = tat.max(now_ns);
                (start <= limit).then_some(start + interval)
            })
            .is_ok()
    }

    /// Gives back a token [`Self::bucket_take`] spent on a request that did not go (its
    /// endpoint had no connection or stream for it after all). A full bucket stays full.
    pub fn bucket_refund(&self, cfg: &RateLimitConfig, now_ns: u64) {
        let interval = cfg.interval_ns();
        let _ = self
            .bucket_tat
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |tat| {
                (tat > now_ns).then(|| tat.saturating_sub(interval).max(now_ns))
            });
    }

    /// The bucket's arrival time, brought within what `cfg` can make: at most an empty
    /// bucket's (`now + burst + interval`; with an unchanged config a take never gets past
    /// that). After a reload to a smaller burst or a higher rate the bucket is empty, not in
    /// debt for the old burst's length.
    fn bucket_settle(&self, cfg: &RateLimitConfig, now_ns: u64) -> u64 {
        let tat = self.bucket_tat.load(Ordering::Relaxed);
        let most = now_ns + cfg.burst_ns() + cfg.interval_ns();
        if tat <= most {
            return tat;
        }
        // Another worker may settle or take at the same time: either way the word is then
        // within bounds.
        let _ = self
            .bucket_tat
            .compare_exchange(tat, most, Ordering::Relaxed, Ordering::Relaxed);
        most
    }

    /// In-flight attempts summed over workers.
    pub fn in_flight_total(&self) -> u64 {
        self.stats
            .iter()
            .map(|c| c.in_flight.load(Ordering::Relaxed))
            .sum()
    }

    /// This worker's counters (`worker` is always below the worker count the state was
    /// built for; the modulo keeps a mismatch harmless).
    pub fn stats(&self, worker: usize) -> &EndpointStats {
        &self.stats[worker % self.stats.len()]
    }
}

/// Circuit breaker state, as published in one word (see [`Breaker`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    /// Requests flow.
    Closed,
    /// Requests are refused until the open duration has passed.
    Open,
    /// A limited number of probe requests test the upstream.
    HalfOpen,
}

const CLOSED: u64 = 0;
const OPEN: u64 = 1;
const HALF_OPEN: u64 = 2;
const STATE_MASK: u64 = 3;
/// Probes out in the current half-open round: bits 2..18 (`half_open_max` < 2^16).
const PROBE_SHIFT: u32 = 2;
const PROBE_MASK: u64 = 0xffff << PROBE_SHIFT;
const PROBE_ONE: u64 = 1 << PROBE_SHIFT;
/// When the circuit opened (ms since the server's epoch): the bits above.
const STAMP_SHIFT: u32 = 18;

/// The word of a half-open round that begins at `now_ms` with its first probe, after the
/// round (or the open state) stamped `previous`. The stamp is the round's start less the
/// open duration (`stamp + open_ms` is when the round began) and never `previous` again: a
/// probe of an earlier round can neither decide nor free a permit of this one.
fn half_open_round(previous: u64, now_ms: u64, open_ms: u64) -> u64 {
    let stamp = now_ms.saturating_sub(open_ms).max(previous + 1);
    (stamp << STAMP_SHIFT) | PROBE_ONE | HALF_OPEN
}

/// What the breaker says about one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Go ahead.
    Allow,
    /// Go ahead as a probe of the half-open round of the circuit that opened at this
    /// instant (ms): its outcome decides the state, and its permit must be returned through
    /// `record` or `release_probe`.
    Probe(u64),
    /// Refused: the circuit is open for this many more seconds (at least 1).
    Reject(u64),
}

/// One upstream's circuit breaker, shared by all workers.
///
/// ```text
/// CLOSED --failures in a row >= threshold--> OPEN --open_duration passed--> HALF_OPEN
/// HALF_OPEN --a probe succeeds--> CLOSED        HALF_OPEN --a probe fails--> OPEN
/// ```
/// Local rejections (caps, pending limits) are never recorded.
///
/// The state, when the circuit opened and the probes out in a half-open round share one
/// word (`opened << 18 | probes << 2 | state`): every transition is one compare-exchange, so
/// a round starts with exactly no probe out, and a probe of an earlier round (still running
/// when its round ended) can neither decide nor free a permit of a later one.
#[derive(Debug, Default)]
pub struct Breaker {
    word: CachePadded<AtomicU64>,
    failures: AtomicU32,
}

impl Breaker {
    /// The current state and when it opened.
    pub fn state(&self) -> (BreakerState, u64) {
        let w = self.word.load(Ordering::Relaxed);
        let s = match w & STATE_MASK {
            OPEN => BreakerState::Open,
            HALF_OPEN => BreakerState::HalfOpen,
            _ => BreakerState::Closed,
        };
        (s, w >> STAMP_SHIFT)
    }

    /// Whether a request may go, given the breaker config (disabled: always).
    /// `probe_timeout_ms`: how long a half-open round's probes may go without an outcome (the
    /// upstream's try timeout). Past it, a round whose permits are all out is stale (a probe
    /// whose request body streams for minutes, say, must not refuse everyone else as long):
    /// the next request starts a new round, and the stale probes can no longer decide.
    pub fn admit(&self, cfg: &BreakerConfig, now_ms: u64, probe_timeout_ms: u64) -> Admit {
        if cfg.failure_threshold == 0 {
            // Turned off by a reload while open: closed from now on (the state is reported),
            // and turned on again later with no failure run from before.
            if self.word.load(Ordering::Relaxed) & STATE_MASK != CLOSED {
                self.word.store(CLOSED, Ordering::Relaxed);
            }
            if self.failures.load(Ordering::Relaxed) != 0 {
                self.failures.store(0, Ordering::Relaxed);
            }
            return Admit::Allow;
        }
        let open_ms = cfg.open_duration.as_millis() as u64;
        let max = u64::from(cfg.half_open_max).min(PROBE_MASK >> PROBE_SHIFT);
        let mut w = self.word.load(Ordering::Acquire);
        loop {
            let opened = w >> STAMP_SHIFT;
            let next = match w & STATE_MASK {
                CLOSED => return Admit::Allow,
                OPEN => {
                    let elapsed = now_ms.saturating_sub(opened);
                    if elapsed < open_ms {
                        return Admit::Reject((open_ms - elapsed).div_ceil(1000).max(1));
                    }
                    // The first request after the open duration starts the half-open round
                    // as its first probe.
                    half_open_round(opened, now_ms, open_ms)
                }
                _ => {
                    if (w & PROBE_MASK) >> PROBE_SHIFT < max {
                        w + PROBE_ONE
                    } else if now_ms.saturating_sub(opened + open_ms) < probe_timeout_ms.max(1) {
                        return Admit::Reject(1);
                    } else {
                        half_open_round(opened, now_ms, open_ms)
                    }
                }
            };
            match self
                .word
                .compare_exchange_weak(w, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Admit::Probe(next >> STAMP_SHIFT),
                Err(current) => w = current,
            }
        }
    }

    /// Records the outcome of an admitted request.
    pub fn record(&self, cfg: &BreakerConfig, admit: Admit, success: bool, now_ms: u64) {
        if cfg.failure_threshold == 0 {
            return;
        }
        match admit {
            Admit::Probe(round) => {
                // A new round never shares its stamp with the one that ended.
                let next = if success {
                    CLOSED
                } else {
                    (now_ms.max(round + 1) << STAMP_SHIFT) | OPEN
                };
                // Only a probe of the round in progress decides.
                if self.update_round(round, |_| Some(next)) && success {
                    self.failures.store(0, Ordering::Relaxed);
                }
            }
            _ if success => {
                if self.failures.load(Ordering::Relaxed) != 0 {
                    self.failures.store(0, Ordering::Relaxed);
                }
            }
            _ => {
                let run = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
                if run >= cfg.failure_threshold {
                    let w = self.word.load(Ordering::Acquire);
                    if w & STATE_MASK == CLOSED
                        && self
                            .word
                            .compare_exchange(
                                w,
                                (now_ms << STAMP_SHIFT) | OPEN,
                                Ordering::AcqRel,
                                Ordering::Relaxed,
                            )
                            .is_ok()
                    {
                        self.failures.store(0, Ordering::Relaxed);
                    }
                }
            }
        }
    }

    /// Returns a probe permit whose request ended without an outcome (client gone); a
    /// permit of a round that has ended is gone with its round.
    pub fn release_probe(&self, admit: Admit) {
        if let Admit::Probe(round) = admit {
            self.update_round(round, |w| (w & PROBE_MASK != 0).then(|| w - PROBE_ONE));
        }
    }

    /// Applies `f` to the word while it is the half-open round of the circuit opened at
    /// `round`; whether it did.
    fn update_round(&self, round: u64, f: impl Fn(u64) -> Option<u64>) -> bool {
        self.word
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                if w & STATE_MASK == HALF_OPEN && w >> STAMP_SHIFT == round {
                    f(w)
                } else {
                    None
                }
            })
            .is_ok()
    }
}

/// One upstream's shared state.
#[derive(Debug)]
pub struct UpstreamState {
    /// Upstream name (the key across reloads).
    pub name: String,
    /// Circuit breaker: every worker must see one state and share the half-open probes.
    pub breaker: Breaker,
    /// Retries in progress across workers (the concurrent part of the retry budget).
    pub active_retries: CachePadded<AtomicU32>,
    /// Requests waiting for a connection across workers (`max_pending`).
    pub pending: CachePadded<AtomicU32>,
    /// Each worker's requests and retries in the budget window, published on its tick: the
    /// budget is a ratio over all workers' traffic.
    pub window: Box<[CachePadded<[AtomicU64; 2]>]>,
    /// Per-worker counters (summed at scrape).
    pub stats: Box<[CachePadded<UpstreamStats>]>,
    /// Per-worker latency histograms in microseconds (time to the response head), as each
    /// worker last published them (about once a second); merged at scrape.
    /// (None until the worker first publishes one.)
    pub latency: Box<[CachePadded<ArcSwapOption<Histogram<u64>>>]>,
}

impl UpstreamState {
    /// State for upstream `name` on `workers` workers.
    pub fn new(name: &str, workers: usize) -> Self {
        let workers = workers.max(1);
        UpstreamState {
            name: name.to_string(),
            breaker: Breaker::default(),
            active_retries: CachePadded::new(AtomicU32::new(0)),
            pending: CachePadded::new(AtomicU32::new(0)),
            window: (0..workers)
                .map(|_| CachePadded::new([AtomicU64::new(0), AtomicU64::new(0)]))
                .collect(),
            stats: (0..workers)
                .map(|_| CachePadded::new(UpstreamStats::default()))
                .collect(),
            latency: (0..workers)
                .map(|_| CachePadded::new(ArcSwapOption::empty()))
                .collect(),
        }
    }

    /// This worker's counters.
    pub fn stats(&self, worker: usize) -> &UpstreamStats {
        &self.stats[worker % self.stats.len()]
    }

    /// Publishes a copy of `worker`'s histogram (the worker keeps recording into its own).
    /// `spare` is the copy published the time before, reused when no scrape holds it any
    /// more, so publishing does not allocate in steady state.
    pub fn publish_latency(
        &self,
        worker: usize,
        local: &Histogram<u64>,
        spare: &mut Option<Arc<Histogram<u64>>>,
    ) {
        let copy = match spare.take() {
            Some(mut arc) => match Arc::get_mut(&mut arc) {
                Some(h) => {
                    h.reset();
                    // (Auto-resizing: adding cannot fail; the spare grows once for each
                    // growth of the worker's own, up to the clamp.)
                    let _ = h.add(local);
                    arc
                }
                None => Arc::new(local.clone()),
            },
            None => Arc::new(local.clone()),
        };
        let old = self.latency[worker % self.latency.len()].swap(Some(copy));
        *spare = old;
    }

    /// Every worker's last published histogram, merged.
    pub fn merged_latency(&self) -> Histogram<u64> {
        let mut all = new_histogram();
        for slot in self.latency.iter() {
            if let Some(h) = &*slot.load() {
                // (Auto-resizing: adding cannot fail.)
                let _ = all.add(&**h);
            }
        }
        all
    }

    /// Retries in progress may grow by one (within `max`); the slot is returned through
    /// [`UpstreamState::retry_done`].
    pub fn retry_begin(&self, max: u32) -> bool {
        self.active_retries
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |n| {
                (n < max).then_some(n + 1)
            })
            .is_ok()
    }

    /// Ends a retry begun with [`UpstreamState::retry_begin`].
    pub fn retry_done(&self) {
        let _ = self
            .active_retries
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |n| {
                Some(n.saturating_sub(1))
            });
    }

    /// Requests and retries in the budget window, summed over workers' published figures,
    /// except worker `skip`'s (the caller adds its own, fresher counts).
    pub fn window_totals(&self, skip: usize) -> (u64, u64) {
        self.window
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != skip)
            .fold((0, 0), |(r, t), (_, w)| {
                (
                    r + w[0].load(Ordering::Relaxed),
                    t + w[1].load(Ordering::Relaxed),
                )
            })
    }
}

/// How many of `endpoints` are ejected, and how many may be by `max_percent` (at least one
/// when there are two or more).
pub fn ejection_budget<'a>(
    endpoints: impl Iterator<Item = &'a EndpointState>,
    max_percent: u32,
    now_ms: u64,
) -> (u64, u64) {
    let (mut n, mut ejected) = (0u64, 0u64);
    for e in endpoints {
        n += 1;
        ejected += u64::from(e.ejected(now_ms));
    }
    (
        ejected,
        (u64::from(max_percent) * n / 100).max(u64::from(n > 1)),
    )
}

/// An empty latency histogram: two significant figures (about 1% resolution). It covers 1 us
/// to 1 s in 14 KiB and grows as longer latencies come, up to 26 KiB for
/// [`LATENCY_RANGE_US`] (recorded values are clamped to it): sized for the latencies seen,
/// not for the hour a few requests might take, since every worker keeps three per upstream
/// it sends to (its own, the one it published, and the one before, reused).
pub fn new_histogram() -> Histogram<u64> {
    // invariant: constant, valid bounds (low >= 1, high >= 2 * low, sigfig <= 5).
    let mut h = Histogram::new_with_bounds(LATENCY_RANGE_US.0, 1_000_000, 2)
        .expect("constant histogram bounds are valid");
    h.auto(true);
    h
}

/// A connection slot taken under `max_connections` for a connection being opened: given
/// back when dropped (the connect failed, or its future was dropped or panicked mid-way),
/// unless handed to the connection, which gives it back when it closes.
#[derive(Debug)]
#[must_use]
pub struct ConnectionSlot(Option<Arc<EndpointState>>);

impl ConnectionSlot {
    /// A slot on `state` within `max` (0: unlimited), if one is free.
    pub fn take(state: &Arc<EndpointState>, max: u32) -> Option<Self> {
        state
            .open_connection(max)
            .then(|| ConnectionSlot(Some(state.clone())))
    }

    /// The connection now holds the slot (and gives it back itself).
    pub fn hand_over(mut self) {
        self.0 = None;
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        if let Some(state) = self.0.take() {
            state.close_connection();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn latency_histograms_are_held_only_once_used_and_grow_with_what_they_see() {
        let st = UpstreamState::new("up", 2);
        // Nothing published yet: nothing held, an empty merge.
        assert!(st.latency.iter().all(|s| s.load().is_none()));
        assert_eq!(st.merged_latency().len(), 0);
        // Worker 0 sees milliseconds, worker 1 an hour (the clamp).
        let mut fast = new_histogram();
        let small = fast.distinct_values();
        for ms in 1..=100 {
            fast.record(ms * 1000).unwrap();
        }
        assert_eq!(fast.distinct_values(), small, "1 us to 1 s fits as made");
        let mut slow = new_histogram();
        slow.record(LATENCY_RANGE_US.1).unwrap();
        assert!(slow.distinct_values() > small);
        let (mut spare0, mut spare1) = (None, None);
        st.publish_latency(0, &fast, &mut spare0);
        st.publish_latency(1, &slow, &mut spare1);
        let all = st.merged_latency();
        assert_eq!(all.len(), 101);
        assert_eq!(all.value_at_quantile(0.5) / 1000, 51);
        assert!(all.max() >= LATENCY_RANGE_US.1 * 99 / 100);
        // Published again over the copy from before (no reader holds it): the spare, grown.
        st.publish_latency(0, &slow, &mut spare0);
        st.publish_latency(0, &slow, &mut spare0);
        assert_eq!(st.merged_latency().len(), 2);
    }

    fn breaker_cfg() -> BreakerConfig {
        BreakerConfig {
            failure_threshold: 3,
            open_duration: Duration::from_secs(10),
            half_open_max: 2,
        }
    }

    #[test]
    fn breaker_cycle() {
        let b = Breaker::default();
        let cfg = breaker_cfg();
        for _ in 0..2 {
            assert_eq!(b.admit(&cfg, 0, 60_000), Admit::Allow);
            b.record(&cfg, Admit::Allow, false, 0);
        }
        b.record(&cfg, Admit::Allow, true, 0);
        for _ in 0..3 {
            b.record(&cfg, Admit::Allow, false, 1000);
        }
        assert_eq!(b.state().0, BreakerState::Open);
        assert_eq!(b.admit(&cfg, 1000, 60_000), Admit::Reject(10));
        assert_eq!(b.admit(&cfg, 10_500, 60_000), Admit::Reject(1));
        // Half-open: exactly half_open_max probes.
        let first = b.admit(&cfg, 11_000, 60_000);
        assert_eq!(first, Admit::Probe(1001));
        assert_eq!(b.state().0, BreakerState::HalfOpen);
        let second = b.admit(&cfg, 11_000, 60_000);
        assert_eq!(second, Admit::Probe(1001));
        assert_eq!(b.admit(&cfg, 11_000, 60_000), Admit::Reject(1));
        // A permit given back makes room for one more.
        b.release_probe(second);
        let second = b.admit(&cfg, 11_000, 60_000);
        assert_eq!(second, Admit::Probe(1001));
        b.record(&cfg, first, false, 11_500);
        assert_eq!(b.state(), (BreakerState::Open, 11_500));
        // The round's other probe ends later: neither its permit nor its outcome reaches
        // the next round.
        b.release_probe(second);
        b.record(&cfg, second, true, 11_600);
        assert_eq!(b.state(), (BreakerState::Open, 11_500));
        let a = b.admit(&cfg, 21_500, 60_000);
        assert_eq!(a, Admit::Probe(11_501));
        assert_eq!(b.admit(&cfg, 21_500, 60_000), Admit::Probe(11_501));
        b.release_probe(second);
        assert_eq!(b.admit(&cfg, 21_500, 60_000), Admit::Reject(1));
        b.record(&cfg, a, true, 21_600);
        assert_eq!(b.state().0, BreakerState::Closed);
        assert_eq!(b.admit(&cfg, 21_600, 60_000), Admit::Allow);
        // Disabled.
        let off = BreakerConfig {
            failure_threshold: 0,
            ..cfg
        };
        assert_eq!(Breaker::default().admit(&off, 0, 60_000), Admit::Allow);
        // Turned off (a reload) while open: it reports closed once requests flow again.
        let b = Breaker::default();
        for t in 0..3 {
            let a = b.admit(&cfg, t, 60_000);
            b.record(&cfg, a, false, t);
        }
        assert_eq!(b.state().0, BreakerState::Open);
        assert_eq!(b.admit(&off, 10, 60_000), Admit::Allow);
        assert_eq!(b.state().0, BreakerState::Closed);
    }

    #[test]
    fn a_round_whose_probes_take_too_long_gives_way_to_a_new_one() {
        let b = Breaker::default();
        let cfg = BreakerConfig {
            failure_threshold: 1,
            open_duration: Duration::from_secs(10),
            half_open_max: 1,
        };
        b.record(&cfg, Admit::Allow, false, 0);
        // The round begins at 10 s with a probe that takes long (an upload, say).
        let slow = b.admit(&cfg, 10_000, 5_000);
        assert!(matches!(slow, Admit::Probe(_)), "{slow:?}");
        assert_eq!(b.admit(&cfg, 14_999, 5_000), Admit::Reject(1));
        // Past the probe timeout the round is stale: a new one, with a new probe.
        let fresh = b.admit(&cfg, 15_100, 5_000);
        assert!(
            matches!(fresh, Admit::Probe(_)) && fresh != slow,
            "{fresh:?}"
        );
        assert_eq!(b.admit(&cfg, 16_000, 5_000), Admit::Reject(1));
        // The stale probe decides nothing, and its permit is not the new round's.
        b.record(&cfg, slow, true, 16_000);
        b.release_probe(slow);
        assert_eq!(b.state().0, BreakerState::HalfOpen);
        assert_eq!(b.admit(&cfg, 16_000, 5_000), Admit::Reject(1));
        b.record(&cfg, fresh, true, 16_500);
        assert_eq!(b.state().0, BreakerState::Closed);
    }

    #[test]
    fn two_ejections_at_once_never_pass_the_budget() {
        let a = EndpointState::new("127.0.0.1:1".parse().unwrap(), Arc::from("a:1"), 2);
        let b = EndpointState::new("127.0.0.1:2".parse().unwrap(), Arc::from("b:1"), 2);
        let cfg = OutlierConfig {
            consecutive_failures: 1,
            base_ejection: Duration::from_secs(1),
            max_ejection: Duration::from_secs(3),
            max_ejection_percent: 50,
            on_5xx: true,
        };
        let both = |now| ejection_budget([&a, &b].into_iter(), 50, now);
        assert!(a.record_failure(&cfg, 0, || both(0)));
        // `b`'s worker looked before `a` was ejected (room for one), then finds the two
        // together past the budget: it steps back.
        let looks = std::cell::Cell::new(0);
        let stale_then_real = || {
            looks.set(looks.get() + 1);
            if looks.get() == 1 {
                (0, 1)
            } else {
                both(0)
            }
        };
        assert!(!b.record_failure(&cfg, 0, stale_then_real));
        assert_eq!(looks.get(), 2);
        assert!(a.ejected(0) && !b.ejected(0));
        // Its run stays at the threshold: once `a` is back, its next failure ejects it.
        assert!(b.record_failure(&cfg, 1000, || both(1000)));
        assert!(b.ejected(1000));
    }

    /// Many threads competing for the permits of one half-open round never hold more than
    /// `half_open_max` at once.
    #[test]
    fn half_open_permits_hold_under_contention() {
        let b = Arc::new(Breaker::default());
        let cfg = breaker_cfg();
        for _ in 0..3 {
            b.record(&cfg, Admit::Allow, false, 0);
        }
        let out = Arc::new(AtomicU32::new(0));
        let over = Arc::new(AtomicU32::new(0));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (b, out, over, cfg) = (b.clone(), out.clone(), over.clone(), cfg.clone());
                std::thread::spawn(move || {
                    for _ in 0..20_000 {
                        if let a @ Admit::Probe(_) = b.admit(&cfg, 10_000, 60_000) {
                            if out.fetch_add(1, Ordering::SeqCst) >= cfg.half_open_max {
                                over.fetch_add(1, Ordering::SeqCst);
                            }
                            out.fetch_sub(1, Ordering::SeqCst);
                            b.release_probe(a);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(over.load(Ordering::SeqCst), 0);
        assert_eq!(b.state().0, BreakerState::HalfOpen);
    }

    #[test]
    fn a_failure_run_starts_afresh_after_the_breaker_was_off() {
        let b = Breaker::default();
        let cfg = breaker_cfg();
        let off = BreakerConfig {
            failure_threshold: 0,
            ..breaker_cfg()
        };
        b.record(&cfg, Admit::Allow, false, 0);
        b.record(&cfg, Admit::Allow, false, 0);
        // Turned off by a reload, then on again: the run of two is gone.
        assert_eq!(b.admit(&off, 0, 1000), Admit::Allow);
        b.record(&cfg, Admit::Allow, false, 0);
        assert_eq!(b.state().0, BreakerState::Closed);
        for _ in 0..2 {
            b.record(&cfg, Admit::Allow, false, 0);
        }
        assert_eq!(b.state().0, BreakerState::Open);
    }

    #[test]
    fn ejection_grows_and_expires() {
        let e = EndpointState::new("127.0.0.1:1".parse().unwrap(), Arc::from("a:1"), 2);
        let cfg = OutlierConfig {
            consecutive_failures: 2,
            base_ejection: Duration::from_secs(1),
            max_ejection: Duration::from_secs(3),
            max_ejection_percent: 100,
            on_5xx: true,
        };
        assert!(!e.record_failure(&cfg, 0, || (0, 1)));
        assert!(e.record_failure(&cfg, 0, || (0, 1)));
        assert!(e.ejected(500) && !e.ejected(1000));
        assert_eq!(e.back_since(999), 0, "still out");
        assert_eq!(e.back_since(1000), 1000, "back when the ejection ended");
        // Failing again 0.5 s after coming back: twice as long.
        e.record_failure(&cfg, 1500, || (0, 1));
        assert!(e.record_failure(&cfg, 1500, || (0, 1)));
        assert!(
            e.ejected(3499) && !e.ejected(3500),
            "second ejection lasts twice as long"
        );
        e.record_failure(&cfg, 3600, || (0, 1));
        assert!(e.record_failure(&cfg, 3600, || (0, 1)));
        assert!(
            e.ejected(6599) && !e.ejected(6600),
            "capped at max_ejection"
        );
        // Two base intervals back in rotation take the multiplier down by two (3 → 1).
        e.record_failure(&cfg, 8600, || (0, 1));
        assert!(e.record_failure(&cfg, 8600, || (0, 1)));
        assert!(e.ejected(10_599) && !e.ejected(10_600), "decayed to 2 s");
        // A long healthy stretch: back to the base time.
        e.record_failure(&cfg, 60_000, || (0, 1));
        assert!(e.record_failure(&cfg, 60_000, || (0, 1)));
        assert!(e.ejected(60_999) && !e.ejected(61_000), "decayed to 1 s");
        e.record_success();
        assert!(
            !e.record_failure(&cfg, 100_000, || (1, 1)),
            "the ejection budget refuses"
        );
    }

    #[test]
    fn two_workers_reaching_the_threshold_together_eject_once() {
        let e = EndpointState::new("127.0.0.1:1".parse().unwrap(), Arc::from("a:1"), 2);
        let cfg = OutlierConfig {
            consecutive_failures: 1,
            base_ejection: Duration::from_secs(1),
            max_ejection: Duration::from_secs(30),
            max_ejection_percent: 100,
            on_5xx: true,
        };
        // One worker's failure is recorded in full while the other's is between its look at
        // the ejection and its own ejection (its look at the budget).
        let other = std::cell::Cell::new(None);
        let first = e.record_failure(&cfg, 0, || {
            if other.get().is_none() {
                other.set(Some(e.record_failure(&cfg, 0, || (0, 2))));
            }
            (0, 2)
        });
        assert_eq!((other.get(), first), (Some(true), false));
        assert_eq!(e.ejections.load(Ordering::Relaxed), 1);
        assert!(
            e.ejected(999) && !e.ejected(1000),
            "the first ejection's length"
        );
    }

    #[test]
    fn connection_limit_and_bucket() {
        let e = EndpointState::new("127.0.0.1:1".parse().unwrap(), Arc::from("a:1"), 1);
        assert!(e.open_connection(2) && e.open_connection(2));
        assert!(!e.open_connection(2) && !e.has_connection_room(2));
        e.close_connection();
        assert!(e.has_connection_room(2));
        let cfg = RateLimitConfig {
            max_rps: 10,
            burst: 2,
        };
        let mut taken = 0;
        for _ in 0..10 {
            taken += usize::from(e.bucket_take(&cfg, 0));
        }
        assert_eq!(taken, 3, "the burst plus the token due now");
        assert!(!e.bucket_allows(&cfg, 0));
        // A token given back is there to take again, once.
        e.bucket_refund(&cfg, 0);
        assert!(e.bucket_take(&cfg, 0) && !e.bucket_take(&cfg, 0));
        // A full bucket stays full.
        let full = EndpointState::new("127.0.0.1:1".parse().unwrap(), Arc::from("a:1"), 1);
        full.bucket_refund(&cfg, 0);
        assert_eq!((0..10).filter(|_| full.bucket_take(&cfg, 0)).count(), 3);
        assert!(e.bucket_allows(&cfg, 200_000_000), "refilled at 10/s");
        // Spent again, then a reload to a smaller burst at a higher rate: the old debt (300
        // ms) does not outlast the new bucket's own refill (1 ms).
        let e = EndpointState::new("127.0.0.1:1".parse().unwrap(), Arc::from("a:1"), 1);
        while e.bucket_take(&cfg, 0) {}
        let faster = RateLimitConfig {
            max_rps: 1000,
            burst: 0,
        };
        assert!(!e.bucket_allows(&faster, 0) && !e.bucket_take(&faster, 0));
        assert!(e.bucket_allows(&faster, 1_000_000) && e.bucket_take(&faster, 1_000_000));
        assert!(!e.bucket_take(&faster, 1_000_000));
        assert!(e.bucket_take(&faster, 2_000_000));
    }
}
