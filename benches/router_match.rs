//! How long does choosing a route take as the table grows? Tables of 10, 1,000 and 10,000
//! routes mixing exact paths (40%), templates (30%), prefixes (25%) and regexes (5%), looked up
//! with paths that hit each kind and paths that hit nothing.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use ringway::config::compile;
use ringway::route::{HeaderList, RouteRequest};

/// A config with `n` routes in the mix above, and lookups that hit each kind.
fn table(n: usize) -> (ringway::config::Generation, Vec<String>) {
    let mut text = String::from("[[listeners]]\naddress = \"127.0.0.1:0\"\n");
    let mut paths = Vec::new();
    for i in 0..n {
        let bucket = i % 20;
        let route = if bucket < 8 {
            paths.push(format!("/exact/{i}/item"));
            format!("path = \"/exact/{i}/item\"")
        } else if bucket < 14 {
            paths.push(format!("/tpl{i}/abc123/detail"));
            format!("path_template = \"/tpl{i}/{{id}}/detail\"")
        } else if bucket < 19 {
            paths.push(format!("/pre{i}/some/deeper/path"));
            format!("path_prefix = \"/pre{i}/\"")
        } else {
            paths.push(format!("/re{i}/12345"));
            format!("path_regex = \"/re{i}/[0-9]+\"\npriority = 1")
        };
        text.push_str(&format!(
            "[[routes]]\n{route}\nrespond = {{ status = 200 }}\n"
        ));
    }
    paths.push("/no/such/route/anywhere".to_string());
    (compile(&text, "bench.toml").expect("bench config"), paths)
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("route_lookup");
    for n in [10usize, 1_000, 10_000] {
        let (gen, paths) = table(n);
        let mut scratch = gen.routes.scratch();
        let headers = HeaderList::default();
        // A fixed sample across kinds, so every size looks up the same mix.
        let sample: Vec<&String> = paths.iter().step_by((paths.len() / 20).max(1)).collect();
        g.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
            let mut i = 0;
            b.iter(|| {
                let path = sample[i % sample.len()];
                i += 1;
                let req = RouteRequest {
                    method: b"GET",
                    host: b"example.com",
                    path: path.as_bytes(),
                    query: b"",
                    headers: &headers,
                };
                black_box(gen.routes.lookup(black_box(&req), &mut scratch).is_some())
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
