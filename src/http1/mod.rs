//! HTTP/1.1 codec, sans-IO: head parsing on httparse, strict framing, body decoding and head
//! writing. Nothing here touches a socket or knows about routes and upstreams.
//!
//! Ownership: the parsed heads ([`RequestHead`], [`ResponseHead`]) are reusable per-connection
//! storage holding *offsets* into the caller's buffer, so parsing allocates nothing once a
//! connection's header vector has grown to its working size.
//!
//! Strictness (RFC 9112): invalid names or values, control characters, bare CR, obs-fold,
//! Content-Length with Transfer-Encoding, differing Content-Lengths, a Transfer-Encoding that is
//! not exactly `chunked`, and an HTTP/1.1 request without exactly one valid Host are errors.

pub mod body;
pub mod encode;
pub mod head;

pub use body::{filter_in_place, parse_content_length, ChunkedDecoder, ChunkedError, Keep, Step};
pub use encode::{write_request_head, write_response_head, RequestEdits, ResponseEdits};
pub use head::{
    check_partial, may_complete_head, parse_request, parse_response, request_from_parts,
    HeadLimits, ParseError, RequestHead, ResponseHead, WrittenRequest, MAX_HEADERS_HARD_LIMIT,
};

/// A byte range inside a parsed head, relative to the head's first byte.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Span {
    /// Offset of the first byte.
    pub start: u32,
    /// Length in bytes.
    pub len: u32,
}

impl Span {
    /// The span of `part`, which must lie inside `base`.
    pub(crate) fn of(base: &[u8], part: &[u8]) -> Span {
        let start = (part.as_ptr() as usize).wrapping_sub(base.as_ptr() as usize);
        debug_assert!(start + part.len() <= base.len());
        Span {
            start: start as u32,
            len: part.len() as u32,
        }
    }

    /// The bytes of this span in `base` (empty if out of range, which parsing never produces).
    pub fn get<'a>(&self, base: &'a [u8]) -> &'a [u8] {
        let start = self.start as usize;
        base.get(start..start + self.len as usize).unwrap_or(&[])
    }

    /// One past the last byte.
    pub fn end(&self) -> usize {
        (self.start + self.len) as usize
    }
}

/// HTTP/1.x minor version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Version {
    /// HTTP/1.0
    Http10,
    /// HTTP/1.1
    #[default]
    Http11,
}

/// Request method, with the ones the proxy treats specially named.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Method {
    /// GET
    #[default]
    Get,
    /// HEAD: the response never has a body.
    Head,
    /// POST
    Post,
    /// PUT
    Put,
    /// DELETE
    Delete,
    /// OPTIONS
    Options,
    /// TRACE
    Trace,
    /// PATCH
    Patch,
    /// CONNECT: not served by a reverse proxy.
    Connect,
    /// Any other token.
    Other,
}

impl Method {
    fn from_bytes(m: &[u8]) -> Method {
        match m {
            b"GET" => Method::Get,
            b"HEAD" => Method::Head,
            b"POST" => Method::Post,
            b"PUT" => Method::Put,
            b"DELETE" => Method::Delete,
            b"OPTIONS" => Method::Options,
            b"TRACE" => Method::Trace,
            b"PATCH" => Method::Patch,
            b"CONNECT" => Method::Connect,
            _ => Method::Other,
        }
    }

    /// RFC 9110 §9.2.2: the request can be repeated with the same effect.
    pub fn is_idempotent(self) -> bool {
        matches!(
            self,
            Method::Get
                | Method::Head
                | Method::Options
                | Method::Trace
                | Method::Put
                | Method::Delete
        )
    }
}

/// Header names the codec and the proxy treat specially; everything else is `Other`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HeaderKind {
    /// Any header without special meaning here.
    #[default]
    Other,
    /// Host
    Host,
    /// Content-Length
    ContentLength,
    /// Transfer-Encoding
    TransferEncoding,
    /// Connection
    Connection,
    /// Keep-Alive
    KeepAlive,
    /// Proxy-Connection (non-standard, treated as hop-by-hop)
    ProxyConnection,
    /// TE
    Te,
    /// Upgrade
    Upgrade,
    /// Expect
    Expect,
    /// X-Forwarded-For
    XForwardedFor,
    /// X-Forwarded-Proto
    XForwardedProto,
    /// X-Real-IP
    XRealIp,
    /// X-Request-Id
    XRequestId,
    /// Forwarded (RFC 7239): kept from trusted peers only.
    Forwarded,
    /// Date: added to a relayed response that lacks one (RFC 9110 §6.6.1).
    Date,
    /// X-Forwarded-Host, X-Forwarded-Port, X-Forwarded-Prefix: what a backend builds its own
    /// URLs from; kept from trusted peers only (ringway sets none of them).
    XForwardedOrigin,
    /// An underscore spelling of a field ringway treats specially (`X_Forwarded_For`,
    /// `Content_Length`, `Transfer_Encoding`, `Host`...), which CGI-style backends read as
    /// the real one: never forwarded.
    ForwardedAlias,
}

/// Whether `name` spells `lower`, a lowercase field name (letters, digits, `-`), in any ASCII
/// case. The same answer as `eq_ignore_ascii_case`, eight bytes at a time: the two may differ
/// only in bit 0x20, and only where `lower` has a letter. (Every request classifies each of
/// its fields and each of its response's; byte by byte this was 2–6% of the proxy's
/// instructions per request.)
#[inline]
fn eq_ignore_case(name: &[u8], lower: &[u8]) -> bool {
    debug_assert!(lower
        .iter()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-'));
    if name.len() != lower.len() {
        return false;
    }
    let (mut a, mut b) = (name, lower);
    while let (Some((x, rest_a)), Some((y, rest_b))) =
        (a.split_first_chunk::<8>(), b.split_first_chunk::<8>())
    {
        let (x, y) = (u64::from_ne_bytes(*x), u64::from_ne_bytes(*y));
        if (x ^ y) & !letter_bits(y) != 0 {
            return false;
        }
        (a, b) = (rest_a, rest_b);
    }
    a.iter()
        .zip(b)
        .all(|(&x, &y)| x == y || (y.is_ascii_lowercase() && x == y ^ 0x20))
}

/// 0x20 in each byte of `w` that is a lowercase letter, for bytes that are letters, digits
/// or `-` (all below 0x80, and every one from `a` up a letter): per byte, the high bit of
/// `(byte | 0x80) - 0x61` says `byte >= 0x61`, with no borrow between bytes.
#[inline]
fn letter_bits(w: u64) -> u64 {
    const HIGH: u64 = 0x8080_8080_8080_8080;
    const LOWER_A: u64 = 0x6161_6161_6161_6161;
    (((w | HIGH).wrapping_sub(LOWER_A)) & HIGH) >> 2
}

impl HeaderKind {
    /// Classifies a header name (case-insensitive).
    pub fn classify(name: &[u8]) -> HeaderKind {
        let kind = Self::classify_exact(name);
        if kind == HeaderKind::Other && name.contains(&b'_') && name.len() <= 18 {
            let mut dashed = [0u8; 18];
            for (d, &b) in dashed.iter_mut().zip(name) {
                *d = if b == b'_' { b'-' } else { b };
            }
            // Forwarding fields, and the ones that frame or route a message: a backend
            // that reads `_` as `-` would otherwise see a second Content-Length (a
            // desync), a second Host or Connection.
            if Self::classify_exact(&dashed[..name.len()]) != HeaderKind::Other {
                return HeaderKind::ForwardedAlias;
            }
        }
        kind
    }

    fn classify_exact(name: &[u8]) -> HeaderKind {
        for (n, kind) in Self::known(name.len()) {
            if eq_ignore_case(name, n) {
                return *kind;
            }
        }
        HeaderKind::Other
    }

    /// The field names ringway treats specially that are `len` bytes long, lowercase.
    /// (Dispatch on length first: one comparison for most names.)
    fn known(len: usize) -> &'static [(&'static [u8], HeaderKind)] {
        match len {
            2 => &[(b"te", HeaderKind::Te)],
            4 => &[(b"host", HeaderKind::Host), (b"date", HeaderKind::Date)],
            6 => &[(b"expect", HeaderKind::Expect)],
            7 => &[(b"upgrade", HeaderKind::Upgrade)],
            9 => &[
                (b"x-real-ip", HeaderKind::XRealIp),
                (b"forwarded", HeaderKind::Forwarded),
            ],
            10 => &[
                (b"connection", HeaderKind::Connection),
                (b"keep-alive", HeaderKind::KeepAlive),
            ],
            12 => &[(b"x-request-id", HeaderKind::XRequestId)],
            14 => &[(b"content-length", HeaderKind::ContentLength)],
            15 => &[(b"x-forwarded-for", HeaderKind::XForwardedFor)],
            16 => &[
                (b"proxy-connection", HeaderKind::ProxyConnection),
                (b"x-forwarded-host", HeaderKind::XForwardedOrigin),
                (b"x-forwarded-port", HeaderKind::XForwardedOrigin),
            ],
            17 => &[
                (b"transfer-encoding", HeaderKind::TransferEncoding),
                (b"x-forwarded-proto", HeaderKind::XForwardedProto),
            ],
            18 => &[(b"x-forwarded-prefix", HeaderKind::XForwardedOrigin)],
            _ => &[],
        }
    }

    /// RFC 9110 §7.6.1 connection-specific fields, never forwarded.
    pub fn is_hop_by_hop(self) -> bool {
        matches!(
            self,
            HeaderKind::Connection
                | HeaderKind::KeepAlive
                | HeaderKind::ProxyConnection
                | HeaderKind::Te
                | HeaderKind::TransferEncoding
                | HeaderKind::Upgrade
        )
    }
}

impl HeaderKind {
    /// Whether a field of this kind may be relayed in a trailer section: not a
    /// connection-specific one, and none that frames or routes a message (RFC 9110 §6.5.1),
    /// as a recipient merging trailers into the header section would take them for real.
    pub fn fits_a_trailer(self) -> bool {
        !self.is_hop_by_hop()
            && !matches!(
                self,
                HeaderKind::ContentLength | HeaderKind::Host | HeaderKind::ForwardedAlias
            )
    }
}

/// One parsed header field: where its name and value are, what it is, and whether it must be
/// dropped when forwarding (hop-by-hop or listed in Connection).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HeaderField {
    /// The field name.
    pub name: Span,
    /// The field value, without surrounding whitespace.
    pub value: Span,
    /// Classification of the name.
    pub kind: HeaderKind,
    /// Connection-specific: never forwarded.
    pub hop: bool,
}

/// How a message body is delimited (RFC 9112 §6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BodyFraming {
    /// No body.
    #[default]
    None,
    /// Exactly this many bytes.
    Length(u64),
    /// Chunked transfer coding.
    Chunked,
    /// Until the connection closes (responses only).
    UntilClose,
}

impl BodyFraming {
    /// Whether a body follows the head.
    pub fn has_body(self) -> bool {
        !matches!(self, BodyFraming::None | BodyFraming::Length(0))
    }
}

/// RFC 9110 §5.6.2 tchar.
pub fn is_tchar(b: u8) -> bool {
    matches!(b,
        b'!' | b'#' | b'$' | b'%' | b'&' | b'\'' | b'*' | b'+' | b'-' | b'.' | b'^' | b'_' | b'`'
        | b'|' | b'~' | b'0'..=b'9' | b'a'..=b'z' | b'A'..=b'Z')
}

/// Splits a comma-separated field value into trimmed, non-empty elements (RFC 9110 §5.6.1).
pub fn list_elements(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value
        .split(|&b| b == b',')
        .map(trim_ows)
        .filter(|e| !e.is_empty())
}

/// Trims optional whitespace (SP / HTAB) from both ends.
pub fn trim_ows(mut s: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = s {
        s = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = s {
        s = rest;
    }
    s
}

/// Whether a response that has no body still states its Content-Length (RFC 9110 §8.6): a
/// response to HEAD and a 304 may give the length the body would have had; a 1xx or 204 never
/// carries one.
pub fn bodiless_length_stated(method: Method, status: u16) -> bool {
    (method == Method::Head || status == 304) && status != 204 && !(100..200).contains(&status)
}

/// The standard reason phrase of a status code, or "" for unknown ones.
pub fn reason_phrase(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        101 => "Switching Protocols",
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        204 => "No Content",
        206 => "Partial Content",
        301 => "Moved Permanently",
        302 => "Found",
        303 => "See Other",
        304 => "Not Modified",
        307 => "Temporary Redirect",
        308 => "Permanent Redirect",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        411 => "Length Required",
        413 => "Content Too Large",
        414 => "URI Too Long",
        417 => "Expectation Failed",
        421 => "Misdirected Request",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        505 => "HTTP Version Not Supported",
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every field name `classify` knows, and every name one byte away from one (each byte
    /// value at each position), in lower and upper case: the word-wise comparison answers as
    /// `eq_ignore_ascii_case` does.
    #[test]
    fn eq_ignore_case_agrees_with_the_bytewise_comparison() {
        // Every known name, and one with digits (none of them has any).
        let mut known: Vec<&[u8]> = (0..64)
            .flat_map(|len| HeaderKind::known(len).iter().map(|(n, _)| *n))
            .collect();
        assert!(known.len() >= 18);
        known.push(b"x-b3-traceid-2024");
        let mut checked = 0;
        for lower in known {
            let upper = lower.to_ascii_uppercase();
            assert!(eq_ignore_case(lower, lower));
            assert!(eq_ignore_case(&upper, lower));
            for base in [lower.to_vec(), upper] {
                for i in 0..base.len() {
                    for v in 0..=255u8 {
                        let mut name = base.clone();
                        name[i] = v;
                        assert_eq!(
                            eq_ignore_case(&name, lower),
                            name.eq_ignore_ascii_case(lower),
                            "{:?} against {:?}",
                            String::from_utf8_lossy(&name),
                            String::from_utf8_lossy(lower)
                        );
                        checked += 1;
                    }
                }
            }
            assert!(!eq_ignore_case(&lower[1..], lower));
        }
        assert!(checked > 100_000);
    }

    #[test]
    fn classify_is_case_insensitive() {
        assert_eq!(HeaderKind::classify(b"HOST"), HeaderKind::Host);
        assert_eq!(
            HeaderKind::classify(b"Transfer-Encoding"),
            HeaderKind::TransferEncoding
        );
        assert_eq!(
            HeaderKind::classify(b"x-forwarded-proto"),
            HeaderKind::XForwardedProto
        );
        assert_eq!(HeaderKind::classify(b"x-forwarded-prot"), HeaderKind::Other);
        assert_eq!(HeaderKind::classify(b"Keep-Alive"), HeaderKind::KeepAlive);
        assert_eq!(HeaderKind::classify(b"accept"), HeaderKind::Other);
        assert_eq!(HeaderKind::classify(b"Forwarded"), HeaderKind::Forwarded);
        for origin in [
            &b"X-Forwarded-Host"[..],
            b"x-forwarded-port",
            b"X-FORWARDED-PREFIX",
        ] {
            assert_eq!(HeaderKind::classify(origin), HeaderKind::XForwardedOrigin);
        }
        assert_eq!(
            HeaderKind::classify(b"x_forwarded_prefix"),
            HeaderKind::ForwardedAlias
        );
        assert_eq!(
            HeaderKind::classify(b"X_Forwarded_For"),
            HeaderKind::ForwardedAlias
        );
        assert_eq!(
            HeaderKind::classify(b"x_real_ip"),
            HeaderKind::ForwardedAlias
        );
        assert_eq!(
            HeaderKind::classify(b"X-Real_IP"),
            HeaderKind::ForwardedAlias
        );
        for framing in [
            &b"Content_Length"[..],
            b"transfer_encoding",
            b"CONNECTION",
            b"up_grade",
        ] {
            let kind = HeaderKind::classify(framing);
            let aliased = framing.contains(&b'_') && framing != b"up_grade";
            assert_eq!(
                kind == HeaderKind::ForwardedAlias,
                aliased,
                "{}",
                String::from_utf8_lossy(framing)
            );
        }
        assert_eq!(HeaderKind::classify(b"x_custom"), HeaderKind::Other);
    }

    #[test]
    fn list_elements_trims_and_skips_empty() {
        let v: Vec<&[u8]> = list_elements(b" close ,, keep-alive,\tX-Foo ").collect();
        assert_eq!(v, vec![&b"close"[..], b"keep-alive", b"X-Foo"]);
    }

    #[test]
    fn idempotent_methods() {
        assert!(Method::Put.is_idempotent());
        assert!(Method::Delete.is_idempotent());
        assert!(!Method::Post.is_idempotent());
        assert!(!Method::Patch.is_idempotent());
    }
}
