//! Non-path route criteria, AND-ed: methods, headers, query parameters, cookies and the Accept
//! media type. All matching is on bytes as sent (no decoding), without allocation.

use crate::http1::{list_elements, trim_ows};

/// Read access to a request's header fields, by name (case-insensitive).
pub trait HeaderLookup {
    /// Every value of the fields named `name`, in order, without surrounding whitespace.
    fn values<'s>(&'s self, name: &'s [u8]) -> impl Iterator<Item = &'s [u8]> + 's;
}

/// What a header, query parameter or cookie must be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ValueMatch {
    /// Present, with any value.
    Present,
    /// Present with exactly this value.
    Exact(Box<[u8]>),
}

impl ValueMatch {
    fn accepts(&self, value: &[u8]) -> bool {
        match self {
            ValueMatch::Present => true,
            ValueMatch::Exact(v) => **v == *value,
        }
    }
}

/// A compiled `accept` criterion: a media type, lower-cased.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MediaType {
    /// `application` in `application/json`.
    pub kind: Box<[u8]>,
    /// `json` in `application/json`.
    pub subtype: Box<[u8]>,
}

impl MediaType {
    /// Parses `type/subtype` (parameters and padding dropped, case folded).
    pub fn parse(text: &str) -> Option<MediaType> {
        let essence = text.split(';').next()?.trim().to_ascii_lowercase();
        let (kind, subtype) = essence.split_once('/')?;
        let ok = |s: &str| !s.is_empty() && s.bytes().all(crate::http1::is_tchar) && s != "*";
        if !ok(kind) || !ok(subtype) {
            return None;
        }
        Some(MediaType {
            kind: kind.as_bytes().into(),
            subtype: subtype.as_bytes().into(),
        })
    }

    /// Whether an Accept field value accepts this type: the most specific listed range that
    /// covers it (`t/s` over `t/*` over `*/*`) has a weight above zero (RFC 9110 §12.5.1), so
    /// `application/json;q=0, */*` refuses JSON.
    pub fn accepted_by(&self, accept: &[u8]) -> bool {
        // (specificity, weight is zero) of the most specific covering range.
        let mut best: Option<(u8, bool)> = None;
        for range in list_elements(accept) {
            let mut parts = range.split(|&b| b == b';');
            let essence = trim_ows(parts.next().unwrap_or(&[]));
            let weight_zero = parts.any(|p| {
                let p = trim_ows(p);
                p.len() >= 2
                    && p[..2].eq_ignore_ascii_case(b"q=")
                    && p[2..].iter().all(|&b| b == b'0' || b == b'.')
            });
            let Some(slash) = essence.iter().position(|&b| b == b'/') else {
                continue;
            };
            let (k, s) = (&essence[..slash], &essence[slash + 1..]);
            let specificity = if k == b"*" && s == b"*" {
                0
            } else if !k.eq_ignore_ascii_case(&self.kind) {
                continue;
            } else if s == b"*" {
                1
            } else if s.eq_ignore_ascii_case(&self.subtype) {
                2
            } else {
                continue;
            };
            match best {
                // Equally specific ranges: any non-zero weight accepts.
                Some((b, zero)) if b == specificity => best = Some((b, zero && weight_zero)),
                Some((b, _)) if b > specificity => {}
                _ => best = Some((specificity, weight_zero)),
            }
        }
        best.is_some_and(|(_, zero)| !zero)
    }
}

/// The criteria of one route.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Criteria {
    /// Allowed methods, case-sensitive; empty allows all.
    pub methods: Vec<Box<[u8]>>,
    /// Header fields (names lower-cased).
    pub headers: Vec<(Box<[u8]>, ValueMatch)>,
    /// Query parameters (names as sent).
    pub query: Vec<(Box<[u8]>, ValueMatch)>,
    /// Cookies (names as sent).
    pub cookies: Vec<(Box<[u8]>, ValueMatch)>,
    /// A media type the request's Accept must accept.
    pub accept: Option<MediaType>,
}

impl Criteria {
    /// Whether there is no criterion at all.
    pub fn is_empty(&self) -> bool {
        self.methods.is_empty()
            && self.headers.is_empty()
            && self.query.is_empty()
            && self.cookies.is_empty()
            && self.accept.is_none()
    }

    /// Whether a request satisfies every criterion.
    pub fn applies<H: HeaderLookup>(&self, method: &[u8], query: &[u8], headers: &H) -> bool {
        if !self.methods.is_empty() && !self.methods.iter().any(|m| **m == *method) {
            return false;
        }
        for (name, want) in &self.headers {
            if !headers.values(name).any(|v| want.accepts(v)) {
                return false;
            }
        }
        for (name, want) in &self.query {
            if !query_params(query).any(|(n, v)| n == &**name && want.accepts(v)) {
                return false;
            }
        }
        for (name, want) in &self.cookies {
            let found = headers
                .values(b"cookie")
                .flat_map(parse_cookies)
                .any(|(n, v)| n == &**name && want.accepts(v));
            if !found {
                return false;
            }
        }
        if let Some(media) = &self.accept {
            let mut any_field = false;
            let mut accepted = false;
            for value in headers.values(b"accept") {
                any_field = true;
                accepted |= media.accepted_by(value);
            }
            // No Accept field: the client accepts anything (RFC 9110 §12.5.1).
            if any_field && !accepted {
                return false;
            }
        }
        true
    }
}

/// `name=value` pairs of a query string (with or without its leading `?`), split on `&` and on
/// the first `=`; a name without `=` has an empty value. Nothing is decoded.
pub fn query_params(query: &[u8]) -> impl Iterator<Item = (&[u8], &[u8])> {
    let query = query.strip_prefix(b"?").unwrap_or(query);
    query
        .split(|&b| b == b'&')
        .filter(|p| !p.is_empty())
        .map(split_first_eq)
}

/// Cookie pairs of one Cookie field value: split on `;`, spaces trimmed, each pair split on the
/// first `=`. Values are matched as sent (no quoting or decoding).
pub fn parse_cookies(value: &[u8]) -> impl Iterator<Item = (&[u8], &[u8])> {
    value
        .split(|&b| b == b';')
        .map(trim_ows)
        .filter(|p| !p.is_empty())
        .map(split_first_eq)
}

fn split_first_eq(pair: &[u8]) -> (&[u8], &[u8]) {
    match pair.iter().position(|&b| b == b'=') {
        Some(i) => (&pair[..i], &pair[i + 1..]),
        None => (pair, &[][..]),
    }
}

/// Header fields as (name, value) pairs: a simple [`HeaderLookup`] for tests and tools.
#[derive(Debug, Clone, Default)]
pub struct HeaderList(pub Vec<(Vec<u8>, Vec<u8>)>);

impl HeaderLookup for HeaderList {
    fn values<'s>(&'s self, name: &'s [u8]) -> impl Iterator<Item = &'s [u8]> + 's {
        self.0
            .iter()
            .filter(move |(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| trim_ows(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(pairs: &[(&str, &str)]) -> HeaderList {
        HeaderList(
            pairs
                .iter()
                .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
                .collect(),
        )
    }

    #[test]
    fn cookies_as_in_the_reference() {
        let pairs: Vec<(&[u8], &[u8])> = parse_cookies(b" a=1; b = 2;c=x=y; flag; ;d=").collect();
        assert_eq!(
            pairs,
            vec![
                (&b"a"[..], &b"1"[..]),
                (b"b ", b" 2"),
                (b"c", b"x=y"),
                (b"flag", b""),
                (b"d", b"")
            ]
        );
    }

    #[test]
    fn query_pairs() {
        let pairs: Vec<(&[u8], &[u8])> = query_params(b"?a=1&&b&c=x=y").collect();
        assert_eq!(
            pairs,
            vec![(&b"a"[..], &b"1"[..]), (b"b", b""), (b"c", b"x=y")]
        );
    }

    #[test]
    fn accept_ranges() {
        let json = MediaType::parse(" Application/JSON ; charset=utf-8").unwrap();
        assert_eq!(&*json.kind, b"application");
        for yes in [
            &b"application/json"[..],
            b"*/*",
            b"application/*",
            b"text/html, application/json;q=0.5",
            b"APPLICATION/JSON",
            b"*/*;q=0, application/json",
            b"application/*;q=0, application/json;q=0.1",
        ] {
            assert!(json.accepted_by(yes), "{:?}", String::from_utf8_lossy(yes));
        }
        for no in [
            &b"text/html"[..],
            b"application/json;q=0",
            b"application/xml",
            b"application/json;q=0.0",
            b"",
            b"application/json;q=0, */*",
            b"application/*;q=0, */*;q=1",
        ] {
            assert!(!json.accepted_by(no), "{:?}", String::from_utf8_lossy(no));
        }
        assert!(MediaType::parse("json").is_none());
        assert!(MediaType::parse("*/*").is_none());
    }

    #[test]
    fn criteria_are_anded() {
        let c = Criteria {
            methods: vec![b"GET".as_slice().into(), b"HEAD".as_slice().into()],
            headers: vec![
                (
                    b"x-env".as_slice().into(),
                    ValueMatch::Exact(b"beta".as_slice().into()),
                ),
                (b"x-debug".as_slice().into(), ValueMatch::Present),
            ],
            query: vec![(
                b"v".as_slice().into(),
                ValueMatch::Exact(b"2".as_slice().into()),
            )],
            cookies: vec![(b"session".as_slice().into(), ValueMatch::Present)],
            accept: MediaType::parse("application/json"),
        };
        let ok = h(&[
            ("X-Env", "beta"),
            ("x-debug", ""),
            ("Cookie", "a=1; session=xyz"),
            ("Accept", "application/json"),
        ]);
        assert!(c.applies(b"GET", b"?v=2&w=3", &ok));
        assert!(!c.applies(b"POST", b"?v=2", &ok), "method");
        assert!(!c.applies(b"GET", b"?v=3", &ok), "query value");
        assert!(!c.applies(b"GET", b"", &ok), "query missing");
        let no_cookie = h(&[("X-Env", "beta"), ("x-debug", "1"), ("Accept", "*/*")]);
        assert!(!c.applies(b"GET", b"?v=2", &no_cookie), "cookie");
        let wrong_env = h(&[("X-Env", "prod"), ("x-debug", ""), ("Cookie", "session=1")]);
        assert!(!c.applies(b"GET", b"?v=2", &wrong_env), "header value");
        let html_only = h(&[
            ("X-Env", "beta"),
            ("x-debug", ""),
            ("Cookie", "session=1"),
            ("Accept", "text/html"),
        ]);
        assert!(!c.applies(b"GET", b"?v=2", &html_only), "accept");
        let no_accept = h(&[("X-Env", "beta"), ("x-debug", ""), ("Cookie", "session=1")]);
        assert!(
            c.applies(b"HEAD", b"v=2", &no_accept),
            "no Accept accepts anything"
        );
        assert!(Criteria::default().applies(b"ANY", b"", &HeaderList::default()));
    }
}
