//! Endpoint selection. Round-robin for now; every balancer answers "which endpoint first", and
//! the caller walks on from there when that one fails to connect.
//!
//! Ownership: one balancer per upstream per worker (`Cell`, no atomics): workers balance
//! independently, each starting at a different offset so that N workers do not all hit
//! endpoint 0 first.

use std::cell::Cell;

/// Per-worker round-robin cursor.
#[derive(Debug)]
pub struct RoundRobin {
    next: Cell<usize>,
}

impl RoundRobin {
    /// A cursor starting at `offset` (the worker index).
    pub fn new(offset: usize) -> Self {
        RoundRobin {
            next: Cell::new(offset),
        }
    }

    /// The endpoint to try first among `n` (n > 0), advancing the cursor.
    pub fn pick(&self, n: usize) -> usize {
        let i = self.next.get();
        self.next.set(i.wrapping_add(1));
        i % n.max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cycles_evenly() {
        let rr = RoundRobin::new(1);
        let picks: Vec<usize> = (0..6).map(|_| rr.pick(3)).collect();
        assert_eq!(picks, vec![1, 2, 0, 1, 2, 0]);
    }
}
