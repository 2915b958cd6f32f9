//! gRPC through ringway between a real gRPC client and server (tonic, with prost messages): the
//! client speaks h2c to ringway, ringway speaks h2c to the server. Covered: unary calls,
//! server streaming, bidirectional streaming with messages interleaved both ways, a status with
//! metadata sent as trailers after streamed messages, and a `grpc-timeout` deadline that ringway
//! enforces with DEADLINE_EXCEEDED.
//!
//! The server runs tonic's request handling (`tonic::server::Grpc`) on a bare hyper HTTP/2
//! connection rather than `tonic::transport::Server`, whose own `grpc-timeout` layer would race
//! ringway's deadline: here only ringway enforces it.
#![allow(
    clippy::disallowed_methods,
    clippy::disallowed_types,
    clippy::result_large_err // tonic::Status is what the gRPC API returns
)]

mod support;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use support::*;
use tokio_stream::{Stream, StreamExt};
use tonic::codec::{ProstCodec, Streaming};
use tonic::server::{Grpc, ServerStreamingService, StreamingService, UnaryService};
use tonic::{Code, Request, Response, Status};

#[derive(Clone, PartialEq, prost::Message)]
struct Msg {
    #[prost(string, tag = "1")]
    text: String,
    #[prost(uint32, tag = "2")]
    n: u32,
}

fn msg(text: &str, n: u32) -> Msg {
    Msg {
        text: text.to_string(),
        n,
    }
}

type BoxFuture<T> = Pin<Box<dyn std::future::Future<Output = Result<T, Status>> + Send>>;
type MsgStream = Pin<Box<dyn Stream<Item = Result<Msg, Status>> + Send>>;

/// What the server saw of the last request's metadata, and when response streams ended.
#[derive(Clone, Default)]
struct Seen(
    Arc<Mutex<Vec<(String, String)>>>,
    Arc<Mutex<Vec<(Instant, bool)>>>,
);

/// Records, when a response stream is dropped, whether it had sent everything.
struct EndOfStream(Seen, Arc<std::sync::atomic::AtomicBool>);

impl Drop for EndOfStream {
    fn drop(&mut self) {
        let finished = self.1.load(std::sync::atomic::Ordering::SeqCst);
        (self.0).1.lock().unwrap().push((Instant::now(), finished));
    }
}

impl Seen {
    fn record<T>(&self, req: &Request<T>) {
        let mut seen = self.0.lock().unwrap();
        seen.clear();
        for key in ["grpc-timeout", "te", "x-forwarded-for"] {
            if let Some(v) = req.metadata().get(key) {
                seen.push((key.to_string(), v.to_str().unwrap_or("?").to_string()));
            }
        }
    }

    fn get(&self, key: &str) -> Option<String> {
        let seen = self.0.lock().unwrap();
        seen.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone())
    }
}

/// `/test.Echo/Unary`: echoes the text upper-cased; `n` > 0 makes it sleep `n` ms first. The
/// end of each call (answered, or dropped by a reset) is recorded like a stream's.
struct Unary(Seen);

impl UnaryService<Msg> for Unary {
    type Response = Msg;
    type Future = BoxFuture<Response<Msg>>;

    fn call(&mut self, req: Request<Msg>) -> Self::Future {
        self.0.record(&req);
        let seen = self.0.clone();
        Box::pin(async move {
            let m = req.into_inner();
            let answered = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let _end = EndOfStream(seen, answered.clone());
            if m.n > 0 {
                tokio::time::sleep(Duration::from_millis(u64::from(m.n))).await;
            }
            answered.store(true, std::sync::atomic::Ordering::SeqCst);
            Ok(Response::new(msg(&m.text.to_uppercase(), m.n)))
        })
    }
}

/// `/test.Echo/Count`: `n` messages 20 ms apart (400 ms when the text is "slow"); when the
/// text is "fail", then a RESOURCE_EXHAUSTED status with metadata `x-detail` in the trailers.
struct Count(Seen);

impl ServerStreamingService<Msg> for Count {
    type Response = Msg;
    type ResponseStream = MsgStream;
    type Future = BoxFuture<Response<MsgStream>>;

    fn call(&mut self, req: Request<Msg>) -> Self::Future {
        self.0.record(&req);
        let m = req.into_inner();
        let fail = m.text == "fail";
        let items = (0..m.n).map(|i| Ok(msg("item", i)));
        let gap = if m.text == "slow" { 400 } else { 20 };
        let n = m.n;
        let finished = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let end = EndOfStream(self.0.clone(), finished.clone());
        let stream = tokio_stream::iter(items)
            .throttle(Duration::from_millis(gap))
            .map(move |item| {
                let _ = &end;
                if item.as_ref().is_ok_and(|m| m.n + 1 == n) {
                    finished.store(true, std::sync::atomic::Ordering::SeqCst);
                }
                item
            });
        let stream: MsgStream = if fail {
            let mut status = Status::resource_exhausted("quota used up");
            status
                .metadata_mut()
                .insert("x-detail", "per-minute".parse().unwrap());
            Box::pin(stream.chain(tokio_stream::once(Err(status))))
        } else {
            Box::pin(stream)
        };
        Box::pin(async move { Ok(Response::new(stream)) })
    }
}

/// `/test.Echo/Chat`: answers every incoming message at once (bidirectional streaming).
struct Chat;

impl StreamingService<Msg> for Chat {
    type Response = Msg;
    type ResponseStream = MsgStream;
    type Future = BoxFuture<Response<MsgStream>>;

    fn call(&mut self, req: Request<Streaming<Msg>>) -> Self::Future {
        let input = req.into_inner();
        let output = input.map(|m| m.map(|m| msg(&format!("re: {}", m.text), m.n + 1)));
        Box::pin(async move { Ok(Response::new(Box::pin(output) as MsgStream)) })
    }
}

async fn route(
    seen: Seen,
    req: http::Request<hyper::body::Incoming>,
) -> Result<http::Response<tonic::body::BoxBody>, Infallible> {
    let codec = ProstCodec::<Msg, Msg>::default();
    let resp = match req.uri().path() {
        "/test.Echo/Unary" => Grpc::new(codec).unary(Unary(seen), req).await,
        "/test.Echo/Count" => Grpc::new(codec).server_streaming(Count(seen), req).await,
        "/test.Echo/Chat" => Grpc::new(codec).streaming(Chat, req).await,
        _ => Status::unimplemented("no such method").into_http(),
    };
    Ok(resp)
}

/// A tonic gRPC server on h2c, on its own thread.
fn grpc_server(seen: Seen) -> SocketAddr {
    tokio_server(move |tcp| {
        let seen = seen.clone();
        async move {
            let svc = hyper::service::service_fn(move |req| route(seen.clone(), req));
            let _ = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                .serve_connection(hyper_util::rt::TokioIo::new(tcp), svc)
                .await;
        }
    })
}

fn rt() -> tokio::runtime::Runtime {
    tokio_rt()
}

fn proxy_to(server: SocketAddr) -> Proxy {
    proxy_with(server, "")
}

/// `extra`: tables placed after the top-level keys (e.g. `[http]` settings).
fn proxy_with(server: SocketAddr, extra: &str) -> Proxy {
    Proxy::start(&format!(
        "workers = 1\n{extra}\n[[upstreams]]\nname = \"grpc\"\nprotocol = \"h2c\"\nendpoints = [\"{server}\"]\n\
         [[routes]]\npath_prefix = \"/test.Echo/\"\nproxy = \"grpc\"\n"
    ))
}

async fn client(addr: SocketAddr) -> tonic::client::Grpc<tonic::transport::Channel> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .expect("ringway accepts h2c");
    tonic::client::Grpc::new(channel)
}

fn path(p: &'static str) -> http::uri::PathAndQuery {
    http::uri::PathAndQuery::from_static(p)
}

#[test]
fn unary_and_server_streaming_calls() {
    let seen = Seen::default();
    let proxy = proxy_to(grpc_server(seen.clone()));
    rt().block_on(async {
        let mut c = client(proxy.addr).await;
        for i in 0..20 {
            c.ready().await.unwrap();
            let resp: Response<Msg> = c
                .unary(
                    Request::new(msg(&format!("hello {i}"), 0)),
                    path("/test.Echo/Unary"),
                    ProstCodec::default(),
                )
                .await
                .expect("unary call");
            assert_eq!(resp.into_inner(), msg(&format!("HELLO {i}"), 0));
        }
        assert_eq!(seen.get("te").as_deref(), Some("trailers"));
        assert_eq!(seen.get("x-forwarded-for").as_deref(), Some("127.0.0.1"));

        c.ready().await.unwrap();
        let started = Instant::now();
        let resp: Response<Streaming<Msg>> = c
            .server_streaming(
                Request::new(msg("count", 5)),
                path("/test.Echo/Count"),
                ProstCodec::default(),
            )
            .await
            .expect("streaming call");
        let mut stream = resp.into_inner();
        let mut got = Vec::new();
        let mut first_at = None;
        while let Some(m) = stream.message().await.expect("stream item") {
            first_at.get_or_insert_with(|| started.elapsed());
            got.push(m.n);
        }
        assert_eq!(got, vec![0, 1, 2, 3, 4]);
        // Streamed, not collected: the first item arrives well before the last was produced.
        let first_at = first_at.unwrap();
        assert!(
            first_at + Duration::from_millis(60) < started.elapsed(),
            "first item at {first_at:?}, all at {:?}",
            started.elapsed()
        );
        let trailers = stream.trailers().await.expect("trailers");
        assert!(trailers.is_some(), "grpc-status came as a trailer");
    });
}

#[test]
fn a_status_after_streamed_messages_arrives_as_trailers_with_its_metadata() {
    let proxy = proxy_to(grpc_server(Seen::default()));
    rt().block_on(async {
        let mut c = client(proxy.addr).await;
        c.ready().await.unwrap();
        let resp: Response<Streaming<Msg>> = c
            .server_streaming(
                Request::new(msg("fail", 2)),
                path("/test.Echo/Count"),
                ProstCodec::default(),
            )
            .await
            .expect("headers arrive");
        let mut stream = resp.into_inner();
        assert_eq!(stream.message().await.unwrap().unwrap().n, 0);
        assert_eq!(stream.message().await.unwrap().unwrap().n, 1);
        let status = stream
            .message()
            .await
            .expect_err("the stream ends in a status");
        assert_eq!(status.code(), Code::ResourceExhausted);
        assert_eq!(status.message(), "quota used up");
        assert_eq!(
            status
                .metadata()
                .get("x-detail")
                .map(|v| v.to_str().unwrap()),
            Some("per-minute")
        );
        // An unknown method: the server's trailers-only UNIMPLEMENTED, relayed as is.
        c.ready().await.unwrap();
        let err = c
            .unary::<Msg, Msg, _>(
                Request::new(msg("x", 0)),
                path("/test.Echo/Nope"),
                ProstCodec::default(),
            )
            .await
            .expect_err("no such method");
        assert_eq!(err.code(), Code::Unimplemented);
    });
}

#[test]
fn bidirectional_streaming_interleaves_both_ways() {
    let proxy = proxy_to(grpc_server(Seen::default()));
    rt().block_on(async {
        let mut c = client(proxy.addr).await;
        c.ready().await.unwrap();
        // Each message goes up only after the answer to the previous one came down: this
        // completes only if ringway relays both directions of the stream at once.
        let (tx, rx) = tokio::sync::mpsc::channel::<Msg>(1);
        let up = tokio_stream::wrappers::ReceiverStream::new(rx);
        tx.send(msg("one", 0)).await.unwrap();
        let resp: Response<Streaming<Msg>> = tokio::time::timeout(
            Duration::from_secs(5),
            c.streaming(
                Request::new(up),
                path("/test.Echo/Chat"),
                ProstCodec::default(),
            ),
        )
        .await
        .expect("headers in time")
        .expect("bidi call");
        let mut down = resp.into_inner();
        let mut tx = Some(tx);
        for (i, word) in ["one", "two", "three"].iter().enumerate() {
            let answer = tokio::time::timeout(Duration::from_secs(5), down.message())
                .await
                .expect("answer in time")
                .expect("answer")
                .expect("a message");
            assert_eq!(answer, msg(&format!("re: {word}"), i as u32 + 1));
            let next = ["two", "three"].get(i);
            match next {
                Some(w) => tx
                    .as_ref()
                    .unwrap()
                    .send(msg(w, i as u32 + 1))
                    .await
                    .unwrap(),
                None => drop(tx.take()),
            }
        }
        let end = tokio::time::timeout(Duration::from_secs(5), down.message())
            .await
            .expect("end in time")
            .expect("clean end");
        assert!(end.is_none());
    });
}

#[test]
fn grpc_timeout_is_the_deadline_ringway_enforces() {
    let seen = Seen::default();
    let proxy = proxy_to(grpc_server(seen.clone()));
    rt().block_on(async {
        let mut c = client(proxy.addr).await;
        // tonic's client times its own deadline only until the response head; a stream that
        // started in time and then stalls is ended by ringway's deadline, with
        // DEADLINE_EXCEEDED as the trailers' status.
        c.ready().await.unwrap();
        let mut req = Request::new(msg("slow", 10));
        req.set_timeout(Duration::from_millis(300));
        let started = Instant::now();
        let resp: Response<Streaming<Msg>> = c
            .server_streaming(req, path("/test.Echo/Count"), ProstCodec::default())
            .await
            .expect("the head comes in time");
        let mut stream = resp.into_inner();
        let mut got = 0;
        let status = loop {
            match stream.message().await {
                Ok(Some(_)) => got += 1,
                Ok(None) => panic!("the stream ended without a status"),
                Err(status) => break status,
            }
        };
        let elapsed = started.elapsed();
        assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
        assert_eq!(got, 1, "one message came before the deadline");
        assert!(
            elapsed >= Duration::from_millis(250) && elapsed < Duration::from_millis(1500),
            "{elapsed:?}"
        );
        let forwarded = seen
            .get("grpc-timeout")
            .expect("the server saw the deadline");
        assert!(
            forwarded.ends_with('m') || forwarded.ends_with('u'),
            "{forwarded}"
        );
        // Within the deadline the same kind of call succeeds.
        c.ready().await.unwrap();
        let mut req = Request::new(msg("quick", 10));
        req.set_timeout(Duration::from_secs(5));
        let resp: Response<Msg> = c
            .unary(req, path("/test.Echo/Unary"), ProstCodec::default())
            .await
            .expect("in time");
        assert_eq!(resp.into_inner().text, "QUICK");
    });
    // The server gone: UNAVAILABLE from ringway itself.
    let proxy = proxy_to(closed_port());
    rt().block_on(async {
        let mut c = client(proxy.addr).await;
        c.ready().await.unwrap();
        let err = c
            .unary::<Msg, Msg, _>(
                Request::new(msg("x", 0)),
                path("/test.Echo/Unary"),
                ProstCodec::default(),
            )
            .await
            .expect_err("no server");
        assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    });
}

#[test]
fn a_bidirectional_call_may_be_quiet_upward_longer_than_the_body_timeout() {
    // Once the response streams, the request body's read timeout no longer applies: the
    // client thinks for 1.5 s (body_timeout is 1 s) and the call goes on.
    let proxy = proxy_with(
        grpc_server(Seen::default()),
        "[http]\nbody_timeout = \"1s\"\n",
    );
    rt().block_on(async {
        let mut c = client(proxy.addr).await;
        c.ready().await.unwrap();
        let (tx, rx) = tokio::sync::mpsc::channel::<Msg>(1);
        tx.send(msg("one", 0)).await.unwrap();
        let resp: Response<Streaming<Msg>> = c
            .streaming(
                Request::new(tokio_stream::wrappers::ReceiverStream::new(rx)),
                path("/test.Echo/Chat"),
                ProstCodec::default(),
            )
            .await
            .expect("bidi call");
        let mut down = resp.into_inner();
        assert_eq!(down.message().await.unwrap().unwrap().text, "re: one");
        tokio::time::sleep(Duration::from_millis(1500)).await;
        tx.send(msg("two", 1)).await.unwrap();
        let answer = tokio::time::timeout(Duration::from_secs(5), down.message())
            .await
            .expect("answer in time")
            .expect("the stream was not reset");
        assert_eq!(answer.unwrap().text, "re: two");
        drop(tx);
        assert!(down.message().await.unwrap().is_none());
    });
}

#[test]
fn a_cancelled_stream_is_cancelled_upstream_at_once() {
    // The client reads one message of a slow stream (one per 400 ms, ten in all) and goes
    // away: ringway resets the upstream stream then, not when the stream would have ended.
    let seen = Seen::default();
    let proxy = proxy_to(grpc_server(seen.clone()));
    rt().block_on(async {
        let mut c = client(proxy.addr).await;
        c.ready().await.unwrap();
        let resp: Response<Streaming<Msg>> = c
            .server_streaming(
                Request::new(msg("slow", 10)),
                path("/test.Echo/Count"),
                ProstCodec::default(),
            )
            .await
            .expect("the stream starts");
        let mut stream = resp.into_inner();
        assert_eq!(stream.message().await.unwrap().unwrap().n, 0);
        let cancelled = Instant::now();
        drop(stream);
        let deadline = cancelled + Duration::from_secs(3);
        while seen.1.lock().unwrap().is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let ends = seen.1.lock().unwrap().clone();
        let (at, finished) = *ends.first().expect("the server's stream ended");
        assert!(!finished, "the stream was cut short, not finished");
        assert!(
            at.duration_since(cancelled) < Duration::from_millis(1500),
            "the upstream stream ended {:?} after the cancel",
            at.duration_since(cancelled)
        );
    });
}

#[test]
fn a_unary_call_cancelled_before_its_answer_is_cancelled_upstream_at_once() {
    // The server takes 3 s to answer; the client gives up after 300 ms. ringway resets the
    // upstream stream then (the server's handler is dropped), not when the answer comes.
    let seen = Seen::default();
    let proxy = proxy_to(grpc_server(seen.clone()));
    rt().block_on(async {
        let mut c = client(proxy.addr).await;
        c.ready().await.unwrap();
        let call = c.unary::<Msg, Msg, _>(
            Request::new(msg("slow", 3000)),
            path("/test.Echo/Unary"),
            ProstCodec::default(),
        );
        let gave_up = tokio::time::timeout(Duration::from_millis(300), call).await;
        assert!(gave_up.is_err(), "no answer within 300 ms");
        let cancelled = Instant::now();
        let deadline = cancelled + Duration::from_secs(2);
        while seen.1.lock().unwrap().is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let ends = seen.1.lock().unwrap().clone();
        let (at, answered) = *ends.first().expect("the server's handler ended");
        assert!(!answered, "the call was cut short, not answered");
        assert!(
            at.duration_since(cancelled) < Duration::from_secs(1),
            "the upstream call ended {:?} after the cancel",
            at.duration_since(cancelled)
        );
    });
}
