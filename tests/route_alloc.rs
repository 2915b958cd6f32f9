//! Route lookup allocates nothing: 10,000 lookups over a 10,000-route table (exact, template,
//! prefix and regex routes, hits and misses) under a counting allocator.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use ringway::route::{HeaderList, RouteRequest};

struct Counting;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static COUNT: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.with(Cell::get) {
            COUNT.with(|c| c.set(c.get() + 1));
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn lookups_allocate_nothing() {
    let mut text = String::from("[[listeners]]\naddress = \"127.0.0.1:0\"\n");
    let mut paths = Vec::new();
    for i in 0..10_000 {
        let route = match i % 4 {
            0 => {
                paths.push(format!("/exact/{i}"));
                format!("path = \"/exact/{i}\"")
            }
            1 => {
                paths.push(format!("/tpl{i}/x/y"));
                format!("path_template = \"/tpl{i}/{{a}}/{{*rest}}\"")
            }
            2 => {
                paths.push(format!("/pre{i}/z"));
                format!("path_prefix = \"/pre{i}/\"")
            }
            _ => {
                paths.push(format!("/re{i}/77"));
                format!("path_regex = \"/re{i}/[0-9]+\"\npriority = 1\nmethods = [\"GET\"]\nheaders = {{ \"x-a\" = true }}")
            }
        };
        text.push_str(&format!(
            "[[routes]]\n{route}\nrespond = {{ status = 200 }}\n"
        ));
    }
    paths.push("/missing".into());
    let gen = ringway::config::compile(&text, "t.toml").unwrap();
    let mut scratch = gen.routes.scratch();
    let headers = HeaderList(vec![(b"x-a".to_vec(), b"1".to_vec())]);
    let mut found = 0;
    let mut run = |count: bool| {
        COUNTING.with(|c| c.set(count));
        for p in paths.iter().step_by(7).cycle().take(10_000) {
            let req = RouteRequest {
                method: b"GET",
                host: b"h",
                path: p.as_bytes(),
                query: b"",
                headers: &headers,
            };
            found += usize::from(gen.routes.lookup(&req, &mut scratch).is_some());
        }
        COUNTING.with(|c| c.set(false));
    };
    run(false); // warm-up: the regex engine's per-thread cache fills once
    run(true);
    let allocations = COUNT.with(Cell::get);
    assert!(found > 15_000, "{found}");
    assert_eq!(
        allocations, 0,
        "{allocations} allocations in 10,000 lookups"
    );
}
