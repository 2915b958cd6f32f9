//! Start-up and shutdown of a whole ringway instance: resolve, bind, start workers and the
//! control thread; drain on request. Used by the binary and by the integration tests.

use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

use crate::config::{CpuPinning, Generation};
use crate::control::{Command, Control};
use crate::net::{bind_group, BindError};
use crate::observe::access_log;
use crate::shared::{DriverKind, Shared};
use crate::worker::WorkerCommand;
use crate::{control, net, worker};

/// Why ringway could not start.
#[derive(Debug)]
pub enum StartError {
    /// An upstream name did not resolve.
    Resolve(String),
    /// A listener could not be bound.
    Bind(BindError),
    /// A worker could not start (runtime or listener registration).
    Worker(String),
    /// The configured driver is not available.
    Driver(String),
    /// The access log file could not be opened.
    AccessLog(String),
}

impl fmt::Display for StartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StartError::Resolve(e) => write!(f, "{e}"),
            StartError::Bind(e) => write!(f, "{e}"),
            StartError::Worker(e) => write!(f, "{e}"),
            StartError::Driver(e) => write!(f, "{e}"),
            StartError::AccessLog(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for StartError {}

/// A running instance.
#[derive(Debug)]
pub struct Server {
    shared: Arc<Shared>,
    addrs: Vec<SocketAddr>,
    admin_addr: Option<SocketAddr>,
    workers: Vec<JoinHandle<()>>,
    control: Option<JoinHandle<()>>,
    health: Option<JoinHandle<()>>,
    admin: Option<JoinHandle<()>>,
    commands: Sender<Command>,
    stop_control: Arc<AtomicBool>,
    access_log: Option<JoinHandle<()>>,
}

/// Asks the control thread to reload the config file (SIGHUP, tests) or to reopen the access
/// log (SIGUSR1).
#[derive(Debug, Clone)]
pub struct ReloadHandle(Sender<Command>);

impl ReloadHandle {
    /// Starts a reload and returns at once; the outcome is logged.
    pub fn reload(&self) {
        let _ = self.0.send(Command::Reload { reply: None });
    }

    /// Opens the access log file again (log rotation) and returns at once.
    pub fn reopen_logs(&self) {
        let _ = self.0.send(Command::ReopenLogs { reply: None });
    }

    /// Opens the access log file again and waits until it is published (workers take it on
    /// their next tick), or for why it could not be opened.
    pub fn reopen_logs_and_wait(&self) -> Result<(), String> {
        self.ask(|tx| Command::ReopenLogs { reply: Some(tx) })
    }

    /// Reloads and waits for the outcome: the new generation number, or why the running
    /// config was kept.
    pub fn reload_and_wait(&self) -> Result<u64, String> {
        self.ask(|tx| Command::Reload { reply: Some(tx) })
    }

    /// Sends the command `make` builds around a reply channel and waits for the reply.
    fn ask<T>(&self, make: impl FnOnce(Sender<Result<T, String>>) -> Command) -> Result<T, String> {
        let (tx, rx) = mpsc::channel();
        self.0
            .send(make(tx))
            .map_err(|_| "the control thread is not running".to_string())?;
        rx.recv()
            .map_err(|_| "the control thread stopped".to_string())?
    }
}

/// Begins a graceful shutdown from anywhere (a signal handler thread, a test).
#[derive(Debug, Clone)]
pub struct ShutdownHandle(Arc<Shared>);

impl ShutdownHandle {
    /// Stops accepting, closes idle connections and lets in-flight requests finish.
    pub fn shutdown(&self) {
        self.0.draining.store(true, Ordering::Release);
    }
}

impl Server {
    /// Starts `gen`: returns once every worker listens.
    pub fn start(gen: Generation) -> Result<Server, StartError> {
        let gen = Arc::new(gen);
        let workers = gen.workers.resolve();
        let book = crate::shared::StateBook::new(None, workers);
        let endpoints = control::resolve_all(&gen, &book).map_err(StartError::Resolve)?;
        let log_file = match &gen.access_log {
            None => None,
            Some(cfg) => Some(access_log::open(&cfg.path).map_err(StartError::AccessLog)?),
        };
        let published = crate::shared::Published::new(1, gen.clone(), endpoints, &book)
            .with_access_log(log_file);
        if let Err(e) = net::sys::raise_nofile_limit() {
            tracing::warn!(error = %e, "cannot raise the open-files limit");
        }
        let driver = worker::runtime::choose_driver(gen.driver).map_err(StartError::Driver)?;

        let mut per_worker: Vec<Vec<(std::net::TcpListener, SocketAddr)>> =
            (0..workers).map(|_| Vec::new()).collect();
        let mut addrs = Vec::new();
        for l in &gen.listeners {
            let group = bind_group(l.address, workers, l.backlog).map_err(StartError::Bind)?;
            addrs.push(group.addr);
            for (i, s) in group.sockets.into_iter().enumerate() {
                per_worker[i].push((s, l.address));
            }
        }

        let admin_listener = match &gen.admin {
            None => None,
            Some(a) => Some(std::net::TcpListener::bind(a.address).map_err(|source| {
                StartError::Bind(BindError {
                    addr: a.address,
                    source,
                })
            })?),
        };
        let admin_addr = admin_listener.as_ref().and_then(|l| l.local_addr().ok());

        let head_block = (gen.http.limits.max_head_bytes + crate::worker::ctx::HEAD_SLACK_BYTES)
            .next_multiple_of(4096)
            .max(16 * 1024);
        let pinning = gen.cpus.clone();
        // Started whether or not this generation logs: a reload may turn the log on.
        let (log_queue, log_thread) = access_log::spawn_writer()
            .map_err(|e| StartError::Worker(format!("cannot spawn the access log thread: {e}")))?;
        let shared = Arc::new(Shared::new(workers, published, driver, Some(log_queue)));
        let (ready_tx, ready_rx) = mpsc::channel::<Result<(), String>>();
        let mut handles = Vec::with_capacity(workers);
        let mut worker_txs = Vec::with_capacity(workers);
        for (id, sockets) in per_worker.into_iter().enumerate() {
            let (cmd_tx, cmd_rx) = mpsc::channel::<WorkerCommand>();
            worker_txs.push(cmd_tx);
            let (w_shared, w_ready, w_pinning) =
                (shared.clone(), ready_tx.clone(), pinning.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("ringway-w{id}"))
                .spawn(move || {
                    worker_thread(id, driver, w_shared, w_pinning, cmd_rx, sockets, w_ready)
                });
            match spawned {
                Ok(h) => handles.push(h),
                Err(e) => {
                    shared.draining.store(true, Ordering::Release);
                    return Err(StartError::Worker(format!("cannot spawn worker {id}: {e}")));
                }
            }
        }
        drop(ready_tx);
        for _ in 0..workers {
            match ready_rx.recv() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    shared.draining.store(true, Ordering::Release);
                    return Err(StartError::Worker(e));
                }
                Err(_) => {
                    shared.draining.store(true, Ordering::Release);
                    return Err(StartError::Worker("a worker exited during start-up".into()));
                }
            }
        }

        let stop_control = Arc::new(AtomicBool::new(false));
        let (commands, commands_rx) = mpsc::channel::<Command>();
        let control = {
            let state = Control::new(shared.clone(), worker_txs, head_block, &addrs);
            let stop = stop_control.clone();
            std::thread::Builder::new()
                .name("ringway-control".into())
                .spawn(move || control::run(state, commands_rx, stop))
                .map_err(|e| StartError::Worker(format!("cannot spawn the control thread: {e}")))?
        };
        let health = {
            let (shared, stop) = (shared.clone(), stop_control.clone());
            std::thread::Builder::new()
                .name("ringway-health".into())
                .spawn(move || control::health::run(shared, stop))
                .map_err(|e| StartError::Worker(format!("cannot spawn the health thread: {e}")))?
        };
        {
            let (shared, stop) = (shared.clone(), stop_control.clone());
            std::thread::Builder::new()
                .name("ringway-dns".into())
                .spawn(move || control::run_dns(shared, stop))
                .map_err(|e| StartError::Worker(format!("cannot spawn the DNS thread: {e}")))?;
        }
        let admin = match admin_listener {
            None => None,
            Some(listener) => {
                let (commands, stop, shared) =
                    (commands.clone(), stop_control.clone(), shared.clone());
                Some(
                    std::thread::Builder::new()
                        .name("ringway-admin".into())
                        .spawn(move || control::admin::serve(listener, shared, commands, stop))
                        .map_err(|e| {
                            StartError::Worker(format!("cannot spawn the admin thread: {e}"))
                        })?,
                )
            }
        };
        tracing::info!(
            workers,
            driver = driver.name(),
            listeners = ?addrs,
            admin = ?admin_addr,
            "ringway started"
        );
        for warning in crate::config::warnings(&shared.published.load().gen) {
            tracing::warn!("{warning}");
        }
        Ok(Server {
            shared,
            addrs,
            admin_addr,
            workers: handles,
            control: Some(control),
            health: Some(health),
            admin,
            commands,
            stop_control,
            access_log: Some(log_thread),
        })
    }

    /// The bound listener addresses, in config order (real ports when 0 was configured).
    pub fn local_addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// The admin listener's address, when configured.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin_addr
    }

    /// A handle that asks for config reloads.
    pub fn reload_handle(&self) -> ReloadHandle {
        ReloadHandle(self.commands.clone())
    }

    /// The config generation in force.
    pub fn generation(&self) -> u64 {
        self.shared.generation()
    }

    /// Waits until every worker serves new requests with generation `number` or later;
    /// false on timeout.
    pub fn wait_for_generation(&self, number: u64, timeout: std::time::Duration) -> bool {
        let end = std::time::Instant::now() + timeout;
        loop {
            let all = self
                .shared
                .metrics
                .iter()
                .all(|m| m.generation.load(Ordering::Relaxed) >= number);
            if all {
                return true;
            }
            if std::time::Instant::now() >= end {
                return false;
            }
            #[allow(clippy::disallowed_methods)] // called by tests and tools, not by workers
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    /// The driver the workers run on.
    pub fn driver(&self) -> DriverKind {
        self.shared.driver
    }

    /// A handle that begins graceful shutdown.
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        ShutdownHandle(self.shared.clone())
    }

    /// Begins graceful shutdown.
    pub fn shutdown(&self) {
        self.shutdown_handle().shutdown();
    }

    /// Waits until every worker has drained and stopped.
    pub fn join(mut self) {
        for h in self.workers.drain(..) {
            let _ = h.join();
        }
        self.stop_control.store(true, Ordering::Release);
        if let Some(c) = self.control.take() {
            let _ = c.join();
        }
        if let Some(h) = self.health.take() {
            let _ = h.join();
        }
        if let Some(a) = self.admin.take() {
            let _ = a.join();
        }
        // The workers handed over their last lines as they stopped.
        // Bounded: a log on a pipe nobody reads would never be written.
        if let (Some(queue), Some(h)) = (&self.shared.access_log, self.access_log.take()) {
            let end = std::time::Instant::now() + access_log::STOP_WAIT;
            if queue.stop() {
                while !h.is_finished() && std::time::Instant::now() < end {
                    #[allow(clippy::disallowed_methods)] // the caller's thread, not a worker
                    std::thread::sleep(std::time::Duration::from_millis(2));
                }
            }
            if h.is_finished() {
                let _ = h.join();
            } else {
                tracing::warn!("the access log writer did not finish; lines may be lost");
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // A server dropped without join (a failing test) still stops its threads.
        self.shared.draining.store(true, Ordering::Release);
        self.stop_control.store(true, Ordering::Release);
    }
}

fn worker_thread(
    id: usize,
    driver: DriverKind,
    shared: Arc<Shared>,
    pinning: CpuPinning,
    commands: mpsc::Receiver<WorkerCommand>,
    sockets: Vec<(std::net::TcpListener, SocketAddr)>,
    ready: mpsc::Sender<Result<(), String>>,
) {
    match worker::runtime::pin(id, &pinning) {
        Some(cpu) => tracing::debug!(worker = id, cpu, "worker pinned"),
        None if !matches!(pinning, crate::config::CpuPinning::Off) => tracing::warn!(
            worker = id,
            "worker not pinned: its CPU is not one this process may run on (see `cpus`)"
        ),
        None => {}
    }
    let mut rt = match worker::runtime::build(driver) {
        Ok(rt) => rt,
        Err(e) => {
            let _ = ready.send(Err(format!(
                "worker {id}: cannot build the {} runtime: {e}",
                driver.name()
            )));
            return;
        }
    };
    // Tasks keep their panics to themselves (`runtime::spawn_isolated`); one escaping the
    // event loop itself would leave this worker's listener taking connections no one
    // accepts. The process ends then, for its supervisor to start it again.
    let served = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        rt.block_on(worker::serve(id, shared, commands, sockets, move |r| {
            let _ = ready.send(r);
        }))
    }));
    if served.is_err() {
        tracing::error!(worker = id, "the worker's event loop panicked; exiting");
        // (The line is queued for the log's writer thread: written out before the exit.)
        crate::observe::log::flush();
        std::process::exit(70);
    }
}
