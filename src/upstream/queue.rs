//! A worker's line of requests waiting for a connection to one upstream, served in the order
//! they came.
//!
//! A request waits when every endpoint is at its connection limit or out of tokens. Only the
//! first in line looks for a connection; a request that comes while others wait joins the
//! end instead of taking the connection they wait for (which is what made a wait a lottery
//! before: every waiter looked again on its own timer, and a new request looked at once). The
//! first is woken when a request to the upstream ends on this worker, and looks again on its
//! own timer for what frees up on other workers; when it leaves the line, the next one looks
//! at once (more than one connection may be free).
//!
//! Ownership: one per upstream per worker and generation, in `UpstreamRt` (never `Send`).
//! Connections belong to the worker that opened them, so each worker keeps its own line:
//! across workers, lines are served side by side, as each worker's clients are. A reload
//! starts a new line: the requests of the old one pick under the old limits and endpoints,
//! and must not hold up those that may use what the reload added.
//! Invariant: tickets grow from the front of the line to its back, and the front is a waiter
//! still in line. A waiter that leaves from the middle is marked and dropped when it reaches
//! the front, or when the marked outnumber those in line (so leaving costs a binary search,
//! and the line's memory stays within twice the waiters).

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::task::{Context, Poll, Waker};

/// See the module documentation.
#[derive(Debug)]
pub struct WaitQueue {
    line: RefCell<VecDeque<Waiter>>,
    /// The ticket the next waiter at the back gets.
    back: Cell<u64>,
    /// Waiters in line (the line also holds those that left from its middle).
    waiting: Cell<usize>,
}

#[derive(Debug)]
struct Waiter {
    ticket: u64,
    state: Turn,
    waker: Option<Waker>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Turn {
    Waiting,
    /// Woken as the first in line; not yet seen by the waiter.
    Woken,
    Left,
}

/// Where the first ticket starts: room below it for waiters that go back to the front.
const FIRST_TICKET: u64 = 1 << 62;

impl Default for WaitQueue {
    fn default() -> Self {
        WaitQueue {
            line: RefCell::new(VecDeque::new()),
            back: Cell::new(FIRST_TICKET),
            waiting: Cell::new(0),
        }
    }
}

impl WaitQueue {
    /// Waiters in line.
    pub fn len(&self) -> usize {
        self.waiting.get()
    }

    /// Whether nobody waits.
    pub fn is_empty(&self) -> bool {
        self.waiting.get() == 0
    }

    /// Joins the back of the line (or its front: a waiter that left to take a connection and
    /// lost it to another worker meanwhile keeps its turn); returns the waiter's ticket.
    pub fn join(&self, front: bool) -> u64 {
        let mut line = self.line.borrow_mut();
        let ticket = match line.front() {
            Some(first) if front => first.ticket - 1,
            _ => {
                let t = self.back.get();
                self.back.set(t + 1);
                t
            }
        };
        let waiter = Waiter {
            ticket,
            state: Turn::Waiting,
            waker: None,
        };
        if front {
            line.push_front(waiter);
        } else {
            line.push_back(waiter);
        }
        self.waiting.set(self.waiting.get() + 1);
        ticket
    }

    /// Leaves the line; when `ticket` was first, the next waiter is woken.
    pub fn leave(&self, ticket: u64) {
        let waker = {
            let mut line = self.line.borrow_mut();
            let Ok(i) = line.binary_search_by_key(&ticket, |w| w.ticket) else {
                return;
            };
            if line[i].state == Turn::Left {
                return;
            }
            line[i].state = Turn::Left;
            line[i].waker = None;
            self.waiting.set(self.waiting.get() - 1);
            if i != 0 {
                if line.len() > 2 * self.waiting.get() + 16 {
                    line.retain(|w| w.state != Turn::Left);
                }
                return;
            }
            while line.front().is_some_and(|w| w.state == Turn::Left) {
                line.pop_front();
            }
            Self::wake(&mut line)
        };
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// Whether `ticket` is first in line.
    pub fn is_first(&self, ticket: u64) -> bool {
        self.line
            .borrow()
            .front()
            .is_some_and(|w| w.ticket == ticket)
    }

    /// Wakes the first in line (something it waits for may have freed up).
    pub fn wake_first(&self) {
        if self.is_empty() {
            return;
        }
        let waker = Self::wake(&mut self.line.borrow_mut());
        if let Some(w) = waker {
            w.wake();
        }
    }

    fn wake(line: &mut VecDeque<Waiter>) -> Option<Waker> {
        let first = line.front_mut()?;
        first.state = Turn::Woken;
        first.waker.take()
    }

    /// Ready once `ticket` was woken as the first in line since it last looked (or is no
    /// longer in line).
    pub fn poll_turn(&self, ticket: u64, cx: &mut Context<'_>) -> Poll<()> {
        let mut line = self.line.borrow_mut();
        let Ok(i) = line.binary_search_by_key(&ticket, |w| w.ticket) else {
            return Poll::Ready(());
        };
        let w = &mut line[i];
        match w.state {
            Turn::Left => Poll::Ready(()),
            Turn::Woken => {
                w.state = Turn::Waiting;
                Poll::Ready(())
            }
            Turn::Waiting => {
                if !w.waker.as_ref().is_some_and(|k| k.will_wake(cx.waker())) {
                    w.waker = Some(cx.waker().clone());
                }
                Poll::Pending
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::Wake;

    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn waker() -> (Arc<Count>, Waker) {
        let c = Arc::new(Count(AtomicUsize::new(0)));
        (c.clone(), Waker::from(c))
    }

    #[test]
    fn the_first_in_line_is_woken_and_the_next_takes_its_place() {
        let q = WaitQueue::default();
        let a = q.join(false);
        let b = q.join(false);
        let c = q.join(false);
        assert_eq!(q.len(), 3);
        assert!(q.is_first(a) && !q.is_first(b));
        let (ca, wa) = waker();
        let (cb, wb) = waker();
        assert!(q.poll_turn(a, &mut Context::from_waker(&wa)).is_pending());
        assert!(q.poll_turn(b, &mut Context::from_waker(&wb)).is_pending());
        q.wake_first();
        assert_eq!(ca.0.load(Ordering::SeqCst), 1);
        assert_eq!(cb.0.load(Ordering::SeqCst), 0, "only the first is woken");
        assert!(q.poll_turn(a, &mut Context::from_waker(&wa)).is_ready());
        assert!(
            q.poll_turn(a, &mut Context::from_waker(&wa)).is_pending(),
            "a wake is seen once"
        );
        q.leave(a);
        assert!(q.is_first(b));
        assert_eq!(
            cb.0.load(Ordering::SeqCst),
            1,
            "the new first looks at once"
        );
        assert!(q.poll_turn(b, &mut Context::from_waker(&wb)).is_ready());
        q.leave(b);
        assert!(q.is_first(c));
        q.leave(c);
        assert!(q.is_empty());
        assert!(q.line.borrow().is_empty());
    }

    #[test]
    fn leaving_from_the_middle_keeps_the_order_and_the_memory_bounded() {
        let q = WaitQueue::default();
        let first = q.join(false);
        for _ in 0..1000 {
            let t = q.join(false);
            q.leave(t);
        }
        let last = q.join(false);
        assert_eq!(q.len(), 2);
        assert!(q.line.borrow().len() <= 2 * 2 + 16 + 1);
        q.leave(first);
        assert!(q.is_first(last), "those that left are skipped");
        q.leave(last);
        q.leave(last);
        assert!(q.is_empty());
    }

    #[test]
    fn a_waiter_going_back_to_the_front_is_first_again() {
        let q = WaitQueue::default();
        let a = q.join(false);
        let b = q.join(false);
        q.leave(a);
        let a2 = q.join(true);
        assert!(q.is_first(a2));
        q.leave(a2);
        assert!(q.is_first(b));
        q.leave(b);
        // Into an empty line, a waiter going back is simply first.
        let c = q.join(true);
        assert!(q.is_first(c));
        let d = q.join(false);
        q.leave(c);
        assert!(q.is_first(d));
    }

    #[test]
    fn a_ticket_no_longer_in_line_is_never_pending() {
        let q = WaitQueue::default();
        let a = q.join(false);
        q.leave(a);
        let (_, w) = waker();
        assert!(q.poll_turn(a, &mut Context::from_waker(&w)).is_ready());
    }
}
