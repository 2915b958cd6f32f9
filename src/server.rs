//! Start-up and shutdown of a whole ringway instance: resolve, bind, start workers and the
//! control thread; drain on request. Used by the binary and by the integration tests.

use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;

use crate::config::Generation;
use crate::net::{bind_group, BindError};
use crate::shared::{DriverKind, Shared};
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
}

impl fmt::Display for StartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StartError::Resolve(e) => write!(f, "{e}"),
            StartError::Bind(e) => write!(f, "{e}"),
            StartError::Worker(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for StartError {}

/// A running instance.
#[derive(Debug)]
pub struct Server {
    shared: Arc<Shared>,
    addrs: Vec<SocketAddr>,
    workers: Vec<JoinHandle<()>>,
    control: Option<JoinHandle<()>>,
    stop_control: Arc<AtomicBool>,
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
        let endpoints = control::resolve_all(&gen).map_err(StartError::Resolve)?;
        let workers = gen.workers.resolve();
        if let Err(e) = net::sys::raise_nofile_limit() {
            tracing::warn!(error = %e, "cannot raise the open-files limit");
        }
        let driver = worker::runtime::choose_driver();
        if driver == DriverKind::Epoll {
            tracing::info!("io_uring unavailable or disabled: workers use the epoll driver");
        }

        let mut per_worker: Vec<Vec<std::net::TcpListener>> =
            (0..workers).map(|_| Vec::new()).collect();
        let mut addrs = Vec::new();
        for l in &gen.listeners {
            let group = bind_group(l.address, workers, l.backlog).map_err(StartError::Bind)?;
            addrs.push(group.addr);
            for (i, s) in group.sockets.into_iter().enumerate() {
                per_worker[i].push(s);
            }
        }

        let shared = Arc::new(Shared::new(workers, endpoints, driver));
        let (ready_tx, ready_rx) = mpsc::channel::<Result<(), String>>();
        let mut handles = Vec::with_capacity(workers);
        for (id, sockets) in per_worker.into_iter().enumerate() {
            let (w_shared, w_gen, w_ready) = (shared.clone(), gen.clone(), ready_tx.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("ringway-w{id}"))
                .spawn(move || worker_thread(id, driver, w_shared, w_gen, sockets, w_ready));
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
        let control = {
            let (shared, stop) = (shared.clone(), stop_control.clone());
            std::thread::Builder::new()
                .name("ringway-control".into())
                .spawn(move || control::run(shared, gen, stop))
                .map_err(|e| StartError::Worker(format!("cannot spawn the control thread: {e}")))?
        };
        tracing::info!(
            workers,
            driver = driver.name(),
            listeners = ?addrs,
            "ringway started"
        );
        Ok(Server {
            shared,
            addrs,
            workers: handles,
            control: Some(control),
            stop_control,
        })
    }

    /// The bound listener addresses, in config order (real ports when 0 was configured).
    pub fn local_addrs(&self) -> &[SocketAddr] {
        &self.addrs
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
    gen: Arc<Generation>,
    sockets: Vec<std::net::TcpListener>,
    ready: mpsc::Sender<Result<(), String>>,
) {
    if let Some(cpu) = worker::runtime::pin(id, &gen.cpus) {
        tracing::debug!(worker = id, cpu, "worker pinned");
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
    rt.block_on(worker::serve(id, shared, gen, sockets, move |r| {
        let _ = ready.send(r);
    }));
}
