//! The bridge between an HTTP/2 stream and the HTTP/1.1 request path: a virtual connection.
//!
//! ```text
//! h2 stream ──(HTTP/1.1 request bytes)──► [to_proxy pipe]  ──► VirtualConn::read  ──► proxy
//! h2 stream ◄──(HTTP/1.1 response bytes)── [from_proxy pipe] ◄── VirtualConn::write ◄── proxy
//! ```
//!
//! Each HTTP/2 request is written as an HTTP/1.1 request into a virtual connection that the
//! ordinary connection task serves (routes, limits, retries, breakers, error envelopes: all
//! of it, once), and the HTTP/1.1 response it writes back is turned into HTTP/2 frames.
//! The pipes live on one thread (`Rc<RefCell>`), hold a bounded number of bytes and wake the
//! other side: a full pipe makes its writer wait, so backpressure runs through end to end
//! (an HTTP/2 reader that grants no window stops the upstream relay).

use std::cell::RefCell;
use std::future::poll_fn;
use std::io;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use bytes::{Bytes, BytesMut};
use monoio::buf::{IoBuf, IoBufMut, IoVecBuf, IoVecBufMut, RawBuf};
use monoio::io::{AsyncReadRent, AsyncWriteRent};
use monoio::BufResult;

/// Bytes a pipe holds before its writer waits.
pub const PIPE_BYTES: usize = 64 * 1024;

/// One direction.
#[derive(Debug, Default)]
struct Pipe {
    data: BytesMut,
    /// The writer is done (end of stream once `data` is drained).
    writer_closed: bool,
    /// The reader is gone: writes fail.
    reader_closed: bool,
    read_waker: Option<Waker>,
    write_waker: Option<Waker>,
}

impl Pipe {
    /// Appends what fits of `data` (at most [`PIPE_BYTES`] held); `Pending` (with the waker
    /// kept) when full; `None` once the reader is gone.
    fn push(&mut self, data: &[u8], cx: &mut Context<'_>) -> Poll<Option<usize>> {
        if self.reader_closed {
            return Poll::Ready(None);
        }
        let room = PIPE_BYTES.saturating_sub(self.data.len());
        if room == 0 {
            self.write_waker = Some(cx.waker().clone());
            return Poll::Pending;
        }
        let n = room.min(data.len());
        self.data.extend_from_slice(&data[..n]);
        self.wake_reader();
        Poll::Ready(Some(n))
    }

    /// Takes up to `max` bytes; `Ready(None)` at end of stream; `Pending` when empty.
    fn pull(&mut self, max: usize, cx: &mut Context<'_>) -> Poll<Option<BytesMut>> {
        if !self.data.is_empty() {
            let n = max.max(1).min(self.data.len());
            let out = self.data.split_to(n);
            self.wake_writer();
            return Poll::Ready(Some(out));
        }
        if self.writer_closed {
            return Poll::Ready(None);
        }
        self.read_waker = Some(cx.waker().clone());
        Poll::Pending
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
}

type Shared = Rc<RefCell<Pipe>>;

/// Creates the two ends: the proxy's virtual connection and the HTTP/2 stream's end.
pub fn pair(sni: Option<Rc<str>>, tls: bool) -> (VirtualConn, StreamEnd) {
    let to_proxy: Shared = Rc::default();
    let from_proxy: Shared = Rc::default();
    (
        VirtualConn {
            to_proxy: to_proxy.clone(),
            from_proxy: from_proxy.clone(),
            sni,
            tls,
        },
        StreamEnd {
            to_proxy,
            from_proxy,
        },
    )
}

/// The proxy's side: reads the request, writes the response.
#[derive(Debug)]
pub struct VirtualConn {
    to_proxy: Shared,
    from_proxy: Shared,
    sni: Option<Rc<str>>,
    tls: bool,
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

    /// A second handle on the request direction, usable while this connection writes the
    /// response (a request body streamed up while the response streams down: gRPC's
    /// bidirectional calls). It reads the same bytes: one of the two reads at a time.
    pub fn reader(&self) -> VirtualReader {
        VirtualReader {
            to_proxy: self.to_proxy.clone(),
        }
    }

    async fn write_from<T: IoBuf>(&mut self, buf: T) -> BufResult<usize, T> {
        // SAFETY: IoBuf's contract: `bytes_init` initialized bytes at `read_ptr`.
        let data = unsafe { std::slice::from_raw_parts(buf.read_ptr(), buf.bytes_init()) };
        let n = poll_fn(|cx| self.from_proxy.borrow_mut().push(data, cx)).await;
        (n.ok_or_else(|| io::ErrorKind::BrokenPipe.into()), buf)
    }

    fn close_write(&self) {
        let mut p = self.from_proxy.borrow_mut();
        p.writer_closed = true;
        p.wake_reader();
    }
}

impl Drop for VirtualConn {
    fn drop(&mut self) {
        self.close_write();
        let mut p = self.to_proxy.borrow_mut();
        p.reader_closed = true;
        p.wake_writer();
    }
}

/// Reads request bytes from the pipe into `buf`; `Ok(0)` at end of stream.
async fn read_into<T: IoBufMut>(pipe: &Shared, mut buf: T) -> BufResult<usize, T> {
    let want = buf.bytes_total();
    if want == 0 {
        return (Ok(0), buf);
    }
    let Some(data) = poll_fn(|cx| pipe.borrow_mut().pull(want, cx)).await else {
        return (Ok(0), buf);
    };
    // SAFETY: `data.len() <= bytes_total` writable bytes at `write_ptr`; the source is the
    // pipe's initialized data; they do not overlap.
    unsafe {
        buf.write_ptr()
            .copy_from_nonoverlapping(data.as_ptr(), data.len());
        buf.set_init(data.len());
    }
    (Ok(data.len()), buf)
}

/// `read_into` for a vectored buffer: fills its first slice.
async fn readv_into<T: IoVecBufMut>(pipe: &Shared, mut buf: T) -> BufResult<usize, T> {
    // SAFETY: `buf` outlives `raw`, which points into its first slice only.
    let Some(raw) = (unsafe { RawBuf::new_from_iovec_mut(&mut buf) }) else {
        return (Ok(0), buf);
    };
    let (res, _) = read_into(pipe, raw).await;
    if let Ok(n) = res {
        // SAFETY: `n` bytes were written at the start of the first slice.
        unsafe { buf.set_init(n) };
    }
    (res, buf)
}

impl AsyncReadRent for VirtualConn {
    async fn read<T: IoBufMut>(&mut self, buf: T) -> BufResult<usize, T> {
        read_into(&self.to_proxy, buf).await
    }

    async fn readv<T: IoVecBufMut>(&mut self, buf: T) -> BufResult<usize, T> {
        readv_into(&self.to_proxy, buf).await
    }
}

/// The request direction of a [`VirtualConn`], apart from it (see [`VirtualConn::reader`]).
/// Dropping it closes nothing: the connection's own drop does.
#[derive(Debug)]
pub struct VirtualReader {
    to_proxy: Shared,
}

impl AsyncReadRent for VirtualReader {
    async fn read<T: IoBufMut>(&mut self, buf: T) -> BufResult<usize, T> {
        read_into(&self.to_proxy, buf).await
    }

    async fn readv<T: IoVecBufMut>(&mut self, buf: T) -> BufResult<usize, T> {
        readv_into(&self.to_proxy, buf).await
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
    to_proxy: Shared,
    from_proxy: Shared,
}

impl StreamEnd {
    /// Writes all of `data` toward the proxy, waiting for room; false when the proxy side is
    /// gone.
    pub async fn write_all(&self, mut data: &[u8]) -> bool {
        while !data.is_empty() {
            let n = poll_fn(|cx| self.to_proxy.borrow_mut().push(data, cx)).await;
            match n {
                Some(n) => data = &data[n..],
                None => return false,
            }
        }
        true
    }

    /// Makes `data` the first bytes toward the proxy, without copying them (they are appended
    /// when the pipe holds bytes already).
    pub fn put_first(&self, data: BytesMut) {
        let mut p = self.to_proxy.borrow_mut();
        if p.data.is_empty() {
            p.data = data;
        } else {
            p.data.extend_from_slice(&data);
        }
        p.wake_reader();
    }

    /// Ends the request stream (end of stream for the proxy's reader).
    pub fn close_write(&self) {
        let mut p = self.to_proxy.borrow_mut();
        p.writer_closed = true;
        p.wake_reader();
    }

    /// Up to `max` response bytes from the proxy; `None` at end of stream.
    pub async fn read(&self, max: usize) -> Option<Bytes> {
        poll_fn(|cx| self.from_proxy.borrow_mut().pull(max, cx))
            .await
            .map(BytesMut::freeze)
    }
}

impl Drop for StreamEnd {
    fn drop(&mut self) {
        self.close_write();
        let mut p = self.from_proxy.borrow_mut();
        p.reader_closed = true;
        p.wake_writer();
    }
}
