//! The compiled route table of one config generation: host + path prefix → action.
//!
//! Ownership: built once by `config::compile`, immutable, shared by every worker through the
//! generation's `Arc`. Lookup allocates nothing.
//!
//! Matching: a route applies when its host (exact, case-insensitive, port ignored) equals the
//! request's host, or it has no host; and its `path_prefix` is a byte prefix of the request
//! path. The longest matching prefix wins; on equal prefixes a route with a host wins over one
//! without; then config order.

use std::fmt;

use crate::http1::head::split_host_port;

/// Most header fields a configured `respond` action may set (checked at compile time).
pub const MAX_LOCAL_HEADERS: usize = 32;

/// A response defined in config, answered by ringway itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalResponse {
    /// Status code (200–599).
    pub status: u16,
    /// Extra header fields, validated at compile time.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
}

/// What a matched route does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Forward to an upstream.
    Proxy {
        /// Index into the generation's upstream list.
        upstream: usize,
        /// Removed from the front of the path when present.
        strip_prefix: Option<String>,
        /// Send the client's Host instead of the upstream authority.
        preserve_host: bool,
    },
    /// Answer with a fixed response.
    Respond(LocalResponse),
}

/// One compiled route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// Name for logs: the `name` key, or `route-N` (1-based config position).
    pub name: String,
    /// Lower-cased host without port, or `None` for any host.
    pub host: Option<String>,
    /// Byte prefix of the request path.
    pub path_prefix: String,
    /// The action.
    pub action: Action,
}

/// Routes in match order.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct RouteTable {
    routes: Vec<Route>,
}

impl fmt::Debug for RouteTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.routes.iter()).finish()
    }
}

impl RouteTable {
    /// Builds the table from routes in config order.
    pub fn new(mut routes: Vec<Route>) -> Self {
        // Stable sort: config order breaks the remaining ties.
        routes.sort_by(|a, b| {
            b.path_prefix
                .len()
                .cmp(&a.path_prefix.len())
                .then_with(|| b.host.is_some().cmp(&a.host.is_some()))
        });
        RouteTable { routes }
    }

    /// Routes in match order.
    pub fn routes(&self) -> &[Route] {
        &self.routes
    }

    /// The route for a request to `host` (as sent: any case, maybe with a port) and `path`.
    pub fn lookup(&self, host: &[u8], path: &[u8]) -> Option<&Route> {
        let (host, _port) = split_host_port(host);
        self.routes.iter().find(|r| {
            path.starts_with(r.path_prefix.as_bytes())
                && r.host
                    .as_deref()
                    .is_none_or(|h| h.as_bytes().eq_ignore_ascii_case(host))
        })
    }
}

/// Applies `strip_prefix` to `path`: the rest after the prefix, always starting with `/`.
/// Returns `(leading, rest)` where `leading` is `"/"` when the rest needs one.
pub fn strip_path<'a>(path: &'a [u8], prefix: Option<&str>) -> (&'static [u8], &'a [u8]) {
    let rest = match prefix {
        Some(p) if path.starts_with(p.as_bytes()) => &path[p.len()..],
        _ => path,
    };
    if rest.first() == Some(&b'/') {
        (b"", rest)
    } else {
        (b"/", rest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(name: &str, host: Option<&str>, prefix: &str) -> Route {
        Route {
            name: name.into(),
            host: host.map(Into::into),
            path_prefix: prefix.into(),
            action: Action::Respond(LocalResponse {
                status: 200,
                headers: vec![],
                body: vec![],
            }),
        }
    }

    #[test]
    fn longest_prefix_then_host_then_order() {
        let t = RouteTable::new(vec![
            route("root", None, "/"),
            route("api", None, "/api/"),
            route("api-host", Some("example.com"), "/api/"),
            route("api-v2", None, "/api/v2/"),
            route("dup", None, "/api/"),
        ]);
        let name = |h: &[u8], p: &[u8]| t.lookup(h, p).map(|r| r.name.as_str());
        assert_eq!(name(b"x", b"/"), Some("root"));
        assert_eq!(name(b"x", b"/api"), Some("root"));
        assert_eq!(name(b"x", b"/api/a"), Some("api"));
        assert_eq!(name(b"EXAMPLE.com:8080", b"/api/a"), Some("api-host"));
        assert_eq!(name(b"example.com", b"/api/v2/x"), Some("api-v2"));
        let empty = RouteTable::new(vec![route("only", Some("a"), "/x")]);
        assert!(empty.lookup(b"b", b"/x").is_none());
        assert!(empty.lookup(b"a", b"/y").is_none());
    }

    #[test]
    fn strip() {
        assert_eq!(strip_path(b"/api/x", Some("/api")), (&b""[..], &b"/x"[..]));
        assert_eq!(strip_path(b"/api", Some("/api")), (&b"/"[..], &b""[..]));
        assert_eq!(strip_path(b"/api/x", Some("/api/")), (&b"/"[..], &b"x"[..]));
        assert_eq!(
            strip_path(b"/other", Some("/api")),
            (&b""[..], &b"/other"[..])
        );
        assert_eq!(strip_path(b"/p", None), (&b""[..], &b"/p"[..]));
        assert_eq!(strip_path(b"", None), (&b"/"[..], &b""[..]));
    }
}
