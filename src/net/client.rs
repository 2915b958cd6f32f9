//! The client side of a connection: plain TCP or TLS, behind one type the request path uses.
//!
//! An enum rather than a trait object: a match per operation, no allocation, and the plain
//! case stays a direct call into monoio's TCP stream.

use std::io;
use std::os::fd::{AsRawFd, RawFd};

use monoio::buf::{IoBuf, IoBufMut, IoVecBuf, IoVecBufMut};
use monoio::io::{AsyncReadRent, AsyncWriteRent, OwnedReadHalf, OwnedWriteHalf, Splitable};
use monoio::net::TcpStream;
use monoio::BufResult;

use crate::h2::bridge::VirtualConn;
use crate::tls::{TlsReadHalf, TlsStream, TlsWriteHalf};

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
