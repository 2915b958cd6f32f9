//! Head writers: the forwarded request head and the relayed response head, written from the
//! original head's bytes plus a small set of edits, straight into a pooled block.
//!
//! What is never copied from the original: hop-by-hop fields and the names listed in
//! Connection (RFC 9110 §7.6.1), framing fields (regenerated from the parsed framing, so an
//! ambiguous spelling never reaches the next hop), and the fields the edits replace.

use super::head::upgrade_protocols;
use super::{reason_phrase, BodyFraming, HeaderField, HeaderKind, RequestHead, ResponseHead};
use crate::buf::{Block, Full};

/// How X-Forwarded-For is written.
#[derive(Debug, Clone, Copy)]
pub enum ForwardedFor<'a> {
    /// The peer is a trusted proxy: keep the inbound chain and append the peer.
    Append(&'a [u8]),
    /// Untrusted peer: the inbound chain is discarded; the value is exactly the peer.
    Replace(&'a [u8]),
}

/// The changes made to a request head on its way upstream.
#[derive(Debug, Clone, Copy)]
pub struct RequestEdits<'a> {
    /// The request target, written as the concatenation of these parts.
    pub target: [&'a [u8]; 3],
    /// The Host value.
    pub host: &'a [u8],
    /// X-Forwarded-For.
    pub forwarded_for: ForwardedFor<'a>,
    /// X-Real-IP: the direct peer.
    pub real_ip: &'a [u8],
    /// X-Forwarded-Proto to set, or `None` to keep the inbound value (trusted peer).
    pub forwarded_proto: Option<&'a [u8]>,
    /// Keep inbound `Forwarded` and `X-Forwarded-Host`/`-Port`/`-Prefix` fields (trusted
    /// peer); otherwise they are dropped.
    pub keep_forwarded: bool,
    /// X-Request-Id.
    pub request_id: &'a [u8],
    /// Forward the request's protocol upgrade (`RequestHead::upgrade`): its Upgrade
    /// protocols but `h2c`, with `Connection: upgrade`.
    pub upgrade: bool,
}

/// The changes made to a response head on its way to the client.
#[derive(Debug, Clone, Copy)]
pub struct ResponseEdits<'a> {
    /// Framing header to write: `Length(n)` writes Content-Length, `Chunked` writes
    /// Transfer-Encoding, anything else writes none.
    pub framing: BodyFraming,
    /// Connection option to send (`close`, `keep-alive`), if any.
    pub connection: Option<&'a [u8]>,
    /// X-Request-Id echoed to the client.
    pub request_id: &'a [u8],
    /// A 101 switching protocols: the response's Upgrade protocols go along, with
    /// `Connection: upgrade`.
    pub upgrade: bool,
    /// The time now (an IMF-fixdate), for a response that carries no Date field: a proxy
    /// with a clock adds it (RFC 9110 §6.6.1).
    pub date: &'a [u8],
}

/// Writes the upstream request head for `head` (parsed from `src`) with `edits` into `out`.
pub fn write_request_head(
    src: &[u8],
    head: &RequestHead,
    edits: &RequestEdits<'_>,
    out: &mut Block,
) -> Result<(), Full> {
    out.put(head.method_span.get(src))?;
    out.put(b" ")?;
    for part in edits.target {
        out.put(part)?;
    }
    out.put(b" HTTP/1.1\r\nhost: ")?;
    out.put(edits.host)?;
    out.put(b"\r\n")?;
    for h in &head.headers {
        let skip = h.hop
            || match h.kind {
                HeaderKind::Host
                | HeaderKind::ContentLength
                | HeaderKind::Expect
                | HeaderKind::XForwardedFor
                | HeaderKind::XRealIp
                | HeaderKind::XRequestId
                | HeaderKind::ForwardedAlias => true,
                HeaderKind::XForwardedProto => edits.forwarded_proto.is_some(),
                HeaderKind::Forwarded | HeaderKind::XForwardedOrigin => !edits.keep_forwarded,
                _ => false,
            };
        if !skip {
            put_field(out, h.name.get(src), h.value.get(src))?;
        }
    }
    put_framing(out, head.framing)?;
    if edits.upgrade {
        put_upgrade(out, head.upgrade_protocols(src))?;
    }
    out.put(b"x-forwarded-for: ")?;
    match edits.forwarded_for {
        ForwardedFor::Append(peer) => {
            for h in head
                .headers
                .iter()
                .filter(|h| h.kind == HeaderKind::XForwardedFor && !h.hop)
            {
                let v = h.value.get(src);
                if !v.is_empty() {
                    out.put(v)?;
                    out.put(b", ")?;
                }
            }
            out.put(peer)?;
        }
        ForwardedFor::Replace(peer) => out.put(peer)?,
    }
    out.put(b"\r\nx-real-ip: ")?;
    out.put(edits.real_ip)?;
    if let Some(proto) = edits.forwarded_proto {
        out.put(b"\r\nx-forwarded-proto: ")?;
        out.put(proto)?;
    }
    out.put(b"\r\nx-request-id: ")?;
    out.put(edits.request_id)?;
    out.put(b"\r\n\r\n")
}

/// Whether a relayed response head keeps this field of the upstream's as it is: not a
/// connection-specific one, nor one the proxy writes itself (framing, request id). The
/// HTTP/2 form of a relayed head (`h2::h2_response`) keeps the same.
pub fn kept_when_relayed(h: &HeaderField) -> bool {
    !h.hop
        && !matches!(
            h.kind,
            HeaderKind::ContentLength | HeaderKind::TransferEncoding | HeaderKind::XRequestId
        )
}

/// Writes the client response head for `head` (parsed from `src`) with `edits` into `out`.
pub fn write_response_head(
    src: &[u8],
    head: &ResponseHead,
    edits: &ResponseEdits<'_>,
    out: &mut Block,
) -> Result<(), Full> {
    put_status_line(out, head.status, head.reason.get(src))?;
    let mut dated = false;
    for h in &head.headers {
        dated |= h.kind == HeaderKind::Date;
        if kept_when_relayed(h) {
            put_field(out, h.name.get(src), h.value.get(src))?;
        }
    }
    if !dated && !edits.date.is_empty() {
        put_field(out, b"date", edits.date)?;
    }
    put_framing(out, edits.framing)?;
    if edits.upgrade {
        put_upgrade(out, upgrade_protocols(&head.headers, src))?;
    } else if let Some(option) = edits.connection {
        put_field(out, b"connection", option)?;
    }
    put_field(out, b"x-request-id", edits.request_id)?;
    out.put(b"\r\n")
}

/// `upgrade: p1, p2` and `connection: upgrade`.
fn put_upgrade<'a>(out: &mut Block, protocols: impl Iterator<Item = &'a [u8]>) -> Result<(), Full> {
    out.put(b"upgrade: ")?;
    for (i, p) in protocols.enumerate() {
        if i > 0 {
            out.put(b", ")?;
        }
        out.put(p)?;
    }
    out.put(b"\r\nconnection: upgrade\r\n")
}

/// `HTTP/1.1 <status> <reason>\r\n`; the standard phrase when `reason` is empty.
pub fn put_status_line(out: &mut Block, status: u16, reason: &[u8]) -> Result<(), Full> {
    out.put(b"HTTP/1.1 ")?;
    put_u64(out, u64::from(status))?;
    out.put(b" ")?;
    if reason.is_empty() {
        out.put(reason_phrase(status).as_bytes())?;
    } else {
        out.put(reason)?;
    }
    out.put(b"\r\n")
}

/// `name: value\r\n`
pub fn put_field(out: &mut Block, name: &[u8], value: &[u8]) -> Result<(), Full> {
    out.put(name)?;
    out.put(b": ")?;
    out.put(value)?;
    out.put(b"\r\n")
}

fn put_framing(out: &mut Block, framing: BodyFraming) -> Result<(), Full> {
    match framing {
        BodyFraming::Length(n) => {
            out.put(b"content-length: ")?;
            put_u64(out, n)?;
            out.put(b"\r\n")
        }
        BodyFraming::Chunked => out.put(b"transfer-encoding: chunked\r\n"),
        BodyFraming::None | BodyFraming::UntilClose => Ok(()),
    }
}

/// Decimal digits of `n`.
pub fn put_u64(out: &mut Block, n: u64) -> Result<(), Full> {
    let mut digits = [0u8; 20];
    out.put(decimal(n, &mut digits))
}

/// `n` in decimal, written at the end of `buf` (no allocation).
pub fn decimal(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    &buf[i..]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::buf::BufPool;
    use crate::http1::{parse_request, parse_response, HeadLimits, Method};

    fn req_head(src: &[u8]) -> RequestHead {
        let mut head = RequestHead::default();
        parse_request(src, &HeadLimits::default(), &mut head)
            .unwrap()
            .unwrap();
        head
    }

    #[test]
    fn request_rewrite_strips_and_appends() {
        let src = b"POST /api/x?y=1 HTTP/1.1\r\nHost: public.example\r\nConnection: keep-alive, X-Hop\r\nX-Hop: 1\r\nKeep-Alive: timeout=5\r\nTE: trailers\r\nUpgrade: websocket\r\nProxy-Connection: x\r\nX-Forwarded-For: 1.1.1.1\r\nX-Forwarded-For: 2.2.2.2\r\nX-Real-IP: 9.9.9.9\r\nX-Request-Id: abc\r\nX_Forwarded_For: 7.7.7.7\r\nForwarded: for=7.7.7.7\r\nExpect: 100-continue\r\nTransfer-Encoding: chunked\r\nAccept: */*\r\n\r\n";
        let head = req_head(src);
        let pool = BufPool::new(4096);
        let mut out = pool.take();
        let edits = RequestEdits {
            target: [b"/v2", head.path.get(src), head.query.get(src)],
            host: b"10.0.0.1:9000",
            forwarded_for: ForwardedFor::Append(b"3.3.3.3"),
            real_ip: b"3.3.3.3",
            forwarded_proto: Some(b"http"),
            keep_forwarded: false,
            request_id: b"abc",
            upgrade: head.upgrade,
        };
        write_request_head(src, &head, &edits, &mut out).unwrap();
        assert_eq!(
            std::str::from_utf8(out.data()).unwrap(),
            "POST /v2/api/x?y=1 HTTP/1.1\r\nhost: 10.0.0.1:9000\r\nAccept: */*\r\n\
             transfer-encoding: chunked\r\nx-forwarded-for: 1.1.1.1, 2.2.2.2, 3.3.3.3\r\n\
             x-real-ip: 3.3.3.3\r\nx-forwarded-proto: http\r\nx-request-id: abc\r\n\r\n"
        );

        let mut out = pool.take();
        let edits = RequestEdits {
            forwarded_for: ForwardedFor::Replace(b"3.3.3.3"),
            ..edits
        };
        write_request_head(src, &head, &edits, &mut out).unwrap();
        let text = std::str::from_utf8(out.data()).unwrap();
        assert!(text.contains("x-forwarded-for: 3.3.3.3\r\n"), "{text}");
        assert!(!text.contains("1.1.1.1"));
    }

    #[test]
    fn response_rewrite() {
        let src = b"HTTP/1.1 200 OK\r\nConnection: X-A\r\nX-A: 1\r\nX-Request-Id: upstream\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n";
        let mut head = ResponseHead::default();
        parse_response(src, 100, Method::Get, &mut head)
            .unwrap()
            .unwrap();
        let pool = BufPool::new(4096);
        let mut out = pool.take();
        let edits = ResponseEdits {
            framing: head.framing,
            connection: Some(b"close"),
            request_id: b"rid",
            upgrade: false,
            date: b"",
        };
        write_response_head(src, &head, &edits, &mut out).unwrap();
        assert_eq!(
            std::str::from_utf8(out.data()).unwrap(),
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\ntransfer-encoding: chunked\r\n\
             connection: close\r\nx-request-id: rid\r\n\r\n"
        );
        // The upstream's Date is kept, not doubled.
        let src = b"HTTP/1.1 204 No Content\r\nDATE: Mon, 30 Nov 2026 01:02:03 GMT\r\n\r\n";
        parse_response(src, 100, Method::Get, &mut head)
            .unwrap()
            .unwrap();
        let mut out = pool.take();
        let edits = ResponseEdits {
            date: b"Tue, 01 Dec 2026 05:30:00 GMT",
            connection: None,
            framing: head.framing,
            ..edits
        };
        write_response_head(src, &head, &edits, &mut out).unwrap();
        let text = std::str::from_utf8(out.data()).unwrap();
        let dates = text
            .lines()
            .filter(|l| l.to_ascii_lowercase().starts_with("date:"))
            .count();
        assert_eq!(dates, 1, "{text}");
        assert!(
            text.contains("DATE: Mon, 30 Nov 2026 01:02:03 GMT\r\n"),
            "{text}"
        );
    }

    #[test]
    fn overflow_is_reported() {
        let src = b"GET / HTTP/1.1\r\nHost: a\r\n\r\n";
        let head = req_head(src);
        let pool = BufPool::new(1024);
        let mut out = pool.take();
        let long = [b'a'; 2000];
        let edits = RequestEdits {
            target: [b"/", b"", b""],
            host: &long,
            forwarded_for: ForwardedFor::Replace(b"1.2.3.4"),
            real_ip: b"1.2.3.4",
            forwarded_proto: None,
            keep_forwarded: false,
            request_id: b"x",
            upgrade: false,
        };
        assert_eq!(write_request_head(src, &head, &edits, &mut out), Err(Full));
    }

    #[test]
    fn upgrades_keep_their_protocols_but_h2c() {
        let src = b"GET /ws HTTP/1.1\r\nHost: a\r\nConnection: Upgrade, keep-alive\r\nUpgrade: websocket, h2c\r\nSec-WebSocket-Key: k\r\n\r\n";
        let head = req_head(src);
        assert!(head.upgrade);
        let pool = BufPool::new(4096);
        let mut out = pool.take();
        let edits = RequestEdits {
            target: [b"/ws", b"", b""],
            host: b"up:80",
            forwarded_for: ForwardedFor::Replace(b"1.2.3.4"),
            real_ip: b"1.2.3.4",
            forwarded_proto: None,
            keep_forwarded: false,
            request_id: b"x",
            upgrade: head.upgrade,
        };
        write_request_head(src, &head, &edits, &mut out).unwrap();
        let text = std::str::from_utf8(out.data()).unwrap();
        assert!(
            text.contains("Sec-WebSocket-Key: k\r\nupgrade: websocket\r\nconnection: upgrade\r\n"),
            "{text}"
        );
        assert!(
            !text.contains("h2c") && !text.contains("keep-alive"),
            "{text}"
        );
        // h2c alone, or no `upgrade` option, is no upgrade.
        for src in [
            &b"GET / HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n"[..],
            b"GET / HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\n\r\n",
            b"GET / HTTP/1.0\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
        ] {
            assert!(!req_head(src).upgrade, "{:?}", String::from_utf8_lossy(src));
        }

        let src = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: a\r\n\r\n";
        let mut resp = ResponseHead::default();
        parse_response(src, 100, Method::Get, &mut resp)
            .unwrap()
            .unwrap();
        let mut out = pool.take();
        let edits = ResponseEdits {
            framing: BodyFraming::None,
            connection: None,
            request_id: b"rid",
            upgrade: true,
            date: b"Tue, 01 Dec 2026 05:30:00 GMT",
        };
        write_response_head(src, &resp, &edits, &mut out).unwrap();
        assert_eq!(
            std::str::from_utf8(out.data()).unwrap(),
            "HTTP/1.1 101 Switching Protocols\r\nSec-WebSocket-Accept: a\r\n\
             date: Tue, 01 Dec 2026 05:30:00 GMT\r\nupgrade: websocket\r\n\
             connection: upgrade\r\nx-request-id: rid\r\n\r\n"
        );
    }

    #[test]
    fn numbers() {
        let pool = BufPool::new(1024);
        let mut out = pool.take();
        for n in [0u64, 7, 10, 1234567890, u64::MAX] {
            out.clear();
            put_u64(&mut out, n).unwrap();
            assert_eq!(out.data(), n.to_string().as_bytes());
        }
    }
}
