//! The cross-core cells: everything workers share, built once at start-up.
//!
//! Adding a field here is a design decision (DESIGN.md §1): each one says beside it why it must
//! cross cores and who writes it. Everything else a request touches lives in its worker.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use crossbeam_utils::CachePadded;

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
    /// Bumped by the control thread after it stores a changed `endpoints` table; workers compare
    /// it on their tick and rebuild their endpoint lists (DNS answers are found off-core).
    pub endpoints_version: CachePadded<AtomicU64>,
    /// The latest resolved endpoints, published by the control thread.
    pub endpoints: ArcSwap<EndpointTable>,
    /// Per-worker metric shards: worker `i` is the only writer of `metrics[i]`; a `/metrics`
    /// scrape on any worker sums them all, so every shard must be readable from every core.
    pub metrics: Box<[CachePadded<WorkerMetrics>]>,
    /// Workers that have finished starting (for start-up errors and tests).
    pub workers_ready: CachePadded<AtomicU64>,
    /// The driver workers run on, decided once at start.
    pub driver: DriverKind,
}

impl Shared {
    /// Cells for `workers` workers, with the endpoints resolved at start.
    pub fn new(workers: usize, endpoints: EndpointTable, driver: DriverKind) -> Self {
        Shared {
            draining: CachePadded::new(AtomicBool::new(false)),
            endpoints_version: CachePadded::new(AtomicU64::new(0)),
            endpoints: ArcSwap::from_pointee(endpoints),
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

    /// Publishes a new endpoint table (control thread only).
    pub fn publish_endpoints(&self, table: EndpointTable) {
        self.endpoints.store(Arc::new(table));
        self.endpoints_version.fetch_add(1, Ordering::Release);
    }
}
