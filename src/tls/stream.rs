//! A TLS connection over a monoio TCP stream: rustls's state machine driven by rent-style I/O.
//!
//! ```text
//! socket ──read──► ciphertext buffer ──read_tls/process──► rustls ──reader──► plaintext scratch
//!                                                                               │ copy
//! caller's block ◄──────────────────────────────────────────────────────────────┘
//! caller's block ──writer──► rustls ──write_tls──► ciphertext buffer ──write_all──► socket
//! ```
//!
//! The TCP stream is split at once and the rustls state sits in an `Rc<RefCell<_>>` borrowed
//! only between awaits, so the stream can be split again into a read half and a write half
//! for tunnels (each half owns its own socket half and buffers). Plaintext is copied out of a
//! per-thread scratch buffer into the caller's block with a raw copy, so no reference to the
//! block's uninitialized spare bytes is ever made.
//!
//! A write cancelled half-way (a timeout) leaves the TLS record stream cut: the write half is
//! then marked broken and fails every later call.

use std::cell::RefCell;
use std::io::{self, Read, Write};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use monoio::buf::{IoBuf, IoBufMut, IoVecBuf, IoVecBufMut, RawBuf};
use monoio::io::{
    AsyncReadRent, AsyncWriteRent, AsyncWriteRentExt, OwnedReadHalf, OwnedWriteHalf, Splitable,
};
use monoio::net::TcpStream;
use monoio::BufResult;

/// Ciphertext read per socket read (a little more than one full TLS record).
const CIPHER_READ: usize = 17 * 1024;
/// Ciphertext read per socket read while the peer sends little (a request head, a small
/// answer): an idle keep-alive connection's read waits in this much, not in [`CIPHER_READ`],
/// whose pages a burst before touched. A read that fills it moves back to [`CIPHER_READ`].
const CIPHER_READ_SMALL: usize = 4 * 1024;
/// Plaintext scratch: one TLS record's worth.
const PLAIN_SCRATCH: usize = 16 * 1024;
/// Ciphertext output buffer a connection keeps between writes; one that grew past it for a
/// large write is given back at the next small one (an idle keep-alive or pooled connection
/// holds no more).
const OUT_KEEP: usize = 4 * 1024;

thread_local! {
    /// The plaintext scratch, one per thread: rustls's reader fills it and the bytes are
    /// copied on at once, with no await in between, so every TLS connection of a worker
    /// shares it (16 KiB less per connection).
    static PLAIN: RefCell<Box<[u8]>> = RefCell::new(vec![0u8; PLAIN_SCRATCH].into_boxed_slice());
}

type Tls = Rc<RefCell<rustls::Connection>>;

/// The read side: ciphertext in, plaintext out.
pub struct TlsReadHalf {
    tls: Tls,
    io: OwnedReadHalf<TcpStream>,
    cipher: Vec<u8>,
    pos: usize,
    eof: bool,
    /// The last socket read filled its buffer: more is likely waiting.
    burst: bool,
    /// Ciphertext read since rustls's record buffer was last trimmed (see
    /// [`TlsReadHalf::wait_plain`]).
    fed: usize,
}

/// The write side: plaintext in, ciphertext out.
pub struct TlsWriteHalf {
    tls: Tls,
    io: OwnedWriteHalf<TcpStream>,
    out: Vec<u8>,
    broken: bool,
}

/// A TLS connection (server or client side) after its handshake.
pub struct TlsStream {
    r: TlsReadHalf,
    w: TlsWriteHalf,
    sni: Option<Box<str>>,
    alpn: Option<Box<[u8]>>,
}

impl std::fmt::Debug for TlsReadHalf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsReadHalf")
            .field("eof", &self.eof)
            .finish()
    }
}

impl std::fmt::Debug for TlsWriteHalf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsWriteHalf")
            .field("broken", &self.broken)
            .finish()
    }
}

impl std::fmt::Debug for TlsStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsStream")
            .field("sni", &self.sni)
            .field("alpn", &self.alpn)
            .finish()
    }
}

/// A reader with nothing to read yet.
struct NothingYet;

impl Read for NothingYet {
    fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
        Err(io::ErrorKind::WouldBlock.into())
    }
}

fn invalid(e: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

impl TlsReadHalf {
    /// Whether bytes past what was read are held here: ciphertext not yet given to rustls,
    /// or plaintext not yet taken. A connection holding any must not be reused (the bytes are
    /// no answer to the next request; a socket check cannot see them).
    pub fn holds_unread(&self) -> bool {
        if self.pos < self.cipher.len() {
            return true;
        }
        // A close_notify taken in with the end of the response: the peer is done with the
        // connection (a socket check sees nothing until its FIN arrives).
        match self.tls.borrow_mut().process_new_packets() {
            Ok(state) => state.plaintext_bytes_to_read() > 0 || state.peer_has_closed(),
            Err(_) => true,
        }
    }

    /// Gives rustls more ciphertext: what is left of the last socket read, else a new read.
    /// At end of stream rustls is told (it then reports a close without `close_notify`).
    async fn fill(&mut self) -> io::Result<()> {
        if self.pos >= self.cipher.len() {
            let mut v = std::mem::take(&mut self.cipher);
            v.clear();
            let size = if self.burst {
                CIPHER_READ
            } else {
                CIPHER_READ_SMALL
            };
            if v.capacity() > size {
                v = Vec::new();
            }
            v.reserve_exact(size);
            let spare = v.capacity();
            let (res, v) = self.io.read(v).await;
            self.cipher = v;
            self.pos = 0;
            let n = res?;
            self.burst = n == spare;
            self.fed = self.fed.saturating_add(n);
            if n == 0 {
                self.eof = true;
                let mut tls = self.tls.borrow_mut();
                tls.read_tls(&mut &[][..])?;
                tls.process_new_packets().map_err(invalid)?;
                return Ok(());
            }
        }
        let mut tls = self.tls.borrow_mut();
        let n = tls.read_tls(&mut &self.cipher[self.pos..])?;
        self.pos += n;
        tls.process_new_packets().map_err(invalid)?;
        Ok(())
    }

    /// Waits until plaintext can be read, the peer closed, or the connection failed, holding
    /// no buffer of the caller's.
    async fn wait_plain(&mut self) -> io::Result<()> {
        if self.fed > CIPHER_READ_SMALL && self.pos >= self.cipher.len() {
            // rustls keeps the record buffer a burst grew (up to 18 KiB) until its next
            // `read_tls`, which first trims it to 4 KiB when it holds no partial record: one
            // that finds nothing to read (`WouldBlock`, not the end of stream) trims it
            // before the wait rather than after. (It grows by 4 KiB reads, so only past
            // 4 KiB fed since the last trim.)
            let _ = self.tls.borrow_mut().read_tls(&mut NothingYet);
            self.fed = 0;
        }
        loop {
            if self.eof {
                return Ok(());
            }
            // (rustls wants no more once plaintext or the peer's close_notify waits.)
            if !self.tls.borrow().wants_read() {
                return Ok(());
            }
            self.fill().await?;
        }
    }

    /// Reads plaintext into `buf`'s spare bytes.
    async fn read_plain<T: IoBufMut>(&mut self, mut buf: T) -> BufResult<usize, T> {
        let cap = buf.bytes_total().min(PLAIN_SCRATCH);
        if cap == 0 {
            return (Ok(0), buf);
        }
        loop {
            let r = PLAIN.with_borrow_mut(|plain| {
                let r = self.tls.borrow_mut().reader().read(&mut plain[..cap]);
                if let Ok(n) = r {
                    // SAFETY: `n <= cap <= buf.bytes_total()` bytes are writable at
                    // `write_ptr` (IoBufMut's contract), the source is our own initialized
                    // scratch, and the two do not overlap; `set_init` then covers exactly
                    // them.
                    unsafe {
                        buf.write_ptr().copy_from_nonoverlapping(plain.as_ptr(), n);
                        buf.set_init(n);
                    }
                }
                r
            });
            match r {
                Ok(n) => return (Ok(n), buf),
                // The peer closed the connection without `close_notify`: its end of stream,
                // as over TCP. Many servers do (and nginx and HAProxy take it so); framed
                // bodies still see their own truncation, and a close-delimited body ending
                // this way is relayed as complete, as those proxies do.
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return (Ok(0), buf),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if self.eof {
                        return (Ok(0), buf);
                    }
                    if let Err(e) = self.fill().await {
                        return (Err(e), buf);
                    }
                }
                Err(e) => return (Err(e), buf),
            }
        }
    }
}

impl TlsWriteHalf {
    fn wants_write(&self) -> bool {
        self.tls.borrow().wants_write()
    }

    /// Writes every ciphertext byte rustls has queued.
    async fn flush_out(&mut self) -> io::Result<()> {
        if self.broken {
            return Err(io::ErrorKind::BrokenPipe.into());
        }
        loop {
            {
                let mut tls = self.tls.borrow_mut();
                if !tls.wants_write() {
                    return Ok(());
                }
                self.out.clear();
                while tls.wants_write() {
                    tls.write_tls(&mut self.out)?;
                }
            }
            let v = std::mem::take(&mut self.out);
            let small = v.len() <= OUT_KEEP;
            self.broken = true;
            let (res, v) = self.io.write_all(v).await;
            self.broken = false;
            self.out = if small && v.capacity() > OUT_KEEP {
                Vec::new()
            } else {
                v
            };
            res?;
        }
    }

    async fn write_plain<T: IoBuf>(&mut self, buf: T) -> BufResult<usize, T> {
        // SAFETY: IoBuf's contract: `bytes_init` bytes at `read_ptr` are initialized and stay
        // valid while we hold `buf`.
        let data = unsafe { std::slice::from_raw_parts(buf.read_ptr(), buf.bytes_init()) };
        if self.broken {
            return (Err(io::ErrorKind::BrokenPipe.into()), buf);
        }
        let n = match self.tls.borrow_mut().writer().write(data) {
            Ok(n) => n,
            Err(e) => return (Err(e), buf),
        };
        let res = self.flush_out().await.map(|()| n);
        (res, buf)
    }

    async fn close(&mut self) -> io::Result<()> {
        self.tls.borrow_mut().send_close_notify();
        let flushed = self.flush_out().await;
        let shut = self.io.shutdown().await;
        flushed.and(shut)
    }
}

impl TlsStream {
    /// Waits until a read would return at once (plaintext, the peer's close or an error),
    /// holding no buffer of the caller's: an idle keep-alive connection waits in its TLS
    /// state's ciphertext buffer only. (rustls answers a key update taken meanwhile with the
    /// next write; a failure's alert is sent here.)
    pub async fn wait_readable(&mut self) -> io::Result<()> {
        let out = self.r.wait_plain().await;
        if out.is_err() && self.w.wants_write() {
            let _ = self.w.flush_out().await;
        }
        out
    }

    /// Runs the server handshake on `tcp` with `config`, within `timeout`.
    pub async fn accept(
        tcp: TcpStream,
        config: Arc<rustls::ServerConfig>,
        timeout: Duration,
    ) -> io::Result<TlsStream> {
        let conn = rustls::ServerConnection::new(config).map_err(invalid)?;
        Self::handshake_with(tcp, rustls::Connection::Server(conn), timeout).await
    }

    /// Runs the client handshake on `tcp` with `config` for `name` (SNI and verification),
    /// within `timeout`.
    pub async fn connect(
        tcp: TcpStream,
        config: Arc<rustls::ClientConfig>,
        name: rustls::pki_types::ServerName<'static>,
        timeout: Duration,
    ) -> io::Result<TlsStream> {
        let conn = rustls::ClientConnection::new(config, name).map_err(invalid)?;
        Self::handshake_with(tcp, rustls::Connection::Client(conn), timeout).await
    }

    async fn handshake_with(
        tcp: TcpStream,
        conn: rustls::Connection,
        timeout: Duration,
    ) -> io::Result<TlsStream> {
        let tls: Tls = Rc::new(RefCell::new(conn));
        let (r, w) = tcp.into_split();
        let mut s = TlsStream {
            r: TlsReadHalf {
                tls: tls.clone(),
                io: r,
                cipher: Vec::new(),
                pos: 0,
                eof: false,
                burst: false,
                fed: 0,
            },
            w: TlsWriteHalf {
                tls,
                io: w,
                out: Vec::new(),
                broken: false,
            },
            sni: None,
            alpn: None,
        };
        match crate::worker::deadline::timeout(timeout, s.handshake()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(io::ErrorKind::TimedOut.into()),
        }
        match &*s.r.tls.borrow() {
            rustls::Connection::Server(c) => {
                s.sni = c.server_name().map(Box::from);
                s.alpn = c.alpn_protocol().map(Box::from);
            }
            rustls::Connection::Client(c) => s.alpn = c.alpn_protocol().map(Box::from),
        }
        Ok(s)
    }

    async fn handshake(&mut self) -> io::Result<()> {
        loop {
            if self.w.wants_write() {
                self.w.flush_out().await?;
            }
            if !self.r.tls.borrow().is_handshaking() {
                return Ok(());
            }
            if self.r.eof {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            if let Err(e) = self.r.fill().await {
                // rustls queued an alert saying why: send it, best effort.
                let _ = self.w.flush_out().await;
                return Err(e);
            }
        }
    }

    /// The SNI name the client sent, if any.
    pub fn sni(&self) -> Option<&str> {
        self.sni.as_deref()
    }

    /// The ALPN protocol agreed on, if any.
    pub fn alpn(&self) -> Option<&[u8]> {
        self.alpn.as_deref()
    }

    /// Takes the session apart to go on in another I/O style (HTTP/2): the rustls state, the
    /// TCP stream, and ciphertext read but not yet given to rustls. `None` if a half was
    /// given away (never after `accept`).
    pub fn into_parts(self) -> Option<(rustls::Connection, TcpStream, Vec<u8>)> {
        let TlsStream { r, w, .. } = self;
        let TlsReadHalf {
            tls,
            io,
            cipher,
            pos,
            ..
        } = r;
        let TlsWriteHalf {
            tls: tls_w,
            io: io_w,
            ..
        } = w;
        drop(tls_w);
        let conn = Rc::try_unwrap(tls).ok()?.into_inner();
        let tcp = io.reunite(io_w).ok()?;
        let leftover = cipher.get(pos..).map(<[u8]>::to_vec).unwrap_or_default();
        Some((conn, tcp, leftover))
    }

    /// Splits into halves that can be used at once (tunnels).
    pub fn into_split(self) -> (TlsReadHalf, TlsWriteHalf) {
        (self.r, self.w)
    }
}

impl AsyncReadRent for TlsReadHalf {
    fn read<T: IoBufMut>(
        &mut self,
        buf: T,
    ) -> impl std::future::Future<Output = BufResult<usize, T>> {
        self.read_plain(buf)
    }

    async fn readv<T: IoVecBufMut>(&mut self, mut buf: T) -> BufResult<usize, T> {
        // SAFETY: `buf` outlives `raw`, which points into its first slice only.
        let Some(raw) = (unsafe { RawBuf::new_from_iovec_mut(&mut buf) }) else {
            return (Ok(0), buf);
        };
        let (res, _) = self.read_plain(raw).await;
        if let Ok(n) = res {
            // SAFETY: `n` bytes were written at the start of the first slice.
            unsafe { buf.set_init(n) };
        }
        (res, buf)
    }
}

impl AsyncWriteRent for TlsWriteHalf {
    fn write<T: IoBuf>(
        &mut self,
        buf: T,
    ) -> impl std::future::Future<Output = BufResult<usize, T>> {
        self.write_plain(buf)
    }

    async fn writev<T: IoVecBuf>(&mut self, buf: T) -> BufResult<usize, T> {
        // SAFETY: `buf` outlives `raw`, which points into its first slice only.
        let Some(raw) = (unsafe { RawBuf::new_from_iovec(&buf) }) else {
            return (Ok(0), buf);
        };
        let (res, _) = self.write_plain(raw).await;
        (res, buf)
    }

    fn flush(&mut self) -> impl std::future::Future<Output = io::Result<()>> {
        self.flush_out()
    }

    fn shutdown(&mut self) -> impl std::future::Future<Output = io::Result<()>> {
        self.close()
    }
}

impl AsyncReadRent for TlsStream {
    async fn read<T: IoBufMut>(&mut self, buf: T) -> BufResult<usize, T> {
        let out = self.r.read_plain(buf).await;
        // Post-handshake messages (a key update) may want an answer.
        if self.w.wants_write() {
            let _ = self.w.flush_out().await;
        }
        out
    }

    fn readv<T: IoVecBufMut>(
        &mut self,
        buf: T,
    ) -> impl std::future::Future<Output = BufResult<usize, T>> {
        self.r.readv(buf)
    }
}

impl AsyncWriteRent for TlsStream {
    fn write<T: IoBuf>(
        &mut self,
        buf: T,
    ) -> impl std::future::Future<Output = BufResult<usize, T>> {
        self.w.write(buf)
    }

    fn writev<T: IoVecBuf>(
        &mut self,
        buf: T,
    ) -> impl std::future::Future<Output = BufResult<usize, T>> {
        self.w.writev(buf)
    }

    fn flush(&mut self) -> impl std::future::Future<Output = io::Result<()>> {
        self.w.flush_out()
    }

    fn shutdown(&mut self) -> impl std::future::Future<Output = io::Result<()>> {
        self.w.close()
    }
}
