//! Poll-style I/O for the h2 crate (tokio's `AsyncRead`/`AsyncWrite`), over monoio's
//! poll-io TCP stream: cleartext with the bytes already read replayed first (h2c detected by
//! its preface), and TLS continuing a session whose handshake ran on the rent-style adapter.

use std::io::{self, Read, Write};
use std::pin::Pin;
use std::task::{Context, Poll};

use monoio::net::tcp::stream_poll::TcpStreamPoll;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A cleartext connection whose first bytes were already read.
#[derive(Debug)]
pub struct Prefixed {
    prefix: Vec<u8>,
    pos: usize,
    io: TcpStreamPoll,
}

impl Prefixed {
    /// `prefix` is read before anything from `io`.
    pub fn new(prefix: Vec<u8>, io: TcpStreamPoll) -> Self {
        Prefixed { prefix, pos: 0, io }
    }
}

impl AsyncRead for Prefixed {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.pos < self.prefix.len() {
            let n = buf.remaining().min(self.prefix.len() - self.pos);
            let start = self.pos;
            buf.put_slice(&self.prefix[start..start + n]);
            self.pos += n;
            if self.pos == self.prefix.len() {
                self.prefix = Vec::new();
                self.pos = 0;
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Prefixed {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// A TLS session over a poll-style stream.
pub struct PollTls {
    io: TcpStreamPoll,
    tls: rustls::Connection,
    /// Ciphertext read before the switch and not yet given to rustls.
    pending: Vec<u8>,
    eof: bool,
}

impl std::fmt::Debug for PollTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PollTls").field("eof", &self.eof).finish()
    }
}

/// `std::io` over a poll-style stream within one poll: `WouldBlock` when it is not ready.
struct SyncIo<'a, 'b> {
    io: &'a mut TcpStreamPoll,
    cx: &'a mut Context<'b>,
}

impl Read for SyncIo<'_, '_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut rb = ReadBuf::new(buf);
        match Pin::new(&mut *self.io).poll_read(self.cx, &mut rb) {
            Poll::Ready(Ok(())) => Ok(rb.filled().len()),
            Poll::Ready(Err(e)) => Err(e),
            Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
        }
    }
}

impl Write for SyncIo<'_, '_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match Pin::new(&mut *self.io).poll_write(self.cx, buf) {
            Poll::Ready(r) => r,
            Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
        }
    }

    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        match Pin::new(&mut *self.io).poll_write_vectored(self.cx, bufs) {
            Poll::Ready(r) => r,
            Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn invalid(e: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

impl PollTls {
    /// Continues `tls` (handshake done) over `io`; `pending` is ciphertext already read.
    pub fn new(io: TcpStreamPoll, tls: rustls::Connection, pending: Vec<u8>) -> Self {
        PollTls {
            io,
            tls,
            pending,
            eof: false,
        }
    }

    /// Writes queued ciphertext; `Ready(Ok)` when none is left.
    fn flush_tls(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.tls.wants_write() {
            let mut sync = SyncIo {
                io: &mut self.io,
                cx,
            };
            match self.tls.write_tls(&mut sync) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Poll::Pending,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
        Poll::Ready(Ok(()))
    }

    /// Gives rustls more ciphertext. `Pending` when the socket has none yet.
    fn fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if !self.pending.is_empty() {
            let n = self.tls.read_tls(&mut &self.pending[..])?;
            self.pending.drain(..n);
        } else {
            let mut sync = SyncIo {
                io: &mut self.io,
                cx,
            };
            match self.tls.read_tls(&mut sync) {
                Ok(0) => self.eof = true,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Poll::Pending,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
        if let Err(e) = self.tls.process_new_packets() {
            let _ = self.flush_tls(cx);
            return Poll::Ready(Err(invalid(e)));
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncRead for PollTls {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            match this.tls.reader().read(buf.initialize_unfilled()) {
                Ok(n) => {
                    buf.advance(n);
                    // Answers to post-handshake messages (key updates) go out with the next
                    // flush; try now without waiting.
                    let _ = this.flush_tls(cx);
                    return Poll::Ready(Ok(()));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if this.eof {
                        return Poll::Ready(Ok(()));
                    }
                    match this.fill(cx) {
                        Poll::Ready(Ok(())) => {}
                        Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                        Poll::Pending => return Poll::Pending,
                    }
                }
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

impl AsyncWrite for PollTls {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        loop {
            let flushed = this.flush_tls(cx);
            if let Poll::Ready(Err(e)) = flushed {
                return Poll::Ready(Err(e));
            }
            let n = this.tls.writer().write(buf)?;
            if n > 0 || buf.is_empty() {
                let _ = this.flush_tls(cx);
                return Poll::Ready(Ok(n));
            }
            // rustls's buffer is full: wait for the socket to take ciphertext.
            if flushed.is_pending() {
                return Poll::Pending;
            }
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        match this.flush_tls(cx) {
            Poll::Ready(Ok(())) => Pin::new(&mut this.io).poll_flush(cx),
            other => other,
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        this.tls.send_close_notify();
        match this.flush_tls(cx) {
            Poll::Ready(Ok(())) => Pin::new(&mut this.io).poll_shutdown(cx),
            other => other,
        }
    }
}
