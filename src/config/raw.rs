//! The TOML schema as written by operators: serde types with spans, so that validation can
//! point at the line and column of a bad value. Unknown keys are errors everywhere.

use std::collections::BTreeMap;

use serde::Deserialize;
use toml::Spanned;

/// The whole file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawConfig {
    pub(crate) workers: Option<Spanned<RawWorkers>>,
    pub(crate) cpus: Option<Spanned<Vec<usize>>>,
    pub(crate) driver: Option<Spanned<String>>,
    pub(crate) shutdown_timeout: Option<Spanned<String>>,
    pub(crate) dns_refresh: Option<Spanned<String>>,
    pub(crate) dns_timeout: Option<Spanned<String>>,
    pub(crate) log_level: Option<Spanned<String>>,
    #[serde(default)]
    pub(crate) gateway: RawGateway,
    pub(crate) admin: Option<RawAdmin>,
    #[serde(default)]
    pub(crate) http: RawHttp,
    #[serde(default)]
    pub(crate) http2: RawHttp2,
    pub(crate) access_log: Option<Spanned<RawAccessLog>>,
    #[serde(default)]
    pub(crate) listeners: Vec<Spanned<RawListener>>,
    #[serde(default)]
    pub(crate) upstreams: Vec<Spanned<RawUpstream>>,
    #[serde(default)]
    pub(crate) routes: Vec<Spanned<RawRoute>>,
}

/// `[http2]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawHttp2 {
    pub(crate) enabled: Option<bool>,
    pub(crate) max_concurrent_streams: Option<Spanned<i64>>,
    pub(crate) initial_stream_window: Option<Spanned<i64>>,
    pub(crate) initial_connection_window: Option<Spanned<i64>>,
    pub(crate) max_buffered_bytes: Option<Spanned<i64>>,
    pub(crate) max_frame_size: Option<Spanned<i64>>,
    pub(crate) max_header_list_bytes: Option<Spanned<i64>>,
    pub(crate) max_pending_accept_reset_streams: Option<Spanned<i64>>,
    pub(crate) max_local_error_reset_streams: Option<Spanned<i64>>,
}

/// `[access_log]`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAccessLog {
    pub(crate) path: Option<Spanned<String>>,
    pub(crate) buffer_bytes: Option<Spanned<i64>>,
    pub(crate) flush_interval: Option<Spanned<String>>,
}

/// `workers = 4` or `workers = "auto"`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum RawWorkers {
    Count(i64),
    Named(String),
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAdmin {
    pub(crate) address: Option<Spanned<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawGateway {
    #[serde(default)]
    pub(crate) trusted_proxies: Vec<Spanned<String>>,
    pub(crate) max_concurrent_requests: Option<Spanned<i64>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawHttp {
    pub(crate) max_head_bytes: Option<Spanned<i64>>,
    pub(crate) max_headers: Option<Spanned<i64>>,
    pub(crate) max_request_line_bytes: Option<Spanned<i64>>,
    pub(crate) encoded_slashes: Option<Spanned<String>>,
    pub(crate) path_parameters: Option<Spanned<String>>,
    pub(crate) repeated_slashes: Option<Spanned<String>>,
    pub(crate) max_request_body_bytes: Option<Spanned<i64>>,
    pub(crate) max_connections: Option<Spanned<i64>>,
    pub(crate) header_timeout: Option<Spanned<String>>,
    pub(crate) idle_timeout: Option<Spanned<String>>,
    pub(crate) body_timeout: Option<Spanned<String>>,
    pub(crate) send_timeout: Option<Spanned<String>>,
    pub(crate) tunnel_idle_timeout: Option<Spanned<String>>,
    pub(crate) buffer_pool_bytes: Option<Spanned<i64>>,
    pub(crate) client_close_check: Option<Spanned<String>>,
    pub(crate) idle_buffer_release: Option<Spanned<String>>,
    pub(crate) reserved_paths: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawListener {
    pub(crate) address: Spanned<String>,
    pub(crate) backlog: Option<Spanned<i64>>,
    pub(crate) tls: Option<Spanned<RawTls>>,
}

/// `[listeners.tls]`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTls {
    pub(crate) cert: Spanned<String>,
    pub(crate) key: Spanned<String>,
    pub(crate) min_version: Option<Spanned<String>>,
    pub(crate) strict_sni: Option<bool>,
    pub(crate) handshake_timeout: Option<Spanned<String>>,
    #[serde(default)]
    pub(crate) sni: Vec<Spanned<RawSniCert>>,
}

/// `[[listeners.tls.sni]]`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSniCert {
    pub(crate) names: Spanned<Vec<String>>,
    pub(crate) cert: Spanned<String>,
    pub(crate) key: Spanned<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawUpstream {
    pub(crate) name: Spanned<String>,
    pub(crate) endpoints: Spanned<Vec<Spanned<RawEndpoint>>>,
    pub(crate) balancer: Option<Spanned<RawBalancer>>,
    pub(crate) max_connections: Option<Spanned<i64>>,
    pub(crate) max_pending: Option<Spanned<i64>>,
    pub(crate) rate_limit: Option<Spanned<RawRateLimit>>,
    pub(crate) health_check: Option<Spanned<RawHealthCheck>>,
    pub(crate) outlier: Option<Spanned<RawOutlier>>,
    pub(crate) breaker: Option<Spanned<RawBreaker>>,
    pub(crate) retries: Option<Spanned<RawRetries>>,
    pub(crate) retry_budget: Option<Spanned<RawRetryBudget>>,
    pub(crate) connect_timeout: Option<Spanned<String>>,
    pub(crate) response_timeout: Option<Spanned<String>>,
    pub(crate) read_timeout: Option<Spanned<String>>,
    pub(crate) pool_max_idle: Option<Spanned<i64>>,
    pub(crate) pool_idle_timeout: Option<Spanned<String>>,
    pub(crate) protocol: Option<Spanned<String>>,
    pub(crate) h2_connections: Option<Spanned<i64>>,
    pub(crate) h2_stream_window: Option<Spanned<i64>>,
    pub(crate) h2_connection_window: Option<Spanned<i64>>,
    pub(crate) h2_keepalive: Option<Spanned<String>>,
    pub(crate) tls: Option<Spanned<RawUpstreamTls>>,
}

/// `Deserialize` for an enum that is a scalar or a table. (An untagged enum would answer a
/// misspelt key in the table with "data did not match any variant"; this way the table's own
/// error, naming the unknown key, reaches the operator.)
macro_rules! scalar_or_table {
    ($ty:ident, $scalar:ident, $visit:ident($v:ty), $table:ident, $expecting:literal) => {
        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct Visitor;
                impl<'de> serde::de::Visitor<'de> for Visitor {
                    type Value = $ty;

                    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                        f.write_str($expecting)
                    }

                    fn $visit<E: serde::de::Error>(self, v: $v) -> Result<$ty, E> {
                        Ok($ty::$scalar(v.into()))
                    }

                    fn visit_map<A: serde::de::MapAccess<'de>>(
                        self,
                        map: A,
                    ) -> Result<$ty, A::Error> {
                        let table = serde::de::value::MapAccessDeserializer::new(map);
                        Deserialize::deserialize(table).map($ty::$table)
                    }
                }
                d.deserialize_any(Visitor)
            }
        }
    };
}

/// An upstream's `tls = true` or `tls = { ... }`.
#[derive(Debug)]
pub(crate) enum RawUpstreamTls {
    Flag(bool),
    Table(RawUpstreamTlsTable),
}

scalar_or_table!(
    RawUpstreamTls,
    Flag,
    visit_bool(bool),
    Table,
    "`true`, `false` or a table"
);

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawUpstreamTlsTable {
    pub(crate) ca_file: Option<String>,
    pub(crate) server_name: Option<String>,
    pub(crate) client_cert: Option<String>,
    pub(crate) client_key: Option<String>,
    pub(crate) insecure_skip_verify: Option<bool>,
}

/// `"host:port"` or `{ address = "host:port", weight = 2 }`.
#[derive(Debug)]
pub(crate) enum RawEndpoint {
    Plain(String),
    Table(RawEndpointTable),
}

scalar_or_table!(
    RawEndpoint,
    Plain,
    visit_str(&str),
    Table,
    "\"host:port\" or a table"
);

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawEndpointTable {
    pub(crate) address: String,
    pub(crate) weight: Option<i64>,
}

/// `"round_robin"` or `{ type = "cookie_hash", cookie = "SID" }`.
#[derive(Debug)]
pub(crate) enum RawBalancer {
    Name(String),
    Table(RawBalancerTable),
}

scalar_or_table!(
    RawBalancer,
    Name,
    visit_str(&str),
    Table,
    "a balancer name or a table"
);

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawBalancerTable {
    #[serde(rename = "type")]
    pub(crate) kind: String,
    pub(crate) cookie: Option<String>,
    pub(crate) header: Option<String>,
    pub(crate) client_ip: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRateLimit {
    pub(crate) max_rps: Spanned<i64>,
    pub(crate) burst: Option<Spanned<i64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawHealthCheck {
    pub(crate) path: Option<Spanned<String>>,
    pub(crate) expect_status: Option<Spanned<i64>>,
    pub(crate) interval: Option<Spanned<String>>,
    pub(crate) timeout: Option<Spanned<String>>,
    pub(crate) healthy_threshold: Option<Spanned<i64>>,
    pub(crate) unhealthy_threshold: Option<Spanned<i64>>,
    pub(crate) jitter_percent: Option<Spanned<i64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawOutlier {
    pub(crate) consecutive_failures: Option<Spanned<i64>>,
    pub(crate) base_ejection: Option<Spanned<String>>,
    pub(crate) max_ejection: Option<Spanned<String>>,
    pub(crate) max_ejection_percent: Option<Spanned<i64>>,
    pub(crate) on_5xx: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawBreaker {
    pub(crate) failure_threshold: Option<Spanned<i64>>,
    pub(crate) open_duration: Option<Spanned<String>>,
    pub(crate) half_open_max: Option<Spanned<i64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRetries {
    pub(crate) attempts: Option<Spanned<i64>>,
    pub(crate) per_try_timeout: Option<Spanned<String>>,
    pub(crate) backoff_base: Option<Spanned<String>>,
    pub(crate) backoff_max: Option<Spanned<String>>,
    pub(crate) retry_on: Option<Vec<Spanned<String>>>,
    pub(crate) retry_post: Option<bool>,
    pub(crate) buffer_max_bytes: Option<Spanned<i64>>,
    pub(crate) total_timeout: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRetryBudget {
    pub(crate) percent: Option<Spanned<i64>>,
    pub(crate) min_per_second: Option<Spanned<i64>>,
    pub(crate) max_concurrent: Option<Spanned<i64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRoute {
    pub(crate) name: Option<Spanned<String>>,
    pub(crate) priority: Option<Spanned<i64>>,
    pub(crate) priority_class: Option<Spanned<i64>>,
    pub(crate) host: Option<Spanned<String>>,
    pub(crate) path: Option<Spanned<String>>,
    pub(crate) path_template: Option<Spanned<String>>,
    pub(crate) path_prefix: Option<Spanned<String>>,
    pub(crate) path_regex: Option<Spanned<String>>,
    pub(crate) methods: Option<Vec<Spanned<String>>>,
    pub(crate) headers: Option<BTreeMap<String, Spanned<RawValueMatch>>>,
    pub(crate) query: Option<BTreeMap<String, Spanned<RawValueMatch>>>,
    pub(crate) cookies: Option<BTreeMap<String, Spanned<RawValueMatch>>>,
    pub(crate) accept: Option<Spanned<String>>,
    pub(crate) proxy: Option<Spanned<String>>,
    pub(crate) strip_prefix: Option<Spanned<String>>,
    pub(crate) add_prefix: Option<Spanned<String>>,
    pub(crate) rewrite: Option<Spanned<RawRewrite>>,
    pub(crate) preserve_host: Option<Spanned<bool>>,
    pub(crate) response_timeout: Option<Spanned<String>>,
    pub(crate) read_timeout: Option<Spanned<String>>,
    pub(crate) redirect: Option<Spanned<RawRedirect>>,
    pub(crate) respond: Option<Spanned<RawRespond>>,
    pub(crate) limits: Option<Spanned<RawLimits>>,
    pub(crate) maintenance: Option<Spanned<RawMaintenance>>,
}

/// `"value"` (exact) or `true` (present with any value).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum RawValueMatch {
    Exact(String),
    Present(bool),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRewrite {
    pub(crate) pattern: Spanned<String>,
    pub(crate) replacement: Spanned<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRedirect {
    pub(crate) status: Option<Spanned<i64>>,
    pub(crate) scheme: Option<Spanned<String>>,
    pub(crate) host: Option<Spanned<String>>,
    pub(crate) port: Option<Spanned<i64>>,
    pub(crate) path: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRespond {
    pub(crate) status: Spanned<i64>,
    pub(crate) body: Option<String>,
    pub(crate) body_file: Option<Spanned<String>>,
    #[serde(default)]
    pub(crate) headers: BTreeMap<String, Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawLimits {
    pub(crate) max_body_bytes: Option<Spanned<i64>>,
    pub(crate) max_head_bytes: Option<Spanned<i64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawMaintenance {
    pub(crate) message: Option<String>,
    pub(crate) retry_after: Option<Spanned<String>>,
}
