//! Poll-style I/O for the h2 crate (tokio's `AsyncRead`/`AsyncWrite`), over monoio's
//! poll-io TCP stream: cleartext with the bytes already read replayed first (h2c detected by
//! its preface), and TLS continuing a session whose handshake ran on the rent-style adapter.

use std::cell::Cell;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use monoio::net::tcp::stream_poll::TcpStreamPoll;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Whether a connection's socket refuses every write: its peer stopped reading (and the
/// kernel's buffers are full). A write that moves any byte ends the stall. Writes only set
/// flags; the connection's periodic check dates the stall with the worker's clock.
#[derive(Debug, Default)]
pub struct WriteStall {
    /// The last write was refused.
    refused: Cell<bool>,
    /// A write moved bytes since the last check.
    moved: Cell<bool>,
    /// The first check that saw the current stall.
    since: Cell<Option<Instant>>,
}

impl WriteStall {
    /// Notes a write's outcome.
    fn note(&self, r: &Poll<io::Result<usize>>) {
        match r {
            Poll::Pending => self.refused.set(true),
            Poll::Ready(Ok(n)) if *n > 0 => {
                self.refused.set(false);
                self.moved.set(true);
            }
            Poll::Ready(_) => {}
        }
    }

    /// For the connection's periodic check, at `now`: how long its checks have seen every
    /// write refused, with no byte moved between them (zero when one moved or none is
    /// refused). A stall is dated by the first check that sees it: this falls short of the
    /// stall's length by up to the checks' period.
    pub fn check(&self, now: Instant) -> Duration {
        if self.moved.replace(false) || !self.refused.get() {
            self.since.set(None);
            return Duration::ZERO;
        }
        let since = self.since.get().unwrap_or(now);
        self.since.set(Some(since));
        now.saturating_duration_since(since)
    }
}

/// What a connection's task keeps of a transport it hands to the h2 crate.
#[derive(Debug, Clone)]
pub struct Watch {
    /// The socket's write stall.
    pub stall: Rc<WriteStall>,
    /// The socket (to reset it at its close), open while the transport lives.
    pub fd: RawFd,
}

/// A transport for an HTTP/2 connection whose writes can be watched.
pub trait Watched: AsyncRead + AsyncWrite + Unpin + 'static {
    /// The transport's [`Watch`].
    fn watch(&self) -> Watch;
}

/// Reads in a row that found bytes between looks at the clock: see [`Socket`].
const READ_BURST: u8 = 32;

/// How long a socket's reads may go on finding bytes before it pauses: see [`Socket`].
const READ_STREAK: Duration = Duration::from_millis(5);

/// How long a socket whose reads never ran dry pauses (the timer's resolution).
const READ_PAUSE: Duration = Duration::from_millis(1);

/// A poll-style socket that notes its write stalls, and that a connection whose peer keeps it
/// full cannot hold the worker with. The h2 crate reads and handles frames for as long as the
/// socket has them, and monoio has no cooperative budget: a peer writing frames that need no
/// answer (PRIORITY, say) faster than they are handled kept its task polling, and every other
/// connection of the worker waiting, for as long as it went on. Once its reads have found
/// bytes for [`READ_STREAK`] without running dry (the clock is read every [`READ_BURST`]
/// reads), the socket says "not ready" for [`READ_PAUSE`]. (A pause on a
/// timer, not a wake of the task: monoio runs a task woken in its own poll again at once, and
/// on a ring set up with `DEFER_TASKRUN` no completion arrives while tasks keep the run queue
/// from emptying.) A connection's reads run dry long before that under any load a client
/// waits on; one that streams so fast that they never do keeps about five sixths of a
/// worker. (HTTP/2 upstream connections over TLS read through this too; cleartext ones read
/// their socket directly.)
#[derive(Debug)]
struct Socket {
    io: TcpStreamPoll,
    stall: Rc<WriteStall>,
    /// Reads that found bytes since the last look at the clock.
    burst: u8,
    /// When the reads began to find bytes every time (at the first look at the clock).
    streak: Option<Instant>,
    pause: Option<Pin<Box<monoio::time::Sleep>>>,
}

impl Socket {
    fn new(io: TcpStreamPoll) -> Self {
        Socket {
            io,
            stall: Rc::default(),
            burst: 0,
            streak: None,
            pause: None,
        }
    }

    fn watch(&self) -> Watch {
        Watch {
            stall: self.stall.clone(),
            fd: self.io.as_raw_fd(),
        }
    }
}

impl AsyncRead for Socket {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if let Some(pause) = self.pause.as_mut() {
            std::task::ready!(std::future::Future::poll(pause.as_mut(), cx));
            self.pause = None;
        }
        let r = Pin::new(&mut self.io).poll_read(cx, buf);
        match r {
            Poll::Ready(Ok(())) => {
                self.burst += 1;
                if self.burst >= READ_BURST {
                    self.burst = 0;
                    let now = Instant::now();
                    match self.streak {
                        None => self.streak = Some(now),
                        Some(since) if now.saturating_duration_since(since) >= READ_STREAK => {
                            self.streak = None;
                            self.pause = Some(Box::pin(monoio::time::sleep(READ_PAUSE)));
                        }
                        Some(_) => {}
                    }
                }
            }
            Poll::Pending => {
                self.burst = 0;
                self.streak = None;
            }
            Poll::Ready(Err(_)) => {}
        }
        r
    }
}

impl AsyncWrite for Socket {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write(cx, buf);
        self.stall.note(&r);
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.stall.note(&r);
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// Bytes a connection holds for one write at most.
const HOLD_MAX: usize = 64 * 1024;
/// Held bytes that are written at the first flush, without waiting for more.
const FLUSH_AT: usize = 32 * 1024;
/// A held-bytes buffer larger than this is released once written (idle connections keep
/// little memory).
const HOLD_KEEP: usize = 16 * 1024;

/// Write coalescing. The h2 crate flushes after every DATA frame (16 KiB at the peer's
/// default frame size), and every connection poll ends with a flush: written one by one, each
/// frame is a syscall and a TCP segment of its own. So the first flush of a batch is put
/// off: the connection's task is woken again instead and the bytes stay held; the next flush,
/// at the end of that next poll, writes them with what h2 queued in between. (monoio polls a
/// task that woke itself again at once, ahead of the rest of the run queue. A yield to the
/// back of the queue, through a helper task, was tried: TCP segments per request stayed at
/// 2.25 and the CPU per request did not move beyond the noise, 0.88-1.04 of this over h2c
/// and h2 TLS runs.)
#[derive(Debug, Default)]
struct Coalesce {
    /// A flush was put off: the next one writes.
    put_off: bool,
}

impl Coalesce {
    /// Whether this flush may wait for the next poll (it wakes the task for it).
    fn put_off(&mut self, cx: &mut Context<'_>, held: usize) -> bool {
        if self.put_off || held >= FLUSH_AT {
            return false;
        }
        self.put_off = true;
        cx.waker().wake_by_ref();
        true
    }

    /// Everything held was written.
    fn written(&mut self) {
        self.put_off = false;
    }
}

/// A cleartext connection whose first bytes were already read; writes are coalesced.
#[derive(Debug)]
pub struct Prefixed {
    prefix: Vec<u8>,
    pos: usize,
    io: Socket,
    /// Written bytes not yet sent.
    held: Vec<u8>,
    coalesce: Coalesce,
}

impl Prefixed {
    /// `prefix` is read before anything from `io`.
    pub fn new(prefix: Vec<u8>, io: TcpStreamPoll) -> Self {
        Prefixed {
            prefix,
            pos: 0,
            io: Socket::new(io),
            held: Vec::new(),
            coalesce: Coalesce::default(),
        }
    }

    /// Sends every held byte.
    fn send_held(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut sent = 0;
        let result = loop {
            if sent == self.held.len() {
                break Poll::Ready(Ok(()));
            }
            match Pin::new(&mut self.io).poll_write(cx, &self.held[sent..]) {
                Poll::Ready(Ok(0)) => break Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => sent += n,
                Poll::Ready(Err(e)) => break Poll::Ready(Err(e)),
                Poll::Pending => break Poll::Pending,
            }
        };
        self.held.drain(..sent);
        if self.held.is_empty() {
            self.coalesce.written();
            if self.held.capacity() > HOLD_KEEP {
                self.held = Vec::new();
            }
        }
        result
    }

    /// Room in `held` for `len` more bytes. Beyond what an idle connection keeps, for all it
    /// may hold at once: doubled write by write, a large body's buffer would be reallocated
    /// (and copied) twice per batch.
    fn reserve(&mut self, len: usize) {
        let need = self.held.len() + len;
        if need > self.held.capacity() && need > HOLD_KEEP {
            self.held.reserve(HOLD_MAX - self.held.len());
        }
    }

    /// Makes room to hold `len` more bytes, sending what is held first when they would not
    /// fit; `Ready(false)`: too large to hold, write them directly.
    fn hold(&mut self, cx: &mut Context<'_>, len: usize) -> Poll<io::Result<bool>> {
        if self.held.len() + len > HOLD_MAX {
            match self.send_held(cx) {
                Poll::Ready(Ok(())) => {}
                other => return other.map(|r| r.map(|()| false)),
            }
        }
        Poll::Ready(Ok(len < HOLD_MAX))
    }
}

impl Watched for Prefixed {
    fn watch(&self) -> Watch {
        self.io.watch()
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
        let this = &mut *self;
        match this.hold(cx, buf.len()) {
            Poll::Ready(Ok(true)) => {
                this.reserve(buf.len());
                this.held.extend_from_slice(buf);
                Poll::Ready(Ok(buf.len()))
            }
            Poll::Ready(Ok(false)) => Pin::new(&mut this.io).poll_write(cx, buf),
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => Poll::Pending,
        }
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let len: usize = bufs.iter().map(|b| b.len()).sum();
        match this.hold(cx, len) {
            Poll::Ready(Ok(true)) => {
                this.reserve(len);
                for b in bufs {
                    this.held.extend_from_slice(b);
                }
                Poll::Ready(Ok(len))
            }
            Poll::Ready(Ok(false)) => Pin::new(&mut this.io).poll_write_vectored(cx, bufs),
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if !this.held.is_empty() {
            if this.coalesce.put_off(cx, this.held.len()) {
                return Poll::Ready(Ok(()));
            }
            match this.send_held(cx) {
                Poll::Ready(Ok(())) => {}
                other => return other,
            }
        }
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        match this.send_held(cx) {
            Poll::Ready(Ok(())) => Pin::new(&mut this.io).poll_shutdown(cx),
            other => other,
        }
    }
}

/// A TLS session over a poll-style stream.
pub struct PollTls {
    io: Socket,
    tls: rustls::Connection,
    /// Ciphertext read before the switch and not yet given to rustls.
    pending: Vec<u8>,
    eof: bool,
    coalesce: Coalesce,
}

impl std::fmt::Debug for PollTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PollTls").field("eof", &self.eof).finish()
    }
}

/// `std::io` over a poll-style stream within one poll: `WouldBlock` when it is not ready.
struct SyncIo<'a, 'b> {
    io: &'a mut Socket,
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
            io: Socket::new(io),
            tls,
            pending,
            eof: false,
            coalesce: Coalesce::default(),
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

impl Watched for PollTls {
    fn watch(&self) -> Watch {
        self.io.watch()
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
        // Records stay in rustls's buffer until a flush (coalesced like cleartext), or until
        // the buffer is full.
        let n = this.tls.writer().write(buf)?;
        if n > 0 || buf.is_empty() {
            return Poll::Ready(Ok(n));
        }
        match this.flush_tls(cx) {
            Poll::Ready(Ok(())) => Poll::Ready(Ok(this.tls.writer().write(buf)?)),
            other => other.map(|r| r.map(|()| 0)),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        // rustls does not say how many bytes it holds: the first flush of a batch waits.
        if this.tls.wants_write() && this.coalesce.put_off(cx, 0) {
            return Poll::Ready(Ok(()));
        }
        match this.flush_tls(cx) {
            Poll::Ready(Ok(())) => {
                this.coalesce.written();
                Pin::new(&mut this.io).poll_flush(cx)
            }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::WakeCount;

    /// What the peer can read after a moment, without waiting for more.
    async fn available(peer: &mut std::net::TcpStream) -> Vec<u8> {
        monoio::time::sleep(std::time::Duration::from_millis(20)).await;
        let mut out = Vec::new();
        let mut buf = [0u8; 65536];
        loop {
            match peer.read(&mut buf) {
                Ok(0) => return out,
                Ok(n) => out.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return out,
                Err(e) => panic!("{e}"),
            }
        }
    }

    /// Runs `test` on a runtime of the epoll driver, with a [`Prefixed`] (no prefix) over a
    /// loopback connection and the other end of it (non-blocking).
    fn on_a_connection<F: std::future::Future<Output = ()>>(
        test: impl FnOnce(Prefixed, std::net::TcpStream) -> F,
    ) {
        let mut rt = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
            .enable_timer()
            .build()
            .unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        rt.block_on(async move {
            let tcp = monoio::net::TcpStream::connect(addr).await.unwrap();
            let (peer, _) = listener.accept().unwrap();
            peer.set_nonblocking(true).unwrap();
            test(
                Prefixed::new(Vec::new(), tcp.try_into_poll_io().unwrap()),
                peer,
            )
            .await;
        });
    }

    #[test]
    fn a_large_batch_is_held_in_one_buffer_and_small_writes_in_a_small_one() {
        on_a_connection(|mut io, _peer| async move {
            let mut cx = Context::from_waker(std::task::Waker::noop());
            let mut io = Pin::new(&mut io);
            assert!(matches!(
                io.as_mut().poll_write(&mut cx, b"small"),
                Poll::Ready(Ok(5))
            ));
            assert!(io.held.capacity() <= HOLD_KEEP);
            // DATA frames of 16 KiB, each written as its frame head and its payload, as h2
            // writes them: the first one past what an idle connection keeps sizes the buffer
            // for the whole batch, and the next ones are not moved again.
            let (frame_head, payload) = ([0u8; 9], vec![7u8; 16 * 1024]);
            let bufs = [io::IoSlice::new(&frame_head), io::IoSlice::new(&payload)];
            let frame = frame_head.len() + payload.len();
            for i in 0..2 {
                assert!(matches!(
                    io.as_mut().poll_write_vectored(&mut cx, &bufs),
                    Poll::Ready(Ok(n)) if n == frame
                ));
                if i == 0 {
                    assert!(io.held.capacity() >= HOLD_MAX);
                }
            }
            let at = io.held.as_ptr();
            assert!(matches!(
                io.as_mut().poll_write_vectored(&mut cx, &bufs),
                Poll::Ready(Ok(n)) if n == frame
            ));
            assert_eq!(io.held.as_ptr(), at, "no reallocation");
            assert_eq!(io.held.len(), 5 + 3 * frame);
        });
    }

    #[test]
    fn a_write_stall_lasts_while_writes_are_refused_and_no_byte_moves() {
        on_a_connection(|mut io, mut peer| async move {
            let mut cx = Context::from_waker(std::task::Waker::noop());
            let stall = io.watch().stall;
            let mut io = Pin::new(&mut io);
            let block = vec![7u8; HOLD_MAX];
            let t0 = Instant::now();
            let at = |ms| t0 + Duration::from_millis(ms);
            // The peer reads nothing: writes go through until the kernel's buffers are full.
            let mut written = 0;
            while let Poll::Ready(r) = io.as_mut().poll_write(&mut cx, &block) {
                written += r.unwrap();
                assert!(written < 1 << 30, "the socket never filled");
            }
            // Bytes moved since the last check: no stall yet. Then one, dated by the first
            // check that sees it, lasting while writes are refused.
            assert_eq!(stall.check(at(0)), Duration::ZERO);
            assert_eq!(stall.check(at(500)), Duration::ZERO);
            assert_eq!(stall.check(at(1500)), Duration::from_millis(1000));
            assert!(io.as_mut().poll_write(&mut cx, &block).is_pending());
            assert_eq!(stall.check(at(2500)), Duration::from_millis(2000));
            // Once the peer reads, a write moves bytes: the stall is over, even when the next
            // write is refused again before the next check.
            let mut tries = 0;
            loop {
                tries += 1;
                assert!(tries < 250, "no write went through after the peer read");
                let _ = available(&mut peer).await;
                if let Poll::Ready(r) = io.as_mut().poll_write(&mut cx, &block) {
                    assert!(r.unwrap() > 0);
                    break;
                }
            }
            while io.as_mut().poll_write(&mut cx, &block).is_ready() {}
            assert_eq!(stall.check(at(3000)), Duration::ZERO);
            assert_eq!(
                stall.check(at(3500)),
                Duration::ZERO,
                "a new stall, first seen"
            );
            assert_eq!(stall.check(at(4000)), Duration::from_millis(500));
        });
    }

    #[test]
    fn writes_wait_for_the_second_flush_of_a_batch() {
        on_a_connection(|mut io, mut peer| async move {
            let (count, waker) = WakeCount::waker();
            let mut cx = Context::from_waker(&waker);
            let mut io = Pin::new(&mut io);

            // Small writes are held, and so is the first flush: it only wakes the task.
            assert!(matches!(
                io.as_mut().poll_write(&mut cx, b"one "),
                Poll::Ready(Ok(4))
            ));
            let bufs = [io::IoSlice::new(b"two "), io::IoSlice::new(b"three ")];
            assert!(matches!(
                io.as_mut().poll_write_vectored(&mut cx, &bufs),
                Poll::Ready(Ok(10))
            ));
            assert!(matches!(
                io.as_mut().poll_flush(&mut cx),
                Poll::Ready(Ok(()))
            ));
            assert_eq!(count.get(), 1, "the task is polled again");
            assert!(available(&mut peer).await.is_empty(), "nothing sent yet");
            // The next flush (at the end of that poll) writes the batch.
            assert!(matches!(
                io.as_mut().poll_flush(&mut cx),
                Poll::Ready(Ok(()))
            ));
            assert_eq!(available(&mut peer).await, b"one two three ");

            // A batch of FLUSH_AT bytes or more goes at the first flush.
            let big = vec![7u8; FLUSH_AT];
            assert!(matches!(
                io.as_mut().poll_write(&mut cx, &big),
                Poll::Ready(Ok(_))
            ));
            assert!(matches!(
                io.as_mut().poll_flush(&mut cx),
                Poll::Ready(Ok(()))
            ));
            assert_eq!(available(&mut peer).await.len(), FLUSH_AT);

            // Held bytes go out before a shutdown.
            assert!(matches!(
                io.as_mut().poll_write(&mut cx, b"last"),
                Poll::Ready(Ok(4))
            ));
            assert!(matches!(
                io.as_mut().poll_shutdown(&mut cx),
                Poll::Ready(Ok(()))
            ));
            assert_eq!(available(&mut peer).await, b"last");
        });
    }
}
