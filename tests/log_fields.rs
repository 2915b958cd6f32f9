//! Log lines carry client-controlled text escaped: a request id sent by a client cannot add
//! fields to a line (the subscriber here is the binary's default format, without colour).
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

mod support;

use std::io::Write;
use std::sync::{Arc, Mutex};

use support::*;

#[derive(Clone)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_client_request_id_cannot_forge_fields_of_a_log_line() {
    let lines = Captured(Arc::new(Mutex::new(Vec::new())));
    let writer = lines.clone();
    tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_target(false)
        .init();
    let proxy = Proxy::to(closed_port(), "workers = 1\n");
    let mut c = proxy.connect();
    c.send(
        b"GET / HTTP/1.1\r\nHost: a\r\nX-Request-Id: x upstream=payments endpoint=10.0.0.9:80\r\n\r\n",
    );
    let r = c.read_response(false).expect("a response");
    assert_eq!(r.status, 502);
    let text = String::from_utf8_lossy(&lines.0.lock().unwrap()).into_owned();
    assert!(
        text.contains("request_id=\"x upstream=payments endpoint=10.0.0.9:80\""),
        "the id is one quoted value: {text}"
    );
}
