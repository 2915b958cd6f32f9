//! The `ringway` binary: arguments → config → server; no logic of its own.

use std::alloc::GlobalAlloc;
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
///
/// mimalloc is asked for plain blocks only (`mi_malloc`: 8-byte aligned). A small block with
/// a larger alignment (16, or 128 for a task whose future holds one of monoio's timers: one
/// per HTTP/2 stream) is cut from a larger plain block here. mimalloc's aligned entry point
/// over-allocates for every block above 1 KiB whose size class is not a power of two, even at
/// 8-byte alignment, at about 300 instructions a block, and marks the block's page so that
/// each later free on it takes the slow path.
struct Allocator;

/// Allocations of at least this many bytes go to the system allocator.
const LARGE: usize = 16 * 1024;

/// The alignment of every block from either allocator (glibc's is 16).
const PLAIN_ALIGN: usize = 8;

/// The sizes of mimalloc's two largest small size classes (7 to 8 KiB and 8 to 10 KiB), which
/// it keeps only 7 and 6 to a 64 KiB page. A pool of such blocks that fills and drains empties
/// a page every few frees, and mimalloc gives an empty page back to its arena unless it is the
/// last of its class: each HTTP/2 stream's task (about 8 KiB) paid that churn, 21,000 pages
/// in 200,000 requests at 160 concurrent streams. They are asked for as [`FEW_PER_PAGE_AS`]
/// bytes instead: the smallest medium size class (12 KiB), 42 to a 512 KiB page.
const FEW_PER_PAGE: std::ops::RangeInclusive<usize> = 7 * 1024 + 1..=10 * 1024;

/// What a size in [`FEW_PER_PAGE`] is asked of mimalloc as.
const FEW_PER_PAGE_AS: usize = 10 * 1024 + 1;

/// The size mimalloc is asked for to hold `size` bytes.
fn mi_size(size: usize) -> usize {
    if FEW_PER_PAGE.contains(&size) {
        FEW_PER_PAGE_AS
    } else {
        size
    }
}

/// How a block of a layout is allocated and freed.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Path {
    /// A plain block from the side its size picks ([`alloc_plain`]).
    Plain,
    /// Small and aligned above [`PLAIN_ALIGN`]: cut from a larger plain block
    /// ([`alloc_over_aligned`]).
    OverAligned,
    /// Large and aligned above [`PLAIN_ALIGN`]: the system allocator's own aligned path.
    SystemAligned,
}

/// The path of `layout`; the same layout takes the same path back in `dealloc`.
fn path(layout: std::alloc::Layout) -> Path {
    if layout.align() <= PLAIN_ALIGN {
        Path::Plain
    } else if layout.size() < LARGE {
        Path::OverAligned
    } else {
        Path::SystemAligned
    }
}

/// The plain block that holds an over-aligned `layout`: room for the alignment, and for the
/// pointer to the block's start kept just below the aligned address. `None` past `isize`.
fn outer_layout(layout: std::alloc::Layout) -> Option<std::alloc::Layout> {
    let size = layout.size().checked_add(layout.align())?;
    std::alloc::Layout::from_size_align(size, PLAIN_ALIGN).ok()
}

/// A plain block of `layout` (alignment at most [`PLAIN_ALIGN`]) from the side its size picks.
///
/// # Safety
/// `layout` has a non-zero size.
unsafe fn alloc_plain(layout: std::alloc::Layout, zeroed: bool) -> *mut u8 {
    if layout.size() >= LARGE {
        // SAFETY: the caller's guarantee, passed on.
        return unsafe {
            if zeroed {
                std::alloc::System.alloc_zeroed(layout)
            } else {
                std::alloc::System.alloc(layout)
            }
        };
    }
    // SAFETY: plain C allocation calls; mimalloc's blocks are 8-byte aligned at least.
    unsafe {
        if zeroed {
            libmimalloc_sys::mi_zalloc(mi_size(layout.size())).cast()
        } else {
            libmimalloc_sys::mi_malloc(mi_size(layout.size())).cast()
        }
    }
}

/// Frees a block [`alloc_plain`] gave out for `layout`.
///
/// # Safety
/// `ptr` came from `alloc_plain(layout, _)` (or a resize on the same side) and is not used
/// again.
unsafe fn dealloc_plain(ptr: *mut u8, layout: std::alloc::Layout) {
    if layout.size() >= LARGE {
        // SAFETY: the system allocator gave out `ptr` for this layout.
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    } else {
        // SAFETY: mimalloc gave out `ptr`.
        unsafe { libmimalloc_sys::mi_free(ptr.cast()) }
    }
}

/// Allocates an over-aligned `layout` from a plain block of [`outer_layout`].
///
/// # Safety
/// `layout` has a non-zero size and takes [`Path::OverAligned`].
unsafe fn alloc_over_aligned(layout: std::alloc::Layout, zeroed: bool) -> *mut u8 {
    let Some(outer) = outer_layout(layout) else {
        return std::ptr::null_mut();
    };
    // SAFETY: `outer` has a non-zero size (more than `layout.align()`).
    let base = unsafe { alloc_plain(outer, zeroed) };
    if base.is_null() {
        return base;
    }
    // The first aligned address past `base`: `base` is 8-aligned and the alignment a power
    // of two above 8, so it is 8 to `align` bytes in, and `size` bytes from it end inside
    // the block.
    let offset = layout.align() - (base as usize & (layout.align() - 1));
    // SAFETY: `offset` is at most `layout.align()`, inside the block; the 8 bytes below the
    // aligned address are inside it too (at least 8 in), and 8-aligned.
    unsafe {
        let aligned = base.add(offset);
        aligned.cast::<*mut u8>().sub(1).write(base);
        aligned
    }
}

/// Frees what [`alloc_over_aligned`] gave out for `layout`.
///
/// # Safety
/// `ptr` came from `alloc_over_aligned(layout, _)` and is not used again.
unsafe fn dealloc_over_aligned(ptr: *mut u8, layout: std::alloc::Layout) {
    // SAFETY: the allocation succeeded, so `outer_layout` did too; the start of the block was
    // written just below `ptr` then.
    unsafe {
        let outer = outer_layout(layout).unwrap_unchecked();
        let base = ptr.cast::<*mut u8>().sub(1).read();
        dealloc_plain(base, outer);
    }
}

/// A block for `layout` (zeroed or not) by the path its size and alignment pick; `dealloc`
/// takes the same path back.
///
/// # Safety
/// `layout` has a non-zero size.
unsafe fn allocate(layout: std::alloc::Layout, zeroed: bool) -> *mut u8 {
    // SAFETY: the caller's guarantee; each path gets the layouts it serves.
    unsafe {
        match path(layout) {
            Path::Plain => alloc_plain(layout, zeroed),
            Path::OverAligned => alloc_over_aligned(layout, zeroed),
            Path::SystemAligned if zeroed => std::alloc::System.alloc_zeroed(layout),
            Path::SystemAligned => std::alloc::System.alloc(layout),
        }
    }
}

// SAFETY: every block comes from one of two allocators chosen by the layout's size alone (the
// outer block's size for an over-aligned one), so memory is always returned to (and resized
// by) the allocator that gave it out; an over-aligned block is found again by the pointer
// kept below it; a resize that changes the side or is over-aligned allocates, copies and
// frees.
unsafe impl GlobalAlloc for Allocator {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        // SAFETY: the caller's guarantee of a non-zero size, passed on.
        let block = unsafe { allocate(layout, false) };
        #[cfg(feature = "footprint")]
        // SAFETY: `block` is null or a fresh block of `layout.size()` bytes.
        unsafe {
            ringway::worker::runtime::footprint::mark(block, layout.size())
        };
        block
    }

    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        // SAFETY: as in `alloc`.
        unsafe { allocate(layout, true) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        // SAFETY: the same layout picked the same path when `ptr` was allocated.
        unsafe {
            match path(layout) {
                Path::Plain => dealloc_plain(ptr, layout),
                Path::OverAligned => dealloc_over_aligned(ptr, layout),
                Path::SystemAligned => std::alloc::System.dealloc(ptr, layout),
            }
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        if path(layout) == Path::Plain && layout.size() < LARGE && new_size < LARGE {
            // SAFETY: mimalloc gave out `ptr`; its resize keeps the 8-byte alignment.
            return unsafe { libmimalloc_sys::mi_realloc(ptr.cast(), mi_size(new_size)).cast() };
        }
        if layout.size() >= LARGE && new_size >= LARGE {
            // SAFETY: the system allocator gave out `ptr` (plain or over-aligned, it keeps
            // the alignment); the caller's guarantees, passed on.
            return unsafe { std::alloc::System.realloc(ptr, layout, new_size) };
        }
        // SAFETY: the caller guarantees that `new_size`, rounded up to the alignment, fits in
        // `isize` (GlobalAlloc::realloc's contract): the layout is valid. `ptr` holds
        // `layout.size()` bytes and the new block `new_size`; they do not overlap, and `ptr`
        // is freed by the path that gave it out.
        unsafe {
            let new_layout =
                std::alloc::Layout::from_size_align_unchecked(new_size, layout.align());
            let new = self.alloc(new_layout);
            if !new.is_null() {
                std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                self.dealloc(ptr, layout);
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

/// SIGTERM, SIGINT, SIGHUP and SIGUSR1, taken from the start: one arriving while the config
/// loads (start-up may resolve names for seconds) waits for the signal thread rather than
/// killing the process (a logrotate signal, say).
fn signals() -> Result<signal_hook::iterator::Signals, ExitCode> {
    signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGHUP,
        signal_hook::consts::SIGUSR1,
    ])
    .map_err(|e| {
        eprintln!("ringway: cannot install signal handlers: {e}");
        ExitCode::FAILURE
    })
}

fn run(gen: Generation, signals: signal_hook::iterator::Signals) -> ExitCode {
    observe::log::init(&gen.log_level);
    let code = serve(gen, signals);
    // (Lines still queued for stderr: see `observe::log`.)
    observe::log::flush();
    code
}

fn serve(gen: Generation, mut signals: signal_hook::iterator::Signals) -> ExitCode {
    let source = gen.source.clone();
    let server = match Server::start(gen) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("ringway: {e}");
            return ExitCode::FAILURE;
        }
    };
    tracing::info!(
        config = %source,
        "serving; SIGHUP reloads, SIGUSR1 reopens the access log, SIGTERM or SIGINT drains and stops"
    );
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
                } else if sig == signal_hook::consts::SIGUSR1 {
                    tracing::info!("SIGUSR1: reopening the access log");
                    reload.reopen_logs();
                } else if first {
                    tracing::info!(signal = sig, "shutting down: draining in-flight requests");
                    handle.shutdown();
                    first = false;
                } else {
                    tracing::warn!(signal = sig, "second signal: exiting now");
                    observe::log::flush();
                    std::process::exit(1);
                }
            }
        });
    // Without the thread that takes them, SIGTERM, SIGINT, SIGHUP and SIGUSR1 would be caught and
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

#[cfg(test)]
mod tests {
    use std::alloc::Layout;

    use super::*;

    /// Fills a block with a pattern of `seed` and the offset.
    fn fill(ptr: *mut u8, len: usize, seed: u8) {
        for i in 0..len {
            // SAFETY: the block holds `len` bytes.
            unsafe { ptr.add(i).write(seed.wrapping_add(i as u8)) };
        }
    }

    fn holds(ptr: *const u8, len: usize, seed: u8) -> bool {
        // SAFETY: the block holds at least `len` bytes.
        (0..len).all(|i| unsafe { ptr.add(i).read() } == seed.wrapping_add(i as u8))
    }

    fn holds_zeros(ptr: *const u8, len: usize) -> bool {
        // SAFETY: the block holds at least `len` bytes.
        (0..len).all(|i| unsafe { ptr.add(i).read() } == 0)
    }

    #[test]
    fn every_block_has_its_alignment_and_room() {
        let a = Allocator;
        for align in [1, 8, 16, 32, 64, 128, 4096] {
            for size in [1, 24, 100, 1000, 8_300, 11_392, LARGE - 1, LARGE, 70_000] {
                let layout = Layout::from_size_align(size, align).unwrap();
                // Several at once, so that neighbours would overwrite each other.
                let blocks: Vec<_> = (0..4u8)
                    .map(|seed| {
                        // SAFETY: `layout` has a non-zero size.
                        let p = unsafe { a.alloc(layout) };
                        assert!(!p.is_null());
                        assert_eq!(p as usize % align, 0, "size {size} align {align}");
                        fill(p, size, seed);
                        (p, seed)
                    })
                    .collect();
                for (p, seed) in blocks {
                    assert!(holds(p, size, seed), "size {size} align {align}");
                    // SAFETY: allocated above with `layout`, freed once.
                    unsafe { a.dealloc(p, layout) };
                }
                // SAFETY: as above.
                let z = unsafe { a.alloc_zeroed(layout) };
                assert_eq!(z as usize % align, 0);
                assert!(holds_zeros(z, size));
                // SAFETY: allocated above with `layout`, freed once.
                unsafe { a.dealloc(z, layout) };
            }
        }
    }

    #[test]
    fn a_resized_block_keeps_its_bytes_and_alignment_across_both_sides() {
        let a = Allocator;
        for align in [8, 16, 128] {
            let mut size = 40;
            let layout = Layout::from_size_align(size, align).unwrap();
            // SAFETY: non-zero size.
            let mut p = unsafe { a.alloc(layout) };
            fill(p, size, 7);
            // Up across the large threshold and back down.
            for new_size in [3_000, 20_000, 90_000, 9_000, 7_000, 64] {
                let old = Layout::from_size_align(size, align).unwrap();
                // SAFETY: `p` holds `old`; `new_size` is non-zero and small.
                p = unsafe { a.realloc(p, old, new_size) };
                assert!(!p.is_null());
                assert_eq!(p as usize % align, 0, "align {align} size {new_size}");
                assert!(
                    holds(p, size.min(new_size), 7),
                    "align {align} size {new_size}"
                );
                size = new_size;
                fill(p, size, 7);
            }
            // SAFETY: `p` holds `size` bytes at `align`.
            unsafe { a.dealloc(p, Layout::from_size_align(size, align).unwrap()) };
        }
    }

    #[test]
    fn blocks_of_few_per_small_page_come_from_the_medium_class() {
        extern "C" {
            // mimalloc's own (its crate declares it behind a feature ringway does not use).
            fn mi_usable_size(p: *const std::ffi::c_void) -> usize;
        }
        let a = Allocator;
        for (size, steered) in [
            (7 * 1024, false),
            (7 * 1024 + 1, true),
            (8_300, true),
            (10 * 1024, true),
            (10 * 1024 + 1, false),
        ] {
            let layout = Layout::from_size_align(size, 8).unwrap();
            // SAFETY: non-zero size.
            let p = unsafe { a.alloc(layout) };
            assert!(!p.is_null());
            fill(p, size, 3);
            // SAFETY: `p` is a live block of mimalloc's (below `LARGE`).
            let usable = unsafe { mi_usable_size(p.cast()) };
            assert_eq!(
                usable > 10 * 1024,
                steered || size > 10 * 1024,
                "size {size}: {usable}"
            );
            assert!(holds(p, size, 3));
            // SAFETY: allocated above with `layout`, freed once.
            unsafe { a.dealloc(p, layout) };
        }
        // A block resized into the range is steered as well.
        let small = Layout::from_size_align(100, 8).unwrap();
        // SAFETY: non-zero size; `p` holds `small`, resized once.
        unsafe {
            let p = a.alloc(small);
            let p = a.realloc(p, small, 9_000);
            assert!(mi_usable_size(p.cast()) > 10 * 1024);
            a.dealloc(p, Layout::from_size_align(9_000, 8).unwrap());
        }
    }
}
