//! Per-endpoint idle keep-alive connections, most recently used first.
//!
//! Ownership: inside a worker's `UpstreamRt` (never `Send`).
//! Invariant: only connections whose previous exchange completed exactly are pushed here.
//! Reuse is LIFO: the warmest connection goes first, and the coldest ones age out.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use monoio::io::Splitable;
use monoio::net::TcpStream;

use super::state::EndpointState;
use crate::net::client::{ReadHalf, WriteHalf};
use crate::net::sys::idle_socket_usable;
use crate::tls::TlsStream;

/// An upstream connection, split so the request body can be sent while the response head is
/// read. It holds one of its endpoint's connection slots until dropped.
#[derive(Debug)]
pub struct UpConn {
    /// Read half.
    pub read: ReadHalf,
    /// Write half.
    pub write: WriteHalf,
    fd: RawFd,
    addr: SocketAddr,
    authority: Arc<str>,
    endpoint: Arc<EndpointState>,
    reused: bool,
    /// Reuse only after the `MSG_PEEK` check, whatever the request (see `UpstreamRt::connect`).
    pub(super) check_before_reuse: bool,
    /// Handed out without that check.
    pub(super) unchecked: bool,
}

impl Drop for UpConn {
    fn drop(&mut self) {
        self.endpoint.close_connection();
    }
}

impl UpConn {
    /// The connection's socket (under TLS too).
    pub fn fd(&self) -> RawFd {
        self.fd
    }

    /// The socket of a cleartext connection, whose writes are best sized to whole TCP
    /// segments ([`crate::net::sys::segment_size`]); `None` over TLS, whose records set them.
    pub fn plain_fd(&self) -> Option<RawFd> {
        match self.write {
            WriteHalf::Plain(_) => Some(self.fd),
            WriteHalf::Tls(_) => None,
        }
    }

    /// Wraps a freshly connected stream to `addr`, whose Host value is `authority`; the
    /// connection slot it took on `endpoint` is given back when it drops.
    pub fn new(
        stream: TcpStream,
        addr: SocketAddr,
        authority: Arc<str>,
        endpoint: Arc<EndpointState>,
    ) -> Self {
        let fd = stream.as_raw_fd();
        let (read, write) = stream.into_split();
        UpConn {
            read: ReadHalf::Plain(read),
            write: WriteHalf::Plain(write),
            fd,
            addr,
            authority,
            endpoint,
            reused: false,
            check_before_reuse: false,
            unchecked: false,
        }
    }

    /// Wraps a TLS connection (`fd` its socket) to `addr`, like [`UpConn::new`].
    pub fn new_tls(
        tls: TlsStream,
        fd: RawFd,
        addr: SocketAddr,
        authority: Arc<str>,
        endpoint: Arc<EndpointState>,
    ) -> Self {
        let (read, write) = tls.into_split();
        UpConn {
            read: ReadHalf::Tls(Box::new(read)),
            write: WriteHalf::Tls(Box::new(write)),
            fd,
            addr,
            authority,
            endpoint,
            reused: false,
            check_before_reuse: false,
            unchecked: false,
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

    /// Whether this is a connection to the endpoint whose state is `state`.
    pub fn belongs_to(&self, state: &Arc<EndpointState>) -> bool {
        Arc::ptr_eq(&self.endpoint, state)
    }

    /// Whether this connection served an earlier request.
    pub fn is_reused(&self) -> bool {
        self.reused
    }

    pub(crate) fn mark_reused(&mut self) {
        self.reused = true;
    }

    /// Asks for the idle check before the next reuse in any case: after an exchange whose
    /// response had no body (HEAD, 204, 304, an empty body), the case where a broken server
    /// sends bytes nobody asked for.
    pub fn set_check_before_reuse(&mut self, yes: bool) {
        self.check_before_reuse = yes;
    }

    /// Whether this pooled connection was handed out without the idle check.
    pub fn is_unchecked(&self) -> bool {
        self.unchecked
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

    /// The most recently used connection that has not outlived `idle_timeout`, and how long
    /// it was idle.
    pub fn pop(&mut self, now: Instant, idle_timeout: Duration) -> Option<(UpConn, Duration)> {
        while let Some((conn, since)) = self.idle.pop_back() {
            let idle = now.saturating_duration_since(since);
            if idle < idle_timeout {
                return Some((conn, idle));
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

    /// Closes the oldest connections beyond `max`.
    pub fn trim(&mut self, max: usize) {
        while self.idle.len() > max {
            self.idle.pop_front();
        }
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
