//! Per-worker counters and the Prometheus text rendering that sums them.
//!
//! Each counter has exactly one writer (its worker), so an increment is a relaxed load and a
//! relaxed store: no locked instruction on the request path. A scrape reads every shard with
//! relaxed loads; counters are monotonic per shard, so the sum is a valid snapshot.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_utils::CachePadded;

use crate::shared::Published;
use crate::upstream::state::{
    BreakerState, EndpointState, FailureClass, UpstreamState, UpstreamStats,
};

/// One worker's counters.
#[derive(Debug, Default)]
pub struct WorkerMetrics {
    /// Responses sent, by status class (index 0 = 1xx ... 4 = 5xx), counted as their head is
    /// written (so a client that read one sees it counted).
    pub responses: [AtomicU64; 5],
    /// Client connections accepted.
    pub connections_accepted: AtomicU64,
    /// Client connections closed.
    pub connections_closed: AtomicU64,
    /// Bytes read from clients.
    pub bytes_in: AtomicU64,
    /// Bytes written to clients.
    pub bytes_out: AtomicU64,
    /// Requests that finished on a generation already replaced by a reload.
    pub requests_previous_generation: AtomicU64,
    /// The config generation this worker has installed.
    pub generation: AtomicU64,
    /// Requests refused by the gateway concurrency cap, by route priority class (0 to 10).
    pub shed: [AtomicU64; 11],
    /// Exchanges switched to a tunnel (101 to an Upgrade request).
    pub tunnels_opened: AtomicU64,
    /// Proxied requests whose client went away before their response began (nginx logs
    /// these as 499): the upstream request was cancelled or never finished.
    pub client_aborts: AtomicU64,
    /// HTTP/2 connections established.
    pub h2_connections: AtomicU64,
    /// HTTP/2 streams accepted.
    pub h2_streams: AtomicU64,
    /// TLS handshakes completed.
    pub tls_handshakes: AtomicU64,
    /// TLS handshakes that failed or timed out.
    pub tls_handshake_failures: AtomicU64,
    /// Access log lines handed to the writer thread.
    pub access_log_lines: AtomicU64,
    /// Access log lines dropped because the writer thread was behind.
    pub access_log_dropped_lines: AtomicU64,
    /// Bytes of the worker's pooled I/O blocks, by [`BUFFER_SERIES`] (set once a second).
    pub buffer_bytes: [AtomicU64; 4],
}

/// The `pool` and `state` labels of [`WorkerMetrics::buffer_bytes`], in order.
pub const BUFFER_SERIES: [(&str, &str); 4] = [
    ("head", "in_use"),
    ("head", "idle"),
    ("body", "in_use"),
    ("body", "idle"),
];

/// Adds `n` to a single-writer counter.
#[inline]
pub fn add(counter: &AtomicU64, n: u64) {
    counter.store(
        counter.load(Ordering::Relaxed).wrapping_add(n),
        Ordering::Relaxed,
    );
}

impl WorkerMetrics {
    /// Counts a response with `status`.
    #[inline]
    pub fn response(&self, status: u16) {
        let class = (status / 100).clamp(1, 5) as usize - 1;
        add(&self.responses[class], 1);
    }
}

/// Process-wide facts shown in the scrape.
#[derive(Debug, Clone, Copy)]
pub struct Info<'a> {
    /// Crate version.
    pub version: &'a str,
    /// `io_uring` or `epoll`.
    pub driver: &'a str,
    /// Worker threads.
    pub workers: usize,
    /// Resolved endpoints across upstreams.
    pub endpoints: usize,
    /// Config generation in force.
    pub generation: u64,
    /// Reloads applied.
    pub reloads_ok: u64,
    /// Reloads refused (invalid config, unresolvable name, unbindable listener).
    pub reloads_failed: u64,
    /// Access log writes that failed.
    pub access_log_write_errors: u64,
}

fn sum(shards: &[CachePadded<WorkerMetrics>], f: impl Fn(&WorkerMetrics) -> &AtomicU64) -> u64 {
    shards
        .iter()
        .map(|s| f(s).load(Ordering::Relaxed))
        .fold(0u64, u64::wrapping_add)
}

/// The whole `/metrics` text (on the listeners and on the admin listener), at `now_ms` (the
/// shared clock's milliseconds).
pub fn render_all(shared: &crate::shared::Shared, now_ms: u64) -> String {
    use std::sync::atomic::Ordering;
    let mut text = String::with_capacity(4096);
    let published = shared.published.load();
    let endpoints = published.endpoints.iter().map(Vec::len).sum();
    render(
        &shared.metrics,
        Info {
            version: env!("CARGO_PKG_VERSION"),
            driver: shared.driver.name(),
            workers: shared.metrics.len(),
            endpoints,
            generation: shared.generation(),
            reloads_ok: shared.reloads_ok.load(Ordering::Relaxed),
            reloads_failed: shared.reloads_failed.load(Ordering::Relaxed),
            access_log_write_errors: shared.access_log.as_ref().map_or(0, |q| q.write_errors()),
        },
        &mut text,
    );
    render_upstreams(
        &shared.metrics,
        &published,
        shared.admission.in_flight(),
        now_ms,
        &mut text,
    );
    text
}

/// Renders every metric in the Prometheus text exposition format.
pub fn render(shards: &[CachePadded<WorkerMetrics>], info: Info<'_>, out: &mut String) {
    let _ = writeln!(out, "# HELP ringway_info Build and runtime information.");
    let _ = writeln!(out, "# TYPE ringway_info gauge");
    let _ = writeln!(
        out,
        "ringway_info{{version=\"{}\",driver=\"{}\"}} 1",
        info.version, info.driver
    );
    gauge(
        out,
        "ringway_workers",
        "Worker threads.",
        info.workers as u64,
    );
    gauge(
        out,
        "ringway_upstream_endpoints",
        "Resolved upstream endpoints.",
        info.endpoints as u64,
    );

    gauge(
        out,
        "ringway_config_generation",
        "Config generation in force (1 at start, +1 per applied reload).",
        info.generation,
    );
    let _ = writeln!(
        out,
        "# HELP ringway_worker_generation Config generation each worker serves new requests with."
    );
    let _ = writeln!(out, "# TYPE ringway_worker_generation gauge");
    for (i, s) in shards.iter().enumerate() {
        let g = s.generation.load(Ordering::Relaxed);
        let _ = writeln!(out, "ringway_worker_generation{{worker=\"{i}\"}} {g}");
    }
    help(
        out,
        "ringway_buffer_bytes",
        "gauge",
        "Bytes of pooled I/O blocks, by pool (head: heads and small bodies; body: large bodies in flight) and state (in_use: held by a connection or an operation; idle: kept for reuse), as of each worker's last second.",
    );
    for (i, (pool, state)) in BUFFER_SERIES.iter().enumerate() {
        let n = sum(shards, |s| &s.buffer_bytes[i]);
        let _ = writeln!(
            out,
            "ringway_buffer_bytes{{pool=\"{pool}\",state=\"{state}\"}} {n}"
        );
    }
    let _ = writeln!(
        out,
        "# HELP ringway_config_reloads_total Config reloads, by result."
    );
    let _ = writeln!(out, "# TYPE ringway_config_reloads_total counter");
    let _ = writeln!(
        out,
        "ringway_config_reloads_total{{result=\"success\"}} {}",
        info.reloads_ok
    );
    let _ = writeln!(
        out,
        "ringway_config_reloads_total{{result=\"failure\"}} {}",
        info.reloads_failed
    );
    counter(
        out,
        "ringway_requests_previous_generation_total",
        "Requests that finished on a config generation already replaced by a reload.",
        sum(shards, |s| &s.requests_previous_generation),
    );
    let _ = writeln!(
        out,
        "# HELP ringway_responses_total Responses sent to clients, by status class."
    );
    let _ = writeln!(out, "# TYPE ringway_responses_total counter");
    for (i, class) in ["1xx", "2xx", "3xx", "4xx", "5xx"].iter().enumerate() {
        let n = sum(shards, |s| &s.responses[i]);
        let _ = writeln!(out, "ringway_responses_total{{class=\"{class}\"}} {n}");
    }
    let accepted = sum(shards, |s| &s.connections_accepted);
    let closed = sum(shards, |s| &s.connections_closed);
    counter(
        out,
        "ringway_connections_accepted_total",
        "Client connections accepted.",
        accepted,
    );
    gauge(
        out,
        "ringway_connections_active",
        "Client connections open now.",
        accepted.saturating_sub(closed),
    );
    counter(
        out,
        "ringway_h2_connections_total",
        "HTTP/2 connections established (h2 and h2c).",
        sum(shards, |s| &s.h2_connections),
    );
    counter(
        out,
        "ringway_h2_streams_total",
        "HTTP/2 streams accepted.",
        sum(shards, |s| &s.h2_streams),
    );
    counter(
        out,
        "ringway_tls_handshakes_total",
        "TLS handshakes completed.",
        sum(shards, |s| &s.tls_handshakes),
    );
    counter(
        out,
        "ringway_tls_handshake_failures_total",
        "TLS handshakes that failed or timed out.",
        sum(shards, |s| &s.tls_handshake_failures),
    );
    counter(
        out,
        "ringway_client_aborts_total",
        "Proxied requests whose client went away before their response began.",
        sum(shards, |s| &s.client_aborts),
    );
    counter(
        out,
        "ringway_access_log_lines_total",
        "Access log lines handed to the log writer.",
        sum(shards, |s| &s.access_log_lines),
    );
    counter(
        out,
        "ringway_access_log_dropped_lines_total",
        "Access log lines dropped because the log writer was behind.",
        sum(shards, |s| &s.access_log_dropped_lines),
    );
    counter(
        out,
        "ringway_access_log_write_errors_total",
        "Access log batches whose write failed (a full disk, a closed pipe).",
        info.access_log_write_errors,
    );
    counter(
        out,
        "ringway_tunnels_opened_total",
        "Exchanges switched to a byte tunnel (101 to an Upgrade request).",
        sum(shards, |s| &s.tunnels_opened),
    );
    counter(
        out,
        "ringway_client_bytes_received_total",
        "Bytes read from clients.",
        sum(shards, |s| &s.bytes_in),
    );
    counter(
        out,
        "ringway_client_bytes_sent_total",
        "Bytes written to clients.",
        sum(shards, |s| &s.bytes_out),
    );
}

/// Renders the gateway cap and every upstream's and endpoint's series from the generation in
/// force (`published`) and the cap's counter (`admission_in_flight`).
pub fn render_upstreams(
    shards: &[CachePadded<WorkerMetrics>],
    published: &Published,
    admission_in_flight: u32,
    now_ms: u64,
    out: &mut String,
) {
    gauge(
        out,
        "ringway_gateway_requests_in_flight",
        "Proxied requests holding a slot of the gateway concurrency cap.",
        u64::from(admission_in_flight),
    );
    gauge(
        out,
        "ringway_gateway_max_concurrent_requests",
        "The gateway concurrency cap (0: none).",
        u64::from(published.gen.gateway.max_concurrent_requests),
    );
    help(
        out,
        "ringway_gateway_shed_total",
        "counter",
        "Requests refused by the gateway concurrency cap, by route priority class.",
    );
    for class in 0..11 {
        let n = sum(shards, |s| &s.shed[class]);
        let _ = writeln!(
            out,
            "ringway_gateway_shed_total{{priority_class=\"{class}\"}} {n}"
        );
    }

    type Field = fn(&UpstreamStats) -> &AtomicU64;
    let counters: [(&str, &str, Field); 8] = [
        ("ringway_upstream_requests_total", "Requests routed to the upstream, each once (retries not included); those the circuit breaker or a full queue then refused are counted here too, and in their own counters.", |s| &s.requests),
        ("ringway_upstream_retries_total", "Retries admitted (counted before their backoff, as by the retry budget).", |s| &s.retries),
        ("ringway_upstream_retry_budget_exhausted_total", "Retries refused because the retry budget was spent.", |s| &s.budget_exhausted),
        ("ringway_upstream_circuit_open_total", "Requests refused because the circuit breaker was open.", |s| &s.circuit_open),
        ("ringway_upstream_saturated_total", "Requests refused because every endpoint was at its connection limit and the queue was full or the wait ran out.", |s| &s.saturated),
        ("ringway_upstream_ejections_total", "Endpoints ejected by passive health.", |s| &s.ejections),
        ("ringway_upstream_pool_hits_total", "Attempts sent on a reused pooled connection.", |s| &s.pool_hits),
        ("ringway_upstream_pool_misses_total", "Attempts that opened a new connection.", |s| &s.pool_misses),
    ];
    let ups: Vec<(String, &UpstreamState)> = published
        .gen
        .upstreams
        .iter()
        .zip(published.upstreams.iter())
        .map(|(cfg, st)| (label(&cfg.name), &**st))
        .collect();
    let total = |st: &UpstreamState, f: Field| -> u64 {
        st.stats
            .iter()
            .map(|s| f(s).load(Ordering::Relaxed))
            .fold(0, u64::wrapping_add)
    };
    for (name, text, f) in counters {
        help(out, name, "counter", text);
        for (up, st) in &ups {
            let _ = writeln!(out, "{name}{{upstream=\"{up}\"}} {}", total(st, f));
        }
    }
    help(
        out,
        "ringway_upstream_pool_reuse_ratio",
        "gauge",
        "Share of attempts served on a pooled connection.",
    );
    for (up, st) in &ups {
        let (hits, misses) = (total(st, |s| &s.pool_hits), total(st, |s| &s.pool_misses));
        let ratio = if hits + misses == 0 {
            0.0
        } else {
            hits as f64 / (hits + misses) as f64
        };
        let _ = writeln!(
            out,
            "ringway_upstream_pool_reuse_ratio{{upstream=\"{up}\"}} {ratio:.4}"
        );
    }
    help(
        out,
        "ringway_upstream_failures_total",
        "counter",
        "Failed attempts, by class.",
    );
    for (up, st) in &ups {
        for class in FailureClass::ALL {
            let n: u64 = st
                .stats
                .iter()
                .map(|s| s.failures[class as usize].load(Ordering::Relaxed))
                .sum();
            let _ = writeln!(
                out,
                "ringway_upstream_failures_total{{upstream=\"{up}\",class=\"{}\"}} {n}",
                class.label()
            );
        }
    }
    help(
        out,
        "ringway_upstream_breaker_state",
        "gauge",
        "Circuit breaker state: 0 closed, 1 open, 2 half-open.",
    );
    for (up, st) in &ups {
        let v = match st.breaker.state().0 {
            BreakerState::Closed => 0,
            BreakerState::Open => 1,
            BreakerState::HalfOpen => 2,
        };
        let _ = writeln!(
            out,
            "ringway_upstream_breaker_state{{upstream=\"{up}\"}} {v}"
        );
    }
    let latencies: Vec<_> = ups
        .iter()
        .map(|(up, st)| (up, st.merged_latency()))
        .collect();
    help(out, "ringway_upstream_latency_microseconds", "summary", "Time from sending an attempt to its response head, merged across workers (published about once a second); quantiles over the whole uptime (for recent ones, use ringway_upstream_latency_seconds).");
    for (up, h) in &latencies {
        for q in [0.5, 0.9, 0.99, 0.999] {
            let _ = writeln!(
                out,
                "ringway_upstream_latency_microseconds{{upstream=\"{up}\",quantile=\"{q}\"}} {}",
                h.value_at_quantile(q)
            );
        }
        let _ = writeln!(
            out,
            "ringway_upstream_latency_microseconds_sum{{upstream=\"{up}\"}} {:.0}",
            h.mean() * h.len() as f64
        );
        let _ = writeln!(
            out,
            "ringway_upstream_latency_microseconds_count{{upstream=\"{up}\"}} {}",
            h.len()
        );
    }
    help(out, "ringway_upstream_latency_seconds", "histogram", "Time from sending an attempt to its response head (the summary's figures in buckets: rate() over them gives recent quantiles).");
    for (up, h) in &latencies {
        latency_buckets(out, up, h);
    }

    // Endpoints.
    let eps: Vec<(&String, String, &EndpointState)> = ups
        .iter()
        .zip(published.endpoints.iter())
        .flat_map(|((up, _), list)| {
            list.iter().map(move |e| {
                // Two names can resolve to one address: the authority tells them apart.
                let labels = format!(
                    "endpoint=\"{}\",authority=\"{}\"",
                    label(&e.addr.to_string()),
                    label(&e.authority)
                );
                (up, labels, &*e.state)
            })
        })
        .collect();
    help(
        out,
        "ringway_endpoint_requests_total",
        "counter",
        "Attempts sent to the endpoint.",
    );
    for (up, ep, st) in &eps {
        let n: u64 = st
            .stats
            .iter()
            .map(|s| s.requests.load(Ordering::Relaxed))
            .sum();
        let _ = writeln!(
            out,
            "ringway_endpoint_requests_total{{upstream=\"{up}\",{ep}}} {n}"
        );
    }
    help(
        out,
        "ringway_endpoint_failures_total",
        "counter",
        "Failed attempts on the endpoint, by class.",
    );
    for (up, ep, st) in &eps {
        for class in FailureClass::ALL {
            let n: u64 = st
                .stats
                .iter()
                .map(|s| s.failures[class as usize].load(Ordering::Relaxed))
                .sum();
            let _ = writeln!(
                out,
                "ringway_endpoint_failures_total{{upstream=\"{up}\",{ep},class=\"{}\"}} {n}",
                class.label()
            );
        }
    }
    type Gauge = fn(&EndpointState, u64) -> u64;
    let gauges: [(&str, &str, Gauge); 6] = [
        (
            "ringway_endpoint_in_flight",
            "Attempts in flight on the endpoint.",
            |st, _| st.in_flight_total(),
        ),
        (
            "ringway_endpoint_connections",
            "Open connections to the endpoint (pooled ones included).",
            |st, _| u64::from(st.connections.load(Ordering::Relaxed)),
        ),
        (
            "ringway_endpoint_healthy",
            "Active health: 1 healthy, 0 unhealthy.",
            |st, _| u64::from(st.healthy.load(Ordering::Relaxed)),
        ),
        (
            "ringway_endpoint_ejected",
            "Passive health: 1 while ejected.",
            |st, now| u64::from(st.ejected(now)),
        ),
        (
            "ringway_endpoint_ejections",
            "Times the endpoint was ejected.",
            |st, _| u64::from(st.ejections.load(Ordering::Relaxed)),
        ),
        (
            "ringway_endpoint_drained",
            "1 while drained by an operator.",
            |st, _| u64::from(st.drained.load(Ordering::Relaxed)),
        ),
    ];
    for (name, text, f) in gauges {
        help(out, name, "gauge", text);
        for (up, ep, st) in &eps {
            let _ = writeln!(out, "{name}{{upstream=\"{up}\",{ep}}} {}", f(st, now_ms));
        }
    }
}

/// A label value with `\`, `"` and newlines escaped.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn help(out: &mut String, name: &str, kind: &str, text: &str) {
    let _ = writeln!(out, "# HELP {name} {text}\n# TYPE {name} {kind}");
}

fn counter(out: &mut String, name: &str, help: &str, v: u64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
    );
}

/// Upper bounds of the latency histogram's buckets, in microseconds (1 ms to 60 s).
const LATENCY_BUCKETS_US: [u64; 15] = [
    1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000, 2_500_000,
    5_000_000, 10_000_000, 30_000_000, 60_000_000,
];

/// One upstream's `ringway_upstream_latency_seconds` series: cumulative buckets (a bucket
/// holds the samples hdrhistogram cannot tell from its bound, within 1%), `+Inf`, sum, count.
fn latency_buckets(out: &mut String, up: &str, h: &hdrhistogram::Histogram<u64>) {
    for le in LATENCY_BUCKETS_US {
        let n = h.count_between(0, le);
        let secs = le as f64 / 1e6;
        let _ = writeln!(
            out,
            "ringway_upstream_latency_seconds_bucket{{upstream=\"{up}\",le=\"{secs}\"}} {n}"
        );
    }
    let _ = writeln!(
        out,
        "ringway_upstream_latency_seconds_bucket{{upstream=\"{up}\",le=\"+Inf\"}} {}",
        h.len()
    );
    let _ = writeln!(
        out,
        "ringway_upstream_latency_seconds_sum{{upstream=\"{up}\"}} {:.6}",
        h.mean() * h.len() as f64 / 1e6
    );
    let _ = writeln!(
        out,
        "ringway_upstream_latency_seconds_count{{upstream=\"{up}\"}} {}",
        h.len()
    );
}

fn gauge(out: &mut String, name: &str, help: &str, v: u64) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_are_summed() {
        let shards: Vec<CachePadded<WorkerMetrics>> = (0..3)
            .map(|_| CachePadded::new(WorkerMetrics::default()))
            .collect();
        shards[0].response(200);
        shards[1].response(204);
        shards[2].response(502);
        add(&shards[0].connections_accepted, 3);
        add(&shards[1].connections_closed, 1);
        let mut out = String::new();
        render(
            &shards,
            Info {
                version: "0",
                driver: "io_uring",
                workers: 3,
                endpoints: 1,
                generation: 2,
                reloads_ok: 1,
                reloads_failed: 0,
                access_log_write_errors: 0,
            },
            &mut out,
        );
        assert!(
            out.contains("ringway_responses_total{class=\"2xx\"} 2\n"),
            "{out}"
        );
        assert!(out.contains("ringway_responses_total{class=\"5xx\"} 1\n"));
        assert!(out.contains("ringway_connections_active 2\n"));
        assert!(out.contains("ringway_info{version=\"0\",driver=\"io_uring\"} 1"));
        assert!(out.contains("ringway_config_generation 2\n"), "{out}");
        assert!(out.contains("ringway_config_reloads_total{result=\"success\"} 1\n"));
    }

    #[test]
    fn latency_buckets_are_cumulative_in_seconds() {
        let mut h = crate::upstream::state::new_histogram();
        for us in [800, 3_000, 3_000, 40_000, 2_000_000] {
            h.record(us).unwrap();
        }
        let mut out = String::new();
        latency_buckets(&mut out, "up", &h);
        let bucket = |le: &str| {
            let line =
                format!("ringway_upstream_latency_seconds_bucket{{upstream=\"up\",le=\"{le}\"}} ");
            out.lines()
                .find_map(|l| l.strip_prefix(line.as_str()))
                .unwrap_or_else(|| panic!("no bucket {le}: {out}"))
                .to_string()
        };
        assert_eq!(bucket("0.001"), "1");
        assert_eq!(bucket("0.0025"), "1");
        assert_eq!(bucket("0.005"), "3");
        assert_eq!(bucket("0.05"), "4");
        assert_eq!(bucket("1"), "4");
        assert_eq!(bucket("2.5"), "5");
        assert_eq!(bucket("60"), "5");
        assert_eq!(bucket("+Inf"), "5");
        assert!(out.contains("ringway_upstream_latency_seconds_count{upstream=\"up\"} 5\n"));
        let sum: f64 = out
            .lines()
            .find_map(|l| l.strip_prefix("ringway_upstream_latency_seconds_sum{upstream=\"up\"} "))
            .unwrap()
            .parse()
            .unwrap();
        assert!((sum - 2.0468).abs() < 0.03, "{sum}");
    }
}
