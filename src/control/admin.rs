//! The admin listener: operator endpoints, served by a plain thread off the workers, one
//! request per connection. Bound to loopback unless configured otherwise.
//!
//! - `POST /-/reload`: reload the config file now; 200 `{"generation":N}`, or 422 with the
//!   reason the running config was kept (the admin listener is for operators, so the reason is
//!   given in full).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::Arc;
use std::time::Duration;

use super::Command;
use crate::http1::{parse_request, HeadLimits, Method, RequestHead};

/// How long one admin exchange may take to arrive.
const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest a reload may take before the admin request gives up waiting (the reload goes on).
const RELOAD_WAIT: Duration = Duration::from_secs(60);
/// Largest admin request head.
const MAX_HEAD: usize = 16 * 1024;

/// Serves admin requests on `listener` until `stop` is set.
pub fn serve(listener: TcpListener, commands: Sender<Command>, stop: Arc<AtomicBool>) {
    if listener.set_nonblocking(true).is_err() {
        tracing::error!("admin listener: cannot set non-blocking; admin endpoints are off");
        return;
    }
    while !stop.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((stream, _)) => {
                let _ = stream.set_nonblocking(false);
                handle(stream, &commands);
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

fn handle(mut stream: TcpStream, commands: &Sender<Command>) {
    let _ = stream.set_read_timeout(Some(READ_TIMEOUT));
    let _ = stream.set_write_timeout(Some(READ_TIMEOUT));
    let mut buf = vec![0u8; MAX_HEAD];
    let mut len = 0;
    let mut head = RequestHead::default();
    let limits = HeadLimits {
        max_head_bytes: MAX_HEAD,
        max_headers: 64,
        max_request_line_bytes: 4096,
    };
    let parsed = loop {
        match stream.read(&mut buf[len..]) {
            Ok(0) | Err(_) => return,
            Ok(n) => len += n,
        }
        match parse_request(&buf[..len], &limits, &mut head) {
            Ok(Some(n)) => break n,
            Ok(None) if len < MAX_HEAD => continue,
            _ => {
                reply(&mut stream, 400, "{\"error\":{\"code\":\"bad_request\",\"message\":\"malformed admin request\"}}");
                return;
            }
        }
    };
    let path = head.path.get(&buf[..parsed]).to_vec();
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
        _ => reply(
            &mut stream,
            404,
            "{\"error\":{\"code\":\"no_route\",\"message\":\"no admin endpoint here\"}}",
        ),
    }
}

fn reply(stream: &mut TcpStream, status: u16, body: &str) {
    let text = format!(
        "HTTP/1.1 {status} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
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
    fn json_strings_escape() {
        assert_eq!(json_string("a\"b\\c\nd"), "\"a\\\"b\\\\c\\u000ad\"");
    }
}
