//! Upstreams as one worker sees them: endpoints, the balancer and the keep-alive pools.
//!
//! Ownership: one [`UpstreamRt`] per upstream per worker (`RefCell`/`Cell`, never `Send`).
//! The endpoint list is replaced on the worker's tick when the control thread publishes new
//! DNS answers; pools of endpoints that stay are kept.
//! Invariant: a connection is handed to [`UpstreamRt::release`] only after its response
//! completed exactly and neither side asked to close (the caller's duty, see `proxy/forward.rs`).
//! Not here: resolving names (control thread), deciding what to forward (proxy).

pub mod balancer;
pub mod pool;

use std::cell::RefCell;
use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use crate::config::UpstreamConfig;
use crate::net;
use crate::observe::metrics::{add, WorkerMetrics};
use crate::shared::ResolvedEndpoint;

pub use balancer::RoundRobin;
pub use pool::{IdlePool, UpConn};

/// One endpoint with its idle connections.
#[derive(Debug)]
struct EndpointRt {
    addr: SocketAddr,
    authority: Rc<str>,
    idle: IdlePool,
}

/// Why no connection could be had.
#[derive(Debug)]
pub enum AcquireError {
    /// The upstream has no endpoint (DNS returned nothing).
    NoEndpoints,
    /// Every endpoint tried refused or failed; the last one tried and its error.
    Failed(SocketAddr, io::Error),
    /// An endpoint did not accept the connection within the connect timeout.
    TimedOut(SocketAddr),
}

/// A worker's view of one upstream.
#[derive(Debug)]
pub struct UpstreamRt {
    endpoints: RefCell<Vec<EndpointRt>>,
    balancer: RoundRobin,
    connect_timeout: Duration,
    pool_max_idle: usize,
    pool_idle_timeout: Duration,
}

impl UpstreamRt {
    /// The runtime state for `cfg` with its resolved `endpoints`, on worker `worker`.
    pub fn new(cfg: &UpstreamConfig, endpoints: &[ResolvedEndpoint], worker: usize) -> Self {
        let rt = UpstreamRt {
            endpoints: RefCell::new(Vec::new()),
            balancer: RoundRobin::new(worker),
            connect_timeout: cfg.connect_timeout,
            pool_max_idle: cfg.pool_max_idle,
            pool_idle_timeout: cfg.pool_idle_timeout,
        };
        rt.set_endpoints(endpoints);
        rt
    }

    /// Replaces the endpoint list, keeping the idle pools of endpoints still present.
    pub fn set_endpoints(&self, resolved: &[ResolvedEndpoint]) {
        let mut current = self.endpoints.borrow_mut();
        let mut next = Vec::with_capacity(resolved.len());
        for r in resolved {
            let kept = current
                .iter()
                .position(|e| e.addr == r.addr && *e.authority == *r.authority)
                .map(|i| current.swap_remove(i));
            next.push(kept.unwrap_or_else(|| EndpointRt {
                addr: r.addr,
                authority: Rc::from(&*r.authority),
                idle: IdlePool::default(),
            }));
        }
        *current = next;
    }

    /// Number of endpoints.
    pub fn endpoint_count(&self) -> usize {
        self.endpoints.borrow().len()
    }

    /// Idle pooled connections across endpoints.
    pub fn idle_count(&self) -> usize {
        self.endpoints.borrow().iter().map(|e| e.idle.len()).sum()
    }

    /// A connection for one request: a pooled one when there is one, else a new one, walking
    /// the endpoints from the balancer's pick when connecting fails. `force_new` skips the
    /// pool (the retry after a stale pooled connection).
    ///
    /// A pooled connection is checked first (one non-blocking `MSG_PEEK`): one the upstream
    /// closed, or one with bytes nobody asked for (a late response, a 408 written before
    /// closing an idle connection), is dropped, so those bytes can never be read as the next
    /// request's response.
    pub async fn acquire(
        &self,
        force_new: bool,
        now: Instant,
        metrics: &WorkerMetrics,
    ) -> Result<UpConn, AcquireError> {
        let n = self.endpoint_count();
        if n == 0 {
            return Err(AcquireError::NoEndpoints);
        }
        let first = self.balancer.pick(n);
        let mut last_err = None;
        for i in 0..n {
            let (addr, authority) = {
                let mut eps = self.endpoints.borrow_mut();
                // The list cannot change while this loop runs without an await in between,
                // but it may between iterations: index modulo the current length.
                let len = eps.len();
                if len == 0 {
                    return Err(AcquireError::NoEndpoints);
                }
                let ep = &mut eps[(first + i) % len];
                if !force_new {
                    while let Some(conn) = ep.idle.pop(now, self.pool_idle_timeout) {
                        if conn.idle_usable() {
                            add(&metrics.pool_hits, 1);
                            return Ok(conn);
                        }
                    }
                }
                (ep.addr, ep.authority.clone())
            };
            add(&metrics.pool_misses, 1);
            match net::connect(addr, self.connect_timeout).await {
                Ok(stream) => {
                    add(&metrics.upstream_connects, 1);
                    return Ok(UpConn::new(stream, addr, authority));
                }
                Err(e) => {
                    add(&metrics.upstream_connect_errors, 1);
                    tracing::debug!(endpoint = %addr, error = %e, "upstream connect failed");
                    if e.kind() == io::ErrorKind::TimedOut {
                        // A slow network: walking on would multiply the wait.
                        return Err(AcquireError::TimedOut(addr));
                    }
                    last_err = Some((addr, e));
                }
            }
        }
        let (addr, e) = last_err.unwrap_or_else(|| {
            (
                SocketAddr::from(([0, 0, 0, 0], 0)),
                io::ErrorKind::NotConnected.into(),
            )
        });
        Err(AcquireError::Failed(addr, e))
    }

    /// Returns a connection whose exchange completed cleanly to its endpoint's idle pool (or
    /// closes it when the pool is full or the endpoint is gone).
    pub fn release(&self, mut conn: UpConn, now: Instant) {
        if self.pool_max_idle == 0 {
            return;
        }
        let mut eps = self.endpoints.borrow_mut();
        if let Some(ep) = eps
            .iter_mut()
            .find(|e| e.addr == conn.addr() && *e.authority == *conn.authority())
        {
            conn.mark_reused();
            ep.idle.push(conn, now, self.pool_max_idle);
        }
    }

    /// Takes over the idle connections `old` (the same upstream in the previous generation)
    /// holds for endpoints this one also has.
    pub fn adopt_idle(&self, old: &UpstreamRt) {
        let mut theirs = old.endpoints.borrow_mut();
        let mut ours = self.endpoints.borrow_mut();
        for ep in ours.iter_mut() {
            if let Some(prev) = theirs
                .iter_mut()
                .find(|p| p.addr == ep.addr && *p.authority == *ep.authority)
            {
                std::mem::swap(&mut ep.idle, &mut prev.idle);
            }
        }
    }

    /// Closes idle connections older than the pool idle timeout.
    pub fn reap(&self, now: Instant) {
        for ep in self.endpoints.borrow_mut().iter_mut() {
            ep.idle.reap(now, self.pool_idle_timeout);
        }
    }

    /// Closes every idle connection (shutdown).
    pub fn clear_idle(&self) {
        for ep in self.endpoints.borrow_mut().iter_mut() {
            ep.idle.clear();
        }
    }
}
