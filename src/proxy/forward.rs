//! Forwarding one request to an upstream and relaying the response.
//!
//! ```text
//! limits ─► acquire (pool | connect) ─► send head ─► [100 Continue] ─► pump body ∥ read response head
//!        ─► send response head ─► relay body ─► pool or close
//! ```
//!
//! Framing is relayed as received (after validation): a Content-Length body byte for byte, a
//! chunked body verbatim (to HTTP/1.0 clients with the framing removed, close-delimited), a
//! close-delimited body until EOF. Nothing is collected: each block read is written before the
//! next read, so a slow reader slows the sender (backpressure by construction).
//!
//! Reuse: the upstream connection goes back to the pool only when the request body was sent
//! completely, the response completed exactly with no stray bytes after it, and neither side
//! asked to close. A request that failed on a *reused* connection before any response byte
//! arrived is sent once more on a new connection, if it has no body and its method is
//! idempotent (RFC 9110 §9.2.2).

use std::io as stdio;
use std::os::fd::AsRawFd;
use std::rc::Rc;
use std::time::Instant;

use monoio::io::{OwnedReadHalf, OwnedWriteHalf};
use monoio::net::TcpStream;

use super::io::{race, read_by, write_all_by, write_front_by, write_static_by, Either};
use super::{respond, ClientConn, ReqInfo};
use crate::buf::Block;
use crate::error::{Error, ErrorKind, Side};
use crate::http1::encode::ForwardedFor;
use crate::http1::head::TargetForm;
use crate::http1::{
    filter_in_place, parse_response, write_request_head, write_response_head, BodyFraming,
    ChunkedDecoder, HeaderKind, Keep, Method, RequestEdits, ResponseEdits, ResponseHead, Version,
    MAX_HEADERS_HARD_LIMIT,
};
use crate::observe::metrics::add;
use crate::route::{rewrite_path, Params, ProxyAction, Route};
use crate::upstream::{AcquireError, UpConn};
use crate::worker::{CoreGen, Worker};

/// Interim (1xx) responses skipped before the final one; more is an invalid upstream.
const MAX_INTERIM_RESPONSES: usize = 16;

const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// How the response body travels to the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Relay {
    /// No body.
    None,
    /// Exactly this many bytes.
    Length(u64),
    /// Chunked, relayed verbatim.
    Chunked,
    /// Chunked from the upstream, data only to the (HTTP/1.0) client, close-delimited.
    Dechunk,
    /// Until the upstream closes.
    UntilClose,
}

/// Forwards the request in `conn` to upstream `upstream`; returns whether the client
/// connection may serve another request.
pub(super) async fn proxy(
    w: &Worker,
    cg: &Rc<CoreGen>,
    conn: &mut ClientConn,
    info: &ReqInfo,
    route: &Route,
    action: &ProxyAction,
    params: Params,
) -> bool {
    let gen = &cg.gen;
    let (Some(up_cfg), Some(up)) = (
        gen.upstreams.get(action.upstream),
        cg.upstreams.get(action.upstream),
    ) else {
        // invariant: validate.rs only compiles routes naming existing upstreams.
        return fail(
            w,
            cg,
            conn,
            info,
            Error::new(ErrorKind::Internal, Side::Internal),
            true,
        )
        .await;
    };
    let head_len = conn.head.len;
    let max_body = route
        .limits
        .max_body_bytes
        .or(gen.http.max_request_body_bytes);
    let response_timeout = action.response_timeout.unwrap_or(up_cfg.response_timeout);
    let read_timeout = action.read_timeout.unwrap_or(up_cfg.read_timeout);

    if let (Some(max), BodyFraming::Length(n)) = (max_body, info.framing) {
        if n > max {
            conn.consume_head(head_len);
            return fail(
                w,
                cg,
                conn,
                info,
                Error::new(ErrorKind::BodyTooLarge, Side::Downstream),
                true,
            )
            .await;
        }
    }

    let has_body = info.framing.has_body();
    let replayable = !has_body && info.method.is_idempotent();
    let mut force_new = false;
    let mut attempt = 0u32;
    let mut body_sent = !has_body;
    let (mut upc, ubuf) = loop {
        let mut upc = match up.acquire(force_new, w.now(), w.metrics()).await {
            Ok(c) => c,
            Err(e) => {
                conn.consume_head(head_len);
                let err = match e {
                    AcquireError::NoEndpoints => {
                        Error::new(ErrorKind::UpstreamConnect, Side::Upstream)
                            .with_cause("no endpoint resolved")
                    }
                    AcquireError::Failed(addr, io) => {
                        Error::new(ErrorKind::UpstreamConnect, Side::Upstream)
                            .with_cause(format!("connect to {addr}: {io}"))
                    }
                    AcquireError::TimedOut(addr) => {
                        Error::new(ErrorKind::UpstreamConnectTimeout, Side::Upstream)
                            .with_cause(format!("connect to {addr} timed out"))
                    }
                };
                log_upstream(info, &up_cfg.name, None, &err);
                return fail(w, cg, conn, info, err, has_body).await;
            }
        };

        let mut ubuf = w.pool.take();
        if encode_request(cg, conn, info, &upc, route, action, &params, &mut ubuf).is_err() {
            conn.consume_head(head_len);
            return fail(
                w,
                cg,
                conn,
                info,
                Error::new(ErrorKind::HeadTooLarge, Side::Downstream),
                true,
            )
            .await;
        }
        if has_body {
            // No retry for requests with a body: the head leaves the buffer now, and a small
            // body that is already here rides along in the same write.
            conn.consume_head(head_len);
            if let (BodyFraming::Length(n), Some(rbuf)) = (info.framing, conn.rbuf.as_mut()) {
                let n = n as usize;
                if rbuf.len() >= n && ubuf.spare() >= n {
                    let _ = ubuf.put(&rbuf.data()[..n]);
                    rbuf.consume(n);
                    body_sent = true;
                }
            }
        }

        let deadline = w.now() + gen.http.send_timeout;
        let (res, buf) = write_all_by(&mut upc.write, ubuf, deadline, &w.pool).await;
        let mut ubuf = buf;
        if let Err(e) = res {
            let err = Error::upstream_io(e);
            if attempt == 0 && replayable && err.kind().retryable(upc.is_reused()) {
                tracing::debug!(endpoint = %upc.addr(), "stale pooled connection; retrying on a new one");
                attempt += 1;
                force_new = true;
                continue;
            }
            conn.consume_head(head_len);
            log_upstream(info, &up_cfg.name, Some(&upc), &err);
            return fail(w, cg, conn, info, err, !body_sent).await;
        }
        ubuf.clear();

        let response_deadline = || w.now() + response_timeout;
        let result = if body_sent {
            read_response_head(
                w,
                &mut upc.read,
                ubuf,
                &mut conn.resp,
                info.method,
                Some(response_deadline()),
            )
            .await
        } else {
            let outcome = send_body_and_read_head(
                w,
                cg,
                conn,
                info,
                &mut upc,
                ubuf,
                response_timeout,
                max_body,
            )
            .await;
            match outcome {
                BodyOutcome::Sent(result) => {
                    body_sent = true;
                    result
                }
                BodyOutcome::Interrupted(result) => result,
                BodyOutcome::ClientFailed(err) => {
                    return fail(w, cg, conn, info, err, true).await;
                }
            }
        };
        match result {
            Ok(ubuf) => {
                if !has_body {
                    conn.consume_head(head_len);
                }
                break (upc, ubuf);
            }
            Err(HeadError { error, got_bytes }) => {
                if attempt == 0
                    && replayable
                    && !got_bytes
                    && error.kind().retryable(upc.is_reused())
                {
                    tracing::debug!(endpoint = %upc.addr(), "pooled connection closed before responding; retrying on a new one");
                    attempt += 1;
                    force_new = true;
                    continue;
                }
                if !has_body {
                    conn.consume_head(head_len);
                }
                log_upstream(info, &up_cfg.name, Some(&upc), &error);
                return fail(w, cg, conn, info, error, !body_sent).await;
            }
        }
    };

    let relayed = relay_response(
        w,
        cg,
        conn,
        info,
        &up_cfg.name,
        read_timeout,
        &mut upc,
        ubuf,
        body_sent,
    )
    .await;
    match relayed {
        Some(reuse) => {
            if reuse.upstream {
                w.release_upstream(cg, action.upstream, upc);
            }
            reuse.client
        }
        None => false,
    }
}

/// Writes the upstream request head into `out`: the route's path rewrite, the Host, the
/// forwarding fields.
#[allow(clippy::too_many_arguments)]
fn encode_request(
    cg: &CoreGen,
    conn: &ClientConn,
    info: &ReqInfo,
    upc: &UpConn,
    route: &Route,
    action: &ProxyAction,
    params: &Params,
    out: &mut Block,
) -> Result<(), crate::buf::Full> {
    let Some(rbuf) = conn.rbuf.as_ref() else {
        return Err(crate::buf::Full);
    };
    let src = rbuf.data();
    let head = &conn.head;
    let path = match (head.form, head.path.len) {
        (TargetForm::Absolute, 0) => &b"/"[..],
        _ => head.path.get(src),
    };
    let host = if action.preserve_host && head.host.len > 0 {
        head.host.get(src)
    } else {
        upc.authority().as_bytes()
    };
    let trusted = cg
        .gen
        .gateway
        .trusted_proxies
        .iter()
        .any(|net| net.contains(&conn.peer_ip));
    let peer = conn.peer_text.as_bytes();
    let keep_proto = trusted && head.find(HeaderKind::XForwardedProto).is_some();
    let mut scratch = cg.scratch.borrow_mut();
    let crate::worker::ctx::Scratch { text, captures, .. } = &mut *scratch;
    rewrite_path(
        &action.rewrite,
        path,
        params,
        route.param_names(),
        captures.get_mut(route.index).and_then(Option::as_mut),
        text,
    );
    let edits = RequestEdits {
        target: [text.as_slice(), head.query.get(src), b""],
        host,
        forwarded_for: if trusted {
            ForwardedFor::Append(peer)
        } else {
            ForwardedFor::Replace(peer)
        },
        real_ip: peer,
        forwarded_proto: if keep_proto { None } else { Some(b"http") },
        keep_forwarded: trusted,
        request_id: info.rid.as_bytes(),
    };
    write_request_head(src, head, &edits, out)
}

enum BodyOutcome {
    /// The whole body went upstream; then the response head (or its failure).
    Sent(Result<Block, HeadError>),
    /// The upstream answered, or failed, before the body was sent completely.
    Interrupted(Result<Block, HeadError>),
    /// The client failed (went away, too slow, body too large or malformed).
    ClientFailed(Error),
}

/// Streams the request body upstream while watching for the response head: an upstream may
/// answer (413, 401, ...) before it has read the whole body.
#[allow(clippy::too_many_arguments)]
async fn send_body_and_read_head(
    w: &Worker,
    cg: &CoreGen,
    conn: &mut ClientConn,
    info: &ReqInfo,
    upc: &mut UpConn,
    ubuf: Block,
    response_timeout: std::time::Duration,
    max_body: Option<u64>,
) -> BodyOutcome {
    if info.expect_continue && conn.rbuf.as_ref().is_some_and(Block::is_empty) {
        let deadline = w.now() + cg.gen.http.send_timeout;
        if write_static_by(&mut conn.stream, CONTINUE, deadline)
            .await
            .is_err()
        {
            return BodyOutcome::ClientFailed(Error::new(
                ErrorKind::ClientClosed,
                Side::Downstream,
            ));
        }
        add(&w.metrics().bytes_out, CONTINUE.len() as u64);
    }
    let ClientConn {
        stream, rbuf, resp, ..
    } = conn;
    let UpConn { read, write, .. } = upc;
    let mut pump = std::pin::pin!(pump_request_body(
        w,
        cg,
        stream,
        rbuf,
        write,
        info.framing,
        max_body
    ));
    let mut head = std::pin::pin!(read_response_head(w, read, ubuf, resp, info.method, None));
    match race(pump.as_mut(), head.as_mut()).await {
        Either::Left(Ok(())) => {
            BodyOutcome::Sent(await_head(head.as_mut(), w.now() + response_timeout).await)
        }
        Either::Left(Err(e)) if e.side() == Side::Upstream => {
            // The upstream stopped reading; it may have answered first.
            tracing::debug!(error = %e, "upstream stopped reading the request body");
            BodyOutcome::Interrupted(await_head(head.as_mut(), w.now() + response_timeout).await)
        }
        Either::Left(Err(e)) => BodyOutcome::ClientFailed(e),
        Either::Right(result) => BodyOutcome::Interrupted(result),
    }
}

async fn await_head<F>(head: std::pin::Pin<&mut F>, deadline: Instant) -> Result<Block, HeadError>
where
    F: std::future::Future<Output = Result<Block, HeadError>>,
{
    match monoio::time::timeout_at(monoio::time::Instant::from_std(deadline), head).await {
        Ok(r) => r,
        Err(_) => Err(HeadError {
            error: Error::new(ErrorKind::UpstreamTimeout, Side::Upstream)
                .with_cause("no response head in time"),
            got_bytes: true,
        }),
    }
}

/// Sends the rest of the request body from the client to the upstream.
async fn pump_request_body(
    w: &Worker,
    cg: &CoreGen,
    client: &mut TcpStream,
    rbuf: &mut Option<Block>,
    up: &mut OwnedWriteHalf<TcpStream>,
    framing: BodyFraming,
    max_body: Option<u64>,
) -> Result<(), Error> {
    let http = &cg.gen.http;
    let mut remaining = match framing {
        BodyFraming::Length(n) => n,
        BodyFraming::Chunked => u64::MAX,
        BodyFraming::None | BodyFraming::UntilClose => return Ok(()),
    };
    let mut decoder = ChunkedDecoder::new();
    loop {
        let mut buf = rbuf.take().unwrap_or_else(|| w.pool.take());
        if buf.is_empty() {
            w.body_block(&mut buf);
            if framing != BodyFraming::Chunked {
                buf.limit_next_read(remaining.min(usize::MAX as u64) as usize);
            }
            let deadline = w.now() + http.body_timeout;
            let (res, b) = read_by(client, buf, deadline, &w.pool).await;
            buf = b;
            match res {
                Ok(0) => {
                    *rbuf = Some(buf);
                    return Err(Error::new(ErrorKind::ClientClosed, Side::Downstream)
                        .with_cause("client closed before the end of the request body"));
                }
                Ok(n) => add(&w.metrics().bytes_in, n as u64),
                Err(e) if e.kind() == stdio::ErrorKind::TimedOut => {
                    *rbuf = Some(buf);
                    return Err(
                        Error::new(ErrorKind::RequestTimeout, Side::Downstream).with_cause(e)
                    );
                }
                Err(e) => {
                    *rbuf = Some(buf);
                    return Err(Error::client_io(e));
                }
            }
        }
        // Chunked: relayed verbatim but for trailer fields, which are dropped: a backend that
        // merges trailers into headers must not receive forwarding fields ringway did not set.
        let (n, skipped) = if framing == BodyFraming::Chunked {
            match filter_in_place(&mut decoder, buf.data_mut(), Keep::NoTrailers) {
                Ok((kept, consumed)) => (kept, consumed - kept),
                Err(e) => {
                    *rbuf = Some(buf);
                    return Err(Error::new(ErrorKind::BadRequest, Side::Downstream).with_cause(e));
                }
            }
        } else {
            let n = (buf.len() as u64).min(remaining) as usize;
            remaining -= n as u64;
            (n, 0)
        };
        if max_body.is_some_and(|max| decoder.data_total() > max) {
            *rbuf = Some(buf);
            return Err(Error::new(ErrorKind::BodyTooLarge, Side::Downstream));
        }
        let deadline = w.now() + http.send_timeout;
        let (res, mut b) = write_front_by(up, buf, n, deadline, &w.pool).await;
        if let Err(e) = res {
            *rbuf = Some(b);
            return Err(Error::upstream_io(e));
        }
        b.consume(skipped);
        *rbuf = Some(b);
        let done = if framing == BodyFraming::Chunked {
            decoder.is_done()
        } else {
            remaining == 0
        };
        if done {
            if let Some(b) = rbuf.as_mut() {
                w.head_block(b);
            }
            return Ok(());
        }
    }
}

/// A failure to get a response head, and whether any response byte had arrived.
struct HeadError {
    error: Error,
    got_bytes: bool,
}

/// Reads until a final (non-1xx) response head is buffered at the front of the returned block.
async fn read_response_head(
    w: &Worker,
    up: &mut OwnedReadHalf<TcpStream>,
    mut ubuf: Block,
    resp: &mut ResponseHead,
    method: Method,
    deadline: Option<Instant>,
) -> Result<Block, HeadError> {
    let mut got_bytes = false;
    let mut interim = 0;
    let err = |kind, got_bytes, cause: &'static str| HeadError {
        error: Error::new(kind, Side::Upstream).with_cause(cause),
        got_bytes,
    };
    loop {
        if !ubuf.is_empty() {
            match parse_response(ubuf.data(), MAX_HEADERS_HARD_LIMIT, method, resp) {
                Ok(Some(len)) => {
                    if (100..200).contains(&resp.status) && resp.status != 101 {
                        // Interim responses (100 Continue, 103 Early Hints) are not relayed:
                        // ringway answers Expect itself.
                        interim += 1;
                        if interim > MAX_INTERIM_RESPONSES {
                            return Err(err(
                                ErrorKind::UpstreamInvalid,
                                true,
                                "too many interim responses",
                            ));
                        }
                        ubuf.consume(len);
                        continue;
                    }
                    return Ok(ubuf);
                }
                Ok(None) => {}
                Err(e) => {
                    return Err(HeadError {
                        error: Error::new(ErrorKind::UpstreamInvalid, Side::Upstream).with_cause(e),
                        got_bytes: true,
                    })
                }
            }
        }
        if ubuf.spare() == 0 {
            ubuf.compact();
            if ubuf.spare() == 0 {
                return Err(err(
                    ErrorKind::UpstreamInvalid,
                    true,
                    "response head too large",
                ));
            }
        }
        let read = match deadline {
            Some(d) => read_by(up, ubuf, d, &w.pool).await,
            None => {
                use monoio::io::AsyncReadRent;
                up.read(ubuf).await
            }
        };
        let (res, buf) = read;
        ubuf = buf;
        match res {
            Ok(0) => {
                return Err(err(
                    ErrorKind::UpstreamClosed,
                    got_bytes,
                    "upstream closed before a complete response head",
                ))
            }
            Ok(_) => got_bytes = true,
            Err(e) if e.kind() == stdio::ErrorKind::TimedOut => {
                return Err(HeadError {
                    error: Error::new(ErrorKind::UpstreamTimeout, Side::Upstream).with_cause(e),
                    got_bytes,
                })
            }
            Err(e) => {
                return Err(HeadError {
                    error: Error::upstream_io(e),
                    got_bytes,
                })
            }
        }
    }
}

/// What may be reused after the exchange.
struct Reuse {
    client: bool,
    upstream: bool,
}

/// Sends the response head and relays the body. `None` when the exchange failed after the
/// response started (the client connection must close).
#[allow(clippy::too_many_arguments)]
async fn relay_response(
    w: &Worker,
    cg: &CoreGen,
    conn: &mut ClientConn,
    info: &ReqInfo,
    up_name: &str,
    read_timeout: std::time::Duration,
    upc: &mut UpConn,
    mut ubuf: Block,
    body_sent: bool,
) -> Option<Reuse> {
    let resp = &conn.resp;
    if resp.status == 101 {
        // Upgrade is stripped from requests until tunnels exist; a 101 is a protocol error.
        let err =
            Error::new(ErrorKind::UpstreamInvalid, Side::Upstream).with_cause("unexpected 101");
        log_upstream(info, up_name, Some(upc), &err);
        return fail(w, cg, conn, info, err, !body_sent)
            .await
            .then_some(Reuse {
                client: true,
                upstream: false,
            });
    }
    let http10 = info.version == Version::Http10;
    let (relay, out_framing) = match resp.framing {
        BodyFraming::None => {
            let declared = if info.method == Method::Head || resp.status == 304 {
                resp.content_length
                    .map_or(BodyFraming::None, BodyFraming::Length)
            } else {
                BodyFraming::None
            };
            (Relay::None, declared)
        }
        BodyFraming::Length(n) => (Relay::Length(n), BodyFraming::Length(n)),
        BodyFraming::Chunked if http10 => (Relay::Dechunk, BodyFraming::None),
        BodyFraming::Chunked => (Relay::Chunked, BodyFraming::Chunked),
        BodyFraming::UntilClose => (Relay::UntilClose, BodyFraming::None),
    };
    let keep_client = info.keep_alive
        && body_sent
        && !w.draining()
        && !matches!(relay, Relay::Dechunk | Relay::UntilClose);
    let connection: Option<&[u8]> = if !keep_client {
        Some(b"close")
    } else if http10 {
        Some(b"keep-alive")
    } else {
        None
    };
    let status = resp.status;
    let upstream_keep_alive = resp.keep_alive;

    let mut out = w.pool.take();
    let edits = ResponseEdits {
        framing: out_framing,
        connection,
        request_id: info.rid.as_bytes(),
    };
    if write_response_head(ubuf.data(), resp, &edits, &mut out).is_err() {
        let err = Error::new(ErrorKind::UpstreamInvalid, Side::Upstream)
            .with_cause("response head too large to relay");
        log_upstream(info, up_name, Some(upc), &err);
        return fail(w, cg, conn, info, err, !body_sent)
            .await
            .then_some(Reuse {
                client: true,
                upstream: false,
            });
    }
    ubuf.consume(resp.len);
    if !keep_client {
        conn.linger = !body_sent;
    }

    let mut relay_state = RelayState {
        remaining: match relay {
            Relay::Length(n) => n,
            _ => 0,
        },
        decoder: ChunkedDecoder::new(),
    };
    // The first body bytes ride with the head when they fit.
    if let Err(e) = relay_state.fill_head_block(relay, &mut ubuf, &mut out) {
        // Nothing was sent yet, but the head is already committed to this response.
        log_upstream(info, up_name, Some(upc), &e);
        return fail(w, cg, conn, info, e, !body_sent)
            .await
            .then_some(Reuse {
                client: true,
                upstream: false,
            });
    }
    let deadline = w.now() + cg.gen.http.send_timeout;
    let len = out.len() as u64;
    let (res, _out) = write_all_by(&mut conn.stream, out, deadline, &w.pool).await;
    if res.is_err() {
        return None;
    }
    add(&w.metrics().bytes_out, len);
    w.metrics().response(status);

    match relay_state
        .relay_rest(
            w,
            cg,
            relay,
            &mut upc.read,
            &mut conn.stream,
            ubuf,
            read_timeout,
        )
        .await
    {
        Ok(leftover) => Some(Reuse {
            client: keep_client,
            upstream: upstream_keep_alive
                && body_sent
                && leftover == 0
                && !matches!(relay, Relay::UntilClose),
        }),
        Err(e) => {
            if e.side() == Side::Upstream {
                // The response is cut short: reset the client connection rather than close it,
                // so that even a close-delimited body cannot pass for complete.
                crate::net::sys::reset_on_close(conn.stream.as_raw_fd());
                conn.aborted = true;
                tracing::warn!(
                    request_id = %info.rid.as_str(),
                    upstream = up_name,
                    endpoint = %upc.addr(),
                    error = %e,
                    "upstream failed mid-body; client connection truncated"
                );
            }
            None
        }
    }
}

struct RelayState {
    remaining: u64,
    decoder: ChunkedDecoder,
}

impl RelayState {
    /// Moves the body bytes already read (as many as fit) into the head block.
    fn fill_head_block(
        &mut self,
        relay: Relay,
        ubuf: &mut Block,
        out: &mut Block,
    ) -> Result<(), Error> {
        match relay {
            Relay::None | Relay::Dechunk => Ok(()),
            Relay::Length(_) => {
                let n = (ubuf.len() as u64)
                    .min(self.remaining)
                    .min(out.spare() as u64) as usize;
                let _ = out.put(&ubuf.data()[..n]);
                ubuf.consume(n);
                self.remaining -= n as u64;
                Ok(())
            }
            Relay::Chunked => {
                let avail = ubuf.len().min(out.spare());
                let (n, _) = self.filter(&mut ubuf.data_mut()[..avail], Keep::All)?;
                let _ = out.put(&ubuf.data()[..n]);
                ubuf.consume(n);
                Ok(())
            }
            Relay::UntilClose => {
                out.put_from(ubuf);
                Ok(())
            }
        }
    }

    fn filter(&mut self, data: &mut [u8], keep: Keep) -> Result<(usize, usize), Error> {
        filter_in_place(&mut self.decoder, data, keep)
            .map_err(|e| Error::new(ErrorKind::UpstreamInvalid, Side::Upstream).with_cause(e))
    }

    fn done(&self, relay: Relay) -> bool {
        match relay {
            Relay::None => true,
            Relay::Length(_) => self.remaining == 0,
            Relay::Chunked | Relay::Dechunk => self.decoder.is_done(),
            Relay::UntilClose => false,
        }
    }

    /// Relays the rest of the body; returns how many stray bytes followed it (non-zero: the
    /// upstream connection is not reusable).
    #[allow(clippy::too_many_arguments)]
    async fn relay_rest(
        &mut self,
        w: &Worker,
        cg: &CoreGen,
        relay: Relay,
        up: &mut OwnedReadHalf<TcpStream>,
        client: &mut TcpStream,
        mut ubuf: Block,
        read_timeout: std::time::Duration,
    ) -> Result<usize, Error> {
        let send_timeout = cg.gen.http.send_timeout;
        loop {
            if !ubuf.is_empty() {
                // (bytes to write from the front, bytes to drop after them)
                let (n, skip) = match relay {
                    Relay::None => (0, 0),
                    Relay::Length(_) => {
                        let n = (ubuf.len() as u64).min(self.remaining) as usize;
                        self.remaining -= n as u64;
                        (n, 0)
                    }
                    Relay::Chunked | Relay::Dechunk => {
                        let keep = if relay == Relay::Chunked {
                            Keep::All
                        } else {
                            Keep::DataOnly
                        };
                        let (kept, consumed) = self.filter(ubuf.data_mut(), keep)?;
                        (kept, consumed - kept)
                    }
                    Relay::UntilClose => (ubuf.len(), 0),
                };
                if n > 0 {
                    let deadline = w.now() + send_timeout;
                    let (res, b) = write_front_by(client, ubuf, n, deadline, &w.pool).await;
                    ubuf = b;
                    res.map_err(Error::client_io)?;
                    add(&w.metrics().bytes_out, n as u64);
                }
                ubuf.consume(skip);
            }
            if self.done(relay) {
                return Ok(ubuf.len());
            }
            w.body_block(&mut ubuf);
            if let Relay::Length(_) = relay {
                ubuf.limit_next_read(self.remaining.min(usize::MAX as u64) as usize);
            }
            let deadline = w.now() + read_timeout;
            let (res, b) = read_by(up, ubuf, deadline, &w.pool).await;
            ubuf = b;
            match res {
                Ok(0) if relay == Relay::UntilClose => return Ok(0),
                Ok(0) => {
                    return Err(Error::new(ErrorKind::UpstreamClosed, Side::Upstream)
                        .with_cause("upstream closed before the end of the response body"))
                }
                Ok(_) => {}
                Err(e) if e.kind() == stdio::ErrorKind::TimedOut => {
                    return Err(Error::new(ErrorKind::UpstreamTimeout, Side::Upstream).with_cause(e))
                }
                Err(e) => return Err(Error::upstream_io(e)),
            }
        }
    }
}

/// Answers an error before any response byte went out. `request_unread`: the request body was
/// not (completely) read, so the connection closes. Returns whether the connection may go on.
async fn fail(
    w: &Worker,
    cg: &CoreGen,
    conn: &mut ClientConn,
    info: &ReqInfo,
    err: Error,
    request_unread: bool,
) -> bool {
    let kind = err.kind();
    let close = request_unread || kind.closes_downstream() || !info.keep_alive || w.draining();
    if request_unread && info.framing.has_body() {
        conn.linger = true;
    }
    let sent = respond::error(w, cg, &mut conn.stream, kind, Some(info), &info.rid, close).await;
    sent && !close
}

fn log_upstream(info: &ReqInfo, upstream: &str, upc: Option<&UpConn>, err: &Error) {
    tracing::warn!(
        request_id = %info.rid.as_str(),
        upstream,
        endpoint = ?upc.map(UpConn::addr),
        kind = err.kind().code(),
        error = %err,
        "upstream request failed"
    );
}
