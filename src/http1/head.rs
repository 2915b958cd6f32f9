//! Request and response head parsing: httparse for the syntax, then the RFC 9112 checks that
//! decide framing, persistence and which fields are connection-specific.

use std::cell::RefCell;
use std::mem::MaybeUninit;

use super::{
    is_tchar, list_elements, parse_content_length, trim_ows, BodyFraming, HeaderField, HeaderKind,
    Method, Span, Version,
};

/// Field lists a thread keeps for the heads it parses next, at most.
const SPARE_LISTS: usize = 256;
/// A list with room for more fields than this is not kept.
const SPARE_LIST_FIELDS: usize = 32;

thread_local! {
    /// Emptied field lists of heads that are gone. A keep-alive HTTP/1.1 connection reuses
    /// its heads, but every HTTP/2 stream parses three of its own (its request, the upstream
    /// response, the response it relays): from here, none of them allocates.
    static SPARE: RefCell<Vec<Vec<HeaderField>>> = const { RefCell::new(Vec::new()) };
}

/// A head's header fields, in order: a `Vec` whose storage comes from and goes back to the
/// thread's spare lists.
#[derive(Debug, PartialEq, Eq)]
pub struct FieldList(Vec<HeaderField>);

impl Default for FieldList {
    fn default() -> Self {
        // `try_with`: a head made while the thread's locals are torn down gets a new list.
        let spare = SPARE.try_with(|s| s.try_borrow_mut().ok().and_then(|mut s| s.pop()));
        FieldList(spare.ok().flatten().unwrap_or_default())
    }
}

impl Clone for FieldList {
    fn clone(&self) -> Self {
        let mut list = FieldList::default();
        list.0.extend_from_slice(&self.0);
        list
    }
}

impl Drop for FieldList {
    fn drop(&mut self) {
        let cap = self.0.capacity();
        if cap == 0 || cap > SPARE_LIST_FIELDS {
            return;
        }
        let mut list = std::mem::take(&mut self.0);
        list.clear();
        // (`try_with`: a head dropped while the thread's locals are torn down frees its list.)
        let _ = SPARE.try_with(|s| {
            if let Ok(mut spare) = s.try_borrow_mut() {
                if spare.len() < SPARE_LISTS {
                    spare.push(list);
                }
            }
        });
    }
}

impl std::ops::Deref for FieldList {
    type Target = Vec<HeaderField>;
    fn deref(&self) -> &Vec<HeaderField> {
        &self.0
    }
}

impl<'a> IntoIterator for &'a FieldList {
    type Item = &'a HeaderField;
    type IntoIter = std::slice::Iter<'a, HeaderField>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl std::ops::DerefMut for FieldList {
    fn deref_mut(&mut self) -> &mut Vec<HeaderField> {
        &mut self.0
    }
}

/// Upper bound on `max_headers` (the parser's header array lives on the stack).
pub const MAX_HEADERS_HARD_LIMIT: usize = 256;

/// Names listed in one message's Connection fields that we track; more is an error.
const MAX_CONNECTION_TOKENS: usize = 16;

/// Size limits applied while parsing a request head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadLimits {
    /// Whole head, request line to the empty line (431 beyond).
    pub max_head_bytes: usize,
    /// Number of header fields (431 beyond); at most [`MAX_HEADERS_HARD_LIMIT`].
    pub max_headers: usize,
    /// Request line, without its line ending (414 beyond).
    pub max_request_line_bytes: usize,
    /// `%2F` in a request path is allowed (routed as it is, not as a `/`); otherwise 400.
    pub encoded_slashes: bool,
    /// `;` in a request path is allowed (routed as it is); otherwise 400.
    pub path_parameters: bool,
    /// `//` in a request path is refused (400); otherwise routed and forwarded as it is.
    pub reject_repeated_slashes: bool,
}

impl Default for HeadLimits {
    fn default() -> Self {
        HeadLimits {
            max_head_bytes: 16 * 1024,
            max_headers: 100,
            max_request_line_bytes: 8 * 1024,
            encoded_slashes: false,
            path_parameters: false,
            reject_repeated_slashes: false,
        }
    }
}

/// Why a head was rejected. Each maps to one status in `error.rs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParseError {
    /// Syntax or framing violation (400 for requests, 502 for responses). The text is for logs.
    Malformed(&'static str),
    /// The head exceeds `max_head_bytes` (431).
    HeadTooLarge,
    /// More header fields than `max_headers` (431).
    TooManyHeaders,
    /// The request line exceeds `max_request_line_bytes` (414).
    UriTooLong,
    /// A transfer coding other than chunked (501).
    UnsupportedTransferCoding,
    /// CONNECT: ringway is not a forward proxy (501).
    UnsupportedMethod,
    /// An Expect value other than 100-continue (417).
    ExpectationFailed,
    /// Neither HTTP/1.0 nor HTTP/1.1 (505).
    UnsupportedVersion,
}

/// The form of a request target (RFC 9112 §3.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TargetForm {
    /// `/path?query`
    #[default]
    Origin,
    /// `http://authority/path?query`: the authority replaces Host (§3.2.2).
    Absolute,
    /// `*` (OPTIONS only)
    Asterisk,
}

/// A parsed request head. Spans are relative to the first byte of the parsed buffer.
#[derive(Debug, Default, Clone)]
pub struct RequestHead {
    /// Head length in bytes, through the empty line.
    pub len: usize,
    /// The method.
    pub method: Method,
    /// The method token as sent.
    pub method_span: Span,
    /// The request target as sent.
    pub target: Span,
    /// Form of the target.
    pub form: TargetForm,
    /// Path part of the target (empty for an absolute-form target without path: means `/`).
    pub path: Span,
    /// Query part including its leading `?` (empty when there is none).
    pub query: Span,
    /// Protocol version.
    pub version: Version,
    /// Every header field in order.
    pub headers: FieldList,
    /// The effective host: the absolute-form authority or the Host field (empty if none).
    pub host: Span,
    /// How the body is delimited.
    pub framing: BodyFraming,
    /// Whether the client allows the connection to persist after this exchange.
    pub keep_alive: bool,
    /// `Expect: 100-continue` on an HTTP/1.1 request.
    pub expect_continue: bool,
    /// An HTTP/1.1 protocol upgrade is asked for (RFC 9110 §7.8): an `Upgrade` field with a
    /// protocol other than `h2c` (never tunnelled: h2c is served by prior knowledge), and
    /// `upgrade` among the Connection options.
    pub upgrade: bool,
}

impl RequestHead {
    /// The path the request is routed and forwarded by: an absolute-form target without one
    /// stands for `/`, or for `*` with OPTIONS and no query (RFC 9112 §3.2.4).
    pub fn routed_path<'a>(&self, src: &'a [u8]) -> &'a [u8] {
        match (self.form, self.path.len) {
            (TargetForm::Absolute, 0) if self.method == Method::Options && self.query.len == 0 => {
                b"*"
            }
            (TargetForm::Absolute, 0) => b"/",
            _ => self.path.get(src),
        }
    }

    /// The protocols of the Upgrade fields that may be forwarded (all but `h2c`).
    pub fn upgrade_protocols<'a>(&'a self, src: &'a [u8]) -> impl Iterator<Item = &'a [u8]> + 'a {
        upgrade_protocols(&self.headers, src)
    }

    /// The first field of `kind`, if any.
    pub fn find(&self, kind: HeaderKind) -> Option<&HeaderField> {
        self.headers.iter().find(|h| h.kind == kind)
    }
}

/// A parsed response head.
#[derive(Debug, Default, Clone)]
pub struct ResponseHead {
    /// Head length in bytes, through the empty line.
    pub len: usize,
    /// Protocol version.
    pub version: Version,
    /// Status code.
    pub status: u16,
    /// Reason phrase as sent (may be empty).
    pub reason: Span,
    /// Every header field in order.
    pub headers: FieldList,
    /// How the body is delimited, given the request method and status.
    pub framing: BodyFraming,
    /// The declared Content-Length, also for responses without a body (HEAD, 304).
    pub content_length: Option<u64>,
    /// Whether the upstream allows the connection to persist.
    pub keep_alive: bool,
}

/// The protocols named by the Upgrade fields among `headers`, but `h2c`.
pub fn upgrade_protocols<'a>(
    headers: &'a [HeaderField],
    src: &'a [u8],
) -> impl Iterator<Item = &'a [u8]> + 'a {
    headers
        .iter()
        .filter(|h| h.kind == HeaderKind::Upgrade)
        .flat_map(move |h| list_elements(h.value.get(src)))
        .filter(|p| !p.eq_ignore_ascii_case(b"h2c"))
}

/// Parses a request head from `buf`. `Ok(None)`: incomplete, read more. `Ok(Some(n))`: the head
/// is the first `n` bytes and `head` describes it.
pub fn parse_request(
    buf: &[u8],
    limits: &HeadLimits,
    head: &mut RequestHead,
) -> Result<Option<usize>, ParseError> {
    let mut storage =
        [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS_HARD_LIMIT];
    let max_headers = limits.max_headers.clamp(1, MAX_HEADERS_HARD_LIMIT);
    let mut req = httparse::Request::new(&mut []);
    let status = httparse::ParserConfig::default().parse_request_with_uninit_headers(
        &mut req,
        buf,
        &mut storage[..max_headers],
    );
    let len = match status {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => {
            check_partial(buf, limits)?;
            return Ok(None);
        }
        Err(e) => {
            // A line too long to be a request line is a 414 whatever else is wrong with it.
            check_request_line(buf, limits)?;
            return Err(match e {
                httparse::Error::TooManyHeaders => ParseError::TooManyHeaders,
                httparse::Error::Version if names_other_http_version(buf) => {
                    ParseError::UnsupportedVersion
                }
                httparse::Error::HeaderName => ParseError::Malformed("invalid header name"),
                httparse::Error::HeaderValue => ParseError::Malformed("invalid header value"),
                httparse::Error::NewLine => ParseError::Malformed("invalid line ending"),
                httparse::Error::Token => ParseError::Malformed("invalid request line"),
                _ => ParseError::Malformed("invalid request head"),
            });
        }
    };
    // Request line. httparse returned Complete, so all three parts are present.
    let method = req.method.unwrap_or("").as_bytes();
    let target = req.path.unwrap_or("").as_bytes();
    let version = if req.version == Some(0) {
        Version::Http10
    } else {
        Version::Http11
    };
    let fields = req.headers.iter().map(|h| (h.name.as_bytes(), h.value));
    read_request(buf, len, (method, target, version), fields, limits, head).map(Some)
}

/// Where the parts of a request head are that ringway wrote itself (an HTTP/2 request as
/// HTTP/1.1, see `h2::bridge`): such a head is read with [`request_from_parts`], without
/// tokenizing its bytes again.
#[derive(Debug, Default)]
pub struct WrittenRequest {
    /// Head length in bytes, through the empty line.
    pub len: usize,
    /// The method token.
    pub method: Span,
    /// The request target.
    pub target: Span,
    /// Each field's name and value (their kinds are left to the reading).
    pub fields: FieldList,
}

/// Reads an HTTP/1.1 request head that ringway wrote itself into `buf` (its parts at
/// `parts`), with every check and limit of [`parse_request`] but the tokenizing: what it is
/// made of already passed a stricter syntax (HTTP/2's field and `:path` rules).
pub fn request_from_parts(
    buf: &[u8],
    parts: &WrittenRequest,
    limits: &HeadLimits,
    head: &mut RequestHead,
) -> Result<usize, ParseError> {
    let within = |s: &Span| s.end() <= parts.len;
    let in_place = parts.len <= buf.len()
        && within(&parts.method)
        && within(&parts.target)
        && parts
            .fields
            .iter()
            .all(|f| within(&f.name) && within(&f.value));
    if !in_place {
        return Err(ParseError::Malformed("invalid request head"));
    }
    if parts.fields.len() > limits.max_headers.clamp(1, MAX_HEADERS_HARD_LIMIT) {
        // (As the parser answers: a request line too long first.)
        check_request_line(buf, limits)?;
        return Err(ParseError::TooManyHeaders);
    }
    let line = (
        parts.method.get(buf),
        parts.target.get(buf),
        Version::Http11,
    );
    let fields = parts
        .fields
        .iter()
        .map(|f| (f.name.get(buf), f.value.get(buf)));
    read_request(buf, parts.len, line, fields, limits, head)
}

/// The checks and the reading of a request head whose parts are known (`line`: method,
/// target, version; `fields`: names and values as sent), which is the first `len` bytes of
/// `buf`; every slice lies in `buf`.
fn read_request<'a>(
    buf: &'a [u8],
    len: usize,
    line: (&'a [u8], &'a [u8], Version),
    fields: impl Iterator<Item = (&'a [u8], &'a [u8])>,
    limits: &HeadLimits,
    head: &mut RequestHead,
) -> Result<usize, ParseError> {
    check_request_line(buf, limits)?;
    if len > limits.max_head_bytes {
        return Err(ParseError::HeadTooLarge);
    }

    head.len = len;
    head.headers.clear();
    head.framing = BodyFraming::None;
    head.host = Span::default();
    head.expect_continue = false;

    let (method, target, version) = line;
    head.method = Method::from_bytes(method);
    head.method_span = Span::of(buf, method);
    head.target = Span::of(buf, target);
    head.version = version;
    if head.method == Method::Connect {
        return Err(ParseError::UnsupportedMethod);
    }
    parse_target(buf, target, head, limits)?;

    // Header fields: classify, record, and gather what framing and persistence depend on.
    let mut conn_tokens = [Span::default(); MAX_CONNECTION_TOKENS];
    let mut n_tokens = 0;
    let mut conn_close = false;
    let mut conn_keep_alive = false;
    let mut host_count = 0;
    let mut host_field = Span::default();
    let mut content_length: Option<u64> = None;
    let mut te_seen = false;
    let mut te_codings = 0usize;
    let mut te_last_chunked = false;
    let mut te_chunked_not_last = false;
    for (name, value) in fields {
        let value = trim_ows(value);
        let kind = HeaderKind::classify(name);
        let field = HeaderField {
            name: Span::of(buf, name),
            value: Span::of(buf, value),
            kind,
            hop: kind.is_hop_by_hop(),
        };
        match kind {
            HeaderKind::Host => {
                host_count += 1;
                if !valid_host(value) {
                    return Err(ParseError::Malformed("invalid host"));
                }
                host_field = field.value;
            }
            HeaderKind::ContentLength => {
                let n = parse_content_length(value)
                    .ok_or(ParseError::Malformed("invalid content-length"))?;
                if content_length.is_some_and(|prev| prev != n) {
                    return Err(ParseError::Malformed("differing content-length values"));
                }
                content_length = Some(n);
            }
            HeaderKind::TransferEncoding => {
                te_seen = true;
                for coding in list_elements(value) {
                    if te_last_chunked {
                        te_chunked_not_last = true;
                    }
                    te_codings += 1;
                    te_last_chunked = coding.eq_ignore_ascii_case(b"chunked");
                }
            }
            HeaderKind::Connection => {
                for token in list_elements(value) {
                    if !token.iter().all(|&b| is_tchar(b)) {
                        return Err(ParseError::Malformed("invalid connection option"));
                    }
                    if token.eq_ignore_ascii_case(b"close") {
                        conn_close = true;
                    } else if token.eq_ignore_ascii_case(b"keep-alive") {
                        conn_keep_alive = true;
                    } else {
                        if n_tokens == MAX_CONNECTION_TOKENS {
                            return Err(ParseError::Malformed("too many connection options"));
                        }
                        conn_tokens[n_tokens] = Span::of(buf, token);
                        n_tokens += 1;
                    }
                }
            }
            HeaderKind::Expect => {
                if value.eq_ignore_ascii_case(b"100-continue") {
                    // RFC 9110 §10.1.1: ignored on HTTP/1.0.
                    head.expect_continue = head.version == Version::Http11;
                } else {
                    return Err(ParseError::ExpectationFailed);
                }
            }
            _ => {}
        }
        head.headers.push(field);
    }
    mark_connection_listed(buf, &mut head.headers, &conn_tokens[..n_tokens]);
    head.upgrade = head.version == Version::Http11
        && conn_tokens[..n_tokens]
            .iter()
            .any(|t| t.get(buf).eq_ignore_ascii_case(b"upgrade"))
        && head.upgrade_protocols(buf).next().is_some();

    // RFC 9112 §3.2: exactly one Host in HTTP/1.1, at most one in HTTP/1.0.
    if host_count > 1 || (host_count == 0 && head.version == Version::Http11) {
        return Err(ParseError::Malformed("missing or repeated host"));
    }
    if head.form != TargetForm::Absolute {
        head.host = host_field;
    }

    // RFC 9112 §6.1 and §6.3.
    if te_seen {
        if head.version == Version::Http10 {
            return Err(ParseError::Malformed("transfer-encoding in HTTP/1.0"));
        }
        if content_length.is_some() {
            return Err(ParseError::Malformed(
                "content-length with transfer-encoding",
            ));
        }
        if te_codings == 0 || !te_last_chunked || te_chunked_not_last {
            return Err(ParseError::Malformed(
                "transfer-encoding must end in chunked",
            ));
        }
        if te_codings > 1 {
            return Err(ParseError::UnsupportedTransferCoding);
        }
        head.framing = BodyFraming::Chunked;
    } else if let Some(n) = content_length {
        head.framing = BodyFraming::Length(n);
    }
    if !head.framing.has_body() {
        head.expect_continue = false;
    }

    head.keep_alive = match head.version {
        Version::Http11 => !conn_close,
        Version::Http10 => conn_keep_alive && !conn_close,
    };
    Ok(len)
}

/// The limits that can be checked on an incomplete head: 414 for a request line already too
/// long, 431 for a head that has reached `max_head_bytes` without ending.
pub fn check_partial(buf: &[u8], limits: &HeadLimits) -> Result<(), ParseError> {
    check_request_line(buf, limits)?;
    if buf.len() >= limits.max_head_bytes {
        return Err(ParseError::HeadTooLarge);
    }
    Ok(())
}

/// Whether `buf` may hold a complete head, looking only at what follows `from` (bytes before it
/// were already looked at): a head ends with an empty line, so only a new line feed followed
/// by `\n` or `\r\n` can complete one. Lets a reader skip re-parsing a head that grows a byte
/// at a time.
pub fn may_complete_head(buf: &[u8], from: usize) -> bool {
    let start = from.saturating_sub(2).min(buf.len());
    let mut rest = &buf[start..];
    while let Some(i) = rest.iter().position(|&b| b == b'\n') {
        match &rest[i + 1..] {
            [b'\n', ..] | [b'\r', b'\n', ..] => return true,
            _ => rest = &rest[i + 1..],
        }
    }
    false
}

/// Whether the request line ends in a well-formed `HTTP/x.y` (so a version error means an
/// unsupported version rather than a malformed line).
fn names_other_http_version(buf: &[u8]) -> bool {
    let mut rest = buf;
    while let [b'\r' | b'\n', tail @ ..] = rest {
        rest = tail;
    }
    let line_end = rest.iter().position(|&b| b == b'\n').unwrap_or(rest.len());
    let line = rest[..line_end]
        .strip_suffix(b"\r")
        .unwrap_or(&rest[..line_end]);
    let parts: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
    matches!(parts.as_slice(), [_, _, v] if v.len() == 8
        && v.starts_with(b"HTTP/")
        && v[5].is_ascii_digit()
        && v[6] == b'.'
        && v[7].is_ascii_digit())
}

/// 414 when the request line (after any leading empty lines) is longer than allowed.
fn check_request_line(buf: &[u8], limits: &HeadLimits) -> Result<(), ParseError> {
    let mut rest = buf;
    while let [b'\r' | b'\n', tail @ ..] = rest {
        rest = tail;
    }
    let window = &rest[..rest.len().min(limits.max_request_line_bytes + 2)];
    match window.iter().position(|&b| b == b'\n') {
        Some(nl) => {
            let line = if nl > 0 && window[nl - 1] == b'\r' {
                nl - 1
            } else {
                nl
            };
            if line > limits.max_request_line_bytes {
                return Err(ParseError::UriTooLong);
            }
        }
        None => {
            let seen = window.len() - usize::from(window.last() == Some(&b'\r'));
            if seen > limits.max_request_line_bytes {
                return Err(ParseError::UriTooLong);
            }
        }
    }
    Ok(())
}

/// Splits the target into path and query, and takes the authority of an absolute-form target.
fn parse_target(
    buf: &[u8],
    target: &[u8],
    head: &mut RequestHead,
    limits: &HeadLimits,
) -> Result<(), ParseError> {
    if target.contains(&b'#') {
        return Err(ParseError::Malformed("fragment in request target"));
    }
    let path_and_query = match target.first() {
        Some(b'/') => {
            head.form = TargetForm::Origin;
            target
        }
        Some(b'*') if target.len() == 1 => {
            if head.method != Method::Options {
                return Err(ParseError::Malformed("asterisk-form without OPTIONS"));
            }
            head.form = TargetForm::Asterisk;
            head.path = Span::of(buf, target);
            head.query = Span::of(buf, &target[1..]);
            return Ok(());
        }
        _ => {
            let rest =
                strip_scheme(target).ok_or(ParseError::Malformed("invalid request target"))?;
            let end = rest
                .iter()
                .position(|&b| b == b'/' || b == b'?')
                .unwrap_or(rest.len());
            let authority = &rest[..end];
            // An empty host is invalid in an http(s) URI (RFC 9110 §4.2.1): `http://:80/`.
            if split_host_port(authority).0.is_empty()
                || authority.contains(&b'@')
                || !valid_host(authority)
            {
                return Err(ParseError::Malformed("invalid authority in request target"));
            }
            head.form = TargetForm::Absolute;
            head.host = Span::of(buf, authority);
            &rest[end..]
        }
    };
    let q = path_and_query
        .iter()
        .position(|&b| b == b'?')
        .unwrap_or(path_and_query.len());
    check_path(&path_and_query[..q], limits)?;
    head.path = Span::of(buf, &path_and_query[..q]);
    head.query = Span::of(buf, &path_and_query[q..]);
    Ok(())
}

/// Why `path` would mean another path to some upstream, if it would: a dot-segment
/// (`/a/../admin` is `/admin` to an upstream that resolves it, RFC 3986 §5.2.4), also with
/// a `;` parameter (`/..;/admin`: servlet containers drop the parameter, then resolve), or a
/// backslash (a separator to IIS and WHATWG URL parsers). Also applied to rewritten paths.
pub fn path_ambiguity(path: &[u8]) -> Option<&'static str> {
    if path.contains(&b'\\') {
        return Some("backslash in path");
    }
    for segment in path.split(|&b| b == b'/') {
        let bare = segment.split(|&b| b == b';').next().unwrap_or(segment);
        if bare == b"." || bare == b".." {
            return Some("dot-segment in path");
        }
    }
    None
}

/// Refuses paths that other software would read differently from the bytes routing matches:
/// see [`path_ambiguity`]; also percent-encoded unreserved characters (`/%61dmin` is `/admin`
/// after RFC 3986 §6.2.2.2 normalization), an encoded backslash, and malformed
/// percent-encodings. Browsers and HTTP libraries send none of these; a route that denies
/// `/admin` cannot be walked around with them. Unless `encoded_slashes`, an encoded slash
/// too: routing matches `/admin%2Fusers` as one segment, a backend that decodes it before
/// its own routing sees `/admin/users` (some APIs put `%2F` in a segment on purpose: then
/// allow it, and route accordingly). Unless `path_parameters`, a `;` too: servlet
/// containers (Tomcat, Jetty) drop `;` parameters from every segment before their own
/// routing, so `/admin;x/users` is `/admin/users` to them, and not to a route for `/admin/`.
/// With `reject_repeated_slashes`, a `//` too (backends that merge slashes read `/api//admin`
/// as `/api/admin`).
fn check_path(path: &[u8], limits: &HeadLimits) -> Result<(), ParseError> {
    if let Some(why) = path_ambiguity(path) {
        return Err(ParseError::Malformed(why));
    }
    if !limits.path_parameters && path.contains(&b';') {
        return Err(ParseError::Malformed("path parameter (;) in path"));
    }
    if limits.reject_repeated_slashes && path.windows(2).any(|w| w == b"//") {
        return Err(ParseError::Malformed("repeated slash in path"));
    }
    let mut i = 0;
    while let Some(off) = path[i..].iter().position(|&b| b == b'%') {
        let at = i + off;
        let (Some(&h), Some(&l)) = (path.get(at + 1), path.get(at + 2)) else {
            return Err(ParseError::Malformed("malformed percent-encoding in path"));
        };
        let (Some(h), Some(l)) = (hex_value(h), hex_value(l)) else {
            return Err(ParseError::Malformed("malformed percent-encoding in path"));
        };
        let c = h << 4 | l;
        if c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b'~') {
            return Err(ParseError::Malformed(
                "percent-encoded unreserved character in path",
            ));
        }
        if c == b'\\' {
            return Err(ParseError::Malformed("percent-encoded backslash in path"));
        }
        if c == b'/' && !limits.encoded_slashes {
            return Err(ParseError::Malformed("percent-encoded slash in path"));
        }
        i = at + 3;
    }
    Ok(())
}

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

fn strip_scheme(target: &[u8]) -> Option<&[u8]> {
    for scheme in [&b"http://"[..], b"https://"] {
        if target.len() >= scheme.len() && target[..scheme.len()].eq_ignore_ascii_case(scheme) {
            return Some(&target[scheme.len()..]);
        }
    }
    None
}

/// RFC 9110 §7.2 / RFC 3986 §3.2.2: `uri-host [ ":" port ]`, where uri-host is a reg-name, an
/// IPv4 address or a bracketed IP literal. Empty is allowed (no authority).
pub fn valid_host(value: &[u8]) -> bool {
    let (host, port) = split_host_port(value);
    if let Some(port) = port {
        if port.len() > 5 || !port.iter().all(u8::is_ascii_digit) {
            return false;
        }
    }
    match host {
        [b'[', inner @ .., b']'] => {
            !inner.is_empty()
                && inner
                    .iter()
                    .all(|&b| b.is_ascii_hexdigit() || b == b':' || b == b'.')
        }
        _ => host.iter().all(|&b| {
            b.is_ascii_alphanumeric()
                || matches!(
                    b,
                    b'-' | b'.'
                        | b'_'
                        | b'~'
                        | b'%'
                        | b'!'
                        | b'$'
                        | b'&'
                        | b'\''
                        | b'('
                        | b')'
                        | b'*'
                        | b'+'
                        | b','
                        | b';'
                        | b'='
                )
        }),
    }
}

/// Splits `host[:port]`, minding IPv6 brackets. The port, when present, may be empty.
pub fn split_host_port(value: &[u8]) -> (&[u8], Option<&[u8]>) {
    let colon = if value.first() == Some(&b'[') {
        value
            .iter()
            .position(|&b| b == b']')
            .and_then(|close| (value.get(close + 1) == Some(&b':')).then_some(close + 1))
    } else {
        value.iter().rposition(|&b| b == b':')
    };
    match colon {
        Some(i) => (&value[..i], Some(&value[i + 1..])),
        None => (value, None),
    }
}

fn mark_connection_listed(buf: &[u8], headers: &mut [HeaderField], tokens: &[Span]) {
    if tokens.is_empty() {
        return;
    }
    for h in headers.iter_mut() {
        if h.hop {
            continue;
        }
        let name = h.name.get(buf);
        if tokens.iter().any(|t| t.get(buf).eq_ignore_ascii_case(name)) {
            h.hop = true;
        }
    }
}

/// Parses a response head. `request_method` and the status decide whether a body follows
/// (RFC 9112 §6.3). `max_headers` bounds the field count. `Ok(None)`: incomplete.
pub fn parse_response(
    buf: &[u8],
    max_headers: usize,
    request_method: Method,
    head: &mut ResponseHead,
) -> Result<Option<usize>, ParseError> {
    let mut storage =
        [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS_HARD_LIMIT];
    let max_headers = max_headers.clamp(1, MAX_HEADERS_HARD_LIMIT);
    let mut res = httparse::Response::new(&mut []);
    let len = match httparse::ParserConfig::default().parse_response_with_uninit_headers(
        &mut res,
        buf,
        &mut storage[..max_headers],
    ) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(ParseError::TooManyHeaders),
        Err(_) => return Err(ParseError::Malformed("invalid response head")),
    };

    head.len = len;
    head.headers.clear();
    head.version = if res.version == Some(0) {
        Version::Http10
    } else {
        Version::Http11
    };
    head.status = res.code.unwrap_or(0);
    if !(100..=599).contains(&head.status) {
        return Err(ParseError::Malformed("invalid status code"));
    }
    let reason = res.reason.unwrap_or("").as_bytes();
    head.reason = if reason.is_empty() {
        Span::default()
    } else {
        Span::of(buf, reason)
    };

    let mut conn_tokens = [Span::default(); MAX_CONNECTION_TOKENS];
    let mut n_tokens = 0;
    let mut conn_close = false;
    let mut conn_keep_alive = false;
    let mut content_length: Option<u64> = None;
    let mut te_seen = false;
    let mut te_only_chunked = true;
    let mut te_codings = 0usize;
    for h in res.headers.iter() {
        let name = h.name.as_bytes();
        let value = trim_ows(h.value);
        let kind = HeaderKind::classify(name);
        match kind {
            HeaderKind::ContentLength => {
                let n = parse_content_length(value)
                    .ok_or(ParseError::Malformed("invalid content-length"))?;
                if content_length.is_some_and(|prev| prev != n) {
                    return Err(ParseError::Malformed("differing content-length values"));
                }
                content_length = Some(n);
            }
            HeaderKind::TransferEncoding => {
                te_seen = true;
                for coding in list_elements(value) {
                    te_codings += 1;
                    te_only_chunked &= coding.eq_ignore_ascii_case(b"chunked");
                }
            }
            HeaderKind::Connection => {
                for token in list_elements(value) {
                    if token.eq_ignore_ascii_case(b"close") {
                        conn_close = true;
                    } else if token.eq_ignore_ascii_case(b"keep-alive") {
                        conn_keep_alive = true;
                    } else if n_tokens < MAX_CONNECTION_TOKENS {
                        conn_tokens[n_tokens] = Span::of(buf, token);
                        n_tokens += 1;
                    } else {
                        return Err(ParseError::Malformed("too many connection options"));
                    }
                }
            }
            _ => {}
        }
        head.headers.push(HeaderField {
            name: Span::of(buf, name),
            value: Span::of(buf, value),
            kind,
            hop: kind.is_hop_by_hop(),
        });
    }
    mark_connection_listed(buf, &mut head.headers, &conn_tokens[..n_tokens]);

    // Strict framing: an upstream that could be read two ways is not relayed.
    if te_seen {
        if content_length.is_some() {
            return Err(ParseError::Malformed(
                "content-length with transfer-encoding",
            ));
        }
        if head.version == Version::Http10 {
            return Err(ParseError::Malformed("transfer-encoding in HTTP/1.0"));
        }
        if te_codings != 1 || !te_only_chunked {
            return Err(ParseError::Malformed(
                "transfer-encoding other than chunked",
            ));
        }
    }
    head.content_length = content_length;
    let bodiless = request_method == Method::Head
        || (100..200).contains(&head.status)
        || head.status == 204
        || head.status == 304;
    head.framing = if bodiless {
        BodyFraming::None
    } else if te_seen {
        BodyFraming::Chunked
    } else if let Some(n) = content_length {
        BodyFraming::Length(n)
    } else {
        BodyFraming::UntilClose
    };
    head.keep_alive = match head.version {
        Version::Http11 => !conn_close,
        Version::Http10 => conn_keep_alive && !conn_close,
    };
    Ok(Some(len))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(input: &[u8]) -> Result<Option<usize>, ParseError> {
        let mut head = RequestHead::default();
        parse_request(input, &HeadLimits::default(), &mut head)
    }

    fn parsed(input: &[u8]) -> RequestHead {
        let mut head = RequestHead::default();
        let n = parse_request(input, &HeadLimits::default(), &mut head)
            .expect("valid")
            .expect("complete");
        assert_eq!(n, input.len());
        head
    }

    fn spare_lists() -> usize {
        SPARE.with(|s| s.borrow().len())
    }

    #[test]
    fn a_dropped_head_gives_its_field_list_to_the_next_one() {
        SPARE.with(|s| s.borrow_mut().clear());
        let head = parsed(b"GET / HTTP/1.1\r\nHost: a\r\nAccept: */*\r\n\r\n");
        let storage = head.headers.as_ptr();
        assert_eq!(head.headers.len(), 2);
        drop(head);
        assert_eq!(spare_lists(), 1);
        let mut next = ResponseHead::default();
        assert_eq!(spare_lists(), 0);
        assert!(next.headers.is_empty(), "a reused list starts empty");
        assert!(next.headers.capacity() >= 2);
        assert_eq!(
            next.headers.as_ptr(),
            storage,
            "the same storage, not a new allocation"
        );
        // A copy has storage of its own; both go back (an empty list has none to give).
        next.headers.push(HeaderField::default());
        let copy = next.clone();
        assert_ne!(copy.headers.as_ptr(), next.headers.as_ptr());
        assert_eq!(copy.headers, next.headers);
        drop((next, copy));
        assert_eq!(spare_lists(), 2);
    }

    #[test]
    fn spare_field_lists_are_bounded_in_number_and_size() {
        SPARE.with(|s| s.borrow_mut().clear());
        let mut big = RequestHead::default();
        big.headers
            .extend((0..SPARE_LIST_FIELDS + 1).map(|_| HeaderField::default()));
        drop(big);
        assert_eq!(spare_lists(), 0, "a list grown past the cap is freed");
        let heads: Vec<RequestHead> = (0..SPARE_LISTS + 10)
            .map(|_| {
                let mut h = RequestHead::default();
                h.headers.push(HeaderField::default());
                h
            })
            .collect();
        drop(heads);
        assert_eq!(spare_lists(), SPARE_LISTS);
    }

    /// Every strict prefix is incomplete (never an error, never complete), and the whole input
    /// gives `expected`.
    fn check_split(input: &[u8], expected: Result<Option<usize>, ParseError>) {
        for cut in 0..input.len() {
            let mut head = RequestHead::default();
            let r = parse_request(&input[..cut], &HeadLimits::default(), &mut head);
            match expected {
                Ok(_) => assert_eq!(r, Ok(None), "prefix of {cut} bytes"),
                Err(_) => assert!(
                    matches!(r, Ok(None)) || r == expected,
                    "prefix {cut}: {r:?}"
                ),
            }
        }
        assert_eq!(parse(input), expected);
    }

    #[test]
    fn simple_get_at_every_split() {
        let req = b"GET /a/b?x=1 HTTP/1.1\r\nHost: example.com\r\nAccept: */*\r\n\r\n";
        check_split(req, Ok(Some(req.len())));
        let h = parsed(req);
        assert_eq!(h.method, Method::Get);
        assert_eq!(h.path.get(req), b"/a/b");
        assert_eq!(h.query.get(req), b"?x=1");
        assert_eq!(h.host.get(req), b"example.com");
        assert_eq!(h.framing, BodyFraming::None);
        assert!(h.keep_alive);
        assert_eq!(h.headers.len(), 2);
    }

    #[test]
    fn chunked_post_at_every_split() {
        let req = b"POST /u HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n";
        check_split(req, Ok(Some(req.len())));
        assert_eq!(parsed(req).framing, BodyFraming::Chunked);
    }

    #[test]
    fn content_length_and_duplicates() {
        let h =
            parsed(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n");
        assert_eq!(h.framing, BodyFraming::Length(5));
        let h = parsed(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5, 5\r\n\r\n");
        assert_eq!(h.framing, BodyFraming::Length(5));
        assert!(matches!(
            parse(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n"),
            Err(ParseError::Malformed(_))
        ));
        for bad in [
            &b"+5"[..],
            b"-1",
            b"5 5",
            b"0x5",
            b"",
            b"99999999999999999999999",
        ] {
            let mut req = b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: ".to_vec();
            req.extend_from_slice(bad);
            req.extend_from_slice(b"\r\n\r\n");
            assert!(
                matches!(parse(&req), Err(ParseError::Malformed(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn smuggling_shapes_are_rejected() {
        let cases: &[&[u8]] = &[
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, identity\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: x\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, chunked\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: \r\n\r\n",
            b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding : chunked\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nX: a\r\n chunked\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a\r\nX: a\rb\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a\r\nX: a\x01b\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a\r\nX: a\x7fb\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
            b"GET / HTTP/1.1\r\nAccept: x\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a b\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a/b\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a@b\r\n\r\n",
            b"GET /a#b HTTP/1.1\r\nHost: a\r\n\r\n",
            b"GET  / HTTP/1.1\r\nHost: a\r\n\r\n",
            b"GET foo HTTP/1.1\r\nHost: a\r\n\r\n",
            b"GET * HTTP/1.1\r\nHost: a\r\n\r\n",
            b"GET http://u@h/ HTTP/1.1\r\nHost: a\r\n\r\n",
            b"GET http://:80/ HTTP/1.1\r\nHost: a\r\n\r\n",
            b"GET http:///a HTTP/1.1\r\nHost: a\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a\r\nConnection: clo se\r\n\r\n",
        ];
        for c in cases {
            assert!(
                matches!(parse(c), Err(ParseError::Malformed(_))),
                "{:?} gave {:?}",
                String::from_utf8_lossy(c),
                parse(c)
            );
        }
    }

    #[test]
    fn other_codings_are_not_implemented() {
        assert_eq!(
            parse(b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"),
            Err(ParseError::UnsupportedTransferCoding)
        );
    }

    #[test]
    fn connect_expect_and_version() {
        assert_eq!(
            parse(b"CONNECT a:443 HTTP/1.1\r\nHost: a\r\n\r\n"),
            Err(ParseError::UnsupportedMethod)
        );
        assert_eq!(
            parse(b"PUT / HTTP/1.1\r\nHost: a\r\nExpect: something\r\n\r\n"),
            Err(ParseError::ExpectationFailed)
        );
        assert_eq!(
            parse(b"GET / HTTP/2.0\r\nHost: a\r\n\r\n"),
            Err(ParseError::UnsupportedVersion)
        );
        assert!(matches!(
            parse(b"GET /a b HTTP/1.1\r\nHost: a\r\n\r\n"),
            Err(ParseError::Malformed(_))
        ));
        let h = parsed(
            b"PUT / HTTP/1.1\r\nHost: a\r\nExpect: 100-Continue\r\nContent-Length: 3\r\n\r\n",
        );
        assert!(h.expect_continue);
        let h = parsed(b"PUT / HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n");
        assert!(!h.expect_continue);
    }

    #[test]
    fn limits() {
        let limits = HeadLimits {
            max_head_bytes: 64,
            max_headers: 2,
            max_request_line_bytes: 20,
            ..HeadLimits::default()
        };
        let mut h = RequestHead::default();
        assert_eq!(
            parse_request(b"GET /0123456789012345 HTTP/1.1\r\n", &limits, &mut h),
            Err(ParseError::UriTooLong)
        );
        assert_eq!(
            parse_request(b"GET /01234567890123456789", &limits, &mut h),
            Err(ParseError::UriTooLong)
        );
        assert_eq!(
            parse_request(
                b"GET / HTTP/1.1\r\nHost: a\r\nA: 1\r\nB: 2\r\n\r\n",
                &limits,
                &mut h
            ),
            Err(ParseError::TooManyHeaders)
        );
        let big = [b"GET / HTTP/1.1\r\nHost: a\r\nA: ".as_slice(), &[b'x'; 40]].concat();
        assert_eq!(
            parse_request(&big, &limits, &mut h),
            Err(ParseError::HeadTooLarge)
        );
    }

    #[test]
    fn connection_options_mark_fields_hop_by_hop() {
        let req = b"GET / HTTP/1.1\r\nHost: a\r\nConnection: X-Secret, close\r\nX-Secret: 1\r\nKeep-Alive: 5\r\nX-Other: 2\r\n\r\n";
        let h = parsed(req);
        let hops: Vec<&[u8]> = h
            .headers
            .iter()
            .filter(|f| f.hop)
            .map(|f| f.name.get(req))
            .collect();
        assert_eq!(hops, vec![&b"Connection"[..], b"X-Secret", b"Keep-Alive"]);
        assert!(!h.keep_alive);
    }

    #[test]
    fn http10_keep_alive_rules() {
        assert!(!parsed(b"GET / HTTP/1.0\r\n\r\n").keep_alive);
        assert!(parsed(b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n").keep_alive);
        assert!(!parsed(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n").keep_alive);
    }

    #[test]
    fn absolute_form_takes_authority_as_host() {
        let req = b"GET http://Example.com:8080/p?q HTTP/1.1\r\nHost: other\r\n\r\n";
        let h = parsed(req);
        assert_eq!(h.form, TargetForm::Absolute);
        assert_eq!(h.host.get(req), b"Example.com:8080");
        assert_eq!(h.path.get(req), b"/p");
        assert_eq!(h.query.get(req), b"?q");
        let req = b"GET HTTP://a.b HTTP/1.1\r\nHost: a.b\r\n\r\n";
        let h = parsed(req);
        assert_eq!(h.path.len, 0);
        assert_eq!(h.host.get(req), b"a.b");
        assert_eq!(h.routed_path(req), b"/");
    }

    #[test]
    fn an_absolute_target_without_a_path_routes_as_slash_or_asterisk() {
        for (req, path) in [
            (
                &b"OPTIONS http://a.b HTTP/1.1\r\nHost: a.b\r\n\r\n"[..],
                &b"*"[..],
            ),
            (b"OPTIONS http://a.b?x HTTP/1.1\r\nHost: a.b\r\n\r\n", b"/"),
            (b"OPTIONS http://a.b/ HTTP/1.1\r\nHost: a.b\r\n\r\n", b"/"),
            (b"OPTIONS * HTTP/1.1\r\nHost: a.b\r\n\r\n", b"*"),
            (b"HEAD http://a.b HTTP/1.1\r\nHost: a.b\r\n\r\n", b"/"),
            (b"GET /x HTTP/1.1\r\nHost: a.b\r\n\r\n", b"/x"),
        ] {
            assert_eq!(
                parsed(req).routed_path(req),
                path,
                "{}",
                String::from_utf8_lossy(req)
            );
        }
    }

    #[test]
    fn leading_empty_lines_are_ignored() {
        let req = b"\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n";
        assert_eq!(parsed(req).method, Method::Get);
    }

    #[test]
    fn paths_that_normalize_differently_are_refused() {
        for bad in [
            &b"/a/../admin"[..],
            b"/..",
            b"/./admin",
            b"/admin/.",
            b"/%61dmin",
            b"/a%2e%2e/x",
            b"/%7Euser",
            b"/a%2",
            b"/a%zz",
            b"/a%",
            b"/admin%2Fusers",
            b"/public/..%2fadmin",
            // Servlet containers drop `;` parameters: `/admin/users`, `/actuator/env`.
            b"/admin;x/users",
            b"/actuator/env;",
            b"/..;/admin",
        ] {
            let req = [b"GET ", bad, b"?x=/../ HTTP/1.1\r\nHost: a\r\n\r\n"].concat();
            let r = parse(&req);
            assert!(
                matches!(r, Err(ParseError::Malformed(_))),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
            check_split(&req, r);
        }
        for good in [
            &b"/a..b/.c/d."[..],
            b"/%20space",
            b"/caf%C3%A9",
            b"/...",
            b"/",
        ] {
            let req = [b"GET ", good, b" HTTP/1.1\r\nHost: a\r\n\r\n"].concat();
            check_split(&req, Ok(Some(req.len())));
        }
        // The query is not a path: dot-segments there are data.
        let req = b"GET /x?a=/../b&c=%61 HTTP/1.1\r\nHost: a\r\n\r\n";
        check_split(req, Ok(Some(req.len())));
        // Encoded slashes when allowed (`http.encoded_slashes = "keep"`).
        let keep = HeadLimits {
            encoded_slashes: true,
            ..HeadLimits::default()
        };
        let req = b"GET /projects/group%2Fname HTTP/1.1\r\nHost: a\r\n\r\n";
        let mut h = RequestHead::default();
        assert_eq!(parse_request(req, &keep, &mut h), Ok(Some(req.len())));
        assert_eq!(h.path.get(req), b"/projects/group%2Fname");
        // Path parameters when allowed (`http.path_parameters = "keep"`); `..;` never.
        let keep = HeadLimits {
            path_parameters: true,
            ..HeadLimits::default()
        };
        let req = b"GET /shop/cart;jsessionid=A1 HTTP/1.1\r\nHost: a\r\n\r\n";
        let mut h = RequestHead::default();
        assert_eq!(parse_request(req, &keep, &mut h), Ok(Some(req.len())));
        assert_eq!(h.path.get(req), b"/shop/cart;jsessionid=A1");
        let req = b"GET /..;/admin HTTP/1.1\r\nHost: a\r\n\r\n";
        let r = parse_request(req, &keep, &mut RequestHead::default());
        assert!(matches!(r, Err(ParseError::Malformed(_))), "{r:?}");
        // Repeated slashes: kept by default, refused on request (`http.repeated_slashes`).
        let req = b"GET /api//admin?a=//b HTTP/1.1\r\nHost: a\r\n\r\n";
        check_split(req, Ok(Some(req.len())));
        let strict = HeadLimits {
            reject_repeated_slashes: true,
            ..HeadLimits::default()
        };
        let r = parse_request(req, &strict, &mut RequestHead::default());
        assert!(matches!(r, Err(ParseError::Malformed(_))), "{r:?}");
        let req = b"GET /api/admin?a=//b HTTP/1.1\r\nHost: a\r\n\r\n";
        let r = parse_request(req, &strict, &mut RequestHead::default());
        assert_eq!(r, Ok(Some(req.len())), "the query is no path");
    }

    #[test]
    fn head_end_detection() {
        let req = b"GET / HTTP/1.1\r\nHost: a\r\n\r\n";
        assert!(may_complete_head(req, 0));
        for cut in 0..req.len() {
            // Until the last byte arrives, no prefix may complete a head.
            assert!(!may_complete_head(&req[..cut], 0), "cut {cut}");
            // Scanning from any earlier point still finds the end.
            assert!(may_complete_head(req, cut), "from {cut}");
        }
        assert!(may_complete_head(b"GET / HTTP/1.0\n\n", 15));
        assert!(!may_complete_head(b"GET / HTTP/1.1\r\nHost: a\r\n", 0));
    }

    #[test]
    fn hosts() {
        for ok in [
            &b"a"[..],
            b"a.b:80",
            b"[::1]:8080",
            b"[::1]",
            b"10.0.0.1",
            b"",
            b"a:",
        ] {
            assert!(valid_host(ok), "{ok:?}");
        }
        for bad in [&b"a b"[..], b"a/b", b"[::1", b"a:x", b"a:123456", b"a?b"] {
            assert!(!valid_host(bad), "{bad:?}");
        }
        assert_eq!(
            split_host_port(b"[::1]:80"),
            (&b"[::1]"[..], Some(&b"80"[..]))
        );
        assert_eq!(split_host_port(b"[::1]"), (&b"[::1]"[..], None));
        assert_eq!(split_host_port(b"a:1"), (&b"a"[..], Some(&b"1"[..])));
    }

    fn resp(input: &[u8], method: Method) -> Result<ResponseHead, ParseError> {
        let mut head = ResponseHead::default();
        parse_response(input, 100, method, &mut head).map(|r| {
            assert_eq!(r, Some(input.len()));
            head
        })
    }

    #[test]
    fn response_framing() {
        let r = resp(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", Method::Get).unwrap();
        assert_eq!(r.framing, BodyFraming::Length(5));
        assert!(r.keep_alive);
        let r = resp(
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n",
            Method::Head,
        )
        .unwrap();
        assert_eq!(r.framing, BodyFraming::None);
        assert_eq!(r.content_length, Some(5));
        let r = resp(b"HTTP/1.1 204 No Content\r\n\r\n", Method::Get).unwrap();
        assert_eq!(r.framing, BodyFraming::None);
        let r = resp(b"HTTP/1.1 304 Not Modified\r\n\r\n", Method::Get).unwrap();
        assert_eq!(r.framing, BodyFraming::None);
        let r = resp(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
            Method::Get,
        )
        .unwrap();
        assert_eq!(r.framing, BodyFraming::Chunked);
        let r = resp(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n", Method::Get).unwrap();
        assert_eq!(r.framing, BodyFraming::UntilClose);
        assert!(!r.keep_alive);
        let r = resp(b"HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\n", Method::Get).unwrap();
        assert!(!r.keep_alive);
        let r = resp(b"HTTP/1.1 100 Continue\r\n\r\n", Method::Post).unwrap();
        assert_eq!(r.framing, BodyFraming::None);
    }

    #[test]
    fn ambiguous_responses_are_rejected() {
        for bad in [
            &b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"[..],
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nX: a\r\n b\r\n\r\n",
            b"HTTP/1.1 2000 OK\r\n\r\n",
            b"HTTP/1.1 099 OK\r\n\r\n",
            b"HTTP/1.1 600 OK\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",
            b"HTTTP/1.1 200 OK\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nX: \x00\r\n\r\n",
        ] {
            assert!(
                resp(bad, Method::Get).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn response_at_every_split() {
        let input = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\n";
        for cut in 0..input.len() {
            let mut head = ResponseHead::default();
            assert_eq!(
                parse_response(&input[..cut], 100, Method::Get, &mut head),
                Ok(None),
                "cut {cut}"
            );
        }
        assert!(resp(input, Method::Get).is_ok());
    }
}
