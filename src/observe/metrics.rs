//! Per-worker counters and the Prometheus text rendering that sums them.
//!
//! Each counter has exactly one writer (its worker), so an increment is a relaxed load and a
//! relaxed store: no locked instruction on the request path. A scrape reads every shard with
//! relaxed loads; counters are monotonic per shard, so the sum is a valid snapshot.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_utils::CachePadded;

/// One worker's counters.
#[derive(Debug, Default)]
pub struct WorkerMetrics {
    /// Responses sent, by status class (index 0 = 1xx ... 4 = 5xx).
    pub responses: [AtomicU64; 5],
    /// Client connections accepted.
    pub connections_accepted: AtomicU64,
    /// Client connections closed.
    pub connections_closed: AtomicU64,
    /// TCP connections opened to upstreams.
    pub upstream_connects: AtomicU64,
    /// Failed attempts to connect to upstreams (refused, timed out).
    pub upstream_connect_errors: AtomicU64,
    /// Requests sent on a pooled (reused) upstream connection.
    pub pool_hits: AtomicU64,
    /// Requests that needed a new upstream connection.
    pub pool_misses: AtomicU64,
    /// Bytes read from clients.
    pub bytes_in: AtomicU64,
    /// Bytes written to clients.
    pub bytes_out: AtomicU64,
    /// Requests that finished on a generation already replaced by a reload.
    pub requests_previous_generation: AtomicU64,
    /// The config generation this worker has installed.
    pub generation: AtomicU64,
}

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
}

fn sum(shards: &[CachePadded<WorkerMetrics>], f: impl Fn(&WorkerMetrics) -> &AtomicU64) -> u64 {
    shards
        .iter()
        .map(|s| f(s).load(Ordering::Relaxed))
        .fold(0u64, u64::wrapping_add)
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
        "ringway_upstream_connects_total",
        "TCP connections opened to upstreams.",
        sum(shards, |s| &s.upstream_connects),
    );
    counter(
        out,
        "ringway_upstream_connect_errors_total",
        "Failed connection attempts to upstreams.",
        sum(shards, |s| &s.upstream_connect_errors),
    );
    counter(
        out,
        "ringway_upstream_pool_hits_total",
        "Upstream requests sent on a reused pooled connection.",
        sum(shards, |s| &s.pool_hits),
    );
    counter(
        out,
        "ringway_upstream_pool_misses_total",
        "Upstream requests that needed a new connection.",
        sum(shards, |s| &s.pool_misses),
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

fn counter(out: &mut String, name: &str, help: &str, v: u64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
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
}
