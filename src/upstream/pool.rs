//! Per-endpoint idle keep-alive connections, most recently used first.
//!
//! Ownership: inside a worker's `UpstreamRt` (never `Send`).
//! Invariant: only connections whose previous exchange completed exactly are pushed here.
//! Reuse is LIFO: the warmest connection goes first, and the coldest ones age out.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::rc::Rc;
use std::time::{Duration, Instant};

use monoio::io::{OwnedReadHalf, OwnedWriteHalf, Splitable};
use monoio::net::TcpStream;

use crate::net::sys::idle_socket_usable;

/// An upstream connection, split so the request body can be sent while the response head is
/// read.
#[derive(Debug)]
pub struct UpConn {
    /// Read half.
    pub read: OwnedReadHalf<TcpStream>,
    /// Write half.
    pub write: OwnedWriteHalf<TcpStream>,
    fd: RawFd,
    addr: SocketAddr,
    authority: Rc<str>,
    reused: bool,
}

impl UpConn {
    /// Wraps a freshly connected stream to `addr`, whose Host value is `authority`.
    pub fn new(stream: TcpStream, addr: SocketAddr, authority: Rc<str>) -> Self {
        let fd = stream.as_raw_fd();
        let (read, write) = stream.into_split();
        UpConn {
            read,
            write,
            fd,
            addr,
            authority,
            reused: false,
        }
    }

    /// The endpoint address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The Host value for requests on this connection.
    pub fn authority(&self) -> &str {
        &self.authority
    }

    /// Whether this connection served an earlier request.
    pub fn is_reused(&self) -> bool {
        self.reused
    }

    pub(crate) fn mark_reused(&mut self) {
        self.reused = true;
    }

    /// Whether the idle socket still looks usable (no EOF, reset or stray bytes).
    pub fn idle_usable(&self) -> bool {
        idle_socket_usable(self.fd)
    }
}

/// Idle connections of one endpoint.
#[derive(Debug, Default)]
pub struct IdlePool {
    idle: VecDeque<(UpConn, Instant)>,
}

impl IdlePool {
    /// Idle connections held.
    pub fn len(&self) -> usize {
        self.idle.len()
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.idle.is_empty()
    }

    /// The most recently used connection that has not outlived `idle_timeout`.
    pub fn pop(&mut self, now: Instant, idle_timeout: Duration) -> Option<UpConn> {
        while let Some((conn, since)) = self.idle.pop_back() {
            if now.saturating_duration_since(since) < idle_timeout {
                return Some(conn);
            }
            // Older ones are older still: drop them all.
            self.idle.clear();
        }
        None
    }

    /// Adds a connection; when `max` are held already, the oldest is closed.
    pub fn push(&mut self, conn: UpConn, now: Instant, max: usize) {
        if max == 0 {
            return;
        }
        while self.idle.len() >= max {
            self.idle.pop_front();
        }
        self.idle.push_back((conn, now));
    }

    /// Closes connections idle for `idle_timeout` or longer.
    pub fn reap(&mut self, now: Instant, idle_timeout: Duration) {
        while let Some((_, since)) = self.idle.front() {
            if now.saturating_duration_since(*since) >= idle_timeout {
                self.idle.pop_front();
            } else {
                break;
            }
        }
    }

    /// Closes every idle connection.
    pub fn clear(&mut self) {
        self.idle.clear();
    }
}
