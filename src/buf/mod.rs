//! Per-worker pool of fixed-size I/O blocks.
//!
//! Ownership: one [`BufPool`] per worker thread (`Rc`, never `Send`); no locks. A [`Block`] is
//! taken from its pool, moved into a read or write (monoio's rent-style I/O) and back, and
//! returns its memory to the pool when dropped, so steady-state proxying allocates nothing.
//!
//! A block is a window `[start, end)` over `capacity` bytes:
//! - as an [`IoBufMut`] (the target of a read) it *appends* after `end`, up to the spare space
//!   or an optional one-shot read limit;
//! - as an [`IoBuf`] (the source of a write) it offers the unconsumed window `[start, end)`;
//!   the caller then calls [`Block::consume`] with what was written.
//!
//! This is the one module with `unsafe`: the two monoio buffer trait impls.

use std::cell::{Cell, RefCell};
use std::fmt;
use std::rc::Rc;

use monoio::buf::{IoBuf, IoBufMut};

/// Idle blocks a pool keeps for reuse at the most, whatever their size allows.
pub const MAX_FREE_BLOCKS: usize = 4096;

/// How many times its budget a pool takes back for a while (see [`BufPool::trim`]).
pub const HOLD_FACTOR: usize = 4;

struct PoolShared {
    block_size: usize,
    free: RefCell<Vec<Box<[u8]>>>,
    /// Idle blocks kept for good; [`BufPool::trim`] frees those beyond that sat unused since
    /// the trim before (memory a burst took is given back rather than held for good).
    max_free: Cell<usize>,
    /// Idle blocks held at the most until a trim; a block coming back beyond is freed.
    hold_max: Cell<usize>,
    /// The fewest idle blocks since the last trim: that many were not needed all along.
    low_water: Cell<usize>,
    /// Blocks allocated and not yet freed, idle or in use.
    live: Cell<usize>,
}

/// A worker's pool of equally sized blocks.
#[derive(Clone)]
pub struct BufPool {
    shared: Rc<PoolShared>,
}

impl fmt::Debug for BufPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufPool")
            .field("block_size", &self.shared.block_size)
            .field("free", &self.shared.free.borrow().len())
            .finish()
    }
}

impl BufPool {
    /// A pool of blocks of `block_size` bytes (at least 1 KiB).
    pub fn new(block_size: usize) -> Self {
        BufPool {
            shared: Rc::new(PoolShared {
                block_size: block_size.max(1024),
                free: RefCell::new(Vec::new()),
                max_free: Cell::new(MAX_FREE_BLOCKS),
                hold_max: Cell::new(MAX_FREE_BLOCKS),
                low_water: Cell::new(0),
                live: Cell::new(0),
            }),
        }
    }

    /// Keeps `bytes` of idle blocks for good and takes back up to [`HOLD_FACTOR`] times as
    /// many until [`BufPool::trim`] (whole blocks, at most [`MAX_FREE_BLOCKS`]). A budget
    /// lower than before frees the idle blocks beyond it now.
    pub fn set_idle_bytes(&self, bytes: usize) {
        let s = &self.shared;
        let max = (bytes / s.block_size).min(MAX_FREE_BLOCKS);
        let hold = (bytes.saturating_mul(HOLD_FACTOR) / s.block_size).min(MAX_FREE_BLOCKS);
        let lowered = max < s.max_free.get();
        s.max_free.set(max);
        s.hold_max.set(hold);
        // An unchanged budget (any reload sets it) leaves a busy pool's blocks to the trim.
        if lowered {
            let mut free = s.free.borrow_mut();
            s.live.set(s.live.get() - free.len().saturating_sub(max));
            free.truncate(max);
            s.low_water.set(s.low_water.get().min(free.len()));
        }
    }

    /// Frees the idle blocks beyond the [`BufPool::set_idle_bytes`] budget that were not
    /// needed since the last trim (the worker trims once a second).
    ///
    /// Blocks beyond the budget go back to the pool (up to [`HOLD_FACTOR`] times it) and are
    /// trimmed here instead, so a load that keeps more blocks busy than the budget holds
    /// does not free blocks as they come back only to allocate them again at the next peak:
    /// at 640 HTTP/2 streams that churn cost about 3,000 instructions per request in zeroing
    /// fresh 20 KiB blocks.
    ///
    /// Returns the bytes freed.
    pub fn trim(&self) -> usize {
        let s = &self.shared;
        let mut free = s.free.borrow_mut();
        let surplus = free
            .len()
            .saturating_sub(s.max_free.get())
            .min(s.low_water.get());
        let keep = free.len() - surplus;
        free.truncate(keep);
        s.live.set(s.live.get() - surplus);
        s.low_water.set(keep);
        surplus * s.block_size
    }

    /// Size in bytes of every block of this pool.
    pub fn block_size(&self) -> usize {
        self.shared.block_size
    }

    /// Blocks currently idle in the pool.
    pub fn idle(&self) -> usize {
        self.shared.free.borrow().len()
    }

    /// Blocks of this pool that exist: idle in it, or taken and not yet dropped.
    pub fn live(&self) -> usize {
        self.shared.live.get()
    }

    /// Takes an empty block, reusing an idle one when there is one.
    pub fn take(&self) -> Block {
        let s = &self.shared;
        let (mem, left) = {
            let mut free = s.free.borrow_mut();
            (free.pop(), free.len())
        };
        if left < s.low_water.get() {
            s.low_water.set(left);
        }
        let mem = mem.unwrap_or_else(|| {
            s.live.set(s.live.get() + 1);
            vec![0u8; s.block_size].into_boxed_slice()
        });
        Block {
            mem: Some(mem),
            start: 0,
            end: 0,
            read_limit: usize::MAX,
            pool: self.shared.clone(),
        }
    }
}

/// Returned by [`Block::put`] when the bytes do not fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Full;

/// A pooled byte block with a `[start, end)` window; see the module docs.
pub struct Block {
    // invariant: `Some` until `drop`, which hands the memory back to the pool.
    mem: Option<Box<[u8]>>,
    start: usize,
    end: usize,
    read_limit: usize,
    pool: Rc<PoolShared>,
}

impl fmt::Debug for Block {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Block")
            .field("start", &self.start)
            .field("end", &self.end)
            .field("capacity", &self.capacity())
            .finish()
    }
}

impl Block {
    fn mem(&self) -> &[u8] {
        self.mem.as_deref().unwrap_or(&[])
    }

    fn mem_mut(&mut self) -> &mut [u8] {
        self.mem.as_deref_mut().unwrap_or(&mut [])
    }

    /// Total bytes the block can hold.
    pub fn capacity(&self) -> usize {
        self.mem().len()
    }

    /// The unconsumed bytes `[start, end)`.
    pub fn data(&self) -> &[u8] {
        &self.mem()[self.start..self.end]
    }

    /// The unconsumed bytes, writable (for in-place transforms such as dechunking).
    pub fn data_mut(&mut self) -> &mut [u8] {
        let (start, end) = (self.start, self.end);
        &mut self.mem_mut()[start..end]
    }

    /// Number of unconsumed bytes.
    pub fn len(&self) -> usize {
        self.end - self.start
    }

    /// Whether no unconsumed byte is left.
    pub fn is_empty(&self) -> bool {
        self.start == self.end
    }

    /// Bytes that can still be appended after `end`.
    pub fn spare(&self) -> usize {
        self.capacity() - self.end
    }

    /// Marks the first `n` unconsumed bytes as consumed. Empties the block (so the next read
    /// uses all of it) once everything is consumed.
    pub fn consume(&mut self, n: usize) {
        self.start = (self.start + n).min(self.end);
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
    }

    /// Drops every byte.
    pub fn clear(&mut self) {
        self.start = 0;
        self.end = 0;
    }

    /// Moves the unconsumed bytes to the front, so the spare space is as large as it can be.
    pub fn compact(&mut self) {
        if self.start > 0 {
            let (start, end) = (self.start, self.end);
            self.mem_mut().copy_within(start..end, 0);
            self.end -= start;
            self.start = 0;
        }
    }

    /// Limits the next read into this block to at most `n` bytes (used to never read past a
    /// Content-Length body). The limit is cleared by the read.
    pub fn limit_next_read(&mut self, n: usize) {
        self.read_limit = n;
    }

    /// Appends `bytes`, or fails without writing anything when they do not fit.
    pub fn put(&mut self, bytes: &[u8]) -> Result<(), Full> {
        let end = self.end;
        let dst = self.mem_mut().get_mut(end..end + bytes.len()).ok_or(Full)?;
        dst.copy_from_slice(bytes);
        self.end += bytes.len();
        Ok(())
    }

    /// Removes `n` unconsumed bytes starting `at` bytes into the data (fewer when the data
    /// ends first), moving the bytes after them forward.
    pub fn remove(&mut self, at: usize, n: usize) {
        let at = at.min(self.len());
        let n = n.min(self.len() - at);
        if n == 0 {
            return;
        }
        let (from, end) = (self.start + at + n, self.end);
        let to = self.start + at;
        self.mem_mut().copy_within(from..end, to);
        self.end -= n;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
    }

    /// Moves the unconsumed bytes of `other` (as many as fit) to the end of this block.
    pub fn put_from(&mut self, other: &mut Block) -> usize {
        let n = other.len().min(self.spare());
        let (end, src_start) = (self.end, other.start);
        if let (Some(dst), Some(src)) = (self.mem.as_deref_mut(), other.mem.as_deref()) {
            dst[end..end + n].copy_from_slice(&src[src_start..src_start + n]);
        }
        self.end += n;
        other.consume(n);
        n
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        if let Some(mem) = self.mem.take() {
            let mut free = self.pool.free.borrow_mut();
            if free.len() < self.pool.hold_max.get() {
                free.push(mem);
            } else {
                self.pool.live.set(self.pool.live.get() - 1);
            }
        }
    }
}

// SAFETY: `read_ptr` points into the boxed slice owned by the block, which does not move when
// the block moves, and `bytes_init` (`end - start`) bytes from it are initialized (the whole
// allocation is zero-initialized at creation).
unsafe impl IoBuf for Block {
    fn read_ptr(&self) -> *const u8 {
        self.mem()[self.start..].as_ptr()
    }

    fn bytes_init(&self) -> usize {
        self.end - self.start
    }
}

// SAFETY: `write_ptr` points at `end` inside the owned boxed slice and `bytes_total` never
// exceeds the space left after it, so the kernel writes only inside the allocation.
unsafe impl IoBufMut for Block {
    fn write_ptr(&mut self) -> *mut u8 {
        let end = self.end;
        self.mem_mut()[end..].as_mut_ptr()
    }

    fn bytes_total(&mut self) -> usize {
        (self.capacity() - self.end).min(self.read_limit)
    }

    unsafe fn set_init(&mut self, n: usize) {
        // monoio calls this with the byte count of the completed read, relative to write_ptr.
        self.end = (self.end + n).min(self.capacity());
        self.read_limit = usize::MAX;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_blocks_are_capped_in_bytes() {
        let pool = BufPool::new(64 * 1024);
        pool.set_idle_bytes(1024 * 1024);
        // A burst of 100 blocks in use at once: 64 come back (four times the budget of 16),
        // the rest are freed; the trim right after keeps them (they were in use since the
        // last one), the next one frees all but the 16 the budget holds.
        let burst: Vec<Block> = (0..100).map(|_| pool.take()).collect();
        assert_eq!(pool.live(), 100);
        drop(burst);
        assert_eq!(pool.idle(), 64);
        assert_eq!(pool.live(), 64, "the blocks beyond were freed");
        // The same budget again (every reload sets it) frees nothing.
        pool.set_idle_bytes(1024 * 1024);
        assert_eq!(pool.idle(), 64);
        assert_eq!(pool.trim(), 0);
        assert_eq!(pool.idle(), 64);
        assert_eq!(pool.trim(), 48 * 64 * 1024, "the bytes freed");
        assert_eq!(pool.idle(), 16);
        assert_eq!(pool.live(), 16);
        // Lowered live: idle blocks beyond go at once.
        pool.set_idle_bytes(128 * 1024);
        assert_eq!(pool.idle(), 2);
        assert_eq!(pool.live(), 2);
        let busy = pool.take();
        assert_eq!((pool.idle(), pool.live()), (1, 2), "a taken block is live");
        drop(busy);
        // No budget: nothing is kept, not even until a trim.
        pool.set_idle_bytes(0);
        assert_eq!(pool.idle(), 0);
        drop(pool.take());
        assert_eq!((pool.idle(), pool.live()), (0, 0));
        // At most MAX_FREE_BLOCKS come back, whatever the budget.
        let small = BufPool::new(1024);
        small.set_idle_bytes(usize::MAX);
        let burst: Vec<Block> = (0..MAX_FREE_BLOCKS + 5).map(|_| small.take()).collect();
        drop(burst);
        assert_eq!(small.idle(), MAX_FREE_BLOCKS);
    }

    #[test]
    fn a_load_above_the_budget_reuses_its_blocks() {
        let pool = BufPool::new(4096);
        pool.set_idle_bytes(2 * 4096);
        // Eight blocks busy at every peak (four times the budget), a trim between peaks: all
        // eight come back every time and serve the next peak (none is freed only to be
        // allocated again).
        let first: Vec<Block> = (0..8).map(|_| pool.take()).collect();
        let mut seen: Vec<*const u8> = first.iter().map(|b| b.mem().as_ptr()).collect();
        seen.sort();
        drop(first);
        for _ in 0..5 {
            pool.trim();
            assert_eq!(pool.idle(), 8);
            let peak: Vec<Block> = (0..8).map(|_| pool.take()).collect();
            let mut now: Vec<*const u8> = peak.iter().map(|b| b.mem().as_ptr()).collect();
            now.sort();
            assert_eq!(now, seen);
            drop(peak);
            assert_eq!(pool.idle(), 8);
        }
        // The load gone, the blocks beyond the budget go at the trims after.
        pool.trim();
        pool.trim();
        assert_eq!(pool.idle(), 2);
    }

    #[test]
    fn blocks_are_reused() {
        let pool = BufPool::new(4096);
        let b = pool.take();
        assert_eq!(b.capacity(), 4096);
        drop(b);
        assert_eq!(pool.idle(), 1);
        let _b = pool.take();
        assert_eq!(pool.idle(), 0);
    }

    #[test]
    fn window_put_consume_compact() {
        let pool = BufPool::new(1024);
        let mut b = pool.take();
        b.put(b"hello world").unwrap();
        assert_eq!(b.data(), b"hello world");
        b.consume(6);
        assert_eq!(b.data(), b"world");
        b.compact();
        assert_eq!(b.data(), b"world");
        assert_eq!(b.spare(), 1024 - 5);
        b.consume(5);
        assert!(b.is_empty());
        assert_eq!(b.spare(), 1024);
        assert_eq!(b.put(&[0u8; 1025]), Err(Full));
        assert!(b.is_empty());
    }

    #[test]
    fn remove_from_the_middle() {
        let pool = BufPool::new(64);
        let mut b = pool.take();
        b.put(b"xxHEADbodyNEXT").unwrap();
        b.consume(2);
        b.remove(4, 4);
        assert_eq!(b.data(), b"HEADNEXT");
        b.remove(4, 100);
        assert_eq!(b.data(), b"HEAD");
        b.remove(9, 1);
        assert_eq!(b.data(), b"HEAD");
        b.remove(0, 4);
        assert!(b.is_empty());
        assert_eq!(b.spare(), b.capacity());
    }

    #[test]
    fn read_limit_bounds_bytes_total_once() {
        let pool = BufPool::new(1024);
        let mut b = pool.take();
        b.limit_next_read(10);
        assert_eq!(IoBufMut::bytes_total(&mut b), 10);
        // SAFETY: test only; the block is zero-initialized.
        unsafe { b.set_init(4) };
        assert_eq!(b.len(), 4);
        assert_eq!(IoBufMut::bytes_total(&mut b), 1020);
    }

    #[test]
    fn put_from_moves_what_fits() {
        let pool = BufPool::new(1024);
        let mut a = pool.take();
        let mut b = pool.take();
        a.put(&[7u8; 1000]).unwrap();
        b.put(&[1u8; 100]).unwrap();
        assert_eq!(a.put_from(&mut b), 24);
        assert_eq!(a.len(), 1024);
        assert_eq!(b.len(), 76);
    }
}
