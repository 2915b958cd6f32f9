//! Listener groups.
//!
//! A plain bind without SO_REUSEPORT comes first, as a probe: if anything (another ringway
//! included) already listens on the address, start-up fails with a clear message instead of
//! silently sharing the port. Then each worker gets its own SO_REUSEPORT socket on the same
//! address (the probe's port, so port 0 in tests resolves once for all workers) and the kernel
//! spreads connections across them.

use std::fmt;
use std::io;
use std::net::{SocketAddr, TcpListener};

use socket2::{Domain, Protocol, Socket, Type};

/// Sockets for one configured listener: one per worker.
#[derive(Debug)]
pub struct ListenerGroup {
    /// The bound address (with the real port when 0 was configured).
    pub addr: SocketAddr,
    /// One socket per worker, in worker order.
    pub sockets: Vec<TcpListener>,
}

/// Why a listener could not be bound.
#[derive(Debug)]
pub struct BindError {
    /// The configured address.
    pub addr: SocketAddr,
    /// The OS error.
    pub source: io::Error,
}

impl fmt::Display for BindError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.source.kind() == io::ErrorKind::AddrInUse {
            write!(
                f,
                "cannot listen on {}: the address is already in use (another ringway or server is listening there)",
                self.addr
            )
        } else {
            write!(f, "cannot listen on {}: {}", self.addr, self.source)
        }
    }
}

impl std::error::Error for BindError {}

/// Binds `addr` once per worker, after the exclusive probe.
pub fn bind_group(
    addr: SocketAddr,
    workers: usize,
    backlog: u32,
) -> Result<ListenerGroup, BindError> {
    let err = |source| BindError { addr, source };
    let probe = TcpListener::bind(addr).map_err(err)?;
    let bound = probe.local_addr().map_err(err)?;
    drop(probe);
    let mut sockets = Vec::with_capacity(workers);
    for _ in 0..workers {
        sockets.push(reuseport_socket(bound, backlog).map_err(err)?);
    }
    Ok(ListenerGroup {
        addr: bound,
        sockets,
    })
}

fn reuseport_socket(addr: SocketAddr, backlog: u32) -> io::Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.set_nonblocking(true)?;
    socket.set_cloexec(true)?;
    socket.bind(&addr.into())?;
    socket.listen(backlog.min(i32::MAX as u32) as i32)?;
    Ok(socket.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_group_on_the_same_port_fails() {
        let a = bind_group("127.0.0.1:0".parse().unwrap(), 2, 16).unwrap();
        assert_eq!(a.sockets.len(), 2);
        assert_ne!(a.addr.port(), 0);
        let e = bind_group(a.addr, 2, 16).unwrap_err();
        assert_eq!(e.source.kind(), io::ErrorKind::AddrInUse);
        assert!(e.to_string().contains("already in use"), "{e}");
    }
}
