//! A worker-local event: tasks wait for the next `notify_all`. No atomics, no cross-thread
//! wakeups; used for shutdown (idle connections and accept loops stop waiting) and for
//! connection slots freeing up.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use slab::Slab;

/// See the module docs.
#[derive(Debug, Default)]
pub struct Event {
    epoch: Cell<u64>,
    waiters: RefCell<Slab<Waker>>,
}

impl Event {
    /// Wakes every current waiter.
    pub fn notify_all(&self) {
        self.epoch.set(self.epoch.get().wrapping_add(1));
        let wakers: Vec<Waker> = self.waiters.borrow_mut().drain().collect();
        for w in wakers {
            w.wake();
        }
    }

    /// Completes at the next `notify_all` after this call.
    pub fn wait(&self) -> Wait<'_> {
        Wait {
            event: self,
            epoch: self.epoch.get(),
            key: None,
        }
    }
}

/// Future returned by [`Event::wait`].
#[derive(Debug)]
pub struct Wait<'a> {
    event: &'a Event,
    epoch: u64,
    key: Option<usize>,
}

impl Future for Wait<'_> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.event.epoch.get() != self.epoch {
            self.key = None;
            return Poll::Ready(());
        }
        let mut waiters = self.event.waiters.borrow_mut();
        match self.key.and_then(|k| waiters.get_mut(k)) {
            Some(w) => w.clone_from(cx.waker()),
            None => {
                let k = waiters.insert(cx.waker().clone());
                drop(waiters);
                self.key = Some(k);
            }
        }
        Poll::Pending
    }
}

impl Drop for Wait<'_> {
    fn drop(&mut self) {
        if let Some(k) = self.key {
            // The slab was drained by notify_all if the epoch moved; only remove a live key.
            if self.event.epoch.get() == self.epoch {
                let mut waiters = self.event.waiters.borrow_mut();
                if waiters.contains(k) {
                    waiters.remove(k);
                }
            }
        }
    }
}

/// Polls `fut` until it completes or `event` fires; `None` if the event came first.
pub async fn or_event<F: Future>(event: &Event, fut: F) -> Option<F::Output> {
    let mut fut = std::pin::pin!(fut);
    let mut wait = std::pin::pin!(event.wait());
    std::future::poll_fn(|cx| {
        if let Poll::Ready(v) = fut.as_mut().poll(cx) {
            return Poll::Ready(Some(v));
        }
        if wait.as_mut().poll(cx).is_ready() {
            return Poll::Ready(None);
        }
        Poll::Pending
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::rc::Rc;

    #[test]
    fn wakes_waiters_and_cleans_up() {
        let mut rt = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
            .enable_timer()
            .build()
            .unwrap();
        rt.block_on(async {
            let ev = Rc::new(Event::default());
            let ev2 = ev.clone();
            let task = monoio::spawn(async move {
                ev2.wait().await;
                1
            });
            monoio::time::sleep(std::time::Duration::ZERO).await;
            assert_eq!(ev.waiters.borrow().len(), 1);
            ev.notify_all();
            assert_eq!(task.await, 1);
            // A dropped waiter leaves nothing behind.
            {
                let w = ev.wait();
                let mut w = std::pin::pin!(w);
                let waker = futures_noop_waker();
                let mut cx = Context::from_waker(&waker);
                assert!(w.as_mut().poll(&mut cx).is_pending());
                assert_eq!(ev.waiters.borrow().len(), 1);
            }
            assert_eq!(ev.waiters.borrow().len(), 0);
            assert_eq!(or_event(&ev, async { 5 }).await, Some(5));
        });
    }

    fn futures_noop_waker() -> Waker {
        Waker::noop().clone()
    }
}
