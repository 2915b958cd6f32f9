//! The load test's origin: a small, fast keep-alive HTTP/1.1 server on one monoio thread.
//!
//! `GET /1m` answers 1 MiB, `GET /1g` 1 GiB (streamed from the same 1 MiB), anything else 12
//! bytes (`hello world\n`). Request bodies (Content-Length or chunked) are read and dropped, so
//! uploads can be measured too.
//!
//! Usage: `origin ADDR` (e.g. `127.0.0.1:9000`); pin it with taskset.

use std::net::SocketAddr;

use monoio::buf::IoBufMut;
use monoio::io::{AsyncReadRent, AsyncWriteRentExt};
use monoio::net::{TcpListener, TcpStream};
use ringway::http1::{parse_request, BodyFraming, ChunkedDecoder, HeadLimits, RequestHead};

const SMALL: &[u8] =
    b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 12\r\n\r\nhello world\n";
const SMALL_CLOSE: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 12\r\nconnection: close\r\n\r\nhello world\n";
const MIB: usize = 1024 * 1024;

fn big_response() -> &'static [u8] {
    let mut r = format!("HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\ncontent-length: {MIB}\r\n\r\n").into_bytes();
    r.extend((0..MIB).map(|i| (i % 251) as u8));
    Box::leak(r.into_boxed_slice())
}

fn main() {
    let addr: SocketAddr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:9000".into())
        .parse()
        .expect("usage: origin IP:PORT");
    let big = big_response();
    let mut rt = monoio::RuntimeBuilder::<monoio::FusionDriver>::new()
        .enable_timer()
        .with_entries(4096)
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let listener = TcpListener::bind(addr).expect("bind");
        eprintln!("origin listening on {addr}");
        loop {
            if let Ok((stream, _)) = listener.accept().await {
                monoio::spawn(serve(stream, big));
            }
        }
    });
}

async fn serve(mut s: TcpStream, big: &'static [u8]) {
    let _ = s.set_nodelay(true);
    let limits = HeadLimits {
        max_head_bytes: 64 * 1024,
        max_headers: 100,
        max_request_line_bytes: 8192,
        ..HeadLimits::default()
    };
    let mut head = RequestHead::default();
    let mut buf: Vec<u8> = Vec::with_capacity(64 * 1024);
    let mut start = 0;
    loop {
        // One head.
        let len = loop {
            match parse_request(&buf[start..], &limits, &mut head) {
                Ok(Some(n)) => break n,
                Ok(None) => {}
                Err(_) => return,
            }
            if !fill(&mut s, &mut buf, &mut start).await {
                return;
            }
        };
        let path = head.path.get(&buf[start..]);
        let (path_is_big, path_is_huge) = (path == b"/1m", path == b"/1g");
        let keep = head.keep_alive;
        let framing = head.framing;
        start += len;
        // Its body, dropped.
        match framing {
            BodyFraming::Length(mut n) => {
                while n > 0 {
                    if start == buf.len() && !fill(&mut s, &mut buf, &mut start).await {
                        return;
                    }
                    let take = ((buf.len() - start) as u64).min(n) as usize;
                    start += take;
                    n -= take as u64;
                }
            }
            BodyFraming::Chunked => {
                let mut dec = ChunkedDecoder::new();
                while !dec.is_done() {
                    if start == buf.len() && !fill(&mut s, &mut buf, &mut start).await {
                        return;
                    }
                    match dec.step(&buf[start..]) {
                        Ok(step) => start += step.bytes(),
                        Err(_) => return,
                    }
                }
            }
            _ => {}
        }
        if path_is_huge {
            let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", 1024 * MIB);
            let (res, _) = s.write_all(head.into_bytes()).await;
            if res.is_err() {
                return;
            }
            let body = &big[big.len() - MIB..];
            for _ in 0..1024 {
                let (res, _) = s.write_all(body).await;
                if res.is_err() {
                    return;
                }
            }
        } else {
            let reply: &'static [u8] = match (path_is_big, keep) {
                (true, _) => big,
                (false, true) => SMALL,
                (false, false) => SMALL_CLOSE,
            };
            let (res, _) = s.write_all(reply).await;
            if res.is_err() {
                return;
            }
        }
        if !keep {
            return;
        }
    }
}

/// Reads more bytes, compacting first; false on EOF or error.
async fn fill(s: &mut TcpStream, buf: &mut Vec<u8>, start: &mut usize) -> bool {
    if *start > 0 {
        buf.drain(..*start);
        *start = 0;
    }
    if buf.len() == buf.capacity() {
        buf.reserve(64 * 1024);
    }
    let owned = std::mem::take(buf);
    let len = owned.len();
    // A Vec's slice counts `set_init` as monoio documents it (the rule is for `buf::Block`).
    #[allow(clippy::disallowed_methods)]
    let (res, slice) = s.read(owned.slice_mut(len..)).await;
    *buf = slice.into_inner();
    matches!(res, Ok(n) if n > 0)
}
