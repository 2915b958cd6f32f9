//! Log setup: tracing to stderr, filtered by `RUST_LOG` when set, else by the config's
//! `log_level`.
//!
//! Lines go to stderr through a writer thread, never from a worker: a stderr nobody reads (a
//! stalled log driver, a pipe whose reader stopped) would otherwise block the worker writing
//! a warning in the middle of its loop, and with it every connection on its core, just when
//! an upstream failing floods warnings. When the writer falls [`BACKLOG_LINES`] behind, lines
//! are dropped instead.

use std::sync::atomic::{AtomicPtr, Ordering};

/// Lines queued for the writer thread at most; beyond, new ones are dropped.
pub const BACKLOG_LINES: usize = 16_384;

/// The writer thread's guard, set once by [`init`], taken by [`flush`].
static GUARD: AtomicPtr<tracing_appender::non_blocking::WorkerGuard> =
    AtomicPtr::new(std::ptr::null_mut());

/// Installs the global subscriber once; later calls (tests start many servers) do nothing.
pub fn init(default_level: &str) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let filter = match std::env::var("RUST_LOG") {
            Ok(v) if !v.is_empty() => tracing_subscriber::EnvFilter::new(v),
            _ => tracing_subscriber::EnvFilter::new(default_level),
        };
        let (writer, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
            .lossy(true)
            .buffered_lines_limit(BACKLOG_LINES)
            .thread_name("ringway-log")
            .finish(std::io::stderr());
        let installed = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(writer)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_target(false)
            .try_init()
            .is_ok();
        if installed {
            GUARD.store(Box::into_raw(Box::new(guard)), Ordering::Release);
        }
    });
}

/// Writes out the lines still queued and stops the writer thread (the process is about to
/// exit: later lines are lost).
pub fn flush() {
    let guard = GUARD.swap(std::ptr::null_mut(), Ordering::AcqRel);
    if !guard.is_null() {
        // SAFETY: the pointer came from `Box::into_raw` in `init`, stored once; the swap
        // takes it out, so it is turned back into a box exactly once.
        let guard = unsafe { Box::from_raw(guard) };
        // The guard waits for the writer (at most about a second) and, when the queue is full
        // (a stderr that stalled), says so with `println!`, which panics on a closed stdout:
        // an exit is not to be turned into a crash for that.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(guard)));
    }
}
