//! The bridge between an HTTP/2 stream and the HTTP/1.1 request path: a virtual connection.
//!
//! ```text
//! h2 stream ──(HTTP/1.1 request bytes)──► [to_proxy pipe]  ──► VirtualConn::read  ──► proxy
//! h2 stream ◄──(HTTP/1.1 response bytes)── [from_proxy pipe] ◄── VirtualConn::write ◄── proxy
//!           ◄──(or a typed head, then body bytes)──────────────── VirtualConn::put_head
//! ```
//!
//! Each HTTP/2 request is written as an HTTP/1.1 request into a virtual connection that the
//! ordinary connection task serves (routes, limits, retries, breakers, error envelopes: all
//! of it, once), and the HTTP/1.1 response it writes back is turned into HTTP/2 frames. The
//! request head goes with where its parts are, so the proxy reads it without tokenizing it
//! again; a relayed upstream response skips the round trip through bytes for its head: the
//! proxy hands it over as an `http::Response`, and only the body follows as bytes.
//! The pipes live on one thread (`Rc<RefCell>`), hold a bounded number of bytes and wake the
//! other side: a full pipe makes its writer wait, so backpressure runs through end to end
//! (an HTTP/2 reader that grants no window stops the upstream relay).

use std::cell::{Cell, RefCell};
use std::future::poll_fn;
use std::io;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use bytes::{Buf, BytesMut};
use monoio::buf::{IoBuf, IoBufMut, IoVecBuf, IoVecBufMut, RawBuf};
use monoio::io::{AsyncReadRent, AsyncWriteRent};
use monoio::BufResult;

use crate::http1::{BodyFraming, WrittenRequest};
use crate::observe::access_log::Pending;

/// Bytes a pipe holds before its writer waits, at most.
pub const PIPE_BYTES: usize = 64 * 1024;

/// Bytes a pipe may hold however many streams share their connection's budget (a DATA frame's
/// worth at the default frame size).
pub const MIN_PIPE_BYTES: usize = 16 * 1024;

/// A final response head handed over typed (see [`VirtualConn::put_head`]), with how its
/// body follows in the pipe's bytes.
#[derive(Debug)]
pub struct HeadStart {
    /// Status and end-to-end fields, ready for a HEADERS frame.
    pub head: http::Response<()>,
    /// How the body bytes after it are delimited (`None`: there are none).
    pub body: BodyFraming,
}

/// What [`StreamEnd::read_into`] found.
#[derive(Debug)]
pub enum Read {
    /// Bytes, appended to the buffer.
    Bytes,
    /// The final response head, typed; every byte before it was read already.
    Head(HeadStart),
    /// The end of the response direction.
    End,
}

/// One direction.
#[derive(Debug, Default)]
struct Pipe {
    data: BytesMut,
    /// A typed response head that comes after the first `head_at` bytes of `data` (response
    /// direction only).
    head: Option<HeadStart>,
    head_at: usize,
    /// The writer is done (end of stream once `data` is drained).
    writer_closed: bool,
    /// The reader is gone: writes fail.
    reader_closed: bool,
    /// The writer ended because what it sent was cut short, not complete.
    aborted: bool,
    read_waker: Option<Waker>,
    write_waker: Option<Waker>,
    /// Woken when the reader goes (a [`GoneWatch`] on the response direction).
    gone_waker: Option<Waker>,
    /// The streams of the connection, whose budget sets how much the pipe holds (`None`:
    /// [`PIPE_BYTES`]).
    share: Option<Rc<super::StreamCount>>,
}

impl Pipe {
    /// The bytes the pipe may hold now (see [`super::StreamCount::pipe_limit`]).
    fn limit(&self) -> usize {
        self.share.as_ref().map_or(PIPE_BYTES, |s| s.pipe_limit())
    }

    /// Appends what fits of `data` (at most [`Pipe::limit`] held); `Pending` (with the waker
    /// kept) when full; `None` once the reader is gone.
    fn push(&mut self, data: &[u8], cx: &mut Context<'_>) -> Poll<Option<usize>> {
        if self.reader_closed {
            return Poll::Ready(None);
        }
        let limit = self.limit();
        let room = limit.saturating_sub(self.data.len());
        if room == 0 {
            self.write_waker = Some(cx.waker().clone());
            return Poll::Pending;
        }
        let n = room.min(data.len());
        let need = self.data.len() + n;
        if need > self.data.capacity() && need > limit / 4 {
            // A large body: room for all the pipe may hold, at once. Grown write by write to
            // fit, its buffer would be reallocated (and copied) several times per block.
            // (Small bodies keep small buffers.)
            self.data.reserve(limit - self.data.len());
        }
        self.data.extend_from_slice(&data[..n]);
        self.wake_reader();
        Poll::Ready(Some(n))
    }

    /// `Ready(true)` when bytes are held, `Ready(false)` at end of stream, `Pending` (with the
    /// waker kept) when empty.
    fn poll_data(&mut self, cx: &mut Context<'_>) -> Poll<bool> {
        if !self.data.is_empty() || self.head.is_some() {
            return Poll::Ready(true);
        }
        if self.writer_closed {
            return Poll::Ready(false);
        }
        self.read_waker = Some(cx.waker().clone());
        Poll::Pending
    }

    /// The first `max` held bytes at most (taken out of the pipe by [`Pipe::consume`]).
    fn front(&self, max: usize) -> &[u8] {
        &self.data[..max.min(self.data.len())]
    }

    /// Drops the first `n` held bytes (its buffer stays, for the next bytes: no allocation
    /// per transfer) and lets the writer go on.
    fn consume(&mut self, n: usize) {
        if n == self.data.len() {
            self.data.clear();
        } else {
            self.data.advance(n);
        }
        self.wake_writer();
    }

    /// Moves every held byte to the end of `dst`: the buffers trade places when `dst` is
    /// empty (no copy, no allocation). A typed head is taken in its turn: the bytes before
    /// it first, then the head alone.
    fn move_out(&mut self, dst: &mut BytesMut) -> Read {
        if self.head.is_some() {
            if self.head_at == 0 {
                return self.head.take().map_or(Read::End, Read::Head);
            }
            dst.extend_from_slice(&self.data[..self.head_at]);
            self.data.advance(self.head_at);
            self.head_at = 0;
            self.wake_writer();
            return Read::Bytes;
        }
        if dst.is_empty() {
            std::mem::swap(dst, &mut self.data);
        } else {
            dst.extend_from_slice(&self.data);
        }
        self.data.clear();
        self.wake_writer();
        Read::Bytes
    }

    fn wake_reader(&mut self) {
        if let Some(w) = self.read_waker.take() {
            w.wake();
        }
    }

    fn wake_writer(&mut self) {
        if let Some(w) = self.write_waker.take() {
            w.wake();
        }
    }

    /// The reader is gone: writes fail from now on, and whoever watches for that is woken.
    fn close_reader(&mut self) {
        self.reader_closed = true;
        self.head = None;
        self.wake_writer();
        if let Some(w) = self.gone_waker.take() {
            w.wake();
        }
    }
}

/// Both directions, in one allocation.
#[derive(Debug, Default)]
struct Pipes {
    to_proxy: RefCell<Pipe>,
    from_proxy: RefCell<Pipe>,
    /// Where the parts of the request head (the first bytes toward the proxy) are.
    written: RefCell<Option<WrittenRequest>>,
    /// The exchange's access log line, handed over by the proxy side when it is done: the
    /// stream's side finishes it once the client has the response (see [`StreamEnd::take_line`]).
    line: RefCell<Option<Pending>>,
    /// The status of the HEADERS frame sent to the client (0: none yet).
    status: Cell<u16>,
    /// DATA bytes sent to the client.
    sent: Cell<u64>,
}

type Shared = Rc<Pipes>;

/// Creates the two ends: the proxy's virtual connection and the HTTP/2 stream's end. `grpc`:
/// the request says it is a gRPC call (its content type). `share`: the streams of the
/// connection, whose budget bounds both pipes (`None`: [`PIPE_BYTES`] each).
pub fn pair(
    sni: Option<Rc<str>>,
    tls: bool,
    grpc: bool,
    share: Option<Rc<super::StreamCount>>,
) -> (VirtualConn, StreamEnd) {
    let pipes: Shared = Rc::default();
    pipes.to_proxy.borrow_mut().share = share.clone();
    pipes.from_proxy.borrow_mut().share = share;
    (
        VirtualConn {
            pipes: pipes.clone(),
            sni,
            tls,
            grpc,
        },
        StreamEnd { pipes },
    )
}

/// The proxy's side: reads the request, writes the response.
#[derive(Debug)]
pub struct VirtualConn {
    pipes: Shared,
    sni: Option<Rc<str>>,
    tls: bool,
    grpc: bool,
}

impl VirtualConn {
    /// The SNI name of the HTTP/2 connection, when it came over TLS with one.
    pub fn sni(&self) -> Option<&str> {
        self.sni.as_deref()
    }

    /// Whether the HTTP/2 connection is TLS.
    pub fn is_tls(&self) -> bool {
        self.tls
    }

    /// Whether a body is best relayed to this stream in large blocks: whether its pipe may hold
    /// a whole [`PIPE_BYTES`] now. (With many streams open, each gets a share of the
    /// connection's budget, and a large block would hold more than its share while it waits
    /// for room.)
    pub fn takes_large_blocks(&self) -> bool {
        self.pipes.from_proxy.borrow().limit() >= PIPE_BYTES
    }

    /// Whether the stream's request is a gRPC call (by its content type): its errors are
    /// gRPC statuses even before its head is parsed.
    pub fn is_grpc(&self) -> bool {
        self.grpc
    }

    /// Hands the exchange's access log line to the stream's side, which adds what the client
    /// got (status and DATA bytes) when the stream ends.
    pub fn hand_line(&self, line: Pending) {
        *self.pipes.line.borrow_mut() = Some(line);
    }

    /// Where the parts of the request head are, which the stream wrote as the first bytes
    /// (see [`StreamEnd::put_first`]); once.
    pub fn take_written(&self) -> Option<WrittenRequest> {
        self.pipes.written.borrow_mut().take()
    }

    /// A second handle on the request direction, usable while this connection writes the
    /// response (a request body streamed up while the response streams down: gRPC's
    /// bidirectional calls). It reads the same bytes: one of the two reads at a time.
    pub fn reader(&self) -> VirtualReader {
        VirtualReader {
            pipes: self.pipes.clone(),
        }
    }

    /// A watch that turns ready once the HTTP/2 stream stops taking the response (the client
    /// reset the stream or went away), usable while this connection is lent out.
    pub fn gone_watch(&self) -> GoneWatch {
        GoneWatch {
            pipes: self.pipes.clone(),
        }
    }

    async fn write_from<T: IoBuf>(&mut self, buf: T) -> BufResult<usize, T> {
        // SAFETY: IoBuf's contract: `bytes_init` initialized bytes at `read_ptr`.
        let data = unsafe { std::slice::from_raw_parts(buf.read_ptr(), buf.bytes_init()) };
        let n = poll_fn(|cx| self.pipes.from_proxy.borrow_mut().push(data, cx)).await;
        (n.ok_or_else(|| io::ErrorKind::BrokenPipe.into()), buf)
    }

    fn close_write(&self) {
        let mut p = self.pipes.from_proxy.borrow_mut();
        p.writer_closed = true;
        p.wake_reader();
    }

    /// Hands the final response head over typed, in place of its HTTP/1.1 bytes (which
    /// the stream would only parse back): the body's bytes follow it with [`write`]s.
    /// Bytes written before it (a `100 Continue`) are read before it. `BrokenPipe` when
    /// the stream no longer takes the response.
    ///
    /// [`write`]: AsyncWriteRent::write
    pub fn put_head(&self, start: HeadStart) -> io::Result<()> {
        let mut p = self.pipes.from_proxy.borrow_mut();
        if p.reader_closed {
            return Err(io::ErrorKind::BrokenPipe.into());
        }
        debug_assert!(p.head.is_none(), "one final head per stream");
        p.head_at = p.data.len();
        p.head = Some(start);
        p.wake_reader();
        Ok(())
    }

    /// Marks the response written so far as cut short: its end is no end of the response
    /// (the stream is reset, even when the body is delimited by the close).
    pub fn abort(&self) {
        self.pipes.from_proxy.borrow_mut().aborted = true;
    }
}

impl Drop for VirtualConn {
    fn drop(&mut self) {
        self.close_write();
        let mut p = self.pipes.to_proxy.borrow_mut();
        p.reader_closed = true;
        p.wake_writer();
    }
}

/// Reads request bytes from the pipe into `buf`; `Ok(0)` at end of stream.
async fn read_into<T: IoBufMut>(pipes: &Shared, mut buf: T) -> BufResult<usize, T> {
    let want = buf.bytes_total();
    if want == 0 {
        return (Ok(0), buf);
    }
    if !poll_fn(|cx| pipes.to_proxy.borrow_mut().poll_data(cx)).await {
        return (Ok(0), buf);
    }
    let mut pipe = pipes.to_proxy.borrow_mut();
    let src = pipe.front(want);
    let n = src.len();
    // SAFETY: `n <= bytes_total` bytes are writable at `write_ptr` (`IoBufMut`'s contract);
    // they are copied by raw pointer (no reference to possibly uninitialized memory is made)
    // from the pipe's own buffer, which does not overlap, and only then marked initialized.
    unsafe {
        buf.write_ptr().copy_from_nonoverlapping(src.as_ptr(), n);
        buf.set_init(n);
    }
    pipe.consume(n);
    drop(pipe);
    (Ok(n), buf)
}

/// `read_into` for a vectored buffer: fills its first slice.
async fn readv_into<T: IoVecBufMut>(pipes: &Shared, mut buf: T) -> BufResult<usize, T> {
    // SAFETY: `buf` outlives `raw`, which points into its first slice only.
    let Some(raw) = (unsafe { RawBuf::new_from_iovec_mut(&mut buf) }) else {
        return (Ok(0), buf);
    };
    let (res, _) = read_into(pipes, raw).await;
    if let Ok(n) = res {
        // SAFETY: `n` bytes were written at the start of the first slice.
        unsafe { buf.set_init(n) };
    }
    (res, buf)
}

impl AsyncReadRent for VirtualConn {
    async fn read<T: IoBufMut>(&mut self, buf: T) -> BufResult<usize, T> {
        read_into(&self.pipes, buf).await
    }

    async fn readv<T: IoVecBufMut>(&mut self, buf: T) -> BufResult<usize, T> {
        readv_into(&self.pipes, buf).await
    }
}

/// Whether the HTTP/2 stream behind a [`VirtualConn`] still takes the response; see
/// [`VirtualConn::gone_watch`].
#[derive(Debug)]
pub struct GoneWatch {
    pipes: Shared,
}

impl GoneWatch {
    /// `Ready` once the stream stopped taking the response; `Pending` (the waker kept) before.
    pub fn poll_gone(&self, cx: &mut Context<'_>) -> Poll<()> {
        let mut p = self.pipes.from_proxy.borrow_mut();
        if p.reader_closed {
            return Poll::Ready(());
        }
        if !p
            .gone_waker
            .as_ref()
            .is_some_and(|w| w.will_wake(cx.waker()))
        {
            p.gone_waker = Some(cx.waker().clone());
        }
        Poll::Pending
    }
}

/// The request direction of a [`VirtualConn`], apart from it (see [`VirtualConn::reader`]).
/// Dropping it closes nothing: the connection's own drop does.
#[derive(Debug)]
pub struct VirtualReader {
    pipes: Shared,
}

impl AsyncReadRent for VirtualReader {
    async fn read<T: IoBufMut>(&mut self, buf: T) -> BufResult<usize, T> {
        read_into(&self.pipes, buf).await
    }

    async fn readv<T: IoVecBufMut>(&mut self, buf: T) -> BufResult<usize, T> {
        readv_into(&self.pipes, buf).await
    }
}

impl AsyncWriteRent for VirtualConn {
    async fn write<T: IoBuf>(&mut self, buf: T) -> BufResult<usize, T> {
        self.write_from(buf).await
    }

    async fn writev<T: IoVecBuf>(&mut self, buf: T) -> BufResult<usize, T> {
        // SAFETY: `buf` outlives `raw`, which points into its first slice only.
        let Some(raw) = (unsafe { RawBuf::new_from_iovec(&buf) }) else {
            return (Ok(0), buf);
        };
        let (res, _) = self.write_from(raw).await;
        (res, buf)
    }

    async fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }

    async fn shutdown(&mut self) -> io::Result<()> {
        self.close_write();
        Ok(())
    }
}

/// The HTTP/2 stream's side: writes the request, reads the response.
#[derive(Debug)]
pub struct StreamEnd {
    pipes: Shared,
}

impl StreamEnd {
    /// The response's HEADERS went to the client with `status`.
    pub fn responded(&self, status: u16) {
        self.pipes.status.set(status);
    }

    /// `n` bytes of DATA went to the client.
    pub fn sent_data(&self, n: u64) {
        self.pipes.sent.set(self.pipes.sent.get() + n);
    }

    /// The access log line the proxy side handed over, with the status and the DATA bytes
    /// the client got.
    pub fn take_line(&self) -> Option<(Pending, u16, u64)> {
        let line = self.pipes.line.borrow_mut().take()?;
        Some((line, self.pipes.status.get(), self.pipes.sent.get()))
    }

    /// Writes all of `data` toward the proxy, waiting for room; false when the proxy side is
    /// gone.
    pub async fn write_all(&self, mut data: &[u8]) -> bool {
        while !data.is_empty() {
            let n = poll_fn(|cx| self.pipes.to_proxy.borrow_mut().push(data, cx)).await;
            match n {
                Some(n) => data = &data[n..],
                None => return false,
            }
        }
        true
    }

    /// Makes `data`, a request head whose parts are at `written`, the first bytes toward the
    /// proxy, without copying them. (Were bytes there already, it would go after them, to be
    /// parsed as bytes.)
    pub fn put_first(&self, data: BytesMut, written: WrittenRequest) {
        let mut p = self.pipes.to_proxy.borrow_mut();
        if p.data.is_empty() {
            p.data = data;
            *self.pipes.written.borrow_mut() = Some(written);
        } else {
            p.data.extend_from_slice(&data);
        }
        p.wake_reader();
    }

    /// Ends the request stream (end of stream for the proxy's reader).
    pub fn close_write(&self) {
        let mut p = self.pipes.to_proxy.borrow_mut();
        p.writer_closed = true;
        p.wake_reader();
    }

    /// Stops taking response bytes: the proxy's writes fail from now on.
    pub fn close_read(&self) {
        let mut p = self.pipes.from_proxy.borrow_mut();
        p.data.clear();
        p.close_reader();
    }

    /// Whether the proxy marked its response as cut short (see [`VirtualConn::abort`]).
    pub fn aborted(&self) -> bool {
        self.pipes.from_proxy.borrow().aborted
    }

    /// Appends the response bytes the proxy wrote to `dst`, or takes its typed head
    /// (waiting for either).
    pub async fn read_into(&self, dst: &mut BytesMut) -> Read {
        let pipe = &self.pipes.from_proxy;
        if !poll_fn(|cx| pipe.borrow_mut().poll_data(cx)).await {
            return Read::End;
        }
        pipe.borrow_mut().move_out(dst)
    }
}

impl Drop for StreamEnd {
    fn drop(&mut self) {
        self.close_write();
        self.pipes.from_proxy.borrow_mut().close_reader();
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::pin::pin;

    use super::*;

    /// Polls `f` once: every step here has what it needs at hand.
    fn now<F: Future>(f: F) -> F::Output {
        match pin!(f).poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(out) => out,
            Poll::Pending => panic!("would wait"),
        }
    }

    fn head(body: BodyFraming) -> HeadStart {
        HeadStart {
            head: http::Response::new(()),
            body,
        }
    }

    #[test]
    fn a_large_body_gets_the_whole_pipe_at_once_and_a_small_one_stays_small() {
        let mut cx = Context::from_waker(Waker::noop());
        let mut pipe = Pipe::default();
        assert_eq!(pipe.push(b"hello world\n", &mut cx), Poll::Ready(Some(12)));
        assert!(
            pipe.data.capacity() < PIPE_BYTES / 4,
            "a small body keeps a small buffer"
        );
        pipe.consume(12);
        // A relayed large body comes in pieces: once it outgrows a small buffer, the pipe's
        // buffer is sized for all it holds, and the pieces after that are not moved again.
        let piece = vec![7u8; 16 * 1024];
        for _ in 0..2 {
            assert_eq!(pipe.push(&piece, &mut cx), Poll::Ready(Some(piece.len())));
        }
        assert!(pipe.data.capacity() >= PIPE_BYTES);
        let at = pipe.data.as_ptr();
        while pipe.data.len() < PIPE_BYTES {
            assert!(matches!(pipe.push(&piece, &mut cx), Poll::Ready(Some(_))));
        }
        assert_eq!(pipe.data.as_ptr(), at, "no reallocation");
        assert!(pipe.push(&piece, &mut cx).is_pending(), "full");
    }

    /// Fills `pipe` with `piece`s until it refuses; the bytes it took.
    fn fill(pipe: &mut Pipe, piece: &[u8]) -> usize {
        let mut cx = Context::from_waker(Waker::noop());
        let mut took = 0;
        while let Poll::Ready(Some(n)) = pipe.push(piece, &mut cx) {
            took += n;
        }
        took
    }

    #[test]
    fn a_pipe_holds_an_equal_share_of_its_connections_budget() {
        let streams = Rc::new(crate::h2::StreamCount::new(1024 * 1024));
        let (vconn, end) = pair(None, false, false, Some(streams.clone()));
        let piece = [7u8; 5000];
        // One stream open: its share is above a pipe, so a whole pipe.
        streams.active.set(1);
        assert!(vconn.takes_large_blocks());
        assert_eq!(
            fill(&mut vconn.pipes.from_proxy.borrow_mut(), &piece),
            PIPE_BYTES
        );
        let mut buf = BytesMut::new();
        assert!(matches!(now(end.read_into(&mut buf)), Read::Bytes));
        assert_eq!(buf.len(), PIPE_BYTES);
        // 32 open: 32 KiB each. 100 open: a share below the floor, so the floor.
        streams.active.set(32);
        assert!(!vconn.takes_large_blocks());
        assert_eq!(
            fill(&mut vconn.pipes.from_proxy.borrow_mut(), &piece),
            32 * 1024
        );
        end.pipes.from_proxy.borrow_mut().consume(32 * 1024);
        streams.active.set(100);
        assert_eq!(
            fill(&mut vconn.pipes.from_proxy.borrow_mut(), &piece),
            MIN_PIPE_BYTES
        );
        // The request direction holds the same share.
        assert_eq!(
            fill(&mut vconn.pipes.to_proxy.borrow_mut(), &piece),
            MIN_PIPE_BYTES
        );
        // Streams ended: a full pipe's room again, for the bytes already held too.
        streams.active.set(1);
        assert_eq!(
            fill(&mut vconn.pipes.from_proxy.borrow_mut(), &piece),
            PIPE_BYTES - MIN_PIPE_BYTES
        );
    }

    #[test]
    fn a_typed_head_comes_after_the_bytes_before_it_and_before_the_body() {
        let (mut vconn, end) = pair(None, false, false, None);
        let interim: &'static [u8] = b"HTTP/1.1 100 Continue\r\n\r\n";
        assert_eq!(now(vconn.write(interim)).0.unwrap(), interim.len());
        vconn.put_head(head(BodyFraming::Length(5))).unwrap();
        assert_eq!(now(vconn.write(&b"hello"[..])).0.unwrap(), 5);
        let mut buf = BytesMut::new();
        assert!(matches!(now(end.read_into(&mut buf)), Read::Bytes));
        assert_eq!(&buf[..], interim, "only the bytes before the head");
        buf.clear();
        let Read::Head(start) = now(end.read_into(&mut buf)) else {
            panic!("the head next");
        };
        assert_eq!(start.body, BodyFraming::Length(5));
        assert!(buf.is_empty());
        assert!(matches!(now(end.read_into(&mut buf)), Read::Bytes));
        assert_eq!(&buf[..], b"hello");
        drop(vconn);
        assert!(matches!(now(end.read_into(&mut buf)), Read::End));
    }

    #[test]
    fn a_head_first_is_read_first() {
        let (vconn, end) = pair(None, false, false, None);
        vconn.put_head(head(BodyFraming::None)).unwrap();
        drop(vconn);
        let mut buf = BytesMut::new();
        assert!(matches!(now(end.read_into(&mut buf)), Read::Head(_)));
        assert!(matches!(now(end.read_into(&mut buf)), Read::End));
        assert!(buf.is_empty());
    }

    #[test]
    fn a_stream_that_stopped_taking_the_response_refuses_its_head() {
        let (vconn, end) = pair(None, false, false, None);
        end.close_read();
        let err = vconn.put_head(head(BodyFraming::None)).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::BrokenPipe);
    }
}
