//! How long does parsing a typical request head (and a response head) take? The figure bounds
//! what the codec costs per proxied request.

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use ringway::http1::{
    parse_request, parse_response, HeadLimits, Method, RequestHead, ResponseHead,
};

const BROWSER_GET: &[u8] = b"GET /api/v1/users/12345?fields=name,email HTTP/1.1\r\n\
Host: api.example.com\r\n\
User-Agent: Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0 Safari/537.36\r\n\
Accept: application/json, text/plain, */*\r\n\
Accept-Language: en-US,en;q=0.9\r\n\
Accept-Encoding: gzip, deflate, br\r\n\
Connection: keep-alive\r\n\
Cookie: session=abcdef0123456789; theme=dark\r\n\
X-Request-Id: 4bf92f3577b34da6a3ce929d0e0e4736\r\n\r\n";

const WRK_GET: &[u8] = b"GET / HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n\r\n";

const RESPONSE: &[u8] =
    b"HTTP/1.1 200 OK\r\nServer: nginx\r\nDate: Mon, 30 Nov 2026 05:21:17 GMT\r\n\
Content-Type: application/json\r\nContent-Length: 1234\r\nConnection: keep-alive\r\n\
Cache-Control: no-cache\r\n\r\n";

fn bench(c: &mut Criterion) {
    let limits = HeadLimits::default();
    let mut g = c.benchmark_group("h1_parse");
    for (name, input) in [("browser_get", BROWSER_GET), ("wrk_get", WRK_GET)] {
        let mut head = RequestHead::default();
        g.throughput(Throughput::Bytes(input.len() as u64));
        g.bench_function(name, |b| {
            b.iter(|| parse_request(black_box(input), &limits, &mut head).unwrap())
        });
    }
    let mut resp = ResponseHead::default();
    g.throughput(Throughput::Bytes(RESPONSE.len() as u64));
    g.bench_function("response", |b| {
        b.iter(|| parse_response(black_box(RESPONSE), 100, Method::Get, &mut resp).unwrap())
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
