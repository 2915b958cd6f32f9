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
    pub(crate) host: Option<Spanned<String>>,
    pub(crate) path_prefix: Spanned<String>,
    pub(crate) proxy: Option<Spanned<String>>,
    pub(crate) strip_prefix: Option<Spanned<String>>,
    pub(crate) preserve_host: Option<Spanned<bool>>,
    pub(crate) respond: Option<Spanned<RawRespond>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRespond {
    pub(crate) status: Spanned<i64>,
    #[serde(default)]
    pub(crate) body: String,
    #[serde(default)]
    pub(crate) headers: BTreeMap<String, Spanned<String>>,
}
