//! Path rewriting for proxy routes: `strip_prefix` then `add_prefix`, or a regex rewrite whose
//! replacement expands `$1` / `${name}` from the pattern's groups and the route's `{param}`
//! captures. The query string is never touched here (the caller keeps it).

use regex_automata::meta::{self, Regex};
use regex_automata::util::captures::Captures;
use regex_automata::Input;

use super::matcher::{regex_builder, Params};

/// A piece of a parsed replacement.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Literal(Box<[u8]>),
    /// `$N` / `${N}`
    Index(usize),
    /// `$name` / `${name}`
    Name(Box<str>),
}

/// A compiled `rewrite = { pattern, replacement }`.
#[derive(Debug, Clone)]
pub struct RegexRewrite {
    /// The pattern (unanchored, as configured; on bytes, see `matcher::regex_builder`).
    pub regex: Regex,
    /// The pattern as configured.
    pub pattern: String,
    /// The replacement as configured.
    pub replacement: String,
    parts: Vec<Part>,
}

impl RegexRewrite {
    /// Compiles a rewrite; the error says what is wrong.
    pub fn new(pattern: &str, replacement: &str) -> Result<RegexRewrite, String> {
        let regex = regex_builder()
            .build(pattern)
            .map_err(|e| format!("invalid rewrite pattern: {e}"))?;
        if replacement
            .bytes()
            .any(|b| b <= b' ' || b == 0x7f || b == b'?' || b == b'#')
        {
            return Err(
                "the rewrite replacement may not contain spaces, control characters, '?' or '#'"
                    .into(),
            );
        }
        Ok(RegexRewrite {
            regex,
            pattern: pattern.to_string(),
            replacement: replacement.to_string(),
            parts: parse_replacement(replacement.as_bytes()),
        })
    }

    /// Search storage for one worker (a cache and capture slots), so a rewrite neither locks
    /// nor allocates.
    pub fn scratch(&self) -> RewriteScratch {
        RewriteScratch {
            cache: self.regex.create_cache(),
            caps: self.regex.create_captures(),
        }
    }
}

/// A worker's search storage for one regex rewrite (see [`RegexRewrite::scratch`]).
#[derive(Debug, Clone)]
pub struct RewriteScratch {
    cache: meta::Cache,
    caps: Captures,
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// Splits a replacement into literals and references (the reference's `expand_substitution`
/// grammar): `$N`, `$name`, `${name}`; a `$` not followed by an identifier or a closed `{...}`
/// stays literal.
fn parse_replacement(r: &[u8]) -> Vec<Part> {
    let mut parts = Vec::new();
    let mut lit = Vec::new();
    let mut i = 0;
    while i < r.len() {
        if r[i] != b'$' {
            lit.push(r[i]);
            i += 1;
            continue;
        }
        let (name, next) = if r.get(i + 1) == Some(&b'{') {
            match r[i + 2..].iter().position(|&b| b == b'}') {
                Some(len) if len > 0 => (&r[i + 2..i + 2 + len], i + 3 + len),
                _ => (&r[0..0], i + 1),
            }
        } else {
            let len = r[i + 1..].iter().take_while(|&&b| is_ident(b)).count();
            (&r[i + 1..i + 1 + len], i + 1 + len)
        };
        if name.is_empty() {
            lit.push(b'$');
            i += 1;
            continue;
        }
        if !lit.is_empty() {
            parts.push(Part::Literal(std::mem::take(&mut lit).into()));
        }
        let text = String::from_utf8_lossy(name).into_owned();
        parts.push(match text.parse::<usize>() {
            Ok(n) => Part::Index(n),
            Err(_) => Part::Name(text.into()),
        });
        i = next;
    }
    if !lit.is_empty() {
        parts.push(Part::Literal(lit.into()));
    }
    parts
}

/// How a proxy route rewrites the path.
#[derive(Debug, Clone, Default)]
pub enum PathRewrite {
    /// Unchanged.
    #[default]
    None,
    /// `strip_prefix` (when the path starts with it) then `add_prefix`.
    Prefix {
        /// Removed from the front.
        strip: Option<String>,
        /// Put in front.
        add: Option<String>,
    },
    /// A regex substitution.
    Regex(RegexRewrite),
}

/// Writes the rewritten `path` into `out` (cleared first). `params` are the template captures
/// of this request (with `param_names` from its route); `locs` is reusable capture storage for
/// a regex rewrite (from [`RegexRewrite::scratch`]).
pub fn rewrite_path(
    rewrite: &PathRewrite,
    path: &[u8],
    params: &Params,
    param_names: &[Box<str>],
    scratch: Option<&mut RewriteScratch>,
    out: &mut Vec<u8>,
) {
    out.clear();
    match rewrite {
        PathRewrite::None => out.extend_from_slice(path),
        PathRewrite::Prefix { strip, add } => {
            // Whole segments only: `/api` strips `/api/x` and `/api`, never `/apiary` or
            // `/api..` (which would leave `..` behind as a segment of its own). What is left
            // starts with `/` or is empty: a prefix written with its trailing `/` leaves that
            // slash to the rest. Every slash of the request stays: `/api//admin` stripped of
            // `/api/` is `//admin`, not `/admin`, which is another path (one that a route
            // more specific than this one, a deny, may hold).
            let rest = match strip {
                Some(p) if p.ends_with('/') && path.starts_with(p.as_bytes()) => {
                    &path[p.len() - 1..]
                }
                Some(p)
                    if path.starts_with(p.as_bytes())
                        && matches!(path.get(p.len()), None | Some(b'/')) =>
                {
                    &path[p.len()..]
                }
                _ => path,
            };
            // At the junction the configured prefix gives up its trailing `/` to the rest's
            // first one: never a slash of the request.
            let add = add.as_deref().map_or(&b""[..], str::as_bytes);
            let add = match (add.split_last(), rest.first()) {
                (Some((b'/', head)), Some(b'/')) => head,
                _ => add,
            };
            out.extend_from_slice(add);
            if out.is_empty() && rest.is_empty() {
                out.push(b'/');
            }
            out.extend_from_slice(rest);
        }
        PathRewrite::Regex(rw) => {
            let Some(RewriteScratch { cache, caps }) = scratch else {
                out.extend_from_slice(path);
                return;
            };
            rw.regex
                .search_captures_with(cache, &Input::new(path), caps);
            let Some(m) = caps.get_match() else {
                // A rewrite that does not apply leaves the path as it was.
                out.extend_from_slice(path);
                return;
            };
            out.extend_from_slice(&path[..m.start()]);
            for part in &rw.parts {
                match part {
                    Part::Literal(l) => out.extend_from_slice(l),
                    Part::Index(n) => {
                        if let Some(span) = caps.get_group(*n) {
                            out.extend_from_slice(&path[span.range()]);
                        }
                    }
                    Part::Name(name) => {
                        if let Some(span) = caps.get_group_by_name(name) {
                            out.extend_from_slice(&path[span.range()]);
                        } else if let Some(v) = params.value(path, param_names, name) {
                            out.extend_from_slice(v);
                        }
                    }
                }
            }
            out.extend_from_slice(&path[m.end()..]);
            if out.first() != Some(&b'/') {
                out.insert(0, b'/');
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(rw: &PathRewrite, path: &str) -> String {
        let mut out = Vec::new();
        let mut scratch = match rw {
            PathRewrite::Regex(r) => Some(r.scratch()),
            _ => None,
        };
        rewrite_path(
            rw,
            path.as_bytes(),
            &Params::default(),
            &[],
            scratch.as_mut(),
            &mut out,
        );
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn prefix_strip_then_add() {
        let rw = PathRewrite::Prefix {
            strip: Some("/api".into()),
            add: Some("/v2".into()),
        };
        assert_eq!(run(&rw, "/api/users"), "/v2/users");
        assert_eq!(run(&rw, "/api"), "/v2");
        // Whole segments only: no `..` left behind as a segment, no `/apiary` cut in two.
        assert_eq!(run(&rw, "/api../admin"), "/v2/api../admin");
        assert_eq!(run(&rw, "/apiary"), "/v2/apiary");
        assert_eq!(
            run(&rw, "/other"),
            "/v2/other",
            "strip does not apply, add does"
        );
        let rw = PathRewrite::Prefix {
            strip: Some("/api/".into()),
            add: None,
        };
        assert_eq!(run(&rw, "/api/x"), "/x");
        assert_eq!(run(&rw, "/api/"), "/");
        let rw = PathRewrite::Prefix {
            strip: None,
            add: Some("/base/".into()),
        };
        assert_eq!(
            run(&rw, "/x"),
            "/base/x",
            "no doubled slash at the junction"
        );
    }

    #[test]
    fn prefix_rewrites_keep_every_slash_of_the_request() {
        // An empty segment is the request's own: dropped, `/api//admin` would become the
        // path a route for `/api/admin` decides on.
        let strip = |p: &str, add: Option<&str>| PathRewrite::Prefix {
            strip: Some(p.into()),
            add: add.map(Into::into),
        };
        assert_eq!(run(&strip("/api/", None), "/api//admin"), "//admin");
        assert_eq!(run(&strip("/api", None), "/api//admin"), "//admin");
        assert_eq!(
            run(&strip("/api", Some("/v2/")), "/api//admin"),
            "/v2//admin"
        );
        assert_eq!(
            run(&strip("/api/", Some("/v2")), "/api//admin"),
            "/v2//admin"
        );
        assert_eq!(
            run(&strip("/api/", Some("/v2/")), "/api/admin"),
            "/v2/admin"
        );
        assert_eq!(run(&strip("/api/", Some("/v2/")), "/api/"), "/v2/");
        assert_eq!(run(&strip("/api/", Some("/v2")), "/api/"), "/v2/");
        assert_eq!(run(&strip("/", None), "//x"), "//x");
        let add = PathRewrite::Prefix {
            strip: None,
            add: Some("/v2/".into()),
        };
        assert_eq!(run(&add, "//admin"), "/v2//admin");
        assert_eq!(run(&add, "/admin"), "/v2/admin");
        assert_eq!(run(&add, "/"), "/v2/");
    }

    #[test]
    fn substitution_rules() {
        let parts = parse_replacement(b"/a/$1/${name}/$x$/${}/$");
        assert_eq!(
            parts,
            vec![
                Part::Literal(b"/a/".as_slice().into()),
                Part::Index(1),
                Part::Literal(b"/".as_slice().into()),
                Part::Name("name".into()),
                Part::Literal(b"/".as_slice().into()),
                Part::Name("x".into()),
                Part::Literal(b"$/${}/$".as_slice().into()),
            ]
        );
        let rw = PathRewrite::Regex(
            RegexRewrite::new(r"^/v(\d+)/(?P<rest>.*)$", "/api/$1/${rest}/$9").unwrap(),
        );
        assert_eq!(
            run(&rw, "/v3/users/7"),
            "/api/3/users/7/",
            "unknown references expand to nothing"
        );
        assert_eq!(run(&rw, "/nope"), "/nope", "no match: unchanged");
        let rw = PathRewrite::Regex(RegexRewrite::new(r"/old/", "new/").unwrap());
        assert_eq!(
            run(&rw, "/old/x"),
            "/new/x",
            "unanchored: the matched part is replaced"
        );
        assert!(RegexRewrite::new("(", "/x").is_err());
        assert!(RegexRewrite::new("a", "/x y").is_err());
    }
}
