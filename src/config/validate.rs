//! Raw TOML → checked [`Generation`]. Parse, don't validate: what comes out cannot be invalid
//! (non-empty endpoint lists, durations above zero, routes that name existing upstreams).

use std::collections::{BTreeMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::ops::Range;
use std::time::Duration;

use ipnet::IpNet;
use toml::Spanned;

use super::raw::{
    RawBalancer, RawConfig, RawEndpoint, RawHealthCheck, RawRedirect, RawRespond, RawRetries,
    RawRoute, RawUpstream, RawValueMatch, RawWorkers,
};
use super::{
    AccessLogConfig, AdminConfig, BalancerConfig, BreakerConfig, ConfigError, CpuPinning,
    DriverChoice, EndpointSpec, GatewayConfig, Generation, HashKey, HealthCheckConfig, HttpConfig,
    ListenerConfig, OutlierConfig, RateLimitConfig, RetryBudgetConfig, RetryOn, RetryPolicy,
    UpstreamConfig, Workers,
};
use crate::http1::head::valid_host;
use crate::http1::{is_tchar, HeadLimits, HeaderKind, MAX_HEADERS_HARD_LIMIT};
use crate::route::{
    Action, Criteria, HostMatch, LocalResponse, Maintenance, MediaType, PathMatch, PathRewrite,
    ProxyAction, Redirect, RegexRewrite, Route, RouteLimits, RouteTable, Template, ValueMatch,
    MAX_LOCAL_HEADERS,
};

/// Most workers a config may ask for.
pub(super) const MAX_WORKERS: usize = 1024;

struct Ctx<'a> {
    text: &'a str,
    source: &'a str,
    /// Directory that relative paths in the config (body_file) are relative to.
    base_dir: std::path::PathBuf,
}

impl Ctx<'_> {
    fn error(&self, span: Range<usize>, message: impl Into<String>) -> ConfigError {
        let offset = span.start.min(self.text.len());
        let before = &self.text[..floor_char_boundary(self.text, offset)];
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        ConfigError {
            source: self.source.to_string(),
            line,
            column,
            message: message.into(),
        }
    }

    fn duration(
        &self,
        value: &Option<Spanned<String>>,
        default: Duration,
    ) -> Result<Duration, ConfigError> {
        match value {
            None => Ok(default),
            Some(v) => parse_duration(v.get_ref()).map_err(|why| self.error(v.span(), why)),
        }
    }

    /// A `"keep"` or `"reject"` key: whether it keeps (`default` when unset).
    fn keep(
        &self,
        value: &Option<Spanned<String>>,
        default: bool,
        what: &str,
    ) -> Result<bool, ConfigError> {
        match value {
            None => Ok(default),
            Some(v) if v.get_ref() == "keep" => Ok(true),
            Some(v) if v.get_ref() == "reject" => Ok(false),
            Some(v) => Err(self.error(v.span(), format!("{what} is \"keep\" or \"reject\""))),
        }
    }

    fn int(
        &self,
        value: &Option<Spanned<i64>>,
        default: u64,
        range: Range<u64>,
        what: &str,
    ) -> Result<u64, ConfigError> {
        match value {
            None => Ok(default),
            Some(v) => {
                let n = *v.get_ref();
                if n < 0 || !(range.start..=range.end).contains(&(n as u64)) {
                    return Err(self.error(
                        v.span(),
                        format!(
                            "{what} must be between {} and {}, not {n}",
                            range.start, range.end
                        ),
                    ));
                }
                Ok(n as u64)
            }
        }
    }
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// The longest duration any key accepts: deadlines are instants (now + duration), and a
/// duration near `u64::MAX` seconds would overflow them at the first request.
const MAX_DURATION: Duration = Duration::from_secs(366 * 24 * 3600);

/// Longest `maintenance.message` and `redirect.path`, and the most bytes of `respond.headers`
/// (`name: value` lines): ringway's own answers are written in one head block (at least
/// 16 KiB), with its own fields, the request id and, for a redirect, the request's path.
const MAX_LOCAL_TEXT_BYTES: usize = 4096;
const MAX_LOCAL_HEADER_BYTES: usize = 8192;

/// How long lookups may take when `dns_timeout` is not set: a resolver's own first timeout
/// (glibc's 5 s) passes once before a name counts as failed.
const DEFAULT_DNS_TIMEOUT: Duration = Duration::from_secs(5);

/// How often upstream names are resolved again when `dns_refresh` is not set.
const DEFAULT_DNS_REFRESH: Duration = Duration::from_secs(10);

/// Parses `"250ms"`, `"10s"`, `"2m"`, `"1h"` (a positive whole number and a unit), at most
/// [`MAX_DURATION`].
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    let (number, unit) = text.split_at(digits);
    let n: u64 = number.parse().map_err(|_| {
        format!("invalid duration `{text}`: expected a number and a unit, like \"10s\"")
    })?;
    let d = match unit {
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.saturating_mul(60)),
        "h" => Duration::from_secs(n.saturating_mul(3600)),
        _ => {
            return Err(format!(
                "invalid duration `{text}`: the unit must be ms, s, m or h"
            ))
        }
    };
    if d.is_zero() {
        return Err(format!("invalid duration `{text}`: must be above zero"));
    }
    if d > MAX_DURATION {
        return Err(format!("invalid duration `{text}`: at most a year (8784h)"));
    }
    Ok(d)
}

/// Compiles config `text` read from `source` (used in messages).
pub fn compile(text: &str, source: &str) -> Result<Generation, ConfigError> {
    let base_dir = std::path::Path::new(source)
        .parent()
        .filter(|p| !p.as_os_str().is_empty() && !source.starts_with('<'))
        .map_or_else(|| std::path::PathBuf::from("."), |p| p.to_path_buf());
    let ctx = Ctx {
        text,
        source,
        base_dir,
    };
    let raw: RawConfig = toml::from_str(text).map_err(|e| {
        let span = e.span().unwrap_or(0..0);
        ctx.error(span, e.message().trim().to_string())
    })?;

    let workers = match &raw.workers {
        None => Workers::Auto,
        Some(w) => match w.get_ref() {
            RawWorkers::Named(s) if s == "auto" => Workers::Auto,
            RawWorkers::Count(n) if (1..=MAX_WORKERS as i64).contains(n) => {
                Workers::Count(*n as usize)
            }
            _ => {
                return Err(ctx.error(
                    w.span(),
                    format!("workers must be \"auto\" or a number from 1 to {MAX_WORKERS}"),
                ))
            }
        },
    };
    let cpus = match &raw.cpus {
        None => CpuPinning::PerWorker,
        Some(c) if c.get_ref().is_empty() => CpuPinning::Off,
        Some(c) => CpuPinning::List(c.get_ref().clone()),
    };
    let driver = match &raw.driver {
        None => DriverChoice::Auto,
        Some(d) => match d.get_ref().as_str() {
            "auto" => DriverChoice::Auto,
            "io_uring" => DriverChoice::IoUring,
            "epoll" => DriverChoice::Epoll,
            _ => {
                return Err(ctx.error(
                    d.span(),
                    "driver must be \"auto\", \"io_uring\" or \"epoll\"".to_string(),
                ))
            }
        },
    };
    let shutdown_timeout = ctx.duration(&raw.shutdown_timeout, Duration::from_secs(30))?;
    // (Lookups run on a thread of their own, at most once a second.)
    let dns_refresh = match &raw.dns_refresh {
        Some(v) if v.get_ref() == "off" => None,
        Some(v) => match ctx.duration(&raw.dns_refresh, DEFAULT_DNS_REFRESH)? {
            d if d >= Duration::from_secs(1) => Some(d),
            _ => {
                let why = "dns_refresh must be at least \"1s\", or \"off\"";
                return Err(ctx.error(v.span(), why.to_string()));
            }
        },
        None => Some(DEFAULT_DNS_REFRESH),
    };
    let dns_timeout = ctx.duration(&raw.dns_timeout, DEFAULT_DNS_TIMEOUT)?;
    if !(Duration::from_millis(100)..=Duration::from_secs(60)).contains(&dns_timeout) {
        let span = raw.dns_timeout.as_ref().map_or(0..0, |v| v.span());
        let why = "dns_timeout must be from \"100ms\" to \"60s\"";
        return Err(ctx.error(span, why.to_string()));
    }
    let log_level = match &raw.log_level {
        None => "info".to_string(),
        Some(l) => {
            tracing_subscriber::EnvFilter::try_new(l.get_ref()).map_err(|e| {
                ctx.error(
                    l.span(),
                    format!("invalid log_level `{}`: {e}", l.get_ref()),
                )
            })?;
            l.get_ref().clone()
        }
    };

    let mut trusted_proxies = Vec::new();
    for p in &raw.gateway.trusted_proxies {
        let text = p.get_ref().trim();
        let net = text
            .parse::<IpNet>()
            .or_else(|_| text.parse::<IpAddr>().map(IpNet::from))
            .map_err(|_| {
                ctx.error(
                    p.span(),
                    format!("`{text}` is not an IP address or CIDR block (like 10.0.0.0/8)"),
                )
            })?;
        trusted_proxies.push(net);
    }

    let http = compile_http(&ctx, &raw)?;
    let http2 = compile_http2(&ctx, &raw, &http)?;
    let access_log = compile_access_log(&ctx, &raw)?;

    let admin = match &raw.admin {
        None => None,
        Some(a) => {
            let address = match &a.address {
                None => super::DEFAULT_ADMIN_ADDRESS.parse().ok(),
                Some(s) => Some(s.get_ref().trim().parse::<SocketAddr>().map_err(|_| {
                    ctx.error(
                        s.span(),
                        format!("`{}` is not an IP:port address", s.get_ref()),
                    )
                })?),
            };
            address.map(|address| AdminConfig { address })
        }
    };

    if raw.listeners.is_empty() {
        return Err(ctx.error(
            0..0,
            "no listener: add a [[listeners]] table with an address, like \"127.0.0.1:8080\"",
        ));
    }
    let mut listeners = Vec::new();
    let mut seen_addrs = HashSet::new();
    for l in &raw.listeners {
        let l_ref = l.get_ref();
        let address: SocketAddr = l_ref.address.get_ref().trim().parse().map_err(|_| {
            ctx.error(
                l_ref.address.span(),
                format!(
                    "`{}` is not an IP:port address (like \"127.0.0.1:8080\" or \"[::]:80\")",
                    l_ref.address.get_ref()
                ),
            )
        })?;
        if !seen_addrs.insert(address) {
            return Err(ctx.error(
                l_ref.address.span(),
                format!("listener address {address} is configured twice"),
            ));
        }
        // `[::]:P` takes IPv4 connections too (IPV6_V6ONLY is off), so with `0.0.0.0:P` the
        // second bind would fail as if another server held the port.
        let port = address.port();
        let wildcard = |a: &SocketAddr| a.ip().is_unspecified() && a.port() == port && port != 0;
        if wildcard(&address)
            && seen_addrs
                .iter()
                .any(|a| a != &address && wildcard(a) && a.is_ipv4() != address.is_ipv4())
        {
            return Err(ctx.error(
                l_ref.address.span(),
                format!(
                    "`[::]:{port}` already takes IPv4 connections on port {port}: drop `0.0.0.0:{port}`"
                ),
            ));
        }
        let backlog = ctx.int(&l_ref.backlog, 1024, 1..65535, "backlog")? as u32;
        let tls = match &l_ref.tls {
            None => None,
            Some(t) => Some(std::sync::Arc::new(compile_tls(&ctx, t, http2.enabled)?)),
        };
        listeners.push(ListenerConfig {
            address,
            backlog,
            tls,
        });
    }

    let mut upstreams = Vec::new();
    for u in &raw.upstreams {
        let compiled = compile_upstream(&ctx, u.get_ref())?;
        if upstreams
            .iter()
            .any(|x: &UpstreamConfig| x.name == compiled.name)
        {
            return Err(ctx.error(
                u.get_ref().name.span(),
                format!("upstream `{}` is defined twice", compiled.name),
            ));
        }
        upstreams.push(compiled);
    }

    let mut routes = Vec::new();
    for (i, r) in raw.routes.iter().enumerate() {
        let route = compile_route(&ctx, i, r.get_ref(), r.span(), &upstreams)?;
        // The head is read (and bounded by [http]) before any route is known: a route can
        // only lower the bound.
        if route
            .limits
            .max_head_bytes
            .is_some_and(|n| n > http.limits.max_head_bytes)
        {
            let span = r.get_ref().limits.as_ref().map_or(r.span(), |l| l.span());
            return Err(ctx.error(
                span,
                "limits.max_head_bytes may not exceed http.max_head_bytes (heads are read before routing)",
            ));
        }
        routes.push(route);
    }
    let max_concurrent_requests = ctx.int(
        &raw.gateway.max_concurrent_requests,
        0,
        0..10_000_000,
        "gateway.max_concurrent_requests",
    )? as u32;
    // A tenth of the cap (at least one slot) is kept for high-priority routes, when any; at
    // least one slot always stays for the others (a cap of 1 keeps none back).
    let high_priority_reserve = if max_concurrent_requests > 0
        && routes
            .iter()
            .any(|r| r.priority_class >= super::HIGH_PRIORITY_CLASS)
    {
        (max_concurrent_requests / 10)
            .max(1)
            .min(max_concurrent_requests - 1)
    } else {
        0
    };
    let routes = RouteTable::new(routes)
        .map_err(|e| ctx.error(0..0, format!("cannot compile the route regexes: {e}")))?;

    Ok(Generation {
        source: source.to_string(),
        text_hash: super::hash_text(text),
        workers,
        cpus,
        driver,
        shutdown_timeout,
        dns_refresh,
        dns_timeout,
        log_level,
        gateway: GatewayConfig {
            trusted_proxies,
            max_concurrent_requests,
            high_priority_reserve,
        },
        admin,
        http,
        http2,
        access_log,
        listeners,
        upstreams,
        routes,
    })
}

/// `[access_log]`: off without the table; the table needs a `path`.
fn compile_access_log(
    ctx: &Ctx<'_>,
    raw: &RawConfig,
) -> Result<Option<AccessLogConfig>, ConfigError> {
    let Some(t) = &raw.access_log else {
        return Ok(None);
    };
    let r = t.get_ref();
    let Some(path) = r.path.as_ref().filter(|p| !p.get_ref().trim().is_empty()) else {
        return Err(ctx.error(
            t.span(),
            "access_log needs a `path` (a file, or \"/dev/stdout\"); remove the table to log nothing",
        ));
    };
    let buffer_bytes = ctx.int(
        &r.buffer_bytes,
        AccessLogConfig::DEFAULT_BUFFER_BYTES as u64,
        0..1024 * 1024,
        "access_log.buffer_bytes",
    )? as usize;
    let flush_interval =
        ctx.duration(&r.flush_interval, AccessLogConfig::DEFAULT_FLUSH_INTERVAL)?;
    Ok(Some(AccessLogConfig {
        path: ctx.base_dir.join(path.get_ref().trim()),
        buffer_bytes,
        flush_interval,
    }))
}

/// A listener's `tls` table: reads and checks the certificates now, so a broken file refuses
/// the config (at start or reload) instead of failing handshakes later.
fn compile_tls(
    ctx: &Ctx<'_>,
    t: &Spanned<super::raw::RawTls>,
    h2: bool,
) -> Result<crate::tls::TlsListener, ConfigError> {
    use crate::tls::{resolve_path, CertSpec, TlsSpec};
    let r = t.get_ref();
    let min_version_13 = match r.min_version.as_ref().map(|v| v.get_ref().as_str()) {
        None | Some("1.2") => false,
        Some("1.3") => true,
        Some(_) => {
            let span = r.min_version.as_ref().map_or(t.span(), |v| v.span());
            return Err(ctx.error(span, "tls.min_version must be \"1.2\" or \"1.3\""));
        }
    };
    let mut sni = Vec::new();
    let mut seen_names = std::collections::HashSet::new();
    for c in &r.sni {
        let cr = c.get_ref();
        if cr.names.get_ref().is_empty() {
            return Err(ctx.error(
                cr.names.span(),
                "an sni certificate needs at least one name",
            ));
        }
        for n in cr.names.get_ref() {
            // Names a client's SNI can match: no port, no trailing dot (SNI carries none),
            // `*` only as a whole leading label, and no IP address (never sent as SNI).
            let bare = n.strip_prefix("*.").unwrap_or(n);
            if bare.is_empty()
                || !valid_host(bare.as_bytes())
                || bare.contains([':', '*'])
                || bare.ends_with('.')
                || bare.parse::<std::net::IpAddr>().is_ok()
            {
                return Err(ctx.error(
                    cr.names.span(),
                    format!("`{n}` is not a host name (or `*.` and one) a client can send as SNI"),
                ));
            }
            if !seen_names.insert(n.to_ascii_lowercase()) {
                return Err(ctx.error(
                    cr.names.span(),
                    format!("`{n}` is named by two sni certificates (one would win silently)"),
                ));
            }
        }
        sni.push(CertSpec {
            cert: resolve_path(&ctx.base_dir, cr.cert.get_ref()),
            key: resolve_path(&ctx.base_dir, cr.key.get_ref()),
            names: cr.names.get_ref().clone(),
        });
    }
    let spec = TlsSpec {
        default: CertSpec {
            cert: resolve_path(&ctx.base_dir, r.cert.get_ref()),
            key: resolve_path(&ctx.base_dir, r.key.get_ref()),
            names: Vec::new(),
        },
        sni,
        min_version_13,
        strict_sni: r.strict_sni.unwrap_or(true),
        handshake_timeout: ctx
            .duration(&r.handshake_timeout, std::time::Duration::from_secs(10))?,
        h2,
    };
    crate::tls::build(&spec).map_err(|e| ctx.error(t.span(), e))
}

fn compile_http2(
    ctx: &Ctx<'_>,
    raw: &RawConfig,
    http: &HttpConfig,
) -> Result<super::Http2Config, ConfigError> {
    let h = &raw.http2;
    Ok(super::Http2Config {
        enabled: h.enabled.unwrap_or(true),
        max_concurrent_streams: ctx.int(
            &h.max_concurrent_streams,
            100,
            1..10_000,
            "http2.max_concurrent_streams",
        )? as u32,
        initial_stream_window: ctx.int(
            &h.initial_stream_window,
            256 * 1024,
            65_535..(1 << 31) - 1,
            "http2.initial_stream_window",
        )? as u32,
        initial_connection_window: ctx.int(
            &h.initial_connection_window,
            1024 * 1024,
            65_535..(1 << 31) - 1,
            "http2.initial_connection_window",
        )? as u32,
        max_buffered_bytes: ctx.int(
            &h.max_buffered_bytes,
            1024 * 1024,
            64 * 1024..1 << 30,
            "http2.max_buffered_bytes",
        )? as usize,
        max_frame_size: ctx.int(
            &h.max_frame_size,
            16_384,
            16_384..16_777_215,
            "http2.max_frame_size",
        )? as u32,
        max_header_list_bytes: {
            let n = ctx.int(
                &h.max_header_list_bytes,
                http.limits.max_head_bytes as u64,
                1024..1024 * 1024,
                "http2.max_header_list_bytes",
            )?;
            // A stream's head goes through the HTTP/1.1 head limit too: above it, a list
            // would be decoded whole only to be answered 431.
            if n > http.limits.max_head_bytes as u64 {
                let span = h.max_header_list_bytes.as_ref().map_or(0..0, |v| v.span());
                let why = "http2.max_header_list_bytes must not exceed http.max_head_bytes";
                return Err(ctx.error(span, why.to_string()));
            }
            n as u32
        },
        max_pending_accept_reset_streams: ctx.int(
            &h.max_pending_accept_reset_streams,
            20,
            1..10_000,
            "http2.max_pending_accept_reset_streams",
        )? as usize,
        max_local_error_reset_streams: ctx.int(
            &h.max_local_error_reset_streams,
            1024,
            1..1_000_000,
            "http2.max_local_error_reset_streams",
        )? as usize,
    })
}

fn compile_http(ctx: &Ctx<'_>, raw: &RawConfig) -> Result<HttpConfig, ConfigError> {
    let h = &raw.http;
    let d = HttpConfig::default();
    let max_head_bytes = ctx.int(
        &h.max_head_bytes,
        d.limits.max_head_bytes as u64,
        1024..1024 * 1024,
        "http.max_head_bytes",
    )? as usize;
    let max_headers = ctx.int(
        &h.max_headers,
        d.limits.max_headers as u64,
        1..MAX_HEADERS_HARD_LIMIT as u64,
        "http.max_headers",
    )? as usize;
    // Route matching keeps path offsets in 16 bits: a request line (and so a path) never
    // exceeds 65,535 bytes, so no route is ever skipped for a long path (414 comes first).
    let line_cap = max_head_bytes.min(crate::route::MAX_PATH_BYTES);
    let max_request_line_bytes = ctx.int(
        &h.max_request_line_bytes,
        (d.limits.max_request_line_bytes.min(line_cap)) as u64,
        64..line_cap as u64,
        "http.max_request_line_bytes",
    )? as usize;
    let max_request_body_bytes = match ctx.int(
        &h.max_request_body_bytes,
        0,
        0..i64::MAX as u64,
        "http.max_request_body_bytes",
    )? {
        0 => None,
        n => Some(n),
    };
    let max_connections = ctx.int(
        &h.max_connections,
        d.max_connections as u64,
        1..1_000_000,
        "http.max_connections",
    )? as usize;
    Ok(HttpConfig {
        limits: HeadLimits {
            max_head_bytes,
            max_headers,
            max_request_line_bytes,
            encoded_slashes: ctx.keep(&h.encoded_slashes, false, "http.encoded_slashes")?,
            reject_repeated_slashes: !ctx.keep(
                &h.repeated_slashes,
                true,
                "http.repeated_slashes",
            )?,
            path_parameters: ctx.keep(&h.path_parameters, false, "http.path_parameters")?,
        },
        max_request_body_bytes,
        max_connections,
        header_timeout: ctx.duration(&h.header_timeout, d.header_timeout)?,
        idle_timeout: ctx.duration(&h.idle_timeout, d.idle_timeout)?,
        body_timeout: ctx.duration(&h.body_timeout, d.body_timeout)?,
        send_timeout: ctx.duration(&h.send_timeout, d.send_timeout)?,
        tunnel_idle_timeout: ctx.duration(&h.tunnel_idle_timeout, d.tunnel_idle_timeout)?,
        buffer_pool_bytes: ctx.int(
            &h.buffer_pool_bytes,
            d.buffer_pool_bytes as u64,
            0..(1 << 40),
            "http.buffer_pool_bytes",
        )? as usize,
        client_close_check: match &h.client_close_check {
            Some(v) if v.get_ref() == "off" => None,
            Some(_) => Some(ctx.duration(&h.client_close_check, Duration::ZERO)?),
            None => d.client_close_check,
        },
        idle_buffer_release: match &h.idle_buffer_release {
            Some(v) if v.get_ref() == "off" => None,
            Some(_) => Some(ctx.duration(&h.idle_buffer_release, Duration::ZERO)?),
            None => d.idle_buffer_release,
        },
        reserved_paths: h.reserved_paths.unwrap_or(d.reserved_paths),
    })
}

fn compile_upstream(ctx: &Ctx<'_>, u: &RawUpstream) -> Result<UpstreamConfig, ConfigError> {
    let name = u.name.get_ref().trim().to_string();
    if name.is_empty()
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        return Err(ctx.error(
            u.name.span(),
            "upstream names use letters, digits, '-', '_' and '.'",
        ));
    }
    if u.endpoints.get_ref().is_empty() {
        return Err(ctx.error(
            u.endpoints.span(),
            format!("upstream `{name}` has no endpoints"),
        ));
    }
    let mut endpoints = Vec::new();
    for e in u.endpoints.get_ref() {
        let (text, weight) = match e.get_ref() {
            RawEndpoint::Plain(t) => (t.as_str(), 1),
            RawEndpoint::Table(t) => {
                let w = t.weight.unwrap_or(1);
                if !(1..=1000).contains(&w) {
                    return Err(ctx.error(e.span(), "endpoint weight must be from 1 to 1000"));
                }
                (t.address.as_str(), w as u32)
            }
        };
        let mut spec = parse_endpoint(text.trim()).map_err(|why| ctx.error(e.span(), why))?;
        spec.weight = weight;
        // One entry per name: a weight says how much traffic an endpoint gets (and a name
        // listed twice would have its addresses twice, also in what a failed lookup keeps).
        if endpoints
            .iter()
            .any(|s: &super::EndpointSpec| s.authority.eq_ignore_ascii_case(&spec.authority))
        {
            return Err(ctx.error(
                e.span(),
                format!(
                    "endpoint `{}` is listed twice in upstream `{name}` (use `weight`)",
                    spec.authority
                ),
            ));
        }
        endpoints.push(spec);
    }
    let response_timeout = ctx.duration(&u.response_timeout, Duration::from_secs(15))?;
    let h2_stream_window = ctx.int(
        &u.h2_stream_window,
        256 * 1024,
        65_535..(1 << 31) - 1,
        "h2_stream_window",
    )? as u32;
    let h2_connection_window = ctx.int(
        &u.h2_connection_window,
        16 * 1024 * 1024,
        65_535..(1 << 31) - 1,
        "h2_connection_window",
    )? as u32;
    if h2_connection_window < h2_stream_window {
        let span = u.h2_connection_window.as_ref().map_or(0..0, |v| v.span());
        return Err(ctx.error(
            span,
            "h2_connection_window must be at least h2_stream_window",
        ));
    }
    let protocol = match u
        .protocol
        .as_ref()
        .map(|p| (p.get_ref().as_str(), p.span()))
    {
        None | Some(("http1", _)) => super::UpstreamProtocol::Http1,
        Some(("h2c", _)) => super::UpstreamProtocol::H2c,
        Some(("h2", _)) => super::UpstreamProtocol::H2,
        Some((_, span)) => {
            return Err(ctx.error(
                span,
                "protocol must be \"http1\", \"h2c\" or \"h2\" (HTTP/2 over TLS)",
            ))
        }
    };
    // Keys of the other kind of connection pool would be taken and ignored.
    if protocol == super::UpstreamProtocol::Http1 {
        let h2_only = [
            u.h2_connections.as_ref().map(|v| v.span()),
            u.h2_stream_window.as_ref().map(|v| v.span()),
            u.h2_connection_window.as_ref().map(|v| v.span()),
            u.h2_keepalive.as_ref().map(|v| v.span()),
        ];
        if let Some(span) = h2_only.into_iter().flatten().next() {
            return Err(ctx.error(
                span,
                "this key applies to HTTP/2 upstreams only (`protocol = \"h2\"` or `\"h2c\"`)",
            ));
        }
    } else if let Some(v) = &u.pool_max_idle {
        return Err(ctx.error(
            v.span(),
            "pool_max_idle applies to HTTP/1.1 upstreams; an HTTP/2 upstream keeps \
             `h2_connections` connections per endpoint",
        ));
    }
    Ok(UpstreamConfig {
        name,
        endpoints,
        balancer: compile_balancer(ctx, &u.balancer)?,
        max_connections: ctx.int(&u.max_connections, 0, 0..1_000_000, "max_connections")? as u32,
        max_pending: ctx.int(&u.max_pending, 1024, 0..1_000_000, "max_pending")? as u32,
        rate_limit: match &u.rate_limit {
            None => None,
            Some(r) => {
                let r = r.get_ref();
                Some(RateLimitConfig {
                    max_rps: ctx.int(
                        &Some(r.max_rps.clone()),
                        0,
                        1..10_000_000,
                        "rate_limit.max_rps",
                    )? as u32,
                    burst: ctx.int(&r.burst, 0, 0..10_000_000, "rate_limit.burst")? as u32,
                })
            }
        },
        health_check: match &u.health_check {
            None => None,
            // Probes speak HTTP/1.1 (over TLS when the upstream has `tls`): an HTTP/2-only
            // upstream would fail every probe, and health checking would quietly stop.
            Some(h) if protocol != super::UpstreamProtocol::Http1 => return Err(ctx.error(
                h.span(),
                "health_check probes use HTTP/1.1: not available with protocol = \"h2\" or \"h2c\"",
            )),
            Some(h) => Some(compile_health_check(ctx, h)?),
        },
        outlier: match &u.outlier {
            None => Some(OutlierConfig::default()),
            Some(o) => {
                let o = o.get_ref();
                let d = OutlierConfig::default();
                let base = ctx.duration(&o.base_ejection, d.base_ejection)?;
                let consecutive_failures = ctx.int(
                    &o.consecutive_failures,
                    u64::from(d.consecutive_failures),
                    0..1000,
                    "outlier.consecutive_failures",
                )? as u32;
                (consecutive_failures > 0).then_some(OutlierConfig {
                    consecutive_failures,
                    base_ejection: base,
                    max_ejection: ctx.duration(&o.max_ejection, d.max_ejection)?.max(base),
                    max_ejection_percent: ctx.int(
                        &o.max_ejection_percent,
                        u64::from(d.max_ejection_percent),
                        0..100,
                        "outlier.max_ejection_percent",
                    )? as u32,
                    on_5xx: o.on_5xx.unwrap_or(d.on_5xx),
                })
            }
        },
        breaker: match &u.breaker {
            None => BreakerConfig::default(),
            Some(b) => {
                let b = b.get_ref();
                BreakerConfig {
                    failure_threshold: ctx.int(
                        &b.failure_threshold,
                        5,
                        0..100_000,
                        "breaker.failure_threshold",
                    )? as u32,
                    open_duration: ctx.duration(&b.open_duration, Duration::from_secs(30))?,
                    half_open_max: ctx.int(
                        &b.half_open_max,
                        1,
                        1..10_000,
                        "breaker.half_open_max",
                    )? as u32,
                }
            }
        },
        retries: match &u.retries {
            None => RetryPolicy::default(),
            Some(r) => compile_retries(ctx, r.get_ref())?,
        },
        retry_budget: match &u.retry_budget {
            None => RetryBudgetConfig::default(),
            Some(b) => {
                let b = b.get_ref();
                let d = RetryBudgetConfig::default();
                RetryBudgetConfig {
                    percent: ctx.int(
                        &b.percent,
                        d.percent as u64,
                        0..100,
                        "retry_budget.percent",
                    )? as u32,
                    min_per_second: ctx.int(
                        &b.min_per_second,
                        d.min_per_second as u64,
                        0..1_000_000,
                        "retry_budget.min_per_second",
                    )? as u32,
                    max_concurrent: ctx.int(
                        &b.max_concurrent,
                        d.max_concurrent as u64,
                        0..1_000_000,
                        "retry_budget.max_concurrent",
                    )? as u32,
                }
            }
        },
        connect_timeout: ctx.duration(&u.connect_timeout, Duration::from_secs(5))?,
        response_timeout,
        read_timeout: ctx.duration(&u.read_timeout, Duration::from_secs(60))?,
        pool_max_idle: ctx.int(&u.pool_max_idle, 64, 0..100_000, "pool_max_idle")? as usize,
        pool_idle_timeout: ctx.duration(&u.pool_idle_timeout, Duration::from_secs(30))?,
        protocol,
        tls: compile_upstream_tls(ctx, u, protocol)?,
        h2_connections: ctx.int(&u.h2_connections, 2, 1..64, "h2_connections")? as usize,
        h2_stream_window,
        h2_connection_window,
        h2_keepalive: match &u.h2_keepalive {
            None => None,
            // Each interval a PING goes out, and must be answered within the next.
            Some(v) => match ctx.duration(&u.h2_keepalive, Duration::ZERO)? {
                d if d >= MIN_H2_KEEPALIVE => Some(d),
                _ => {
                    let why = "h2_keepalive must be at least \"100ms\"";
                    return Err(ctx.error(v.span(), why.to_string()));
                }
            },
        },
    })
}

/// An upstream's `tls`: `true` (system trust store) or a table.
fn compile_upstream_tls(
    ctx: &Ctx<'_>,
    u: &RawUpstream,
    protocol: super::UpstreamProtocol,
) -> Result<Option<std::sync::Arc<crate::tls::client::UpstreamTls>>, ConfigError> {
    use super::raw::{RawUpstreamTls, RawUpstreamTlsTable};
    use crate::tls::client::UpstreamTlsSpec;
    let empty = RawUpstreamTlsTable::default();
    let (t, span) = match u.tls.as_ref().map(|t| (t.get_ref(), t.span())) {
        None | Some((RawUpstreamTls::Flag(false), _)) => {
            if protocol == super::UpstreamProtocol::H2 {
                let span = u.protocol.as_ref().map_or(0..0, |p| p.span());
                return Err(ctx.error(span, "protocol = \"h2\" is HTTP/2 over TLS: set `tls`"));
            }
            return Ok(None);
        }
        Some((RawUpstreamTls::Flag(true), span)) => (&empty, span),
        Some((RawUpstreamTls::Table(t), span)) => (t, span),
    };
    let path = |p: &String| crate::tls::resolve_path(&ctx.base_dir, p);
    let client_cert = match (&t.client_cert, &t.client_key) {
        (Some(c), Some(k)) => Some((path(c), path(k))),
        (None, None) => None,
        _ => return Err(ctx.error(span, "tls.client_cert and tls.client_key go together")),
    };
    if t.insecure_skip_verify == Some(true) && t.ca_file.is_some() {
        return Err(ctx.error(
            span,
            "tls.ca_file has no use with insecure_skip_verify = true (nothing is verified)",
        ));
    }
    let spec = UpstreamTlsSpec {
        ca_file: t.ca_file.as_ref().map(path),
        server_name: t.server_name.clone(),
        client_cert,
        insecure_skip_verify: t.insecure_skip_verify.unwrap_or(false),
    };
    let alpn: &[&[u8]] = match protocol {
        super::UpstreamProtocol::H2 => &[b"h2"],
        _ => &[b"http/1.1"],
    };
    crate::tls::client::build(&spec, alpn)
        .map(|t| Some(std::sync::Arc::new(t)))
        .map_err(|e| ctx.error(span, e))
}

fn compile_balancer(
    ctx: &Ctx<'_>,
    b: &Option<Spanned<RawBalancer>>,
) -> Result<BalancerConfig, ConfigError> {
    let Some(b) = b else {
        return Ok(BalancerConfig::P2cEwma);
    };
    let bad = |why: &str| ctx.error(b.span(), why.to_string());
    let simple = |name: &str| match name {
        "p2c_ewma" => Some(BalancerConfig::P2cEwma),
        "round_robin" => Some(BalancerConfig::RoundRobin),
        "weighted" => Some(BalancerConfig::Weighted),
        "least_conn" => Some(BalancerConfig::LeastConn),
        "ip_hash" => Some(BalancerConfig::IpHash),
        _ => None,
    };
    match b.get_ref() {
        RawBalancer::Name(n) => simple(n).ok_or_else(|| {
            bad("balancer must be p2c_ewma, round_robin, weighted, least_conn, ip_hash, or a table for cookie_hash / consistent_hash")
        }),
        RawBalancer::Table(t) => match t.kind.as_str() {
            "cookie_hash" => match (&t.cookie, &t.header, t.client_ip) {
                (Some(c), None, None) if !c.is_empty() => Ok(BalancerConfig::CookieHash(c.clone())),
                _ => Err(bad("cookie_hash takes `cookie = \"name\"`")),
            },
            "consistent_hash" => match (&t.cookie, &t.header, t.client_ip) {
                (Some(c), None, None) if !c.is_empty() => Ok(BalancerConfig::ConsistentHash(HashKey::Cookie(c.clone()))),
                (None, Some(h), None) if !h.is_empty() && h.bytes().all(is_tchar) => {
                    Ok(BalancerConfig::ConsistentHash(HashKey::Header(h.to_ascii_lowercase())))
                }
                (None, None, Some(true)) => Ok(BalancerConfig::ConsistentHash(HashKey::ClientIp)),
                _ => Err(bad("consistent_hash takes one of `header = \"name\"`, `cookie = \"name\"`, `client_ip = true`")),
            },
            other => simple(other)
                .filter(|_| t.cookie.is_none() && t.header.is_none() && t.client_ip.is_none())
                .ok_or_else(|| bad("unknown balancer type, or keys it does not take")),
        },
    }
}

fn compile_health_check(
    ctx: &Ctx<'_>,
    h: &Spanned<RawHealthCheck>,
) -> Result<HealthCheckConfig, ConfigError> {
    let r = h.get_ref();
    let path = match &r.path {
        None => "/".to_string(),
        Some(p)
            if p.get_ref().starts_with('/')
                && p.get_ref().bytes().all(|b| (0x21..0x7f).contains(&b)) =>
        {
            p.get_ref().clone()
        }
        Some(p) => {
            return Err(ctx.error(
                p.span(),
                "health_check.path must start with '/' and contain no spaces",
            ))
        }
    };
    let expect_status = match &r.expect_status {
        None => 0,
        Some(s) if *s.get_ref() == 0 || (100..=599).contains(s.get_ref()) => *s.get_ref() as u16,
        Some(s) => {
            return Err(ctx.error(
                s.span(),
                "health_check.expect_status must be a status code, or 0 for any 2xx or 3xx",
            ))
        }
    };
    let interval = ctx.duration(&r.interval, Duration::from_secs(5))?;
    if interval < MIN_HEALTH_INTERVAL {
        let span = r.interval.as_ref().map_or(0..0, |t| t.span());
        return Err(ctx.error(span, "health_check.interval must be at least 50ms"));
    }
    let timeout = ctx.duration(&r.timeout, Duration::from_secs(1))?;
    // The probes of a round run together and the next round waits for them: a long timeout
    // would let one endpoint that never answers hold up every upstream's checks, and
    // shutdown.
    if timeout > MAX_HEALTH_TIMEOUT {
        let span = r.timeout.as_ref().map_or(0..0, |t| t.span());
        return Err(ctx.error(span, "health_check.timeout must be at most 30s"));
    }
    Ok(HealthCheckConfig {
        path,
        expect_status,
        interval,
        timeout,
        healthy_threshold: ctx.int(
            &r.healthy_threshold,
            2,
            1..1000,
            "health_check.healthy_threshold",
        )? as u32,
        unhealthy_threshold: ctx.int(
            &r.unhealthy_threshold,
            3,
            1..1000,
            "health_check.unhealthy_threshold",
        )? as u32,
        jitter_percent: ctx.int(&r.jitter_percent, 10, 0..100, "health_check.jitter_percent")?
            as u32,
    })
}

/// Longest health probe timeout accepted.
const MAX_HEALTH_TIMEOUT: Duration = Duration::from_secs(30);

/// Shortest `health_check.interval`: the checker looks at its endpoints this often.
const MIN_HEALTH_INTERVAL: Duration = Duration::from_millis(50);

/// Shortest `h2_keepalive`.
const MIN_H2_KEEPALIVE: Duration = Duration::from_millis(100);

/// Largest `respond.body_file`: read into memory on every load and reload.
const MAX_BODY_FILE_BYTES: u64 = 1024 * 1024;

/// A `body_file`'s content: a regular file of at most [`MAX_BODY_FILE_BYTES`] (not a device
/// that never ends, nor a pipe that blocks the reload until a writer comes).
fn read_body_file(path: &std::path::Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    // Looked at before it is opened: opening a pipe waits for a writer.
    if !std::fs::metadata(path)?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    let file = std::fs::File::open(path)?;
    let mut body = Vec::new();
    file.take(MAX_BODY_FILE_BYTES + 1).read_to_end(&mut body)?;
    if body.len() as u64 > MAX_BODY_FILE_BYTES {
        return Err(std::io::Error::other("larger than 1 MiB"));
    }
    Ok(body)
}

fn compile_retries(ctx: &Ctx<'_>, r: &RawRetries) -> Result<RetryPolicy, ConfigError> {
    let d = RetryPolicy::default();
    let retry_on = match &r.retry_on {
        None => d.retry_on,
        Some(list) => {
            let mut on = RetryOn::default();
            for item in list {
                match item.get_ref().as_str() {
                    "connect_failure" => on.connect_failure = true,
                    "reset" => on.reset = true,
                    "5xx" => on.status_5xx = true,
                    "gateway_error" => on.gateway_error = true,
                    other => {
                        return Err(ctx.error(
                            item.span(),
                            format!("unknown retry_on `{other}`: use connect_failure, reset, 5xx, gateway_error"),
                        ))
                    }
                }
            }
            on
        }
    };
    Ok(RetryPolicy {
        attempts: ctx.int(&r.attempts, d.attempts as u64, 1..10, "retries.attempts")? as u32,
        per_try_timeout: r
            .per_try_timeout
            .as_ref()
            .map(|t| parse_duration(t.get_ref()).map_err(|why| ctx.error(t.span(), why)))
            .transpose()?,
        backoff_base: ctx.duration(&r.backoff_base, d.backoff_base)?,
        backoff_max: ctx.duration(&r.backoff_max, d.backoff_max)?,
        retry_on,
        retry_post: r.retry_post.unwrap_or(false),
        buffer_max_bytes: ctx.int(
            &r.buffer_max_bytes,
            0,
            0..64 * 1024 * 1024,
            "retries.buffer_max_bytes",
        )? as usize,
        total_timeout: ctx.duration(&r.total_timeout, d.total_timeout)?,
    })
}

/// `host:port`, where host is an IPv4 address, a bracketed IPv6 address or a DNS name.
fn parse_endpoint(text: &str) -> Result<EndpointSpec, String> {
    if let Ok(addr) = text.parse::<SocketAddr>() {
        if addr.port() == 0 || addr.ip().is_unspecified() {
            return Err(format!(
                "endpoint `{text}` names no peer (port 0 or an unspecified address)"
            ));
        }
        return Ok(EndpointSpec {
            authority: text.to_string(),
            host: addr.ip().to_string(),
            port: addr.port(),
            literal: Some(addr),
            weight: 1,
        });
    }
    let bad = || {
        format!(
            "endpoint `{text}` is not host:port (like \"10.0.0.5:8080\" or \"api.internal:80\")"
        )
    };
    let (host, port) = text.rsplit_once(':').ok_or_else(bad)?;
    let port: u16 = port.parse().map_err(|_| bad())?;
    let name_ok = !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        });
    if port == 0 || !name_ok {
        return Err(bad());
    }
    Ok(EndpointSpec {
        authority: text.to_string(),
        host: host.to_string(),
        port,
        literal: None,
        weight: 1,
    })
}

fn compile_route(
    ctx: &Ctx<'_>,
    index: usize,
    r: &RawRoute,
    span: Range<usize>,
    upstreams: &[UpstreamConfig],
) -> Result<Route, ConfigError> {
    let name = match &r.name {
        Some(n) => n.get_ref().clone(),
        None => format!("route-{}", index + 1),
    };
    let priority = match &r.priority {
        None => 0,
        Some(p) => i32::try_from(*p.get_ref())
            .ok()
            .filter(|p| (-1000..=1000).contains(p))
            .ok_or_else(|| ctx.error(p.span(), "priority must be from -1000 to 1000"))?,
    };
    let priority_class = ctx.int(&r.priority_class, 5, 0..10, "priority_class")? as u8;
    let host = match &r.host {
        None => HostMatch::Any,
        Some(h) => compile_host(h.get_ref()).map_err(|why| ctx.error(h.span(), why))?,
    };
    let path = compile_path_match(ctx, r, span.clone(), &name)?;
    let criteria = compile_criteria(ctx, r)?;
    let actions = [r.proxy.is_some(), r.redirect.is_some(), r.respond.is_some()];
    if actions.iter().filter(|a| **a).count() != 1 {
        return Err(ctx.error(
            span,
            format!("route `{name}` needs exactly one action: `proxy = \"<upstream>\"`, `redirect = {{ ... }}` or `respond = {{ ... }}`"),
        ));
    }
    let proxy_only = [
        r.strip_prefix.as_ref().map(|s| s.span()),
        r.add_prefix.as_ref().map(|s| s.span()),
        r.rewrite.as_ref().map(|s| s.span()),
        r.preserve_host.as_ref().map(|s| s.span()),
        r.response_timeout.as_ref().map(|s| s.span()),
        r.read_timeout.as_ref().map(|s| s.span()),
        // Only proxied requests take a slot of the gateway cap (and its reserve).
        r.priority_class.as_ref().map(|s| s.span()),
    ];
    let action = if let Some(p) = &r.proxy {
        let upstream = upstreams
            .iter()
            .position(|u| u.name == *p.get_ref())
            .ok_or_else(|| {
                let known: Vec<&str> = upstreams.iter().map(|u| u.name.as_str()).collect();
                ctx.error(
                    p.span(),
                    format!(
                        "route `{name}` proxies to upstream `{}`, which is not defined (defined: {})",
                        p.get_ref(),
                        if known.is_empty() { "none".to_string() } else { known.join(", ") }
                    ),
                )
            })?;
        let slash_prefix = |v: &Option<Spanned<String>>,
                            key: &str|
         -> Result<Option<String>, ConfigError> {
            match v {
                None => Ok(None),
                Some(s)
                    if s.get_ref().starts_with('/')
                        && valid_path_bytes(s.get_ref())
                        && crate::http1::head::path_ambiguity(s.get_ref().as_bytes()).is_none() =>
                {
                    Ok(Some(s.get_ref().clone()))
                }
                Some(s) => Err(ctx.error(
                    s.span(),
                    format!(
                        "{key} must start with '/' and be a valid path without dot-segments \
                             or backslashes"
                    ),
                )),
            }
        };
        let strip = slash_prefix(&r.strip_prefix, "strip_prefix")?;
        let add = slash_prefix(&r.add_prefix, "add_prefix")?;
        let rewrite = match &r.rewrite {
            Some(rw) if strip.is_some() || add.is_some() => {
                return Err(ctx.error(
                    rw.span(),
                    "use either `rewrite` or `strip_prefix`/`add_prefix`, not both",
                ))
            }
            Some(rw) => {
                let raw = rw.get_ref();
                PathRewrite::Regex(
                    RegexRewrite::new(raw.pattern.get_ref(), raw.replacement.get_ref())
                        .map_err(|why| ctx.error(raw.pattern.span(), why))?,
                )
            }
            None if strip.is_some() || add.is_some() => PathRewrite::Prefix { strip, add },
            None => PathRewrite::None,
        };
        let opt_duration = |v: &Option<Spanned<String>>| -> Result<Option<Duration>, ConfigError> {
            v.as_ref()
                .map(|d| parse_duration(d.get_ref()).map_err(|why| ctx.error(d.span(), why)))
                .transpose()
        };
        Action::Proxy(ProxyAction {
            upstream,
            rewrite,
            preserve_host: r.preserve_host.as_ref().is_some_and(|p| *p.get_ref()),
            response_timeout: opt_duration(&r.response_timeout)?,
            read_timeout: opt_duration(&r.read_timeout)?,
        })
    } else {
        if let Some(span) = proxy_only.into_iter().flatten().next() {
            return Err(ctx.error(span, "this key applies to proxy routes only"));
        }
        if let Some(rd) = &r.redirect {
            Action::Redirect(compile_redirect(ctx, rd)?)
        } else if let Some(resp) = &r.respond {
            Action::Respond(compile_respond(ctx, resp)?)
        } else {
            unreachable_action(ctx, span.clone())?
        }
    };
    let limits = match &r.limits {
        None => RouteLimits::default(),
        Some(l) => {
            let l = l.get_ref();
            RouteLimits {
                max_body_bytes: l
                    .max_body_bytes
                    .as_ref()
                    .map(|v| {
                        ctx.int(
                            &Some(v.clone()),
                            0,
                            0..i64::MAX as u64,
                            "limits.max_body_bytes",
                        )
                        // 0: no limit, as for `http.max_request_body_bytes`.
                        .map(|n| (n > 0).then_some(n))
                    })
                    .transpose()?,
                max_head_bytes: l
                    .max_head_bytes
                    .as_ref()
                    .map(|v| {
                        ctx.int(
                            &Some(v.clone()),
                            0,
                            64..1024 * 1024,
                            "limits.max_head_bytes",
                        )
                        .map(|n| n as usize)
                    })
                    .transpose()?,
            }
        }
    };
    let maintenance = match &r.maintenance {
        None => None,
        Some(m) => {
            let m = m.get_ref();
            if m.message
                .as_deref()
                .is_some_and(|t| t.chars().any(char::is_control))
            {
                return Err(ctx.error(
                    span,
                    "maintenance.message may not contain control characters",
                ));
            }
            if m.message
                .as_ref()
                .is_some_and(|t| t.len() > MAX_LOCAL_TEXT_BYTES)
            {
                return Err(ctx.error(
                    span,
                    format!("maintenance.message may be at most {MAX_LOCAL_TEXT_BYTES} bytes"),
                ));
            }
            Some(Maintenance {
                message: m
                    .message
                    .clone()
                    .unwrap_or_else(|| "this route is down for maintenance".to_string()),
                retry_after: {
                    // Retry-After is whole seconds.
                    let d = ctx.duration(&m.retry_after, Duration::from_secs(60))?;
                    if d.subsec_nanos() != 0 {
                        let span = m.retry_after.as_ref().map_or(0..0, |t| t.span());
                        let why = "maintenance.retry_after must be whole seconds";
                        return Err(ctx.error(span, why.to_string()));
                    }
                    d
                },
            })
        }
    };
    Ok(Route {
        name,
        index,
        priority,
        priority_class,
        host,
        path,
        criteria,
        action,
        limits,
        maintenance,
    })
}

fn unreachable_action(ctx: &Ctx<'_>, span: Range<usize>) -> Result<Action, ConfigError> {
    // invariant: exactly one action was checked above.
    Err(ctx.error(span, "a route needs an action"))
}

fn valid_path_bytes(p: &str) -> bool {
    p.bytes()
        .all(|b| (0x21..0x7f).contains(&b) && b != b'?' && b != b'#')
}

/// `example.com`, `Example.COM:8080` (port ignored) or `*.example.com`.
fn compile_host(text: &str) -> Result<HostMatch, String> {
    let text = text.trim().to_ascii_lowercase();
    if let Some(suffix) = text.strip_prefix("*.") {
        if suffix.is_empty()
            || suffix.contains('*')
            || !valid_host(suffix.as_bytes())
            || suffix.contains(':')
        {
            return Err(format!(
                "`{text}` is not a valid wildcard host (like \"*.example.com\")"
            ));
        }
        // One trailing dot (the absolute form) is dropped, as requests' hosts lose theirs.
        let suffix = suffix.strip_suffix('.').unwrap_or(suffix);
        if suffix.is_empty() || suffix.ends_with('.') {
            return Err(format!(
                "`{text}` is not a valid wildcard host (like \"*.example.com\")"
            ));
        }
        return Ok(HostMatch::Wildcard(format!(".{suffix}")));
    }
    if text.is_empty() || text.contains('*') || !valid_host(text.as_bytes()) {
        return Err(format!("`{text}` is not a valid host name"));
    }
    let (host, _) = crate::http1::head::split_host_port(text.as_bytes());
    let host = String::from_utf8_lossy(host)
        .trim_end_matches('.')
        .to_string();
    Ok(HostMatch::Exact(host))
}

fn compile_path_match(
    ctx: &Ctx<'_>,
    r: &RawRoute,
    span: Range<usize>,
    name: &str,
) -> Result<PathMatch, ConfigError> {
    let given: Vec<(&str, &Spanned<String>)> = [
        ("path", &r.path),
        ("path_template", &r.path_template),
        ("path_prefix", &r.path_prefix),
        ("path_regex", &r.path_regex),
    ]
    .into_iter()
    .filter_map(|(k, v)| v.as_ref().map(|v| (k, v)))
    .collect();
    let (key, value) = match given.as_slice() {
        [one] => *one,
        [] => {
            return Err(ctx.error(
                span,
                format!(
                    "route `{name}` needs one of path, path_template, path_prefix or path_regex"
                ),
            ))
        }
        [_, (k, v), ..] => {
            return Err(ctx.error(
                v.span(),
                format!("route `{name}` has more than one path matcher (`{k}` too)"),
            ))
        }
    };
    let text = value.get_ref();
    let bad = |why: String| ctx.error(value.span(), why);
    match key {
        "path" | "path_prefix" => {
            if !text.starts_with('/') || !valid_path_bytes(text) {
                return Err(bad(format!("{key} `{text}` must start with '/' and contain no spaces, control characters, '?' or '#'")));
            }
            Ok(if key == "path" {
                PathMatch::Exact(text.clone())
            } else {
                PathMatch::Prefix(text.clone())
            })
        }
        "path_template" => Template::parse(text).map(PathMatch::Template).map_err(bad),
        _ => {
            crate::route::regex_builder()
                .build(text)
                .map_err(|e| bad(format!("invalid path_regex: {e}")))?;
            Ok(PathMatch::Regex(text.clone()))
        }
    }
}

/// A criterion's name and value match.
type NamedMatch = (Box<[u8]>, ValueMatch);

fn compile_value_matches(
    ctx: &Ctx<'_>,
    map: &Option<BTreeMap<String, Spanned<RawValueMatch>>>,
    what: &str,
    lowercase: bool,
) -> Result<Vec<NamedMatch>, ConfigError> {
    let mut out = Vec::new();
    for (name, v) in map.iter().flatten() {
        if name.is_empty() || (lowercase && !name.bytes().all(is_tchar)) {
            return Err(ctx.error(v.span(), format!("`{name}` is not a valid {what} name")));
        }
        let key: Box<[u8]> = if lowercase {
            name.to_ascii_lowercase().into_bytes().into()
        } else {
            name.as_bytes().into()
        };
        let m = match v.get_ref() {
            RawValueMatch::Present(true) => ValueMatch::Present,
            RawValueMatch::Present(false) => {
                return Err(ctx.error(
                    v.span(),
                    format!(
                        "{what} `{name}`: use a string for an exact value or `true` for presence"
                    ),
                ))
            }
            RawValueMatch::Exact(s) => ValueMatch::Exact(s.as_bytes().into()),
        };
        out.push((key, m));
    }
    Ok(out)
}

fn compile_criteria(ctx: &Ctx<'_>, r: &RawRoute) -> Result<Criteria, ConfigError> {
    let mut methods = Vec::new();
    for m in r.methods.iter().flatten() {
        let t = m.get_ref();
        if t.is_empty() || !t.bytes().all(is_tchar) {
            return Err(ctx.error(m.span(), format!("`{t}` is not a method token")));
        }
        methods.push(t.as_bytes().into());
    }
    let accept = match &r.accept {
        None => None,
        Some(a) => Some(MediaType::parse(a.get_ref()).ok_or_else(|| {
            ctx.error(
                a.span(),
                format!(
                    "`{}` is not a media type like \"application/json\"",
                    a.get_ref()
                ),
            )
        })?),
    };
    Ok(Criteria {
        methods,
        headers: compile_value_matches(ctx, &r.headers, "header", true)?,
        query: compile_value_matches(ctx, &r.query, "query parameter", false)?,
        cookies: compile_value_matches(ctx, &r.cookies, "cookie", false)?,
        accept,
    })
}

fn compile_redirect(ctx: &Ctx<'_>, rd: &Spanned<RawRedirect>) -> Result<Redirect, ConfigError> {
    let r = rd.get_ref();
    let status = match &r.status {
        None => 302,
        Some(s) if [301, 302, 303, 307, 308].contains(s.get_ref()) => *s.get_ref() as u16,
        Some(s) => {
            return Err(ctx.error(
                s.span(),
                "redirect.status must be 301, 302, 303, 307 or 308",
            ))
        }
    };
    let scheme = match &r.scheme {
        None => None,
        Some(s) if matches!(s.get_ref().as_str(), "http" | "https") => Some(s.get_ref().clone()),
        Some(s) => return Err(ctx.error(s.span(), "redirect.scheme must be http or https")),
    };
    let host = match &r.host {
        None => None,
        Some(h)
            if !h.get_ref().is_empty()
                && !h.get_ref().contains(':')
                && valid_host(h.get_ref().as_bytes()) =>
        {
            Some(h.get_ref().to_ascii_lowercase())
        }
        Some(h) => {
            return Err(ctx.error(
                h.span(),
                "redirect.host must be a host name without a port (use redirect.port)",
            ))
        }
    };
    let port = match &r.port {
        None => None,
        Some(p) => Some(
            u16::try_from(*p.get_ref())
                .ok()
                .filter(|p| *p > 0)
                .ok_or_else(|| ctx.error(p.span(), "redirect.port must be from 1 to 65535"))?,
        ),
    };
    let path = match &r.path {
        None => None,
        Some(p) if p.get_ref().len() > MAX_LOCAL_TEXT_BYTES => {
            return Err(ctx.error(
                p.span(),
                format!("redirect.path may be at most {MAX_LOCAL_TEXT_BYTES} bytes"),
            ))
        }
        Some(p)
            if p.get_ref().starts_with('/')
                && p.get_ref()
                    .bytes()
                    .all(|b| (0x21..0x7f).contains(&b) && b != b'#') =>
        {
            Some(p.get_ref().clone())
        }
        Some(p) => {
            return Err(ctx.error(
                p.span(),
                "redirect.path must start with '/' and contain no spaces or control characters",
            ))
        }
    };
    if scheme.is_none() && host.is_none() && port.is_none() && path.is_none() {
        return Err(ctx.error(
            rd.span(),
            "a redirect must change something: set scheme, host, port or path",
        ));
    }
    Ok(Redirect {
        status,
        scheme,
        host,
        port,
        path,
    })
}

fn compile_respond(
    ctx: &Ctx<'_>,
    resp: &Spanned<RawRespond>,
) -> Result<LocalResponse, ConfigError> {
    let r = resp.get_ref();
    let status = *r.status.get_ref();
    if !(200..=599).contains(&status) {
        return Err(ctx.error(r.status.span(), "respond.status must be from 200 to 599"));
    }
    let body = match (&r.body, &r.body_file) {
        (Some(_), Some(f)) => {
            return Err(ctx.error(f.span(), "set `body` or `body_file`, not both"))
        }
        (Some(b), None) => b.clone().into_bytes(),
        (None, Some(f)) => {
            let path = ctx.base_dir.join(f.get_ref());
            read_body_file(&path).map_err(|e| {
                ctx.error(
                    f.span(),
                    format!("cannot read body_file {}: {e}", path.display()),
                )
            })?
        }
        (None, None) => Vec::new(),
    };
    if (status == 204 || status == 304) && !body.is_empty() {
        return Err(ctx.error(
            r.status.span(),
            format!("a {status} response has no body: remove `body`"),
        ));
    }
    if r.headers.len() > MAX_LOCAL_HEADERS {
        return Err(ctx.error(
            resp.span(),
            format!(
                "respond sets {} headers; at most {MAX_LOCAL_HEADERS}",
                r.headers.len()
            ),
        ));
    }
    let mut headers = Vec::new();
    for (name, value) in &r.headers {
        let valid_name = !name.is_empty() && name.bytes().all(is_tchar);
        if !valid_name {
            return Err(ctx.error(resp.span(), format!("`{name}` is not a valid header name")));
        }
        let kind = HeaderKind::classify(name.as_bytes());
        if kind == HeaderKind::ContentLength
            || kind.is_hop_by_hop()
            || kind == HeaderKind::XRequestId
            || name.eq_ignore_ascii_case("date")
        {
            return Err(ctx.error(
                value.span(),
                format!("header `{name}` is set by ringway and cannot be configured"),
            ));
        }
        if value
            .get_ref()
            .bytes()
            .any(|b| (b < 0x20 && b != b'\t') || b == 0x7f)
        {
            return Err(ctx.error(
                value.span(),
                format!("header `{name}` has a control character"),
            ));
        }
        headers.push((name.clone(), value.get_ref().clone()));
    }
    let bytes: usize = headers.iter().map(|(k, v)| k.len() + v.len() + 4).sum();
    if bytes > MAX_LOCAL_HEADER_BYTES {
        return Err(ctx.error(
            resp.span(),
            format!("respond.headers take {bytes} bytes; at most {MAX_LOCAL_HEADER_BYTES}"),
        ));
    }
    Ok(LocalResponse {
        status: status as u16,
        headers,
        body,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> ConfigError {
        compile(text, "t.toml").expect_err("must fail")
    }

    const MIN: &str = "[[listeners]]\naddress = \"127.0.0.1:8080\"\n";

    #[test]
    fn a_misspelt_key_in_a_scalar_or_table_value_is_named() {
        let up = |keys: &str| format!("{MIN}[[upstreams]]\nname = \"u\"\n{keys}\n");
        for (keys, said) in [
            (
                "endpoints = [{ adress = \"127.0.0.1:1\" }]",
                "unknown field `adress`",
            ),
            (
                "endpoints = [\"127.0.0.1:1\"]\ntls = { ca_fil = \"ca.pem\" }",
                "unknown field `ca_fil`",
            ),
            (
                "endpoints = [\"127.0.0.1:1\"]\nbalancer = { typ = \"ip_hash\" }",
                "unknown field `typ`",
            ),
            (
                "endpoints = [\"127.0.0.1:1\"]\ntls = \"yes\"",
                "`true`, `false` or a table",
            ),
            ("endpoints = [7]", "\"host:port\" or a table"),
        ] {
            let e = err(&up(keys)).to_string();
            assert!(e.contains(said), "{keys}: {e}");
        }
        // Both forms still read.
        let g = compile(
            &up(
                "endpoints = [\"127.0.0.1:1\", { address = \"127.0.0.1:2\", weight = 3 }]\n\
                 balancer = { type = \"consistent_hash\", header = \"x-user\" }",
            ),
            "t.toml",
        )
        .unwrap();
        assert_eq!(g.upstreams[0].endpoints.len(), 2);
    }

    #[test]
    fn request_lines_are_capped_at_what_routing_handles() {
        let e = err(&format!(
            "{MIN}[http]\nmax_head_bytes = 1048576\nmax_request_line_bytes = 70000\n"
        ));
        assert!(e.to_string().contains("65535"), "{e}");
        let g = compile(
            &format!("{MIN}[http]\nmax_head_bytes = 1048576\nmax_request_line_bytes = 65535\n"),
            "t.toml",
        )
        .unwrap();
        assert_eq!(g.http.limits.max_request_line_bytes, 65535);
    }

    #[test]
    fn the_shipped_configs_compile() {
        // The default config runs as is, and the example shows keys that exist, in range.
        for name in ["config/ringway.toml", "config/examples/reverse-proxy.toml"] {
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(name);
            if let Err(e) = crate::config::load(&path) {
                panic!("{name}: {e}");
            }
        }
    }

    #[test]
    fn both_wildcards_on_one_port_are_refused() {
        let e = err(
            "[[listeners]]\naddress = \"0.0.0.0:8080\"\n[[listeners]]\naddress = \"[::]:8080\"\n",
        );
        assert!(e.to_string().contains("takes IPv4 connections"), "{e}");
        // Other ports, or specific addresses, are fine.
        compile(
            "[[listeners]]\naddress = \"0.0.0.0:8080\"\n[[listeners]]\naddress = \"[::]:8081\"\n\
             [[listeners]]\naddress = \"[::1]:8080\"\n",
            "t.toml",
        )
        .unwrap();
    }

    #[test]
    fn an_endpoint_listed_twice_is_refused() {
        let e = err(&format!(
            "{MIN}[[upstreams]]\nname = \"u\"\nendpoints = [\"api.internal:80\", {{ address = \"API.internal:80\", weight = 2 }}]\n"
        ));
        assert!(e.to_string().contains("listed twice"), "{e}");
        // One name and one address that it may resolve to are two endpoints.
        compile(
            &format!("{MIN}[[upstreams]]\nname = \"u\"\nendpoints = [\"localhost:80\", \"127.0.0.1:80\"]\n"),
            "t.toml",
        )
        .unwrap();
    }

    #[test]
    fn h2_upstream_windows_and_keepalive() {
        let up = |keys: &str| {
            format!(
                "{MIN}[[upstreams]]\nname = \"u\"\nprotocol = \"h2c\"\nendpoints = [\"127.0.0.1:1\"]\n{keys}\n"
            )
        };
        let g = compile(&up(""), "t.toml").unwrap();
        let u = &g.upstreams[0];
        assert_eq!(
            (u.h2_stream_window, u.h2_connection_window, u.h2_keepalive),
            (256 * 1024, 16 << 20, None)
        );
        let g = compile(
            &up("h2_keepalive = \"20s\"\nh2_stream_window = 65535"),
            "t.toml",
        )
        .unwrap();
        let u = &g.upstreams[0];
        assert_eq!(
            (u.h2_stream_window, u.h2_keepalive),
            (65535, Some(Duration::from_secs(20)))
        );
        let e = err(&up(
            "h2_stream_window = 1048576\nh2_connection_window = 65535",
        ));
        assert!(e.to_string().contains("at least h2_stream_window"), "{e}");
        let e = err(&up("h2_stream_window = 1000"));
        assert!(e.to_string().contains("h2_stream_window"), "{e}");
        // The other pool's keys are refused, not ignored.
        let e = err(&up("pool_max_idle = 8"));
        assert!(
            e.to_string().contains("applies to HTTP/1.1 upstreams"),
            "{e}"
        );
        let http1 = |keys: &str| up(keys).replace("protocol = \"h2c\"\n", "");
        for key in [
            "h2_connections = 1",
            "h2_stream_window = 65535",
            "h2_connection_window = 16777216",
            "h2_keepalive = \"1s\"",
        ] {
            let e = err(&http1(key));
            assert!(
                e.to_string().contains("HTTP/2 upstreams only"),
                "{key}: {e}"
            );
        }
        compile(&http1("pool_max_idle = 8"), "t.toml").unwrap();
    }

    #[test]
    fn sni_names_a_client_cannot_send_are_refused() {
        let tls = |name: &str| {
            format!(
                "[[listeners]]\naddress = \"127.0.0.1:8443\"\n[listeners.tls]\ncert = \"d.pem\"\nkey = \"d.key\"\n\
                 [[listeners.tls.sni]]\nnames = [\"{name}\"]\ncert = \"a.pem\"\nkey = \"a.key\"\n"
            )
        };
        for bad in [
            "api.example.com.",
            "a*.example.com",
            "*.*.example.com",
            "10.0.0.1",
            "a.test:443",
            "*",
        ] {
            let e = err(&tls(bad));
            assert!(e.to_string().contains("SNI"), "{bad}: {e}");
        }
        // Good names get as far as reading their (missing) files.
        for good in ["api.example.com", "*.example.com"] {
            let e = err(&tls(good));
            assert!(!e.to_string().contains("SNI"), "{good}: {e}");
        }
    }

    #[test]
    fn route_hosts_match_as_requests_name_them() {
        let wildcard = |h: &str| match compile_host(h) {
            Ok(HostMatch::Wildcard(s)) => s,
            other => panic!("{h}: {other:?}"),
        };
        // A request's host loses one trailing dot: so does a route's, wildcard or not.
        assert_eq!(wildcard("*.Example.com."), ".example.com");
        assert_eq!(wildcard("*.example.com"), ".example.com");
        assert!(compile_host("*..").is_err());
        assert!(compile_host("*.example.com..").is_err());
        assert!(
            matches!(compile_host("api.example.com."), Ok(HostMatch::Exact(h)) if h == "api.example.com")
        );
    }

    #[test]
    fn path_parameters_are_refused_unless_kept() {
        let g = compile(MIN, "t.toml").unwrap();
        assert!(!g.http.limits.path_parameters);
        let g = compile(
            &format!("{MIN}[http]\npath_parameters = \"keep\"\n"),
            "t.toml",
        )
        .unwrap();
        assert!(g.http.limits.path_parameters);
        let e = err(&format!("{MIN}[http]\npath_parameters = \"strip\"\n"));
        assert!(e.to_string().contains("path_parameters"), "{e}");
        assert!(
            !compile(MIN, "t.toml")
                .unwrap()
                .http
                .limits
                .reject_repeated_slashes
        );
        let g = compile(
            &format!("{MIN}[http]\nrepeated_slashes = \"reject\"\n"),
            "t.toml",
        )
        .unwrap();
        assert!(g.http.limits.reject_repeated_slashes);
        let e = err(&format!("{MIN}[http]\nrepeated_slashes = \"merge\"\n"));
        assert!(e.to_string().contains("repeated_slashes"), "{e}");
    }

    #[test]
    fn encoded_slashes_are_refused_unless_kept() {
        let g = compile(MIN, "t.toml").unwrap();
        assert!(!g.http.limits.encoded_slashes);
        let g = compile(
            &format!("{MIN}[http]\nencoded_slashes = \"keep\"\n"),
            "t.toml",
        )
        .unwrap();
        assert!(g.http.limits.encoded_slashes);
        let e = err(&format!("{MIN}[http]\nencoded_slashes = \"decode\"\n"));
        assert!(e.to_string().contains("encoded_slashes"), "{e}");
    }

    #[test]
    fn keys_that_would_do_nothing_or_stall_are_refused() {
        // The same SNI name on two certificates.
        let e = err(
            "[[listeners]]\naddress = \"127.0.0.1:8443\"\n[listeners.tls]\ncert = \"d.pem\"\nkey = \"d.key\"\n\
             [[listeners.tls.sni]]\nnames = [\"a.test\"]\ncert = \"a.pem\"\nkey = \"a.key\"\n\
             [[listeners.tls.sni]]\nnames = [\"A.test\"]\ncert = \"b.pem\"\nkey = \"b.key\"\n",
        );
        assert!(e.to_string().contains("two sni certificates"), "{e}");
        // A CA file nothing is verified against.
        let e = err(&format!(
            "{MIN}[[upstreams]]\nname = \"u\"\nendpoints = [\"127.0.0.1:1\"]\n\
             tls = {{ ca_file = \"ca.pem\", insecure_skip_verify = true }}\n"
        ));
        assert!(e.to_string().contains("ca_file"), "{e}");
        // A priority class on a route that takes no slot of the gateway cap.
        let e = err(&format!(
            "{MIN}[[routes]]\npath = \"/status\"\nrespond = {{ status = 200 }}\npriority_class = 9\n"
        ));
        assert!(e.to_string().contains("proxy routes only"), "{e}");
        // A health probe that may hang for long (every upstream's checks would wait).
        let hc = |keys: &str| {
            format!(
                "{MIN}[[upstreams]]\nname = \"u\"\nendpoints = [\"127.0.0.1:1\"]\n\
                 health_check = {{ {keys} }}\n"
            )
        };
        for bad in ["timeout = \"10m\"", "interval = \"5m\", timeout = \"31s\""] {
            let e = err(&hc(bad));
            assert!(e.to_string().contains("health_check.timeout"), "{bad}: {e}");
        }
        assert!(compile(&hc("interval = \"50ms\", timeout = \"30s\""), "t.toml").is_ok());
    }

    #[test]
    fn values_the_runtime_could_not_honour_are_refused() {
        let up = |keys: &str| {
            format!("{MIN}[[upstreams]]\nname = \"u\"\nendpoints = [\"127.0.0.1:1\"]\n{keys}\n")
        };
        let refused = [
            (
                up("health_check = { interval = \"10ms\" }"),
                "health_check.interval",
            ),
            (
                up("protocol = \"h2c\"\nh2_keepalive = \"1ms\""),
                "h2_keepalive must be at least",
            ),
            (
                format!(
                    "{MIN}[http]\nmax_head_bytes = 8192\n[http2]\nmax_header_list_bytes = 65536\n"
                ),
                "must not exceed http.max_head_bytes",
            ),
            (
                format!(
                    "{MIN}[[routes]]\npath_prefix = \"/\"\nrespond = {{ status = 200 }}\n\
                     maintenance = {{ retry_after = \"1500ms\" }}\n"
                ),
                "whole seconds",
            ),
        ];
        for (text, said) in refused {
            let e = err(&text);
            assert!(e.to_string().contains(said), "{said}: {e}");
        }
        for endpoint in ["127.0.0.1:0", "0.0.0.0:80", "[::]:80"] {
            let e = err(&format!(
                "{MIN}[[upstreams]]\nname = \"u\"\nendpoints = [\"{endpoint}\"]\n"
            ));
            assert!(e.to_string().contains("names no peer"), "{endpoint}: {e}");
        }
        // The bounds themselves are allowed.
        for keys in [
            "health_check = { interval = \"50ms\" }",
            "protocol = \"h2c\"\nh2_keepalive = \"100ms\"",
        ] {
            assert!(compile(&up(keys), "t.toml").is_ok(), "{keys}");
        }
    }

    #[test]
    fn a_body_file_must_be_a_regular_file_of_at_most_1_mib() {
        let dir = std::env::temp_dir().join(format!("ringway-body-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fits = dir.join("fits.txt");
        std::fs::write(&fits, vec![b'a'; MAX_BODY_FILE_BYTES as usize]).unwrap();
        assert_eq!(read_body_file(&fits).unwrap().len(), 1 << 20);
        let over = dir.join("over.txt");
        std::fs::write(&over, vec![b'a'; MAX_BODY_FILE_BYTES as usize + 1]).unwrap();
        let e = read_body_file(&over).unwrap_err();
        assert!(e.to_string().contains("larger than 1 MiB"), "{e}");
        // A device that never ends, a directory, and a pipe (whose opening would wait for a
        // writer).
        let fifo = dir.join("fifo");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        for path in [
            std::path::Path::new("/dev/zero"),
            dir.as_path(),
            fifo.as_path(),
        ] {
            let e = read_body_file(path).unwrap_err();
            assert!(e.to_string().contains("not a regular file"), "{e}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_upstream_server_name_must_be_a_name() {
        let up = |name: &str| {
            format!(
                "{MIN}[[upstreams]]\nname = \"u\"\nendpoints = [\"127.0.0.1:1\"]\n\
                 tls = {{ server_name = \"{name}\", insecure_skip_verify = true }}\n"
            )
        };
        let e = err(&up("api.example.com:443"));
        assert!(e.to_string().contains("server_name"), "{e}");
        compile(&up("api.example.com"), "t.toml").unwrap();
    }

    #[test]
    fn a_route_can_only_lower_the_head_limit() {
        let route = |n: u32| {
            format!(
                "{MIN}[[routes]]\npath_prefix = \"/\"\nrespond = {{ status = 200 }}\n\
                 limits = {{ max_head_bytes = {n} }}\n"
            )
        };
        let e = err(&route(65536));
        assert!(e.to_string().contains("http.max_head_bytes"), "{e}");
        let g = compile(&route(4096), "t.toml").unwrap();
        assert_eq!(g.routes.routes()[0].limits.max_head_bytes, Some(4096));
    }

    #[test]
    fn upstream_resilience_keys_compile_and_refuse_bad_values() {
        let up = |keys: &str| {
            format!("{MIN}[[upstreams]]\nname = \"u\"\nendpoints = [\"127.0.0.1:1\", {{ address = \"127.0.0.1:2\", weight = 3 }}]\n{keys}\n[[routes]]\npath_prefix = \"/\"\nproxy = \"u\"\npriority_class = 9\n")
        };
        let g = compile(&up(""), "t.toml").unwrap();
        let u = &g.upstreams[0];
        assert_eq!(u.balancer, BalancerConfig::P2cEwma);
        assert_eq!(u.endpoints[1].weight, 3);
        assert_eq!(
            u.outlier,
            Some(OutlierConfig::default()),
            "passive health is on by default"
        );
        assert_eq!(
            u.breaker.failure_threshold, 0,
            "the breaker is off by default"
        );
        assert_eq!(u.retries, RetryPolicy::default());
        assert_eq!(g.gateway.high_priority_reserve, 0, "no cap, no reserve");

        let g = compile(
            &format!("[gateway]\nmax_concurrent_requests = 25\n{}", up("balancer = { type = \"consistent_hash\", header = \"X-User\" }\noutlier = { consecutive_failures = 0 }\nretries = { attempts = 3, retry_on = [\"5xx\"], per_try_timeout = \"2s\" }")),
            "t.toml",
        )
        .unwrap();
        let u = &g.upstreams[0];
        assert_eq!(
            u.balancer,
            BalancerConfig::ConsistentHash(HashKey::Header("x-user".into()))
        );
        assert_eq!(u.outlier, None);
        assert_eq!(u.retries.attempts, 3);
        assert!(u.retries.retry_on.status_5xx && !u.retries.retry_on.connect_failure);
        assert_eq!(u.retries.per_try_timeout, Some(Duration::from_secs(2)));
        assert_eq!(
            g.gateway.high_priority_reserve, 2,
            "a tenth of 25, for priority_class 9"
        );
        // A cap of 1 keeps nothing back: the other routes would otherwise get none.
        let tiny = compile(
            &format!("[gateway]\nmax_concurrent_requests = 1\n{}", up("")),
            "t.toml",
        )
        .unwrap();
        assert_eq!(tiny.gateway.high_priority_reserve, 0);

        for (keys, why) in [
            ("balancer = \"fastest\"", "balancer must be"),
            (
                "balancer = { type = \"consistent_hash\" }",
                "consistent_hash takes",
            ),
            (
                "balancer = { type = \"cookie_hash\", header = \"x\" }",
                "cookie_hash takes",
            ),
            ("retries = { retry_on = [\"always\"] }", "unknown retry_on"),
            ("retries = { attempts = 0 }", "retries.attempts"),
            ("retry_budget = { percent = 101 }", "retry_budget.percent"),
            ("rate_limit = { max_rps = 0 }", "rate_limit.max_rps"),
            ("health_check = { path = \"health\" }", "health_check.path"),
            ("health_check = { expect_status = 42 }", "expect_status"),
            (
                "outlier = { max_ejection_percent = 150 }",
                "max_ejection_percent",
            ),
            ("breaker = { half_open_max = 0 }", "half_open_max"),
            ("retries = { colour = 1 }", "unknown field"),
        ] {
            let e = err(&up(keys));
            assert!(e.to_string().contains(why), "{keys}: {e}");
        }
        let e = err(&format!("{MIN}[[upstreams]]\nname = \"u\"\nendpoints = [{{ address = \"127.0.0.1:1\", weight = 0 }}]\n"));
        assert!(e.to_string().contains("weight"), "{e}");
    }

    #[test]
    fn minimal_config_compiles_with_defaults() {
        let g = compile(MIN, "t.toml").unwrap();
        assert_eq!(g.workers, Workers::Auto);
        assert_eq!(g.http.header_timeout, Duration::from_secs(10));
        assert_eq!(g.http.limits.max_head_bytes, 16384);
        assert_eq!(g.listeners[0].address, "127.0.0.1:8080".parse().unwrap());
        assert!(g.routes.routes().is_empty());
    }

    #[test]
    fn unknown_key_points_at_it() {
        let e = err("[[listeners]]\naddress = \"127.0.0.1:8080\"\nbogus = 1\n");
        assert_eq!((e.line, e.column), (3, 1), "{e}");
        assert!(e.message.contains("bogus"), "{e}");
        assert!(e.to_string().starts_with("t.toml:3:1: "), "{e}");
    }

    #[test]
    fn bad_address_and_missing_upstream() {
        let e = err("[[listeners]]\naddress = \"localhost:x\"\n");
        assert_eq!((e.line, e.column), (2, 11), "{e}");
        let e = err(&format!(
            "{MIN}[[routes]]\npath_prefix = \"/\"\nproxy = \"nope\"\n"
        ));
        assert_eq!(e.line, 5, "{e}");
        assert!(e.message.contains("nope"), "{e}");
        let e = err(&format!(
            "{MIN}[[upstreams]]\nname = \"a\"\nendpoints = [\"10.0.0.1\"]\n"
        ));
        assert_eq!((e.line, e.column), (5, 14), "{e}");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("10").is_err());
        assert!(parse_duration("1.5s").is_err());
        // Deadlines are instants: a duration that would overflow them is refused.
        assert!(parse_duration("10000000000000000000s").is_err());
        assert!(parse_duration("8785h").is_err());
        assert_eq!(parse_duration("8784h"), Ok(MAX_DURATION));
        assert!(parse_duration("s").is_err());
        let e = err(&format!("{MIN}[http]\nheader_timeout = \"10 s\"\n"));
        assert_eq!(e.line, 4, "{e}");
    }

    #[test]
    fn dns_refresh_is_a_duration_of_a_second_or_more_or_off() {
        let refresh = |v: &str| compile(&format!("{v}{MIN}"), "t.toml").map(|g| g.dns_refresh);
        assert_eq!(refresh("").unwrap(), Some(Duration::from_secs(10)));
        assert_eq!(
            refresh("dns_refresh = \"30s\"\n").unwrap(),
            Some(Duration::from_secs(30))
        );
        assert_eq!(refresh("dns_refresh = \"off\"\n").unwrap(), None);
        let e = refresh("dns_refresh = \"500ms\"\n").unwrap_err();
        assert!(e.to_string().contains("at least"), "{e}");
        assert!(refresh("dns_refresh = \"0s\"\n").is_err());
        assert!(refresh("dns_refresh = 10\n").is_err());
        let timeout = |v: &str| compile(&format!("{v}{MIN}"), "t.toml").map(|g| g.dns_timeout);
        assert_eq!(timeout("").unwrap(), Duration::from_secs(5));
        assert_eq!(
            timeout("dns_timeout = \"800ms\"\n").unwrap(),
            Duration::from_millis(800)
        );
        assert!(timeout("dns_timeout = \"50ms\"\n").is_err());
        assert!(timeout("dns_timeout = \"2m\"\n").is_err());
    }

    #[test]
    fn the_client_close_check_and_the_idle_buffer_release_are_durations_or_off() {
        type Key = fn(&crate::config::HttpConfig) -> Option<Duration>;
        let keys: [(&str, Key, Option<Duration>); 2] = [
            (
                "client_close_check",
                |h| h.client_close_check,
                Some(Duration::from_secs(1)),
            ),
            ("idle_buffer_release", |h| h.idle_buffer_release, None),
        ];
        for (key, get, default) in keys {
            let check =
                |v: &str| compile(&format!("{MIN}[http]\n{v}"), "t.toml").map(|g| get(&g.http));
            assert_eq!(check("").unwrap(), default, "{key}");
            assert_eq!(
                check(&format!("{key} = \"250ms\"\n")).unwrap(),
                Some(Duration::from_millis(250)),
                "{key}"
            );
            assert_eq!(check(&format!("{key} = \"off\"\n")).unwrap(), None, "{key}");
            assert!(check(&format!("{key} = \"0s\"\n")).is_err(), "{key}");
            assert!(check(&format!("{key} = \"never\"\n")).is_err(), "{key}");
        }
    }

    #[test]
    fn endpoints() {
        let e = parse_endpoint("[::1]:80").unwrap();
        assert_eq!(e.literal, Some("[::1]:80".parse().unwrap()));
        let e = parse_endpoint("api.internal:8080").unwrap();
        assert_eq!(
            (e.host.as_str(), e.port, e.literal),
            ("api.internal", 8080, None)
        );
        for bad in ["api", "api:0", "api:99999", "a b:80", ":80", "a..b:80"] {
            assert!(parse_endpoint(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn routes_compile() {
        let g = compile(
            &format!(
                "{MIN}[[upstreams]]\nname = \"api\"\nendpoints = [\"127.0.0.1:9000\"]\n\
                 [[routes]]\nhost = \"Example.COM:8080\"\npath_prefix = \"/api/\"\nproxy = \"api\"\nstrip_prefix = \"/api\"\n\
                 [[routes]]\npath_prefix = \"/\"\nrespond = {{ status = 200, body = \"hi\", headers = {{ \"content-type\" = \"text/plain\" }} }}\n"
            ),
            "t.toml",
        )
        .unwrap();
        let headers = crate::route::HeaderList::default();
        let mut scratch = g.routes.scratch();
        let mut find = |host: &'static [u8], path: &'static [u8]| {
            let req = crate::route::RouteRequest {
                method: b"GET",
                host,
                path,
                query: b"",
                headers: &headers,
            };
            g.routes.lookup(&req, &mut scratch).map(|m| m.route.clone())
        };
        let r = find(b"example.com", b"/api/x").unwrap();
        assert_eq!(r.host, HostMatch::Exact("example.com".into()));
        assert!(matches!(
            r.action,
            Action::Proxy(ProxyAction { upstream: 0, .. })
        ));
        let r = find(b"other", b"/x").unwrap();
        assert!(matches!(&r.action, Action::Respond(l) if l.body == b"hi"));
    }

    #[test]
    fn route_errors() {
        let e = err(&format!(
            "{MIN}[[routes]]\npath_prefix = \"api\"\nrespond = {{ status = 200 }}\n"
        ));
        assert_eq!(e.line, 4, "{e}");
        let e = err(&format!("{MIN}[[routes]]\npath_prefix = \"/\"\n"));
        assert!(e.message.contains("exactly one action"), "{e}");
        let e = err(&format!(
            "{MIN}[[routes]]\npath_prefix = \"/\"\nrespond = {{ status = 200, headers = {{ \"content-length\" = \"1\" }} }}\n"
        ));
        assert!(e.message.contains("content-length"), "{e}");
        let e = err(&format!(
            "{MIN}[[routes]]\npath_prefix = \"/\"\nrespond = {{ status = 100 }}\n"
        ));
        assert!(e.message.contains("status"), "{e}");
    }

    #[test]
    fn driver_choice() {
        let ok = |text: &str| compile(text, "t.toml").unwrap();
        assert_eq!(ok(MIN).driver, DriverChoice::Auto);
        for (text, want) in [
            ("auto", DriverChoice::Auto),
            ("io_uring", DriverChoice::IoUring),
            ("epoll", DriverChoice::Epoll),
        ] {
            let g = ok(&format!("driver = \"{text}\"\n{MIN}"));
            assert_eq!(g.driver, want, "{text}");
        }
        let e = err(&format!("driver = \"uring\"\n{MIN}"));
        assert!(e.message.contains("driver must be"), "{e}");
        assert_eq!(e.line, 1, "{e}");
    }

    #[test]
    fn workers_and_trusted_proxies() {
        let g = compile(
            &format!("workers = 3\n[gateway]\ntrusted_proxies = [\"10.0.0.0/8\", \"::1\"]\n{MIN}"),
            "t",
        )
        .unwrap();
        assert_eq!(g.workers, Workers::Count(3));
        assert_eq!(g.gateway.trusted_proxies.len(), 2);
        assert!(err(&format!("workers = 0\n{MIN}"))
            .message
            .contains("workers"));
        assert!(err(&format!("workers = \"many\"\n{MIN}"))
            .message
            .contains("workers"));
        let e = err(&format!(
            "[gateway]\ntrusted_proxies = [\"10.0.0.0/99\"]\n{MIN}"
        ));
        assert_eq!((e.line, e.column), (2, 20), "{e}");
    }

    #[test]
    fn limits_are_range_checked() {
        let e = err(&format!("{MIN}[http]\nmax_headers = 1000\n"));
        assert!(e.message.contains("max_headers"), "{e}");
        let e = err(&format!("{MIN}[http]\nmax_head_bytes = 10\n"));
        assert!(e.message.contains("max_head_bytes"), "{e}");
    }

    #[test]
    fn no_listener_is_an_error() {
        let e = err("workers = 1\n");
        assert_eq!((e.line, e.column), (1, 1));
        assert!(e.message.contains("listener"));
    }
}
