//! The admin listener: operator endpoints, served by plain threads off the workers (one per
//! exchange, at most [`MAX_CONCURRENT`] at once), one request per connection. Bound to
//! loopback unless configured otherwise.
//!
//! - `POST /-/reload`: reload the config file now; 200 `{"generation":N}`, or 422 with the
//!   reason the running config was kept (the admin listener is for operators, so the reason is
//!   given in full).
//! - `GET /-/upstreams`: every upstream's breaker, queue and retries, and every endpoint's
//!   health, ejection, drain, in-flight and connection counts, as JSON.
//! - `POST /-/upstreams/{name}/endpoints/{addr}/drain` and `.../undrain`: take an endpoint out
//!   of rotation (in-flight requests finish; it stays resolved, health-checked and pooled) or
//!   put it back. `addr` is the resolved `ip:port` or the configured `host:port` (then every
//!   address of that name). The drain survives reloads while the endpoint stays configured.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::Arc;
use std::time::Duration;

use super::Command;
use crate::http1::{parse_request, HeadLimits, Method, RequestHead};
use crate::shared::Shared;
use crate::upstream::state::BreakerState;

/// How long one admin exchange may take to arrive.
const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest a reload may take before the admin request gives up waiting (the reload goes on).
const RELOAD_WAIT: Duration = Duration::from_secs(60);
/// Largest admin request head.
const MAX_HEAD: usize = 16 * 1024;
/// Admin exchanges served at once, each on its own thread: a client that trickles its head,
/// or a reload in progress, holds one of them and not the listener. One more is answered
/// 503 `busy` at once.
pub const MAX_CONCURRENT: usize = 8;
/// Longest the accepting thread spends on a connection it refuses.
const BUSY_LINGER: Duration = Duration::from_millis(50);

/// One of the [`MAX_CONCURRENT`] slots, given back when dropped.
struct Slot(Arc<AtomicUsize>);

impl Slot {
    fn take(active: &Arc<AtomicUsize>) -> Option<Slot> {
        let slot = Slot(active.clone());
        // (A refused take is given back by the drop.)
        (active.fetch_add(1, Ordering::AcqRel) < MAX_CONCURRENT).then_some(slot)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Serves admin requests on `listener` until `stop` is set.
pub fn serve(
    listener: TcpListener,
    shared: Arc<Shared>,
    commands: Sender<Command>,
    stop: Arc<AtomicBool>,
) {
    if listener.set_nonblocking(true).is_err() {
        tracing::error!("admin listener: cannot set non-blocking; admin endpoints are off");
        return;
    }
    let active = Arc::new(AtomicUsize::new(0));
    while !stop.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((stream, _)) => {
                let _ = stream.set_nonblocking(false);
                let Some(slot) = Slot::take(&active) else {
                    refuse_busy(stream);
                    continue;
                };
                let (shared, commands) = (shared.clone(), commands.clone());
                let spawned = std::thread::Builder::new()
                    .name("ringway-admin-conn".into())
                    .spawn(move || {
                        let _slot = slot;
                        handle(stream, &shared, &commands);
                    });
                // (A thread that could not start dropped its connection and slot.)
                if let Err(e) = spawned {
                    tracing::warn!(error = %e, "admin: cannot spawn a thread for a request");
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                #[allow(clippy::disallowed_methods)] // the admin thread is not a worker
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => {
                tracing::warn!(error = %e, "admin accept failed");
                #[allow(clippy::disallowed_methods)]
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// Answers 503 `busy` on the accepting thread, within [`BUSY_LINGER`]: the answer, then
/// the client's request read and dropped until it closes (closing on unread bytes would reset
/// the connection, and the client could lose the answer).
fn refuse_busy(mut stream: TcpStream) {
    let deadline = std::time::Instant::now() + BUSY_LINGER;
    let _ = stream.set_write_timeout(Some(BUSY_LINGER));
    reply(
        &mut stream,
        503,
        "{\"error\":{\"code\":\"busy\",\"message\":\"too many admin requests at once\"}}",
    );
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let mut sink = [0u8; 1024];
    while let Some(left) = deadline
        .checked_duration_since(std::time::Instant::now())
        .filter(|d| !d.is_zero())
    {
        let _ = stream.set_read_timeout(Some(left));
        if !matches!(stream.read(&mut sink), Ok(n) if n > 0) {
            break;
        }
    }
}

/// Whether a Host value names this machine without a DNS name a browser could have resolved
/// for a page (an IP address, or `localhost`), with or without a port.
fn local_host(host: &[u8]) -> bool {
    let Ok(host) = std::str::from_utf8(host) else {
        return false;
    };
    let name = match host.strip_prefix('[') {
        Some(rest) => match rest.split_once(']') {
            Some((v6, port)) if port.is_empty() || port.starts_with(':') => {
                return v6.parse::<std::net::Ipv6Addr>().is_ok()
                    && port.bytes().skip(1).all(|b| b.is_ascii_digit());
            }
            _ => return false,
        },
        None => match host.rsplit_once(':') {
            Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
            Some(_) => return false,
            None => host,
        },
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::Ipv4Addr>().is_ok()
}

fn handle(mut stream: TcpStream, shared: &Shared, commands: &Sender<Command>) {
    // One deadline for the whole request head: a client trickling bytes cannot hold its
    // admin slot longer than READ_TIMEOUT.
    let deadline = std::time::Instant::now() + READ_TIMEOUT;
    let _ = stream.set_write_timeout(Some(READ_TIMEOUT));
    let mut buf = vec![0u8; MAX_HEAD];
    let mut len = 0;
    let mut head = RequestHead::default();
    let limits = HeadLimits {
        max_head_bytes: MAX_HEAD,
        max_headers: 64,
        max_request_line_bytes: 4096,
        ..HeadLimits::default()
    };
    let parsed = loop {
        let Some(left) = deadline
            .checked_duration_since(std::time::Instant::now())
            .filter(|d| !d.is_zero())
        else {
            return;
        };
        let _ = stream.set_read_timeout(Some(left));
        match stream.read(&mut buf[len..]) {
            Ok(0) | Err(_) => return,
            Ok(n) => len += n,
        }
        match parse_request(&buf[..len], &limits, &mut head) {
            Ok(Some(n)) => break n,
            Ok(None) if len < MAX_HEAD => continue,
            _ if len >= MAX_HEAD => {
                reply(&mut stream, 431, "{\"error\":{\"code\":\"head_too_large\",\"message\":\"admin request head too large\"}}");
                return;
            }
            Err(crate::http1::head::ParseError::UriTooLong) => {
                reply(&mut stream, 414, "{\"error\":{\"code\":\"uri_too_long\",\"message\":\"admin request line too long\"}}");
                return;
            }
            _ => {
                reply(&mut stream, 400, "{\"error\":{\"code\":\"bad_request\",\"message\":\"malformed admin request\"}}");
                return;
            }
        }
    };
    let path = head.path.get(&buf[..parsed]).to_vec();
    // A browser sends Origin on a cross-site post, and Sec-Fetch-Site on requests to secure
    // origins; operators' tools send neither. A page whose DNS name was rebound to a loopback
    // address (DNS rebinding) reads it same-origin over plain HTTP with neither, but names
    // its own host: on a loopback address, a Host that is not an IP address or `localhost`
    // is refused as well. (An admin listener bound elsewhere is reachable without a browser's
    // help, and scrapers name it as they please.) Refusing them keeps web pages from
    // reloading, draining, or reading the endpoint list through a loopback port.
    let on_loopback = stream
        .local_addr()
        .is_ok_and(|a| a.ip().to_canonical().is_loopback());
    let from_browser = head.headers.iter().any(|h| {
        let name = h.name.get(&buf[..parsed]);
        name.eq_ignore_ascii_case(b"origin")
            || name.eq_ignore_ascii_case(b"sec-fetch-site")
            || (on_loopback
                && name.eq_ignore_ascii_case(b"host")
                && !local_host(h.value.get(&buf[..parsed])))
    });
    if from_browser {
        reply(&mut stream, 403, "{\"error\":{\"code\":\"forbidden\",\"message\":\"admin requests from browsers are refused\"}}");
        return;
    }
    match (head.method, path.as_slice()) {
        (Method::Post, b"/-/reload") => {
            let (tx, rx) = mpsc::channel();
            if commands.send(Command::Reload { reply: Some(tx) }).is_err() {
                reply(&mut stream, 503, "{\"error\":{\"code\":\"unavailable\",\"message\":\"the control thread is not running\"}}");
                return;
            }
            match rx.recv_timeout(RELOAD_WAIT) {
                Ok(Ok(generation)) => reply(&mut stream, 200, &format!("{{\"generation\":{generation}}}")),
                Ok(Err(why)) => reply(
                    &mut stream,
                    422,
                    &format!("{{\"error\":{{\"code\":\"reload_failed\",\"message\":{}}}}}", json_string(&why)),
                ),
                Err(_) => reply(&mut stream, 504, "{\"error\":{\"code\":\"timeout\",\"message\":\"the reload is still running\"}}"),
            }
        }
        (_, b"/-/reload") => reply(
            &mut stream,
            405,
            "{\"error\":{\"code\":\"method_not_allowed\",\"message\":\"use POST\"}}",
        ),
        (Method::Get, b"/-/upstreams") => reply(&mut stream, 200, &upstreams_json(shared)),
        // The listeners' reserved paths, here too (for `http.reserved_paths = false`).
        (Method::Get, b"/metrics") => {
            let text = crate::observe::metrics::render_all(
                shared,
                shared.millis(std::time::Instant::now()),
            );
            reply_typed(
                &mut stream,
                200,
                "text/plain; version=0.0.4; charset=utf-8",
                &text,
            );
        }
        (Method::Get, b"/healthz") => reply(&mut stream, 200, "{\"status\":\"ok\"}"),
        (Method::Get, b"/readyz") if shared.is_draining() => {
            reply(&mut stream, 503, "{\"status\":\"draining\"}")
        }
        (Method::Get, b"/readyz") => reply(&mut stream, 200, "{\"status\":\"ready\"}"),
        (_, b"/-/upstreams" | b"/metrics" | b"/healthz" | b"/readyz") => reply(
            &mut stream,
            405,
            "{\"error\":{\"code\":\"method_not_allowed\",\"message\":\"use GET\"}}",
        ),
        (method, p) if p.starts_with(b"/-/upstreams/") => {
            let (status, body) = drain_request(shared, method, &p[b"/-/upstreams/".len()..]);
            reply(&mut stream, status, &body);
        }
        _ => reply(
            &mut stream,
            404,
            "{\"error\":{\"code\":\"no_route\",\"message\":\"no admin endpoint here\"}}",
        ),
    }
}

/// The state of every upstream and endpoint.
fn upstreams_json(shared: &Shared) -> String {
    let published = shared.published.load_full();
    let now_ms = shared.millis(std::time::Instant::now());
    let mut out = String::from("{\"generation\":");
    out.push_str(&published.number.to_string());
    out.push_str(",\"upstreams\":[");
    for (i, (cfg, st)) in published
        .gen
        .upstreams
        .iter()
        .zip(published.upstreams.iter())
        .enumerate()
    {
        if i > 0 {
            out.push(',');
        }
        let (state, opened) = st.breaker.state();
        let (state, retry_in) = match state {
            BreakerState::Closed => ("closed", 0),
            BreakerState::HalfOpen => ("half_open", 0),
            BreakerState::Open => {
                let open_ms = cfg.breaker.open_duration.as_millis() as u64;
                ("open", (opened + open_ms).saturating_sub(now_ms))
            }
        };
        out.push_str(&format!(
            "{{\"name\":{},\"balancer\":\"{}\",\"breaker\":{{\"state\":\"{state}\",\"half_open_in_ms\":{retry_in}}},\"pending\":{},\"active_retries\":{},\"endpoints\":[",
            json_string(&cfg.name),
            cfg.balancer.name(),
            st.pending.load(Ordering::Relaxed),
            st.active_retries.load(Ordering::Relaxed),
        ));
        let eps = published.endpoints.get(i).map(Vec::as_slice).unwrap_or(&[]);
        for (j, e) in eps.iter().enumerate() {
            if j > 0 {
                out.push(',');
            }
            let s = &e.state;
            let until = s.ejected_until.load(Ordering::Relaxed);
            out.push_str(&format!(
                "{{\"address\":\"{}\",\"authority\":{},\"weight\":{},\"healthy\":{},\"ejected\":{},\"ejected_for_ms\":{},\"ejections\":{},\"drained\":{},\"in_flight\":{},\"connections\":{}}}",
                e.addr,
                json_string(&e.authority),
                e.weight,
                s.healthy.load(Ordering::Relaxed),
                s.ejected(now_ms),
                until.saturating_sub(now_ms),
                s.ejections.load(Ordering::Relaxed),
                s.drained.load(Ordering::Relaxed),
                s.in_flight_total(),
                s.connections.load(Ordering::Relaxed),
            ));
        }
        out.push_str("]}");
    }
    out.push_str("]}");
    out
}

/// `{name}/endpoints/{addr}/drain|undrain`: the status and body of the answer.
fn drain_request(shared: &Shared, method: Method, rest: &[u8]) -> (u16, String) {
    let error = |code: &str, message: &str| {
        format!(
            "{{\"error\":{{\"code\":\"{code}\",\"message\":{}}}}}",
            json_string(message)
        )
    };
    let text = String::from_utf8_lossy(rest);
    let parts: Vec<&str> = text.split('/').collect();
    let [name, "endpoints", addr, action] = parts.as_slice() else {
        return (404, error("no_route", "no admin endpoint here"));
    };
    let drain = match *action {
        "drain" => true,
        "undrain" => false,
        _ => return (404, error("no_route", "no admin endpoint here")),
    };
    if method != Method::Post {
        return (405, error("method_not_allowed", "use POST"));
    }
    let published = shared.published.load_full();
    let Some(i) = published.gen.upstreams.iter().position(|u| u.name == *name) else {
        return (
            404,
            error("unknown_upstream", &format!("no upstream named `{name}`")),
        );
    };
    let eps = published.endpoints.get(i).map(Vec::as_slice).unwrap_or(&[]);
    let mut changed = 0;
    for e in eps {
        if e.addr.to_string() == *addr || &*e.authority == *addr {
            e.state.drained.store(drain, Ordering::Relaxed);
            changed += 1;
        }
    }
    if changed == 0 {
        return (
            404,
            error(
                "unknown_endpoint",
                &format!("upstream `{name}` has no endpoint `{addr}`"),
            ),
        );
    }
    tracing::info!(upstream = %name, endpoint = %addr, drained = drain, "endpoint drain changed by the admin API");
    (
        200,
        format!("{{\"upstream\":{},\"endpoint\":{},\"drained\":{drain},\"endpoints_changed\":{changed}}}", json_string(name), json_string(addr)),
    )
}

fn reply(stream: &mut TcpStream, status: u16, body: &str) {
    reply_typed(stream, status, "application/json", body);
}

fn reply_typed(stream: &mut TcpStream, status: u16, content_type: &str, body: &str) {
    let text = format!(
        "HTTP/1.1 {status} {}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        crate::http1::reason_phrase(status),
        body.len()
    );
    let _ = stream.write_all(text.as_bytes());
}

/// A JSON string literal.
pub fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_addresses_and_localhost_are_local_hosts() {
        for ok in [
            "127.0.0.1",
            "127.0.0.1:9901",
            "localhost",
            "LocalHost:9901",
            "[::1]",
            "[::1]:9901",
            "10.0.0.7:80",
        ] {
            assert!(local_host(ok.as_bytes()), "{ok}");
        }
        for refused in [
            "rebound.example",
            "rebound.example:9901",
            "localhost.evil.example",
            "127.0.0.1.nip.io",
            "[::1",
            "[::1]x",
            "[rebound.example]",
            "127.0.0.1:99x",
            "",
            "\u{fc}",
        ] {
            assert!(!local_host(refused.as_bytes()), "{refused}");
        }
    }

    #[test]
    fn json_strings_escape() {
        assert_eq!(json_string("a\"b\\c\nd"), "\"a\\\"b\\\\c\\u000ad\"");
    }
}
