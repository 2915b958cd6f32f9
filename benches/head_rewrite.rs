//! How long does rewriting a parsed head for the next hop take (hop-by-hop stripping, Host,
//! X-Forwarded-For, X-Request-Id), for the request and for the response?

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use ringway::buf::BufPool;
use ringway::http1::encode::ForwardedFor;
use ringway::http1::{
    parse_request, parse_response, write_request_head, write_response_head, HeadLimits, Method,
    RequestEdits, RequestHead, ResponseEdits, ResponseHead,
};

const REQUEST: &[u8] = b"GET /api/v1/users/12345?fields=name HTTP/1.1\r\n\
Host: api.example.com\r\n\
User-Agent: Mozilla/5.0 (X11; Linux x86_64)\r\n\
Accept: application/json\r\n\
Connection: keep-alive\r\n\
X-Forwarded-For: 203.0.113.7\r\n\
Cookie: session=abcdef0123456789\r\n\r\n";

const RESPONSE: &[u8] = b"HTTP/1.1 200 OK\r\nServer: origin\r\nContent-Type: application/json\r\n\
Content-Length: 1234\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5\r\n\r\n";

fn bench(c: &mut Criterion) {
    let pool = BufPool::new(20 * 1024);
    let mut head = RequestHead::default();
    parse_request(REQUEST, &HeadLimits::default(), &mut head).unwrap();
    let mut resp = ResponseHead::default();
    parse_response(RESPONSE, 100, Method::Get, &mut resp).unwrap();
    let mut g = c.benchmark_group("head_rewrite");
    g.bench_function("request", |b| {
        let mut out = pool.take();
        b.iter(|| {
            out.clear();
            let edits = RequestEdits {
                target: [b"", head.path.get(REQUEST), head.query.get(REQUEST)],
                host: b"10.0.0.5:8080",
                forwarded_for: ForwardedFor::Append(b"10.1.2.3"),
                real_ip: b"10.1.2.3",
                forwarded_proto: Some(b"http"),
                keep_forwarded: false,
                request_id: b"0123456789abcdef0123456789abcdef",
                upgrade: false,
            };
            write_request_head(black_box(REQUEST), &head, &edits, &mut out).unwrap();
        })
    });
    g.bench_function("response", |b| {
        let mut out = pool.take();
        b.iter(|| {
            out.clear();
            let edits = ResponseEdits {
                framing: resp.framing,
                connection: None,
                request_id: b"0123456789abcdef0123456789abcdef",
                upgrade: false,
                date: b"Tue, 01 Dec 2026 05:30:00 GMT",
            };
            write_response_head(black_box(RESPONSE), &resp, &edits, &mut out).unwrap();
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
