//! Responses ringway writes itself: the JSON error envelope, configured `respond` actions and
//! the reserved endpoints. The only place an error becomes bytes on the wire.

use super::io::{write_all_by, Stall};
use super::{ClientConn, ReqInfo};
use crate::buf::Block;
use crate::error::ErrorKind;
use crate::http1::encode::{decimal, put_field, put_status_line, put_u64};
use crate::http1::{Method, Version};
use crate::observe::metrics::add;
use crate::observe::request_id::RequestId;
use crate::route::Maintenance;
use crate::worker::{CoreGen, Worker};

/// A response to write.
#[derive(Debug, Clone, Copy)]
pub struct Local<'a> {
    /// Status code.
    pub status: u16,
    /// Content-Type, if any.
    pub content_type: Option<&'a [u8]>,
    /// More fields.
    pub headers: &'a [(&'a [u8], &'a [u8])],
    /// Body (not sent for HEAD requests; Content-Length still says its size).
    pub body: &'a [u8],
}

/// Writes `resp` to the client. `close` adds `Connection: close`; for a persistent HTTP/1.0
/// client `Connection: keep-alive` is added instead. Returns whether the write succeeded.
pub async fn send(
    w: &Worker,
    cg: &CoreGen,
    conn: &mut ClientConn,
    resp: Local<'_>,
    req: Option<&ReqInfo>,
    rid: &RequestId,
    close: bool,
) -> bool {
    // RFC 9110 §8.6, §15.3.5, §15.4.5: no body after 204 and 304, and no Content-Length on 204.
    let bodiless = resp.status == 204 || resp.status == 304;
    let head_only = bodiless || req.is_some_and(|r| r.method == Method::Head);
    let http10 = req.is_some_and(|r| r.version == Version::Http10);
    let mut out = w.pool.take();
    let date = w.date();
    let written = (|| {
        put_status_line(&mut out, resp.status, b"")?;
        put_field(&mut out, b"date", &date)?;
        if let Some(ct) = resp.content_type {
            put_field(&mut out, b"content-type", ct)?;
        }
        for (name, value) in resp.headers {
            put_field(&mut out, name, value)?;
        }
        if !bodiless {
            out.put(b"content-length: ")?;
            put_u64(&mut out, resp.body.len() as u64)?;
            out.put(b"\r\n")?;
        }
        if close {
            put_field(&mut out, b"connection", b"close")?;
        } else if http10 {
            put_field(&mut out, b"connection", b"keep-alive")?;
        }
        put_field(&mut out, b"x-request-id", rid.as_bytes())?;
        out.put(b"\r\n")
    })();
    if written.is_err() {
        // Configured headers too large for a block: the config's bounds on them (8 KiB of
        // fields against blocks of at least 16 KiB) keep this from happening; the caller
        // closes the connection.
        tracing::error!(
            status = resp.status,
            "local response head does not fit a block"
        );
        return false;
    }
    let mut body = if head_only { &[][..] } else { resp.body };
    // Counted before the write: a client that has read the response and asks /metrics next
    // must see it counted.
    w.metrics().response(resp.status);
    loop {
        let n = out.spare().min(body.len());
        // Fits by construction: n <= spare.
        let _ = out.put(&body[..n]);
        body = &body[n..];
        let len = out.len() as u64;
        let stall = Stall::new(w.now(), cg.gen.http.send_timeout);
        let (res, buf) = write_all_by(&mut conn.stream, out, stall, &w.pool).await;
        out = buf;
        if res.is_err() {
            conn.log.client_left();
            return false;
        }
        add(&w.metrics().bytes_out, len);
        conn.log.wrote(resp.status, len);
        if body.is_empty() {
            break;
        }
    }
    true
}

/// Writes the JSON error envelope for `kind` (nothing for kinds without a status).
#[allow(clippy::too_many_arguments)]
pub async fn error(
    w: &Worker,
    cg: &CoreGen,
    conn: &mut ClientConn,
    kind: ErrorKind,
    req: Option<&ReqInfo>,
    rid: &RequestId,
    close: bool,
) -> bool {
    let retry_after: &[u8] = if kind == ErrorKind::ShuttingDown {
        b"1"
    } else {
        b""
    };
    envelope_response(
        w,
        cg,
        conn,
        kind,
        kind.message(),
        retry_after,
        req,
        rid,
        close,
    )
    .await
}

/// The JSON error envelope for `kind` with `Retry-After: secs` (an open circuit).
#[allow(clippy::too_many_arguments)]
pub async fn error_retry_after(
    w: &Worker,
    cg: &CoreGen,
    conn: &mut ClientConn,
    kind: ErrorKind,
    secs: u64,
    req: &ReqInfo,
    close: bool,
) -> bool {
    let mut digits = [0u8; 20];
    let text = decimal(secs.max(1), &mut digits);
    envelope_response(
        w,
        cg,
        conn,
        kind,
        kind.message(),
        text,
        Some(req),
        &req.rid,
        close,
    )
    .await
}

/// 503 `maintenance` with the operator's message and `Retry-After` in whole seconds.
pub async fn maintenance(
    w: &Worker,
    cg: &CoreGen,
    conn: &mut ClientConn,
    m: &Maintenance,
    req: &ReqInfo,
    close: bool,
) -> bool {
    let mut digits = [0u8; 20];
    let secs = decimal(m.retry_after.as_secs().max(1), &mut digits);
    let kind = ErrorKind::Maintenance;
    envelope_response(
        w,
        cg,
        conn,
        kind,
        &m.message,
        secs,
        Some(req),
        &req.rid,
        close,
    )
    .await
}

#[allow(clippy::too_many_arguments)]
async fn envelope_response(
    w: &Worker,
    cg: &CoreGen,
    conn: &mut ClientConn,
    kind: ErrorKind,
    message: &str,
    retry_after: &[u8],
    req: Option<&ReqInfo>,
    rid: &RequestId,
    close: bool,
) -> bool {
    conn.log.error = Some(kind);
    let Some(status) = kind.status() else {
        return false;
    };
    // (A request rejected before its head was parsed is known for gRPC by its stream.)
    if req.map_or_else(|| conn.stream.is_grpc(), |r| r.grpc) {
        // gRPC clients read errors from grpc-status: a trailers-only response (its HEADERS
        // frame ends the stream), with the classification as grpc-message.
        let mut digits = [0u8; 20];
        let code = decimal(u64::from(crate::h2::grpc::status_for(kind)), &mut digits);
        let message = crate::h2::grpc::encode_message(message);
        let headers: [(&[u8], &[u8]); 2] = [(b"grpc-status", code), (b"grpc-message", &message)];
        let resp = Local {
            status: 200,
            content_type: Some(b"application/grpc"),
            headers: &headers,
            body: b"",
        };
        return send(w, cg, conn, resp, req, rid, close).await;
    }
    let mut body = w.pool.take();
    if envelope(&mut body, kind.code(), message, rid).is_err() {
        return false;
    }
    let with_retry: [(&[u8], &[u8]); 1] = [(b"retry-after", retry_after)];
    let resp = Local {
        status,
        content_type: Some(b"application/json"),
        headers: if retry_after.is_empty() {
            &[]
        } else {
            &with_retry
        },
        body: body.data(),
    };
    send(
        w,
        cg,
        conn,
        resp,
        req,
        rid,
        close || kind.closes_downstream(),
    )
    .await
}

/// `{"error":{"code":...,"message":...,"request_id":...}}`
pub fn envelope(
    out: &mut Block,
    code: &str,
    message: &str,
    rid: &RequestId,
) -> Result<(), crate::buf::Full> {
    out.put(b"{\"error\":{\"code\":\"")?;
    put_json_str(out, code.as_bytes())?;
    out.put(b"\",\"message\":\"")?;
    put_json_str(out, message.as_bytes())?;
    out.put(b"\",\"request_id\":\"")?;
    put_json_str(out, rid.as_bytes())?;
    out.put(b"\"}}")
}

fn put_json_str(out: &mut Block, s: &[u8]) -> Result<(), crate::buf::Full> {
    crate::observe::access_log::json_escape(s, &mut |piece| out.put(piece))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::buf::BufPool;

    #[test]
    fn envelope_escapes() {
        let pool = BufPool::new(1024);
        let mut out = pool.take();
        let rid = RequestId::from_inbound(br#"a"b\c"#).unwrap();
        envelope(&mut out, "no_route", "no route for this request", &rid).unwrap();
        assert_eq!(
            std::str::from_utf8(out.data()).unwrap(),
            r#"{"error":{"code":"no_route","message":"no route for this request","request_id":"a\"b\\c"}}"#
        );
    }
}
