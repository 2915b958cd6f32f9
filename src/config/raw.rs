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
    pub(crate) shutdown_timeout: Option<Spanned<String>>,
    pub(crate) log_level: Option<Spanned<String>>,
    #[serde(default)]
    pub(crate) gateway: RawGateway,
    pub(crate) admin: Option<RawAdmin>,
    #[serde(default)]
    pub(crate) http: RawHttp,
    #[serde(default)]
    pub(crate) listeners: Vec<Spanned<RawListener>>,
    #[serde(default)]
    pub(crate) upstreams: Vec<Spanned<RawUpstream>>,
    #[serde(default)]
    pub(crate) routes: Vec<Spanned<RawRoute>>,
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
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawHttp {
    pub(crate) max_head_bytes: Option<Spanned<i64>>,
    pub(crate) max_headers: Option<Spanned<i64>>,
    pub(crate) max_request_line_bytes: Option<Spanned<i64>>,
    pub(crate) max_request_body_bytes: Option<Spanned<i64>>,
    pub(crate) max_connections: Option<Spanned<i64>>,
    pub(crate) header_timeout: Option<Spanned<String>>,
    pub(crate) idle_timeout: Option<Spanned<String>>,
    pub(crate) body_timeout: Option<Spanned<String>>,
    pub(crate) send_timeout: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawListener {
    pub(crate) address: Spanned<String>,
    pub(crate) backlog: Option<Spanned<i64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawUpstream {
    pub(crate) name: Spanned<String>,
    pub(crate) endpoints: Spanned<Vec<Spanned<String>>>,
    pub(crate) connect_timeout: Option<Spanned<String>>,
    pub(crate) response_timeout: Option<Spanned<String>>,
    pub(crate) read_timeout: Option<Spanned<String>>,
    pub(crate) pool_max_idle: Option<Spanned<i64>>,
    pub(crate) pool_idle_timeout: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRoute {
    pub(crate) name: Option<Spanned<String>>,
    pub(crate) priority: Option<Spanned<i64>>,
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
