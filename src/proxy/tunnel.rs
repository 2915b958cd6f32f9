//! Byte tunnels after a protocol switch (101 to an `Upgrade` request: WebSocket and the like).
//!
//! ```text
//! client read ──► upstream write        (one pump per direction, in one task)
//! upstream read ──► client write
//! ```
//!
//! Each pump reads into a pooled block and writes it out before reading again, so a slow side
//! slows the other (no buffering beyond one block per direction). A direction that waits holds
//! a head block; one whose reads fill their block (a burst) moves to a 64 KiB body block until
//! a read comes up short: an idle WebSocket session keeps two head blocks, not two body
//! blocks. End of stream on one side half-closes the other side's write and the opposite
//! direction goes on (a WebSocket close handshake, a server still sending); an error, or no
//! byte either way for `tunnel_idle_timeout`, ends both (a write that moves bytes slowly is
//! not idle: it fails on its own once it moves none for as long). The HTTP timeouts do not
//! apply any more. A worker that begins to shut down closes its tunnels at once: a session
//! has no natural end the drain could wait for (its clients reconnect, to another instance).

use std::cell::Cell;
use std::io;
use std::time::{Duration, Instant};

use crate::net::client::ClientStream;
use monoio::io::{AsyncReadRent, AsyncWriteRent};

use super::io::{race, write_all_by, Either, Stall};
use crate::buf::Block;
use crate::observe::metrics::add;
use crate::upstream::{InFlight, UpConn};
use crate::worker::Worker;

/// A switched exchange waiting for its tunnel: the upstream connection and the upstream bytes
/// that came with the 101 but did not fit behind it.
#[derive(Debug)]
pub struct Tunnel {
    /// The upstream connection.
    pub upstream: UpConn,
    /// Upstream bytes still to give the client.
    pub pending: Block,
    /// The tunnel counts as in flight on its endpoint while it lasts (`least_conn` and
    /// `p2c_ewma` see WebSocket sessions).
    pub in_flight: InFlight,
}

/// Which way a pump moves bytes (for the byte counters).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Way {
    ToUpstream,
    ToClient,
}

/// What both directions of a tunnel did last, for the idle bound.
#[derive(Debug)]
struct Activity {
    /// When bytes last moved, either way.
    last: Cell<Instant>,
    /// Writes under way (at most one per direction).
    writing: Cell<u8>,
}

impl Activity {
    fn new(now: Instant) -> Self {
        Activity {
            last: Cell::new(now),
            writing: Cell::new(0),
        }
    }

    /// When the tunnel idles out unless bytes move before.
    fn deadline(&self, idle: Duration) -> Instant {
        self.last.get() + idle
    }

    /// At the deadline: whether nothing moved either way for `idle`. A write under way counts
    /// as activity (it fails by itself when it moves nothing for `idle`), and the wait starts
    /// again. (The precise clock: with the coarse one, a tick behind, the next deadline could
    /// already have passed, and the wait would spin.)
    fn idled(&self, idle: Duration) -> bool {
        let now = Instant::now();
        if self.writing.get() > 0 {
            self.last.set(now);
            return false;
        }
        now.saturating_duration_since(self.last.get()) >= idle
    }
}

/// Runs the tunnel until both directions ended, or one failed or idled out. `from_client`
/// holds client bytes already read (sent right after the upgrade request). Returns the bytes
/// written to the client.
pub async fn run(
    w: &Worker,
    client: ClientStream,
    from_client: Option<Block>,
    t: Tunnel,
    idle: Duration,
) -> u64 {
    if w.draining() {
        return 0;
    }
    let Some((mut client_read, mut client_write)) = client.into_split() else {
        return 0;
    };
    let (to_upstream, to_client) = (Cell::new(0), Cell::new(0));
    let activity = Activity::new(w.now());
    // (`in_flight` is held to the end: the tunnel counts on its endpoint while it lasts.)
    let Tunnel {
        mut upstream,
        pending,
        in_flight: _in_flight,
    } = t;
    let UpConn { read, write, .. } = &mut upstream;
    let mut up = std::pin::pin!(pump(
        w,
        &mut client_read,
        write,
        from_client,
        &activity,
        idle,
        Way::ToUpstream,
        &to_upstream
    ));
    let mut down = std::pin::pin!(pump(
        w,
        read,
        &mut client_write,
        Some(pending),
        &activity,
        idle,
        Way::ToClient,
        &to_client
    ));
    let both = async {
        match race(up.as_mut(), down.as_mut()).await {
            Either::Left(Ok(())) => down.await,
            Either::Right(Ok(())) => up.await,
            Either::Left(Err(e)) | Either::Right(Err(e)) => Err(e),
        }
    };
    let both = std::pin::pin!(both);
    let shutdown = std::pin::pin!(w.shutdown.wait());
    let ended = race(both, shutdown).await;
    match ended {
        Either::Left(Err(e)) => tracing::debug!(error = %e, "tunnel closed"),
        Either::Left(Ok(())) => {}
        Either::Right(()) => tracing::debug!("tunnel closed: shutting down"),
    }
    to_client.get()
}

/// Moves bytes from `src` to `dst` until `src` ends (then shuts `dst`'s write side down).
/// `first`: bytes to write before the first read (those from the client were counted when
/// they were read).
#[allow(clippy::too_many_arguments)]
async fn pump<R: AsyncReadRent, W: AsyncWriteRent>(
    w: &Worker,
    src: &mut R,
    dst: &mut W,
    first: Option<Block>,
    activity: &Activity,
    idle: Duration,
    way: Way,
    moved: &Cell<u64>,
) -> io::Result<()> {
    let mut buf = first.unwrap_or_else(|| w.pool.take());
    // The last read filled its block: more is likely waiting.
    let mut burst = false;
    let mut fair = crate::worker::fair::FairShare::default();
    loop {
        if fair.turn() {
            fair.look(w).await;
        }
        if !buf.is_empty() {
            let n = buf.len() as u64;
            let stall = Stall::new(w.now(), idle);
            activity.writing.set(activity.writing.get() + 1);
            let (res, b) = write_all_by(dst, buf, stall, &w.body_pool).await;
            activity.writing.set(activity.writing.get() - 1);
            buf = b;
            res?;
            moved.set(moved.get() + n);
            // Bytes that reached a (slow) reader are activity too.
            activity.last.set(w.now());
            if way == Way::ToClient {
                add(&w.metrics().bytes_out, n);
            }
        }
        if burst {
            w.body_block(&mut buf);
        } else {
            w.head_block(&mut buf);
        }
        let spare = buf.spare();
        // Idle means idle both ways: wake up at the deadline and look at the other side's
        // last activity before giving up. The read stays in flight across these looks (a
        // cancelled read could have completed already, and its bytes would be lost).
        let (res, b) = {
            let mut read = std::pin::pin!(src.read(buf));
            loop {
                let deadline = activity.deadline(idle);
                match crate::worker::deadline::timeout_at(deadline, read.as_mut()).await {
                    Ok(r) => break r,
                    Err(_) if activity.idled(idle) => {
                        return Err(io::Error::new(io::ErrorKind::TimedOut, "tunnel idle"));
                    }
                    Err(_) => {}
                }
            }
        };
        buf = b;
        match res {
            Ok(0) => {
                // Bounded: a TLS close_notify to a peer that reads nothing could wait forever.
                let _ = crate::worker::deadline::timeout(idle, dst.shutdown()).await;
                return Ok(());
            }
            Ok(n) => {
                activity.last.set(w.now());
                burst = n == spare;
                if way == Way::ToUpstream {
                    add(&w.metrics().bytes_in, n as u64);
                }
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tunnel_idles_out_only_when_nothing_moves_either_way() {
        let idle = Duration::from_millis(50);
        let a = Activity::new(Instant::now());
        assert!(!a.idled(idle), "bytes just moved");
        a.last.set(Instant::now() - 2 * idle);
        assert!(a.idled(idle), "nothing moved for twice the bound");
        // A slow write is under way: not idle, and the wait starts again.
        a.writing.set(1);
        assert!(!a.idled(idle));
        assert!(a.deadline(idle) > Instant::now(), "the next look is ahead");
        a.writing.set(0);
        assert!(!a.idled(idle), "its progress counted");
    }
}
