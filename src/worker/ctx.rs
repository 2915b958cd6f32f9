//! `Worker`: everything one worker owns, shared by its tasks through an `Rc`; and `CoreGen`, the
//! worker's view of one config generation.
//!
//! Ownership: one per worker thread, never `Send`. Fields in `Cell`/`RefCell` are only borrowed
//! for the span of a synchronous call, never across an `.await`.
//!
//! Generations: the control thread publishes a new generation in `Shared`; the worker picks it
//! up on its tick and builds a new `CoreGen` (upstream state carried over for endpoints that
//! stay). Each request takes an `Rc<CoreGen>` at its start and finishes on it, so in-flight
//! requests keep their generation while the next request on a keep-alive connection sees the
//! new one. An old `CoreGen` is freed when its last request ends.

use std::cell::{Cell, RefCell};
use std::io::Write;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use super::event::Event;
use crate::buf::{Block, BufPool};
use crate::config::Generation;
use crate::observe::access_log::{AccessLog, Pending, Request, Tally};
use crate::observe::metrics::{add, WorkerMetrics};
use crate::observe::request_id::RequestIds;
use crate::proxy::gone::CloseWatcher;
use crate::route::{Action, PathRewrite, RewriteScratch};
use crate::shared::{Published, Shared};
use crate::tls::TlsListener;
use crate::upstream::{UpConn, UpstreamRt, UpstreamState};

/// Slack added to `max_head_bytes` for a block: the rewritten request head carries a few
/// more fields (X-Forwarded-For, X-Real-IP, X-Request-Id) than the one received.
pub const HEAD_SLACK_BYTES: usize = 4096;

/// Size of the blocks that relay bodies. Larger reads and writes cut the per-operation cost of
/// big transfers (measured on loopback, 1 MiB responses through io_uring: 20 KiB blocks cost
/// 2.5x the CPU of 64 KiB ones); a connection holds one only while a body is in flight.
pub const BODY_BLOCK_BYTES: usize = 64 * 1024;

/// Bytes of blocks a pool trim frees, at least, for the allocator to be asked to give its free
/// memory back to the system (see `control::release_free_memory`).
const RELEASE_AFTER_BYTES: usize = 1024 * 1024;

/// The wall clock as the Date header can show it: httpdate panics before 1970 and from the
/// year 10000 on, and a clock stepped there (a bad manual `date`, a VM restored wrong) must
/// not end every worker on its next tick. Outside that range the nearest end is shown.
fn date_clock(now: SystemTime) -> SystemTime {
    // 9999-12-31T23:59:59Z.
    const LAST: Duration = Duration::from_secs(253_402_300_799);
    let last = SystemTime::UNIX_EPOCH + LAST;
    if now < SystemTime::UNIX_EPOCH {
        SystemTime::UNIX_EPOCH
    } else if now > last {
        last
    } else {
        now
    }
}

/// Length of an IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`).
const DATE_LEN: usize = 29;

/// A socket to start accepting on: the socket, its configured address, its TLS settings.
pub type NewListener = (std::net::TcpListener, SocketAddr, Option<Arc<TlsListener>>);

/// What the control thread asks of a worker besides a new generation.
#[derive(Debug)]
pub enum WorkerCommand {
    /// Start accepting on this socket (a listener added by a reload), configured as this
    /// address, with these TLS settings (the reload's: the worker may not have installed
    /// that generation yet).
    Listen(std::net::TcpListener, SocketAddr, Option<Arc<TlsListener>>),
    /// Stop accepting on this address (a listener removed by a reload); its connections finish.
    Unlisten(SocketAddr),
}

/// Per-request scratch space of one generation (route lookup, rewrites), reused so the
/// request path does not allocate.
#[derive(Debug)]
pub struct Scratch {
    /// Route lookup storage.
    pub route: crate::route::Scratch,
    /// The rewritten path of the request being forwarded, or a redirect's Location.
    pub text: Vec<u8>,
    /// Capture storage of each route's regex rewrite (by route index).
    pub captures: Vec<Option<RewriteScratch>>,
}

/// A worker's view of one generation.
#[derive(Debug)]
pub struct CoreGen {
    /// Generation number.
    pub number: u64,
    /// The configuration.
    pub gen: Arc<Generation>,
    /// Upstreams, in the generation's order.
    pub upstreams: Vec<UpstreamRt>,
    /// Scratch space (borrowed only within synchronous code).
    pub scratch: RefCell<Scratch>,
}

impl CoreGen {
    fn new(published: &Published, worker: usize, previous: Option<&CoreGen>) -> CoreGen {
        let gen = published.gen.clone();
        let upstreams = gen
            .upstreams
            .iter()
            .enumerate()
            .map(|(i, cfg)| {
                let eps = published.endpoints.get(i).map(Vec::as_slice).unwrap_or(&[]);
                let state = published.upstreams.get(i).cloned().unwrap_or_else(|| {
                    // invariant: `Published::new` builds one state per upstream.
                    Arc::new(UpstreamState::new(&cfg.name, 1))
                });
                let prev = previous.and_then(|p| {
                    let j = p.gen.upstreams.iter().position(|u| u.name == cfg.name)?;
                    p.upstreams.get(j)
                });
                UpstreamRt::new(cfg, state, eps, worker, prev)
            })
            .collect();
        let captures = gen
            .routes
            .routes()
            .iter()
            .map(|r| match &r.action {
                Action::Proxy(p) => match &p.rewrite {
                    PathRewrite::Regex(rw) => Some(rw.scratch()),
                    _ => None,
                },
                _ => None,
            })
            .collect();
        CoreGen {
            number: published.number,
            scratch: RefCell::new(Scratch {
                route: gen.routes.scratch(),
                text: Vec::with_capacity(256),
                captures,
            }),
            gen,
            upstreams,
        }
    }
}

/// One listening socket's accept loop, as the worker tracks it.
#[derive(Debug)]
pub struct ListenerSlot {
    /// The bound address.
    pub addr: SocketAddr,
    /// The address as configured (its key in the generation's listener list).
    pub configured: SocketAddr,
    /// Fired to stop the accept loop.
    pub stop: Event,
    stopped: Cell<bool>,
    /// Fired when the connections accepted before retire (see `epoch`): idle ones close.
    retire: Event,
    /// The listener's TLS settings when its loop started: what the connections it still
    /// takes after a reload removed it are served with.
    tls: Option<Arc<TlsListener>>,
    /// What a connection is served with for its life, as the generation in force sets it:
    /// TLS or not, and `strict_sni`.
    terms: Cell<(bool, bool)>,
    /// Moves on when those change or the listener is removed: the connections accepted
    /// before (see [`Self::admitted`]) wind down: HTTP/1.1 ones close after the exchange in
    /// progress, HTTP/2 ones get a GOAWAY.
    epoch: Cell<u32>,
}

/// A connection's listener and the [`ListenerSlot::epoch`] it was accepted in.
#[derive(Debug, Clone)]
pub struct Admitted(Rc<ListenerSlot>, u32);

impl Admitted {
    /// Whether the listener's terms changed since, or it was removed (also for connections
    /// it still takes from its queue after that).
    pub fn retired(&self) -> bool {
        self.0.stopped.get() || self.0.epoch.get() != self.1
    }

    /// Fired when the listener's connections retire (a reload removed it, changed its terms,
    /// or shutdown began: every listener stops then).
    pub fn retire_event(&self) -> &Event {
        &self.0.retire
    }
}

impl ListenerSlot {
    /// A slot for `addr`, configured as `configured` with `tls`.
    pub fn new(addr: SocketAddr, configured: SocketAddr, tls: Option<Arc<TlsListener>>) -> Self {
        let terms = Self::terms_of(tls.as_ref());
        ListenerSlot {
            addr,
            configured,
            stop: Event::default(),
            stopped: Cell::new(false),
            retire: Event::default(),
            tls,
            terms: Cell::new(terms),
            epoch: Cell::new(0),
        }
    }

    fn terms_of(tls: Option<&Arc<TlsListener>>) -> (bool, bool) {
        (tls.is_some(), tls.is_some_and(|t| t.strict_sni))
    }

    /// A connection accepted now, in the current epoch.
    pub fn admitted(self: &Rc<Self>) -> Admitted {
        Admitted(self.clone(), self.epoch.get())
    }

    /// Takes the terms of `gen` (installed now): a change retires the connections before.
    fn follow(&self, gen: &Generation) {
        let Some(l) = gen.listener(self.configured) else {
            return; // removed: its `stop` retires them
        };
        let terms = Self::terms_of(l.tls.as_ref());
        if terms != self.terms.replace(terms) {
            self.epoch.set(self.epoch.get().wrapping_add(1));
            self.retire.notify_all();
        }
    }

    /// The TLS settings for a connection accepted now: the listener's in `gen` (a reload may
    /// change certificates), or those it started with when `gen` no longer has it.
    pub fn tls_in(&self, gen: &Generation) -> Option<Arc<TlsListener>> {
        match gen.listener(self.configured) {
            Some(l) => l.tls.clone(),
            None => self.tls.clone(),
        }
    }

    /// Whether the accept loop was told to stop.
    pub fn stopped(&self) -> bool {
        self.stopped.get()
    }

    fn stop(&self) {
        self.stopped.set(true);
        self.epoch.set(self.epoch.get().wrapping_add(1));
        self.stop.notify_all();
        self.retire.notify_all();
    }
}

/// See the module docs.
#[derive(Debug)]
pub struct Worker {
    /// Worker index (0-based).
    pub id: usize,
    /// Cross-core cells.
    pub shared: Arc<Shared>,
    /// Blocks for heads and small exchanges (`max_head_bytes` at start, plus slack).
    pub pool: BufPool,
    /// Blocks for relaying bodies ([`BODY_BLOCK_BYTES`]).
    pub body_pool: BufPool,
    /// Request id generator.
    pub ids: RequestIds,
    /// Fired once when shutdown begins.
    pub shutdown: Event,
    /// Fired when a connection closes while the worker is at its connection cap.
    pub slots: Event,
    /// Client sockets whose requests await a response head, checked for a close each tick.
    pub closes: CloseWatcher,
    current: RefCell<Rc<CoreGen>>,
    seen_version: Cell<u64>,
    listeners: RefCell<Vec<Rc<ListenerSlot>>>,
    commands: Receiver<WorkerCommand>,
    draining: Cell<bool>,
    active: Cell<usize>,
    clock: Cell<Instant>,
    /// `clock` in milliseconds since the server's epoch, worked out once per tick.
    clock_ms: Cell<u64>,
    ticks: Cell<u64>,
    /// The second it was written, its text, and the same as an HTTP/2 field value (shared by
    /// every HTTP/2 response of the second: a reference count, not a copy and an allocation).
    /// The field value is made on first use in the second, so that a worker serving only
    /// HTTP/1.1 allocates nothing for it.
    date: RefCell<(u64, [u8; DATE_LEN], Option<http::HeaderValue>)>,
    access_log: RefCell<AccessLog>,
    /// `access_log.is_on()`, read once per request.
    logs_requests: Cell<bool>,
}

impl Worker {
    /// A worker's state, on the generation in force.
    pub fn new(id: usize, shared: Arc<Shared>, commands: Receiver<WorkerCommand>) -> Self {
        let seen = shared.version.load(Ordering::Acquire);
        let published = shared.published.load_full();
        let block =
            (published.gen.http.limits.max_head_bytes + HEAD_SLACK_BYTES).next_multiple_of(4096);
        let w = Worker {
            id,
            pool: BufPool::new(block.max(16 * 1024)),
            body_pool: BufPool::new(BODY_BLOCK_BYTES),
            ids: RequestIds::new(id),
            shutdown: Event::default(),
            slots: Event::default(),
            closes: CloseWatcher::default(),
            current: RefCell::new(Rc::new(CoreGen::new(&published, id, None))),
            seen_version: Cell::new(seen),
            listeners: RefCell::new(Vec::new()),
            commands,
            draining: Cell::new(false),
            active: Cell::new(0),
            clock: Cell::new(Instant::now()),
            clock_ms: Cell::new(0),
            ticks: Cell::new(0),
            // (No second matches: the first refresh always formats.)
            date: RefCell::new((u64::MAX, [0; DATE_LEN], None)),
            access_log: RefCell::new(AccessLog::new(shared.access_log.clone())),
            logs_requests: Cell::new(false),
            shared,
        };
        w.install_access_log(&published);
        w.set_clock(w.clock.get());
        w.refresh_date();
        w.pool.set_idle_bytes(published.gen.http.buffer_pool_bytes);
        w.body_pool
            .set_idle_bytes(published.gen.http.buffer_pool_bytes);
        w.metrics()
            .generation
            .store(published.number, Ordering::Relaxed);
        w
    }

    /// The generation in force (each request takes one at its start).
    pub fn current(&self) -> Rc<CoreGen> {
        self.current.borrow().clone()
    }

    /// The configuration in force.
    pub fn gen(&self) -> Arc<Generation> {
        self.current.borrow().gen.clone()
    }

    /// This worker's metric shard.
    pub fn metrics(&self) -> &WorkerMetrics {
        &self.shared.metrics[self.id]
    }

    /// Whether shutdown has begun (as of the last tick).
    pub fn draining(&self) -> bool {
        self.draining.get()
    }

    /// Ticks run so far: one every [`TICK`](super::TICK) while the worker's loop gets its turn.
    pub fn ticks(&self) -> u64 {
        self.ticks.get()
    }

    /// Open client connections.
    pub fn active_connections(&self) -> usize {
        self.active.get()
    }

    /// Whether the worker is at its connection cap.
    pub fn at_capacity(&self) -> bool {
        self.active.get() >= self.current.borrow().gen.http.max_connections
    }

    /// The worker's coarse clock, refreshed every tick: what deadlines are computed from, so
    /// the request path never reads the system clock (timeouts are accurate to a tick).
    pub fn now(&self) -> Instant {
        self.clock.get()
    }

    /// The coarse clock in milliseconds since the server's epoch (ejections, breaker).
    pub fn now_ms(&self) -> u64 {
        self.clock_ms.get()
    }

    /// Sets the coarse clock, both its forms.
    fn set_clock(&self, now: Instant) {
        self.clock.set(now);
        self.clock_ms.set(self.shared.millis(now));
    }

    /// Tracks a new accept loop.
    pub fn add_listener(
        &self,
        addr: SocketAddr,
        configured: SocketAddr,
        tls: Option<Arc<TlsListener>>,
    ) -> Rc<ListenerSlot> {
        let slot = Rc::new(ListenerSlot::new(addr, configured, tls));
        self.listeners.borrow_mut().push(slot.clone());
        slot
    }

    pub(crate) fn connection_opened(&self) {
        self.active.set(self.active.get() + 1);
        add(&self.metrics().connections_accepted, 1);
    }

    pub(crate) fn connection_closed(&self) {
        let was_full = self.at_capacity();
        self.active.set(self.active.get().saturating_sub(1));
        add(&self.metrics().connections_closed, 1);
        if was_full {
            self.slots.notify_all();
        }
    }

    /// Returns an upstream connection of generation `cg`'s upstream `index` to the pool in
    /// force: the current generation's upstream of the same name when `cg` was replaced.
    /// Stamped with the system clock: reuse within `upstream::UNCHECKED_IDLE` is measured.
    pub fn release_upstream(&self, cg: &Rc<CoreGen>, index: usize, conn: UpConn) {
        let now = Instant::now();
        let current = self.current();
        if Rc::ptr_eq(cg, &current) {
            if let Some(up) = cg.upstreams.get(index) {
                up.release(conn, now);
            }
            return;
        }
        let Some(old) = cg.gen.upstreams.get(index) else {
            return;
        };
        // A connection made under other settings (protocol, TLS: a rotated client
        // certificate, a new CA, verification turned on) closes instead.
        if let Some(j) = current
            .gen
            .upstreams
            .iter()
            .position(|u| u.name == old.name)
        {
            if crate::upstream::same_connections(old, &current.gen.upstreams[j]) {
                current.upstreams[j].release(conn, now);
            }
        }
    }

    /// Counts a request finished on generation `cg` (old generations are counted apart).
    pub fn request_done(&self, cg: &CoreGen) {
        if cg.number != self.current.borrow().number {
            add(&self.metrics().requests_previous_generation, 1);
        }
    }

    /// A body block in place of `buf` when `buf` is empty and smaller: called before reading
    /// the next piece of a body.
    pub fn body_block(&self, buf: &mut Block) {
        if buf.is_empty() && buf.capacity() < BODY_BLOCK_BYTES {
            *buf = self.body_pool.take();
        }
    }

    /// A head block in place of `buf` when `buf` is an empty body block: a connection waiting
    /// for its next request holds no more than a head's worth of memory.
    pub fn head_block(&self, buf: &mut Block) {
        if buf.is_empty() && buf.capacity() != self.pool.block_size() {
            *buf = self.pool.take();
        }
    }

    /// The current Date header value.
    pub fn date(&self) -> [u8; DATE_LEN] {
        self.date.borrow().1
    }

    /// The current Date header value, as an HTTP/2 field value. (An IMF-fixdate is visible
    /// ASCII, always a valid value; were it not, a response would go without a Date rather
    /// than with an empty one.)
    pub fn date_value(&self) -> Option<http::HeaderValue> {
        let mut date = self.date.borrow_mut();
        let (_, text, value) = &mut *date;
        if value.is_none() {
            *value = http::HeaderValue::from_bytes(&text[..]).ok();
        }
        value.clone()
    }

    fn refresh_date(&self) {
        let now = date_clock(SystemTime::now());
        let secs = now
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let mut date = self.date.borrow_mut();
        if date.0 != secs {
            let mut text = [0u8; DATE_LEN];
            let mut cursor = &mut text[..];
            let _ = write!(cursor, "{}", httpdate::HttpDate::from(now));
            *date = (secs, text, None);
        }
    }

    /// Whether requests are logged (the access log of the generation in force).
    pub fn logs_requests(&self) -> bool {
        self.logs_requests.get()
    }

    /// Starts the access log line of a request whose head was just parsed (see
    /// [`Worker::logs_requests`]).
    pub fn log_begin(&self, req: &Request<'_>) -> Pending {
        self.access_log.borrow_mut().begin(req, Instant::now())
    }

    /// Adds the finished line: the response went out with `status` (0: none) and
    /// `bytes_sent` bytes.
    pub fn log_finish(&self, line: Pending, status: u16, bytes_sent: u64) {
        let tally = self
            .access_log
            .borrow_mut()
            .finish(line, status, bytes_sent, Instant::now());
        self.count_log(tally);
    }

    /// Hands the access log's gathered lines to its writer (the worker is stopping).
    pub fn flush_access_log(&self) {
        let tally = self.access_log.borrow_mut().flush_last();
        self.count_log(tally);
    }

    fn install_access_log(&self, published: &Published) {
        let cfg = published.gen.access_log.as_ref();
        let mut log = self.access_log.borrow_mut();
        let tally = log.install(
            published.access_log.clone().filter(|_| cfg.is_some()),
            cfg.map_or(0, |c| c.buffer_bytes),
            cfg.map_or(Duration::from_secs(1), |c| c.flush_interval),
        );
        self.logs_requests.set(log.is_on());
        drop(log);
        self.count_log(tally);
    }

    fn count_log(&self, tally: Tally) {
        if tally != Tally::default() {
            add(&self.metrics().access_log_lines, tally.written);
            add(&self.metrics().access_log_dropped_lines, tally.dropped);
        }
    }

    /// Periodic housekeeping: clock, shutdown flag, new generations and endpoints, idle pool
    /// reaping, block pool trimming (once a second), listener changes. Returns the sockets of
    /// listeners to start accepting on, with their configured addresses.
    pub fn tick(&self) -> Vec<NewListener> {
        let now = Instant::now();
        self.set_clock(now);
        self.refresh_date();
        let version = self.shared.version.load(Ordering::Acquire);
        if version != self.seen_version.get() {
            self.seen_version.set(version);
            let published = self.shared.published.load_full();
            let current = self.current();
            if published.number != current.number {
                let idle = published.gen.http.buffer_pool_bytes;
                self.pool.set_idle_bytes(idle);
                self.body_pool.set_idle_bytes(idle);
                let next = CoreGen::new(&published, self.id, Some(&current));
                *self.current.borrow_mut() = Rc::new(next);
                for l in self.listeners.borrow().iter() {
                    l.follow(&published.gen);
                }
                self.install_access_log(&published);
                // Accept loops waiting for room below the connection cap check again: a
                // raised `max_connections` makes room no connection's close announces.
                self.slots.notify_all();
                self.metrics()
                    .generation
                    .store(published.number, Ordering::Relaxed);
                tracing::debug!(
                    worker = self.id,
                    generation = published.number,
                    "generation installed"
                );
            } else {
                for (i, up) in current.upstreams.iter().enumerate() {
                    if let Some(eps) = published.endpoints.get(i) {
                        up.set_endpoints(eps);
                    }
                }
                // The same generation with the access log opened again (SIGUSR1).
                if !self
                    .access_log
                    .borrow()
                    .writes_to(published.access_log.as_ref())
                {
                    self.install_access_log(&published);
                }
            }
        }
        if self.logs_requests.get() {
            let tally = self.access_log.borrow_mut().tick(now);
            self.count_log(tally);
        }
        self.closes
            .check(now, self.current().gen.http.client_close_check);
        let ticks = self.ticks.get().wrapping_add(1);
        self.ticks.set(ticks);
        let second = self.clock_ms.get() / 1000;
        // Latency histograms are copied out about once a second (40 ticks of 25 ms), and
        // idle blocks beyond the pools' budget that a second did not need are freed.
        let publish_latency = ticks % 40 == 0;
        if publish_latency {
            let freed = self.pool.trim() + self.body_pool.trim();
            if freed >= RELEASE_AFTER_BYTES {
                // Given back by the control thread (see `control::release_free_memory`).
                self.shared.trim_wanted.store(true, Ordering::Release);
            }
            let m = self.metrics();
            for (i, pool) in [&self.pool, &self.body_pool].into_iter().enumerate() {
                let size = pool.block_size() as u64;
                let (live, idle) = (pool.live() as u64, pool.idle() as u64);
                m.buffer_bytes[2 * i].store(live.saturating_sub(idle) * size, Ordering::Relaxed);
                m.buffer_bytes[2 * i + 1].store(idle * size, Ordering::Relaxed);
            }
        }
        for up in &self.current().upstreams {
            up.reap(now);
            up.tick(second, publish_latency);
        }
        let mut new_sockets = Vec::new();
        while let Ok(cmd) = self.commands.try_recv() {
            match cmd {
                WorkerCommand::Listen(s, configured, tls) => new_sockets.push((s, configured, tls)),
                WorkerCommand::Unlisten(addr) => {
                    // A socket added by an earlier reload in this same tick never starts.
                    new_sockets.retain(|(s, _, _): &NewListener| {
                        s.local_addr().map_or(true, |a| a != addr)
                    });
                    self.listeners.borrow_mut().retain(|l| {
                        if l.addr == addr {
                            l.stop();
                            false
                        } else {
                            true
                        }
                    });
                }
            }
        }
        if self.shared.is_draining() && !self.draining.get() {
            self.draining.set(true);
            for up in &self.current().upstreams {
                up.clear_idle();
            }
            for l in self.listeners.borrow_mut().drain(..) {
                l.stop();
            }
            self.shutdown.notify_all();
        }
        if self.draining.get() {
            // A listener added by a reload that raced the shutdown: started now, its accept
            // loop would keep the worker from ever finishing.
            new_sockets.clear();
        }
        new_sockets
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_date_clock_stays_where_the_date_header_can_show_it() {
        let epoch = SystemTime::UNIX_EPOCH;
        let a_day = Duration::from_secs(86_400);
        let cases = [
            (epoch - a_day, "Thu, 01 Jan 1970 00:00:00 GMT"),
            (
                epoch + Duration::from_secs(300_000_000_000),
                "Fri, 31 Dec 9999 23:59:59 GMT",
            ),
            (
                epoch + Duration::from_secs(1_000_000_000),
                "Sun, 09 Sep 2001 01:46:40 GMT",
            ),
        ];
        for (clock, shown) in cases {
            // (httpdate panics on the first two unclamped.)
            let text = httpdate::HttpDate::from(date_clock(clock)).to_string();
            assert_eq!(text, shown);
            assert_eq!(text.len(), DATE_LEN);
        }
    }
}
