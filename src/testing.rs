//! Helpers for the unit tests.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Wake, Waker};

/// A waker that counts how often it was woken.
#[derive(Debug, Default)]
pub(crate) struct WakeCount(AtomicUsize);

impl WakeCount {
    /// A fresh count and a waker that adds to it.
    pub(crate) fn waker() -> (Arc<WakeCount>, Waker) {
        let count = Arc::new(WakeCount::default());
        (count.clone(), Waker::from(count))
    }

    /// Wakes so far.
    pub(crate) fn get(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

impl Wake for WakeCount {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}
