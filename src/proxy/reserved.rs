//! Reserved paths, answered on every listener before routing: `/healthz` (the process is
//! serving), `/readyz` (503 once draining) and `/metrics` (Prometheus text, summed over workers
//! at scrape time).

use super::{answer_local, respond, Answer, ClientConn, ReqInfo};
use crate::error::ErrorKind;
use crate::observe::metrics::render_all;
use crate::worker::{CoreGen, Worker};

/// A reserved endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reserved {
    Healthz,
    Readyz,
    Metrics,
}

/// The reserved endpoint for `path` (exact match, query ignored), if any.
pub(super) fn match_path(path: &[u8]) -> Option<Reserved> {
    match path {
        b"/healthz" => Some(Reserved::Healthz),
        b"/readyz" => Some(Reserved::Readyz),
        b"/metrics" => Some(Reserved::Metrics),
        _ => None,
    }
}

const JSON: &[u8] = b"application/json";

pub(super) async fn answer(
    w: &Worker,
    cg: &CoreGen,
    conn: &mut ClientConn,
    which: Reserved,
    info: &ReqInfo,
    head_len: usize,
) -> bool {
    match which {
        Reserved::Healthz => {
            let resp = respond::Local {
                status: 200,
                content_type: Some(JSON),
                headers: &[],
                body: b"{\"status\":\"ok\"}",
            };
            answer_local(w, cg, conn, info, head_len, Answer::Local(resp)).await
        }
        Reserved::Readyz if w.shared.is_draining() => {
            answer_local(
                w,
                cg,
                conn,
                info,
                head_len,
                Answer::Error(ErrorKind::ShuttingDown),
            )
            .await
        }
        Reserved::Readyz => {
            let resp = respond::Local {
                status: 200,
                content_type: Some(JSON),
                headers: &[],
                body: b"{\"status\":\"ready\"}",
            };
            answer_local(w, cg, conn, info, head_len, Answer::Local(resp)).await
        }
        Reserved::Metrics => {
            let text = render_all(&w.shared, w.now_ms());
            let resp = respond::Local {
                status: 200,
                content_type: Some(b"text/plain; version=0.0.4; charset=utf-8"),
                headers: &[],
                body: text.as_bytes(),
            };
            answer_local(w, cg, conn, info, head_len, Answer::Local(resp)).await
        }
    }
}
