//! Deadline-bounded, rent-style I/O on pooled blocks.
//!
//! A timed-out read or write is cancelled and its block stays with the cancelled operation
//! until the kernel lets go of it; the caller gets a fresh empty block back together with an
//! `io::ErrorKind::TimedOut` error, so a block is always returned.
//!
//! On the per-request and per-chunk paths these are awaited as `pin!(read_by(..)).await`:
//! built inside `pin!`, the future is made in its final place. Awaited by value, it is put
//! together on the stack and copied into the caller's state whole, once or twice per await.

use std::fmt;
use std::future::Future;
use std::io;
use std::pin::{pin, Pin};
use std::task::Poll;
use std::time::{Duration, Instant};

use monoio::buf::IoBuf;
use monoio::io::{AsyncReadRent, AsyncWriteRent, AsyncWriteRentExt, CancelableAsyncReadRent};

use crate::buf::{Block, BufPool};
use crate::net::client::ClientStream;
use crate::worker::ctx::BODY_BLOCK_BYTES;
use crate::worker::deadline::within;

fn timed_out() -> io::Error {
    io::Error::from(io::ErrorKind::TimedOut)
}

/// Reads once into the spare space of `buf` before `deadline`. `Ok(0)` is end of stream.
pub async fn read_by<S: AsyncReadRent>(
    stream: &mut S,
    buf: Block,
    deadline: Instant,
    pool: &BufPool,
) -> (io::Result<usize>, Block) {
    let read = pin!(stream.read(buf));
    let res = pin!(within(deadline, read)).await;
    match res {
        Some(r) => r,
        None => (Err(timed_out()), pool.take()),
    }
}

/// What [`release_idle`] gave.
#[derive(Debug)]
pub enum IdleWait {
    /// The read ended before the release time (bytes, end of stream or an error), with its
    /// block.
    Read(io::Result<usize>, Block),
    /// The block went back; bytes have come since.
    Ready,
    /// Nothing came by the deadline, or the wait failed.
    Over,
}

/// A keep-alive connection's canceller for its idle reads (see [`release_idle`]): made at
/// its first such wait, and again after each cancel (a canceller stays cancelled).
#[derive(Default)]
pub struct IdleCancel(Option<monoio::io::Canceller>);

impl fmt::Debug for IdleCancel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("IdleCancel")
    }
}

/// A cleartext keep-alive connection's wait for its next request that gives its block back
/// after a while (`http.idle_buffer_release`): it reads into `buf` (empty) until `release`,
/// then cancels the read and, unless the kernel completed it meanwhile (its bytes are kept:
/// `IdleWait::Read`), drops the block and waits until `deadline` for the socket to turn
/// readable with none (`IdleWait::Ready`). A cancellable read costs monoio a hash set
/// insertion and removal, every time: about 5% more instructions per keep-alive request.
pub async fn release_idle(
    tcp: &mut monoio::net::TcpStream,
    buf: Block,
    release: Instant,
    deadline: Instant,
    cancel: &mut IdleCancel,
) -> IdleWait {
    {
        let handle = cancel.0.get_or_insert_with(Default::default).handle();
        let mut read = pin!(CancelableAsyncReadRent::cancelable_read(tcp, buf, handle));
        if let Some((res, buf)) = within(release, read.as_mut()).await {
            return IdleWait::Read(res, buf);
        }
        if let Some(c) = cancel.0.take() {
            cancel.0 = Some(c.cancel());
        }
        // (Bounded too: a cancel the ring could not take leaves the read waiting for bytes.)
        match within(deadline, read.as_mut()).await {
            Some((Err(e), buf)) if e.raw_os_error() == Some(libc::ECANCELED) => drop(buf),
            Some((res, buf)) => return IdleWait::Read(res, buf),
            None => return IdleWait::Over,
        }
    }
    match within(deadline, pin!(tcp.readable(false))).await {
        Some(Ok(())) => IdleWait::Ready,
        _ => IdleWait::Over,
    }
}

/// How long a write may stall: a deadline that each write making progress pushes back by the
/// whole timeout again. A peer that reads slowly but steadily is never cut; one that stops
/// reading is, `timeout` after its last byte was taken.
#[derive(Debug, Clone, Copy)]
pub struct Stall {
    deadline: Instant,
    /// `None`: no bound of its own (see [`Stall::to_client`]); `deadline` is then far off.
    timeout: Option<Duration>,
}

impl Stall {
    /// A stall bound of `timeout`, counted from `now`.
    pub fn new(now: Instant, timeout: Duration) -> Self {
        Stall {
            deadline: now + timeout,
            timeout: Some(timeout),
        }
    }

    /// The bound for writes of a response body to `client`: `timeout`, except for an HTTP/2
    /// stream, whose own side bounds the client's stalls (it resets the stream when the
    /// client withholds window for `send_timeout`, and the writes here then fail). Its
    /// bridge takes bytes in blocks, each as the client's window lets the previous one go: a
    /// slow reader's progress shows here only block by block.
    pub fn to_client(client: &ClientStream, now: Instant, timeout: Duration) -> Self {
        match client {
            ClientStream::Virtual(_) => Stall {
                // (A year: a plain deadline keeps the write's future as small as a bounded
                // one's; the wheel takes any instant.)
                deadline: now + Duration::from_secs(365 * 24 * 3600),
                timeout: None,
            },
            _ => Stall::new(now, timeout),
        }
    }

    /// Some bytes went: the bound starts again.
    fn progressed(&mut self) {
        if let Some(timeout) = self.timeout {
            self.deadline = Instant::now() + timeout;
        }
    }
}

/// Writes the first `n` unconsumed bytes of `buf`, each write within `stall`, then consumes
/// them.
pub async fn write_front_by<S: AsyncWriteRent>(
    stream: &mut S,
    mut buf: Block,
    n: usize,
    mut stall: Stall,
    pool: &BufPool,
) -> (io::Result<()>, Block) {
    let n = n.min(buf.len());
    let mut written = 0;
    // (monoio's `write_all`, written out: as a future of its own it would be one more layer
    // in every timed write, whose first poll copies its arguments.)
    while written < n {
        let write = pin!(stream.write(buf.slice(written..n)));
        let Some((res, slice)) = pin!(within(stall.deadline, write)).await else {
            return (Err(timed_out()), pool.take());
        };
        buf = slice.into_inner();
        match res {
            Ok(0) => return (Err(io::ErrorKind::WriteZero.into()), buf),
            Ok(k) => {
                written += k;
                if written < n {
                    // (A clock read only when a write was partial: not the common case.)
                    stall.progressed();
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return (Err(e), buf),
        }
    }
    buf.consume(n);
    (Ok(()), buf)
}

/// Writes every unconsumed byte of `buf`, each write within `stall`; `buf` comes back empty on
/// success.
/// ([`write_front_by`]'s future itself: a layer of its own around it would copy the
/// arguments once more.)
pub fn write_all_by<'a, S: AsyncWriteRent>(
    stream: &'a mut S,
    buf: Block,
    stall: Stall,
    pool: &'a BufPool,
) -> impl Future<Output = (io::Result<()>, Block)> + 'a {
    let n = buf.len();
    write_front_by(stream, buf, n, stall, pool)
}

/// Writes a static byte string before `deadline`.
pub async fn write_static_by<S: AsyncWriteRent>(
    stream: &mut S,
    bytes: &'static [u8],
    deadline: Instant,
) -> io::Result<()> {
    let write = pin!(stream.write_all(bytes));
    match within(deadline, write).await {
        Some((r, _)) => r.map(|_| ()),
        None => Err(timed_out()),
    }
}

/// Which of two futures finished first.
#[derive(Debug)]
pub enum Either<A, B> {
    /// The first.
    Left(A),
    /// The second.
    Right(B),
}

/// Polls both futures, first `a`, and returns the output of the one that finishes first. Both
/// stay usable (they are borrowed): the caller may go on awaiting the other.
pub async fn race<A: Future + ?Sized, B: Future + ?Sized>(
    mut a: Pin<&mut A>,
    mut b: Pin<&mut B>,
) -> Either<A::Output, B::Output> {
    std::future::poll_fn(|cx| {
        if let Poll::Ready(v) = a.as_mut().poll(cx) {
            return Poll::Ready(Either::Left(v));
        }
        if let Poll::Ready(v) = b.as_mut().poll(cx) {
            return Poll::Ready(Either::Right(v));
        }
        Poll::Pending
    })
    .await
}

/// Body reads sized so that their writes leave as whole TCP segments. A 64 KiB block written
/// as it was read leaves as a full segment and a short one (loopback's MSS is 65,483; a NIC's
/// GSO cuts the same way, at a multiple of 1,448), so a large body would cost twice the
/// packets it needs, each with its own delivery and wake-up of the reader. The first read
/// that fills a large block (a large body is streaming) asks the segment size of the socket
/// the bytes go to, once; later reads into an empty block are cut to a multiple of it.
#[derive(Debug, Default)]
pub struct WholeSegments(Option<Option<usize>>);

impl WholeSegments {
    /// The limit for a read into an empty block with `spare` free bytes, if any.
    pub fn limit(&self, spare: usize) -> Option<usize> {
        match self.0 {
            Some(Some(mss)) if spare > mss => Some(spare - spare % mss),
            _ => None,
        }
    }

    /// After a read of `n` bytes into `spare` free bytes: the first time one filled a large
    /// block, learns the segment size (`None`: nothing to align to, not asked again).
    pub fn after_read(&mut self, n: usize, spare: usize, mss: impl FnOnce() -> Option<usize>) {
        if self.0.is_none() && n == spare && spare >= BODY_BLOCK_BYTES / 2 {
            self.0 = Some(mss());
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Takes `take` bytes per write, each write after `pause`; `take` 0: never returns.
    struct Trickle {
        pause: Duration,
        take: usize,
    }

    impl AsyncWriteRent for Trickle {
        async fn write<T: IoBuf>(&mut self, buf: T) -> monoio::BufResult<usize, T> {
            if self.take == 0 {
                std::future::pending::<()>().await;
            }
            monoio::time::sleep(self.pause).await;
            (Ok(self.take.min(buf.bytes_init())), buf)
        }

        async fn writev<T: monoio::buf::IoVecBuf>(
            &mut self,
            buf: T,
        ) -> monoio::BufResult<usize, T> {
            (Ok(0), buf)
        }

        async fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }

        async fn shutdown(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// A runtime with a timer, and this thread's deadline wheel fresh.
    fn timed_runtime() -> monoio::Runtime<monoio::time::TimeDriver<monoio::LegacyDriver>> {
        crate::worker::deadline::reset_thread();
        monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
            .enable_timer()
            .build()
            .unwrap()
    }

    #[test]
    fn a_write_is_bounded_by_its_stall_not_by_its_length() {
        timed_runtime().block_on(async {
            let pool = BufPool::new(64);
            let bytes = |pool: &BufPool| {
                let mut b = pool.take();
                let _ = b.put(&[7; 10]);
                b
            };
            let timeout = Duration::from_millis(60);
            // A byte every 25 ms: 250 ms in all, never 60 ms without progress.
            let mut slow = Trickle {
                pause: Duration::from_millis(25),
                take: 1,
            };
            let start = Instant::now();
            let stall = Stall::new(start, timeout);
            let (res, buf) = write_all_by(&mut slow, bytes(&pool), stall, &pool).await;
            assert!(res.is_ok() && buf.is_empty(), "{res:?}");
            assert!(start.elapsed() >= Duration::from_millis(250));
            // No progress: the write ends at the timeout.
            let mut stuck = Trickle {
                pause: Duration::ZERO,
                take: 0,
            };
            let start = Instant::now();
            let stall = Stall::new(start, timeout);
            let (res, _) = write_all_by(&mut stuck, bytes(&pool), stall, &pool).await;
            assert_eq!(res.map_err(|e| e.kind()), Err(io::ErrorKind::TimedOut));
            let took = start.elapsed();
            assert!(
                took >= timeout && took < Duration::from_millis(1000),
                "{took:?}"
            );
        });
    }

    #[test]
    fn within_lets_a_future_finish_and_bounds_one_that_waits() {
        timed_runtime().block_on(async {
            let far = Instant::now() + Duration::from_secs(60);
            // Done at its first poll.
            assert_eq!(within(far, pin!(async { 7 })).await, Some(7));
            // Waits, then finishes before the deadline.
            let later = pin!(monoio::time::sleep(Duration::from_millis(5)));
            assert_eq!(within(far, later).await, Some(()));
            // Never finishes: the deadline ends the wait.
            let start = Instant::now();
            let deadline = start + Duration::from_millis(20);
            let never = pin!(std::future::pending::<()>());
            assert_eq!(within(deadline, never).await, None);
            assert!(Instant::now() >= deadline);
        });
    }

    #[test]
    fn whole_segments_learns_the_size_once_a_large_block_fills() {
        let mut seg = WholeSegments::default();
        assert_eq!(seg.limit(65_536), None);
        // A short read, or a full one into a small block: not asked.
        seg.after_read(100, 65_536, || panic!("asked for a short read"));
        seg.after_read(1_024, 1_024, || panic!("asked for a small block"));
        assert_eq!(seg.limit(65_536), None);
        let mut asked = 0;
        seg.after_read(65_536, 65_536, || {
            asked += 1;
            Some(65_483)
        });
        seg.after_read(65_536, 65_536, || {
            asked += 1;
            Some(1)
        });
        assert_eq!(asked, 1);
        assert_eq!(seg.limit(65_536), Some(65_483));
        assert_eq!(seg.limit(200_000), Some(196_449));
        // A block no larger than one segment is read whole.
        assert_eq!(seg.limit(65_483), None);
        // Nothing to align to (TLS, HTTP/2): asked once, never limits.
        let mut none = WholeSegments::default();
        none.after_read(65_536, 65_536, || None);
        none.after_read(65_536, 65_536, || panic!("asked twice"));
        assert_eq!(none.limit(65_536), None);
    }
}
