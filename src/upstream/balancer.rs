//! Endpoint selection, per upstream per worker: which eligible endpoint a request goes to.
//!
//! Ownership: one [`Balancer`] per upstream per worker (`Cell`s, no atomics): workers balance
//! independently, as nginx workers do. Every algorithm takes an eligibility test and every
//! one honours weights. An endpoint that is out (drained, ejected, unhealthy, at its cap)
//! leaves its share to all the others, not to its neighbour in the list: the rotations are
//! smooth weighted round robin over what is eligible, and a hash key whose endpoint is out
//! is hashed again (deterministically, so the key moves only while its endpoint is out).

use std::cell::Cell;

use crate::config::BalancerConfig;

/// Virtual nodes per unit of weight on the consistent-hash ring.
pub const RING_POINTS: u32 = 160;

/// Most points on one ring: weights are scaled down to fit (each endpoint keeps at least
/// one point). Every worker builds its own ring when the endpoints change: 16 Ki points are
/// 256 KiB and about a millisecond of work, however many endpoints and however heavy.
pub const MAX_RING_POINTS: u64 = 16 * 1024;

/// Times a hash key whose endpoint is out is hashed again before walking the list (nginx's
/// `ip_hash` tries 20 times too).
pub const HASH_TRIES: u32 = 20;

/// Peak-EWMA decay time for p2c latency estimates, in seconds.
pub const EWMA_DECAY_SECS: f64 = 10.0;

/// The latency sample a failed attempt counts as (a refused connect, a reset, a timeout, an
/// invalid response, a 5xx): failing fast must not make an endpoint look fast. Being a peak,
/// it takes over the estimate at once and decays like any sample (about 0.37 s after
/// 10 s), so the endpoint is tried again as its estimate falls, or at once when the others
/// are loaded (the cost is latency × (in-flight + 1)). An endpoint that comes back into
/// rotation (its health checks pass again, its ejection ends) starts without an estimate,
/// as a new one does, and is costed at its rival's latency until its first sample.
pub const FAILURE_PENALTY: std::time::Duration = std::time::Duration::from_secs(1);

/// What a balancer needs to know about each endpoint.
pub trait Endpoints {
    /// Number of endpoints.
    fn len(&self) -> usize;
    /// Whether there is none.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Whether endpoint `i` may take this request.
    fn eligible(&self, i: usize) -> bool;
    /// Its weight.
    fn weight(&self, i: usize) -> u32;
    /// Requests in flight on this worker.
    fn in_flight(&self, i: usize) -> u32;
    /// Peak-EWMA latency estimate in nanoseconds; 0 when there is none yet.
    fn latency_ns(&self, i: usize) -> f64;
    /// Smooth-WRR current weight, read and written by the rotating balancers.
    fn current_weight(&self, i: usize) -> &Cell<i64>;
}

/// 64-bit FNV-1a, then a finalizer so that close keys spread.
pub fn hash_key(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    mix(h)
}

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The consistent-hash ring of `keys` (endpoint key, weight): `RING_POINTS` per unit of
/// weight, halved until the ring holds at most `MAX_RING_POINTS` (each endpoint keeps at least
/// one point); sorted by point.
///
/// The step depends on the total weight only through the power of two it falls under: an
/// endpoint leaving or joining leaves every other endpoint's points as they were (unless the
/// total crosses such a boundary), so only the keys of the one that changed move. (Points in
/// proportion to the total would change every endpoint's points, and move keys between
/// endpoints that stayed.) An endpoint's points are `key#0`, `key#1`...: a halving keeps the
/// first half of them.
fn ring(keys: &[(String, u32)]) -> Vec<(u64, u32)> {
    use std::fmt::Write;
    let total: u64 = keys.iter().map(|(_, w)| u64::from((*w).max(1))).sum();
    let full = total.saturating_mul(u64::from(RING_POINTS));
    let mut shift = 0;
    while full >> shift > MAX_RING_POINTS {
        shift += 1;
    }
    let points =
        |w: u32| -> u64 { ((u64::from(w.max(1)) * u64::from(RING_POINTS)) >> shift).max(1) };
    let mut ring = Vec::with_capacity(((full >> shift) + keys.len() as u64) as usize);
    let mut name = String::new();
    for (i, (key, weight)) in keys.iter().enumerate() {
        for v in 0..points(*weight) {
            name.clear();
            let _ = write!(name, "{key}#{v}");
            ring.push((hash_key(name.as_bytes()), i as u32));
        }
    }
    ring.sort_unstable();
    ring
}

/// A worker's balancer for one upstream.
#[derive(Debug)]
pub struct Balancer {
    kind: BalancerConfig,
    /// Where this worker's rotations break ties (its id): workers do not all start on the
    /// first endpoint.
    start: usize,
    rng: Cell<u64>,
    /// Consistent-hash ring: (point, endpoint index), sorted by point.
    ring: Vec<(u64, u32)>,
    /// Running sums of the weights, when they differ (empty when all are equal): where a
    /// hash key or a random draw lands in proportion to weight.
    cumulative: Vec<u64>,
}

impl Balancer {
    /// A balancer of `kind` on worker `worker`, for endpoints identified by `keys` (their
    /// `addr` + authority, for the ring) with `weights`.
    pub fn new(kind: &BalancerConfig, worker: usize, keys: &[(String, u32)]) -> Balancer {
        let ring = match kind {
            BalancerConfig::ConsistentHash(_) => ring(keys),
            _ => Vec::new(),
        };
        let equal = keys.windows(2).all(|w| w[0].1.max(1) == w[1].1.max(1));
        let cumulative = if equal {
            Vec::new()
        } else {
            keys.iter()
                .scan(0u64, |sum, (_, w)| {
                    *sum += u64::from((*w).max(1));
                    Some(*sum)
                })
                .collect()
        };
        Balancer {
            kind: kind.clone(),
            start: worker,
            rng: Cell::new(mix(0x9e37_79b9_7f4a_7c15 ^ worker as u64) | 1),
            ring,
            cumulative,
        }
    }

    /// The endpoint `x` lands on, in proportion to weight, among `n`.
    fn place(&self, n: usize, x: u64) -> usize {
        match self.cumulative.last() {
            Some(&total) if self.cumulative.len() == n => {
                let t = x % total;
                self.cumulative.partition_point(|&c| c <= t)
            }
            _ => (x % n as u64) as usize,
        }
    }

    /// The algorithm.
    pub fn kind(&self) -> &BalancerConfig {
        &self.kind
    }

    /// Whether this balancer wants a hash key from the request.
    pub fn needs_key(&self) -> bool {
        matches!(
            self.kind,
            BalancerConfig::IpHash
                | BalancerConfig::CookieHash(_)
                | BalancerConfig::ConsistentHash(_)
        )
    }

    /// A pseudo-random number (xorshift64*, per worker).
    pub fn random(&self) -> u64 {
        // xorshift64*
        let mut x = self.rng.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng.set(x);
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// The endpoint for a request; `key` is the request's hash key for hash balancers (none:
    /// they fall back to round robin).
    pub fn pick<E: Endpoints + ?Sized>(&self, eps: &E, key: Option<u64>) -> Option<usize> {
        let n = eps.len();
        if n == 0 {
            return None;
        }
        match (&self.kind, key) {
            (BalancerConfig::ConsistentHash(_), Some(k)) => self.pick_ring(eps, k),
            (BalancerConfig::IpHash | BalancerConfig::CookieHash(_), Some(k)) => {
                self.pick_hash(eps, k)
            }
            (BalancerConfig::LeastConn, _) => self.pick_least(eps),
            (BalancerConfig::P2cEwma, _) => self.pick_p2c(eps),
            // Round robin is the weighted one (as nginx's): with equal weights it takes the
            // endpoints in turn, and one out of turn leaves its share to all the others.
            _ => self.smooth(eps, |i| eps.eligible(i)),
        }
    }

    /// The key's endpoint by weight; while that one is out, the key is hashed again (so it
    /// lands on any other endpoint, not always on the next one in the list), and after
    /// [`HASH_TRIES`] the list is walked from the last place tried.
    fn pick_hash<E: Endpoints + ?Sized>(&self, eps: &E, key: u64) -> Option<usize> {
        let n = eps.len();
        let mut k = key;
        let mut i = self.place(n, k);
        for _ in 0..HASH_TRIES {
            if eps.eligible(i) {
                return Some(i);
            }
            k = mix(k.wrapping_add(0x9e37_79b9_7f4a_7c15));
            i = self.place(n, k);
        }
        (0..n).map(|d| (i + d) % n).find(|&j| eps.eligible(j))
    }

    /// nginx's smooth weighted round robin over the endpoints `candidate` accepts: each gains
    /// its weight, the largest is picked and loses the total.
    fn smooth<E: Endpoints + ?Sized>(
        &self,
        eps: &E,
        mut candidate: impl FnMut(usize) -> bool,
    ) -> Option<usize> {
        let n = eps.len();
        let mut total = 0i64;
        let mut best: Option<usize> = None;
        for d in 0..n {
            let i = (self.start + d) % n;
            if !candidate(i) {
                continue;
            }
            let w = i64::from(eps.weight(i).max(1));
            let c = eps.current_weight(i);
            c.set(c.get() + w);
            total += w;
            if best.is_none_or(|b| c.get() > eps.current_weight(b).get()) {
                best = Some(i);
            }
        }
        if let Some(b) = best {
            let c = eps.current_weight(b);
            c.set(c.get() - total);
        }
        best
    }

    /// The fewest requests in flight per unit of weight; endpoints tied for it take turns by
    /// weight (nginx's `least_conn`), so light traffic is shared rather than sent to the first.
    fn pick_least<E: Endpoints + ?Sized>(&self, eps: &E) -> Option<usize> {
        let load = |i: usize| (u64::from(eps.in_flight(i)), u64::from(eps.weight(i).max(1)));
        let mut best: Option<(u64, u64, usize)> = None;
        for i in 0..eps.len() {
            if !eps.eligible(i) {
                continue;
            }
            let (c, w) = load(i);
            if best.is_none_or(|(bc, bw, _)| c * bw < bc * w) {
                best = Some((c, w, i));
            }
        }
        let (bc, bw, first) = best?;
        // (Eligibility reads other workers' counts: should the tied ones all drop out between
        // the two passes, the first found stands.)
        self.smooth(eps, |i| {
            eps.eligible(i) && {
                let (c, w) = load(i);
                c * bw == bc * w
            }
        })
        .or(Some(first))
    }

    /// Power of two choices: two distinct endpoints at random, the eligible one with the
    /// lower peak-EWMA latency × (in-flight + 1) / weight wins (weight counts once: as the
    /// capacity the cost is divided by); when neither is eligible, the eligible ones take
    /// turns.
    fn pick_p2c<E: Endpoints + ?Sized>(&self, eps: &E) -> Option<usize> {
        let n = eps.len();
        if n == 1 {
            return eps.eligible(0).then_some(0);
        }
        let a = (self.random() % n as u64) as usize;
        let mut b = (self.random() % (n as u64 - 1)) as usize;
        if b >= a {
            b += 1;
        }
        match (eps.eligible(a), eps.eligible(b)) {
            (true, true) => {
                let (la, lb) = (eps.latency_ns(a), eps.latency_ns(b));
                // An endpoint without an estimate (new, or back in rotation) is costed at the
                // other's latency: requests in flight decide, so it takes its share at once,
                // but not every request while its first ones are still out.
                let (la, lb) = match (la > 0.0, lb > 0.0) {
                    (false, true) => (lb, lb),
                    (true, false) => (la, la),
                    _ => (la, lb),
                };
                let cost = |latency: f64, i: usize| {
                    latency.max(1.0) * f64::from(eps.in_flight(i) + 1)
                        / f64::from(eps.weight(i).max(1))
                };
                Some(if cost(lb, b) < cost(la, a) { b } else { a })
            }
            (true, false) => Some(a),
            (false, true) => Some(b),
            (false, false) => self.smooth(eps, |i| eps.eligible(i)),
        }
    }

    fn pick_ring<E: Endpoints + ?Sized>(&self, eps: &E, key: u64) -> Option<usize> {
        if self.ring.is_empty() {
            return None;
        }
        let start = self.ring.partition_point(|&(p, _)| p < key);
        let len = self.ring.len();
        (0..len)
            .map(|d| self.ring[(start + d) % len].1 as usize)
            .find(|&i| i < eps.len() && eps.eligible(i))
    }
}

/// A peak-EWMA estimate `elapsed_secs` after its last sample, decayed toward zero: an
/// endpoint nobody picked for a while looks cheaper and gets probed again (as Finagle's
/// PeakEwma), so one slow sample cannot shut it out for good.
pub fn decayed(estimate: f64, elapsed_secs: f64) -> f64 {
    estimate * (-elapsed_secs / EWMA_DECAY_SECS).exp()
}

/// Folds a latency sample into a peak-EWMA estimate: a higher sample replaces the estimate at
/// once; a lower one pulls it down with a decay of [`EWMA_DECAY_SECS`].
pub fn peak_ewma(estimate: f64, sample_ns: f64, elapsed_secs: f64) -> f64 {
    if sample_ns > estimate {
        sample_ns
    } else {
        let w = (-elapsed_secs / EWMA_DECAY_SECS).exp();
        estimate * w + sample_ns * (1.0 - w)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::HashKey;

    struct Fake {
        eligible: Vec<bool>,
        weights: Vec<u32>,
        in_flight: Vec<u32>,
        latency: Vec<f64>,
        current: Vec<Cell<i64>>,
    }

    impl Fake {
        fn new(n: usize) -> Fake {
            Fake {
                eligible: vec![true; n],
                weights: vec![1; n],
                in_flight: vec![0; n],
                latency: vec![1000.0; n],
                current: (0..n).map(|_| Cell::new(0)).collect(),
            }
        }
    }

    impl Endpoints for Fake {
        fn len(&self) -> usize {
            self.eligible.len()
        }
        fn eligible(&self, i: usize) -> bool {
            self.eligible[i]
        }
        fn weight(&self, i: usize) -> u32 {
            self.weights[i]
        }
        fn in_flight(&self, i: usize) -> u32 {
            self.in_flight[i]
        }
        fn latency_ns(&self, i: usize) -> f64 {
            self.latency[i]
        }
        fn current_weight(&self, i: usize) -> &Cell<i64> {
            &self.current[i]
        }
    }

    fn keys(n: usize) -> Vec<(String, u32)> {
        (0..n).map(|i| (format!("10.0.0.{i}:80"), 1)).collect()
    }

    #[test]
    fn weighted_3_2_1_is_smooth_and_exact() {
        let mut f = Fake::new(3);
        f.weights = vec![3, 2, 1];
        let b = Balancer::new(&BalancerConfig::Weighted, 0, &keys(3));
        let mut counts = [0usize; 3];
        let first: Vec<usize> = (0..6).map(|_| b.pick(&f, None).unwrap()).collect();
        assert_eq!(first, vec![0, 1, 0, 2, 1, 0], "nginx's smooth order");
        for _ in 0..5994 {
            counts[b.pick(&f, None).unwrap()] += 1;
        }
        for (i, c) in first.iter().enumerate() {
            let _ = i;
            counts[*c] += 1;
        }
        assert_eq!(counts, [3000, 2000, 1000]);
        f.eligible[0] = false;
        let picks: Vec<usize> = (0..3).map(|_| b.pick(&f, None).unwrap()).collect();
        assert!(!picks.contains(&0));
    }

    fn counts(b: &Balancer, f: &Fake, picks: usize) -> Vec<usize> {
        let mut c = vec![0; f.len()];
        for _ in 0..picks {
            c[b.pick(f, None).unwrap()] += 1;
        }
        c
    }

    #[test]
    fn round_robin_and_least_conn_share_an_out_endpoints_turn_evenly() {
        let mut f = Fake::new(3);
        f.eligible[1] = false;
        let rr = Balancer::new(&BalancerConfig::RoundRobin, 0, &keys(3));
        let picks: Vec<usize> = (0..4).map(|_| rr.pick(&f, None).unwrap()).collect();
        assert_eq!(picks, vec![0, 2, 0, 2]);
        assert_eq!(counts(&rr, &f, 300), [150, 0, 150]);
        // Ties (light traffic: nothing in flight) take turns too.
        let lc = Balancer::new(&BalancerConfig::LeastConn, 0, &keys(3));
        assert_eq!(counts(&lc, &f, 300), [150, 0, 150]);
        f.eligible[1] = true;
        assert_eq!(counts(&lc, &f, 300), [100, 100, 100]);
        f.in_flight = vec![5, 0, 2];
        f.eligible[1] = false;
        assert_eq!(lc.pick(&f, None), Some(2));
        f.eligible = vec![false; 3];
        assert_eq!(lc.pick(&f, None), None);
        assert_eq!(rr.pick(&f, None), None);
    }

    #[test]
    fn every_balancer_honours_weights() {
        let mut f = Fake::new(2);
        f.weights = vec![3, 1];
        let w = vec![("a:1".to_string(), 3), ("b:1".to_string(), 1)];
        let rr = Balancer::new(&BalancerConfig::RoundRobin, 0, &w);
        assert_eq!(counts(&rr, &f, 400), [300, 100]);
        let lc = Balancer::new(&BalancerConfig::LeastConn, 0, &w);
        assert_eq!(counts(&lc, &f, 400), [300, 100]);
        // In flight per unit of weight: 3 on weight 3 ties with 1 on weight 1.
        f.in_flight = vec![3, 1];
        assert_eq!(counts(&lc, &f, 400), [300, 100]);
        f.in_flight = vec![4, 1];
        assert_eq!(lc.pick(&f, None), Some(1));
        f.in_flight = vec![0, 0];
        // p2c: weight divides the cost, so equal latencies favour the heavier endpoint.
        let p2c = Balancer::new(&BalancerConfig::P2cEwma, 0, &w);
        f.in_flight = vec![2, 0];
        assert_eq!(p2c.pick(&f, None), Some(0), "3 / 3 < 1 / 1");
        f.in_flight = vec![3, 0];
        assert_eq!(p2c.pick(&f, None), Some(1), "4 / 3 > 1 / 1");
        // Hash keys land in proportion to weight.
        let ip = Balancer::new(&BalancerConfig::IpHash, 0, &w);
        let mut c = [0usize; 2];
        for k in 0..10_000u32 {
            c[ip.pick(&f, Some(hash_key(&k.to_le_bytes()))).unwrap()] += 1;
        }
        assert!((7_200..=7_800).contains(&c[0]), "{c:?}");
    }

    #[test]
    fn rotations_start_at_the_workers_own_place_and_p2c_falls_back_to_them() {
        let mut f = Fake::new(3);
        for worker in 0..3 {
            let rr = Balancer::new(&BalancerConfig::RoundRobin, worker, &keys(3));
            let fresh = Fake::new(3);
            assert_eq!(rr.pick(&fresh, None), Some(worker), "worker {worker}");
        }
        // Neither sample eligible: the eligible ones take turns.
        let b = Balancer::new(&BalancerConfig::P2cEwma, 0, &keys(3));
        f.eligible = vec![true, false, false];
        assert_eq!(counts(&b, &f, 50), [50, 0, 0]);
    }

    #[test]
    fn a_hash_key_whose_endpoint_is_out_is_hashed_again_deterministically() {
        let mut f = Fake::new(4);
        let b = Balancer::new(&BalancerConfig::IpHash, 0, &keys(4));
        let k = hash_key(b"203.0.113.9");
        let home = b.pick(&f, Some(k)).unwrap();
        assert_eq!(b.pick(&f, Some(k)), Some(home), "sticky");
        f.eligible[home] = false;
        let next = b.pick(&f, Some(k)).unwrap();
        assert_ne!(next, home);
        assert_eq!(b.pick(&f, Some(k)), Some(next), "sticky while out");
        // The out endpoint's keys spread over all the others, not onto its neighbour.
        f.eligible = vec![true, false, true, true];
        let mut moved = [0usize; 4];
        let all = Fake::new(4);
        for key in 0..12_000u32 {
            let k = hash_key(&key.to_le_bytes());
            let before = b.pick(&all, Some(k)).unwrap();
            let after = b.pick(&f, Some(k)).unwrap();
            if before == 1 {
                moved[after] += 1;
            } else {
                assert_eq!(after, before, "only the out endpoint's keys move");
            }
        }
        for i in [0, 2, 3] {
            assert!(moved[i] > 700, "{moved:?}");
        }
        // Everything out but one: found by the walk after the rehashes.
        f.eligible = vec![false, false, false, true];
        assert_eq!(b.pick(&f, Some(k)), Some(3));
    }

    /// The share of 10,000 keys that move when endpoint `gone` of `all` leaves the ring;
    /// panics when a key moves that was not on `gone`.
    fn moved_when_one_leaves(all: &[(String, u32)], gone: usize) -> f64 {
        let hash = BalancerConfig::ConsistentHash(HashKey::ClientIp);
        let b = Balancer::new(&hash, 0, all);
        let f = Fake::new(all.len());
        let before: Vec<usize> = (0..10_000u32)
            .map(|k| b.pick(&f, Some(hash_key(&k.to_le_bytes()))).unwrap())
            .collect();
        // The ring is rebuilt without it; `map` takes the new indices back to the old ones.
        let map: Vec<usize> = (0..all.len()).filter(|&i| i != gone).collect();
        let remaining: Vec<(String, u32)> = map.iter().map(|&i| all[i].clone()).collect();
        let b2 = Balancer::new(&hash, 0, &remaining);
        let f2 = Fake::new(remaining.len());
        let mut moved = 0;
        for (k, &was) in before.iter().enumerate() {
            let now = map[b2
                .pick(&f2, Some(hash_key(&(k as u32).to_le_bytes())))
                .unwrap()];
            if now != was {
                moved += 1;
                assert_eq!(was, gone, "only keys of the endpoint that left move");
            }
        }
        moved as f64 / before.len() as f64
    }

    #[test]
    fn consistent_hash_moves_about_one_nth_when_an_endpoint_leaves() {
        let share = moved_when_one_leaves(&keys(5), 2);
        assert!(share <= 1.0 / 5.0 + 0.05 && share > 0.1, "moved {share}");
        // Rings scaled down to their cap move only the leaving endpoint's keys as well.
        let heavy = |n: usize, w: u32| -> Vec<(String, u32)> {
            (0..n).map(|i| (format!("10.0.0.{i}:80"), w)).collect()
        };
        let share = moved_when_one_leaves(&heavy(20, 50), 7);
        assert!(share <= 1.0 / 20.0 + 0.03 && share > 0.02, "moved {share}");
        let share = moved_when_one_leaves(&heavy(110, 1), 0);
        assert!(share <= 1.0 / 110.0 + 0.01, "moved {share}");
    }

    #[test]
    fn heavy_rings_are_scaled_to_the_cap_and_keep_their_weights() {
        // 200 endpoints of weight 1000 would be 32 million points unscaled.
        let heavy: Vec<(String, u32)> =
            (0..200).map(|i| (format!("10.0.0.{i}:80"), 1000)).collect();
        let r = ring(&heavy);
        assert!(r.len() as u64 <= MAX_RING_POINTS, "{}", r.len());
        assert!(r.windows(2).all(|p| p[0].0 <= p[1].0));
        // Weights 1 : 3 keep their proportion when scaled (160,000 and 480,000 points
        // halved six times).
        let two = vec![("a:1".to_string(), 1000), ("b:1".to_string(), 3000)];
        let r = ring(&two);
        let a = r.iter().filter(|p| p.1 == 0).count();
        assert_eq!((a, r.len() - a), (2500, 7500));
        // Small sets are not scaled.
        assert_eq!(ring(&keys(3)).len(), 3 * RING_POINTS as usize);
    }

    #[test]
    fn p2c_costs_an_endpoint_without_an_estimate_at_the_others_latency() {
        let mut f = Fake::new(2);
        f.latency = vec![0.0, 1_000.0];
        let b = Balancer::new(&BalancerConfig::P2cEwma, 0, &keys(2));
        // Equal in flight: a tie, which the first drawn wins; both get picked.
        let picks: Vec<usize> = (0..64).map(|_| b.pick(&f, None).unwrap()).collect();
        assert!(picks.contains(&0) && picks.contains(&1), "{picks:?}");
        // Its first requests still out: the known endpoint is cheaper, not 1,000 times dearer.
        f.in_flight = vec![3, 0];
        assert!((0..20).all(|_| b.pick(&f, None) == Some(1)));
    }

    #[test]
    fn p2c_prefers_the_cheaper_of_two() {
        let mut f = Fake::new(2);
        f.latency = vec![10_000.0, 1_000.0];
        let b = Balancer::new(&BalancerConfig::P2cEwma, 0, &keys(2));
        let picks: Vec<usize> = (0..20).map(|_| b.pick(&f, None).unwrap()).collect();
        assert!(picks.iter().all(|&p| p == 1));
        f.in_flight = vec![0, 20];
        assert_eq!(b.pick(&f, None), Some(0));
        assert_eq!(peak_ewma(100.0, 500.0, 1.0), 500.0);
        let decayed = peak_ewma(500.0, 100.0, 10.0);
        assert!(decayed < 500.0 && decayed > 100.0);
    }
}
