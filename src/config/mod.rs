//! Configuration: the TOML schema (`raw.rs`), validation with file:line:column errors and
//! compilation into an immutable [`Generation`] (`validate.rs`).
//!
//! Ownership: a `Generation` is built on the control thread (or the CLI), then shared read-only
//! by every worker through an `Arc`. Compiling reads the file and the `body_file`s it names,
//! nothing else: names in upstream endpoints are resolved later by `control::resolve_all`.

mod raw;
mod validate;

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ipnet::IpNet;

use crate::http1::HeadLimits;
use crate::route::RouteTable;

pub use validate::{compile, parse_duration};

/// Where the default config lives, relative to the working directory.
pub const DEFAULT_CONFIG_PATH: &str = "config/ringway.toml";

/// A fingerprint of a config text (within one process).
pub fn hash_text(text: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut h);
    h.finish()
}

/// A validated, compiled configuration.
#[derive(Debug, Clone)]
pub struct Generation {
    /// Where it was read from (for messages), e.g. `config/ringway.toml`.
    pub source: String,
    /// [`hash_text`] of the text it was compiled from (the file watch compares it).
    pub text_hash: u64,
    /// Worker threads to run.
    pub workers: Workers,
    /// How workers are pinned to CPUs.
    pub cpus: CpuPinning,
    /// The I/O driver the workers run on.
    pub driver: DriverChoice,
    /// How long in-flight requests may run after SIGTERM before connections are dropped.
    pub shutdown_timeout: Duration,
    /// How often upstream names are resolved again (`None`: only when a config loads).
    pub dns_refresh: Option<Duration>,
    /// How long a load or refresh waits for its lookups (they run in parallel); a name with
    /// no answer by then counts as a failed lookup.
    pub dns_timeout: Duration,
    /// tracing filter directive (`info`, `ringway=debug`, ...).
    pub log_level: String,
    /// Gateway-wide policy.
    pub gateway: GatewayConfig,
    /// The admin listener (`POST /-/reload`), when configured.
    pub admin: Option<AdminConfig>,
    /// Client-side HTTP limits and timeouts.
    pub http: HttpConfig,
    /// HTTP/2 inbound.
    pub http2: Http2Config,
    /// The access log, when configured.
    pub access_log: Option<AccessLogConfig>,
    /// Listening sockets.
    pub listeners: Vec<ListenerConfig>,
    /// Upstreams, referenced by index from routes.
    pub upstreams: Vec<UpstreamConfig>,
    /// Compiled routes.
    pub routes: RouteTable,
}

impl Generation {
    /// The listener configured at `address`.
    pub fn listener(&self, address: std::net::SocketAddr) -> Option<&ListenerConfig> {
        self.listeners.iter().find(|l| l.address == address)
    }
}

/// `workers = N | "auto"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workers {
    /// One per available CPU.
    Auto,
    /// Exactly this many.
    Count(usize),
}

impl Workers {
    /// The number of worker threads to start on this machine.
    pub fn resolve(self) -> usize {
        match self {
            Workers::Count(n) => n,
            Workers::Auto => std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
        }
    }
}

/// `cpus`: absent pins worker `i` to the `i`-th CPU (modulo their number); a list pins worker
/// `i` to `cpus[i % len]`; an empty list turns pinning off.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CpuPinning {
    /// Worker `i` on the `i`-th available CPU.
    PerWorker,
    /// Worker `i` on `list[i % len]`.
    List(Vec<usize>),
    /// No pinning.
    Off,
}

/// `driver`: the I/O driver of every worker, chosen once at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DriverChoice {
    /// io_uring when the kernel offers it, else epoll (logged).
    Auto,
    /// io_uring, or no start.
    IoUring,
    /// epoll (where policy rules io_uring out): about 1.3× io_uring's CPU per request on a
    /// busy core, alike on a mostly idle one (`loadtest/RESULTS.md`).
    Epoll,
}

/// `[admin]`
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminConfig {
    /// Where the admin endpoints listen (loopback by default).
    pub address: SocketAddr,
}

/// Default admin address.
pub const DEFAULT_ADMIN_ADDRESS: &str = "127.0.0.1:9901";

/// `[gateway]`
#[derive(Debug, Clone, Default)]
pub struct GatewayConfig {
    /// Peers whose X-Forwarded-For chain is kept (empty: trust nobody).
    pub trusted_proxies: Vec<IpNet>,
    /// Proxied requests in flight across all workers (0: no cap).
    pub max_concurrent_requests: u32,
    /// Slots of the cap only routes of [`HIGH_PRIORITY_CLASS`] or above may take: a tenth of
    /// the cap (at least 1) when such a route exists, else 0.
    pub high_priority_reserve: u32,
}

/// Routes of this `priority_class` or above may use the reserved share of the gateway cap.
pub const HIGH_PRIORITY_CLASS: u8 = 8;

/// `[http2]`: HTTP/2 inbound (h2 by ALPN on TLS listeners, h2c by prior knowledge).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Http2Config {
    /// Offer and accept HTTP/2.
    pub enabled: bool,
    /// Streams a client may have open at once.
    pub max_concurrent_streams: u32,
    /// Flow-control window per stream (bytes the client may send before ringway acknowledges).
    pub initial_stream_window: u32,
    /// Flow-control window per connection.
    pub initial_connection_window: u32,
    /// Body bytes the streams of one connection may hold in ringway together, per direction,
    /// shared equally among the open streams (each gets 16 to 64 KiB of bridge buffer); it
    /// also sizes h2's send queue per stream (see `h2::send_buffer_per_stream`).
    pub max_buffered_bytes: usize,
    /// Largest frame payload accepted.
    pub max_frame_size: u32,
    /// Largest decoded header list (also bounds CONTINUATION frames).
    pub max_header_list_bytes: u32,
    /// Streams reset by the client before ringway accepted them, at most, at once (rapid
    /// reset, CVE-2023-44487); beyond it the connection is closed.
    pub max_pending_accept_reset_streams: usize,
    /// Streams ringway had to reset for the client's protocol errors, at most, per
    /// connection; beyond it the connection is closed.
    pub max_local_error_reset_streams: usize,
}

/// `[access_log]`: one JSON line per request (`observe::access_log`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessLogConfig {
    /// The file lines are appended to (relative paths are relative to the config file).
    pub path: std::path::PathBuf,
    /// Bytes of lines a worker gathers before handing them to the writer thread.
    pub buffer_bytes: usize,
    /// Longest a line waits in a worker's buffer.
    pub flush_interval: Duration,
}

impl AccessLogConfig {
    /// Default of `buffer_bytes`.
    pub const DEFAULT_BUFFER_BYTES: usize = 64 * 1024;
    /// Default of `flush_interval`.
    pub const DEFAULT_FLUSH_INTERVAL: Duration = Duration::from_secs(1);
}

/// `[http]`: limits and timeouts on the client side.
#[derive(Debug, Clone)]
pub struct HttpConfig {
    /// Head size, header count and request line limits.
    pub limits: HeadLimits,
    /// Largest request body accepted (413 beyond), `None` for no limit.
    pub max_request_body_bytes: Option<u64>,
    /// Concurrent client connections per worker; beyond it the worker stops accepting.
    pub max_connections: usize,
    /// Time to receive a whole request head, from its first byte (from accept for the first).
    pub header_timeout: Duration,
    /// Time a keep-alive connection may wait for its next request.
    pub idle_timeout: Duration,
    /// Longest pause between two reads of a request body.
    pub body_timeout: Duration,
    /// Longest a write to the client or upstream may stall.
    pub send_timeout: Duration,
    /// A tunnel (after a 101) with no byte either way for this long is closed.
    pub tunnel_idle_timeout: Duration,
    /// Idle bytes each of a worker's two block pools keeps for good; up to four times as much
    /// is taken back and freed once a second has not needed it (see `buf::BufPool::trim`).
    pub buffer_pool_bytes: usize,
    /// A request that has awaited its response head this long has its client socket checked
    /// for a close, again as often, and a client gone cancels the upstream request. `None`
    /// (`"off"`): not checked; the upstream request runs to its end or timeout.
    pub client_close_check: Option<Duration>,
    /// A cleartext keep-alive connection that has waited this long for its next request
    /// cancels its read and gives its head block back, then waits for its socket with no
    /// block. `None` (`"off"`, the default): it keeps its block (the cancellable read costs
    /// every keep-alive request about 5% more instructions).
    pub idle_buffer_release: Option<Duration>,
    /// `/healthz`, `/readyz` and `/metrics` are answered on the listeners before routing
    /// (off: they are routed like any path; the admin listener serves them either way).
    pub reserved_paths: bool,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            limits: HeadLimits::default(),
            max_request_body_bytes: None,
            max_connections: 8192,
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            body_timeout: Duration::from_secs(60),
            send_timeout: Duration::from_secs(60),
            tunnel_idle_timeout: Duration::from_secs(300),
            buffer_pool_bytes: 16 * 1024 * 1024,
            client_close_check: Some(Duration::from_secs(1)),
            idle_buffer_release: None,
            reserved_paths: true,
        }
    }
}

/// `[[listeners]]`
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerConfig {
    /// Address to bind.
    pub address: SocketAddr,
    /// listen(2) backlog.
    pub backlog: u32,
    /// TLS termination, when set.
    pub tls: Option<std::sync::Arc<crate::tls::TlsListener>>,
}

/// `[[upstreams]]`
#[derive(Debug, Clone)]
pub struct UpstreamConfig {
    /// Name routes refer to.
    pub name: String,
    /// Endpoints in config order (at least one).
    pub endpoints: Vec<EndpointSpec>,
    /// How an endpoint is chosen.
    pub balancer: BalancerConfig,
    /// Open connections per endpoint across workers (0: unlimited).
    pub max_connections: u32,
    /// Requests that may wait for a connection when every endpoint is at its limit (0: none).
    pub max_pending: u32,
    /// Per-endpoint token bucket, when set.
    pub rate_limit: Option<RateLimitConfig>,
    /// Active health checks, when set.
    pub health_check: Option<HealthCheckConfig>,
    /// Passive health (outlier ejection); `None` when turned off (`consecutive_failures = 0`).
    pub outlier: Option<OutlierConfig>,
    /// Circuit breaker (a zero threshold disables it).
    pub breaker: BreakerConfig,
    /// Retry policy.
    pub retries: RetryPolicy,
    /// Retry budget shared by all workers.
    pub retry_budget: RetryBudgetConfig,
    /// Time to establish a TCP connection.
    pub connect_timeout: Duration,
    /// Time from the end of the request to the response head.
    pub response_timeout: Duration,
    /// Longest pause between two reads of a response body.
    pub read_timeout: Duration,
    /// Idle keep-alive connections kept per endpoint per worker.
    pub pool_max_idle: usize,
    /// How long an idle pooled connection is kept.
    pub pool_idle_timeout: Duration,
    /// How requests reach the endpoints.
    pub protocol: UpstreamProtocol,
    /// HTTP/2 connections per endpoint per worker (streams are multiplexed over them).
    pub h2_connections: usize,
    /// HTTP/2: the receive window ringway grants each upstream stream (what one stream's
    /// response may have in flight toward a client that reads slowly).
    pub h2_stream_window: u32,
    /// HTTP/2: the receive window of a whole upstream connection (what all its streams may
    /// have in flight together; at least `h2_stream_window`).
    pub h2_connection_window: u32,
    /// HTTP/2: a PING goes out on each upstream connection with streams open this often,
    /// and one unanswered within the interval closes it (a peer gone without a word). Off
    /// when unset (a request timing out on a connection still makes it answer a PING).
    pub h2_keepalive: Option<Duration>,
    /// TLS toward the endpoints, when set.
    pub tls: Option<std::sync::Arc<crate::tls::client::UpstreamTls>>,
}

/// `protocol = ...` of an upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamProtocol {
    /// HTTP/1.1, pooled keep-alive connections.
    Http1,
    /// HTTP/2 over cleartext TCP (prior knowledge), multiplexed.
    H2c,
    /// HTTP/2 over TLS (ALPN `h2`), multiplexed.
    H2,
}

impl UpstreamProtocol {
    /// Whether streams are multiplexed over HTTP/2 connections.
    pub fn is_h2(self) -> bool {
        matches!(self, UpstreamProtocol::H2c | UpstreamProtocol::H2)
    }
}

/// `balancer = ...`
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BalancerConfig {
    /// Power of two choices on peak-EWMA latency times in-flight requests (the default).
    P2cEwma,
    /// In turn.
    RoundRobin,
    /// Smooth weighted round robin (as nginx), by endpoint `weight`.
    Weighted,
    /// Fewest in-flight requests (per worker).
    LeastConn,
    /// Hash of the client IP.
    IpHash,
    /// Hash of a cookie's value (sticky sessions); round robin without the cookie.
    CookieHash(String),
    /// Consistent hashing (a ring of virtual nodes) on a key.
    ConsistentHash(HashKey),
}

impl BalancerConfig {
    /// The configured name.
    pub fn name(&self) -> &'static str {
        match self {
            BalancerConfig::P2cEwma => "p2c_ewma",
            BalancerConfig::RoundRobin => "round_robin",
            BalancerConfig::Weighted => "weighted",
            BalancerConfig::LeastConn => "least_conn",
            BalancerConfig::IpHash => "ip_hash",
            BalancerConfig::CookieHash(_) => "cookie_hash",
            BalancerConfig::ConsistentHash(_) => "consistent_hash",
        }
    }
}

/// What a consistent hash is computed on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HashKey {
    /// A request header's value (lower-cased name).
    Header(String),
    /// A cookie's value.
    Cookie(String),
    /// The client IP (the direct peer).
    ClientIp,
}

/// `rate_limit = { max_rps, burst }`: a token bucket per endpoint; an empty one makes the
/// endpoint ineligible.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimitConfig {
    /// Tokens per second.
    pub max_rps: u32,
    /// Extra tokens that may be spent at once.
    pub burst: u32,
}

impl RateLimitConfig {
    /// Nanoseconds per token.
    pub fn interval_ns(&self) -> u64 {
        1_000_000_000 / u64::from(self.max_rps.max(1))
    }

    /// How far ahead the bucket may be spent, in nanoseconds.
    pub fn burst_ns(&self) -> u64 {
        self.interval_ns() * u64::from(self.burst)
    }
}

/// `health_check = { ... }`
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthCheckConfig {
    /// Path probed with GET.
    pub path: String,
    /// Status that counts as healthy (0: any 2xx or 3xx).
    pub expect_status: u16,
    /// Time between probes of one endpoint.
    pub interval: Duration,
    /// Time a probe may take.
    pub timeout: Duration,
    /// Successes in a row that mark an endpoint healthy.
    pub healthy_threshold: u32,
    /// Failures in a row that mark it unhealthy.
    pub unhealthy_threshold: u32,
    /// Each probe after the first waits `interval` plus a random part of this percent of it,
    /// so that probes (of endpoints, of ringway instances started together) spread out.
    pub jitter_percent: u32,
}

/// `outlier = { ... }`: passive health.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutlierConfig {
    /// Failures in a row that eject an endpoint.
    pub consecutive_failures: u32,
    /// First ejection time; the n-th lasts n times this.
    pub base_ejection: Duration,
    /// Longest ejection.
    pub max_ejection: Duration,
    /// Most endpoints of the upstream ejected at once, in percent.
    pub max_ejection_percent: u32,
    /// Whether 5xx responses count as failures.
    pub on_5xx: bool,
}

impl Default for OutlierConfig {
    /// On by default, as nginx's passive health: 5 failures in a row eject for 10 s (20 s the
    /// second time, ... up to 5 min), at most half the endpoints at once.
    fn default() -> Self {
        OutlierConfig {
            consecutive_failures: 5,
            base_ejection: Duration::from_secs(10),
            max_ejection: Duration::from_secs(300),
            max_ejection_percent: 50,
            on_5xx: false,
        }
    }
}

/// `breaker = { ... }`
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BreakerConfig {
    /// Failures in a row that open it (0: no breaker).
    pub failure_threshold: u32,
    /// How long it stays open before half-open.
    pub open_duration: Duration,
    /// Probe requests allowed at once while half-open, across workers.
    pub half_open_max: u32,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig {
            failure_threshold: 0,
            open_duration: Duration::from_secs(30),
            half_open_max: 1,
        }
    }
}

/// What failures a retry is tried on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RetryOn {
    /// The connection could not be made (refused, timed out).
    pub connect_failure: bool,
    /// The connection was reset or closed before a response head.
    pub reset: bool,
    /// Any 5xx response.
    pub status_5xx: bool,
    /// 502, 503 and 504 responses.
    pub gateway_error: bool,
}

/// `retries = { ... }`
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included (1: no retry).
    pub attempts: u32,
    /// Time each attempt may take for its response head (default: the upstream's
    /// `response_timeout`).
    pub per_try_timeout: Option<Duration>,
    /// First backoff; then doubled per retry, with full jitter.
    pub backoff_base: Duration,
    /// Longest backoff.
    pub backoff_max: Duration,
    /// What is retried.
    pub retry_on: RetryOn,
    /// POST may be retried (never PATCH or other non-idempotent methods).
    pub retry_post: bool,
    /// Request bodies up to this size are kept for replay (0: never buffered: a request with
    /// a body is retried only when none of it was sent).
    pub buffer_max_bytes: usize,
    /// Deadline for all attempts together.
    pub total_timeout: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempts: 2,
            per_try_timeout: None,
            backoff_base: Duration::from_millis(25),
            backoff_max: Duration::from_millis(250),
            retry_on: RetryOn {
                connect_failure: true,
                reset: true,
                ..RetryOn::default()
            },
            retry_post: false,
            buffer_max_bytes: 0,
            total_timeout: Duration::from_secs(30),
        }
    }
}

/// `retry_budget = { ... }`: retries stay under `percent` of requests over a 10 s window plus
/// `min_per_second`, and under `max_concurrent` at once, across all workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryBudgetConfig {
    /// Retries allowed as a percentage of requests.
    pub percent: u32,
    /// Retries allowed per second regardless.
    pub min_per_second: u32,
    /// Retries in progress at once.
    pub max_concurrent: u32,
}

impl Default for RetryBudgetConfig {
    fn default() -> Self {
        RetryBudgetConfig {
            percent: 20,
            min_per_second: 10,
            max_concurrent: 100,
        }
    }
}

/// An endpoint as configured: `host:port`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointSpec {
    /// `host:port` as written; the Host header sent upstream.
    pub authority: String,
    /// Host part (a name or an IP literal, without brackets).
    pub host: String,
    /// Port.
    pub port: u16,
    /// The address when `host` is an IP literal (no resolution needed).
    pub literal: Option<SocketAddr>,
    /// Weight for the weighted balancer (1 to 1000).
    pub weight: u32,
}

/// A config error with its position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The file (or `<command line>`).
    pub source: String,
    /// 1-based line.
    pub line: usize,
    /// 1-based column, in characters.
    pub column: usize,
    /// What is wrong, in plain words.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}: {}",
            self.source, self.line, self.column, self.message
        )
    }
}

impl std::error::Error for ConfigError {}

/// Reads and compiles the config file at `path`.
pub fn load(path: &Path) -> Result<Generation, ConfigError> {
    let source = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
        source: source.clone(),
        line: 1,
        column: 1,
        message: format!("cannot read the config file: {e}"),
    })?;
    compile(&text, &source)
}

/// The configuration of `ringway proxy --listen ADDR --upstream ADDR[,ADDR...]`: every path to
/// the upstreams, everything else default. Built as TOML so it takes the same validation path.
pub fn quick_proxy(
    listen: &str,
    upstreams: &[String],
    workers: Option<usize>,
) -> Result<Generation, ConfigError> {
    let mut root = toml::Table::new();
    if let Some(n) = workers {
        root.insert("workers".into(), toml::Value::Integer(n as i64));
    }
    let mut listener = toml::Table::new();
    listener.insert("address".into(), listen.into());
    root.insert(
        "listeners".into(),
        toml::Value::Array(vec![listener.into()]),
    );
    let mut upstream = toml::Table::new();
    upstream.insert("name".into(), "default".into());
    upstream.insert(
        "endpoints".into(),
        toml::Value::Array(upstreams.iter().map(|u| u.as_str().into()).collect()),
    );
    root.insert(
        "upstreams".into(),
        toml::Value::Array(vec![upstream.into()]),
    );
    let mut route = toml::Table::new();
    route.insert("path_prefix".into(), "/".into());
    route.insert("proxy".into(), "default".into());
    root.insert("routes".into(), toml::Value::Array(vec![route.into()]));
    let text = toml::to_string(&root).map_err(|e| ConfigError {
        source: "<command line>".into(),
        line: 1,
        column: 1,
        message: e.to_string(),
    })?;
    compile(&text, "<command line>")
}

/// Default config path, as a `PathBuf`.
pub fn default_path() -> PathBuf {
    PathBuf::from(DEFAULT_CONFIG_PATH)
}

/// What `ringway check` prints: the compiled listeners, upstreams (with resolved addresses when
/// given) and routes in match order.
pub fn describe(gen: &Generation, endpoints: Option<&crate::shared::EndpointTable>) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let workers = match gen.workers {
        Workers::Auto => format!("auto ({})", gen.workers.resolve()),
        Workers::Count(n) => n.to_string(),
    };
    let _ = writeln!(out, "{}: ok", gen.source);
    let _ = writeln!(out, "workers: {workers}");
    let pinning = match &gen.cpus {
        CpuPinning::PerWorker => "one CPU per worker".to_string(),
        CpuPinning::List(l) => format!("{l:?}"),
        CpuPinning::Off => "off".to_string(),
    };
    let _ = writeln!(out, "cpu pinning: {pinning}");
    let h = &gen.http;
    let _ = writeln!(
        out,
        "http: head <= {} bytes, <= {} headers, request line <= {} bytes, body <= {}, \
         {} connections/worker; timeouts: header {:?}, idle {:?}, body {:?}, send {:?}",
        h.limits.max_head_bytes,
        h.limits.max_headers,
        h.limits.max_request_line_bytes,
        h.max_request_body_bytes
            .map_or("unlimited".to_string(), |n| format!("{n} bytes")),
        h.max_connections,
        h.header_timeout,
        h.idle_timeout,
        h.body_timeout,
        h.send_timeout
    );
    let _ = writeln!(
        out,
        "trusted proxies: {}",
        if gen.gateway.trusted_proxies.is_empty() {
            "none".to_string()
        } else {
            gen.gateway
                .trusted_proxies
                .iter()
                .map(|n| n.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        }
    );
    match &gen.access_log {
        None => {
            let _ = writeln!(out, "access log: off");
        }
        Some(l) => {
            let _ = writeln!(
                out,
                "access log: {} (JSON lines; batches of {} bytes, written within {:?})",
                l.path.display(),
                l.buffer_bytes,
                l.flush_interval
            );
        }
    }
    if let Some(a) = &gen.admin {
        let _ = writeln!(out, "admin: {} (POST /-/reload, GET /-/upstreams, POST /-/upstreams/NAME/endpoints/ADDR/drain|undrain)", a.address);
    }
    let _ = writeln!(out, "listeners:");
    for l in &gen.listeners {
        let tls = match &l.tls {
            None => String::new(),
            Some(t) => format!(
                ", TLS: {} certificate file(s), handshake within {:?}{}",
                t.files.len() / 2,
                t.handshake_timeout,
                if t.strict_sni {
                    ", 421 when the host is not the SNI name"
                } else {
                    ""
                }
            ),
        };
        let _ = writeln!(out, "  {} (backlog {}{tls})", l.address, l.backlog);
    }
    let _ = writeln!(out, "upstreams:");
    if gen.upstreams.is_empty() {
        let _ = writeln!(out, "  (none)");
    }
    for (i, u) in gen.upstreams.iter().enumerate() {
        let eps: Vec<String> = match endpoints.and_then(|t| t.get(i)) {
            Some(resolved) => u
                .endpoints
                .iter()
                .map(|spec| {
                    let addrs: Vec<String> = resolved
                        .iter()
                        .filter(|r| *r.authority == *spec.authority)
                        .map(|r| r.addr.to_string())
                        .collect();
                    if spec.literal.is_some() {
                        spec.authority.clone()
                    } else {
                        format!("{} -> {}", spec.authority, addrs.join(" "))
                    }
                })
                .collect(),
            None => u.endpoints.iter().map(|e| e.authority.clone()).collect(),
        };
        let _ = writeln!(
            out,
            "  {}: {} [connect {:?}, response {:?}, read {:?}; pool {} idle/endpoint/worker for {:?}]",
            u.name,
            eps.join(", "),
            u.connect_timeout,
            u.response_timeout,
            u.read_timeout,
            u.pool_max_idle,
            u.pool_idle_timeout
        );
        let r = &u.retries;
        let _ = writeln!(
            out,
            "    balancer {}; retries {} attempt(s) on {}; breaker {}; passive health {}; active health {}",
            u.balancer.name(),
            r.attempts,
            [
                (r.retry_on.connect_failure, "connect_failure"),
                (r.retry_on.reset, "reset"),
                (r.retry_on.status_5xx, "5xx"),
                (r.retry_on.gateway_error, "gateway_error"),
            ]
            .iter()
            .filter(|(on, _)| *on)
            .map(|(_, n)| *n)
            .collect::<Vec<_>>()
            .join("+"),
            if u.breaker.failure_threshold == 0 {
                "off".to_string()
            } else {
                format!("after {} failures", u.breaker.failure_threshold)
            },
            u.outlier.as_ref().map_or("off".to_string(), |o| format!(
                "eject after {} failures",
                o.consecutive_failures
            )),
            u.health_check.as_ref().map_or("off".to_string(), |h| format!(
                "GET {} every {:?}",
                h.path, h.interval
            )),
        );
    }
    let _ = writeln!(
        out,
        "routes (config order; per host: priority, then exact > template > prefix > regex):"
    );
    if gen.routes.routes().is_empty() {
        let _ = writeln!(out, "  (none: every request gets 404)");
    }
    for r in gen.routes.routes() {
        let _ = writeln!(out, "  {}. {}", r.index + 1, describe_route(gen, r));
    }
    for warning in warnings(gen) {
        let _ = writeln!(out, "warning: {warning}");
    }
    out
}

/// What in `gen` is allowed but likely a mistake: routes that can never be chosen, and an
/// admin listener reachable off the machine (it reloads the config and drains endpoints, with
/// no authentication of its own). `check` prints these; start-up and reloads log them.
pub fn warnings(gen: &Generation) -> Vec<String> {
    let mut out = gen.routes.conflicts();
    if let Some(admin) = &gen.admin {
        if !admin.address.ip().to_canonical().is_loopback() {
            out.push(format!(
                "the admin listener ({}) is not on a loopback address: anyone who can reach it \
                 can reload the config and drain endpoints (it has no authentication); bind it \
                 to 127.0.0.1 or ::1, or restrict access to it by firewall",
                admin.address
            ));
        }
    }
    out
}

/// One route's compiled form, on one line.
pub fn describe_route(gen: &Generation, r: &crate::route::Route) -> String {
    use crate::route::{Action, PathRewrite, ValueMatch};
    use std::fmt::Write;
    let mut s = format!("{} host={} {}", r.name, r.host, r.path);
    if r.priority != 0 {
        let _ = write!(s, " priority={}", r.priority);
    }
    let c = &r.criteria;
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let value = |m: &ValueMatch| match m {
        ValueMatch::Present => String::new(),
        ValueMatch::Exact(v) => format!("={}", text(v)),
    };
    if !c.methods.is_empty() {
        let m: Vec<String> = c.methods.iter().map(|m| text(m)).collect();
        let _ = write!(s, " methods={}", m.join(","));
    }
    for (n, v) in &c.headers {
        let _ = write!(s, " header:{}{}", text(n), value(v));
    }
    for (n, v) in &c.query {
        let _ = write!(s, " query:{}{}", text(n), value(v));
    }
    for (n, v) in &c.cookies {
        let _ = write!(s, " cookie:{}{}", text(n), value(v));
    }
    if let Some(a) = &c.accept {
        let _ = write!(s, " accept={}/{}", text(&a.kind), text(&a.subtype));
    }
    s.push_str(" -> ");
    match &r.action {
        Action::Proxy(p) => {
            let _ = write!(
                s,
                "proxy {}",
                gen.upstreams
                    .get(p.upstream)
                    .map_or("?", |u| u.name.as_str())
            );
            match &p.rewrite {
                PathRewrite::None => {}
                PathRewrite::Prefix { strip, add } => {
                    if let Some(x) = strip {
                        let _ = write!(s, ", strip {x}");
                    }
                    if let Some(x) = add {
                        let _ = write!(s, ", add {x}");
                    }
                }
                PathRewrite::Regex(rw) => {
                    let _ = write!(s, ", rewrite {} => {}", rw.pattern, rw.replacement);
                }
            }
            if p.preserve_host {
                s.push_str(", preserve host");
            }
            if let Some(t) = p.response_timeout {
                let _ = write!(s, ", response timeout {t:?}");
            }
            if let Some(t) = p.read_timeout {
                let _ = write!(s, ", read timeout {t:?}");
            }
        }
        Action::Redirect(rd) => {
            let _ = write!(
                s,
                "redirect {} to scheme={} host={} port={} path={}",
                rd.status,
                rd.scheme.as_deref().unwrap_or("(request)"),
                rd.host.as_deref().unwrap_or("(request)"),
                rd.port.map_or("(request)".to_string(), |p| p.to_string()),
                rd.path.as_deref().unwrap_or("(request)")
            );
        }
        Action::Respond(l) => {
            let _ = write!(s, "respond {} ({} bytes)", l.status, l.body.len());
        }
    }
    match r.limits.max_body_bytes {
        Some(Some(n)) => {
            let _ = write!(s, "; body <= {n} bytes");
        }
        Some(None) => s.push_str("; any body size"),
        None => {}
    }
    if let Some(n) = r.limits.max_head_bytes {
        let _ = write!(s, "; head <= {n} bytes");
    }
    if let Some(m) = &r.maintenance {
        let _ = write!(s, "; IN MAINTENANCE (503, retry after {:?})", m.retry_after);
    }
    s
}

/// What identifies a version of a watched file (the config, a certificate or key): a rename
/// over it changes the inode, an in-place write the change time (nanoseconds), even at the
/// same size and modification second.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileStamp {
    modified: Option<std::time::SystemTime>,
    len: u64,
    inode: u64,
    changed: (i64, i64),
}

/// The stamp of the file at `path` now (`None` when it cannot be read).
pub fn stamp(path: &std::path::Path) -> Option<FileStamp> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).ok()?;
    Some(FileStamp {
        modified: meta.modified().ok(),
        len: meta.len(),
        inode: meta.ino(),
        changed: (meta.ctime(), meta.ctime_nsec()),
    })
}
