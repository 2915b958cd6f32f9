//! Active health checks, off the request path.
//!
//! One control-side thread (`ringway-health`) probes every endpoint of every upstream with a
//! `health_check`: `GET path` over a new connection, healthy when the status is the expected
//! one (any 2xx or 3xx by default) within the timeout. After `unhealthy_threshold` failures
//! in a row the endpoint's shared `healthy` flag goes down, after `healthy_threshold`
//! successes in a row it comes back (and any passive-health ejection is lifted: the endpoint
//! proved itself). Workers read the flag with one relaxed load when they pick.
//!
//! Probes block (std sockets with timeouts), so they run off the control loop, where they
//! would hold up reloads: each on a thread of its own, which sends its result back to the
//! health thread. At most [`PROBE_THREADS`] run at a time, those due longest first: endpoints
//! whose probes run to their timeouts slow the others' checks down, but cannot keep them
//! from being checked.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::HealthCheckConfig;
use crate::shared::Shared;
use crate::upstream::state::EndpointState;

/// How often the thread looks for probes that are due.
const ROUND: Duration = Duration::from_millis(50);

/// Most probe threads at a time (a probe due beyond them starts when one ends).
const PROBE_THREADS: usize = 64;

/// Longest status line read from a probe's response.
const MAX_STATUS_LINE: usize = 1024;

/// One endpoint's probe history.
#[derive(Debug)]
struct Track {
    state: Arc<EndpointState>,
    /// When the last probe started (the next is due an `interval` later, by the interval in
    /// force now: a reload that shortens it takes effect at once, plus `jitter` of it).
    last: Option<Instant>,
    /// The random part of the wait for the next probe: a fraction, in [0, 1), of
    /// `jitter_percent` of the interval, drawn when the probe before started.
    jitter: f64,
    /// A probe of it is under way (the next waits for its result).
    probing: bool,
    successes: u32,
    failures: u32,
}

/// A probe's outcome, sent back by its thread: (the endpoint's state, address, check,
/// upstream name, result). (The state travels with it: while a result is on its way, its
/// address cannot be taken by a new endpoint's state, whose track it would then reach.)
type Outcome = (
    Arc<EndpointState>,
    SocketAddr,
    HealthCheckConfig,
    String,
    Result<(), String>,
);

/// Runs health checks until `stop` is set.
///
/// Each probe runs on a thread of its own (at most [`PROBE_THREADS`] at a time) and sends
/// its result back; the loop applies what came in, then starts what is due, longest due
/// first. A slow endpoint (a probe that runs to its timeout) delays its own next probe, and
/// while threads are free no other endpoint's.
pub fn run(shared: Arc<Shared>, stop: Arc<AtomicBool>) {
    let mut tracks: HashMap<usize, Track> = HashMap::new();
    let (results_tx, results) = std::sync::mpsc::channel::<Outcome>();
    let mut running = 0;
    let mut draw = Draw::seeded();
    while !stop.load(Ordering::Acquire) && !shared.is_draining() {
        for (state, addr, hc, name, result) in results.try_iter() {
            running -= 1;
            if let Some(t) = tracks.get_mut(&(Arc::as_ptr(&state) as usize)) {
                t.probing = false;
                apply(t, result, &hc, &name, addr, shared.millis(Instant::now()));
            }
        }
        let published = shared.published.load_full();
        let now = Instant::now();
        // Endpoints still checked (a set: thousands of endpoints are looked up every round).
        let mut seen = std::collections::HashSet::new();
        // Probes due: (when, upstream, endpoint), started longest due first, so that probes
        // that run to their timeouts (an upstream whose endpoints hang) cannot keep taking
        // every thread from endpoints listed after them: a freed thread goes to the probe
        // that has waited longest.
        let mut due: Vec<(Option<Instant>, usize, usize)> = Vec::new();
        for (i, cfg) in published.gen.upstreams.iter().enumerate() {
            let endpoints = published.endpoints.get(i).map(Vec::as_slice).unwrap_or(&[]);
            let Some(hc) = &cfg.health_check else {
                // Checks removed by a reload: nothing vouches against these endpoints now.
                for ep in endpoints {
                    ep.state.unchecked(shared.millis(now));
                }
                continue;
            };
            for (j, ep) in endpoints.iter().enumerate() {
                let key = Arc::as_ptr(&ep.state) as usize;
                seen.insert(key);
                let t = tracks.entry(key).or_insert_with(|| Track {
                    state: ep.state.clone(),
                    last: None,
                    jitter: 0.0,
                    probing: false,
                    successes: 0,
                    failures: 0,
                });
                let since = t.last.map(|last| last + wait(hc, t.jitter));
                if !t.probing && since.is_none_or(|at| now >= at) {
                    due.push((since, i, j));
                }
            }
        }
        // (Never probed first: `None` sorts before any time; among equals, the first endpoint
        // of every upstream, then the second of each...: one upstream's long list does not
        // go before every other upstream's.)
        due.sort_unstable_by_key(|&(since, i, j)| (since, j, i));
        // (Those due beyond the free threads stay due for the next round.)
        for (_, i, j) in due.into_iter().take(PROBE_THREADS.saturating_sub(running)) {
            let (Some(cfg), Some(ep)) = (
                published.gen.upstreams.get(i),
                published.endpoints.get(i).and_then(|e| e.get(j)),
            ) else {
                continue;
            };
            let key = Arc::as_ptr(&ep.state) as usize;
            let (Some(hc), Some(t)) = (&cfg.health_check, tracks.get_mut(&key)) else {
                continue;
            };
            let (addr, authority, hc) = (ep.addr, ep.authority.clone(), hc.clone());
            let (name, tls, tx) = (cfg.name.clone(), cfg.tls.clone(), results_tx.clone());
            let state = t.state.clone();
            let spawned = std::thread::Builder::new()
                .name("ringway-probe".into())
                .spawn(move || {
                    let result = probe(addr, &authority, &hc, tls.as_deref());
                    // (The loop may be gone: a shutdown does not wait for probes.)
                    let _ = tx.send((state, addr, hc, name, result));
                });
            t.last = Some(now);
            t.jitter = draw.next();
            match spawned {
                Ok(_) => {
                    t.probing = true;
                    running += 1;
                }
                // A thread the system refuses (a pids limit) says nothing about the
                // endpoint: no result (tried again at its next interval).
                Err(e) => {
                    tracing::warn!(error = %e, "no thread for a health probe; it is tried again at its next interval");
                }
            }
        }
        // A track that goes keeps counting its probe under way until the result comes.
        tracks.retain(|k, _| seen.contains(k));
        #[allow(clippy::disallowed_methods)] // the health thread is not a worker
        std::thread::sleep(ROUND);
    }
}

/// How long after a probe starts the next one of its endpoint is due: `interval`, plus the
/// drawn fraction `jitter` of `jitter_percent` of it.
fn wait(hc: &HealthCheckConfig, jitter: f64) -> Duration {
    let spread = hc.interval.mul_f64(f64::from(hc.jitter_percent) / 100.0);
    hc.interval + spread.mul_f64(jitter)
}

/// Uniform fractions in [0, 1) for jitter (xorshift64*: spreading probes needs no more).
struct Draw(u64);

impl Draw {
    /// Seeded from the clock and the process: instances started together draw apart.
    fn seeded() -> Draw {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        Draw((t ^ u64::from(std::process::id()).rotate_left(32)) | 1)
    }

    fn next(&mut self) -> f64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        // The top 53 bits, as a fraction.
        (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Folds one probe result into the endpoint's run and flips its health at the thresholds.
fn apply(
    t: &mut Track,
    result: Result<(), String>,
    hc: &HealthCheckConfig,
    upstream: &str,
    addr: SocketAddr,
    now_ms: u64,
) {
    let healthy = t.state.healthy.load(Ordering::Relaxed);
    // The first result since the endpoint came under checks: a new endpoint starts out of
    // rotation (see `StateBook::endpoint`), and one passing check brings it in.
    let first = t.successes == 0 && t.failures == 0;
    match result {
        Ok(()) => {
            t.failures = 0;
            t.successes = t.successes.saturating_add(1);
            if !healthy && (first || t.successes >= hc.healthy_threshold) {
                t.state.readmit(now_ms);
                tracing::info!(upstream, endpoint = %addr, "endpoint healthy again");
            }
        }
        Err(why) => {
            t.successes = 0;
            t.failures = t.failures.saturating_add(1);
            if healthy && t.failures >= hc.unhealthy_threshold {
                t.state.healthy.store(false, Ordering::Relaxed);
                tracing::warn!(upstream, endpoint = %addr, reason = %why, "endpoint unhealthy");
            } else {
                tracing::debug!(upstream, endpoint = %addr, reason = %why, "health probe failed");
            }
        }
    }
}

/// One probe: `GET path` on a new connection (TLS like the upstream's own connections when
/// it has `tls`); Ok when the status is the expected one, all of it (connect, handshake,
/// request, status line) within the timeout.
fn probe(
    addr: SocketAddr,
    authority: &str,
    hc: &HealthCheckConfig,
    tls: Option<&crate::tls::client::UpstreamTls>,
) -> Result<(), String> {
    let deadline = Instant::now() + hc.timeout;
    let tcp = TcpStream::connect_timeout(&addr, hc.timeout).map_err(|e| e.to_string())?;
    let io = Bounded { tcp, deadline };
    match tls {
        None => exchange(io, authority, hc),
        Some(t) => {
            let name = t.name_for(authority)?;
            let conn =
                rustls::ClientConnection::new(t.config.clone(), name).map_err(|e| e.to_string())?;
            exchange(rustls::StreamOwned::new(conn, io), authority, hc)
        }
    }
}

/// A socket whose every read and write waits at most until `deadline`: a peer that trickles
/// bytes (a TLS handshake record a byte at a time) cannot stretch a probe past its timeout,
/// and with it the round and every other endpoint's checks.
struct Bounded {
    tcp: TcpStream,
    deadline: Instant,
}

impl Bounded {
    fn left(&self) -> std::io::Result<Duration> {
        self.deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or_else(|| std::io::ErrorKind::TimedOut.into())
    }
}

impl Read for Bounded {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.tcp.set_read_timeout(Some(self.left()?))?;
        self.tcp.read(buf)
    }
}

impl Write for Bounded {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.tcp.set_write_timeout(Some(self.left()?))?;
        self.tcp.write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.tcp.flush()
    }
}

/// The probe's request and status line over `s`.
fn exchange<S: Read + Write>(
    mut s: S,
    authority: &str,
    hc: &HealthCheckConfig,
) -> Result<(), String> {
    let req = format!(
        "GET {} HTTP/1.1\r\nHost: {authority}\r\nUser-Agent: ringway-health-check\r\nConnection: close\r\n\r\n",
        hc.path
    );
    s.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
    let mut buf = [0u8; MAX_STATUS_LINE];
    let mut len = 0;
    // (A status line may end in a bare LF: RFC 9112 §2.2 lets a recipient take it.)
    let line_end = loop {
        if let Some(i) = buf[..len].iter().position(|&b| b == b'\n') {
            break if i > 0 && buf[i - 1] == b'\r' {
                i - 1
            } else {
                i
            };
        }
        if len == buf.len() {
            return Err("status line too long".into());
        }
        match s.read(&mut buf[len..]) {
            Ok(0) => return Err("closed before a status line".into()),
            Ok(n) => len += n,
            Err(e) => return Err(e.to_string()),
        }
    };
    let status = parse_status(&buf[..line_end]).ok_or("invalid status line")?;
    // Any 2xx or 3xx by default, as HAProxy's and nginx's checks take them (a `/` that
    // redirects to a login page is up).
    let ok = if hc.expect_status == 0 {
        (200..400).contains(&status)
    } else {
        status == hc.expect_status
    };
    if ok {
        Ok(())
    } else {
        Err(format!("status {status}"))
    }
}

/// The status code of an `HTTP/1.x NNN reason` line.
fn parse_status(line: &[u8]) -> Option<u16> {
    let rest = line
        .strip_prefix(b"HTTP/1.1 ")
        .or_else(|| line.strip_prefix(b"HTTP/1.0 "))?;
    let digits = rest.get(..3)?;
    if !digits.iter().all(u8::is_ascii_digit) || rest.get(3).is_some_and(|&b| b != b' ') {
        return None;
    }
    std::str::from_utf8(digits).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A peer that answers one probe with `response` and closes.
    fn answering(response: &'static [u8]) -> SocketAddr {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            let Ok((mut s, _)) = l.accept() else { return };
            let mut req = [0u8; 1024];
            let _ = s.read(&mut req);
            let _ = s.write_all(response);
        });
        addr
    }

    #[test]
    fn any_2xx_or_3xx_passes_by_default_and_a_bare_lf_ends_the_status_line() {
        let hc = |expect_status: u16| HealthCheckConfig {
            expect_status,
            ..crate::config::compile(
                "[[listeners]]\naddress = \"127.0.0.1:0\"\n[[upstreams]]\nname = \"u\"\n\
                 endpoints = [\"127.0.0.1:1\"]\nhealth_check = {}\n",
                "t",
            )
            .unwrap()
            .upstreams[0]
                .health_check
                .clone()
                .unwrap()
        };
        for (response, expect, passes) in [
            (&b"HTTP/1.1 204 No Content\r\n\r\n"[..], 0, true),
            (b"HTTP/1.1 302 Found\r\nLocation: /login\r\n\r\n", 0, true),
            (b"HTTP/1.1 200 OK\n\n", 0, true),
            (b"HTTP/1.1 404 Not Found\r\n\r\n", 0, false),
            (b"HTTP/1.1 503 Unavailable\r\n\r\n", 0, false),
            (b"HTTP/1.1 302 Found\r\n\r\n", 200, false),
        ] {
            let addr = answering(response);
            let result = probe(addr, "x", &hc(expect), None);
            assert_eq!(
                result.is_ok(),
                passes,
                "{:?}: {result:?}",
                String::from_utf8_lossy(response)
            );
        }
    }

    #[test]
    fn the_wait_between_probes_is_the_interval_plus_its_drawn_jitter() {
        let mut hc = crate::config::compile(
            "[[listeners]]\naddress = \"127.0.0.1:0\"\n[[upstreams]]\nname = \"u\"\n\
             endpoints = [\"127.0.0.1:1\"]\nhealth_check = { interval = \"2s\" }\n",
            "t",
        )
        .unwrap()
        .upstreams[0]
            .health_check
            .clone()
            .unwrap();
        assert_eq!(hc.jitter_percent, 10, "the default");
        assert_eq!(wait(&hc, 0.0), Duration::from_secs(2));
        assert_eq!(wait(&hc, 0.5), Duration::from_millis(2100));
        hc.jitter_percent = 0;
        assert_eq!(wait(&hc, 0.9), Duration::from_secs(2));
        let mut draw = Draw::seeded();
        let xs: Vec<f64> = (0..1000).map(|_| draw.next()).collect();
        assert!(xs.iter().all(|x| (0.0..1.0).contains(x)));
        let mean = xs.iter().sum::<f64>() / 1000.0;
        assert!((0.4..0.6).contains(&mean), "{mean}");
    }

    #[test]
    fn status_lines() {
        assert_eq!(parse_status(b"HTTP/1.1 200 OK"), Some(200));
        assert_eq!(parse_status(b"HTTP/1.0 503"), Some(503));
        assert_eq!(parse_status(b"HTTP/1.1 20 OK"), None);
        assert_eq!(parse_status(b"HTTP/2 200"), None);
        assert_eq!(parse_status(b"HTTP/1.1 2000"), None);
    }

    /// A peer that accepts and then sends `first`, then one byte every 100 ms.
    fn trickling_peer(first: &'static [u8]) -> SocketAddr {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            let Ok((mut s, _)) = l.accept() else { return };
            let _ = s.write_all(first);
            for _ in 0..100 {
                #[allow(clippy::disallowed_methods)] // a test peer, not a worker
                std::thread::sleep(Duration::from_millis(100));
                if s.write_all(b"\x00").is_err() {
                    return;
                }
            }
        });
        addr
    }

    #[test]
    fn a_probe_ends_at_its_timeout_however_its_peer_trickles() {
        let hc = HealthCheckConfig {
            path: "/".into(),
            expect_status: 0,
            interval: Duration::from_secs(1),
            timeout: Duration::from_millis(500),
            healthy_threshold: 1,
            unhealthy_threshold: 1,
            jitter_percent: 0,
        };
        let spec = crate::tls::client::UpstreamTlsSpec {
            insecure_skip_verify: true,
            ..Default::default()
        };
        let tls = crate::tls::client::build(&spec, &[b"http/1.1"]).unwrap();
        // A TLS handshake record announced 16 KiB long, its bytes coming one by one; and a
        // status line that never ends.
        for (first, tls) in [
            (&b"\x16\x03\x03\x40\x00"[..], Some(&tls)),
            (&b"HTTP/1.1 200"[..], None),
        ] {
            let addr = trickling_peer(first);
            let started = Instant::now();
            let r = probe(addr, "peer.test:1", &hc, tls);
            assert!(r.is_err(), "{r:?}");
            assert!(
                started.elapsed() < Duration::from_millis(900),
                "tls {}: {:?}",
                tls.is_some(),
                started.elapsed()
            );
        }
    }

    #[test]
    fn thresholds_flip_health_and_lift_ejection() {
        let state = Arc::new(EndpointState::new(
            "127.0.0.1:1".parse().unwrap(),
            Arc::from("a:1"),
            1,
        ));
        let hc = HealthCheckConfig {
            path: "/".into(),
            expect_status: 0,
            interval: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
            healthy_threshold: 2,
            unhealthy_threshold: 3,
            jitter_percent: 0,
        };
        let mut t = Track {
            state: state.clone(),
            last: None,
            jitter: 0.0,
            probing: false,
            successes: 0,
            failures: 0,
        };
        let addr = state.addr;
        for _ in 0..2 {
            apply(&mut t, Err("x".into()), &hc, "up", addr, 7);
        }
        assert!(state.healthy.load(Ordering::Relaxed), "2 failures < 3");
        apply(&mut t, Err("x".into()), &hc, "up", addr, 7);
        assert!(!state.healthy.load(Ordering::Relaxed));
        state.ejected_until.store(u64::MAX, Ordering::Relaxed);
        apply(&mut t, Ok(()), &hc, "up", addr, 7);
        assert!(!state.healthy.load(Ordering::Relaxed), "1 success < 2");
        apply(&mut t, Ok(()), &hc, "up", addr, 7);
        assert!(state.healthy.load(Ordering::Relaxed));
        assert_eq!(state.ejected_until.load(Ordering::Relaxed), 0);
        assert_eq!(
            state.back_since(9),
            7,
            "back in rotation when the checks passed again"
        );
    }
}
