//! The raw syscalls ringway makes itself, each behind a safe function.

use std::os::fd::{BorrowedFd, RawFd};

use socket2::SockRef;

/// `fd`, borrowed for one socket option (socket2's `SockRef` on it does not close it).
fn borrow<'a>(fd: RawFd) -> BorrowedFd<'a> {
    // SAFETY: every caller passes a socket it owns and keeps open for the call, and the
    // borrow does not outlive the call (it is dropped at the end of the caller's statement).
    unsafe { BorrowedFd::borrow_raw(fd) }
}

/// Whether an idle connection still looks usable: no EOF, no error and no unsolicited bytes
/// waiting. One non-blocking `recv(MSG_PEEK)`; used before sending a request that could not be
/// replayed on a pooled connection (RFC 9112 §9.3.1: the server may close an idle connection
/// at any time).
pub fn idle_socket_usable(fd: RawFd) -> bool {
    let mut byte = 0u8;
    // SAFETY: `byte` is a valid, writable 1-byte buffer for the duration of the call; `fd` is
    // owned by the caller and open; MSG_DONTWAIT makes the call non-blocking.
    let n = unsafe {
        libc::recv(
            fd,
            (&mut byte as *mut u8).cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    if n < 0 {
        let err = std::io::Error::last_os_error();
        return err.kind() == std::io::ErrorKind::WouldBlock;
    }
    // 0: the peer closed; > 0: bytes nobody asked for (a stray response).
    false
}

/// Makes the next close of `fd` send a reset (SO_LINGER with a zero timeout): how a proxy tells
/// a client that a response it already started was cut short, which a close-delimited or
/// dechunked body could not otherwise show.
pub fn reset_on_close(fd: RawFd) {
    let _ = SockRef::from(&borrow(fd)).set_linger(Some(std::time::Duration::ZERO));
}

/// The largest TCP payload `fd` currently puts in one segment (`TCP_MAXSEG`: the path's MSS
/// less the options each segment carries); `None` when the call fails or reads below TCP's
/// minimum of 536 bytes (then nothing is worth aligning to it).
pub fn segment_size(fd: RawFd) -> Option<usize> {
    let mss = SockRef::from(&borrow(fd)).mss().ok()?;
    (mss >= 536).then_some(mss as usize)
}

/// Acknowledges at once what `fd` received, and what it receives next until ringway writes on
/// it again (`TCP_QUICKACK`), for a reader about to wait for the rest of a message.
///
/// A sender with Nagle's algorithm on (many backends and clients leave it on) holds a small
/// segment back while its previous one is unacknowledged; and once a connection has carried
/// a request and its answer, Linux delays its ACKs (by up to 40 ms), hoping to send them with
/// data. A head and a body written apart then arrive 40 ms apart. One `setsockopt`; errors
/// are ignored (the socket is closed, or not TCP: nothing to hurry).
pub fn quickack(fd: RawFd) {
    let _ = SockRef::from(&borrow(fd)).set_quickack(true);
}

/// [`quickack`] at most once per message: a reader waiting for the rest of a message calls
/// [`QuickAck::before_wait`] before each wait; only the first one acknowledges.
#[derive(Debug, Default)]
pub struct QuickAck {
    done: bool,
}

impl QuickAck {
    /// Acknowledges on `fd` (`None`: no socket of its own, an HTTP/2 stream) unless this
    /// message already did.
    pub fn before_wait(&mut self, fd: Option<RawFd>) {
        if !self.done {
            self.done = true;
            if let Some(fd) = fd {
                quickack(fd);
            }
        }
    }
}

/// Raises the soft open-files limit to the hard limit, as servers handling many connections
/// must; returns the new soft limit.
pub fn raise_nofile_limit() -> std::io::Result<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid rlimit struct for getrlimit to fill.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if lim.rlim_cur < lim.rlim_max {
        lim.rlim_cur = lim.rlim_max;
        // SAFETY: `lim` is a valid, initialized rlimit struct.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(lim.rlim_cur)
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // tests may block
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsRawFd;

    #[test]
    fn peek_sees_close_and_stray_bytes() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut server, _) = listener.accept().unwrap();
        assert!(idle_socket_usable(client.as_raw_fd()));
        server.write_all(b"x").unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!idle_socket_usable(client.as_raw_fd()));

        let client2 = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server2, _) = listener.accept().unwrap();
        drop(server2);
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!idle_socket_usable(client2.as_raw_fd()));
    }

    #[test]
    fn segment_size_reads_the_connected_mss() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        // Loopback's MTU is 64 KiB on Linux; any TCP path's MSS is at least 536. (Each side
        // learns the options the other uses as it goes: the two may differ by a few bytes.)
        for fd in [server.as_raw_fd(), client.as_raw_fd()] {
            let mss = segment_size(fd).unwrap();
            assert!((536..=65_535).contains(&mss), "{mss}");
        }
        // Not a TCP socket: no segment size.
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        assert_eq!(segment_size(udp.as_raw_fd()), None);
    }
}
