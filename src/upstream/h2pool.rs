//! HTTP/2 connections to one endpoint on one worker: a few, multiplexed.
//!
//! Each connection has a driver task (the h2 crate's connection future, which does all its
//! I/O) and counts its open streams; a request takes the least loaded connection that has a
//! stream to spare under the peer's SETTINGS, or opens another up to `h2_connections`. A
//! connection whose driver ended (GOAWAY, error, peer close) is dropped from the pool.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use h2::client::SendRequest;

use super::state::EndpointState;
use super::ConnectError;
use crate::net;

/// Connection limits for [`H2Pool::stream`].
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// HTTP/2 connections per endpoint on this worker.
    pub conns: usize,
    /// Connections per endpoint across workers (0: unlimited).
    pub total: u32,
    /// Time for TCP, TLS and the HTTP/2 handshake each.
    pub connect_timeout: Duration,
}

/// The HTTP/2 handshake on `io`, and its driver task (which gives the endpoint's connection
/// slot back and marks the connection closed when it ends).
async fn handshake<T>(
    io: T,
    timeout: Duration,
    state: Arc<EndpointState>,
) -> Result<(SendRequest<Bytes>, Rc<Cell<bool>>), std::io::Error>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + 'static,
{
    let (send, connection) =
        match monoio::time::timeout(timeout, h2::client::Builder::new().handshake(io)).await {
            Ok(Ok(pair)) => pair,
            Ok(Err(e)) => return Err(std::io::Error::other(e)),
            Err(_) => return Err(std::io::ErrorKind::TimedOut.into()),
        };
    let closed = Rc::new(Cell::new(false));
    let c = closed.clone();
    monoio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "upstream HTTP/2 connection ended");
        }
        c.set(true);
        state.close_connection();
    });
    Ok((send, closed))
}

/// Whether the connection can take no new stream (a GOAWAY came, or it failed, or its
/// stream ids ran out), though its driver may still run for the streams in flight.
fn refuses_streams(send: &SendRequest<Bytes>) -> bool {
    let mut probe = send.clone();
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    // A fresh handle has no stream pending open: readiness is the connection's state.
    matches!(probe.poll_ready(&mut cx), std::task::Poll::Ready(Err(_)))
}

/// One HTTP/2 connection.
#[derive(Debug)]
struct Conn {
    send: SendRequest<Bytes>,
    streams: Rc<Cell<usize>>,
    closed: Rc<Cell<bool>>,
}

impl Conn {
    /// A handle to send one request on, holding one of this connection's stream counts.
    fn take_stream(&self) -> (SendRequest<Bytes>, StreamSlot) {
        self.streams.set(self.streams.get() + 1);
        (self.send.clone(), StreamSlot(self.streams.clone()))
    }
}

/// An endpoint's HTTP/2 connections on this worker.
#[derive(Debug, Default)]
pub struct H2Pool {
    conns: RefCell<Vec<Conn>>,
}

/// A stream's hold on its connection's count, given back when dropped.
#[derive(Debug)]
pub struct StreamSlot(Rc<Cell<usize>>);

impl Drop for StreamSlot {
    fn drop(&mut self) {
        self.0.set(self.0.get().saturating_sub(1));
    }
}

impl H2Pool {
    /// Open connections.
    pub fn len(&self) -> usize {
        self.conns.borrow().len()
    }

    /// Whether none is open.
    pub fn is_empty(&self) -> bool {
        self.conns.borrow().is_empty()
    }

    /// Closes every connection (their drivers end when the handles are gone).
    pub fn clear(&self) {
        self.conns.borrow_mut().clear();
    }

    /// A handle to send one request on, and its stream slot: the least loaded connection
    /// with room under the peer's stream limit, else a new one (up to `max_conns`), else the
    /// least loaded anyway (h2 queues the stream until one is free).
    pub async fn stream(
        &self,
        addr: std::net::SocketAddr,
        authority: &str,
        state: &Arc<EndpointState>,
        limits: Limits,
        tls: Option<&crate::tls::client::UpstreamTls>,
    ) -> Result<(SendRequest<Bytes>, StreamSlot), ConnectError> {
        let Limits {
            conns: max_conns,
            total: max_conns_total,
            connect_timeout,
        } = limits;
        let pick = loop {
            let mut conns = self.conns.borrow_mut();
            conns.retain(|c| !c.closed.get());
            let best = conns.iter().min_by_key(|c| c.streams.get());
            match best {
                Some(c)
                    if c.streams.get() < c.send.current_max_send_streams()
                        || conns.len() >= max_conns =>
                {
                    // A connection told to go away keeps running for its streams in
                    // flight, but takes no new one: out of the pool with it.
                    if refuses_streams(&c.send) {
                        c.closed.set(true);
                        continue;
                    }
                    break Some(c.take_stream());
                }
                _ => break None,
            }
        };
        if let Some(p) = pick {
            return Ok(p);
        }
        if !state.open_connection(max_conns_total) {
            // At the endpoint's connection cap (across workers): share a connection this
            // worker has, h2 queues the stream until the peer allows it; refuse only with none.
            let conns = self.conns.borrow();
            let open = conns
                .iter()
                .filter(|c| !c.closed.get() && !refuses_streams(&c.send));
            return match open.min_by_key(|c| c.streams.get()) {
                Some(c) => Ok(c.take_stream()),
                None => Err(ConnectError::Busy),
            };
        }
        let tcp = match net::connect(addr, connect_timeout).await {
            Ok(s) => s,
            Err(e) => {
                state.close_connection();
                return Err(if e.kind() == std::io::ErrorKind::TimedOut {
                    ConnectError::TimedOut
                } else {
                    ConnectError::Failed(e)
                });
            }
        };
        let failed = |e: std::io::Error| {
            state.close_connection();
            if e.kind() == std::io::ErrorKind::TimedOut {
                ConnectError::TimedOut
            } else {
                ConnectError::Failed(e)
            }
        };
        let handshake = match tls {
            None => {
                let io = tcp.try_into_poll_io().map_err(|(e, _)| failed(e))?;
                handshake(io, connect_timeout, state.clone()).await
            }
            Some(tls) => {
                let s = super::tls_connect(tls, authority, tcp, connect_timeout)
                    .await
                    .map_err(failed)?;
                if s.alpn() != Some(&b"h2"[..]) {
                    return Err(failed(std::io::Error::other(
                        "the upstream did not agree on HTTP/2 (ALPN h2)",
                    )));
                }
                let (conn, tcp, pending) = s
                    .into_parts()
                    .ok_or_else(|| failed(std::io::Error::other("TLS session split")))?;
                let io = tcp.try_into_poll_io().map_err(|(e, _)| failed(e))?;
                handshake(
                    crate::h2::io::PollTls::new(io, conn, pending),
                    connect_timeout,
                    state.clone(),
                )
                .await
            }
        };
        let (send, closed) = handshake.map_err(failed)?;
        let streams = Rc::new(Cell::new(1));
        self.conns.borrow_mut().push(Conn {
            send: send.clone(),
            streams: streams.clone(),
            closed,
        });
        Ok((send, StreamSlot(streams)))
    }
}
