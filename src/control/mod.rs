//! The control thread: everything slow, off the workers.
//! - Reloads: on SIGHUP, `POST /-/reload` on the admin listener (`admin.rs`), or a change of the
//!   config file (its modification time and size polled every second, read once they stayed
//!   the same for a poll, its content hashed), it parses, validates and compiles a new
//!   generation, resolves its names and binds its new listeners; only then is it published.
//!   Any error keeps the running generation.
//! - DNS: upstream names are resolved again every `dns_refresh` (10 s unless configured), on
//!   a thread of its own (a slow resolver holds up nothing else); a failed lookup keeps the
//!   last answer (RFC 8767: serve stale). A load or refresh looks every name up at once and
//!   waits at most `dns_timeout` (a reload on a dead resolver refuses, or keeps the last
//!   answers, in seconds, and a log reopen queued behind it waits no longer).
//!
//! Ownership: runs on its own std thread; talks to workers only through `Shared` (generations)
//! and one channel per worker (listener sockets), which workers poll on their tick.

pub mod admin;
pub mod health;

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::{compile, hash_text, stamp, FileStamp, Generation};
use crate::net::bind_group;
use crate::observe::access_log;
use crate::shared::{EndpointTable, Published, ResolvedEndpoint, Shared, StateBook};
use crate::worker::WorkerCommand;

/// How often the control loop wakes to check for work.
const CONTROL_TICK: Duration = Duration::from_millis(50);

/// A name lookup: `host`, `port` to addresses (blocking).
pub type Lookup = fn(&str, u16) -> std::io::Result<Vec<SocketAddr>>;

/// The system resolver (getaddrinfo, with its own timeouts and retries).
#[allow(clippy::disallowed_methods)] // lookup threads may block on DNS; workers never do
fn system_lookup(host: &str, port: u16) -> std::io::Result<Vec<SocketAddr>> {
    Ok((host, port).to_socket_addrs()?.collect())
}

/// Most lookups one load runs at once.
const LOOKUP_THREADS: usize = 16;

/// Most lookup threads alive across loads: a lookup that outlives its load's `dns_timeout` (a
/// resolver that does not answer) runs on until getaddrinfo gives up, and reloads and
/// refreshes made meanwhile must not pile up threads behind it. Beyond, a name counts as
/// failed at once.
const LOOKUP_THREADS_ALIVE: usize = 64;

static LOOKUPS_ALIVE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The names (`host`, `port`) being looked up, by any load: a name whose lookup from an
/// earlier load still waits for the resolver is not looked up again (it counts as failed and
/// keeps its last answer), so threads are bounded by distinct names, and a few dead names
/// refreshed every second cannot take every lookup thread from the names that answer.
/// (The control, DNS and admin threads only: a lock no worker takes.)
#[allow(clippy::disallowed_types)]
static LOOKING_UP: std::sync::Mutex<Vec<(String, u16)>> = std::sync::Mutex::new(Vec::new());

/// Marks `name` as being looked up; false when it already is.
fn begin_lookup(name: &(String, u16)) -> bool {
    let mut names = LOOKING_UP.lock().unwrap_or_else(|e| e.into_inner());
    if names.contains(name) {
        return false;
    }
    names.push(name.clone());
    true
}

fn end_lookup(name: &(String, u16)) {
    let mut names = LOOKING_UP.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(i) = names.iter().position(|n| n == name) {
        names.swap_remove(i);
    }
}

/// The answers for every distinct name (`host`, `port`) of `gen`'s endpoints, looked up in
/// parallel (at most [`LOOKUP_THREADS`] at once); a name with no answer within `gen`'s
/// `dns_timeout` gets an error. Address literals are not looked up.
fn lookup_names(
    gen: &Generation,
    lookup: Lookup,
) -> std::collections::HashMap<(String, u16), Result<Vec<SocketAddr>, String>> {
    let mut names: Vec<(String, u16)> = gen
        .upstreams
        .iter()
        .flat_map(|u| u.endpoints.iter())
        .filter(|e| e.literal.is_none())
        .map(|e| (e.host.clone(), e.port))
        .collect();
    names.sort();
    names.dedup();
    let mut answers = std::collections::HashMap::with_capacity(names.len());
    if names.is_empty() {
        return answers;
    }
    let deadline = Instant::now() + gen.dns_timeout;
    let (tx, rx) = std::sync::mpsc::channel();
    let mut queue = names.into_iter();
    let mut running = 0;
    loop {
        while running < LOOKUP_THREADS && Instant::now() < deadline {
            let Some(name) = queue.next() else { break };
            if !begin_lookup(&name) {
                let why = "a lookup of it from before still waits for the resolver";
                answers.insert(name, Err(why.to_string()));
                continue;
            }
            let alive = LOOKUPS_ALIVE.fetch_add(1, Ordering::AcqRel);
            let tx = tx.clone();
            let spawned = alive < LOOKUP_THREADS_ALIVE && {
                let name = name.clone();
                std::thread::Builder::new()
                    .name("ringway-dns".into())
                    .spawn(move || {
                        let answer = lookup(&name.0, name.1);
                        end_lookup(&name);
                        LOOKUPS_ALIVE.fetch_sub(1, Ordering::AcqRel);
                        // (The load may have stopped waiting: the answer is dropped.)
                        let _ = tx.send((name, answer));
                    })
                    .is_ok()
            };
            if spawned {
                running += 1;
            } else {
                end_lookup(&name);
                LOOKUPS_ALIVE.fetch_sub(1, Ordering::AcqRel);
                let why = "no lookup thread free (earlier lookups still wait for the resolver)";
                answers.insert(name, Err(why.to_string()));
            }
        }
        if running == 0 {
            break;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((name, answer)) => {
                running -= 1;
                let answer = answer.map_err(|e| e.to_string()).and_then(|mut addrs| {
                    addrs.sort();
                    addrs.dedup();
                    if addrs.is_empty() {
                        Err("no address".to_string())
                    } else {
                        Ok(addrs)
                    }
                });
                answers.insert(name, answer);
            }
            Err(_) => break,
        }
    }
    // What did not answer in time, or was never started for lack of time.
    let why = format!("no answer within dns_timeout ({:?})", gen.dns_timeout);
    for e in gen.upstreams.iter().flat_map(|u| u.endpoints.iter()) {
        if e.literal.is_none() {
            answers
                .entry((e.host.clone(), e.port))
                .or_insert_with(|| Err(why.clone()));
        }
    }
    answers
}

/// Resolves every endpoint of every upstream; fails on the first name that does not resolve.
/// Endpoint state comes from `book`.
pub fn resolve_all(gen: &Generation, book: &StateBook<'_>) -> Result<EndpointTable, String> {
    resolve(gen, book, None, true, system_lookup)
}

/// Resolves `gen`'s endpoints (every name at once, within `dns_timeout`). When a lookup
/// fails, the addresses `previous` has for the same upstream and `host:port` stay in use
/// (RFC 8767: serve stale); with none to fall back on, `strict` makes that an error (start-up,
/// a reload adding a name) and otherwise the name contributes no endpoint until it resolves
/// (a periodic refresh).
fn resolve(
    gen: &Generation,
    book: &StateBook<'_>,
    previous: Option<&Published>,
    strict: bool,
    lookup: Lookup,
) -> Result<EndpointTable, String> {
    let answers = lookup_names(gen, lookup);
    let mut table = Vec::with_capacity(gen.upstreams.len());
    for up in &gen.upstreams {
        let stale_of = |authority: &str| -> Vec<ResolvedEndpoint> {
            let Some(p) = previous else {
                return Vec::new();
            };
            let Some(i) = p.gen.upstreams.iter().position(|u| u.name == up.name) else {
                return Vec::new();
            };
            p.endpoints.get(i).map_or_else(Vec::new, |eps| {
                eps.iter()
                    .filter(|e| &*e.authority == authority)
                    .cloned()
                    .collect()
            })
        };
        let mut eps = Vec::new();
        for spec in &up.endpoints {
            let authority: Arc<str> = Arc::from(spec.authority.as_str());
            let answer = match spec.literal {
                Some(addr) => Ok(vec![addr]),
                None => match answers.get(&(spec.host.clone(), spec.port)) {
                    Some(Ok(addrs)) => Ok(addrs.clone()),
                    Some(Err(e)) => Err(format!("cannot resolve `{}`: {e}", spec.authority)),
                    None => Err(format!("cannot resolve `{}`", spec.authority)),
                },
            };
            match answer {
                Ok(addrs) => eps.extend(addrs.into_iter().map(|addr| ResolvedEndpoint {
                    addr,
                    state: book.endpoint(&up.name, addr, &authority, up.health_check.is_some()),
                    authority: authority.clone(),
                    weight: spec.weight,
                })),
                Err(e) => {
                    let stale = stale_of(&spec.authority);
                    if stale.is_empty() && strict {
                        return Err(format!("upstream `{}`: {e}", up.name));
                    }
                    tracing::warn!(upstream = %up.name, error = %e, kept = stale.len(), "lookup failed; keeping the last answer");
                    eps.extend(stale.into_iter().map(|r| ResolvedEndpoint {
                        weight: spec.weight,
                        ..r
                    }));
                }
            }
        }
        table.push(eps);
    }
    Ok(table)
}

/// What the control thread is asked to do.
#[derive(Debug)]
pub enum Command {
    /// Re-read the config file and apply it; the outcome (the new generation number, or why
    /// the running one was kept) goes to `reply` when given.
    Reload {
        /// Where to send the outcome.
        reply: Option<Sender<Result<u64, String>>>,
    },
    /// Open the access log file again (log rotation: SIGUSR1), without reading the config:
    /// a config file being edited, or a name that does not resolve, does not keep the
    /// rotated file in use.
    ReopenLogs {
        /// Where to send the outcome.
        reply: Option<Sender<Result<(), String>>>,
    },
}

/// How often the config file's modification time and size are looked at.
const FILE_POLL: Duration = Duration::from_secs(1);

/// When a config that compiled was refused for a reason outside it (a name that did not
/// resolve, a port not yet free), the reload is tried again after this long.
const RELOAD_RETRY: Duration = Duration::from_secs(10);

/// The control thread's state.
#[derive(Debug)]
pub struct Control {
    shared: Arc<Shared>,
    /// The config file, when ringway was started from one.
    source: Option<PathBuf>,
    workers: Vec<Sender<WorkerCommand>>,
    /// Head block size the workers were started with (a larger head limit needs a restart).
    head_block_limit: usize,
    /// Each listener's configured address and the address it is bound to (they differ for
    /// port 0): workers know their sockets by the bound one.
    bound: Vec<(SocketAddr, SocketAddr)>,
    file_stamp: Option<FileStamp>,
    file_hash: Option<u64>,
    /// A changed stamp seen at the last poll, not acted on yet (see [`Control::poll_file`]).
    settling: Option<FileStamp>,
    /// When to try again a reload refused for a transient reason (see [`RELOAD_RETRY`]).
    retry_at: Option<Instant>,
    /// Certificate and key files of the generation in force, with their stamps: a change
    /// reloads the config (new certificates for the next handshakes).
    cert_files: Vec<(PathBuf, Option<FileStamp>)>,
}

/// The certificate files `gen` read, listeners' and upstreams' (CA files, client
/// certificates), stamped before they were read (a file replaced while the config compiled
/// then differs from its stamp at the next poll, not only at its next change).
fn cert_files(gen: &Generation) -> Vec<(PathBuf, Option<FileStamp>)> {
    let listeners = gen.listeners.iter().filter_map(|l| l.tls.as_ref());
    let upstreams = gen.upstreams.iter().filter_map(|u| u.tls.as_ref());
    listeners
        .flat_map(|t| t.files.iter().cloned())
        .chain(upstreams.flat_map(|t| t.files.iter().cloned()))
        .collect()
}

/// Puts back into `gen` what a reload cannot change from `old` (the generation in force):
/// worker count, CPUs, driver, log level, admin, listen backlogs, and a head limit beyond the
/// head blocks the workers started with (`head_block_limit`). Returns the keys it kept, for
/// the log. `gen` is then published as running, so the next reload compares with what is
/// really in force.
fn keep_running_values(
    gen: &mut Generation,
    old: &Generation,
    head_block_limit: usize,
) -> Vec<&'static str> {
    let mut restart = Vec::new();
    macro_rules! keep {
        ($($key:ident),*) => {$(
            if gen.$key != old.$key {
                restart.push(stringify!($key));
                gen.$key = old.$key.clone();
            }
        )*};
    }
    keep!(workers, cpus, driver, log_level, admin);
    for l in &mut gen.listeners {
        if let Some(o) = old.listeners.iter().find(|o| o.address == l.address) {
            if o.backlog != l.backlog {
                restart.push("listeners.backlog");
                l.backlog = o.backlog;
            }
        }
    }
    let limits = &mut gen.http.limits;
    if limits.max_head_bytes + crate::worker::ctx::HEAD_SLACK_BYTES > head_block_limit {
        restart.push("http.max_head_bytes (above the size the workers started with)");
        let kept = old.http.limits.max_head_bytes;
        limits.max_head_bytes = kept;
        limits.max_request_line_bytes = limits.max_request_line_bytes.min(kept);
        // The HTTP/2 header list limit stays within the head limit in force (whether it
        // followed the refused one or was set apart from it): an HTTP/2 request's head is read
        // with that limit, and a list the h2 layer took beyond it would get 431 there.
        gen.http2.max_header_list_bytes = gen.http2.max_header_list_bytes.min(kept as u32);
    }
    restart
}

impl Control {
    /// The control state for a server started from `shared`'s generation; `workers` carry
    /// listener changes to each worker; `bound` holds each listener's bound address, in the
    /// generation's listener order.
    pub fn new(
        shared: Arc<Shared>,
        workers: Vec<Sender<WorkerCommand>>,
        head_block_limit: usize,
        bound: &[SocketAddr],
    ) -> Control {
        let gen = shared.published.load().gen.clone();
        let source = (!gen.source.starts_with('<')).then(|| PathBuf::from(&gen.source));
        // The hash of the text the running generation was compiled from, and no stamp: the
        // first poll reads the file and reloads if it changed since it was loaded.
        let file_stamp = None;
        let file_hash = Some(gen.text_hash);
        Control {
            shared,
            source,
            workers,
            head_block_limit,
            bound: gen
                .listeners
                .iter()
                .zip(bound)
                .map(|(l, b)| (l.address, *b))
                .collect(),
            file_stamp,
            file_hash,
            settling: None,
            retry_at: None,
            cert_files: cert_files(&gen),
        }
    }

    /// Re-reads the config file and applies it: new routes, upstreams, limits and listeners.
    /// On any error the running generation stays and the error is returned (and logged).
    pub fn reload(&mut self, why: &str) -> Result<u64, String> {
        let result = self.try_reload();
        match &result {
            Ok(n) => {
                self.shared.reloads_ok.fetch_add(1, Ordering::Relaxed);
                tracing::info!(generation = n, trigger = why, "config reloaded");
            }
            Err(e) => {
                self.shared.reloads_failed.fetch_add(1, Ordering::Relaxed);
                tracing::error!(trigger = why, error = %e, "config reload refused; the running config stays");
            }
        }
        result
    }

    fn try_reload(&mut self) -> Result<u64, String> {
        let Some(path) = self.source.clone() else {
            return Err("ringway was started without a config file (`ringway proxy`)".into());
        };
        // The stamp is taken before the read: a write landing in between changes the stamp
        // again, so the next poll looks once more.
        let before = stamp(&path);
        let text = std::fs::read_to_string(&path)
            .map_err(|e| format!("{}: cannot read the config file: {e}", path.display()))?;
        self.file_hash = Some(hash_text(&text));
        self.file_stamp = before;
        let mut gen = compile(&text, &path.display().to_string()).map_err(|e| e.to_string())?;
        // It compiled: a refusal from here on (resolution, binding) may pass by itself, and the
        // file will not change to say so. Cleared when this reload goes through.
        self.retry_at = Some(Instant::now() + RELOAD_RETRY);
        self.cert_files = cert_files(&gen);
        let current = self.shared.published.load_full();
        let book = StateBook::new(Some(&current), self.shared.workers);
        let endpoints = resolve(&gen, &book, Some(&current), true, system_lookup)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let old = &current.gen;
        for l in &mut gen.listeners {
            let old_tls = old.listener(l.address).and_then(|o| o.tls.as_ref());
            if let (Some(tls), Some(old_tls)) = (l.tls.as_mut(), old_tls) {
                *tls = Arc::new(tls.keeping_sessions_of(old_tls));
            }
        }

        // What a reload cannot change: keep running with it, say so.
        let restart = keep_running_values(&mut gen, old, self.head_block_limit);
        if !restart.is_empty() {
            tracing::warn!(keys = ?restart, "these changes need a restart; the running values stay");
        }

        // Opened again on every reload, even at the same path: a rotated log (renamed, then
        // SIGHUP) goes on in a new file.
        let log_file = match &gen.access_log {
            None => None,
            Some(cfg) => Some(access_log::open(&cfg.path)?),
        };

        // Bind added listeners before anything is published: a failure leaves all as it was.
        let workers = self.workers.len();
        let mut added = Vec::new();
        for l in gen
            .listeners
            .iter()
            .filter(|l| !old.listeners.iter().any(|o| o.address == l.address))
        {
            added.push((
                bind_group(l.address, workers, l.backlog).map_err(|e| e.to_string())?,
                l.address,
            ));
        }
        let removed: Vec<SocketAddr> = old
            .listeners
            .iter()
            .filter(|o| !gen.listeners.iter().any(|l| l.address == o.address))
            .map(|o| o.address)
            .collect();

        for warning in crate::config::warnings(&gen) {
            tracing::warn!("{warning}");
        }
        let number = current.number + 1;
        self.retry_at = None;
        self.shared.publish(
            Published::new(number, Arc::new(gen), endpoints, &book).with_access_log(log_file),
        );
        let published = self.shared.published.load_full();
        for (group, configured) in added {
            self.bound.push((configured, group.addr));
            tracing::info!(listener = %group.addr, "listener added");
            let tls = published
                .gen
                .listener(configured)
                .and_then(|l| l.tls.clone());
            for (tx, socket) in self.workers.iter().zip(group.sockets) {
                let _ = tx.send(WorkerCommand::Listen(socket, configured, tls.clone()));
            }
        }
        for configured in removed {
            let addr = self
                .bound
                .iter()
                .position(|(c, _)| *c == configured)
                .map_or(configured, |i| self.bound.swap_remove(i).1);
            tracing::info!(listener = %addr, "listener removed; its open connections finish");
            for tx in &self.workers {
                let _ = tx.send(WorkerCommand::Unlisten(addr));
            }
        }
        Ok(number)
    }

    /// Reloads when the config file's content changed since it was last read.
    fn poll_file(&mut self) {
        if self.retry_at.is_some_and(|at| Instant::now() >= at) {
            self.retry_at = None;
            let _ = self.reload("retrying a reload refused for a transient reason");
            return;
        }
        let changed_cert = self
            .cert_files
            .iter()
            .find(|(path, seen)| stamp(path) != *seen)
            .map(|(path, _)| path.display().to_string());
        if let Some(path) = changed_cert {
            tracing::info!(file = %path, "certificate file changed");
            // Stamped again whatever the outcome: a half-written pair is retried when it
            // changes again.
            self.cert_files = self
                .cert_files
                .iter()
                .map(|(p, _)| (p.clone(), stamp(p)))
                .collect();
            let _ = self.reload("certificate file changed");
        }
        let Some(path) = self.source.clone() else {
            return;
        };
        let now = stamp(&path);
        if now.is_none() || now == self.file_stamp {
            self.settling = None;
            return;
        }
        // A change is acted on once the file stayed as it is for a whole poll: a file written
        // in place (an editor, `cat >`, a script writing line by line) is read once it is
        // whole, not while a part of it would compile into a config with routes or
        // listeners missing. (An atomic replace, a rename, waits one poll too.)
        if self.settling != now {
            self.settling = now;
            return;
        }
        self.settling = None;
        let Ok(text) = std::fs::read_to_string(&path) else {
            // Looked at again next time: the stamp is stored only after a successful read.
            return;
        };
        self.file_stamp = now;
        if Some(hash_text(&text)) != self.file_hash {
            let _ = self.reload("config file changed");
        }
    }

    /// Opens the access log file again and publishes the generation in force with it:
    /// workers hand their next lines to the new file.
    fn reopen_logs(&self) -> Result<(), String> {
        let current = self.shared.published.load_full();
        let Some(cfg) = &current.gen.access_log else {
            return Ok(());
        };
        let path = cfg.path.clone();
        let file = access_log::open(&path)?;
        // Over the generation in force, unless the DNS thread published new endpoints
        // meanwhile: then over those (publishing the ones loaded here would bring back the
        // addresses it just replaced, until its next refresh).
        let mut current = current;
        loop {
            let book = StateBook::new(Some(&current), self.shared.workers);
            let next = Published::new(
                current.number,
                current.gen.clone(),
                (*current.endpoints).clone(),
                &book,
            )
            .with_access_log(Some(file.clone()));
            if self.shared.publish_over(&current, next) {
                break;
            }
            current = self.shared.published.load_full();
            if current
                .gen
                .access_log
                .as_ref()
                .is_none_or(|c| c.path != path)
            {
                // A reload came between: it opened its own log.
                return Ok(());
            }
        }
        tracing::info!(path = %path.display(), "access log reopened");
        Ok(())
    }
}

/// Re-resolves the endpoint names of the generation in force; publishes it again with the new
/// endpoints when the answers changed, unless a reload published another meanwhile (which
/// resolved its names itself).
fn refresh_dns(shared: &Shared) {
    let current = shared.published.load_full();
    let book = StateBook::new(Some(&current), shared.workers);
    let Ok(table) = resolve(&current.gen, &book, Some(&current), false, system_lookup) else {
        return;
    };
    if *current.endpoints != table {
        let next = Published::new(current.number, current.gen.clone(), table, &book)
            .with_access_log(current.access_log.clone());
        if shared.publish_over(&current, next) {
            tracing::info!("upstream endpoints changed after DNS refresh");
        }
    }
}

/// Resolves upstream names again every `dns_refresh` until `stop` is set, on a thread of its
/// own: a lookup blocks (getaddrinfo, with the resolver's own timeouts and retries), and a
/// slow resolver must not hold up reloads, log reopening or shutdown. (It is not waited for
/// at shutdown: a lookup under way ends with the process.)
pub fn run_dns(shared: Arc<Shared>, stop: Arc<AtomicBool>) {
    let mut last = Instant::now();
    while !stop.load(Ordering::Acquire) && !shared.is_draining() {
        #[allow(clippy::disallowed_methods)] // the DNS thread is not a worker
        std::thread::sleep(CONTROL_TICK);
        let now = Instant::now();
        // The interval in force now: a reload that changes it applies from the next look.
        let gen = shared.published.load().gen.clone();
        if gen
            .dns_refresh
            .is_some_and(|every| now.saturating_duration_since(last) >= every)
        {
            last = now;
            if gen
                .upstreams
                .iter()
                .any(|u| u.endpoints.iter().any(|e| e.literal.is_none()))
            {
                refresh_dns(&shared);
            }
        }
    }
}

/// Gives the system allocator's free memory back to the system, after a worker's pools freed a
/// burst's blocks (`Shared::trim_wanted`). Large blocks (the pools', and pipes and buffers of
/// 16 KiB and more) come from glibc's malloc, which keeps a thread's freed memory mapped unless
/// it lies at the top of its heap: without this, the resident size after a burst (or an
/// attack) stayed at its peak. `malloc_trim` walks every arena's free chunks under the arena's
/// lock, one `madvise` per free run: on a heap fragmented by half-freed blocks it takes 6-20 ms
/// (1,600 64 KiB to 16,000 20 KiB blocks), so it runs here, not on a worker, where every
/// connection of the core would wait for it. (A worker that needs glibc's lock of the arena
/// being walked meanwhile still waits for it; workers take their blocks from their pools
/// and go to glibc only when a pool runs dry.)
fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes the arenas' locks itself; it only unmaps free pages and
    // touches no memory that is allocated.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The control loop; returns when `stop` is set.
pub fn run(mut control: Control, commands: Receiver<Command>, stop: Arc<AtomicBool>) {
    let mut next_file = Instant::now() + FILE_POLL;
    // A command taken off the channel while merging reloads, handled next.
    let mut next: Option<Command> = None;
    while !stop.load(Ordering::Acquire) {
        let command = match next.take() {
            Some(c) => Ok(c),
            None => commands.recv_timeout(CONTROL_TICK),
        };
        match command {
            Ok(Command::Reload { reply }) => {
                // Reload requests already queued behind this one are answered by it: they
                // all came before the file is read (a storm of SIGHUPs or reload calls
                // costs one reload, not one each).
                let mut replies: Vec<_> = reply.into_iter().collect();
                loop {
                    match commands.try_recv() {
                        Ok(Command::Reload { reply }) => replies.extend(reply),
                        Ok(other) => {
                            next = Some(other);
                            break;
                        }
                        Err(_) => break,
                    }
                }
                let result = control.reload("reload request");
                for tx in replies {
                    let _ = tx.send(result.clone());
                }
            }
            Ok(Command::ReopenLogs { reply }) => {
                let result = control.reopen_logs();
                if let Err(e) = &result {
                    tracing::error!(error = %e, "the access log was not reopened; the open file stays");
                }
                if let Some(tx) = reply {
                    let _ = tx.send(result);
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => {
                #[allow(clippy::disallowed_methods)] // control thread, not a worker
                std::thread::sleep(CONTROL_TICK);
            }
        }
        if control.shared.trim_wanted.swap(false, Ordering::AcqRel) {
            release_free_memory();
        }
        if control.shared.is_draining() {
            continue;
        }
        let now = Instant::now();
        if now >= next_file {
            next_file = now + FILE_POLL;
            control.poll_file();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Answers every name with 127.0.0.1 (`slow.test` and `stuck.test` after 3 s).
    #[allow(clippy::disallowed_methods)] // a stand-in for a resolver that does not answer
    fn slow_for_one(host: &str, port: u16) -> std::io::Result<Vec<SocketAddr>> {
        if host == "slow.test" || host == "stuck.test" {
            std::thread::sleep(Duration::from_secs(3));
        }
        Ok(vec![SocketAddr::from(([127, 0, 0, 1], port))])
    }

    /// Answers every name with 127.0.0.2, after 300 ms.
    #[allow(clippy::disallowed_methods)]
    fn each_300ms(_: &str, port: u16) -> std::io::Result<Vec<SocketAddr>> {
        std::thread::sleep(Duration::from_millis(300));
        Ok(vec![SocketAddr::from(([127, 0, 0, 2], port))])
    }

    fn answers_at_once(_: &str, port: u16) -> std::io::Result<Vec<SocketAddr>> {
        Ok(vec![SocketAddr::from(([127, 0, 0, 3], port))])
    }

    fn with_names(names: &[&str], timeout: &str) -> Generation {
        let eps: Vec<String> = names.iter().map(|n| format!("\"{n}:80\"")).collect();
        let text = format!(
            "dns_timeout = \"{timeout}\"\n[[listeners]]\naddress = \"127.0.0.1:0\"\n\
             [[upstreams]]\nname = \"up\"\nendpoints = [{}]\n\
             [[routes]]\npath_prefix = \"/\"\nproxy = \"up\"\n",
            eps.join(", ")
        );
        compile(&text, "t").unwrap()
    }

    #[test]
    fn reload_requests_queued_together_are_served_by_one_reload_and_trims_by_the_loop() {
        let dir = std::env::temp_dir().join(format!("ringway-merge-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ringway.toml");
        let text = "[[listeners]]\naddress = \"127.0.0.1:0\"\n";
        std::fs::write(&path, text).unwrap();
        let gen = Arc::new(compile(text, &path.display().to_string()).unwrap());
        let book = StateBook::new(None, 1);
        let published = Published::new(1, gen, Vec::new(), &book);
        let shared = Arc::new(Shared::new(
            1,
            published,
            crate::shared::DriverKind::Epoll,
            None,
        ));
        let control = Control::new(shared.clone(), Vec::new(), 1 << 20, &[]);
        let (tx, rx) = std::sync::mpsc::channel();
        let mut replies = Vec::new();
        for _ in 0..20 {
            let (reply, answer) = std::sync::mpsc::channel();
            tx.send(Command::Reload { reply: Some(reply) }).unwrap();
            replies.push(answer);
        }
        let (logs, logged) = std::sync::mpsc::channel();
        tx.send(Command::ReopenLogs { reply: Some(logs) }).unwrap();
        // A worker's request to give freed memory back is served by the loop too.
        shared.trim_wanted.store(true, Ordering::Release);
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = stop.clone();
            std::thread::spawn(move || run(control, rx, stop))
        };
        for answer in replies {
            let got = answer.recv_timeout(Duration::from_secs(10)).unwrap();
            assert_eq!(got, Ok(2));
        }
        // The command taken off the line while merging is still served.
        let reopened = logged.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(reopened, Ok(()));
        stop.store(true, Ordering::Release);
        thread.join().unwrap();
        assert_eq!(shared.reloads_ok.load(Ordering::Relaxed), 1);
        assert!(!shared.trim_wanted.load(Ordering::Acquire));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_name_whose_lookup_still_waits_is_not_looked_up_again() {
        let gen = with_names(&["stuck.test"], "200ms");
        let book = StateBook::new(None, 1);
        let e = resolve(&gen, &book, None, true, slow_for_one).unwrap_err();
        assert!(e.contains("dns_timeout"), "{e}");
        // The first lookup's thread still waits: no second one for the same name.
        let started = Instant::now();
        let e = resolve(&gen, &book, None, true, slow_for_one).unwrap_err();
        assert!(e.contains("still waits"), "{e}");
        assert!(started.elapsed() < Duration::from_millis(150));
    }

    #[test]
    fn names_are_looked_up_at_once_not_one_after_another() {
        let names: Vec<String> = (0..10).map(|i| format!("n{i}.test")).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let gen = with_names(&names, "2s");
        let book = StateBook::new(None, 1);
        let started = Instant::now();
        let table = resolve(&gen, &book, None, true, each_300ms).unwrap();
        assert_eq!(table[0].len(), 10);
        assert!(table[0]
            .iter()
            .all(|e| e.addr.ip().to_string() == "127.0.0.2"));
        // One after another: 3 s.
        assert!(
            started.elapsed() < Duration::from_millis(1500),
            "{:?}",
            started.elapsed()
        );
    }

    #[test]
    fn a_name_without_an_answer_in_time_fails_the_load_or_keeps_its_last_answer() {
        let gen = Arc::new(with_names(&["a.test", "slow.test"], "200ms"));
        let book = StateBook::new(None, 1);
        let before = resolve(&gen, &book, None, true, answers_at_once).unwrap();
        let previous = Published::new(1, gen.clone(), before, &book);
        // A load with nothing to fall back on is refused, within dns_timeout.
        let started = Instant::now();
        let e = resolve(&gen, &book, None, true, slow_for_one).unwrap_err();
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{:?}",
            started.elapsed()
        );
        assert!(
            e.contains("slow.test:80") && e.contains("dns_timeout"),
            "{e}"
        );
        // With the answers in force, the slow name keeps its own and the other is renewed
        // (the slow name's lookup from above, still waiting, is not started again).
        let started = Instant::now();
        let table = resolve(&gen, &book, Some(&previous), true, slow_for_one).unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{:?}",
            started.elapsed()
        );
        let got: Vec<(&str, String)> = table[0]
            .iter()
            .map(|e| (&*e.authority, e.addr.ip().to_string()))
            .collect();
        assert_eq!(
            got,
            [
                ("a.test:80", "127.0.0.1".to_string()),
                ("slow.test:80", "127.0.0.3".to_string())
            ]
        );
    }

    #[test]
    fn dns_answers_are_not_published_over_a_reload_that_came_meanwhile() {
        let gen = Arc::new(
            crate::config::compile("[[listeners]]\naddress = \"127.0.0.1:0\"\n", "t").unwrap(),
        );
        let book = StateBook::new(None, 1);
        let published = |n| Published::new(n, gen.clone(), Vec::new(), &book);
        let shared = Shared::new(1, published(1), crate::shared::DriverKind::Epoll, None);
        // The DNS thread loads generation 1 and resolves; a reload publishes generation 2.
        let seen = shared.published.load_full();
        shared.publish(published(2));
        let version = shared.version.load(Ordering::Acquire);
        assert!(!shared.publish_over(&seen, published(1)));
        assert_eq!(shared.generation(), 2);
        assert_eq!(shared.version.load(Ordering::Acquire), version);
        // Over the generation it resolved for, the answers are published.
        let seen = shared.published.load_full();
        assert!(shared.publish_over(&seen, published(2)));
        assert!(!Arc::ptr_eq(&seen, &shared.published.load_full()));
        assert_eq!(shared.version.load(Ordering::Acquire), version + 1);
    }

    #[test]
    fn a_reload_keeps_what_needs_a_restart() {
        const BASE: &str = "[[listeners]]\naddress = \"127.0.0.1:0\"\n";
        let old = crate::config::compile(&format!("workers = 1\n{BASE}"), "t").unwrap();
        // The head blocks the workers started with (16 KiB head limit).
        let blocks = (old.http.limits.max_head_bytes + crate::worker::ctx::HEAD_SLACK_BYTES)
            .next_multiple_of(4096)
            .max(16 * 1024);
        let grown = "[http]\nmax_head_bytes = 65536\n";
        let mut gen = crate::config::compile(&format!("workers = 2\n{BASE}{grown}"), "t").unwrap();
        assert_eq!(gen.http2.max_header_list_bytes, 65536);
        let kept = keep_running_values(&mut gen, &old, blocks);
        assert_eq!(kept.len(), 2, "{kept:?}");
        assert_eq!(gen.workers, old.workers);
        assert_eq!(
            gen.http.limits.max_head_bytes,
            old.http.limits.max_head_bytes
        );
        // The HTTP/2 header list limit followed the head limit: it goes back with it.
        assert_eq!(
            gen.http2.max_header_list_bytes as usize,
            old.http.limits.max_head_bytes
        );
        // Set apart from the head limit, it stays as set within the head limit kept, and is
        // cut to it beyond.
        for (set, runs) in [(8192, 8192), (32768, 16384)] {
            let apart =
                format!("workers = 1\n{BASE}{grown}[http2]\nmax_header_list_bytes = {set}\n");
            let mut gen = crate::config::compile(&apart, "t").unwrap();
            assert_eq!(keep_running_values(&mut gen, &old, blocks).len(), 1);
            assert_eq!(gen.http2.max_header_list_bytes, runs);
        }
        // Within the blocks, a new head limit applies.
        let small = format!("workers = 1\n{BASE}[http]\nmax_head_bytes = 8192\n");
        let mut gen = crate::config::compile(&small, "t").unwrap();
        assert!(keep_running_values(&mut gen, &old, blocks).is_empty());
        assert_eq!(gen.http.limits.max_head_bytes, 8192);
        assert_eq!(gen.http2.max_header_list_bytes, 8192);
    }

    #[test]
    fn literals_and_localhost_resolve() {
        let gen = crate::config::compile(
            "[[listeners]]\naddress = \"127.0.0.1:0\"\n[[upstreams]]\nname = \"a\"\nendpoints = [\"127.0.0.1:9\", \"localhost:80\"]\n",
            "t",
        )
        .unwrap();
        let book = StateBook::new(None, 1);
        let table = resolve_all(&gen, &book).unwrap();
        assert!(table[0].len() >= 2);
        assert_eq!(table[0][0].addr, "127.0.0.1:9".parse().unwrap());
        assert!(table[0].iter().any(|e| &*e.authority == "localhost:80"));
        let published = Published::new(1, Arc::new(gen.clone()), table.clone(), &book);
        let again = resolve(&gen, &book, Some(&published), false, system_lookup).unwrap();
        assert_eq!(again, table);
        // State is kept by address across a refresh.
        let book2 = StateBook::new(Some(&published), 1);
        let third = resolve(&gen, &book2, Some(&published), false, system_lookup).unwrap();
        assert!(Arc::ptr_eq(&third[0][0].state, &table[0][0].state));
        assert!(Arc::ptr_eq(&book2.upstream("a"), &published.upstreams[0]));
    }

    #[test]
    fn a_drained_name_keeps_its_drain_for_addresses_dns_adds() {
        let gen = crate::config::compile(
            "[[listeners]]\naddress = \"127.0.0.1:0\"\n[[upstreams]]\nname = \"a\"\nendpoints = [\"api.internal:80\", \"web.internal:80\"]\n",
            "t",
        )
        .unwrap();
        let book = StateBook::new(None, 1);
        let (api, web): (Arc<str>, Arc<str>) =
            (Arc::from("api.internal:80"), Arc::from("web.internal:80"));
        let endpoint = |book: &StateBook<'_>, addr: &str, authority: &Arc<str>| {
            let addr = addr.parse().unwrap();
            ResolvedEndpoint {
                addr,
                state: book.endpoint("a", addr, authority, false),
                authority: authority.clone(),
                weight: 1,
            }
        };
        let table = vec![vec![
            endpoint(&book, "10.0.0.1:80", &api),
            endpoint(&book, "10.0.0.2:80", &api),
            endpoint(&book, "10.0.1.1:80", &web),
            endpoint(&book, "10.0.1.2:80", &web),
        ]];
        // The operator drains the name `api.internal:80` (both addresses) and one address
        // of `web.internal:80`.
        for e in &table[0][..3] {
            e.state.drained.store(true, Ordering::Relaxed);
        }
        let published = Published::new(1, Arc::new(gen), table, &book);
        let book2 = StateBook::new(Some(&published), 1);
        assert!(endpoint(&book2, "10.0.0.3:80", &api)
            .state
            .drained
            .load(Ordering::Relaxed));
        assert!(!endpoint(&book2, "10.0.1.3:80", &web)
            .state
            .drained
            .load(Ordering::Relaxed));
        let other: Arc<str> = Arc::from("new.internal:80");
        assert!(!endpoint(&book2, "10.0.2.1:80", &other)
            .state
            .drained
            .load(Ordering::Relaxed));
    }

    #[test]
    fn unresolvable_name_is_an_error_at_start_and_stale_after() {
        let gen = crate::config::compile(
            "[[listeners]]\naddress = \"127.0.0.1:0\"\n[[upstreams]]\nname = \"a\"\nendpoints = [\"no-such-host.invalid:80\"]\n",
            "t",
        )
        .unwrap();
        let book = StateBook::new(None, 1);
        assert!(resolve_all(&gen, &book)
            .unwrap_err()
            .contains("no-such-host.invalid"));
        let authority: Arc<str> = Arc::from("no-such-host.invalid:80");
        let addr = "10.0.0.1:80".parse().unwrap();
        let previous = vec![vec![ResolvedEndpoint {
            addr,
            state: book.endpoint("a", addr, &authority, false),
            authority,
            weight: 1,
        }]];
        let published = Published::new(1, Arc::new(gen.clone()), previous.clone(), &book);
        // A refresh and a reload both keep the last answer ...
        assert_eq!(
            resolve(&gen, &book, Some(&published), false, system_lookup).unwrap(),
            previous
        );
        assert_eq!(
            resolve(&gen, &book, Some(&published), true, system_lookup).unwrap(),
            previous
        );
        // ... which a reload adding a name that does not resolve does not have.
        let added = crate::config::compile(
            "[[listeners]]\naddress = \"127.0.0.1:0\"\n[[upstreams]]\nname = \"a\"\nendpoints = [\"no-such-host.invalid:80\", \"other.invalid:80\"]\n",
            "t",
        )
        .unwrap();
        let e = resolve(&added, &book, Some(&published), true, system_lookup).unwrap_err();
        assert!(e.contains("other.invalid"), "{e}");
        let lenient = resolve(&added, &book, Some(&published), false, system_lookup).unwrap();
        assert_eq!(lenient, previous);
        // Refresh after failed refresh: what is kept does not grow.
        let mut last = previous.clone();
        for round in 2..5 {
            let p = Published::new(round, Arc::new(gen.clone()), last.clone(), &book);
            last = resolve(&gen, &book, Some(&p), false, system_lookup).unwrap();
            assert_eq!(last, previous, "round {round}");
        }
    }
}
