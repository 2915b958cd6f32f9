//! Runtime construction and CPU pinning.
//!
//! The driver is chosen once, on the starting thread, as the config's `driver` says. `auto`
//! (the default): io_uring when the kernel offers every operation monoio needs and a
//! full-size ring can be built, else the epoll fallback (logged once);
//! `MONOIO_FORCE_LEGACY_DRIVER=1` forces the fallback (monoio reads it).

use std::io;

use monoio::time::TimeDriver;
use monoio::{IoUringDriver, LegacyDriver, RuntimeBuilder};

use crate::config::{CpuPinning, DriverChoice};
use crate::shared::DriverKind;

/// Submission queue entries per worker ring.
pub const RING_ENTRIES: u32 = 4096;

/// A worker runtime on either driver.
pub type Runtime = monoio::FusionRuntime<TimeDriver<IoUringDriver>, TimeDriver<LegacyDriver>>;

/// Decides the driver for every worker of this process, as the config's `driver` asks:
/// `Auto` takes io_uring when a ring can be built and falls back to epoll (logged); `IoUring`
/// without io_uring is an error (its reason); `Epoll` builds no ring at all.
///
/// The probe runs on a short-lived thread of its own: tearing a ring down queues task work on
/// the thread that created it, which interrupts that thread's blocking calls (`EINTR` on a
/// socket with a receive timeout); the caller must not be that thread.
pub fn choose_driver(choice: DriverChoice) -> Result<DriverKind, String> {
    if choice == DriverChoice::Epoll {
        return Ok(DriverKind::Epoll);
    }
    let probed = std::thread::Builder::new()
        .name("ringway-probe".into())
        .spawn(probe_uring)
        .map_err(|e| NoUring::Failed(format!("cannot start the io_uring probe: {e}")))
        .and_then(|h| {
            h.join()
                .unwrap_or_else(|_| Err(NoUring::Failed("the io_uring probe panicked".into())))
        });
    match probed {
        Ok(()) => Ok(DriverKind::IoUring),
        Err(reason) if choice == DriverChoice::IoUring => {
            Err(format!("driver = \"io_uring\", but {reason}"))
        }
        Err(reason @ NoUring::Unavailable) => {
            tracing::info!(%reason, "workers use the epoll driver");
            Ok(DriverKind::Epoll)
        }
        Err(reason) => {
            tracing::warn!(%reason, "workers use the epoll driver");
            Ok(DriverKind::Epoll)
        }
    }
}

/// Why io_uring workers cannot run here.
#[derive(Debug)]
enum NoUring {
    /// Absent or turned off: a choice, not a fault.
    Unavailable,
    /// Present, but no ring could be had.
    Failed(String),
}

impl std::fmt::Display for NoUring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NoUring::Unavailable => f.write_str(
                "io_uring is unavailable or disabled (kernel, seccomp, \
                 kernel.io_uring_disabled or MONOIO_FORCE_LEGACY_DRIVER)",
            ),
            NoUring::Failed(e) => f.write_str(e),
        }
    }
}

/// Whether io_uring workers can run here.
fn probe_uring() -> Result<(), NoUring> {
    if !monoio::utils::detect_uring() {
        return Err(NoUring::Unavailable);
    }
    build(DriverKind::IoUring)
        .map(drop)
        .map_err(|e| NoUring::Failed(format!("an io_uring ring cannot be built: {e}")))
}

/// Builds a runtime on `driver`, with timers, to run on the calling thread (whose deadline
/// driver, if an earlier runtime left one, is forgotten: `deadline::reset_thread`).
pub fn build(driver: DriverKind) -> io::Result<Runtime> {
    super::deadline::reset_thread();
    Ok(match driver {
        DriverKind::IoUring => {
            // SINGLE_ISSUER: only the worker thread submits. COOP_TASKRUN: completions are run
            // at the worker's next transition into the kernel instead of interrupting it.
            // Measured (small body, 64 connections, 5 interleaved rounds): median CPU per request
            // 15.8 us without, 12.6 us with. DEFER_TASKRUN: completions are run only when the
            // worker waits for them (it parks when its run queue is empty), in one batch:
            // 2-4% less CPU per request on TLS (https64 13.53 against 13.84 us, h2 over TLS
            // 12.06 against 12.55 us), equal on plain HTTP/1.1 and h2c, lower p99 throughout
            // (later whole-session runs put it within the noise: loadtest/RESULTS.md).
            // Kernels refuse flags they do not know (DEFER_TASKRUN before 6.1, the others
            // before 6.0): each refusal drops the newest flag.
            let mut refused = io::Error::other("no io_uring ring");
            for flags in [Flags::Defer, Flags::Coop, Flags::Plain] {
                match uring_runtime(flags.builder()) {
                    Ok(rt) => return Ok(rt),
                    Err(e) => refused = e,
                }
            }
            return Err(refused);
        }
        DriverKind::Epoll => RuntimeBuilder::<LegacyDriver>::new()
            .enable_timer()
            .build()?
            .into(),
    })
}

/// The io_uring setup flags tried, best first.
#[derive(Debug, Clone, Copy)]
enum Flags {
    /// COOP_TASKRUN, SINGLE_ISSUER and DEFER_TASKRUN (Linux 6.1).
    Defer,
    /// COOP_TASKRUN and SINGLE_ISSUER (Linux 6.0).
    Coop,
    /// None.
    Plain,
}

impl Flags {
    fn builder(self) -> io_uring::Builder {
        let mut b = io_uring::IoUring::builder();
        match self {
            Flags::Defer => {
                b.setup_coop_taskrun()
                    .setup_single_issuer()
                    .setup_defer_taskrun();
            }
            Flags::Coop => {
                b.setup_coop_taskrun().setup_single_issuer();
            }
            Flags::Plain => {}
        }
        b
    }
}

fn uring_runtime(urb: io_uring::Builder) -> io::Result<Runtime> {
    Ok(RuntimeBuilder::<IoUringDriver>::new()
        .enable_timer()
        .with_entries(RING_ENTRIES)
        .uring_builder(urb)
        .build()?
        .into())
}

/// Pins the calling thread for worker `index` as `pinning` says. Returns the CPU pinned to.
pub fn pin(index: usize, pinning: &CpuPinning) -> Option<usize> {
    let available = core_affinity::get_core_ids().unwrap_or_default();
    let wanted = match pinning {
        CpuPinning::Off => return None,
        CpuPinning::PerWorker => available.get(index % available.len().max(1))?.id,
        CpuPinning::List(cpus) => *cpus.get(index % cpus.len().max(1))?,
    };
    let core = available.into_iter().find(|c| c.id == wanted)?;
    core_affinity::set_for_current(core).then_some(wanted)
}

/// Spawns a task whose future is large (a connection's or a stream's whole request path,
/// several KiB): the future is built in a heap block of its own and the task holds only the
/// pointer. `monoio::spawn` moves the future it is given into the task's allocation, and a
/// large one costs two full copies per spawn that way (into the task cell, then the cell
/// onto the heap): at tens of thousands of HTTP/2 streams a second, about 2% of the CPU.
/// Kept out of line: inlined into its caller (a profile-guided build did so), the future
/// came back into the caller's frame and was copied into the box whole.
#[inline(never)]
pub fn spawn_large<F>(make: impl FnOnce() -> F)
where
    F: std::future::Future + 'static,
    F::Output: 'static,
{
    // Written through the uninitialized box. When `make` calls a function that is not
    // inlined (see `h2::stream_task`), that call writes the future straight into the box;
    // an inlined one builds it on the stack first and the write copies it whole.
    let mut slot = Box::<F>::new_uninit();
    slot.write(make());
    // SAFETY: `slot` was initialized by the write just above.
    let fut = Box::into_pin(unsafe { slot.assume_init() });
    drop(monoio::spawn(Isolated(Some(fut))));
}

/// Spawns a task whose panic ends only that task (see [`Isolated`]); its handle.
pub fn spawn_isolated<F>(fut: F) -> monoio::task::JoinHandle<()>
where
    F: std::future::Future + 'static,
    F::Output: 'static,
{
    monoio::spawn(Isolated(Some(Box::pin(fut))))
}

/// A task that keeps a panic to itself. monoio does not catch panics in tasks: one unwinds
/// out of the worker's event loop and ends the worker thread, whose tasks are never freed
/// and whose SO_REUSEPORT listener keeps taking its share of new connections with no one to
/// accept them. Here the panic ends the task instead (its future is dropped, closing what
/// it held, such as its connection), is logged, and the worker serves on.
struct Isolated<F>(Option<std::pin::Pin<Box<F>>>);

impl<F: std::future::Future> std::future::Future for Isolated<F> {
    type Output = ();

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        use std::panic::{catch_unwind, AssertUnwindSafe};
        let Some(fut) = self.0.as_mut() else {
            return std::task::Poll::Ready(());
        };
        // Unwind safety: after a panic the future is only dropped, never polled again.
        match catch_unwind(AssertUnwindSafe(|| fut.as_mut().poll(cx))) {
            Ok(std::task::Poll::Pending) => std::task::Poll::Pending,
            Ok(std::task::Poll::Ready(_)) => {
                #[cfg(feature = "footprint")]
                footprint::count(&**fut);
                self.0 = None;
                std::task::Poll::Ready(())
            }
            Err(panic) => {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                tracing::error!(panic = %what, "a task panicked; it was ended, the worker goes on");
                let fut = self.0.take();
                // A destructor that panics too is kept to this task as well.
                let _ = catch_unwind(AssertUnwindSafe(move || drop(fut)));
                std::task::Poll::Ready(())
            }
        }
    }
}

/// What a task's run writes of its future (the `footprint` feature, a diagnostic build; see
/// `loadtest/footprint.sh`). A stream's future is 7-8 KiB; with hundreds of streams in
/// flight, the lines each one writes are what stays out of the caches between its polls.
#[cfg(feature = "footprint")]
pub mod footprint {
    use std::cell::RefCell;

    /// What a fresh block in the measured range is filled with.
    const MARK: u8 = 0xA5;

    /// The block sizes measured: task futures (a stream's, a connection's), not I/O blocks.
    const SIZES: std::ops::Range<usize> = 4096..16384;

    /// Fills a fresh block of `size` bytes in the measured range with [`MARK`].
    ///
    /// # Safety
    /// `block` is null or points to `size` writable bytes.
    pub unsafe fn mark(block: *mut u8, size: usize) {
        if !block.is_null() && SIZES.contains(&size) {
            // SAFETY: the caller's guarantee.
            unsafe { std::ptr::write_bytes(block, MARK, size) };
        }
    }

    /// Per future type: tasks ended, their written lines and bytes summed, and per line how
    /// many tasks wrote it.
    struct Tally {
        name: &'static str,
        size: usize,
        tasks: u64,
        lines: u64,
        bytes: u64,
        per_line: Vec<u64>,
    }

    /// A worker's tallies, printed to stderr when its thread ends (ringway stopped).
    struct Tallies(RefCell<Vec<Tally>>);

    impl Drop for Tallies {
        fn drop(&mut self) {
            for t in self.0.borrow().iter() {
                let n = t.tasks.max(1);
                let map: String = t
                    .per_line
                    .iter()
                    .map(|&w| match w * 4 / n {
                        _ if w == 0 => '.',
                        0 => ',',
                        1..=2 => '+',
                        _ => '#',
                    })
                    .collect();
                eprintln!(
                    "footprint: {}: {} bytes, {} lines; written per task: {:.1} lines, {} bytes \
                     ({} tasks)\nfootprint map: {map}",
                    t.name,
                    t.size,
                    t.size.div_ceil(64),
                    t.lines as f64 / n as f64,
                    t.bytes / n,
                    t.tasks,
                );
            }
        }
    }

    thread_local! {
        static TALLIES: Tallies = const { Tallies(RefCell::new(Vec::new())) };
    }

    /// Counts what an ended task wrote of its future `fut` (heap-allocated through the global
    /// allocator, so marked if its size is in range).
    pub fn count<F>(fut: &F) {
        let size = std::mem::size_of::<F>();
        if !SIZES.contains(&size) {
            return;
        }
        let base = std::hint::black_box(fut as *const F).cast::<u8>();
        // Volatile reads, byte by byte: some of these bytes are padding or state no variant
        // in use holds (the marker, or what a former variant left), which the program never
        // reads; the compiler must not assume anything about them here.
        let bytes: Vec<u8> = (0..size)
            // SAFETY: `i < size`, inside the future's own allocation.
            .map(|i| unsafe { std::ptr::read_volatile(base.add(i)) })
            .collect();
        let name = std::any::type_name::<F>();
        TALLIES.with(|t| {
            let mut t = t.0.borrow_mut();
            let i = match t.iter().position(|x| x.name == name) {
                Some(i) => i,
                None => {
                    t.push(Tally {
                        name,
                        size,
                        tasks: 0,
                        lines: 0,
                        bytes: 0,
                        per_line: vec![0; size.div_ceil(64)],
                    });
                    t.len() - 1
                }
            };
            let tally = &mut t[i];
            tally.tasks += 1;
            for (line, chunk) in bytes.chunks(64).enumerate() {
                let written = chunk.iter().filter(|&&b| b != MARK).count() as u64;
                if written > 0 {
                    tally.lines += 1;
                    tally.bytes += written;
                    tally.per_line[line] += 1;
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::rc::Rc;

    #[test]
    fn a_panicking_task_ends_alone() {
        let mut rt = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
            .enable_timer()
            .build()
            .unwrap();
        let survived = rt.block_on(async {
            let done = Rc::new(Cell::new(0));
            let crashed = spawn_isolated(async {
                monoio::time::sleep(std::time::Duration::from_millis(1)).await;
                panic!("a bug in one connection's task");
            });
            let d = done.clone();
            spawn_large(move || async move {
                monoio::time::sleep(std::time::Duration::from_millis(5)).await;
                d.set(d.get() + 1);
            });
            let d = done.clone();
            spawn_large(move || async move {
                if d.get() == 0 {
                    panic!("another, in a task built in place");
                }
            });
            crashed.await;
            monoio::time::sleep(std::time::Duration::from_millis(20)).await;
            done.get()
        });
        assert_eq!(survived, 1, "the other task ran to its end");
    }
}
