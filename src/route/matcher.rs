//! Path matchers of one host group, each answering "which routes match this path" without
//! allocating and without scanning every route:
//! - exact paths: a hash map;
//! - templates (`/users/{id}/files/{*rest}`): a segment trie walked literal-first;
//! - prefixes: a compressed byte trie, every prefix of the path on the way down;
//! - regexes: one multi-pattern automaton that reports every matching pattern in one pass.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use regex_automata::meta;
use regex_automata::util::syntax;
use regex_automata::{Input, MatchKind, PatternSet};

/// Longest path routing handles: capture offsets are 16-bit. `http.max_request_line_bytes`
/// cannot be configured above it.
pub const MAX_PATH_BYTES: usize = u16::MAX as usize;

/// The builder of every route and rewrite regex. Paths are bytes and may hold bytes of 0x80
/// and above (UTF-8), so the regexes work on bytes: `.` and negated classes match any byte,
/// and `\w`, `\d`, `\s` and case folding are ASCII.
pub fn regex_builder() -> meta::Builder {
    let mut b = meta::Regex::builder();
    b.syntax(syntax::Config::new().unicode(false).utf8(false));
    b.configure(meta::Config::new().utf8_empty(false));
    b
}

/// Most `{param}` captures in one template.
pub const MAX_PARAMS: usize = 8;

/// FNV-1a: route keys come from config, and lookups of short keys dominate.
#[derive(Debug, Default, Clone, Copy)]
pub struct Fnv(u64);

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        let mut h = if self.0 == 0 {
            0xcbf2_9ce4_8422_2325
        } else {
            self.0
        };
        for &b in bytes {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        self.0 = h;
    }
}

/// A hash map with [`Fnv`].
pub type FnvMap<K, V> = HashMap<K, V, BuildHasherDefault<Fnv>>;

/// Template captures of one match: byte ranges into the request path, in the order of the
/// template's parameter names.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Params {
    spans: [(u16, u16); MAX_PARAMS],
    len: u8,
    path_len: u16,
}

impl Params {
    /// The value of parameter `name` in `path` (the path this match was made on).
    pub fn value<'p>(&self, path: &'p [u8], names: &[Box<str>], name: &str) -> Option<&'p [u8]> {
        let i = names.iter().position(|n| &**n == name)?;
        if i >= self.len as usize || path.len() != self.path_len as usize {
            return None;
        }
        let (s, e) = self.spans[i];
        path.get(s as usize..e as usize)
    }

    /// Number of captures.
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// One segment of a compiled template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    /// Must equal this text.
    Literal(Box<[u8]>),
    /// `{name}`: one non-empty segment.
    Param,
    /// `{*name}`: the rest of the path (last only; may be empty).
    Rest,
}

/// A compiled path template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    /// The template as configured.
    pub source: String,
    /// Its segments.
    pub segments: Vec<Segment>,
    /// Parameter names in order (rest included).
    pub names: Vec<Box<str>>,
}

impl Template {
    /// Parses `/a/{x}/b/{*rest}`; the error says what is wrong.
    pub fn parse(source: &str) -> Result<Template, String> {
        let Some(body) = source.strip_prefix('/') else {
            return Err("a path template starts with '/'".into());
        };
        let mut segments = Vec::new();
        let mut names: Vec<Box<str>> = Vec::new();
        let raw: Vec<&str> = body.split('/').collect();
        for (i, seg) in raw.iter().enumerate() {
            if let Some(inner) = seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
                let (rest, name) = match inner.strip_prefix('*') {
                    Some(n) => (true, n),
                    None => (false, inner),
                };
                if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
                {
                    return Err(format!(
                        "`{{{inner}}}`: parameter names use letters, digits and '_'"
                    ));
                }
                if names.iter().any(|n| &**n == name) {
                    return Err(format!("parameter `{name}` appears twice"));
                }
                if rest && i + 1 != raw.len() {
                    return Err(format!("`{{*{name}}}` must be the last segment"));
                }
                names.push(name.into());
                segments.push(if rest { Segment::Rest } else { Segment::Param });
            } else if seg.contains('{') || seg.contains('}') {
                return Err(format!(
                    "`{seg}`: a parameter must be a whole segment, like /{{id}}/"
                ));
            } else if seg
                .bytes()
                .any(|b| !(0x21..0x7f).contains(&b) || b == b'?' || b == b'#')
            {
                return Err(format!("`{seg}`: invalid character in a path template"));
            } else {
                segments.push(Segment::Literal(seg.as_bytes().into()));
            }
        }
        if names.len() > MAX_PARAMS {
            return Err(format!("at most {MAX_PARAMS} parameters per template"));
        }
        if !names.is_empty() || segments.iter().any(|s| !matches!(s, Segment::Literal(_))) {
            Ok(Template {
                source: source.to_string(),
                segments,
                names,
            })
        } else {
            Err("a template without parameters: use `path` for an exact path".into())
        }
    }

    /// The literal text before the first parameter (for conflict analysis).
    pub fn literal_prefix(&self) -> String {
        let mut p = String::from("/");
        for s in &self.segments {
            match s {
                Segment::Literal(l) => {
                    p.push_str(&String::from_utf8_lossy(l));
                    p.push('/');
                }
                _ => break,
            }
        }
        p
    }
}

/// A route found by a matcher, with what ranks it among the others of the same kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hit {
    /// Route index in the table.
    pub route: u32,
    /// Order among hits of the same kind (lower first).
    pub order: u32,
    /// Template captures (templates only).
    pub params: Params,
}

#[derive(Debug, Default, Clone)]
struct TNode {
    literals: FnvMap<Box<[u8]>, u32>,
    param: Option<u32>,
    /// Routes ending here.
    ends: Vec<u32>,
    /// Routes whose `{*rest}` starts here.
    rests: Vec<u32>,
}

/// Segment trie of templates.
#[derive(Debug, Clone)]
pub struct TemplateTrie {
    nodes: Vec<TNode>,
}

impl Default for TemplateTrie {
    fn default() -> Self {
        TemplateTrie {
            nodes: vec![TNode::default()],
        }
    }
}

impl TemplateTrie {
    /// Adds a route's template. Routes must be added in precedence order among equals.
    pub fn insert(&mut self, t: &Template, route: u32) {
        let mut node = 0usize;
        for seg in &t.segments {
            match seg {
                Segment::Literal(l) => {
                    let next = match self.nodes[node].literals.get(l) {
                        Some(&n) => n as usize,
                        None => {
                            self.nodes.push(TNode::default());
                            let n = self.nodes.len() - 1;
                            self.nodes[node].literals.insert(l.clone(), n as u32);
                            n
                        }
                    };
                    node = next;
                }
                Segment::Param => {
                    node = match self.nodes[node].param {
                        Some(n) => n as usize,
                        None => {
                            self.nodes.push(TNode::default());
                            let n = self.nodes.len() - 1;
                            self.nodes[node].param = Some(n as u32);
                            n
                        }
                    };
                }
                Segment::Rest => {
                    self.nodes[node].rests.push(route);
                    return;
                }
            }
        }
        self.nodes[node].ends.push(route);
    }

    /// Every template route matching `path`, most specific first (a literal segment beats a
    /// parameter, which beats a rest), pushed onto `out`.
    pub fn matches(&self, path: &[u8], out: &mut Vec<Hit>) {
        // invariant: paths are at most MAX_PATH_BYTES (http.max_request_line_bytes is capped
        // there), so the length check never skips a route a request could reach.
        if path.first() != Some(&b'/') || path.len() > MAX_PATH_BYTES {
            return;
        }
        let mut stack = Params {
            path_len: path.len() as u16,
            ..Params::default()
        };
        let mut order = 0u32;
        self.walk(0, path, 1, &mut stack, &mut order, out);
    }

    /// `pos` is the offset in `path` where the current segment starts.
    #[allow(clippy::too_many_arguments)]
    fn walk(
        &self,
        node: usize,
        path: &[u8],
        pos: usize,
        params: &mut Params,
        order: &mut u32,
        out: &mut Vec<Hit>,
    ) {
        let n = &self.nodes[node];
        let seg_end = path[pos..]
            .iter()
            .position(|&b| b == b'/')
            .map_or(path.len(), |i| pos + i);
        let seg = &path[pos..seg_end];
        let last = seg_end == path.len();
        // Literal child.
        if let Some(&child) = n.literals.get(seg) {
            if last {
                // A rest after this literal would need a following '/': not here.
                self.emit_end(child as usize, params, order, out);
            } else {
                self.walk(child as usize, path, seg_end + 1, params, order, out);
            }
        }
        // Parameter child: one non-empty segment.
        if let Some(child) = n.param {
            if !seg.is_empty() && (params.len as usize) < MAX_PARAMS {
                params.spans[params.len as usize] = (pos as u16, seg_end as u16);
                params.len += 1;
                if last {
                    self.emit_end(child as usize, params, order, out);
                } else {
                    self.walk(child as usize, path, seg_end + 1, params, order, out);
                }
                params.len -= 1;
            }
        }
        // Rest: everything from here (may be empty).
        if !n.rests.is_empty() && (params.len as usize) < MAX_PARAMS {
            params.spans[params.len as usize] = (pos as u16, path.len() as u16);
            params.len += 1;
            for &r in &n.rests {
                out.push(Hit {
                    route: r,
                    order: *order,
                    params: *params,
                });
                *order += 1;
            }
            params.len -= 1;
        }
    }

    fn emit_end(&self, node: usize, params: &Params, order: &mut u32, out: &mut Vec<Hit>) {
        for &r in &self.nodes[node].ends {
            out.push(Hit {
                route: r,
                order: *order,
                params: *params,
            });
            *order += 1;
        }
    }
}

#[derive(Debug, Default, Clone)]
struct PNode {
    label: Box<[u8]>,
    /// Children sorted by the first byte of their label.
    children: Vec<(u8, u32)>,
    routes: Vec<u32>,
}

/// Compressed byte trie of path prefixes.
#[derive(Debug, Clone)]
pub struct PrefixTrie {
    nodes: Vec<PNode>,
}

impl Default for PrefixTrie {
    fn default() -> Self {
        PrefixTrie {
            nodes: vec![PNode::default()],
        }
    }
}

impl PrefixTrie {
    /// Adds a route's prefix (routes in precedence order among equal prefixes).
    pub fn insert(&mut self, prefix: &[u8], route: u32) {
        let mut node = 0usize;
        let mut rest = prefix;
        loop {
            if rest.is_empty() {
                self.nodes[node].routes.push(route);
                return;
            }
            let first = rest[0];
            match self.nodes[node]
                .children
                .binary_search_by_key(&first, |&(b, _)| b)
            {
                Err(at) => {
                    self.nodes.push(PNode {
                        label: rest.into(),
                        children: Vec::new(),
                        routes: vec![route],
                    });
                    let n = (self.nodes.len() - 1) as u32;
                    self.nodes[node].children.insert(at, (first, n));
                    return;
                }
                Ok(at) => {
                    let child = self.nodes[node].children[at].1 as usize;
                    let label = self.nodes[child].label.clone();
                    let common = label.iter().zip(rest).take_while(|(a, b)| a == b).count();
                    if common < label.len() {
                        // Split the child: a new node for the common part.
                        self.nodes.push(PNode {
                            label: label[..common].into(),
                            children: vec![(label[common], child as u32)],
                            routes: Vec::new(),
                        });
                        let mid = self.nodes.len() - 1;
                        self.nodes[child].label = label[common..].into();
                        self.nodes[node].children[at].1 = mid as u32;
                        node = mid;
                    } else {
                        node = child;
                    }
                    rest = &rest[common..];
                }
            }
        }
    }

    /// Every prefix route matching `path`, longest prefix first, pushed onto `out`.
    pub fn matches(&self, path: &[u8], out: &mut Vec<Hit>) {
        let start = out.len();
        let mut node = 0usize;
        let mut pos = 0usize;
        loop {
            let n = &self.nodes[node];
            for &r in &n.routes {
                out.push(Hit {
                    route: r,
                    order: u32::MAX - pos as u32,
                    params: Params::default(),
                });
            }
            let Some(&b) = path.get(pos) else { break };
            let Ok(at) = n.children.binary_search_by_key(&b, |&(c, _)| c) else {
                break;
            };
            let child = n.children[at].1 as usize;
            let label = &self.nodes[child].label;
            if path.len() - pos < label.len() || path[pos..pos + label.len()] != **label {
                break;
            }
            pos += label.len();
            node = child;
        }
        // Longest first; equal prefixes keep insertion order (stable).
        out[start..].sort_by_key(|h| h.order);
        for (i, h) in out[start..].iter_mut().enumerate() {
            h.order = i as u32;
        }
    }
}

/// The regex routes of a host group as one automaton; pattern `i` is `routes[i]`.
#[derive(Debug, Clone)]
pub struct RegexGroup {
    set: meta::Regex,
    /// Route of each pattern, in precedence order.
    pub routes: Vec<u32>,
}

impl RegexGroup {
    /// Builds the automaton over full-match (`^(?:p)$`) versions of `patterns`.
    pub fn new(patterns: &[(String, u32)]) -> Result<RegexGroup, String> {
        let anchored: Vec<String> = patterns.iter().map(|(p, _)| format!("^(?:{p})$")).collect();
        // MatchKind::All: an overlapping search reports every pattern that matches.
        let set = regex_builder()
            .configure(
                meta::Config::new()
                    .utf8_empty(false)
                    .match_kind(MatchKind::All),
            )
            .build_many(&anchored)
            .map_err(|e| e.to_string())?;
        Ok(RegexGroup {
            set,
            routes: patterns.iter().map(|(_, r)| *r).collect(),
        })
    }

    /// Number of patterns.
    pub fn len(&self) -> usize {
        self.routes.len()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.routes.is_empty()
    }

    /// Search storage for one worker: with its own cache, a lookup neither locks nor
    /// allocates (the regex's shared cache pool does both under contention).
    pub fn cache(&self) -> meta::Cache {
        self.set.create_cache()
    }

    /// Fills `set` (sized with [`RegexGroup::len`]) with the patterns matching `path`.
    pub fn matches(&self, path: &[u8], set: &mut PatternSet, cache: &mut meta::Cache) {
        set.clear();
        self.set
            .which_overlapping_matches_with(cache, &Input::new(path), set);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hits(trie: &TemplateTrie, path: &str) -> Vec<u32> {
        let mut out = Vec::new();
        trie.matches(path.as_bytes(), &mut out);
        out.iter().map(|h| h.route).collect()
    }

    #[test]
    fn templates_parse() {
        let t = Template::parse("/users/{id}/files/{*rest}").unwrap();
        assert_eq!(t.names, vec!["id".into(), "rest".into()] as Vec<Box<str>>);
        assert_eq!(t.literal_prefix(), "/users/");
        for bad in [
            "users/{id}",
            "/a/{*rest}/b",
            "/a/x{id}",
            "/a/{id}/{id}",
            "/a/{}",
            "/a/b",
            "/a/{i-d}",
        ] {
            assert!(Template::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn template_precedence_and_captures() {
        let mut trie = TemplateTrie::default();
        let routes = [
            "/users/{id}",
            "/users/{id}/posts/{post}",
            "/users/me/{tab}",
            "/static/{*path}",
            "/{*all}",
        ];
        let ts: Vec<Template> = routes.iter().map(|r| Template::parse(r).unwrap()).collect();
        for (i, t) in ts.iter().enumerate() {
            trie.insert(t, i as u32);
        }
        assert_eq!(hits(&trie, "/users/42"), vec![0, 4]);
        assert_eq!(hits(&trie, "/users/42/posts/7"), vec![1, 4]);
        assert_eq!(hits(&trie, "/users/me/settings"), vec![2, 4]);
        assert_eq!(
            hits(&trie, "/users/"),
            vec![4],
            "a parameter is never empty"
        );
        assert_eq!(hits(&trie, "/static/a/b.css"), vec![3, 4]);
        assert_eq!(hits(&trie, "/static/"), vec![3, 4]);
        assert_eq!(hits(&trie, "/"), vec![4]);

        let mut out = Vec::new();
        let path = b"/users/42/posts/7";
        trie.matches(path, &mut out);
        let p = out[0].params;
        assert_eq!(p.value(path, &ts[1].names, "id"), Some(&b"42"[..]));
        assert_eq!(p.value(path, &ts[1].names, "post"), Some(&b"7"[..]));
        let mut out = Vec::new();
        let path = b"/static/a/b.css";
        trie.matches(path, &mut out);
        assert_eq!(
            out[0].params.value(path, &ts[3].names, "path"),
            Some(&b"a/b.css"[..])
        );
    }

    #[test]
    fn prefixes_longest_first() {
        let mut trie = PrefixTrie::default();
        for (i, p) in ["/", "/api/", "/api/v1/", "/apiary", "/api/", "/b"]
            .iter()
            .enumerate()
        {
            trie.insert(p.as_bytes(), i as u32);
        }
        let get = |path: &str| {
            let mut out = Vec::new();
            trie.matches(path.as_bytes(), &mut out);
            out.iter().map(|h| h.route).collect::<Vec<_>>()
        };
        assert_eq!(get("/api/v1/users"), vec![2, 1, 4, 0]);
        assert_eq!(get("/api/v2"), vec![1, 4, 0]);
        assert_eq!(get("/apiary/x"), vec![3, 0]);
        assert_eq!(get("/ap"), vec![0]);
        assert_eq!(get("/b"), vec![5, 0]);
        assert_eq!(get("x"), Vec::<u32>::new());
    }

    /// Capture spans, as `Params` holds them.
    type Spans = Vec<(u16, u16)>;

    /// What a template makes of `path` by the rules alone: `None` when it does not match,
    /// else its capture spans. The path's segments are what follows its leading `/`, split
    /// on `/`; a parameter is one non-empty segment, a rest is everything from the start of
    /// its segment on (so `/a/{*r}` needs the `/` after `a`).
    fn reference_match(t: &Template, path: &[u8]) -> Option<Spans> {
        let body = path.strip_prefix(b"/")?;
        let mut segs = Vec::new();
        let mut start = 1;
        for s in body.split(|&b| b == b'/') {
            segs.push((start, start + s.len()));
            start += s.len() + 1;
        }
        let mut spans = Vec::new();
        for (i, seg) in t.segments.iter().enumerate() {
            if let Segment::Rest = seg {
                let &(s, _) = segs.get(i)?;
                spans.push((s as u16, path.len() as u16));
                return Some(spans);
            }
            let &(s, e) = segs.get(i)?;
            match seg {
                Segment::Literal(l) if **l == path[s..e] => {}
                Segment::Param if e > s => spans.push((s as u16, e as u16)),
                _ => return None,
            }
        }
        (segs.len() == t.segments.len()).then_some(spans)
    }

    /// A template's precedence: position by position, a literal before a parameter before a
    /// rest.
    fn specificity(t: &Template) -> Vec<u8> {
        t.segments
            .iter()
            .map(|s| match s {
                Segment::Literal(_) => 0,
                Segment::Param => 1,
                Segment::Rest => 2,
            })
            .collect()
    }

    fn template_source() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let seg = prop_oneof![Just("a"), Just("b"), Just("ab"), Just(""), Just("{p}")];
        (
            proptest::collection::vec(seg, 0..4),
            proptest::bool::ANY,
            proptest::bool::ANY,
        )
            .prop_map(|(segs, rest, param)| {
                let mut n = 0;
                let mut out: Vec<String> = segs
                    .iter()
                    .map(|s| {
                        if *s == "{p}" {
                            n += 1;
                            format!("{{p{n}}}")
                        } else {
                            s.to_string()
                        }
                    })
                    .collect();
                if rest {
                    out.push("{*r}".into());
                } else if param || n == 0 {
                    out.push("{q}".into());
                }
                format!("/{}", out.join("/"))
            })
    }

    fn path_source() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let seg = prop_oneof![
            Just("a"),
            Just("b"),
            Just("ab"),
            Just(""),
            Just("x"),
            Just("ba")
        ];
        (
            proptest::collection::vec(seg, 0..6),
            proptest::bool::weighted(0.95),
        )
            .prop_map(|(segs, rooted)| {
                let p = segs.join("/");
                if rooted {
                    format!("/{p}")
                } else {
                    p
                }
            })
    }

    proptest::proptest! {
        /// The trie finds exactly the templates the rules match, most specific first (equal
        /// templates in the order they were added), with the same captures.
        #[test]
        fn the_template_trie_agrees_with_the_rules(
            sources in proptest::collection::vec(template_source(), 1..8),
            paths in proptest::collection::vec(path_source(), 1..16),
        ) {
            let ts: Vec<Template> = sources.iter().map(|s| Template::parse(s).unwrap()).collect();
            let mut trie = TemplateTrie::default();
            for (i, t) in ts.iter().enumerate() {
                trie.insert(t, i as u32);
            }
            for path in &paths {
                let path = path.as_bytes();
                let mut expected: Vec<(Vec<u8>, usize, Spans)> = ts
                    .iter()
                    .enumerate()
                    .filter_map(|(i, t)| Some((specificity(t), i, reference_match(t, path)?)))
                    .collect();
                expected.sort();
                let mut out = Vec::new();
                trie.matches(path, &mut out);
                let found: Vec<(usize, Spans)> = out
                    .iter()
                    .map(|h| (h.route as usize, h.params.spans[..h.params.len()].to_vec()))
                    .collect();
                let expected: Vec<(usize, Spans)> =
                    expected.into_iter().map(|(_, i, spans)| (i, spans)).collect();
                proptest::prop_assert_eq!(
                    found, expected, "path {:?}", String::from_utf8_lossy(path)
                );
                let orders: Vec<u32> = out.iter().map(|h| h.order).collect();
                proptest::prop_assert_eq!(orders, (0..out.len() as u32).collect::<Vec<_>>());
            }
        }

        /// The prefix trie finds every prefix the path starts with, longest first (equal
        /// prefixes in the order they were added).
        #[test]
        fn the_prefix_trie_agrees_with_starts_with(
            prefixes in proptest::collection::vec("/[ab/]{0,5}", 1..10),
            paths in proptest::collection::vec("/?[ab/x]{0,7}", 1..16),
        ) {
            let mut trie = PrefixTrie::default();
            for (i, p) in prefixes.iter().enumerate() {
                trie.insert(p.as_bytes(), i as u32);
            }
            for path in &paths {
                let mut expected: Vec<(std::cmp::Reverse<usize>, usize)> = prefixes
                    .iter()
                    .enumerate()
                    .filter(|(_, p)| path.starts_with(p.as_str()))
                    .map(|(i, p)| (std::cmp::Reverse(p.len()), i))
                    .collect();
                expected.sort();
                let mut out = Vec::new();
                trie.matches(path.as_bytes(), &mut out);
                let found: Vec<u32> = out.iter().map(|h| h.route).collect();
                let expected: Vec<u32> = expected.iter().map(|&(_, i)| i as u32).collect();
                proptest::prop_assert_eq!(found, expected, "path {:?}", path);
            }
        }
    }

    #[test]
    fn regex_group_reports_every_full_match() {
        let g = RegexGroup::new(&[
            ("/v[0-9]+/.*".into(), 7),
            ("/v1/users".into(), 9),
            ("/x".into(), 3),
        ])
        .unwrap();
        let mut set = PatternSet::new(g.len());
        let mut cache = g.cache();
        g.matches(b"/v1/users", &mut set, &mut cache);
        let found: Vec<usize> = set.iter().map(|p| p.as_usize()).collect();
        assert_eq!(found, vec![0, 1]);
        g.matches(b"/x/y", &mut set, &mut cache);
        assert!(set.is_empty(), "full matches only");
        // Bytes, not UTF-8: a raw 0xFF byte is matched by `.`.
        g.matches(b"/v1/\xff", &mut set, &mut cache);
        let found: Vec<usize> = set.iter().map(|p| p.as_usize()).collect();
        assert_eq!(found, vec![0]);
    }
}
