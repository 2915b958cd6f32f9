//! Noticing that a client went away while its response head is awaited, so the upstream
//! request is cancelled rather than left running to its timeout.
//!
//! An HTTP/2 stream says so at once (its reset closes the bridge: [`GoneWatch`]). A socket says
//! nothing until it is read or written, and the request path does neither while it waits for
//! the upstream. Watching each waiting socket with an operation of its own would cost every
//! request a poll and its cancellation; instead a waiting request enters the worker's
//! [`CloseWatcher`] (a slab slot and a waker), and the worker's tick checks the sockets that
//! have waited at least `http.client_close_check` with one `poll(2)` for all of them. A client
//! that shut down its side (`POLLRDHUP`) or reset the connection counts as gone, as nginx
//! counts it by default, unless bytes it sent before its shutdown are still unread (a request
//! body still being uploaded, a pipelined request) or it pipelined on this connection (the
//! request path then watches no socket: [`ClientGone::of`]); bytes it sends meanwhile are no
//! close.

use std::cell::{Cell, RefCell};
use std::future::{poll_fn, Future};
use std::os::fd::RawFd;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use slab::Slab;

use crate::h2::bridge::GoneWatch;
use crate::net::client::ClientStream;
use crate::worker::{CoreGen, Worker};

/// A waiting request's socket.
#[derive(Debug)]
struct Entry {
    fd: RawFd,
    /// When it started waiting (the worker's coarse clock).
    since: Instant,
    waker: Option<Waker>,
    gone: bool,
}

/// A worker's sockets whose requests await a response head; checked from the worker's tick.
#[derive(Debug)]
pub struct CloseWatcher {
    entries: RefCell<Slab<Entry>>,
    /// Scratch for the check (kept: no allocation per check).
    polls: RefCell<(Vec<libc::pollfd>, Vec<usize>)>,
    next_check: Cell<Option<Instant>>,
}

impl Default for CloseWatcher {
    fn default() -> Self {
        CloseWatcher {
            entries: RefCell::new(Slab::new()),
            polls: RefCell::new((Vec::new(), Vec::new())),
            next_check: Cell::new(None),
        }
    }
}

impl CloseWatcher {
    /// Checks, at most once per `every`, the sockets that have waited at least `every`, and
    /// wakes the requests whose clients are gone. `None`: checking is off.
    pub fn check(&self, now: Instant, every: Option<Duration>) {
        let Some(every) = every else { return };
        if self.entries.borrow().is_empty() {
            return;
        }
        match self.next_check.get() {
            Some(t) if now < t => return,
            _ => self.next_check.set(Some(now + every)),
        }
        let mut polls = self.polls.borrow_mut();
        let (fds, keys) = &mut *polls;
        fds.clear();
        keys.clear();
        for (key, e) in self.entries.borrow().iter() {
            if !e.gone && now.saturating_duration_since(e.since) >= every {
                fds.push(libc::pollfd {
                    fd: e.fd,
                    events: libc::POLLRDHUP,
                    revents: 0,
                });
                keys.push(key);
            }
        }
        if fds.is_empty() {
            return;
        }
        // SAFETY: `fds` is a live, initialized array of `fds.len()` pollfd structs; a zero
        // timeout never blocks. Every fd belongs to a connection whose request is waiting (its
        // entry is removed before the connection can close).
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 0) };
        if n <= 0 {
            return;
        }
        let mut entries = self.entries.borrow_mut();
        for (p, key) in fds.iter().zip(keys.iter()) {
            if p.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) == 0 {
                continue;
            }
            if p.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) == 0 && unread(p.fd) > 0
            {
                // Shut down for writing, but what it sent before is still to be read (a
                // request body being uploaded, a pipelined request): it still wants answers.
                continue;
            }
            if let Some(e) = entries.get_mut(*key) {
                e.gone = true;
                if let Some(w) = e.waker.take() {
                    w.wake();
                }
            }
        }
    }

    /// Sockets registered now (tests).
    pub fn len(&self) -> usize {
        self.entries.borrow().len()
    }

    /// Whether no socket is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One waiting request's socket in a [`CloseWatcher`]: entered at its first poll, left when
/// dropped.
#[derive(Debug)]
pub struct SocketWatch<'a> {
    watcher: &'a CloseWatcher,
    fd: RawFd,
    /// When the wait began (the worker's clock).
    now: Cell<Instant>,
    key: Cell<Option<usize>>,
}

impl SocketWatch<'_> {
    fn poll_gone(&self, cx: &mut Context<'_>) -> Poll<()> {
        let mut entries = self.watcher.entries.borrow_mut();
        let key = match self.key.get() {
            Some(k) => k,
            None => {
                let k = entries.insert(Entry {
                    fd: self.fd,
                    since: self.now.get(),
                    waker: None,
                    gone: false,
                });
                self.key.set(Some(k));
                k
            }
        };
        let Some(e) = entries.get_mut(key) else {
            return Poll::Pending;
        };
        if e.gone {
            return Poll::Ready(());
        }
        if !e.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            e.waker = Some(cx.waker().clone());
        }
        Poll::Pending
    }
}

impl Drop for SocketWatch<'_> {
    fn drop(&mut self) {
        if let Some(k) = self.key.get() {
            self.watcher.entries.borrow_mut().try_remove(k);
        }
    }
}

/// Whether the client of a request still takes its response.
#[derive(Debug)]
pub enum ClientGone<'a> {
    /// An HTTP/2 stream (its reset is seen at once).
    Stream(GoneWatch),
    /// A socket, checked by the worker's tick.
    Socket(SocketWatch<'a>),
}

impl<'a> ClientGone<'a> {
    /// The watch for a request on `stream`: an HTTP/2 stream's, or its socket's when
    /// `http.client_close_check` is on and the client did not pipeline (`pipelined`: a
    /// shutdown of its side is then no close, it waits for the answers to all it sent).
    pub fn of(w: &'a Worker, cg: &CoreGen, stream: &ClientStream, pipelined: bool) -> Option<Self> {
        if let Some(g) = stream.gone_watch() {
            return Some(ClientGone::Stream(g));
        }
        cg.gen.http.client_close_check?;
        if pipelined {
            return None;
        }
        let fd = stream.socket_fd()?;
        Some(ClientGone::socket(&w.closes, fd, w.now()))
    }

    /// A watch on a socket `fd` through `watcher`, from `now` (the worker's clock).
    pub fn socket(watcher: &'a CloseWatcher, fd: RawFd, now: Instant) -> Self {
        ClientGone::Socket(SocketWatch {
            watcher,
            fd,
            now: Cell::new(now),
            key: Cell::new(None),
        })
    }

    /// The wait for the response head begins again at `now` (the request body went up
    /// meanwhile): the close check counts from here.
    pub fn restart(&self, now: Instant) {
        if let ClientGone::Socket(s) = self {
            s.now.set(now);
            if let Some(k) = s.key.get() {
                if let Some(e) = s.watcher.entries.borrow_mut().get_mut(k) {
                    e.since = now;
                }
            }
        }
    }

    /// `Ready` once the client is gone; `Pending` (the waker kept) before.
    pub fn poll_gone(&self, cx: &mut Context<'_>) -> Poll<()> {
        match self {
            ClientGone::Stream(g) => g.poll_gone(cx),
            ClientGone::Socket(s) => s.poll_gone(cx),
        }
    }
}

/// `fut` to its end, unless the client behind `gone` goes first (`None`). Without a watch it
/// is `fut`. `fut` is pinned by the caller (a `Pin<&mut _>`): this future holds only two
/// references, which keeps the futures of every request's path small.
pub fn unless_gone<'a, F: Future + Unpin + 'a>(
    gone: Option<&'a ClientGone<'_>>,
    mut fut: F,
) -> impl Future<Output = Option<F::Output>> + 'a {
    poll_fn(move |cx| {
        if let Poll::Ready(out) = Pin::new(&mut fut).poll(cx) {
            return Poll::Ready(Some(out));
        }
        match gone {
            Some(g) => g.poll_gone(cx).map(|()| None),
            None => Poll::Pending,
        }
    })
}

/// Bytes received on socket `fd` and not yet read (0 when it cannot be told).
fn unread(fd: RawFd) -> libc::c_int {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one c_int through the pointer, which points at `n`; `fd` is a
    // socket of a waiting request (see `check`).
    let r = unsafe { libc::ioctl(fd, libc::FIONREAD, &mut n) };
    if r < 0 {
        0
    } else {
        n
    }
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // tests may block
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsRawFd;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::Wake;

    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn pair() -> (std::net::TcpStream, std::net::TcpStream) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        (c, s)
    }

    #[test]
    fn a_shutdown_with_bytes_unread_is_no_close_and_a_restart_counts_again() {
        let watcher = CloseWatcher::default();
        let every = Some(Duration::from_millis(100));
        let t0 = Instant::now();
        let (mut c, s) = pair();
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count);
        let mut cx = Context::from_waker(&waker);
        let w = ClientGone::socket(&watcher, s.as_raw_fd(), t0);
        assert!(w.poll_gone(&mut cx).is_pending());
        // The rest of an upload, then a shutdown: still unread, so not gone.
        c.write_all(&[b'u'; 4096]).unwrap();
        c.shutdown(std::net::Shutdown::Write).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        watcher.check(t0 + Duration::from_millis(150), every);
        assert!(w.poll_gone(&mut cx).is_pending(), "bytes still to read");
        // Read: now the shutdown is all there is. A wait restarted at 200 ms is not checked
        // before 300 ms (and the check at 260 ms puts the next one at 360 ms).
        let mut sink = [0u8; 4096];
        std::io::Read::read_exact(&mut &s, &mut sink).unwrap();
        w.restart(t0 + Duration::from_millis(200));
        watcher.check(t0 + Duration::from_millis(260), every);
        assert!(
            w.poll_gone(&mut cx).is_pending(),
            "restarted: not waited long enough"
        );
        watcher.check(t0 + Duration::from_millis(370), every);
        assert!(w.poll_gone(&mut cx).is_ready());
    }

    #[test]
    fn a_closed_peer_is_gone_and_pipelined_bytes_are_not() {
        let watcher = CloseWatcher::default();
        let every = Some(Duration::from_millis(100));
        let t0 = Instant::now();
        let (mut c1, s1) = pair();
        let (c2, s2) = pair();
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let mut cx = Context::from_waker(&waker);
        let w1 = ClientGone::socket(&watcher, s1.as_raw_fd(), t0);
        let w2 = ClientGone::socket(&watcher, s2.as_raw_fd(), t0);
        assert!(w1.poll_gone(&mut cx).is_pending());
        assert!(w2.poll_gone(&mut cx).is_pending());
        assert_eq!(watcher.len(), 2);

        c1.write_all(b"GET /next HTTP/1.1\r\n\r\n").unwrap();
        drop(c2);
        std::thread::sleep(Duration::from_millis(20));
        // Not yet waited long enough: nothing is checked.
        watcher.check(t0 + Duration::from_millis(50), every);
        assert_eq!(count.0.load(Ordering::SeqCst), 0);
        assert!(w2.poll_gone(&mut cx).is_pending());

        watcher.check(t0 + Duration::from_millis(150), every);
        assert_eq!(
            count.0.load(Ordering::SeqCst),
            1,
            "only the closed one is woken"
        );
        assert!(
            w1.poll_gone(&mut cx).is_pending(),
            "pipelined bytes are no close"
        );
        assert!(w2.poll_gone(&mut cx).is_ready());

        // Checking is off: a closed client is not looked for. (Its pipelined bytes are read
        // first: unread, they would keep it from counting as gone.)
        let mut pipelined = [0u8; 22];
        std::io::Read::read_exact(&mut &s1, &mut pipelined).unwrap();
        drop(c1);
        std::thread::sleep(Duration::from_millis(20));
        watcher.check(t0 + Duration::from_secs(10), None);
        assert!(w1.poll_gone(&mut cx).is_pending());
        // Within the interval of the last check, nothing is checked either.
        watcher.check(t0 + Duration::from_millis(200), every);
        assert!(w1.poll_gone(&mut cx).is_pending());
        watcher.check(t0 + Duration::from_millis(300), every);
        assert!(w1.poll_gone(&mut cx).is_ready());

        drop((w1, w2));
        assert!(watcher.is_empty(), "a dropped watch leaves the watcher");
    }
}
