//! Workers: one thread per core, pinned, each running its own monoio runtime with its own
//! listener sockets, pools and state. Nothing is shared between workers but `shared.rs`.
//!
//! Lifecycle of a worker: build the runtime → register its listener sockets → accept loops and
//! a tick task run → on drain: stop accepting (serving what the kernel already queued),
//! close idle connections, let in-flight requests finish until `shutdown_timeout` → return.

pub mod ctx;
pub mod deadline;
pub mod event;
pub mod fair;
pub mod runtime;

use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::{Duration, Instant};

use monoio::net::TcpListener;

pub use ctx::{Admitted, CoreGen, ListenerSlot, Worker, WorkerCommand};
use event::or_event;

use crate::shared::Shared;

/// How often a worker runs its housekeeping tick.
pub const TICK: Duration = Duration::from_millis(25);

/// Longest a draining accept loop waits for more already-queued connections.
const BACKLOG_DRAIN_WAIT: Duration = Duration::from_millis(2);

/// Longest a stopped accept loop goes on taking queued connections in all: new ones keep
/// arriving while the socket is open, and under steady traffic the per-accept wait alone
/// would never end (nor would the shutdown deadline, counted from the loops' end, start).
const BACKLOG_DRAIN_TOTAL: Duration = Duration::from_millis(100);

/// Pause after an accept error (EMFILE, ENFILE, ...) before trying again.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(20);

/// The body of a worker thread once its runtime is built: serves until drained.
pub async fn serve(
    id: usize,
    shared: Arc<Shared>,
    commands: Receiver<WorkerCommand>,
    sockets: Vec<(std::net::TcpListener, SocketAddr)>,
    ready: impl FnOnce(Result<(), String>),
) {
    let w = Rc::new(Worker::new(id, shared, commands));
    let mut listeners = Vec::with_capacity(sockets.len());
    for (s, configured) in sockets {
        let tls = w.gen().listener(configured).and_then(|l| l.tls.clone());
        match register(s) {
            Ok((l, addr)) => listeners.push((l, addr, configured, tls)),
            Err(e) => {
                ready(Err(format!("worker {id}: cannot register a listener: {e}")));
                return;
            }
        }
    }
    ready(Ok(()));
    let mut accepts: Vec<_> = listeners
        .into_iter()
        .map(|(l, addr, configured, tls)| spawn_accept(&w, l, addr, configured, tls))
        .collect();

    while !w.draining() {
        monoio::time::sleep(TICK).await;
        for (s, configured, tls) in w.tick() {
            match register(s) {
                Ok((l, addr)) => {
                    tracing::info!(worker = id, listener = %addr, "listening");
                    accepts.push(spawn_accept(&w, l, addr, configured, tls));
                }
                Err(e) => {
                    tracing::error!(worker = id, error = %e, "cannot register a new listener")
                }
            }
        }
    }
    for a in accepts {
        a.await;
    }
    let deadline = Instant::now() + w.gen().shutdown_timeout;
    while w.active_connections() > 0 && Instant::now() < deadline {
        monoio::time::sleep(TICK).await;
        w.tick();
    }
    if w.active_connections() > 0 {
        tracing::warn!(
            worker = id,
            connections = w.active_connections(),
            "shutdown timeout reached; closing connections still in flight"
        );
    }
    w.flush_access_log();
}

fn register(s: std::net::TcpListener) -> std::io::Result<(TcpListener, SocketAddr)> {
    let addr = s.local_addr()?;
    Ok((TcpListener::from_std(s)?, addr))
}

fn spawn_accept(
    w: &Rc<Worker>,
    l: TcpListener,
    addr: SocketAddr,
    configured: SocketAddr,
    tls: Option<Arc<crate::tls::TlsListener>>,
) -> monoio::task::JoinHandle<()> {
    let slot = w.add_listener(addr, configured, tls);
    runtime::spawn_isolated(accept_loop(w.clone(), l, slot))
}

async fn accept_loop(w: Rc<Worker>, listener: TcpListener, slot: Rc<ListenerSlot>) {
    let mut last_error_log: Option<Instant> = None;
    loop {
        while w.at_capacity() && !slot.stopped() {
            if or_event(&slot.stop, w.slots.wait()).await.is_none() {
                break;
            }
        }
        if slot.stopped() {
            break;
        }
        let canceller = monoio::io::Canceller::new();
        let mut accept = std::pin::pin!(listener.cancelable_accept(canceller.handle()));
        match or_event(&slot.stop, accept.as_mut()).await {
            None => {
                // Told to stop: cancel the accept in flight, and serve what it still brings
                // (dropping it could lose a connection the kernel already accepted).
                canceller.cancel();
                if let Ok((stream, peer)) = accept.await {
                    spawn_connection(&w, &slot, stream, peer);
                }
                break;
            }
            Some(Ok((stream, peer))) => spawn_connection(&w, &slot, stream, peer),
            Some(Err(e)) => {
                if last_error_log.is_none_or(|t| t.elapsed() > Duration::from_secs(1)) {
                    tracing::warn!(worker = w.id, error = %e, "accept failed");
                    last_error_log = Some(Instant::now());
                }
                monoio::time::sleep(ACCEPT_ERROR_PAUSE).await;
            }
        }
    }
    // Connections the kernel already queued on this socket would be reset when it closes:
    // take them and answer their first request (with `Connection: close` when draining),
    // as the connection cap leaves room (draining connections close and make it; what is
    // still queued at the end is reset, as at any cap).
    let drain_until = Instant::now() + BACKLOG_DRAIN_TOTAL;
    while Instant::now() < drain_until {
        if w.at_capacity() {
            let left = drain_until.saturating_duration_since(Instant::now());
            if monoio::time::timeout(left, w.slots.wait()).await.is_err() {
                break;
            }
            continue;
        }
        let canceller = monoio::io::Canceller::new();
        let mut accept = std::pin::pin!(listener.cancelable_accept(canceller.handle()));
        match monoio::time::timeout(BACKLOG_DRAIN_WAIT, accept.as_mut()).await {
            Ok(Ok((stream, peer))) => spawn_connection(&w, &slot, stream, peer),
            Ok(Err(_)) => break,
            Err(_) => {
                // Nothing more queued: cancel the accept, and serve what it still brings.
                canceller.cancel();
                if let Ok((stream, peer)) = accept.await {
                    spawn_connection(&w, &slot, stream, peer);
                }
                break;
            }
        }
    }
    tracing::debug!(worker = w.id, listener = %slot.addr, "stopped accepting");
}

fn spawn_connection(
    w: &Rc<Worker>,
    slot: &Rc<ListenerSlot>,
    stream: monoio::net::TcpStream,
    peer: SocketAddr,
) {
    // Counted here, not in the task, so a burst of accepts cannot overshoot the cap before
    // the spawned tasks first run.
    w.connection_opened();
    // The generation in force decides TLS (a reload may add or change certificates).
    let tls = slot.tls_in(&w.current().gen);
    let admitted = slot.admitted();
    let w = w.clone();
    runtime::spawn_large(move || crate::proxy::serve_connection(w, stream, peer, tls, admitted));
}
