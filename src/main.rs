//! The `ringway` binary: arguments → config → server; no logic of its own.

use std::process::ExitCode;

use ringway::cli::{self, Command, USAGE};
use ringway::config::{self, Generation};
use ringway::{control, observe, Server};

#[global_allocator]
static GLOBAL: Allocator = Allocator;

/// Small allocations from mimalloc, large ones from the system allocator.
///
/// The request path allocates small objects per HTTP/2 stream (tasks, frames, header maps),
/// where mimalloc's per-thread free lists are about 3% of the CPU cheaper than glibc's malloc.
/// Large allocations are the pooled I/O blocks (16 and 64 KiB) and TLS buffers, zeroed at
/// creation: glibc leaves fresh pages untouched (already zero) and only the bytes a
/// connection receives become resident, while mimalloc writes the zeros: every idle
/// keep-alive connection then held its whole head block (33 KiB per idle connection against
/// 18.6). Each side frees what it allocated: the size class decides, and it is fixed by the
/// layout `dealloc` gets back.
struct Allocator;

/// Allocations of at least this many bytes go to the system allocator.
const LARGE: usize = 16 * 1024;

/// The allocator that serves allocations of `size` bytes.
fn side(size: usize) -> &'static dyn std::alloc::GlobalAlloc {
    if size >= LARGE {
        &std::alloc::System
    } else {
        &mimalloc::MiMalloc
    }
}

// SAFETY: every call is forwarded, with the caller's guarantees, to one of two allocators
// chosen by the layout's size alone, so memory is always returned to (and resized by) the
// allocator that gave it out; a resize across the threshold allocates on the other side,
// copies and frees on the first.
unsafe impl std::alloc::GlobalAlloc for Allocator {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        // SAFETY: the caller's guarantees for `layout`, passed on.
        unsafe { side(layout.size()).alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        unsafe { side(layout.size()).alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        // SAFETY: `ptr` came from the same side: its layout's size picked it then too.
        unsafe { side(layout.size()).dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        if (layout.size() >= LARGE) == (new_size >= LARGE) {
            // SAFETY: same side before and after; the caller's guarantees, passed on.
            return unsafe { side(layout.size()).realloc(ptr, layout, new_size) };
        }
        // SAFETY: the caller guarantees that `new_size`, rounded up to the alignment, fits in
        // `isize` (GlobalAlloc::realloc's contract): the layout is valid. `ptr` holds
        // `layout.size()` bytes and the new block `new_size`; they do not overlap, and `ptr`
        // is freed by the side that gave it out.
        unsafe {
            let new_layout =
                std::alloc::Layout::from_size_align_unchecked(new_size, layout.align());
            let new = side(new_size).alloc(new_layout);
            if !new.is_null() {
                std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                side(layout.size()).dealloc(ptr, layout);
            }
            new
        }
    }
}

fn main() -> ExitCode {
    // (`args()` would panic on an argument that is not UTF-8.)
    let args: Result<Vec<String>, _> = std::env::args_os()
        .skip(1)
        .map(std::ffi::OsString::into_string)
        .collect();
    let Ok(args) = args else {
        eprintln!("ringway: arguments must be UTF-8\n\n{USAGE}");
        return ExitCode::from(2);
    };
    let command = match cli::parse(args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("ringway: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match command {
        Command::Version => {
            println!("ringway {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        Command::Help => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        Command::Check { config } => match config::load(&config) {
            Ok(gen) => {
                match control::resolve_all(&gen, &ringway::shared::StateBook::new(None, 1)) {
                    Ok(endpoints) => {
                        print!("{}", config::describe(&gen, Some(&endpoints)));
                        ExitCode::SUCCESS
                    }
                    Err(e) => {
                        eprintln!("{}: {e}", gen.source);
                        ExitCode::FAILURE
                    }
                }
            }
            Err(e) => {
                eprintln!("{e}");
                ExitCode::FAILURE
            }
        },
        Command::Run { config } => match (signals(), config::load(&config)) {
            (Err(code), _) => code,
            (Ok(signals), Ok(gen)) => run(gen, signals),
            (Ok(_), Err(e)) => {
                eprintln!("{e}");
                ExitCode::FAILURE
            }
        },
        Command::Proxy {
            listen,
            upstreams,
            workers,
        } => match (signals(), config::quick_proxy(&listen, &upstreams, workers)) {
            (Err(code), _) => code,
            (Ok(signals), Ok(gen)) => run(gen, signals),
            (Ok(_), Err(e)) => {
                eprintln!("{e}");
                ExitCode::FAILURE
            }
        },
    }
}

/// SIGTERM, SIGINT and SIGHUP, taken from the start: one arriving while the config loads
/// (start-up may resolve names for seconds) waits for the signal thread rather than killing
/// the process (a logrotate SIGHUP, say).
fn signals() -> Result<signal_hook::iterator::Signals, ExitCode> {
    signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGHUP,
    ])
    .map_err(|e| {
        eprintln!("ringway: cannot install signal handlers: {e}");
        ExitCode::FAILURE
    })
}

fn run(gen: Generation, mut signals: signal_hook::iterator::Signals) -> ExitCode {
    observe::log::init(&gen.log_level);
    let source = gen.source.clone();
    let server = match Server::start(gen) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("ringway: {e}");
            return ExitCode::FAILURE;
        }
    };
    tracing::info!(config = %source, "serving; SIGHUP reloads, SIGTERM or SIGINT drains and stops");
    let handle = server.shutdown_handle();
    let reload = server.reload_handle();
    let spawned = std::thread::Builder::new()
        .name("ringway-signals".into())
        .spawn(move || {
            let mut first = true;
            for sig in signals.forever() {
                if sig == signal_hook::consts::SIGHUP {
                    tracing::info!("SIGHUP: reloading the config");
                    reload.reload();
                } else if first {
                    tracing::info!(signal = sig, "shutting down: draining in-flight requests");
                    handle.shutdown();
                    first = false;
                } else {
                    tracing::warn!(signal = sig, "second signal: exiting now");
                    std::process::exit(1);
                }
            }
        });
    // Without the thread that takes them, SIGTERM, SIGINT and SIGHUP would be caught and
    // never acted on: only SIGKILL would stop the process.
    if let Err(e) = spawned {
        eprintln!("ringway: cannot start the signal thread: {e}");
        server.shutdown();
        server.join();
        return ExitCode::FAILURE;
    }
    server.join();
    tracing::info!("stopped");
    ExitCode::SUCCESS
}
