//! Steady state allocates nothing: a counting global allocator counts heap allocations made on
//! ringway's worker threads while 10,000 keep-alive requests are proxied (after a warm-up), and
//! reports allocations per request.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

mod support;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use support::*;

struct Counting;

static WORKER_ALLOCS: AtomicU64 = AtomicU64::new(0);

/// Bytes asked for by those allocations (a realloc counts its new size).
static WORKER_BYTES: AtomicU64 = AtomicU64::new(0);

/// The count is process-wide: one test at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

thread_local! {
    /// 1: a ringway worker thread; 2: another thread; 0: not known yet.
    static KIND: Cell<u8> = const { Cell::new(0) };
}

fn on_worker() -> bool {
    KIND.with(|k| {
        if k.get() == 0 {
            // Thread names are set before the thread runs any of our code; reading it does not
            // allocate.
            let worker = std::thread::current()
                .name()
                .is_some_and(|n| n.starts_with("ringway-w"));
            k.set(if worker { 1 } else { 2 });
        }
        k.get() == 1
    })
}

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if on_worker() {
            WORKER_ALLOCS.fetch_add(1, Ordering::Relaxed);
            WORKER_BYTES.fetch_add(layout.size() as u64, Ordering::Relaxed);
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if on_worker() {
            WORKER_ALLOCS.fetch_add(1, Ordering::Relaxed);
            WORKER_BYTES.fetch_add(new_size as u64, Ordering::Relaxed);
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn per_request(c: &mut Client, send: &[u8], n: u64) -> f64 {
    let before = WORKER_ALLOCS.load(Ordering::Relaxed);
    for _ in 0..n {
        c.send(send);
        let r = c.read_response(false).expect("response");
        assert_eq!(r.status, 200);
    }
    let after = WORKER_ALLOCS.load(Ordering::Relaxed);
    (after - before) as f64 / n as f64
}

#[test]
fn proxied_keep_alive_requests_allocate_nothing_in_steady_state() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let origin = Origin::ok("steady");
    let proxy = Proxy::to(origin.addr, "workers = 1\n");
    // The counter works: a new connection (its task, its upstream connection) allocates.
    let before = WORKER_ALLOCS.load(Ordering::Relaxed);
    let mut c = proxy.connect();
    assert_eq!(c.get("/").status, 200);
    assert!(
        WORKER_ALLOCS.load(Ordering::Relaxed) > before,
        "the counter sees worker allocations"
    );
    let get = b"GET /a/b?c=d HTTP/1.1\r\nHost: example.com\r\nUser-Agent: alloc-test\r\nAccept: */*\r\n\r\n";
    let post = b"POST /p HTTP/1.1\r\nHost: example.com\r\nContent-Length: 11\r\n\r\nhello world";
    per_request(&mut c, get, 1000);
    per_request(&mut c, post, 1000);

    let get_rate = per_request(&mut c, get, 10_000);
    let post_rate = per_request(&mut c, post, 10_000);
    println!("allocations per proxied request: GET {get_rate:.4}, POST {post_rate:.4}");
    assert_eq!(get_rate, 0.0, "GET allocates {get_rate} per request");
    assert_eq!(post_rate, 0.0, "POST allocates {post_rate} per request");
}

/// With the access log on, a request's line is built in a reused buffer: what is left is one
/// batch buffer per `buffer_bytes` of lines (64 KiB: about 250 requests).
#[test]
fn the_access_log_allocates_once_per_batch_not_per_request() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = Dir::new("alloc-access-log");
    let log = dir.0.join("access.log");
    let origin = Origin::ok("steady");
    let proxy = Proxy::to(
        origin.addr,
        &format!("workers = 1\n[access_log]\npath = \"{}\"\n", log.display()),
    );
    let mut c = proxy.connect();
    let get = b"GET /a/b?c=d HTTP/1.1\r\nHost: example.com\r\nUser-Agent: alloc-test\r\n\r\n";
    per_request(&mut c, get, 1000);
    let rate = per_request(&mut c, get, 10_000);
    println!("allocations per proxied request with the access log on: {rate:.4}");
    assert!(rate > 0.0 && rate < 0.01, "{rate} per request");
    drop(c);
    drop(proxy);
    let lines = std::fs::read_to_string(&log)
        .expect("the log")
        .lines()
        .count();
    assert_eq!(lines, 11_000, "every request has its line");
}

/// A head declaring a body the route would buffer for retries (up to `buffer_max_bytes`), with
/// no body after it: nothing of the declared size is reserved before the bytes come.
#[test]
fn a_declared_body_is_not_reserved_before_it_comes() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let origin = Origin::ok("ok");
    let proxy = Proxy::start(&format!(
        "workers = 1\n[[upstreams]]\nname = \"up\"\nendpoints = [\"{}\"]\n\
         retries = {{ attempts = 2, buffer_max_bytes = 67108864 }}\n\
         [[routes]]\npath_prefix = \"/\"\nproxy = \"up\"\n",
        origin.addr
    ));
    let mut warm = proxy.connect();
    assert_eq!(warm.get("/").status, 200);
    let before = WORKER_BYTES.load(Ordering::Relaxed);
    let mut held = Vec::new();
    for _ in 0..8 {
        let mut c = proxy.connect();
        c.send(b"PUT /p HTTP/1.1\r\nHost: a\r\nContent-Length: 67108864\r\n\r\nx");
        held.push(c);
    }
    // The worker has read every head (the origin saw none: the bodies are being collected).
    std::thread::sleep(std::time::Duration::from_millis(500));
    let asked = WORKER_BYTES.load(Ordering::Relaxed) - before;
    assert!(asked < 8 << 20, "{asked} bytes asked for by 8 heads");
    drop(held);
}
