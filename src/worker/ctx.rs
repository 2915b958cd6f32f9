//! `Worker`: everything one worker owns, shared by its tasks through an `Rc`.
//!
//! Ownership: one per worker thread, never `Send`. Fields in `Cell`/`RefCell` are only borrowed
//! for the span of a synchronous call, never across an `.await`.

use std::cell::{Cell, RefCell};
use std::io::Write;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use super::event::Event;
use crate::buf::BufPool;
use crate::config::Generation;
use crate::observe::metrics::WorkerMetrics;
use crate::observe::request_id::RequestIds;
use crate::shared::Shared;
use crate::upstream::UpstreamRt;

/// Slack added to `max_head_bytes` for a block: the rewritten request head carries a few
/// more fields (X-Forwarded-For, X-Real-IP, X-Request-Id) than the one received.
pub const HEAD_SLACK_BYTES: usize = 4096;

/// Size of the blocks that relay bodies. Larger reads and writes cut the per-operation cost of
/// big transfers (measured on loopback, 1 MiB responses through io_uring: 20 KiB blocks cost
/// 2.5x the CPU of 64 KiB ones); a connection holds one only while a body is in flight.
pub const BODY_BLOCK_BYTES: usize = 64 * 1024;

/// Length of an IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`).
const DATE_LEN: usize = 29;

/// See the module docs.
#[derive(Debug)]
pub struct Worker {
    /// Worker index (0-based).
    pub id: usize,
    /// Cross-core cells.
    pub shared: Arc<Shared>,
    /// The configuration in force.
    pub gen: Arc<Generation>,
    /// Blocks for heads and small exchanges (`max_head_bytes` plus slack).
    pub pool: BufPool,
    /// Blocks for relaying bodies ([`BODY_BLOCK_BYTES`]).
    pub body_pool: BufPool,
    /// Upstreams, in the generation's order.
    pub upstreams: Vec<UpstreamRt>,
    /// Request id generator.
    pub ids: RequestIds,
    /// Fired once when shutdown begins.
    pub shutdown: Event,
    /// Fired when a connection closes while the worker is at its connection cap.
    pub slots: Event,
    draining: Cell<bool>,
    active: Cell<usize>,
    clock: Cell<Instant>,
    endpoints_version: Cell<u64>,
    date: RefCell<(u64, [u8; DATE_LEN])>,
}

impl Worker {
    /// A worker's state for generation `gen`.
    pub fn new(id: usize, shared: Arc<Shared>, gen: Arc<Generation>) -> Self {
        let block = (gen.http.limits.max_head_bytes + HEAD_SLACK_BYTES).next_multiple_of(4096);
        let table = shared.endpoints.load();
        let upstreams = gen
            .upstreams
            .iter()
            .enumerate()
            .map(|(i, cfg)| {
                UpstreamRt::new(cfg, table.get(i).map(Vec::as_slice).unwrap_or(&[]), id)
            })
            .collect();
        let w = Worker {
            id,
            endpoints_version: Cell::new(shared.endpoints_version.load(Ordering::Acquire)),
            shared,
            gen,
            pool: BufPool::new(block.max(16 * 1024)),
            body_pool: BufPool::new(BODY_BLOCK_BYTES),
            upstreams,
            ids: RequestIds::new(id),
            shutdown: Event::default(),
            slots: Event::default(),
            draining: Cell::new(false),
            active: Cell::new(0),
            clock: Cell::new(Instant::now()),
            date: RefCell::new((0, [0; DATE_LEN])),
        };
        w.refresh_date();
        w
    }

    /// A body block in place of `buf` when `buf` is empty and smaller: called before reading
    /// the next piece of a body.
    pub fn body_block(&self, buf: &mut crate::buf::Block) {
        if buf.is_empty() && buf.capacity() < BODY_BLOCK_BYTES {
            *buf = self.body_pool.take();
        }
    }

    /// A head block in place of `buf` when `buf` is an empty body block: a connection waiting
    /// for its next request holds no more than a head's worth of memory.
    pub fn head_block(&self, buf: &mut crate::buf::Block) {
        if buf.is_empty() && buf.capacity() != self.pool.block_size() {
            *buf = self.pool.take();
        }
    }

    /// The worker's coarse clock, refreshed every tick: what deadlines are computed from, so
    /// the request path never reads the system clock (timeouts are accurate to a tick).
    pub fn now(&self) -> Instant {
        self.clock.get()
    }

    /// This worker's metric shard.
    pub fn metrics(&self) -> &WorkerMetrics {
        &self.shared.metrics[self.id]
    }

    /// Whether shutdown has begun (as of the last tick).
    pub fn draining(&self) -> bool {
        self.draining.get()
    }

    /// Open client connections.
    pub fn active_connections(&self) -> usize {
        self.active.get()
    }

    /// Whether the worker is at its connection cap.
    pub fn at_capacity(&self) -> bool {
        self.active.get() >= self.gen.http.max_connections
    }

    pub(crate) fn connection_opened(&self) {
        self.active.set(self.active.get() + 1);
        crate::observe::metrics::add(&self.metrics().connections_accepted, 1);
    }

    pub(crate) fn connection_closed(&self) {
        let was_full = self.at_capacity();
        self.active.set(self.active.get().saturating_sub(1));
        crate::observe::metrics::add(&self.metrics().connections_closed, 1);
        if was_full {
            self.slots.notify_all();
        }
    }

    /// The current Date header value.
    pub fn date(&self) -> [u8; DATE_LEN] {
        self.date.borrow().1
    }

    fn refresh_date(&self) {
        let now = SystemTime::now();
        let secs = now
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let mut date = self.date.borrow_mut();
        if date.0 != secs {
            let mut text = [0u8; DATE_LEN];
            let mut cursor = &mut text[..];
            let _ = write!(cursor, "{}", httpdate::HttpDate::from(now));
            *date = (secs, text);
        }
    }

    /// Periodic housekeeping: clock, shutdown flag, DNS updates, idle pool reaping.
    pub fn tick(&self) {
        self.clock.set(Instant::now());
        self.refresh_date();
        let version = self.shared.endpoints_version.load(Ordering::Acquire);
        if version != self.endpoints_version.get() {
            self.endpoints_version.set(version);
            let table = self.shared.endpoints.load();
            for (i, up) in self.upstreams.iter().enumerate() {
                if let Some(eps) = table.get(i) {
                    up.set_endpoints(eps);
                }
            }
        }
        let now = self.now();
        for up in &self.upstreams {
            up.reap(now);
        }
        if self.shared.is_draining() && !self.draining.get() {
            self.draining.set(true);
            for up in &self.upstreams {
                up.clear_idle();
            }
            self.shutdown.notify_all();
        }
    }
}
