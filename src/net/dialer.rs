//! Outbound connections with a timeout, to addresses resolved off the worker.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use monoio::net::TcpStream;

/// Connects to `addr` within `timeout`, with TCP_NODELAY set. A timeout is reported as
/// `io::ErrorKind::TimedOut`.
pub async fn connect(addr: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
    let connect = TcpStream::connect_addr(addr);
    let stream = match crate::worker::deadline::timeout(timeout, connect).await {
        Ok(result) => result?,
        Err(_) => return Err(io::Error::from(io::ErrorKind::TimedOut)),
    };
    stream.set_nodelay(true)?;
    Ok(stream)
}
