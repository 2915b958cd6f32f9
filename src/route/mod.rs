//! The compiled route table of one config generation.
//!
//! Ownership: built once by `config::compile`, immutable, shared by every worker through the
//! generation's `Arc`; per-worker scratch ([`Scratch`]) makes lookups allocation-free.
//!
//! Resolution, as Envoy resolves virtual hosts then routes:
//! 1. **Host group**: the request host (case-insensitive, port ignored) selects one group: an
//!    exact host, else the longest matching wildcard (`*.example.com` matches any host ending in
//!    `.example.com`), else the routes without a host. Only that group's routes are candidates.
//! 2. **Path**: every route of the group whose path matcher matches is a candidate, ordered by
//!    explicit `priority` (higher first), then kind (exact > template > prefix > regex), then
//!    within a kind: exact and regex in config order, templates most specific first (literal
//!    segments before parameters before `{*rest}`), prefixes longest first.
//! 3. **Criteria**: the first candidate whose criteria (methods, headers, query, cookies,
//!    accept) all hold wins; a miss falls through to the next candidate. None: no route (404).
//!
//! Regex routes are tried only when one could outrank the best other candidate, and then in
//! one pass of a multi-pattern automaton, so a table of thousands of routes costs a few hash
//! lookups and trie steps per request.

pub mod criteria;
pub mod matcher;
pub mod rewrite;

use std::fmt;
use std::time::Duration;

use regex_automata::PatternSet;

pub use criteria::{Criteria, HeaderList, HeaderLookup, MediaType, ValueMatch};
pub use matcher::{regex_builder, MAX_PATH_BYTES};
use matcher::{FnvMap, Hit, PrefixTrie, RegexGroup, TemplateTrie};
pub use matcher::{Params, Template};
pub use rewrite::{rewrite_path, PathRewrite, RegexRewrite, RewriteScratch};

use crate::http1::head::split_host_port;

/// Most header fields a configured `respond` action may set (checked at compile time).
pub const MAX_LOCAL_HEADERS: usize = 32;

/// Longest host name considered for host matching (longer ones select the default group).
const MAX_HOST_BYTES: usize = 255;

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

/// Where a redirect sends the client; unset parts come from the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redirect {
    /// 301, 302, 303, 307 or 308.
    pub status: u16,
    /// `http` or `https`; default the request's (`https` over TLS).
    pub scheme: Option<String>,
    /// Host; default the request's host (without its port).
    pub host: Option<String>,
    /// Port; default none, or the request's when the host is kept.
    pub port: Option<u16>,
    /// Path (query dropped); default: the request's path and query, verbatim.
    pub path: Option<String>,
}

impl Redirect {
    /// Writes the Location for a request to `req_host` (as sent, maybe with a port), `path` and
    /// `query`, piece by piece through `put`: `scheme://host[:port]path`. Configured parts win;
    /// without a configured path the request's path and query are kept verbatim; a changed
    /// scheme or host drops the request's port unless one is configured. Without any host (an
    /// HTTP/1.0 request without Host, no host configured) the Location is the path alone, a
    /// relative reference, rather than `http:///path`; a target that is not a path (`*`)
    /// becomes `/`. `tls`: the request came over TLS (the scheme kept is then `https`).
    pub fn write_location<E>(
        &self,
        req_host: &[u8],
        path: &[u8],
        query: &[u8],
        tls: bool,
        mut put: impl FnMut(&[u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        let (host, port) = split_host_port(req_host);
        let path = if path.first() == Some(&b'/') {
            path
        } else {
            &b"/"[..]
        };
        if self.host.is_none() && host.is_empty() {
            return match &self.path {
                Some(p) => put(p.as_bytes()),
                None => {
                    // A relative Location starting `//` would name another host (a
                    // network-path reference, RFC 3986 §4.2): one slash only.
                    let extra = path.iter().take_while(|&&b| b == b'/').count() - 1;
                    put(&path[extra..])?;
                    put(query)
                }
            };
        }
        let scheme = match &self.scheme {
            Some(s) => s.as_str(),
            None if tls => "https",
            None => "http",
        };
        put(scheme.as_bytes())?;
        put(b"://")?;
        match &self.host {
            Some(h) => put(h.as_bytes())?,
            None => put(host)?,
        }
        let mut digits = [0u8; 20];
        match (self.port, port) {
            (Some(p), _) => {
                put(b":")?;
                put(crate::http1::encode::decimal(u64::from(p), &mut digits))?;
            }
            (None, Some(p)) if self.host.is_none() && self.scheme.is_none() && !p.is_empty() => {
                put(b":")?;
                put(p)?;
            }
            _ => {}
        }
        match &self.path {
            Some(p) => put(p.as_bytes()),
            None => {
                put(path)?;
                put(query)
            }
        }
    }
}

/// A proxy action.
#[derive(Debug, Clone)]
pub struct ProxyAction {
    /// Index into the generation's upstream list.
    pub upstream: usize,
    /// Path rewrite.
    pub rewrite: PathRewrite,
    /// Send the client's Host instead of the endpoint's.
    pub preserve_host: bool,
    /// Overrides the upstream's `response_timeout`.
    pub response_timeout: Option<Duration>,
    /// Overrides the upstream's `read_timeout`.
    pub read_timeout: Option<Duration>,
}

/// What a matched route does.
#[derive(Debug, Clone)]
pub enum Action {
    /// Forward to an upstream.
    Proxy(ProxyAction),
    /// Answer with a redirect.
    Redirect(Redirect),
    /// Answer with a fixed response.
    Respond(LocalResponse),
}

/// Per-route request limits (override the `[http]` ones).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RouteLimits {
    /// Largest request body (413 beyond): `None` keeps `[http]`'s, `Some(None)` is no limit.
    pub max_body_bytes: Option<Option<u64>>,
    /// Largest request head (431 beyond).
    pub max_head_bytes: Option<usize>,
}

impl RouteLimits {
    /// The largest request body the route takes, given `[http]`'s (`None`: no limit).
    pub fn max_body(&self, http: Option<u64>) -> Option<u64> {
        self.max_body_bytes.unwrap_or(http)
    }
}

/// A route taken out of service: answered 503 with `Retry-After`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Maintenance {
    /// The envelope's message.
    pub message: String,
    /// Retry-After.
    pub retry_after: Duration,
}

/// Which hosts a route serves.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum HostMatch {
    /// Any host (the default group).
    Any,
    /// Exactly this host (lower-cased, no port).
    Exact(String),
    /// Hosts ending with this suffix, dot included (`.example.com` for `*.example.com`).
    Wildcard(String),
}

impl fmt::Display for HostMatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostMatch::Any => f.write_str("*"),
            HostMatch::Exact(h) => f.write_str(h),
            HostMatch::Wildcard(s) => write!(f, "*{s}"),
        }
    }
}

/// How a route matches the path.
#[derive(Debug, Clone)]
pub enum PathMatch {
    /// The path equals this.
    Exact(String),
    /// The path fits this template.
    Template(Template),
    /// The path starts with this.
    Prefix(String),
    /// The whole path matches this regex.
    Regex(String),
}

impl PathMatch {
    fn rank(&self) -> u8 {
        match self {
            PathMatch::Exact(_) => 0,
            PathMatch::Template(_) => 1,
            PathMatch::Prefix(_) => 2,
            PathMatch::Regex(_) => 3,
        }
    }
}

impl fmt::Display for PathMatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PathMatch::Exact(p) => write!(f, "path={p}"),
            PathMatch::Template(t) => write!(f, "template={}", t.source),
            PathMatch::Prefix(p) => write!(f, "prefix={p}"),
            PathMatch::Regex(r) => write!(f, "regex={r}"),
        }
    }
}

/// One compiled route.
#[derive(Debug, Clone)]
pub struct Route {
    /// Name for logs: the `name` key, or `route-N` (1-based config position).
    pub name: String,
    /// Position in the config (0-based).
    pub index: usize,
    /// Explicit priority, higher first (default 0).
    pub priority: i32,
    /// Load-shedding class, 0 (lowest) to 10; 8 and above may use the reserved share of the
    /// gateway's concurrency cap.
    pub priority_class: u8,
    /// Hosts served.
    pub host: HostMatch,
    /// Path matcher.
    pub path: PathMatch,
    /// Non-path criteria.
    pub criteria: Criteria,
    /// The action.
    pub action: Action,
    /// Request limits.
    pub limits: RouteLimits,
    /// When set, the route answers 503 instead of acting.
    pub maintenance: Option<Maintenance>,
}

impl Route {
    /// The template's parameter names (empty for other matchers).
    pub fn param_names(&self) -> &[Box<str>] {
        match &self.path {
            PathMatch::Template(t) => &t.names,
            _ => &[],
        }
    }
}

#[derive(Debug, Clone, Default)]
struct HostGroup {
    exact: FnvMap<Box<[u8]>, Vec<u32>>,
    templates: TemplateTrie,
    prefixes: PrefixTrie,
    regex: Option<RegexGroup>,
    regex_max_priority: i32,
    routes: Vec<u32>,
}

/// A request as routing sees it.
#[derive(Debug, Clone, Copy)]
pub struct RouteRequest<'a, H> {
    /// Method token.
    pub method: &'a [u8],
    /// Host as sent (any case, maybe with a port; empty if none).
    pub host: &'a [u8],
    /// Path, without the query.
    pub path: &'a [u8],
    /// Query, with or without its `?` (empty if none).
    pub query: &'a [u8],
    /// Header fields.
    pub headers: &'a H,
}

/// The route chosen for a request, with its template captures.
#[derive(Debug, Clone, Copy)]
pub struct Match<'t> {
    /// The route.
    pub route: &'t Route,
    /// Template captures (ranges into the request path).
    pub params: Params,
}

#[derive(Debug, Clone, Copy)]
struct Candidate {
    key: (i64, u8, u32),
    hit: Hit,
}

/// Per-worker lookup storage for one table: candidates and the regex match sets.
#[derive(Debug)]
pub struct Scratch {
    hits: Vec<Hit>,
    cands: Vec<Candidate>,
    /// Per host group with regex routes: the match set and this worker's search cache.
    sets: Vec<Option<(PatternSet, regex_automata::meta::Cache)>>,
}

/// Routes compiled for lookup.
#[derive(Clone, Default)]
pub struct RouteTable {
    routes: Vec<Route>,
    exact_hosts: FnvMap<Box<[u8]>, u32>,
    wildcard_hosts: FnvMap<Box<[u8]>, u32>,
    any_host: Option<u32>,
    groups: Vec<HostGroup>,
}

impl fmt::Debug for RouteTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.routes.iter()).finish()
    }
}

impl RouteTable {
    /// Builds the table from routes in config order (`route.index` = position).
    pub fn new(routes: Vec<Route>) -> Result<RouteTable, String> {
        let mut table = RouteTable {
            routes,
            ..RouteTable::default()
        };
        let mut group_of: FnvMap<HostMatch, u32> = FnvMap::default();
        for (i, r) in table.routes.iter().enumerate() {
            let g = *group_of.entry(r.host.clone()).or_insert_with(|| {
                table.groups.push(HostGroup::default());
                (table.groups.len() - 1) as u32
            });
            table.groups[g as usize].routes.push(i as u32);
        }
        for (host, g) in &group_of {
            match host {
                HostMatch::Any => table.any_host = Some(*g),
                HostMatch::Exact(h) => {
                    table.exact_hosts.insert(h.as_bytes().into(), *g);
                }
                HostMatch::Wildcard(s) => {
                    table.wildcard_hosts.insert(s.as_bytes().into(), *g);
                }
            }
        }
        for g in 0..table.groups.len() {
            let mut ids = table.groups[g].routes.clone();
            // Precedence among equals: priority, then config order.
            ids.sort_by_key(|&i| (-table.routes[i as usize].priority, i));
            let mut regexes = Vec::new();
            let mut max_prio = i32::MIN;
            for &i in &ids {
                let r = &table.routes[i as usize];
                let group = &mut table.groups[g];
                match &r.path {
                    PathMatch::Exact(p) => {
                        group.exact.entry(p.as_bytes().into()).or_default().push(i)
                    }
                    PathMatch::Template(t) => group.templates.insert(t, i),
                    PathMatch::Prefix(p) => group.prefixes.insert(p.as_bytes(), i),
                    PathMatch::Regex(re) => {
                        regexes.push((re.clone(), i));
                        max_prio = max_prio.max(r.priority);
                    }
                }
            }
            if !regexes.is_empty() {
                let group = &mut table.groups[g];
                group.regex = Some(RegexGroup::new(&regexes)?);
                group.regex_max_priority = max_prio;
            }
        }
        Ok(table)
    }

    /// Routes in config order.
    pub fn routes(&self) -> &[Route] {
        &self.routes
    }

    /// Lookup storage for this table (one per worker and generation).
    pub fn scratch(&self) -> Scratch {
        Scratch {
            hits: Vec::with_capacity(32),
            cands: Vec::with_capacity(32),
            sets: self
                .groups
                .iter()
                .map(|g| {
                    g.regex
                        .as_ref()
                        .map(|r| (PatternSet::new(r.len()), r.cache()))
                })
                .collect(),
        }
    }

    fn group_for(&self, host: &[u8]) -> Option<u32> {
        let (host, _) = split_host_port(host);
        let host = host.strip_suffix(b".").unwrap_or(host);
        if host.len() <= MAX_HOST_BYTES && !host.is_empty() {
            let mut lower = [0u8; MAX_HOST_BYTES];
            let lower = &mut lower[..host.len()];
            lower.copy_from_slice(host);
            lower.make_ascii_lowercase();
            if let Some(&g) = self.exact_hosts.get(&*lower) {
                return Some(g);
            }
            if !self.wildcard_hosts.is_empty() {
                // Longest suffix first: the leftmost dot.
                for (i, _) in lower.iter().enumerate().filter(|(_, &b)| b == b'.') {
                    if let Some(&g) = self.wildcard_hosts.get(&lower[i..]) {
                        return Some(g);
                    }
                }
            }
        }
        self.any_host
    }

    /// The route for a request, or `None` (404).
    pub fn lookup<'t, H: HeaderLookup>(
        &'t self,
        req: &RouteRequest<'_, H>,
        scratch: &mut Scratch,
    ) -> Option<Match<'t>> {
        let g = self.group_for(req.host)?;
        let group = &self.groups[g as usize];
        scratch.cands.clear();
        if let Some(ids) = group.exact.get(req.path) {
            for (order, &i) in ids.iter().enumerate() {
                let hit = Hit {
                    route: i,
                    order: order as u32,
                    params: Params::default(),
                };
                scratch.cands.push(self.candidate(hit));
            }
        }
        for matches in [0, 1] {
            scratch.hits.clear();
            if matches == 0 {
                group.templates.matches(req.path, &mut scratch.hits);
            } else {
                group.prefixes.matches(req.path, &mut scratch.hits);
            }
            for &hit in &scratch.hits {
                let c = self.candidate(hit);
                scratch.cands.push(c);
            }
        }
        scratch.cands.sort_unstable_by_key(|c| c.key);
        let mut best: Option<(i32, Match<'t>)> = None;
        for c in &scratch.cands {
            let route = &self.routes[c.hit.route as usize];
            if route.criteria.applies(req.method, req.query, req.headers) {
                best = Some((
                    route.priority,
                    Match {
                        route,
                        params: c.hit.params,
                    },
                ));
                break;
            }
        }
        if let Some(regex) = &group.regex {
            if best.is_none_or(|(p, _)| group.regex_max_priority > p) {
                if let Some(Some((set, cache))) = scratch.sets.get_mut(g as usize) {
                    regex.matches(req.path, set, cache);
                    for pid in set.iter() {
                        let route = &self.routes[regex.routes[pid.as_usize()] as usize];
                        if best.is_some_and(|(p, _)| route.priority <= p) {
                            break;
                        }
                        if route.criteria.applies(req.method, req.query, req.headers) {
                            return Some(Match {
                                route,
                                params: Params::default(),
                            });
                        }
                    }
                }
            }
        }
        best.map(|(_, m)| m)
    }

    fn candidate(&self, hit: Hit) -> Candidate {
        let r = &self.routes[hit.route as usize];
        Candidate {
            key: (-(r.priority as i64), r.path.rank(), hit.order),
            hit,
        }
    }

    /// Warnings about routes that can never be chosen: same host group, a route with no
    /// criteria that outranks another whose every path it also matches.
    pub fn conflicts(&self) -> Vec<String> {
        let mut out = Vec::new();
        for group in &self.groups {
            for &b in &group.routes {
                let rb = &self.routes[b as usize];
                let shadow = group.routes.iter().find(|&&a| {
                    let ra = &self.routes[a as usize];
                    a != b
                        && ra.criteria.is_empty()
                        && outranks(ra, rb)
                        && covers(&ra.path, &rb.path)
                });
                if let Some(&a) = shadow {
                    let ra = &self.routes[a as usize];
                    out.push(format!(
                        "route `{}` (host {}, {}) is unreachable: route `{}` ({}) matches every request it could and comes first",
                        rb.name, rb.host, rb.path, ra.name, ra.path
                    ));
                }
            }
        }
        out
    }
}

/// Whether `a` is tried before `b` whenever both match.
fn outranks(a: &Route, b: &Route) -> bool {
    let key = |r: &Route| (-(r.priority as i64), r.path.rank());
    match key(a).cmp(&key(b)) {
        std::cmp::Ordering::Less => true,
        std::cmp::Ordering::Greater => false,
        std::cmp::Ordering::Equal => match (&a.path, &b.path) {
            (PathMatch::Prefix(pa), PathMatch::Prefix(pb)) if pa.len() != pb.len() => {
                pa.len() > pb.len()
            }
            _ => a.index < b.index,
        },
    }
}

/// Whether every path `b` matches is also matched by `a` (conservatively: false when unsure).
fn covers(a: &PathMatch, b: &PathMatch) -> bool {
    match (a, b) {
        (PathMatch::Exact(x), PathMatch::Exact(y)) => x == y,
        (PathMatch::Template(x), PathMatch::Template(y)) => x.segments == y.segments,
        (PathMatch::Regex(x), PathMatch::Regex(y)) => x == y,
        (PathMatch::Prefix(p), PathMatch::Exact(e))
        | (PathMatch::Prefix(p), PathMatch::Prefix(e)) => e.starts_with(p.as_str()),
        (PathMatch::Prefix(p), PathMatch::Template(t)) => {
            t.literal_prefix().starts_with(p.as_str())
        }
        (PathMatch::Prefix(p), PathMatch::Regex(_)) => p == "/",
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(name: &str, host: HostMatch, path: PathMatch, priority: i32) -> Route {
        Route {
            name: name.into(),
            index: 0,
            priority,
            priority_class: 5,
            host,
            path,
            criteria: Criteria::default(),
            action: Action::Respond(LocalResponse {
                status: 200,
                headers: vec![],
                body: vec![],
            }),
            limits: RouteLimits::default(),
            maintenance: None,
        }
    }

    fn table(mut routes: Vec<Route>) -> RouteTable {
        for (i, r) in routes.iter_mut().enumerate() {
            r.index = i;
        }
        RouteTable::new(routes).unwrap()
    }

    fn find(t: &RouteTable, host: &str, path: &str) -> Option<String> {
        let headers = HeaderList::default();
        let req = RouteRequest {
            method: b"GET",
            host: host.as_bytes(),
            path: path.as_bytes(),
            query: b"",
            headers: &headers,
        };
        let mut s = t.scratch();
        t.lookup(&req, &mut s).map(|m| m.route.name.clone())
    }

    #[test]
    fn kinds_rank_exact_template_prefix_regex() {
        let t = table(vec![
            route(
                "regex",
                HostMatch::Any,
                PathMatch::Regex("/users/[0-9]+".into()),
                0,
            ),
            route(
                "prefix",
                HostMatch::Any,
                PathMatch::Prefix("/users/".into()),
                0,
            ),
            route(
                "template",
                HostMatch::Any,
                PathMatch::Template(Template::parse("/users/{id}").unwrap()),
                0,
            ),
            route(
                "exact",
                HostMatch::Any,
                PathMatch::Exact("/users/42".into()),
                0,
            ),
        ]);
        assert_eq!(find(&t, "a", "/users/42").as_deref(), Some("exact"));
        assert_eq!(find(&t, "a", "/users/7").as_deref(), Some("template"));
        assert_eq!(find(&t, "a", "/users/7/x").as_deref(), Some("prefix"));
        assert_eq!(find(&t, "a", "/other").as_deref(), None);
    }

    #[test]
    fn locations_without_a_host_are_relative() {
        let loc = |rd: &Redirect, host: &[u8], path: &[u8], query: &[u8]| {
            let mut out = Vec::new();
            rd.write_location(host, path, query, false, |p| {
                out.extend_from_slice(p);
                Ok::<(), ()>(())
            })
            .unwrap();
            String::from_utf8(out).unwrap()
        };
        let keep = Redirect {
            status: 302,
            scheme: None,
            host: None,
            port: None,
            path: None,
        };
        assert_eq!(
            loc(&keep, b"a.example:8080", b"/x", b"?q"),
            "http://a.example:8080/x?q"
        );
        assert_eq!(loc(&keep, b"", b"/x", b"?q"), "/x?q");
        assert_eq!(loc(&keep, b"", b"//evil.example/x", b""), "/evil.example/x");
        assert_eq!(loc(&keep, b"", b"///x", b"?q"), "/x?q");
        assert_eq!(loc(&keep, b"a.example", b"*", b""), "http://a.example/");
        // Over TLS the scheme kept is https (and so is the port).
        let mut out = Vec::new();
        keep.write_location(b"a.example:8443", b"/x", b"", true, |p| {
            out.extend_from_slice(p);
            Ok::<(), ()>(())
        })
        .unwrap();
        assert_eq!(out, b"https://a.example:8443/x");
        let to = Redirect {
            host: Some("b.example".into()),
            ..keep
        };
        assert_eq!(loc(&to, b"", b"/x", b""), "http://b.example/x");
    }

    #[test]
    fn priority_beats_kind() {
        let t = table(vec![
            route("exact", HostMatch::Any, PathMatch::Exact("/a".into()), 0),
            route("regex", HostMatch::Any, PathMatch::Regex("/.*".into()), 5),
        ]);
        assert_eq!(find(&t, "x", "/a").as_deref(), Some("regex"));
    }

    #[test]
    fn host_groups() {
        let t = table(vec![
            route(
                "exact-host",
                HostMatch::Exact("api.example.com".into()),
                PathMatch::Prefix("/".into()),
                0,
            ),
            route(
                "wild",
                HostMatch::Wildcard(".example.com".into()),
                PathMatch::Prefix("/".into()),
                0,
            ),
            route(
                "deeper-wild",
                HostMatch::Wildcard(".eu.example.com".into()),
                PathMatch::Prefix("/".into()),
                0,
            ),
            route("default", HostMatch::Any, PathMatch::Prefix("/x".into()), 0),
        ]);
        assert_eq!(
            find(&t, "API.Example.com:8443", "/").as_deref(),
            Some("exact-host")
        );
        assert_eq!(find(&t, "www.example.com", "/").as_deref(), Some("wild"));
        assert_eq!(
            find(&t, "a.eu.example.com", "/").as_deref(),
            Some("deeper-wild")
        );
        assert_eq!(find(&t, "example.com", "/x").as_deref(), Some("default"));
        assert_eq!(find(&t, "other", "/x").as_deref(), Some("default"));
        assert_eq!(find(&t, "www.example.com", "/x").as_deref(), Some("wild"));
        // No fallback from a selected group to the default one.
        assert_eq!(find(&t, "other", "/y"), None);
    }

    #[test]
    fn conflicts_are_reported() {
        let t = table(vec![
            route("all", HostMatch::Any, PathMatch::Prefix("/".into()), 10),
            route("never", HostMatch::Any, PathMatch::Exact("/x".into()), 0),
            route(
                "dup-a",
                HostMatch::Exact("h".into()),
                PathMatch::Exact("/d".into()),
                0,
            ),
            route(
                "dup-b",
                HostMatch::Exact("h".into()),
                PathMatch::Exact("/d".into()),
                0,
            ),
            route(
                "fine",
                HostMatch::Exact("h".into()),
                PathMatch::Prefix("/e".into()),
                0,
            ),
        ]);
        let c = t.conflicts();
        assert_eq!(c.len(), 2, "{c:?}");
        assert!(c[0].contains("`never`") && c[0].contains("`all`"));
        assert!(c[1].contains("`dup-b`") && c[1].contains("`dup-a`"));
    }
}
