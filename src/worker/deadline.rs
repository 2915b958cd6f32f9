//! Per-thread deadlines for the timeouts on the request path (every read and write of
//! `proxy::io`, the waits for upstream heads, connects, handshakes): a two-level timing wheel
//! with one driver task per runtime thread.
//!
//! Every read and write on the request path is bounded by a deadline, and on io_uring every
//! read waits at least once, so a deadline is registered two to four times per request and
//! almost always removed unfired. monoio's own timer costs each of them a 512-byte,
//! 128-byte-aligned entry built inside the waiting future (its padding is for threads monoio
//! does not have) and about 400 instructions to register and remove. Here a deadline is a
//! 48-byte slot in a per-thread slab, linked into a wheel slot in O(1); removal unlinks it. One
//! driver task per thread sleeps on a single reused monoio timer until the earliest slot that
//! holds deadlines, and fires those that are due.
//!
//! Resolution is 1 ms, and a deadline never fires early: its tick is rounded up, and the
//! driver's timer (itself rounded up to the millisecond) is set for that tick. Level 0 holds
//! the deadlines due within 1,024 ms, one slot per millisecond; level 1 holds the later ones,
//! one slot per 1,024 ms, and moves a slot's deadlines down to level 0 (or fires them) when
//! its time comes. A deadline beyond level 1's 17.5 minutes waits in level 1 and is placed
//! again each time its slot comes round. Under load the deadlines that wait are the
//! timeouts of seconds, in level 1, so the driver wakes about once a second at most.

use std::cell::RefCell;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use slab::Slab;

/// Slots per level.
const SLOTS: usize = 1024;
/// Bitmap words per level.
const WORDS: usize = SLOTS / 64;
/// End of a slot's list.
const NIL: usize = usize::MAX;

/// Where a deadline is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// Linked into `level`'s slot `slot`.
    Linked { level: u8, slot: u16 },
    /// Fired: out of every list, its waker woken.
    Fired,
}

#[derive(Debug)]
struct Entry {
    /// Due at this tick (milliseconds since the wheel's base, rounded up).
    tick: u64,
    waker: Option<Waker>,
    prev: usize,
    next: usize,
    place: Place,
}

/// The wheel, in ticks: placement, removal and firing, with no clock and no runtime (the
/// unit tests drive it tick by tick).
#[derive(Debug)]
struct Wheel {
    /// Every tick up to this one is processed.
    now: u64,
    entries: Slab<Entry>,
    heads: [[usize; SLOTS]; 2],
    occupied: [[u64; WORDS]; 2],
    /// Wakers of the deadlines fired by the last `advance`, woken by the caller once the
    /// wheel is no longer borrowed (kept: no allocation per firing).
    due: Vec<Waker>,
}

impl Wheel {
    fn new() -> Self {
        Wheel {
            now: 0,
            entries: Slab::new(),
            heads: [[NIL; SLOTS]; 2],
            occupied: [[0; WORDS]; 2],
            due: Vec::new(),
        }
    }

    /// Registers a deadline due at `tick`; `None` if that tick is already processed (due).
    fn insert(&mut self, tick: u64, waker: Waker) -> Option<usize> {
        if tick <= self.now {
            return None;
        }
        let key = self.entries.insert(Entry {
            tick,
            waker: Some(waker),
            prev: NIL,
            next: NIL,
            place: Place::Fired,
        });
        self.link(key);
        Some(key)
    }

    /// Links `key` into the slot its tick belongs to, from `self.now`.
    fn link(&mut self, key: usize) {
        let tick = self.entries[key].tick;
        let (level, slot) = if tick - self.now < SLOTS as u64 {
            (0, (tick % SLOTS as u64) as usize)
        } else {
            (1, ((tick / SLOTS as u64) % SLOTS as u64) as usize)
        };
        let head = self.heads[level][slot];
        if head != NIL {
            self.entries[head].prev = key;
        }
        let e = &mut self.entries[key];
        e.prev = NIL;
        e.next = head;
        e.place = Place::Linked {
            level: level as u8,
            slot: slot as u16,
        };
        self.heads[level][slot] = key;
        self.occupied[level][slot / 64] |= 1 << (slot % 64);
    }

    /// Takes `key` out of its slot's list (a fired one is in none).
    fn unlink(&mut self, key: usize) {
        let Place::Linked { level, slot } = self.entries[key].place else {
            return;
        };
        let (level, slot) = (level as usize, slot as usize);
        let (prev, next) = (self.entries[key].prev, self.entries[key].next);
        if prev == NIL {
            self.heads[level][slot] = next;
            if next == NIL {
                self.occupied[level][slot / 64] &= !(1 << (slot % 64));
            }
        } else {
            self.entries[prev].next = next;
        }
        if next != NIL {
            self.entries[next].prev = prev;
        }
        self.entries[key].place = Place::Fired;
    }

    /// Forgets `key`, fired or not; its waker is returned to be dropped by the caller.
    fn remove(&mut self, key: usize) -> Option<Waker> {
        self.unlink(key);
        self.entries.remove(key).waker
    }

    fn fired(&self, key: usize) -> bool {
        self.entries[key].place == Place::Fired
    }

    /// The next tick after `now` that has work: a level-0 slot with deadlines, or the start
    /// of a level-1 slot with deadlines. `None` when nothing waits.
    fn next_due(&self) -> Option<u64> {
        if self.entries.is_empty() {
            return None;
        }
        let near = next_set(&self.occupied[0], (self.now + 1) as usize % SLOTS)
            .map(|d| self.now + 1 + d as u64);
        let window = self.now / SLOTS as u64;
        let far = next_set(&self.occupied[1], (window + 1) as usize % SLOTS)
            .map(|d| (window + 1 + d as u64) * SLOTS as u64);
        match (near, far) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Processes every tick up to `target`; the wakers of the deadlines that fall due are
    /// left in `due`.
    fn advance(&mut self, target: u64) {
        while let Some(t) = self.next_due().filter(|&t| t <= target) {
            self.now = t;
            if t % SLOTS as u64 == 0 {
                self.sweep(1, ((t / SLOTS as u64) % SLOTS as u64) as usize);
            }
            self.sweep(0, (t % SLOTS as u64) as usize);
        }
        self.now = self.now.max(target);
    }

    /// Empties `level`'s `slot`: fires its deadlines that are due and places the others again
    /// from `now`. A level-0 slot holds only due ones (a level-0 deadline lies within one
    /// turn); a level-1 slot's go down to level 0, or stay in level 1 if still beyond its
    /// span.
    fn sweep(&mut self, level: usize, slot: usize) {
        let mut key = self.heads[level][slot];
        self.heads[level][slot] = NIL;
        self.occupied[level][slot / 64] &= !(1 << (slot % 64));
        while key != NIL {
            let next = self.entries[key].next;
            self.entries[key].place = Place::Fired;
            if self.entries[key].tick <= self.now {
                self.wake(key);
            } else {
                debug_assert!(level == 1, "a level-0 deadline not due at its slot");
                self.link(key);
            }
            key = next;
        }
    }

    fn wake(&mut self, key: usize) {
        if let Some(w) = self.entries[key].waker.take() {
            self.due.push(w);
        }
    }
}

/// Distance from `from` to the first set bit at or after it, going round; `None` if no bit
/// is set.
fn next_set(bits: &[u64; WORDS], from: usize) -> Option<usize> {
    let (word, bit) = (from / 64, from % 64);
    // The rest of the first word, the other words, then the start of the first word.
    let first = bits[word] & (!0u64 << bit);
    if first != 0 {
        return Some(word * 64 + first.trailing_zeros() as usize - from);
    }
    for i in 1..=WORDS {
        let w = (word + i) % WORDS;
        let b = if w == word {
            bits[w] & !(!0u64 << bit)
        } else {
            bits[w]
        };
        if b != 0 {
            let at = w * 64 + b.trailing_zeros() as usize;
            return Some((at + SLOTS - from) % SLOTS);
        }
    }
    None
}

/// A thread's wheel and its driver.
#[derive(Debug)]
struct Deadlines {
    /// Tick 0 (set at first use).
    base: Option<Instant>,
    wheel: Wheel,
    /// Whether the driver task runs on this thread's runtime.
    driving: bool,
    /// The running driver's generation: a driver of an older one ends at its next poll.
    generation: u64,
    /// The tick the driver's timer is set for (`None`: it waits for a first deadline).
    armed: Option<u64>,
    driver: Option<Waker>,
}

thread_local! {
    static DEADLINES: RefCell<Deadlines> = RefCell::new(Deadlines {
        base: None,
        wheel: Wheel::new(),
        driving: false,
        generation: 0,
        armed: None,
        driver: None,
    });
}

/// Forgets this thread's driver; called before a runtime is built on the thread (see
/// [`crate::worker::runtime::build`]). A runtime dropped with tasks still pending leaves them,
/// the driver among them, unpolled for good (monoio does not drop them), and a second runtime
/// on the same thread would otherwise count on that driver.
/// Deadlines registered with the old runtime stay in the wheel until their futures are
/// dropped, and fire (into wakers nobody polls) if they never are.
pub fn reset_thread() {
    let old = DEADLINES.with(|d| {
        let mut d = d.borrow_mut();
        d.driving = false;
        d.generation += 1;
        d.armed = None;
        d.driver.take()
    });
    // Dropped with the wheel no longer borrowed: the last reference to the old driver's
    // task frees it, and its `Driving` guard looks at the wheel.
    drop(old);
}

impl Deadlines {
    fn base(&mut self) -> Instant {
        *self.base.get_or_insert_with(Instant::now)
    }

    /// `at` as a tick, rounded up (never early).
    fn tick_of(&mut self, at: Instant) -> u64 {
        let d = at.saturating_duration_since(self.base());
        let ms = d.as_millis() as u64;
        if d.subsec_nanos() % 1_000_000 != 0 {
            ms + 1
        } else {
            ms
        }
    }

    /// The tick of now, rounded down.
    fn now_tick(&mut self) -> u64 {
        Instant::now()
            .saturating_duration_since(self.base())
            .as_millis() as u64
    }
}

/// A registered deadline; dropping it removes it.
#[derive(Debug)]
pub struct Deadline {
    key: usize,
}

impl Deadline {
    /// Registers `at`, waking `waker` when it passes; `None` if it passed already. Must be
    /// called on a monoio runtime thread (the first call there starts the driver task).
    pub fn register(at: Instant, waker: &Waker) -> Option<Deadline> {
        let (key, driver) = DEADLINES.with(|d| {
            let mut d = d.borrow_mut();
            let tick = d.tick_of(at);
            let key = d.wheel.insert(tick, waker.clone())?;
            let mut driver = None;
            if !d.driving {
                d.driving = true;
                d.generation += 1;
                drop(monoio::spawn(drive(d.generation)));
            } else if d.armed.is_none_or(|a| tick < a) {
                // The driver sleeps past this deadline, or waits for a first one.
                driver = d.driver.take();
            }
            Some((key, driver))
        })?;
        if let Some(w) = driver {
            w.wake();
        }
        Some(Deadline { key })
    }

    /// Whether the deadline passed; if not, `cx`'s waker is the one woken when it does.
    pub fn poll_passed(&self, cx: &Context<'_>) -> bool {
        let (passed, _old) = DEADLINES.with(|d| {
            let mut d = d.borrow_mut();
            if d.wheel.fired(self.key) {
                return (true, None);
            }
            let e = &mut d.wheel.entries[self.key];
            if e.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                return (false, None);
            }
            (false, e.waker.replace(cx.waker().clone()))
        });
        // (A waker is dropped, and a task woken, only once the wheel is no longer borrowed.)
        passed
    }
}

impl Drop for Deadline {
    fn drop(&mut self) {
        // (`try_with`: a future dropped while its thread's locals are torn down.)
        let _waker = DEADLINES.try_with(|d| d.borrow_mut().wheel.remove(self.key));
    }
}

/// `fut` bounded by `deadline` (`None` once it passed; no clock read: the wheel takes the
/// instant as is). The deadline is registered only once `fut` has to wait: many operations
/// are done at their first poll (data already there on the epoll driver, a write into an
/// HTTP/2 stream's pipe with room).
///
/// A plain function returning the poll loop, not an `async fn` around it: the `async fn`'s
/// own state would be one more layer in every timed read and write, whose first poll copies
/// the arguments into it (with many requests in flight, a cache miss per line written).
pub fn within<'a, F: Future>(
    deadline: Instant,
    mut fut: Pin<&'a mut F>,
) -> impl Future<Output = Option<F::Output>> + 'a {
    let mut timer = None::<Deadline>;
    poll_fn(move |cx| {
        if let Poll::Ready(out) = fut.as_mut().poll(cx) {
            return Poll::Ready(Some(out));
        }
        let passed = match &timer {
            Some(t) => t.poll_passed(cx),
            None => match Deadline::register(deadline, cx.waker()) {
                Some(t) => {
                    timer = Some(t);
                    false
                }
                None => true,
            },
        };
        if passed {
            Poll::Ready(None)
        } else {
            Poll::Pending
        }
    })
}

/// The deadline of [`timeout_at`] passed first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Elapsed;

/// `fut` bounded by `deadline`, as `monoio::time::timeout_at` but on this wheel.
pub async fn timeout_at<F: Future>(deadline: Instant, fut: F) -> Result<F::Output, Elapsed> {
    let fut = std::pin::pin!(fut);
    within(deadline, fut).await.ok_or(Elapsed)
}

/// `fut` bounded by `d` from now, as `monoio::time::timeout` but on this wheel.
pub async fn timeout<F: Future>(d: Duration, fut: F) -> Result<F::Output, Elapsed> {
    timeout_at(after(d), fut).await
}

/// Waits until `at`.
pub async fn sleep_until(at: Instant) {
    let _ = within(at, std::pin::pin!(std::future::pending::<()>())).await;
}

/// Waits for `d`.
pub async fn sleep(d: Duration) {
    sleep_until(after(d)).await;
}

/// `d` from now (a duration beyond what an `Instant` can hold is a very long wait).
fn after(d: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(d)
        .or_else(|| now.checked_add(Duration::from_secs(u64::from(u32::MAX))))
        .unwrap_or(now)
}

/// Marks the driver gone when its task ends or is dropped, so the next registration on this
/// thread starts another (unless a newer driver took over meanwhile).
struct Driving(u64);

impl Drop for Driving {
    fn drop(&mut self) {
        let _ = DEADLINES.try_with(|d| {
            let mut d = d.borrow_mut();
            if d.generation == self.0 {
                d.driving = false;
                d.armed = None;
                d.driver = None;
            }
        });
    }
}

/// The driver: sleeps until the next tick with work, processes the ticks up to now, again.
async fn drive(generation: u64) {
    let _driving = Driving(generation);
    let mut timer = std::pin::pin!(monoio::time::sleep_until(monoio::time::Instant::now()));
    let mut fired = Vec::new();
    poll_fn(|cx| loop {
        let due = DEADLINES.with(|d| {
            let mut d = d.borrow_mut();
            if d.generation != generation {
                return Err(());
            }
            let now = d.now_tick();
            d.wheel.advance(now);
            std::mem::swap(&mut fired, &mut d.wheel.due);
            let next = d.wheel.next_due();
            d.armed = next;
            // Woken by a registration due before `armed` (or by the first one).
            d.driver = Some(cx.waker().clone());
            Ok(next.map(|t| d.base() + Duration::from_millis(t)))
        });
        let Ok(due) = due else {
            return Poll::Ready(());
        };
        for w in fired.drain(..) {
            w.wake();
        }
        let Some(at) = due else {
            return Poll::Pending;
        };
        timer.as_mut().reset(monoio::time::Instant::from_std(at));
        if timer.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::testing::WakeCount;

    fn waker() -> (Arc<WakeCount>, Waker) {
        WakeCount::waker()
    }

    fn advance(w: &mut Wheel, target: u64) {
        w.advance(target);
        for wk in w.due.drain(..) {
            wk.wake();
        }
    }

    #[test]
    fn next_set_goes_round() {
        let mut bits = [0u64; WORDS];
        assert_eq!(next_set(&bits, 5), None);
        bits[0] |= 1 << 3;
        assert_eq!(next_set(&bits, 3), Some(0));
        assert_eq!(next_set(&bits, 4), Some(SLOTS - 1));
        assert_eq!(next_set(&bits, 0), Some(3));
        bits[WORDS - 1] |= 1 << 63;
        assert_eq!(next_set(&bits, 4), Some(SLOTS - 1 - 4));
        assert_eq!(next_set(&bits, SLOTS - 1), Some(0));
        bits[7] |= 1 << 10;
        assert_eq!(
            next_set(&bits, 7 * 64 + 11),
            Some(SLOTS - 1 - (7 * 64 + 11))
        );
    }

    /// Deadlines fire exactly at their tick (never before), at every distance: within level 0,
    /// in level 1, and beyond level 1's span; removed ones never fire.
    #[test]
    fn fires_each_deadline_at_its_tick_and_never_a_removed_one() {
        let mut w = Wheel::new();
        advance(&mut w, 5);
        let ticks = [
            6,
            7,
            500,
            1023,
            1024,
            1029,
            1030,
            2047,
            2048,
            5000,
            70_000,
            SLOTS as u64 * SLOTS as u64 + 17,
            3 * SLOTS as u64 * SLOTS as u64 + 1,
        ];
        let mut live = Vec::new();
        for (i, &t) in ticks.iter().enumerate() {
            let (c, wk) = waker();
            let key = w.insert(t, wk).unwrap();
            live.push((key, t, c, i % 4 == 3));
        }
        for (key, _, _, removed) in &live {
            if *removed {
                w.remove(*key);
            }
        }
        // Step by step over the near ticks, then in jumps (as the driver does after a sleep).
        let mut targets: Vec<u64> = (6..3000).collect();
        targets.extend([4999, 5000, 69_999, 70_000, 80_000]);
        targets.extend([
            SLOTS as u64 * SLOTS as u64 + 16,
            SLOTS as u64 * SLOTS as u64 + 17,
        ]);
        targets.extend([
            3 * SLOTS as u64 * SLOTS as u64,
            3 * SLOTS as u64 * SLOTS as u64 + 1,
        ]);
        for at in targets {
            advance(&mut w, at);
            for (key, t, c, removed) in &live {
                let woken = c.get();
                if *removed {
                    assert_eq!(woken, 0, "removed deadline {t} fired");
                } else {
                    assert_eq!(woken, usize::from(*t <= at), "deadline {t} at tick {at}");
                    assert_eq!(w.fired(*key), *t <= at);
                }
            }
        }
        assert_eq!(w.next_due(), None);
    }

    /// A deadline at or before the processed tick is due at once.
    #[test]
    fn a_passed_deadline_is_not_registered() {
        let mut w = Wheel::new();
        advance(&mut w, 100);
        let (_, wk) = waker();
        let key = w.insert(101, wk).unwrap();
        let (_, wk) = waker();
        assert_eq!(w.insert(100, wk), None);
        w.remove(key);
        assert_eq!(w.next_due(), None);
    }

    /// Random deadlines and removals against a plain list: the same ones fire, at the same
    /// targets, and the slots end empty.
    #[test]
    fn matches_a_plain_list_under_random_use() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut rand = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let mut w = Wheel::new();
        let mut live: Vec<(usize, u64, Arc<WakeCount>)> = Vec::new();
        for _ in 0..20_000 {
            match rand(4) {
                0 | 1 => {
                    let span = [3, 900, 5_000, 2_000_000][rand(4) as usize];
                    let t = w.now + 1 + rand(span);
                    let (c, wk) = waker();
                    let key = w.insert(t, wk).unwrap();
                    live.push((key, t, c));
                }
                2 if !live.is_empty() => {
                    let (key, _, _) = live.swap_remove(rand(live.len() as u64) as usize);
                    w.remove(key);
                }
                _ => {
                    let target = w.now + rand(3_000);
                    advance(&mut w, target);
                    live.retain(|(key, t, c)| {
                        let fired = c.get() == 1;
                        assert_eq!(fired, *t <= target, "deadline {t} at {target}");
                        assert_eq!(w.fired(*key), fired);
                        if fired {
                            w.remove(*key);
                        }
                        !fired
                    });
                }
            }
        }
        for (key, _, _) in live.drain(..) {
            w.remove(key);
        }
        assert!(w.entries.is_empty());
        assert!(w.heads.iter().flatten().all(|&h| h == NIL));
        assert!(w.occupied.iter().flatten().all(|&b| b == 0));
    }

    /// A runtime dropped with a deadline still pending leaves its driver unpolled for good;
    /// the next runtime built on the thread starts its own.
    #[test]
    fn a_second_runtime_on_the_thread_gets_a_driver_of_its_own() {
        for _ in 0..2 {
            let mut rt = crate::worker::runtime::build(crate::shared::DriverKind::Epoll).unwrap();
            rt.block_on(async {
                let at = Instant::now() + Duration::from_millis(10);
                let never = std::pin::pin!(std::future::pending::<()>());
                // Bounded by monoio's own timer: a dead driver would never end `within`.
                let bounded = monoio::time::timeout(Duration::from_secs(5), within(at, never));
                assert_eq!(bounded.await, Ok(None), "the deadline fired");
                assert!(Instant::now() >= at);
                drop(monoio::spawn(async {
                    let never = std::pin::pin!(std::future::pending::<()>());
                    within(Instant::now() + Duration::from_secs(60), never).await;
                }));
                monoio::time::sleep(Duration::from_millis(2)).await;
            });
        }
    }

    #[test]
    fn deadlines_fire_on_a_runtime() {
        reset_thread();
        let mut rt = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
            .enable_timer()
            .build()
            .unwrap();
        rt.block_on(async {
            for ms in [0u64, 3, 30, 1_100] {
                let start = Instant::now();
                let at = start + std::time::Duration::from_millis(ms);
                let mut d = None;
                poll_fn(|cx| match &d {
                    None => match Deadline::register(at, cx.waker()) {
                        None => Poll::Ready(()),
                        Some(r) => {
                            d = Some(r);
                            Poll::Pending
                        }
                    },
                    Some(r) if r.poll_passed(cx) => Poll::Ready(()),
                    Some(_) => Poll::Pending,
                })
                .await;
                let took = start.elapsed();
                assert!(
                    took >= std::time::Duration::from_millis(ms),
                    "{ms} ms: {took:?}"
                );
                assert!(
                    took < std::time::Duration::from_millis(ms + 200),
                    "{ms} ms: {took:?}"
                );
            }
        });
    }
}
