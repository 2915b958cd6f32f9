//! Router golden test: tests/golden/routes.toml and the table of requests in
//! tests/golden/cases.toml, each with the route it must resolve to and what that route must
//! make of it (upstream path, redirect Location, local answer).

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use ringway::route::{rewrite_path, Action, HeaderList, RouteRequest};

#[derive(Debug, Deserialize)]
struct Cases {
    case: Vec<Case>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    #[serde(default = "get")]
    method: String,
    #[serde(default = "default_host")]
    host: String,
    path: String,
    #[serde(default)]
    query: String,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    cookies: Option<String>,
    route: Option<String>,
    path_out: Option<String>,
    location: Option<String>,
    status: Option<u16>,
    body: Option<String>,
}

fn get() -> String {
    "GET".into()
}

fn default_host() -> String {
    "example.org".into()
}

#[test]
fn every_golden_case_resolves_as_written() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let gen = ringway::config::load(&dir.join("routes.toml")).expect("golden routes compile");
    let text = std::fs::read_to_string(dir.join("cases.toml")).unwrap();
    let cases: Cases = toml::from_str(&text).expect("cases parse");
    let mut scratch = gen.routes.scratch();
    let mut failures = Vec::new();
    for (n, case) in cases.case.iter().enumerate() {
        let mut headers: Vec<(Vec<u8>, Vec<u8>)> = case
            .headers
            .iter()
            .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
            .collect();
        if let Some(c) = &case.cookies {
            headers.push((b"Cookie".to_vec(), c.as_bytes().to_vec()));
        }
        let headers = HeaderList(headers);
        let req = RouteRequest {
            method: case.method.as_bytes(),
            host: case.host.as_bytes(),
            path: case.path.as_bytes(),
            query: case.query.as_bytes(),
            headers: &headers,
        };
        let label = format!(
            "case {} ({} {}{} host {})",
            n + 1,
            case.method,
            case.path,
            case.query,
            case.host
        );
        let found = gen.routes.lookup(&req, &mut scratch);
        let name = found.map(|m| m.route.name.clone());
        if name != case.route {
            failures.push(format!("{label}: route {name:?}, want {:?}", case.route));
            continue;
        }
        let Some(m) = found else { continue };
        match &m.route.action {
            Action::Proxy(p) => {
                let mut out = Vec::new();
                let mut locs = match &p.rewrite {
                    ringway::route::PathRewrite::Regex(rw) => Some(rw.scratch()),
                    _ => None,
                };
                rewrite_path(
                    &p.rewrite,
                    req.path,
                    &m.params,
                    m.route.param_names(),
                    locs.as_mut(),
                    &mut out,
                );
                out.extend_from_slice(req.query);
                let got = String::from_utf8_lossy(&out).into_owned();
                if let Some(want) = &case.path_out {
                    if &got != want {
                        failures.push(format!("{label}: upstream path {got}, want {want}"));
                    }
                }
                if m.route.maintenance.is_some() && case.status != Some(503) {
                    failures.push(format!("{label}: in maintenance, the case must expect 503"));
                }
            }
            Action::Redirect(rd) => {
                let mut loc = Vec::new();
                rd.write_location(req.host, req.path, req.query, false, |p| {
                    loc.extend_from_slice(p);
                    Ok::<(), ()>(())
                })
                .unwrap();
                let loc = String::from_utf8(loc).unwrap();
                if case.location.as_ref() != Some(&loc) {
                    failures.push(format!("{label}: location {loc}, want {:?}", case.location));
                }
                if case.status != Some(rd.status) {
                    failures.push(format!(
                        "{label}: status {}, want {:?}",
                        rd.status, case.status
                    ));
                }
            }
            Action::Respond(l) => {
                if let Some(s) = case.status {
                    if s != l.status {
                        failures.push(format!("{label}: status {}, want {s}", l.status));
                    }
                }
                if let Some(b) = &case.body {
                    if b.as_bytes() != l.body {
                        failures.push(format!(
                            "{label}: body {:?}",
                            String::from_utf8_lossy(&l.body)
                        ));
                    }
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "golden failures:\n{}",
        failures.join("\n")
    );
    // Every route is exercised by some case, but the one the priority makes unreachable.
    let used: Vec<&str> = cases
        .case
        .iter()
        .filter_map(|c| c.route.as_deref())
        .collect();
    for r in gen.routes.routes() {
        if r.name != "status-exact" && r.name != "shadowed" {
            assert!(
                used.contains(&r.name.as_str()),
                "no case for route {}",
                r.name
            );
        }
    }
}

#[test]
fn check_reports_the_unreachable_route() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let gen = ringway::config::load(&dir.join("routes.toml")).unwrap();
    let warnings = gen.routes.conflicts();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].starts_with("route `shadowed`") && warnings[0].contains("route `static`"),
        "{warnings:?}"
    );
    let text = ringway::config::describe(&gen, None);
    for r in gen.routes.routes() {
        assert!(
            text.contains(&format!("{}. {}", r.index + 1, r.name)),
            "{text}"
        );
    }
    assert!(
        text.contains("template=/users/{id}/files/{*path}"),
        "{text}"
    );
    assert!(
        text.contains("rewrite ^/users/([^/]+)/files/(?P<file>.*)$ => /files/$1/${file}/${path}"),
        "{text}"
    );
    assert!(
        text.contains("redirect 301 to scheme=https host=new.example.com port=8443 path=/new"),
        "{text}"
    );
    assert!(text.contains("IN MAINTENANCE"), "{text}");
    assert!(text.contains("header:x-env=beta header:x-trace"), "{text}");
    assert!(text.contains("warning: route `shadowed`"), "{text}");
}
