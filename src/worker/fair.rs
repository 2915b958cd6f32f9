//! Fairness between a worker's tasks where the runtime gives none (see [`FairShare`]).

use std::time::{Duration, Instant};

use super::Worker;

/// Turns (exchanges, blocks moved) of one task between two looks at whether it let the
/// worker's loop run.
const FAIR_TURNS: u32 = 64;

/// How long a task may take turns while the worker's loop gets none.
const FAIR_STREAK: Duration = Duration::from_millis(30);

/// How long such a task then pauses (the timer's resolution).
const FAIR_PAUSE: Duration = Duration::from_millis(1);

/// A task's share of its worker. On the epoll driver an operation on a ready socket
/// completes within the poll, so a client that pipelines requests without pause (and reads
/// the answers), or a tunnel whose both sides keep up, kept its task running, and every other
/// connection of the worker waiting, for as long as it went on. Every [`FAIR_TURNS`] turns
/// the task looks at the worker's tick count: unchanged for [`FAIR_STREAK`] means the loop
/// got no turn, and the task pauses on a timer for [`FAIR_PAUSE`]. (On io_uring every
/// operation waits for the ring, and the loop always gets its turn.)
#[derive(Debug, Default)]
pub struct FairShare {
    turns: u32,
    /// The tick count at the last look, and when it was first seen.
    seen: Option<(u64, Instant)>,
}

impl FairShare {
    /// One turn taken; whether it is time for [`Self::look`]. (Apart, so that the common turn
    /// makes no future.)
    #[inline]
    pub fn turn(&mut self) -> bool {
        self.turns += 1;
        self.turns >= FAIR_TURNS
    }

    /// Pauses when the worker's loop got no turn for too long.
    pub async fn look(&mut self, w: &Worker) {
        self.turns = 0;
        let (ticks, now) = (w.ticks(), Instant::now());
        match self.seen {
            Some((seen, since)) if seen == ticks => {
                if now.saturating_duration_since(since) >= FAIR_STREAK {
                    self.seen = None;
                    // Boxed: a timer is large, and rarely needed here.
                    Box::pin(super::deadline::sleep(FAIR_PAUSE)).await;
                }
            }
            _ => self.seen = Some((ticks, now)),
        }
    }
}
