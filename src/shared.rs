//! The cross-core cells: everything workers share, built once at start-up.
//!
//! Adding a field here is a design decision (DESIGN.md §1): each one says beside it why it must
//! cross cores and who writes it. Everything else a request touches lives in its worker.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use crossbeam_utils::CachePadded;

use crate::config::Generation;
use crate::observe::metrics::WorkerMetrics;

/// One upstream endpoint after name resolution.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedEndpoint {
    /// Address to connect to.
    pub addr: SocketAddr,
    /// `host:port` as configured: the Host header sent upstream.
    pub authority: Arc<str>,
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
    /// Per-worker metric shards: worker `i` is the only writer of `metrics[i]`; a `/metrics`
    /// scrape on any worker sums them all, so every shard must be readable from every core.
    pub metrics: Box<[CachePadded<WorkerMetrics>]>,
    /// Workers that have finished starting (for start-up errors and tests).
    pub workers_ready: CachePadded<AtomicU64>,
    /// The driver workers run on, decided once at start.
    pub driver: DriverKind,
}

impl Shared {
    /// Cells for `workers` workers, starting with generation 1.
    pub fn new(
        workers: usize,
        gen: Arc<Generation>,
        endpoints: EndpointTable,
        driver: DriverKind,
    ) -> Self {
        Shared {
            draining: CachePadded::new(AtomicBool::new(false)),
            version: CachePadded::new(AtomicU64::new(0)),
            published: ArcSwap::from_pointee(Published {
                number: 1,
                gen,
                endpoints: Arc::new(endpoints),
            }),
            reloads_ok: CachePadded::new(AtomicU64::new(0)),
            reloads_failed: CachePadded::new(AtomicU64::new(0)),
            metrics: (0..workers)
                .map(|_| CachePadded::new(WorkerMetrics::default()))
                .collect(),
            workers_ready: CachePadded::new(AtomicU64::new(0)),
            driver,
        }
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

    /// The number of the generation in force.
    pub fn generation(&self) -> u64 {
        self.published.load().number
    }
}
