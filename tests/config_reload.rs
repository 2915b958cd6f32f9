//! Live configuration: reloads by request, by file change and by the admin endpoint; refused
//! configs; listener changes; in-flight requests finishing on their generation; and a reload
//! storm under load that must not fail a single request.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::*;

const BASE: &str = "workers = 2\ncpus = []\nlog_level = \"error\"\n[admin]\naddress = \"127.0.0.1:0\"\n[[listeners]]\naddress = \"127.0.0.1:0\"\n";

fn respond_route(path: &str, body: &str) -> String {
    format!(
        "[[routes]]\npath_prefix = \"{path}\"\nrespond = {{ status = 200, body = \"{body}\" }}\n"
    )
}

fn admin_post(addr: SocketAddr, path: &str) -> (u16, String) {
    support::admin(addr, "POST", path)
}

#[test]
fn admin_reload_applies_new_routes_to_the_next_request_on_a_keep_alive_connection() {
    let dir = Dir::new("admin");
    let (server, addr) = start_in(&dir, &format!("{BASE}{}", respond_route("/", "one")));
    let mut c = Client::connect(addr);
    assert_eq!(c.get("/x").text(), "one");

    dir.write(&format!(
        "{BASE}{}{}",
        respond_route("/", "two"),
        respond_route("/new", "added")
    ));
    let (status, body) = admin_post(server.admin_addr().unwrap(), "/-/reload");
    assert_eq!(status, 200, "{body}");
    let generation: u64 = body
        .trim_start_matches("{\"generation\":")
        .trim_end_matches('}')
        .parse()
        .unwrap();
    assert!(generation >= 2, "{body}");
    assert!(server.wait_for_generation(generation, Duration::from_secs(2)));
    assert_eq!(c.get("/x").text(), "two", "same connection, new generation");
    assert_eq!(c.get("/new/y").text(), "added");
    let m = metrics(addr);
    assert!(m["ringway_config_generation"] >= 2.0, "{m:?}");
    assert!(m["ringway_config_reloads_total{result=\"success\"}"] >= 1.0);

    assert_eq!(
        admin_post(server.admin_addr().unwrap(), "/-/nothing").0,
        404
    );
    server.shutdown();
    server.join();
}

#[test]
fn an_invalid_config_is_refused_and_the_running_one_stays() {
    let dir = Dir::new("invalid");
    let (server, addr) = start_in(&dir, &format!("{BASE}{}", respond_route("/", "kept")));
    dir.write(&format!(
        "{BASE}[[routes]]\npath_prefix = \"/\"\nproxy = \"nowhere\"\n"
    ));
    let err = server.reload_handle().reload_and_wait().unwrap_err();
    assert!(
        err.contains("ringway.toml:") && err.contains("nowhere"),
        "{err}"
    );
    let (status, body) = admin_post(server.admin_addr().unwrap(), "/-/reload");
    assert_eq!(status, 422);
    assert!(
        body.contains("reload_failed") && body.contains("nowhere"),
        "{body}"
    );
    assert_eq!(server.generation(), 1);
    assert_eq!(Client::connect(addr).get("/").text(), "kept");
    let m = metrics(addr);
    assert!(
        m["ringway_config_reloads_total{result=\"failure\"}"] >= 2.0,
        "{m:?}"
    );
    server.shutdown();
    server.join();
}

#[test]
fn a_changed_file_is_reloaded_by_itself() {
    let dir = Dir::new("watch");
    let (server, addr) = start_in(&dir, &format!("{BASE}{}", respond_route("/", "before")));
    std::thread::sleep(Duration::from_millis(1100));
    dir.write(&format!("{BASE}{}", respond_route("/", "after-the-edit")));
    assert!(
        wait_until(Duration::from_secs(5), || server.generation() >= 2),
        "the file change was not picked up"
    );
    assert!(server.wait_for_generation(2, Duration::from_secs(2)));
    assert_eq!(Client::connect(addr).get("/").text(), "after-the-edit");
    server.shutdown();
    server.join();
}

#[test]
fn a_file_written_in_place_is_read_once_it_is_whole() {
    let dir = Dir::new("in-place");
    let both = |a: &str| {
        format!(
            "{BASE}{}{}",
            respond_route("/a", a),
            respond_route("/b", "b")
        )
    };
    let (server, addr) = start_in(&dir, &both("a"));
    std::thread::sleep(Duration::from_millis(1100));
    // A writer that stops for 900 ms half-way through (in place, no rename): what it wrote so
    // far is a config that compiles, without the route of `/b`.
    std::fs::write(dir.config(), format!("{BASE}{}", respond_route("/a", "a2"))).unwrap();
    let mut c = Client::connect(addr);
    let pause = Instant::now() + Duration::from_millis(900);
    while Instant::now() < pause {
        assert_eq!(c.get("/b").status, 200, "the half-written file was loaded");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::fs::write(dir.config(), both("a2")).unwrap();
    assert!(
        wait_until(Duration::from_secs(5), || server.generation() >= 2),
        "the file change was not picked up"
    );
    assert!(server.wait_for_generation(2, Duration::from_secs(2)));
    assert_eq!(c.get("/a").text(), "a2");
    assert_eq!(c.get("/b").status, 200);
    // One reload: the whole file's.
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(server.generation(), 2);
    server.shutdown();
    server.join();
}

#[test]
fn listeners_are_added_and_removed_live() {
    let dir = Dir::new("listeners");
    let extra = closed_port();
    let (server, addr) = start_in(&dir, &format!("{BASE}{}", respond_route("/", "hi")));
    assert!(TcpStream::connect(extra).is_err());
    let with_extra = format!(
        "{BASE}[[listeners]]\naddress = \"{extra}\"\n{}",
        respond_route("/", "hi")
    );
    dir.write(&with_extra);
    let g = server.reload_handle().reload_and_wait().unwrap();
    assert!(server.wait_for_generation(g, Duration::from_secs(2)));
    assert!(wait_until(Duration::from_secs(2), || TcpStream::connect(
        extra
    )
    .is_ok()));
    let mut on_extra = Client::connect(extra);
    assert_eq!(on_extra.get("/").text(), "hi");

    dir.write(&format!("{BASE}{}", respond_route("/", "hi")));
    let g = server.reload_handle().reload_and_wait().unwrap();
    assert!(server.wait_for_generation(g, Duration::from_secs(2)));
    assert!(
        wait_until(Duration::from_secs(2), || TcpStream::connect(extra)
            .is_err()),
        "the removed listener still accepts"
    );
    // Its idle keep-alive connection closes at once (one in an exchange would finish it
    // first, see tests/tls.rs); the kept listener is unaffected.
    assert!(
        on_extra.is_closed(Duration::from_secs(1)),
        "an idle connection of the removed listener stayed"
    );
    let mut kept = Client::connect(addr);
    for _ in 0..2 {
        let r = kept.get("/");
        assert_eq!((r.text().as_str(), r.header("connection")), ("hi", None));
    }
    server.shutdown();
    server.join();
}

/// Whether an h2c connection to `addr`, once it carried a request, is told to go away and
/// closed within `wait` of `reload` (while no stream is open).
fn h2c_goes_away_on(addr: SocketAddr, wait: Duration, reload: impl FnOnce()) -> bool {
    tokio_rt().block_on(async {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (mut client, conn) = h2::client::handshake(tcp).await.expect("h2c handshake");
        let driver = tokio::spawn(conn);
        let req = http::Request::get("http://x/").body(()).unwrap();
        let (resp, _) = client.send_request(req, true).unwrap();
        assert_eq!(resp.await.unwrap().status(), 200);
        reload();
        tokio::time::timeout(wait, driver).await.is_ok()
    })
}

#[test]
fn http2_connections_go_away_when_their_listener_or_http2_settings_change() {
    let dir = Dir::new("h2-goaway");
    let extra = closed_port();
    let route = respond_route("/", "hi");
    let two = format!("{BASE}[[listeners]]\naddress = \"{extra}\"\n{route}");
    let (server, addr) = start_in(&dir, &two);
    let reload_with = |text: &str| {
        dir.write(text);
        let g = server.reload_handle().reload_and_wait().unwrap();
        assert!(server.wait_for_generation(g, Duration::from_secs(2)));
    };
    // A reload that changes neither: the connection stays.
    let (short, long) = (Duration::from_millis(2500), Duration::from_secs(5));
    assert!(!h2c_goes_away_on(addr, short, || reload_with(&format!(
        "{two}{}",
        respond_route("/other", "x")
    ))));
    assert!(
        h2c_goes_away_on(extra, long, || reload_with(&format!("{BASE}{route}"))),
        "a removed listener's connection stayed"
    );
    assert!(
        h2c_goes_away_on(addr, long, || reload_with(&format!(
            "{BASE}[http2]\nmax_concurrent_streams = 50\n{route}"
        ))),
        "a connection set up with other HTTP/2 settings stayed"
    );
    server.shutdown();
    server.join();
}

#[test]
fn a_removed_port_0_listener_stops_and_an_add_undone_at_once_never_listens() {
    let dir = Dir::new("listeners-port0");
    let (server, addr) = start_in(&dir, &format!("{BASE}{}", respond_route("/", "hi")));
    // Replace the `127.0.0.1:0` listener (bound to `addr`) by a fixed port.
    let fixed = closed_port();
    let moved = BASE.replace(
        "[[listeners]]\naddress = \"127.0.0.1:0\"\n",
        &format!("[[listeners]]\naddress = \"{fixed}\"\n"),
    );
    assert!(moved.contains(&fixed.to_string()), "{moved}");
    dir.write(&format!("{moved}{}", respond_route("/", "hi")));
    let g = server.reload_handle().reload_and_wait().unwrap();
    assert!(server.wait_for_generation(g, Duration::from_secs(2)));
    assert!(wait_until(Duration::from_secs(2), || TcpStream::connect(
        fixed
    )
    .is_ok()));
    assert!(
        wait_until(Duration::from_secs(2), || TcpStream::connect(addr).is_err()),
        "the port-0 listener was removed but still accepts"
    );

    // Add a listener and remove it again before the workers' next tick.
    let brief = closed_port();
    let with_brief = format!(
        "{moved}[[listeners]]\naddress = \"{brief}\"\n{}",
        respond_route("/", "hi")
    );
    for _ in 0..3 {
        dir.write(&with_brief);
        server.reload_handle().reload_and_wait().unwrap();
        dir.write(&format!("{moved}{}", respond_route("/", "hi")));
        let g = server.reload_handle().reload_and_wait().unwrap();
        assert!(server.wait_for_generation(g, Duration::from_secs(2)));
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            TcpStream::connect(brief).is_err(),
            "a listener undone at once still accepts"
        );
    }
    server.shutdown();
    server.join();
}

#[test]
fn an_in_flight_request_finishes_on_the_generation_it_started_with() {
    let origin = Origin::start(|_| {
        Reply::Delay(
            Duration::from_millis(600),
            Box::new(Reply::text(200, "slow")),
        )
    });
    let dir = Dir::new("inflight");
    let proxied = format!(
        "{BASE}[[upstreams]]\nname = \"up\"\nendpoints = [\"{}\"]\n[[routes]]\npath_prefix = \"/\"\nproxy = \"up\"\n",
        origin.addr
    );
    let (server, addr) = start_in(&dir, &proxied);
    let mut busy = Client::connect(addr);
    busy.send(b"GET /slow HTTP/1.1\r\nHost: a\r\n\r\n");
    assert!(wait_until(Duration::from_secs(5), || !origin
        .requests()
        .is_empty()));
    // The new generation has no upstream and no such route at all.
    dir.write(&format!("{BASE}{}", respond_route("/other", "x")));
    let g = server.reload_handle().reload_and_wait().unwrap();
    assert!(server.wait_for_generation(g, Duration::from_secs(2)));
    let r = busy.read_response(false).unwrap();
    assert_eq!((r.status, r.text().as_str()), (200, "slow"));
    // The same connection's next request sees the new routes.
    assert_eq!(busy.get("/slow").status, 404);
    let m = metrics(addr);
    assert!(
        m["ringway_requests_previous_generation_total"] >= 1.0,
        "{m:?}"
    );
    server.shutdown();
    server.join();
}

/// 64 keep-alive clients keep requesting while the config is rewritten and reloaded 20 times
/// (routes added, removed and changed): not one request fails or gets a non-2xx answer, and
/// after each reload the new routes answer.
#[test]
fn twenty_reloads_under_load_fail_no_request() {
    let origin = Origin::ok("from-origin");
    let dir = Dir::new("storm");
    let config = |k: usize| {
        // /load is always routed, alternately to the origin and answered locally; /probe says
        // which generation answers; /gone-{k-1} is removed, /added-{k} added.
        let load = if k % 2 == 0 {
            "[[routes]]\npath_prefix = \"/load\"\nproxy = \"up\"\n".to_string()
        } else {
            respond_route("/load", &format!("local-{k}"))
        };
        format!(
            "{BASE}[[upstreams]]\nname = \"up\"\nendpoints = [\"{}\"]\n{load}{}{}",
            origin.addr,
            respond_route("/probe", &format!("gen-{k}")),
            respond_route(&format!("/added-{k}"), &format!("added-{k}"))
        )
    };
    let (server, addr) = start_in(&dir, &config(0));
    let stop = Arc::new(AtomicBool::new(false));
    let ok = Arc::new(AtomicU64::new(0));
    let bad = Arc::new(AtomicU64::new(0));
    let clients: Vec<_> = (0..64)
        .map(|_| {
            let (stop, ok, bad) = (stop.clone(), ok.clone(), bad.clone());
            std::thread::spawn(move || {
                let mut c = Client::connect(addr);
                while !stop.load(Ordering::Relaxed) {
                    c.send(b"GET /load HTTP/1.1\r\nHost: a\r\n\r\n");
                    match c.read_response(false) {
                        Some(r) if r.status == 200 => ok.fetch_add(1, Ordering::Relaxed),
                        _ => {
                            bad.fetch_add(1, Ordering::Relaxed);
                            c = Client::connect(addr);
                            0
                        }
                    };
                }
            })
        })
        .collect();
    let mut probe = Client::connect(addr);
    let started = Instant::now();
    for k in 1..=20 {
        std::thread::sleep(Duration::from_millis(50));
        dir.write(&config(k));
        let g = server
            .reload_handle()
            .reload_and_wait()
            .expect("reload applies");
        assert!(
            server.wait_for_generation(g, Duration::from_secs(2)),
            "workers did not install {g}"
        );
        assert_eq!(probe.get("/probe").text(), format!("gen-{k}"), "reload {k}");
        assert_eq!(probe.get(&format!("/added-{k}")).status, 200, "reload {k}");
        assert_eq!(
            probe.get(&format!("/added-{}", k - 1)).status,
            404,
            "reload {k}: removed route"
        );
    }
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().unwrap();
    }
    let (ok, bad) = (ok.load(Ordering::Relaxed), bad.load(Ordering::Relaxed));
    println!(
        "{ok} requests, {bad} failed, 20 reloads in {:?}",
        started.elapsed()
    );
    assert_eq!(bad, 0, "{bad} of {} requests failed", ok + bad);
    assert!(ok > 1000, "too little load: {ok}");
    server.shutdown();
    server.join();
}

#[test]
fn idle_upstream_connections_survive_a_reload() {
    let origin = Origin::ok("pooled");
    let dir = Dir::new("pools");
    let text = |extra: &str| {
        format!(
            "workers = 1\ncpus = []\nlog_level = \"error\"\n[[listeners]]\naddress = \"127.0.0.1:0\"\n\
             [[upstreams]]\nname = \"up\"\nendpoints = [\"{}\"]\n[[routes]]\npath_prefix = \"/\"\nproxy = \"up\"\n{extra}",
            origin.addr
        )
    };
    let (server, addr) = start_in(&dir, &text(""));
    let mut c = Client::connect(addr);
    assert_eq!(c.get("/a").text(), "pooled");
    for k in 0..3 {
        dir.write(&text(&respond_route(&format!("/new-{k}"), "x")));
        let g = server.reload_handle().reload_and_wait().unwrap();
        assert!(server.wait_for_generation(g, Duration::from_secs(2)));
        assert_eq!(c.get("/a").text(), "pooled");
    }
    assert_eq!(
        origin.connection_count(),
        1,
        "the pooled connection was carried across reloads"
    );
    server.shutdown();
    server.join();
}

#[test]
fn the_admin_listener_refuses_browsers_and_trickling_clients() {
    let dir = Dir::new("admin-guard");
    let (server, _) = start_in(&dir, &format!("{BASE}{}", respond_route("/", "hi")));
    let admin = server.admin_addr().unwrap();
    // A cross-site form post carries Origin.
    let mut s = TcpStream::connect(admin).unwrap();
    s.write_all(b"POST /-/reload HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: https://evil.example\r\nContent-Length: 0\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    assert!(text.starts_with("HTTP/1.1 403"), "{text}");
    assert_eq!(server.generation(), 1, "nothing was reloaded");
    // A page whose name was rebound to the admin address reads it same-origin, over plain
    // HTTP without Sec-Fetch-Site, but under its own name; a browser sends Sec-Fetch-Site
    // to localhost. Tools (curl) name the address or localhost and send neither.
    for (host, fetch_site, status) in [
        ("rebound.example:9901", "", "403"),
        ("localhost:9901", "Sec-Fetch-Site: same-origin\r\n", "403"),
        ("127.0.0.1:9901", "", "200"),
        ("localhost", "", "200"),
    ] {
        let mut s = TcpStream::connect(admin).unwrap();
        s.write_all(
            format!("GET /-/upstreams HTTP/1.1\r\nHost: {host}\r\n{fetch_site}\r\n").as_bytes(),
        )
        .unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        assert!(text.starts_with(&format!("HTTP/1.1 {status}")), "{text}");
    }

    // A client sending one byte a second is cut off after the 5 s head deadline, not per read.
    let mut slow = TcpStream::connect(admin).unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let started = Instant::now();
    let mut cut_after = None;
    for b in b"GET /-/upstreams HTTP/1.1\r\nHost: x\r\n"
        .iter()
        .cycle()
        .take(20)
    {
        if slow.write_all(&[*b]).is_err() {
            cut_after = Some(started.elapsed());
            break;
        }
        let mut probe = [0u8; 1];
        slow.set_nonblocking(true).unwrap();
        let closed = matches!(slow.read(&mut probe), Ok(0));
        slow.set_nonblocking(false).unwrap();
        if closed {
            cut_after = Some(started.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let cut = cut_after.expect("the trickling client was cut off");
    assert!(cut < Duration::from_secs(8), "cut off after {cut:?}");
    // The admin thread serves others again.
    assert_eq!(support::admin(admin, "GET", "/-/upstreams").0, 200);
    // A request line beyond 4 KiB is a URI too long.
    let long = format!("/-/{}", "a".repeat(5000));
    assert_eq!(support::admin(admin, "GET", &long).0, 414);
    assert_eq!(support::admin(admin, "POST", "/-/upstreams").0, 405);
    server.shutdown();
    server.join();
}

#[test]
fn a_client_holding_the_admin_listener_does_not_stop_others_and_the_rest_are_capped() {
    use ringway::control::admin::MAX_CONCURRENT;
    let dir = Dir::new("admin-concurrent");
    let (server, _) = start_in(&dir, &format!("{BASE}{}", respond_route("/", "hi")));
    let admin = server.admin_addr().unwrap();
    // Connected, sending nothing: each holds its exchange up to the 5 s head deadline.
    let mut silent: Vec<TcpStream> = (0..3).map(|_| TcpStream::connect(admin).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(200));
    let started = Instant::now();
    assert_eq!(support::admin(admin, "GET", "/-/upstreams").0, 200);
    let took = started.elapsed();
    assert!(took < Duration::from_secs(2), "answered after {took:?}");
    // All slots held: the next is told so at once, not queued behind them.
    silent.extend((3..MAX_CONCURRENT).map(|_| TcpStream::connect(admin).unwrap()));
    let mut busy = String::new();
    assert!(
        wait_until(Duration::from_secs(3), || {
            busy = support::admin(admin, "GET", "/-/upstreams").1;
            busy.contains("\"busy\"")
        }),
        "{busy}"
    );
    // Slots come back as their clients go.
    drop(silent);
    assert!(wait_until(Duration::from_secs(3), || {
        support::admin(admin, "GET", "/-/upstreams").0 == 200
    }));
    server.shutdown();
    server.join();
}

#[test]
fn turning_upstream_tls_on_by_reload_never_reuses_a_cleartext_connection() {
    use std::io::Read;
    // An origin that answers cleartext requests and notes a TLS ClientHello (first byte
    // 0x16) on a connection, which it then closes.
    let hellos = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = hellos.clone();
    let origin = raw_origin(move |mut s| {
        use std::io::Write;
        loop {
            let mut first = [0u8; 1];
            if s.peek(&mut first).unwrap_or(0) == 0 {
                return;
            }
            if first[0] == 0x16 {
                seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let _ = s.read(&mut [0u8; 4096]);
                return;
            }
            if read_head_raw(&mut s).is_empty() {
                return;
            }
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nplain");
        }
    });
    let dir = Dir::new("pools-tls");
    let text = |tls: &str| {
        format!(
            "workers = 1\ncpus = []\nlog_level = \"error\"\n[[listeners]]\naddress = \"127.0.0.1:0\"\n\
             [[upstreams]]\nname = \"up\"\nendpoints = [\"{origin}\"]\n{tls}\n\
             [[routes]]\npath_prefix = \"/\"\nproxy = \"up\"\n"
        )
    };
    let (server, addr) = start_in(&dir, &text(""));
    let mut c = Client::connect(addr);
    assert_eq!(c.get("/a").text(), "plain");
    dir.write(&text("tls = { insecure_skip_verify = true }"));
    let g = server.reload_handle().reload_and_wait().unwrap();
    assert!(server.wait_for_generation(g, Duration::from_secs(2)));
    // The pooled cleartext connection is not used: a new connection starts TLS (which this
    // origin does not speak, hence no 200).
    let r = c.get("/b");
    assert_ne!(
        r.text(),
        "plain",
        "sent in cleartext after TLS was turned on"
    );
    assert!(hellos.load(std::sync::atomic::Ordering::SeqCst) >= 1);
    server.shutdown();
    server.join();
}

#[test]
fn a_reload_refused_for_a_port_in_use_is_tried_again_by_itself() {
    // The new listener's port is taken when the reload comes: refused. The file does not
    // change again, yet once the port is free the reload goes through (retried after 10 s).
    let blocker = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = blocker.local_addr().unwrap();
    let dir = Dir::new("retry");
    let (server, _addr) = start_in(&dir, &format!("{BASE}{}", respond_route("/", "x")));
    dir.write(&format!(
        "{BASE}{}[[listeners]]\naddress = \"{port}\"\n",
        respond_route("/", "x")
    ));
    let err = server.reload_handle().reload_and_wait().unwrap_err();
    assert!(!err.is_empty());
    assert_eq!(server.generation(), 1);
    drop(blocker);
    assert!(
        wait_until(Duration::from_secs(15), || server.generation() == 2),
        "the refused reload was not tried again"
    );
    assert_eq!(Client::connect(port).get("/").text(), "x");
    server.shutdown();
    server.join();
}

#[test]
fn raising_max_connections_by_reload_lets_a_worker_at_its_cap_accept_again() {
    let base = BASE.replace("workers = 2", "workers = 1");
    let dir = Dir::new("cap");
    let capped = |n: u32| {
        format!(
            "{base}[http]\nmax_connections = {n}\n{}",
            respond_route("/", "ok")
        )
    };
    let (server, addr) = start_in(&dir, &capped(2));
    let mut held: Vec<Client> = (0..2).map(|_| Client::connect(addr)).collect();
    for c in &mut held {
        assert_eq!(c.get("/").status, 200);
    }
    // At the cap: a third connection waits in the backlog, unanswered.
    let mut third = TcpStream::connect(addr).unwrap();
    third
        .write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        .unwrap();
    third
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let mut byte = [0u8; 1];
    assert!(third.read(&mut byte).is_err(), "answered above the cap");
    // A reload raising the cap: the worker takes it without any connection closing.
    dir.write(&capped(10));
    let (status, body) = admin_post(server.admin_addr().unwrap(), "/-/reload");
    assert_eq!(status, 200, "{body}");
    third
        .set_read_timeout(Some(Duration::from_secs(3)))
        .unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        match third.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            other => panic!("no answer after the reload: {other:?}"),
        }
    }
    assert!(head.starts_with(b"HTTP/1.1 200"), "{head:?}");
    drop(held);
}

#[test]
fn a_reload_that_shortens_the_health_check_interval_applies_at_once() {
    let failing = Arc::new(AtomicBool::new(false));
    let f = failing.clone();
    let origin = Origin::start(move |_| {
        if f.load(Ordering::SeqCst) {
            Reply::text(503, "down")
        } else {
            Reply::text(200, "up")
        }
    });
    let dir = Dir::new("hc-interval");
    let config = |interval: &str| {
        format!(
            "{BASE}[[upstreams]]\nname = \"up\"\nendpoints = [\"{}\"]\n\
             health_check = {{ path = \"/health\", interval = \"{interval}\", timeout = \"500ms\", healthy_threshold = 1, unhealthy_threshold = 1 }}\n\
             [[routes]]\npath_prefix = \"/\"\nproxy = \"up\"\n",
            origin.addr
        )
    };
    let (server, addr) = start_in(&dir, &config("1h"));
    let admin = server.admin_addr().unwrap();
    let healthy = || {
        let key = format!(
            "ringway_endpoint_healthy{{upstream=\"up\",endpoint=\"{0}\",authority=\"{0}\"}}",
            origin.addr
        );
        metrics(addr).get(&key).copied()
    };
    // The first probe (at once) finds it up and brings it in; the next is an hour away.
    let deadline = Instant::now() + Duration::from_secs(3);
    while healthy() != Some(1.0) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(healthy(), Some(1.0));
    assert_eq!(origin.requests().len(), 1);
    failing.store(true, Ordering::SeqCst);
    dir.write(&config("50ms"));
    let (status, body) = admin_post(admin, "/-/reload");
    assert_eq!(status, 200, "{body}");
    // Probed again within the new interval, not an hour after the last probe.
    let deadline = Instant::now() + Duration::from_secs(2);
    while healthy() != Some(0.0) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(healthy(), Some(0.0), "the endpoint went down and was seen");
}

#[test]
fn reserved_paths_can_be_left_to_the_routes_and_the_admin_listener_serves_them() {
    let dir = Dir::new("reserved-off");
    let text = BASE.replace("[admin]", "[http]\nreserved_paths = false\n[admin]")
        + &respond_route("/", "routed");
    let (server, addr) = start_in(&dir, &text);
    // On the listener, /metrics and /healthz are ordinary paths (a public listener shows no
    // metrics, and an application's own /metrics can be proxied).
    for path in ["/metrics", "/healthz"] {
        let mut c = Client::connect(addr);
        let r = c.get(path);
        assert_eq!((r.status, r.text().as_str()), (200, "routed"), "{path}");
    }
    // The admin listener serves them.
    let admin = server.admin_addr().unwrap();
    let (status, body) = support::admin(admin, "GET", "/metrics");
    assert_eq!(status, 200);
    assert!(body.contains("ringway_info{"), "{body}");
    assert_eq!(support::admin(admin, "GET", "/healthz").0, 200);
    assert_eq!(support::admin(admin, "GET", "/readyz").0, 200);
    // A method a path does not take is a 405, not a 404.
    for path in ["/metrics", "/healthz", "/readyz"] {
        assert_eq!(support::admin(admin, "POST", path).0, 405, "{path}");
    }
    // A head over the admin bound (16 KiB, all of it read: nothing left for a reset) is a 431.
    let mut s = std::net::TcpStream::connect(admin).unwrap();
    let mut big = String::from("GET /healthz HTTP/1.1\r\nx-big: ");
    big.push_str(&"a".repeat(16 * 1024 - big.len()));
    let _ = s.write_all(big.as_bytes());
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    assert!(
        got.starts_with(b"HTTP/1.1 431"),
        "{:?}",
        String::from_utf8_lossy(&got)
    );
    server.shutdown();
    server.join();
}

#[test]
fn a_reload_that_raises_max_connections_is_not_held_up_by_requests_waiting_before_it() {
    // One connection, held; a request waits for it. A reload allows two: the next request
    // takes the new room at once instead of waiting behind the one in line, which picks
    // under the limit of its own generation.
    let release = Arc::new(AtomicBool::new(false));
    let r = release.clone();
    let origin = Origin::start(move |_| {
        while !r.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(2));
        }
        Reply::text(200, "ok")
    });
    let dir = Dir::new("queue-reload");
    let config = |max: u32| {
        format!(
            "workers = 1\ncpus = []\nlog_level = \"error\"\n[admin]\naddress = \"127.0.0.1:0\"\n\
             [[listeners]]\naddress = \"127.0.0.1:0\"\n[[upstreams]]\nname = \"up\"\n\
             endpoints = [\"{}\"]\nmax_connections = {max}\nconnect_timeout = \"10s\"\n\
             [[routes]]\npath_prefix = \"/\"\nproxy = \"up\"\n",
            origin.addr
        )
    };
    let (server, addr) = start_in(&dir, &config(1));
    let admin = server.admin_addr().unwrap();
    let get =
        |path: &'static str| std::thread::spawn(move || Client::connect(addr).get(path).status);
    let held = get("/held");
    assert!(wait_until(Duration::from_secs(5), || origin
        .requests()
        .len()
        == 1));
    let waiting = get("/waiting");
    assert!(wait_until(Duration::from_secs(5), || {
        support::admin(admin, "GET", "/-/upstreams")
            .1
            .contains("\"pending\":1")
    }));
    dir.write(&config(2));
    let g = server.reload_handle().reload_and_wait().unwrap();
    assert!(server.wait_for_generation(g, Duration::from_secs(2)));
    let after = get("/after");
    assert!(
        wait_until(Duration::from_secs(3), || origin.requests().len() == 2),
        "the request after the reload waited behind the one in line"
    );
    assert_eq!(origin.requests()[1].target, "/after");
    release.store(true, Ordering::SeqCst);
    for t in [held, waiting, after] {
        assert_eq!(t.join().unwrap(), 200);
    }
    server.shutdown();
    server.join();
}
