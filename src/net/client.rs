//! The client side of a connection: plain TCP or TLS, behind one type the request path uses,
//! and the client's address as the request path needs it ([`Peer`]).
//!
//! An enum rather than a trait object: a match per operation, no allocation, and the plain
//! case stays a direct call into monoio's TCP stream.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, RawFd};

use monoio::buf::{IoBuf, IoBufMut, IoVecBuf, IoVecBufMut};
use monoio::io::{AsyncReadRent, AsyncWriteRent, OwnedReadHalf, OwnedWriteHalf, Splitable};
use monoio::net::TcpStream;
use monoio::BufResult;

use crate::h2::bridge::VirtualConn;
use crate::http1::encode::decimal;
use crate::tls::{TlsReadHalf, TlsStream, TlsWriteHalf};

/// The client's address as the request path uses it: the IP (an IPv4-mapped IPv6 address as
/// IPv4) and its text for forwarded headers, worked out once per connection (for HTTP/2 once
/// per connection, not per stream).
#[derive(Debug, Clone, Copy)]
pub struct Peer {
    /// The socket address, for logs.
    pub addr: SocketAddr,
    /// The IP trust lists are checked against.
    ip: IpAddr,
    /// The IP as forwarded headers carry it.
    text: PeerText,
}

impl Peer {
    /// The client at `addr`.
    pub fn new(addr: SocketAddr) -> Self {
        let ip = addr.ip().to_canonical();
        Peer {
            addr,
            ip,
            text: PeerText::new(ip),
        }
    }

    /// The IP, an IPv4-mapped IPv6 address as IPv4 (what trust lists are checked against).
    pub fn ip(&self) -> IpAddr {
        self.ip
    }

    /// The IP as text (what forwarded headers carry).
    pub fn text(&self) -> &str {
        self.text.as_str()
    }
}

/// The peer IP as text.
#[derive(Debug, Clone, Copy)]
struct PeerText {
    bytes: [u8; 48],
    len: u8,
}

impl PeerText {
    fn new(ip: IpAddr) -> Self {
        let mut bytes = [0u8; 48];
        let len = match ip {
            // By hand: `Display` goes through the formatting machinery, about 1,000
            // instructions, once per connection (a `Connection: close` client pays it for
            // every request).
            IpAddr::V4(v4) => {
                let mut at = 0;
                let mut digits = [0u8; 20];
                for (i, octet) in v4.octets().into_iter().enumerate() {
                    if i > 0 {
                        bytes[at] = b'.';
                        at += 1;
                    }
                    let d = decimal(u64::from(octet), &mut digits);
                    bytes[at..at + d.len()].copy_from_slice(d);
                    at += d.len();
                }
                at
            }
            IpAddr::V6(v6) => {
                use std::io::Write;
                let mut cursor = &mut bytes[..];
                let _ = write!(cursor, "{v6}");
                48 - cursor.len()
            }
        };
        PeerText {
            bytes,
            len: len as u8,
        }
    }

    fn as_str(&self) -> &str {
        // invariant: digits, dots, or `Display` of an IPv6 address: ASCII.
        std::str::from_utf8(&self.bytes[..self.len as usize]).unwrap_or("")
    }
}

/// A client connection.
#[derive(Debug)]
pub enum ClientStream {
    /// Cleartext.
    Plain(TcpStream),
    /// TLS, after its handshake.
    Tls(Box<TlsStream>, RawFd),
    /// One HTTP/2 stream, as a virtual HTTP/1.1 connection (`h2::bridge`).
    Virtual(VirtualConn),
}

/// The read half of a split connection, plain or TLS (tunnels, upstream connections).
#[derive(Debug)]
pub enum ReadHalf {
    /// Cleartext.
    Plain(OwnedReadHalf<TcpStream>),
    /// TLS (boxed: the plain case stays small where connections are moved around).
    Tls(Box<TlsReadHalf>),
}

/// The write half of a split connection, plain or TLS (tunnels, upstream connections).
#[derive(Debug)]
pub enum WriteHalf {
    /// Cleartext.
    Plain(OwnedWriteHalf<TcpStream>),
    /// TLS (boxed, as the read half).
    Tls(Box<TlsWriteHalf>),
}

impl ClientStream {
    /// Marks the response in progress as cut short: a socket is reset at its close (even a
    /// close-delimited body cannot then pass for complete), an HTTP/2 stream is reset.
    pub fn abort(&self) {
        match self {
            ClientStream::Plain(s) => crate::net::sys::reset_on_close(s.as_raw_fd()),
            ClientStream::Tls(_, fd) => crate::net::sys::reset_on_close(*fd),
            ClientStream::Virtual(v) => v.abort(),
        }
    }

    /// Whether the client's connection is TLS.
    pub fn is_tls(&self) -> bool {
        match self {
            ClientStream::Plain(_) => false,
            ClientStream::Tls(..) => true,
            ClientStream::Virtual(v) => v.is_tls(),
        }
    }

    /// The TLS SNI name of the client's connection, if any.
    pub fn sni(&self) -> Option<&str> {
        match self {
            ClientStream::Plain(_) => None,
            ClientStream::Tls(t, _) => t.sni(),
            ClientStream::Virtual(v) => v.sni(),
        }
    }

    /// A second reader of a virtual connection (HTTP/2 stream), to stream its request body
    /// while the response is written; `None` for sockets.
    pub fn virtual_reader(&self) -> Option<crate::h2::bridge::VirtualReader> {
        match self {
            ClientStream::Virtual(v) => Some(v.reader()),
            _ => None,
        }
    }

    /// Whether this is an HTTP/2 stream carrying a gRPC call (its errors are gRPC statuses).
    pub fn is_grpc(&self) -> bool {
        matches!(self, ClientStream::Virtual(v) if v.is_grpc())
    }

    /// A watch on whether the client still takes the response, for an HTTP/2 stream (whose
    /// reset says so at once); `None` for sockets.
    pub fn gone_watch(&self) -> Option<crate::h2::bridge::GoneWatch> {
        match self {
            ClientStream::Virtual(v) => Some(v.gone_watch()),
            _ => None,
        }
    }

    /// Whether a body is best relayed to this client in large blocks (see
    /// [`VirtualConn::takes_large_blocks`]): always for a connection.
    pub fn takes_large_blocks(&self) -> bool {
        match self {
            ClientStream::Plain(_) | ClientStream::Tls(..) => true,
            ClientStream::Virtual(v) => v.takes_large_blocks(),
        }
    }

    /// The write size that leaves as whole TCP segments: the connection's segment size, for
    /// cleartext TCP only (TLS writes records of their own size; an HTTP/2 stream's bytes go
    /// out in frames). One `getsockopt`.
    pub fn segment_size(&self) -> Option<usize> {
        match self {
            ClientStream::Plain(s) => crate::net::sys::segment_size(s.as_raw_fd()),
            ClientStream::Tls(..) | ClientStream::Virtual(_) => None,
        }
    }

    /// The socket of a TCP or TLS connection; `None` for an HTTP/2 stream.
    pub fn socket_fd(&self) -> Option<RawFd> {
        match self {
            ClientStream::Plain(s) => Some(s.as_raw_fd()),
            ClientStream::Tls(_, fd) => Some(*fd),
            ClientStream::Virtual(_) => None,
        }
    }

    /// Splits into halves usable at once; `None` for a virtual connection (HTTP/2 streams
    /// are never tunnelled).
    pub fn into_split(self) -> Option<(ReadHalf, WriteHalf)> {
        match self {
            ClientStream::Plain(s) => {
                let (r, w) = s.into_split();
                Some((ReadHalf::Plain(r), WriteHalf::Plain(w)))
            }
            ClientStream::Tls(t, _) => {
                let (r, w) = t.into_split();
                Some((ReadHalf::Tls(Box::new(r)), WriteHalf::Tls(Box::new(w))))
            }
            ClientStream::Virtual(_) => None,
        }
    }
}

impl AsyncReadRent for ClientStream {
    async fn read<T: IoBufMut>(&mut self, buf: T) -> BufResult<usize, T> {
        match self {
            ClientStream::Plain(s) => s.read(buf).await,
            ClientStream::Tls(s, _) => s.read(buf).await,
            ClientStream::Virtual(s) => s.read(buf).await,
        }
    }

    async fn readv<T: IoVecBufMut>(&mut self, buf: T) -> BufResult<usize, T> {
        match self {
            ClientStream::Plain(s) => s.readv(buf).await,
            ClientStream::Tls(s, _) => s.readv(buf).await,
            ClientStream::Virtual(s) => s.readv(buf).await,
        }
    }
}

impl AsyncWriteRent for ClientStream {
    async fn write<T: IoBuf>(&mut self, buf: T) -> BufResult<usize, T> {
        match self {
            ClientStream::Plain(s) => s.write(buf).await,
            ClientStream::Tls(s, _) => s.write(buf).await,
            ClientStream::Virtual(s) => s.write(buf).await,
        }
    }

    async fn writev<T: IoVecBuf>(&mut self, buf: T) -> BufResult<usize, T> {
        match self {
            ClientStream::Plain(s) => s.writev(buf).await,
            ClientStream::Tls(s, _) => s.writev(buf).await,
            ClientStream::Virtual(s) => s.writev(buf).await,
        }
    }

    async fn flush(&mut self) -> io::Result<()> {
        match self {
            ClientStream::Plain(s) => s.flush().await,
            ClientStream::Tls(s, _) => s.flush().await,
            ClientStream::Virtual(s) => s.flush().await,
        }
    }

    async fn shutdown(&mut self) -> io::Result<()> {
        match self {
            ClientStream::Plain(s) => s.shutdown().await,
            ClientStream::Tls(s, _) => s.shutdown().await,
            ClientStream::Virtual(s) => s.shutdown().await,
        }
    }
}

impl ReadHalf {
    /// Whether the connection is TLS.
    pub fn is_tls(&self) -> bool {
        matches!(self, ReadHalf::Tls(_))
    }

    /// Whether it holds bytes read from the socket but not yet taken (TLS only).
    pub fn holds_unread(&self) -> bool {
        match self {
            ReadHalf::Plain(_) => false,
            ReadHalf::Tls(t) => t.holds_unread(),
        }
    }
}

impl AsyncReadRent for ReadHalf {
    async fn read<T: IoBufMut>(&mut self, buf: T) -> BufResult<usize, T> {
        match self {
            ReadHalf::Plain(s) => s.read(buf).await,
            ReadHalf::Tls(s) => s.read(buf).await,
        }
    }

    async fn readv<T: IoVecBufMut>(&mut self, buf: T) -> BufResult<usize, T> {
        match self {
            ReadHalf::Plain(s) => s.readv(buf).await,
            ReadHalf::Tls(s) => s.readv(buf).await,
        }
    }
}

impl AsyncWriteRent for WriteHalf {
    async fn write<T: IoBuf>(&mut self, buf: T) -> BufResult<usize, T> {
        match self {
            WriteHalf::Plain(s) => s.write(buf).await,
            WriteHalf::Tls(s) => s.write(buf).await,
        }
    }

    async fn writev<T: IoVecBuf>(&mut self, buf: T) -> BufResult<usize, T> {
        match self {
            WriteHalf::Plain(s) => s.writev(buf).await,
            WriteHalf::Tls(s) => s.writev(buf).await,
        }
    }

    async fn flush(&mut self) -> io::Result<()> {
        match self {
            WriteHalf::Plain(s) => s.flush().await,
            WriteHalf::Tls(s) => s.flush().await,
        }
    }

    async fn shutdown(&mut self) -> io::Result<()> {
        match self {
            WriteHalf::Plain(s) => s.shutdown().await,
            WriteHalf::Tls(s) => s.shutdown().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr};

    use super::*;

    fn text(ip: IpAddr) -> String {
        Peer::new(SocketAddr::new(ip, 1)).text().to_owned()
    }

    #[test]
    fn ipv4_text_matches_display_for_every_octet_in_every_place() {
        for place in 0..4 {
            for v in 0..=255u8 {
                let mut o = [1, 20, 255, 0];
                o[place] = v;
                let ip = Ipv4Addr::from(o);
                assert_eq!(text(ip.into()), ip.to_string());
            }
        }
        for ip in [
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::BROADCAST,
            Ipv4Addr::LOCALHOST,
        ] {
            assert_eq!(text(ip.into()), ip.to_string());
        }
    }

    #[test]
    fn ipv6_text_is_display_and_mapped_ipv4_is_canonical() {
        let ip: Ipv6Addr = "2001:db8::ff00:42:8329".parse().unwrap();
        assert_eq!(text(ip.into()), "2001:db8::ff00:42:8329");
        // The longest text (39 bytes; IPv4-mapped ones are written as IPv4).
        let longest = Ipv6Addr::new(
            0xfe80, 0xffff, 0xffff, 0xffff, 0xffff, 0xffff, 0xffff, 0xffff,
        );
        assert_eq!(text(longest.into()).len(), 39);
        assert_eq!(text(longest.into()), longest.to_string());
        let mapped = Ipv4Addr::new(192, 0, 2, 7).to_ipv6_mapped();
        assert_eq!(text(mapped.into()), "192.0.2.7");
    }

    proptest::proptest! {
        #[test]
        fn ipv4_text_matches_display(raw: u32) {
            let ip = Ipv4Addr::from(raw);
            proptest::prop_assert_eq!(text(ip.into()), ip.to_string());
        }
    }
}
