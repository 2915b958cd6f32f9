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

/// One HTTP/2 connection.
#[derive(Debug)]
struct Conn {
    send: SendRequest<Bytes>,
    streams: Rc<Cell<usize>>,
    closed: Rc<Cell<bool>>,
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
        state: &Arc<EndpointState>,
        max_conns: usize,
        max_conns_total: u32,
        connect_timeout: Duration,
    ) -> Result<(SendRequest<Bytes>, StreamSlot), ConnectError> {
        let pick = {
            let mut conns = self.conns.borrow_mut();
            conns.retain(|c| !c.closed.get());
            let best = conns.iter().min_by_key(|c| c.streams.get());
            match best {
                Some(c)
                    if c.streams.get() < c.send.current_max_send_streams()
                        || conns.len() >= max_conns =>
                {
                    c.streams.set(c.streams.get() + 1);
                    Some((c.send.clone(), StreamSlot(c.streams.clone())))
                }
                _ => None,
            }
        };
        if let Some(p) = pick {
            return Ok(p);
        }
        if !state.open_connection(max_conns_total) {
            return Err(ConnectError::Busy);
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
        let io = match tcp.try_into_poll_io() {
            Ok(io) => io,
            Err((e, _)) => {
                state.close_connection();
                return Err(ConnectError::Failed(e));
            }
        };
        let handshake =
            monoio::time::timeout(connect_timeout, h2::client::Builder::new().handshake(io)).await;
        let (send, connection) = match handshake {
            Ok(Ok(pair)) => pair,
            Ok(Err(e)) => {
                state.close_connection();
                return Err(ConnectError::Failed(std::io::Error::other(e)));
            }
            Err(_) => {
                state.close_connection();
                return Err(ConnectError::TimedOut);
            }
        };
        let closed = Rc::new(Cell::new(false));
        {
            let (closed, state) = (closed.clone(), state.clone());
            monoio::spawn(async move {
                if let Err(e) = connection.await {
                    tracing::debug!(error = %e, "upstream HTTP/2 connection ended");
                }
                closed.set(true);
                state.close_connection();
            });
        }
        let streams = Rc::new(Cell::new(1));
        self.conns.borrow_mut().push(Conn {
            send: send.clone(),
            streams: streams.clone(),
            closed,
        });
        Ok((send, StreamSlot(streams)))
    }
}
