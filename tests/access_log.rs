//! The access log: one JSON line per request, whatever answered it (an upstream, a local
//! route, an error envelope, a refusal before the head parsed, an HTTP/2 stream, a tunnel),
//! written by the writer thread, flushed on time and at shutdown, and opened again on reload so
//! that a rotated file is let go.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

mod support;

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::time::Duration;

use ringway::Server;
use serde_json::Value;
use support::*;

/// A config: one worker, the access log at `access.log` beside the config (a relative path),
/// an upstream `api` at `origin` for `/api`, a local route at `/hello`.
fn config(origin: SocketAddr, log: &str) -> String {
    format!(
        "workers = 1\ncpus = []\nlog_level = \"error\"\n\
         [access_log]\n{log}\n\
         [[listeners]]\naddress = \"127.0.0.1:0\"\n\
         [[upstreams]]\nname = \"api\"\nendpoints = [\"{origin}\"]\n\
         [[routes]]\npath_prefix = \"/api\"\nproxy = \"api\"\n\
         [[routes]]\npath_prefix = \"/hello\"\nrespond = {{ status = 200, body = \"hi\" }}\n"
    )
}

/// Every line of the file at `path`, each parsed as JSON (a line that is not fails the test).
fn lines(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

fn find<'a>(lines: &'a [Value], target: &str) -> &'a Value {
    lines
        .iter()
        .find(|l| l["target"] == target)
        .unwrap_or_else(|| panic!("no line for {target}: {lines:?}"))
}

/// 1. Proxied, local, routed-nowhere, refused-before-parsing and failed-upstream requests each
///    get one line with what happened; a client's request id is the line's.
/// 2. Shutdown writes what the worker still held (a flush interval far away).
#[test]
fn every_kind_of_answer_gets_one_line() {
    let dir = Dir::new("access-kinds");
    let origin = Origin::ok("from origin");
    let (server, addr) = start_in(
        &dir,
        &config(
            origin.addr,
            "path = \"access.log\"\nflush_interval = \"1h\"",
        ),
    );
    let mut c = Client::connect(addr);
    c.send(b"GET /api/x?q=1 HTTP/1.1\r\nHost: example.test\r\nX-Request-Id: mine-1\r\n\r\n");
    let r = c.read_response(false).expect("proxied");
    assert_eq!(r.status, 200);
    assert_eq!(c.get("/hello").status, 200);
    assert_eq!(c.get("/nowhere").status, 404);
    let mut bad = Client::connect(addr);
    bad.send(b"GET /x HTTP/1.1\r\nHost: a\r\nBad Header: x\r\n\r\n");
    assert_eq!(bad.read_response(false).expect("400").status, 400);
    // A long target is kept cut, never dropped with its line.
    let long = format!("/hello/{}", "a".repeat(6000));
    assert_eq!(c.get(&long).status, 200);
    // Nothing is written before the interval or a full buffer.
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(lines(&dir.0.join("access.log")).len(), 0);
    server.shutdown();
    server.join();

    let lines = lines(&dir.0.join("access.log"));
    assert_eq!(lines.len(), 5, "{lines:?}");
    let cut = lines
        .iter()
        .find(|l| l["target"].as_str().is_some_and(|t| t.ends_with("aaa...")))
        .expect("the long target's line");
    assert_eq!(cut["target"].as_str().unwrap().len(), 4096 + 3);
    assert_eq!(cut["status"], 200);
    let proxied = find(&lines, "/api/x?q=1");
    assert_eq!(proxied["status"], 200);
    assert_eq!(proxied["method"], "GET");
    assert_eq!(proxied["host"], "example.test");
    assert_eq!(proxied["protocol"], "HTTP/1.1");
    assert_eq!(proxied["request_id"], "mine-1");
    assert_eq!(proxied["upstream"], "api");
    assert_eq!(proxied["endpoint"], origin.addr.to_string());
    assert_eq!(proxied["error"], Value::Null);
    let sent = proxied["bytes_sent"].as_u64().expect("bytes_sent");
    assert!(sent > "from origin".len() as u64, "head and body: {sent}");
    assert!(proxied["duration_us"].as_u64().is_some());
    assert!(proxied["client"]
        .as_str()
        .is_some_and(|a| a.starts_with("127.0.0.1:")));
    let time = proxied["time"].as_str().expect("time");
    assert!(time.len() == 24 && time.ends_with('Z'), "{time}");

    let local = find(&lines, "/hello");
    assert_eq!(local["status"], 200);
    assert_eq!(local["upstream"], Value::Null);
    let none = find(&lines, "/nowhere");
    assert_eq!(none["status"], 404);
    assert_eq!(none["error"], "no_route");
    let refused = find(&lines, "");
    assert_eq!(refused["status"], 400);
    assert_eq!(refused["method"], "");
    assert_eq!(refused["error"], "bad_request");
}

/// An upstream that refuses connections: 502, with the endpoint tried and the failure's kind;
/// a line written within the flush interval without a shutdown.
#[test]
fn a_failed_upstream_is_logged_with_its_endpoint_within_the_interval() {
    let dir = Dir::new("access-fail");
    let down = closed_port();
    let (server, addr) = start_in(
        &dir,
        &config(down, "path = \"access.log\"\nflush_interval = \"50ms\""),
    );
    let mut c = Client::connect(addr);
    assert_eq!(c.get("/api/down").status, 502);
    let path = dir.0.join("access.log");
    assert!(
        wait_until(Duration::from_secs(5), || lines(&path).len() == 1),
        "flushed by the tick"
    );
    let lines = lines(&path);
    assert_eq!(lines[0]["status"], 502);
    assert_eq!(lines[0]["upstream"], "api");
    assert_eq!(lines[0]["endpoint"], down.to_string());
    assert_eq!(lines[0]["error"], "upstream_unreachable");
    let m = metrics(addr);
    assert_eq!(m["ringway_access_log_lines_total"], 1.0);
    assert_eq!(m["ringway_access_log_dropped_lines_total"], 0.0);
    server.shutdown();
    server.join();
}

/// HTTP/2 streams are logged as such, with `:authority` as the host; a refused CONNECT too.
#[test]
fn http2_streams_are_logged() {
    let dir = Dir::new("access-h2");
    let origin = Origin::ok("h2 body");
    let (server, addr) = start_in(&dir, &config(origin.addr, "path = \"access.log\""));
    tokio_rt().block_on(async {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (client, conn) = h2::client::handshake(tcp).await.expect("h2c");
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let mut client = client.ready().await.unwrap();
        let req = http::Request::builder()
            .uri("http://h2.test/api/stream")
            .body(())
            .unwrap();
        let (resp, _) = client.send_request(req, true).unwrap();
        let resp = resp.await.expect("response");
        assert_eq!(resp.status(), 200);
        let mut body = resp.into_body();
        while let Some(d) = body.data().await {
            let _ = d.expect("data");
        }
        let connect = http::Request::builder()
            .method("CONNECT")
            .uri("h2.test:443")
            .body(())
            .unwrap();
        let mut client = client.ready().await.unwrap();
        let (resp, _) = client.send_request(connect, true).unwrap();
        assert_eq!(resp.await.expect("response").status(), 501);
    });
    server.shutdown();
    server.join();
    let lines = lines(&dir.0.join("access.log"));
    assert_eq!(lines.len(), 2, "{lines:?}");
    let stream = find(&lines, "/api/stream");
    assert_eq!(stream["protocol"], "HTTP/2");
    assert_eq!(stream["host"], "h2.test");
    assert_eq!(stream["status"], 200);
    // The DATA the client got: the body, not the HTTP/1.1 form the proxy side wrote.
    assert_eq!(stream["bytes_sent"], "h2 body".len() as u64);
    assert_eq!(stream["upstream"], "api");
    let connect = lines
        .iter()
        .find(|l| l["method"] == "CONNECT")
        .expect("CONNECT line");
    assert_eq!(connect["status"], 501);
    assert_eq!(connect["error"], "not_implemented");
}

/// A tunnel's line is written when it closes: status 101 and the bytes it carried down.
#[test]
fn a_tunnel_is_logged_when_it_closes_with_its_bytes() {
    let origin = TcpListener::bind("127.0.0.1:0").unwrap();
    let origin_addr = origin.local_addr().unwrap();
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        let (mut s, _) = origin.accept().unwrap();
        let _ = read_head_raw(&mut s);
        s.write_all(
            b"HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\nUpgrade: raw\r\n\r\n",
        )
        .unwrap();
        s.write_all(&[7u8; 5000]).unwrap();
        let mut one = [0u8; 1];
        let _ = s.read(&mut one);
    });
    let dir = Dir::new("access-tunnel");
    let (server, addr) = start_in(&dir, &config(origin_addr, "path = \"access.log\""));
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    {
        use std::io::{Read, Write};
        c.write_all(
            b"GET /api/raw HTTP/1.1\r\nHost: t\r\nConnection: upgrade\r\nUpgrade: raw\r\n\r\n",
        )
        .unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 8192];
        while got.iter().filter(|&&b| b == 7).count() < 5000 {
            let n = c.read(&mut buf).unwrap();
            assert!(n > 0, "tunnel bytes");
            got.extend_from_slice(&buf[..n]);
        }
        // Still open: no line yet.
        std::thread::sleep(Duration::from_millis(100));
        c.write_all(b"x").unwrap();
    }
    drop(c);
    let path = dir.0.join("access.log");
    assert!(
        wait_until(Duration::from_secs(5), || lines(&path).len() == 1),
        "the tunnel's line"
    );
    let line = &lines(&path)[0];
    assert_eq!(line["status"], 101);
    assert_eq!(line["target"], "/api/raw");
    let sent = line["bytes_sent"].as_u64().unwrap();
    assert!(
        (5000..6000).contains(&sent),
        "the 101 head and the 5000 tunnel bytes: {sent}"
    );
    server.shutdown();
    server.join();
}

/// Log rotation: the file is renamed, a reload opens the path again, new lines go to the new
/// file and none is lost from the old one.
#[test]
fn a_reload_reopens_the_log_for_rotation() {
    let dir = Dir::new("access-rotate");
    let origin = Origin::ok("ok");
    let text = config(
        origin.addr,
        "path = \"access.log\"\nflush_interval = \"20ms\"",
    );
    let (server, addr) = start_in(&dir, &text);
    let mut c = Client::connect(addr);
    assert_eq!(c.get("/hello").status, 200);
    let path = dir.0.join("access.log");
    assert!(wait_until(Duration::from_secs(5), || lines(&path).len() == 1));
    std::fs::rename(&path, dir.0.join("access.log.1")).unwrap();
    let g = server.reload_handle().reload_and_wait().expect("reload");
    assert!(server.wait_for_generation(g, Duration::from_secs(5)));
    assert_eq!(c.get("/api/after").status, 200);
    assert!(wait_until(Duration::from_secs(5), || lines(&path).len() == 1));
    assert_eq!(lines(&path)[0]["target"], "/api/after");
    let old = lines(&dir.0.join("access.log.1"));
    assert_eq!(old.len(), 1);
    assert_eq!(old[0]["target"], "/hello");

    // SIGUSR1's reopening works while the config file is broken (being edited, say).
    std::fs::rename(&path, dir.0.join("access.log.2")).unwrap();
    dir.write("this is not a config");
    server
        .reload_handle()
        .reopen_logs_and_wait()
        .expect("reopened");
    std::thread::sleep(Duration::from_millis(60)); // workers take it on their tick
    assert_eq!(c.get("/api/reopened").status, 200);
    assert!(wait_until(Duration::from_secs(5), || lines(&path).len() == 1));
    assert_eq!(lines(&path)[0]["target"], "/api/reopened");
    assert_eq!(lines(&dir.0.join("access.log.2")).len(), 1);

    // A reload that cannot open the file is refused; the running log stays.
    dir.write(&config(
        origin.addr,
        "path = \"missing/dir/access.log\"\nflush_interval = \"20ms\"",
    ));
    let err = server.reload_handle().reload_and_wait().unwrap_err();
    assert!(err.contains("cannot open the access log"), "{err}");
    assert_eq!(c.get("/api/still").status, 200);
    assert!(wait_until(Duration::from_secs(5), || lines(&path).len() == 2));
    // As is a reopening that cannot open the path (a directory stands there now): the open
    // file stays.
    std::fs::rename(&path, dir.0.join("access.log.3")).unwrap();
    std::fs::create_dir(&path).unwrap();
    let err = server.reload_handle().reopen_logs_and_wait().unwrap_err();
    assert!(err.contains("cannot open the access log"), "{err}");
    assert_eq!(c.get("/api/still2").status, 200);
    let moved = dir.0.join("access.log.3");
    assert!(wait_until(Duration::from_secs(5), || lines(&moved).len() == 3));
    std::fs::remove_dir(&path).unwrap();
    std::fs::rename(&moved, &path).unwrap();
    // A reload without the table turns it off.
    dir.write(&text.replace(
        "[access_log]\npath = \"access.log\"\nflush_interval = \"20ms\"\n",
        "",
    ));
    let g = server.reload_handle().reload_and_wait().expect("reload");
    assert!(server.wait_for_generation(g, Duration::from_secs(5)));
    assert_eq!(c.get("/api/unlogged").status, 200);
    std::thread::sleep(Duration::from_millis(100));
    server.shutdown();
    server.join();
    assert_eq!(lines(&path).len(), 3);
}

#[test]
fn the_config_says_what_is_wrong() {
    let origin: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let compile = |log: &str| ringway::config::compile(&config(origin, log), "t.toml");
    let e = compile("buffer_bytes = 100").unwrap_err().to_string();
    assert!(e.contains("access_log needs a `path`"), "{e}");
    let e = compile("path = \"x.log\"\nformat = \"text\"")
        .unwrap_err()
        .to_string();
    assert!(e.contains("format"), "{e}");
    let e = compile("path = \"x.log\"\nflush_interval = \"0s\"")
        .unwrap_err()
        .to_string();
    assert!(e.contains("above zero"), "{e}");
    let e = compile("path = \"x.log\"\nbuffer_bytes = -1")
        .unwrap_err()
        .to_string();
    assert!(e.contains("access_log.buffer_bytes"), "{e}");
    let e = compile("path = \"x.log\"\nbuffer_bytes = 2000000")
        .unwrap_err()
        .to_string();
    assert!(e.contains("between 0 and 1048576"), "{e}");
    let gen = compile("path = \"/var/log/x.log\"").expect("compiles");
    let cfg = gen.access_log.expect("on");
    assert_eq!(cfg.path, Path::new("/var/log/x.log"));
    assert_eq!(cfg.buffer_bytes, 64 * 1024);
    assert_eq!(cfg.flush_interval, Duration::from_secs(1));
    // Relative to the config file's directory.
    let gen = ringway::config::compile(&config(origin, "path = \"a.log\""), "/etc/rw/r.toml")
        .expect("compiles");
    assert_eq!(gen.access_log.expect("on").path, Path::new("/etc/rw/a.log"));
    // Starting with a path that cannot be opened fails with the reason.
    let gen = compile("path = \"/nonexistent-dir-ringway/a.log\"").expect("compiles");
    let e = Server::start(gen).unwrap_err().to_string();
    assert!(e.contains("cannot open the access log"), "{e}");
}
