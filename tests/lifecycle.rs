//! The process around the proxy: the binary's commands, one instance per port, graceful
//! shutdown by signal and in-process.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

mod support;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::*;

const BIN: &str = env!("CARGO_BIN_EXE_ringway");

fn temp_config(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ringway-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn free_port() -> SocketAddr {
    closed_port()
}

struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn(args: &[&str]) -> Running {
    Running(
        Command::new(BIN)
            .args(args)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn ringway"),
    )
}

fn wait_listening(addr: SocketAddr) -> bool {
    wait_until(Duration::from_secs(10), || {
        std::net::TcpStream::connect(addr).is_ok()
    })
}

fn sigterm(child: &Child) {
    // SAFETY: kill(2) with a pid we spawned and a valid signal number; no memory is involved.
    let rc = unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    assert_eq!(rc, 0);
}

#[test]
fn version_and_help() {
    let out = Command::new(BIN).arg("--version").output().unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("ringway {}", env!("CARGO_PKG_VERSION"))
    );
    let out = Command::new(BIN).arg("--nope").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("usage:"));
    // An argument that is not UTF-8 is a usage error, not a panic.
    use std::os::unix::ffi::OsStrExt;
    let out = Command::new(BIN)
        .arg("--config")
        .arg(std::ffi::OsStr::from_bytes(b"\xff.toml"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("UTF-8"));
}

#[test]
fn check_prints_the_compiled_config() {
    let out = Command::new(BIN)
        .args([
            "check",
            "--config",
            concat!(env!("CARGO_MANIFEST_DIR"), "/config/ringway.toml"),
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("127.0.0.1:8080"), "{text}");
    assert!(text.contains("api: 127.0.0.1:9000"), "{text}");
    assert!(text.contains("prefix=/api/ -> proxy api"), "{text}");
    assert!(text.contains("prefix=/ -> respond 200"), "{text}");
}

#[test]
fn check_warns_about_unreachable_routes() {
    let out = Command::new(BIN)
        .args([
            "check",
            "--config",
            concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/routes.toml"),
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("template=/users/{id}"), "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("warning: route `shadowed`")),
        "{text}"
    );
}

#[test]
fn check_warns_about_an_admin_listener_off_loopback() {
    let dir = std::env::temp_dir().join(format!("ringway-admin-warn-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("ringway.toml");
    for (addr, warned) in [
        ("0.0.0.0:9901", true),
        ("[::]:9901", true),
        ("127.0.0.1:9901", false),
        ("[::1]:9901", false),
    ] {
        std::fs::write(
            &path,
            format!("[admin]\naddress = \"{addr}\"\n[[listeners]]\naddress = \"127.0.0.1:0\"\n"),
        )
        .unwrap();
        let out = Command::new(BIN)
            .args(["check", "--config", path.to_str().unwrap()])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{text}");
        let warning = text
            .lines()
            .any(|l| l.starts_with("warning: the admin listener"));
        assert_eq!(warning, warned, "{addr}: {text}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn every_example_config_checks() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/config/examples");
    let mut n = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            let out = Command::new(BIN)
                .arg("check")
                .arg("--config")
                .arg(&path)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}: {}",
                path.display(),
                String::from_utf8_lossy(&out.stderr)
            );
            n += 1;
        }
    }
    assert!(n > 0, "no example configs");
}

#[test]
fn check_reports_errors_with_file_line_column() {
    let path = temp_config(
        "broken.toml",
        "[[listeners]]\naddress = \"127.0.0.1:8080\"\n\n[[routes]]\npath_prefix = \"/\"\nproxy = \"missing\"\n",
    );
    let out = Command::new(BIN)
        .arg("check")
        .arg("--config")
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with(&format!("{}:6:9: ", path.display())),
        "{err}"
    );
    assert!(err.contains("missing"), "{err}");

    let path = temp_config(
        "unknown.toml",
        "[[listeners]]\naddress = \"127.0.0.1:8080\"\nport = 1\n",
    );
    let out = Command::new(BIN)
        .arg("check")
        .arg("--config")
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(":3:1: ") && err.contains("port"), "{err}");
}

#[test]
fn proxy_command_forwards_any_path() {
    let origin = Origin::start(|req| Reply::text(200, &format!("origin saw {}", req.target)));
    let listen = free_port();
    let _p = spawn(&[
        "proxy",
        "--listen",
        &listen.to_string(),
        "--upstream",
        &origin.addr.to_string(),
        "--workers",
        "1",
    ]);
    assert!(wait_listening(listen));
    let mut c = Client::connect(listen);
    assert_eq!(c.get("/any/path?x=1").text(), "origin saw /any/path?x=1");
    assert_eq!(c.get("/").text(), "origin saw /");
}

#[test]
fn a_second_instance_on_the_same_port_fails_clearly() {
    let listen = free_port();
    let config = temp_config(
        "port.toml",
        &format!("workers = 2\ncpus = []\n[[listeners]]\naddress = \"{listen}\"\n[[routes]]\npath_prefix = \"/\"\nrespond = {{ status = 200, body = \"first\" }}\n"),
    );
    let _first = spawn(&["--config", config.to_str().unwrap()]);
    assert!(wait_listening(listen));
    let out = Command::new(BIN)
        .args(["--config", config.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("already in use"), "{err}");
    // The first one still answers everything.
    for _ in 0..20 {
        assert_eq!(Client::connect(listen).get("/").body, b"first");
    }
}

#[test]
fn sigterm_lets_the_in_flight_request_finish_then_exits_zero() {
    let origin = Origin::start(|req| {
        if req.target == "/slow" {
            Reply::Delay(
                Duration::from_millis(800),
                Box::new(Reply::text(200, "slow but complete")),
            )
        } else {
            Reply::text(200, "quick")
        }
    });
    let listen = free_port();
    let config = temp_config(
        "drain.toml",
        &format!(
            "workers = 2\ncpus = []\nshutdown_timeout = \"10s\"\n[[listeners]]\naddress = \"{listen}\"\n\
             [[upstreams]]\nname = \"up\"\nendpoints = [\"{}\"]\n[[routes]]\npath_prefix = \"/\"\nproxy = \"up\"\n",
            origin.addr
        ),
    );
    let mut p = spawn(&["--config", config.to_str().unwrap()]);
    assert!(wait_listening(listen));
    // A keep-alive connection between requests, and one accepted that has not sent yet.
    let mut idle = Client::connect(listen);
    idle.send(b"GET /first HTTP/1.1\r\nHost: a\r\n\r\n");
    assert_eq!(idle.read_response(false).unwrap().status, 200);
    let mut fresh = Client::connect(listen);
    let mut busy = Client::connect(listen);
    busy.send(b"GET /slow HTTP/1.1\r\nHost: a\r\n\r\n");
    assert!(wait_until(Duration::from_secs(5), || origin
        .requests()
        .len()
        == 2));
    let t = Instant::now();
    sigterm(&p.0);
    let r = busy
        .read_response(false)
        .expect("the in-flight request completes");
    assert_eq!(r.status, 200);
    assert_eq!(r.body, b"slow but complete");
    assert_eq!(r.header("connection"), Some("close"));
    assert!(
        idle.is_closed(Duration::from_secs(3)),
        "idle keep-alive connection closed"
    );
    // An accepted connection's first request is still answered (and told to close).
    fresh.send(b"GET /late HTTP/1.1\r\nHost: a\r\n\r\n");
    let r = fresh
        .read_response(false)
        .expect("the accepted connection is answered");
    assert_eq!((r.status, r.header("connection")), (200, Some("close")));
    let status = loop {
        if let Some(s) = p.0.try_wait().unwrap() {
            break s;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "did not exit");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(0));
    assert!(
        std::net::TcpStream::connect(listen).is_err(),
        "no longer accepting"
    );
}

#[test]
fn in_process_shutdown_drains_and_readyz_says_so() {
    let origin = Origin::start(|_| {
        Reply::Delay(
            Duration::from_millis(600),
            Box::new(Reply::text(200, "done")),
        )
    });
    let mut proxy = Proxy::to(origin.addr, "workers = 1\n");
    let mut busy = proxy.connect();
    let mut probe = proxy.connect();
    assert_eq!(probe.get("/readyz").status, 200);
    busy.send(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n");
    assert!(wait_until(Duration::from_secs(5), || !origin
        .requests()
        .is_empty()));
    let server = proxy.server.take().unwrap();
    let handle = server.shutdown_handle();
    let joiner = std::thread::spawn(move || server.join());
    // Readiness flips at once; the worker's tick may close the idle probe connection first,
    // but the probe never sees 200 again.
    handle.shutdown();
    std::thread::sleep(Duration::from_millis(5));
    probe.send(b"GET /readyz HTTP/1.1\r\nHost: a\r\n\r\n");
    if let Some(r) = probe.read_response(false) {
        assert_eq!(r.status, 503);
    }
    let r = busy.read_response(false).unwrap();
    assert_eq!(r.body, b"done");
    joiner.join().unwrap();
    assert!(
        std::net::TcpStream::connect(proxy.addr).is_err(),
        "listeners are closed after shutdown"
    );
}

#[test]
fn a_shutdown_takes_no_queued_connection_beyond_the_cap() {
    let origin = Origin::start(|_| {
        Reply::Delay(
            Duration::from_millis(600),
            Box::new(Reply::text(200, "done")),
        )
    });
    let mut proxy = Proxy::to(origin.addr, "workers = 1\n[http]\nmax_connections = 1\n");
    let mut busy = proxy.connect();
    busy.send(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n");
    assert!(wait_until(Duration::from_secs(5), || !origin
        .requests()
        .is_empty()));
    // At the cap: this one waits in the kernel's queue.
    let mut queued = std::net::TcpStream::connect(proxy.addr).unwrap();
    queued
        .write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
        .unwrap();
    queued
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let server = proxy.server.take().unwrap();
    server.shutdown();
    // The busy connection is served; the queued one is not taken above the cap when the
    // listener stops (it is reset with the socket, as at any cap).
    let r = busy.read_response(false).unwrap();
    assert_eq!(r.body, b"done");
    server.join();
    let mut got = Vec::new();
    let _ = queued.read_to_end(&mut got);
    assert!(
        got.is_empty(),
        "served above the cap: {:?}",
        String::from_utf8_lossy(&got)
    );
}

#[test]
fn a_shutdown_takes_queued_connections_as_draining_ones_make_room() {
    let origin = Origin::ok("ok");
    let mut proxy = Proxy::to(origin.addr, "workers = 1\n[http]\nmax_connections = 1\n");
    // An idle keep-alive connection holds the only place.
    let mut idle = proxy.connect();
    assert_eq!(idle.get("/").status, 200);
    let mut queued = std::net::TcpStream::connect(proxy.addr).unwrap();
    queued
        .write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
        .unwrap();
    queued
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let server = proxy.server.take().unwrap();
    server.shutdown();
    // The idle connection closes on the drain, which makes room for the queued one.
    let mut got = Vec::new();
    let _ = queued.read_to_end(&mut got);
    assert!(
        got.starts_with(b"HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&got)
    );
    server.join();
    drop(idle);
}

#[test]
fn sighup_reloads_the_config_file() {
    let listen = free_port();
    let path = temp_config(
        "hup.toml",
        &format!("workers = 1\ncpus = []\n[[listeners]]\naddress = \"{listen}\"\n[[routes]]\npath_prefix = \"/\"\nrespond = {{ status = 200, body = \"before\" }}\n"),
    );
    let mut p = Running(
        Command::new(BIN)
            .args(["--config", path.to_str().unwrap()])
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    assert!(wait_listening(listen));
    assert_eq!(Client::connect(listen).get("/").body, b"before");
    std::fs::write(
        &path,
        format!("workers = 1\ncpus = []\n[[listeners]]\naddress = \"{listen}\"\n[[routes]]\npath_prefix = \"/\"\nrespond = {{ status = 200, body = \"after\" }}\n"),
    )
    .unwrap();
    let pid = p.0.id() as libc::pid_t;
    // SAFETY: kill(2) with a pid we spawned and a valid signal number.
    let rc = unsafe { libc::kill(pid, libc::SIGHUP) };
    assert_eq!(rc, 0);
    assert!(wait_until(Duration::from_secs(5), || Client::connect(
        listen
    )
    .get("/")
    .body
        == b"after"));
    sigterm(&p.0);
    let status = p.0.wait().unwrap();
    assert_eq!(
        status.code(),
        Some(0),
        "SIGHUP did not end the process, SIGTERM ended it cleanly"
    );
    let mut log = String::new();
    std::io::Read::read_to_string(p.0.stderr.as_mut().unwrap(), &mut log).unwrap();
    assert!(log.contains("SIGHUP: reloading the config"), "{log}");
    assert!(log.contains("config reloaded"), "{log}");
}

#[test]
fn a_stderr_nobody_reads_does_not_stop_the_worker() {
    // Every failed upstream attempt is logged as a warning: far more than a pipe holds
    // (64 KiB) when nobody reads it, as a stalled log driver does not. The worker writing
    // them must go on serving (it blocked in write(2) after a few hundred).
    let down = closed_port();
    let listen = free_port();
    let path = temp_config(
        "stderr.toml",
        &format!(
            "workers = 1\n[[listeners]]\naddress = \"{listen}\"\n[[upstreams]]\nname = \"down\"\n\
             endpoints = [\"{down}\"]\nretries = {{ attempts = 1 }}\n\
             outlier = {{ consecutive_failures = 0 }}\n\
             [[routes]]\npath_prefix = \"/\"\nproxy = \"down\"\n"
        ),
    );
    let _proxy = spawn(&["--config", path.to_str().unwrap()]);
    assert!(wait_listening(listen));
    for i in 0..2000 {
        let mut c = Client::connect(listen);
        c.stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        c.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
        let status = c.read_response(false).map(|r| r.status);
        assert_eq!(status, Some(502), "request {i}");
    }
}
