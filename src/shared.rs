//! The cross-core cells: everything workers share, built once at start-up.
//!
//! Adding a field here is a design decision (DESIGN.md §1): each one says beside it why it must
//! cross cores and who writes it. Everything else a request touches lives in its worker.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use arc_swap::ArcSwap;
use crossbeam_utils::CachePadded;

use crate::config::Generation;
use crate::observe::access_log::{LogFile, Queue};
use crate::observe::metrics::WorkerMetrics;
use crate::upstream::state::{EndpointState, UpstreamState};

/// One upstream endpoint after name resolution.
#[derive(Debug, Clone)]
pub struct ResolvedEndpoint {
    /// Address to connect to.
    pub addr: SocketAddr,
    /// `host:port` as configured: the Host header sent upstream.
    pub authority: Arc<str>,
    /// Weight for the weighted balancer.
    pub weight: u32,
    /// Its cross-core state (health, ejection, drain, connections), kept across reloads and
    /// DNS refreshes for as long as the upstream has this address and authority.
    pub state: Arc<EndpointState>,
}

/// Equal when the address, authority and weight are (the state is not compared: a DNS refresh
/// that finds the same answers changes nothing).
impl PartialEq for ResolvedEndpoint {
    fn eq(&self, other: &Self) -> bool {
        self.addr == other.addr && self.authority == other.authority && self.weight == other.weight
    }
}

impl Eq for ResolvedEndpoint {}

/// Hands out cross-core upstream state for a generation being built: the state of the same
/// upstream (by name) and endpoint (by address and authority) in `previous` when there is one,
/// new state otherwise. Breakers, ejections, drains and health survive reloads and DNS changes.
#[derive(Debug)]
pub struct StateBook<'a> {
    previous: Option<&'a Published>,
    workers: usize,
}

impl<'a> StateBook<'a> {
    /// A book that reuses `previous`'s state, for `workers` workers.
    pub fn new(previous: Option<&'a Published>, workers: usize) -> Self {
        StateBook { previous, workers }
    }

    fn previous_index(&self, upstream: &str) -> Option<(&'a Published, usize)> {
        let p = self.previous?;
        let i = p.gen.upstreams.iter().position(|u| u.name == upstream)?;
        Some((p, i))
    }

    /// The state of upstream `name`.
    pub fn upstream(&self, name: &str) -> Arc<UpstreamState> {
        self.previous_index(name)
            .and_then(|(p, i)| p.upstreams.get(i).cloned())
            .unwrap_or_else(|| Arc::new(UpstreamState::new(name, self.workers)))
    }

    /// The state of endpoint `addr` (`authority`) of upstream `upstream`. A new one of an
    /// upstream with active health checks (`checked`) starts out of rotation until its first
    /// check passes (at start, on a reload that adds it, when DNS adds its address): no
    /// request goes to an endpoint nothing has vouched for, while others have been.
    pub fn endpoint(
        &self,
        upstream: &str,
        addr: SocketAddr,
        authority: &Arc<str>,
        checked: bool,
    ) -> Arc<EndpointState> {
        self.previous_index(upstream)
            .and_then(|(p, i)| {
                p.endpoints
                    .get(i)?
                    .iter()
                    .find(|e| e.addr == addr && e.authority == *authority)
                    .map(|e| e.state.clone())
            })
            .unwrap_or_else(|| {
                let state = EndpointState::new(addr, authority.clone(), self.workers);
                if checked {
                    state
                        .healthy
                        .store(false, std::sync::atomic::Ordering::Relaxed);
                }
                // A name drained as a whole (every address it had) stays drained for the
                // addresses DNS adds to it later.
                if self.name_drained(upstream, authority) {
                    state
                        .drained
                        .store(true, std::sync::atomic::Ordering::Relaxed);
                }
                Arc::new(state)
            })
    }

    /// Whether `previous` had addresses for `authority` in `upstream`, all drained.
    fn name_drained(&self, upstream: &str, authority: &Arc<str>) -> bool {
        let Some((p, i)) = self.previous_index(upstream) else {
            return false;
        };
        let mut same_name = p
            .endpoints
            .get(i)
            .into_iter()
            .flatten()
            .filter(|e| e.authority == *authority)
            .peekable();
        same_name.peek().is_some()
            && same_name.all(|e| e.state.drained.load(std::sync::atomic::Ordering::Relaxed))
    }
}

/// Resolved endpoints, per upstream (same order as the generation's upstream list).
pub type EndpointTable = Vec<Vec<ResolvedEndpoint>>;

/// What the control thread publishes for workers: a generation and its resolved endpoints.
#[derive(Debug)]
pub struct Published {
    /// Generation number: 1 at start, +1 per successful reload.
    pub number: u64,
    /// The compiled configuration.
    pub gen: Arc<Generation>,
    /// Its upstreams' endpoints.
    pub endpoints: Arc<EndpointTable>,
    /// Its upstreams' cross-core state (same order as the generation's upstream list).
    pub upstreams: Vec<Arc<UpstreamState>>,
    /// The access log file, opened by the control thread for this generation (`None`: no
    /// access log). A reload opens it again; a DNS refresh keeps it.
    pub access_log: Option<Arc<LogFile>>,
}

impl Published {
    /// Publishable data for generation `number` of `gen` with resolved `endpoints`; upstream
    /// state comes from `book`.
    pub fn new(
        number: u64,
        gen: Arc<Generation>,
        endpoints: EndpointTable,
        book: &StateBook<'_>,
    ) -> Self {
        let upstreams = gen
            .upstreams
            .iter()
            .map(|u| book.upstream(&u.name))
            .collect();
        Published {
            number,
            gen,
            endpoints: Arc::new(endpoints),
            upstreams,
            access_log: None,
        }
    }

    /// The same, logging requests to `file`.
    pub fn with_access_log(mut self, file: Option<Arc<LogFile>>) -> Self {
        self.access_log = file;
        self
    }
}

/// The gateway-wide concurrency cap: one in-flight counter shared by every worker.
#[derive(Debug, Default)]
pub struct Admission {
    in_flight: CachePadded<AtomicU32>,
}

impl Admission {
    /// Takes a slot while fewer than `limit` are in flight (compare-and-swap, so the cap is
    /// exact across cores). The slot is returned by [`Admission::release`].
    pub fn try_acquire(&self, limit: u32) -> bool {
        let mut cur = self.in_flight.load(Ordering::Relaxed);
        loop {
            if cur >= limit {
                return false;
            }
            match self.in_flight.compare_exchange_weak(
                cur,
                cur + 1,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(now) => cur = now,
            }
        }
    }

    /// Returns a slot.
    pub fn release(&self) {
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
    }

    /// Slots in use.
    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Relaxed)
    }
}

/// Which monoio driver the workers run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DriverKind {
    /// io_uring.
    IoUring,
    /// The epoll fallback (old kernel, seccomp, or `MONOIO_FORCE_LEGACY_DRIVER=1`).
    Epoll,
}

impl DriverKind {
    /// `io_uring` or `epoll`.
    pub fn name(self) -> &'static str {
        match self {
            DriverKind::IoUring => "io_uring",
            DriverKind::Epoll => "epoll",
        }
    }
}

/// The shared cells.
#[derive(Debug)]
pub struct Shared {
    /// Set once by the control thread when graceful shutdown begins. Workers copy it into their
    /// own state on each tick: it must reach every core, and nothing else can tell them.
    pub draining: CachePadded<AtomicBool>,
    /// Bumped by the control thread after it stores a new `published` (a reload, or DNS answers
    /// that changed); workers compare it on their tick. Config must reach every core, and only
    /// the control thread reads files and resolves names.
    pub version: CachePadded<AtomicU64>,
    /// The generation in force, published by the control thread.
    pub published: ArcSwap<Published>,
    /// Reloads applied / refused, counted by the control thread for `/metrics` on any worker.
    pub reloads_ok: CachePadded<AtomicU64>,
    /// See `reloads_ok`.
    pub reloads_failed: CachePadded<AtomicU64>,
    /// A worker freed enough memory for the system allocator's free pages to be worth giving
    /// back: the control thread does it (`malloc_trim` can take milliseconds: not on a
    /// worker's loop).
    pub trim_wanted: AtomicBool,
    /// Per-worker metric shards: worker `i` is the only writer of `metrics[i]`; a `/metrics`
    /// scrape on any worker sums them all, so every shard must be readable from every core.
    pub metrics: Box<[CachePadded<WorkerMetrics>]>,
    /// Workers that have finished starting (for start-up errors and tests).
    pub workers_ready: CachePadded<AtomicU64>,
    /// The driver workers run on, decided once at start.
    pub driver: DriverKind,
    /// `gateway.max_concurrent_requests`: the cap is gateway-wide, so its counter crosses
    /// cores (DESIGN.md §5).
    pub admission: Admission,
    /// The time origin of the millisecond clocks in upstream state (ejections, breaker).
    pub epoch: Instant,
    /// Number of workers (the size of every per-worker shard).
    pub workers: usize,
    /// The access log writer's queue (`None` in tests that start no writer).
    pub access_log: Option<Queue>,
}

impl Shared {
    /// Cells for `workers` workers, starting with generation 1.
    pub fn new(
        workers: usize,
        published: Published,
        driver: DriverKind,
        access_log: Option<Queue>,
    ) -> Self {
        Shared {
            draining: CachePadded::new(AtomicBool::new(false)),
            version: CachePadded::new(AtomicU64::new(0)),
            published: ArcSwap::from_pointee(published),
            reloads_ok: CachePadded::new(AtomicU64::new(0)),
            trim_wanted: AtomicBool::new(false),
            reloads_failed: CachePadded::new(AtomicU64::new(0)),
            metrics: (0..workers)
                .map(|_| CachePadded::new(WorkerMetrics::default()))
                .collect(),
            workers_ready: CachePadded::new(AtomicU64::new(0)),
            driver,
            admission: Admission::default(),
            epoch: Instant::now(),
            workers,
            access_log,
        }
    }

    /// Milliseconds from `epoch` to `now`.
    pub fn millis(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.epoch).as_millis() as u64
    }

    /// Whether graceful shutdown has begun.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// Publishes a generation (control thread only).
    pub fn publish(&self, published: Published) {
        self.published.store(Arc::new(published));
        self.version.fetch_add(1, Ordering::Release);
    }

    /// Publishes `published` in place of `current`, unless another was published since
    /// `current` was loaded; whether it was.
    pub fn publish_over(&self, current: &Arc<Published>, published: Published) -> bool {
        let prev = self
            .published
            .compare_and_swap(current, Arc::new(published));
        if !Arc::ptr_eq(&prev, current) {
            return false;
        }
        self.version.fetch_add(1, Ordering::Release);
        true
    }

    /// The number of the generation in force.
    pub fn generation(&self) -> u64 {
        self.published.load().number
    }
}
