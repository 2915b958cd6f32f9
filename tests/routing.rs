//! Route actions over real sockets: rewrites reaching the origin, criteria choosing the
//! upstream, redirects, maintenance, per-route limits, respond from a file, host groups.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

mod support;

use support::*;

fn two_origins() -> (Origin, Origin) {
    (
        Origin::start(|req| Reply::text(200, &format!("a {}", req.target))),
        Origin::start(|req| Reply::text(200, &format!("b {}", req.target))),
    )
}

#[test]
fn templates_rewrites_and_the_query_reach_the_origin() {
    let (a, _) = two_origins();
    let proxy = Proxy::start(&format!(
        "[[upstreams]]\nname = \"a\"\nendpoints = [\"{}\"]\n\
         [[routes]]\npath_template = \"/users/{{id}}/posts/{{post}}\"\nproxy = \"a\"\n\
         rewrite = {{ pattern = \"^/users/([^/]+)/posts/.*$\", replacement = \"/v2/posts/${{post}}/by/$1\" }}\n\
         [[routes]]\npath_prefix = \"/api/\"\nproxy = \"a\"\nstrip_prefix = \"/api\"\nadd_prefix = \"/internal\"\n",
        a.addr
    ));
    let mut c = proxy.connect();
    assert_eq!(
        c.get("/users/7/posts/99?x=1").text(),
        "a /v2/posts/99/by/7?x=1"
    );
    assert_eq!(
        c.get("/api/items?page=2").text(),
        "a /internal/items?page=2"
    );
}

#[test]
fn a_doubled_slash_after_a_stripped_prefix_does_not_become_a_denied_path() {
    let (a, _) = two_origins();
    let proxy = Proxy::start(&format!(
        "[[upstreams]]\nname = \"a\"\nendpoints = [\"{}\"]\n\
         [[routes]]\npath_prefix = \"/api/admin\"\nrespond = {{ status = 403 }}\n\
         [[routes]]\npath_prefix = \"/api/\"\nproxy = \"a\"\nstrip_prefix = \"/api/\"\n",
        a.addr
    ));
    let mut c = proxy.connect();
    assert_eq!(c.get("/api/admin/users").status, 403);
    assert_eq!(c.get("/api/items").text(), "a /items");
    // `/api/admin` is no prefix of `/api//admin`: the proxy route takes it, and its empty
    // segment goes on with it, not folded into the denied `/admin/users`.
    assert_eq!(c.get("/api//admin/users").text(), "a //admin/users");
    // For backends that merge slashes, repeated ones can be refused.
    let proxy = Proxy::start(&format!(
        "[http]\nrepeated_slashes = \"reject\"\n[[upstreams]]\nname = \"a\"\nendpoints = [\"{}\"]\n\
         [[routes]]\npath_prefix = \"/\"\nproxy = \"a\"\n",
        a.addr
    ));
    assert_eq!(proxy.connect().get("/api//admin/users").status, 400);
    let r = proxy.connect().get("/api/admin/users");
    assert_eq!(r.text(), "a /api/admin/users");
}

#[test]
fn a_path_parameter_does_not_walk_around_a_deny_route() {
    let (a, _) = two_origins();
    let routes = |http: &str| {
        format!(
            "{http}[[upstreams]]\nname = \"a\"\nendpoints = [\"{}\"]\n\
             [[routes]]\npath_prefix = \"/admin/\"\nrespond = {{ status = 403 }}\n\
             [[routes]]\npath_prefix = \"/\"\nproxy = \"a\"\n",
            a.addr
        )
    };
    // A servlet container reads `/admin;x/users` as `/admin/users`: refused.
    let proxy = Proxy::start(&routes(""));
    let mut c = proxy.connect();
    c.send(b"GET /admin;x/users HTTP/1.1\r\nHost: h\r\n\r\n");
    let r = c.read_response(false).unwrap();
    assert_eq!(
        (r.status, r.error_code().as_deref()),
        (400, Some("bad_request"))
    );
    // Kept when the applications use them, as they are.
    let proxy = Proxy::start(&routes("[http]\npath_parameters = \"keep\"\n"));
    let mut c = proxy.connect();
    assert_eq!(c.get("/cart;jsessionid=A1").text(), "a /cart;jsessionid=A1");
}

#[test]
fn criteria_see_forwarding_fields_as_the_upstream_will() {
    let (a, b) = two_origins();
    let routes = |gateway: &str| {
        format!(
            "{gateway}[[upstreams]]\nname = \"a\"\nendpoints = [\"{}\"]\n\
             [[upstreams]]\nname = \"b\"\nendpoints = [\"{}\"]\n\
             [[routes]]\npath_prefix = \"/\"\nheaders = {{ \"x-real-ip\" = \"10.0.0.5\" }}\nproxy = \"b\"\n\
             [[routes]]\npath_prefix = \"/\"\nheaders = {{ \"x-forwarded-proto\" = \"https\" }}\nproxy = \"b\"\n\
             [[routes]]\npath_prefix = \"/\"\nproxy = \"a\"\n",
            a.addr, b.addr
        )
    };
    let get = |proxy: &Proxy, field: &str| {
        let mut c = proxy.connect();
        c.send(format!("GET / HTTP/1.1\r\nHost: h\r\n{field}\r\n\r\n").as_bytes());
        c.read_response(false).unwrap().text()
    };
    // From a client that is no trusted proxy, neither reaches the upstream as sent: neither
    // chooses a route.
    let proxy = Proxy::start(&routes(""));
    assert_eq!(get(&proxy, "X-Real-IP: 10.0.0.5"), "a /");
    assert_eq!(get(&proxy, "X-Forwarded-Proto: https"), "a /");
    // From a trusted proxy, X-Forwarded-Proto stands; X-Real-IP is still ringway's own.
    let proxy = Proxy::start(&routes("[gateway]\ntrusted_proxies = [\"127.0.0.1\"]\n"));
    assert_eq!(get(&proxy, "X-Forwarded-Proto: https"), "b /");
    assert_eq!(get(&proxy, "X-Real-IP: 10.0.0.5"), "a /");
}

#[test]
fn criteria_choose_the_upstream() {
    let (a, b) = two_origins();
    let proxy = Proxy::start(&format!(
        "[[upstreams]]\nname = \"a\"\nendpoints = [\"{}\"]\n[[upstreams]]\nname = \"b\"\nendpoints = [\"{}\"]\n\
         [[routes]]\npath_prefix = \"/\"\nmethods = [\"POST\"]\nproxy = \"b\"\n\
         [[routes]]\npath_prefix = \"/\"\nheaders = {{ \"x-canary\" = \"1\" }}\nproxy = \"b\"\n\
         [[routes]]\npath_prefix = \"/\"\ncookies = {{ \"beta\" = true }}\nproxy = \"b\"\n\
         [[routes]]\npath_prefix = \"/\"\nquery = {{ \"b\" = true }}\nproxy = \"b\"\n\
         [[routes]]\npath_prefix = \"/\"\nproxy = \"a\"\n",
        a.addr, b.addr
    ));
    let mut c = proxy.connect();
    assert_eq!(c.get("/x").text(), "a /x");
    c.send(b"POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n\r\n");
    assert_eq!(c.read_response(false).unwrap().text(), "b /x");
    c.send(b"GET /x HTTP/1.1\r\nHost: h\r\nX-Canary: 1\r\n\r\n");
    assert_eq!(c.read_response(false).unwrap().text(), "b /x");
    c.send(b"GET /x HTTP/1.1\r\nHost: h\r\nX-Canary: 2\r\n\r\n");
    assert_eq!(c.read_response(false).unwrap().text(), "a /x");
    c.send(b"GET /x HTTP/1.1\r\nHost: h\r\nCookie: a=1; beta=\r\n\r\n");
    assert_eq!(c.read_response(false).unwrap().text(), "b /x");
    assert_eq!(c.get("/x?b").text(), "b /x?b");
}

#[test]
fn redirects_answer_with_the_built_location() {
    let proxy = Proxy::start(
        "[[routes]]\npath_prefix = \"/\"\nredirect = { status = 308, scheme = \"https\" }\n\
         [[routes]]\npath = \"/old\"\nredirect = { status = 301, host = \"new.example.com\", path = \"/new\" }\n",
    );
    let mut c = proxy.connect();
    c.send(b"GET /a/b?c=d HTTP/1.1\r\nHost: shop.example.com:8080\r\n\r\n");
    let r = c.read_response(false).unwrap();
    assert_eq!(r.status, 308);
    assert_eq!(
        r.header("location"),
        Some("https://shop.example.com/a/b?c=d")
    );
    assert_eq!(r.header("content-length"), Some("0"));
    c.send(b"GET /old?x=1 HTTP/1.1\r\nHost: shop.example.com\r\n\r\n");
    let r = c.read_response(false).unwrap();
    assert_eq!(
        (r.status, r.header("location")),
        (301, Some("http://new.example.com/new"))
    );
}

#[test]
fn a_route_in_maintenance_answers_503_before_its_limits() {
    let proxy = Proxy::start(
        "[[routes]]\npath_prefix = \"/billing/\"\nrespond = { status = 200 }\n\
         maintenance = { message = \"back at 10:00\", retry_after = \"90s\" }\nlimits = { max_body_bytes = 1 }\n\
         [[routes]]\npath_prefix = \"/\"\nrespond = { status = 200, body = \"up\" }\n",
    );
    let mut c = proxy.connect();
    c.send(b"POST /billing/x HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhello");
    let r = c.read_response(false).unwrap();
    assert_eq!(r.status, 503);
    assert_eq!(r.header("retry-after"), Some("90"));
    assert_eq!(r.error_code().as_deref(), Some("maintenance"));
    assert!(r.text().contains("back at 10:00"), "{}", r.text());
    // The connection goes on; reserved paths and other routes are unaffected.
    assert_eq!(c.get("/healthz").status, 200);
    assert_eq!(c.get("/other").text(), "up");
}

#[test]
fn the_largest_configured_local_answers_fit_the_smallest_head_block() {
    // At the smallest head limit (blocks of 16 KiB): a maintenance message of the most bytes
    // allowed, each one escaped in the envelope; response headers of the most bytes allowed;
    // a redirect path of the most bytes allowed, with the longest request id.
    let message = "\\\\".repeat(2048);
    let value = "v".repeat(8192 - 4 - 3);
    let path = format!("/{}", "p".repeat(4095));
    let proxy = Proxy::start(&format!(
        "[http]\nmax_head_bytes = 1024\n\
         [[routes]]\npath_prefix = \"/down/\"\nrespond = {{ status = 200 }}\n\
         maintenance = {{ message = '{message}' }}\n\
         [[routes]]\npath_prefix = \"/fields/\"\n\
         respond = {{ status = 200, headers = {{ x-v = \"{value}\" }} }}\n\
         [[routes]]\npath_prefix = \"/moved/\"\nredirect = {{ path = \"{path}\" }}\n"
    ));
    let rid = "r".repeat(128);
    let get = |target: &str| {
        let mut c = proxy.connect();
        c.send(
            format!("GET {target} HTTP/1.1\r\nHost: h\r\nx-request-id: {rid}\r\n\r\n").as_bytes(),
        );
        c.read_response(false).expect("an answer")
    };
    let r = get("/down/x");
    assert_eq!(r.status, 503);
    assert!(
        r.text().contains(&"\\\\".repeat(4096)),
        "the message, escaped"
    );
    let r = get("/fields/x");
    assert_eq!(
        (r.status, r.header("x-v").map(str::len)),
        (200, Some(value.len()))
    );
    let r = get("/moved/x");
    let location = r.header("location").map(str::to_string);
    assert_eq!(r.status, 302);
    assert!(
        location == Some(format!("http://h{path}")),
        "{location:.40?}"
    );
    // One byte more of any of them is refused when the config loads.
    for too_long in [
        format!("maintenance = {{ message = '{message}x' }}\nrespond = {{ status = 200 }}"),
        format!("respond = {{ status = 200, headers = {{ x-v = \"{value}x\" }} }}"),
        format!("redirect = {{ path = \"{path}x\" }}"),
    ] {
        let text = format!("[[listeners]]\naddress = \"127.0.0.1:0\"\n[[routes]]\npath_prefix = \"/\"\n{too_long}\n");
        let e = ringway::config::compile(&text, "t.toml").expect_err("too long");
        assert!(e.to_string().contains("at most"), "{e}");
    }
}

#[test]
fn per_route_limits() {
    let origin = Origin::ok("ok");
    let proxy = Proxy::start(&format!(
        "[[upstreams]]\nname = \"o\"\nendpoints = [\"{}\"]\n\
         [[routes]]\npath_prefix = \"/small/\"\nproxy = \"o\"\nlimits = {{ max_body_bytes = 10, max_head_bytes = 200 }}\n\
         [[routes]]\npath_prefix = \"/\"\nproxy = \"o\"\n",
        origin.addr
    ));
    let mut c = proxy.connect();
    c.send(b"POST /small/x HTTP/1.1\r\nHost: h\r\nContent-Length: 11\r\n\r\nhello world");
    assert_eq!(c.read_response(false).unwrap().status, 413);
    let mut c = proxy.connect();
    c.send(b"POST /small/x HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n6\r\nhello \r\n5\r\nworld\r\n0\r\n\r\n");
    assert_eq!(c.read_response(false).unwrap().status, 413);
    let mut c = proxy.connect();
    let big = "v".repeat(300);
    c.send(format!("GET /small/x HTTP/1.1\r\nHost: h\r\nX-Big: {big}\r\n\r\n").as_bytes());
    assert_eq!(c.read_response(false).unwrap().status, 431);
    // Other routes keep the global limits.
    let mut c = proxy.connect();
    c.send(format!("POST /big HTTP/1.1\r\nHost: h\r\nX-Big: {big}\r\nContent-Length: 11\r\n\r\nhello world").as_bytes());
    assert_eq!(c.read_response(false).unwrap().status, 200);
}

#[test]
fn a_route_body_limit_of_zero_lifts_the_global_one_and_local_answers_keep_theirs() {
    let origin = Origin::ok("ok");
    let proxy = Proxy::start(&format!(
        "[http]\nmax_request_body_bytes = 10\n\
         [[upstreams]]\nname = \"o\"\nendpoints = [\"{}\"]\n\
         [[routes]]\npath_prefix = \"/free/\"\nproxy = \"o\"\nlimits = {{ max_body_bytes = 0 }}\n\
         [[routes]]\npath_prefix = \"/form\"\nrespond = {{ status = 200, body = \"thanks\" }}\n\
         limits = {{ max_body_bytes = 4 }}\n\
         [[routes]]\npath_prefix = \"/\"\nproxy = \"o\"\n",
        origin.addr
    ));
    let post = |path: &str, body: &str| {
        let mut c = proxy.connect();
        let len = body.len();
        c.send(
            format!("POST {path} HTTP/1.1\r\nHost: h\r\nContent-Length: {len}\r\n\r\n{body}")
                .as_bytes(),
        );
        c.read_response(false).unwrap()
    };
    assert_eq!(post("/free/x", "hello world").status, 200);
    assert_eq!(post("/other", "hello world").status, 413);
    // A local answer's limit holds too: 413 instead of the answer.
    let r = post("/form", "hello");
    assert_eq!(
        (r.status, r.error_code().as_deref()),
        (413, Some("body_too_large"))
    );
    assert_eq!(post("/form", "hey").text(), "thanks");
    assert_eq!(
        origin.requests().len(),
        1,
        "only the unlimited route's request went on"
    );
}

#[test]
fn respond_from_a_file_and_host_groups() {
    let dir = std::env::temp_dir().join(format!("ringway-routing-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("page.html"), "<h1>from a file</h1>").unwrap();
    let config = dir.join("ringway.toml");
    std::fs::write(
        &config,
        "workers = 1\ncpus = []\n[[listeners]]\naddress = \"127.0.0.1:0\"\n\
         [[routes]]\npath = \"/page\"\nrespond = { status = 200, body_file = \"page.html\", headers = { \"content-type\" = \"text/html\" } }\n\
         [[routes]]\nhost = \"*.example.com\"\npath_prefix = \"/\"\nrespond = { status = 200, body = \"wildcard\" }\n\
         [[routes]]\nhost = \"api.example.com\"\npath_prefix = \"/\"\nrespond = { status = 200, body = \"exact\" }\n",
    )
    .unwrap();
    let gen = ringway::config::load(&config).unwrap();
    let server = ringway::Server::start(gen).unwrap();
    let mut c = Client::connect(server.local_addrs()[0]);
    let r = c.get("/page");
    assert_eq!(
        (r.text().as_str(), r.header("content-type")),
        ("<h1>from a file</h1>", Some("text/html"))
    );
    for (host, want) in [
        ("api.example.com", "exact"),
        ("www.example.com", "wildcard"),
        ("API.EXAMPLE.COM:80", "exact"),
    ] {
        c.send(format!("GET /x HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes());
        assert_eq!(c.read_response(false).unwrap().text(), want, "{host}");
    }
    c.send(b"GET /x HTTP/1.1\r\nHost: other.org\r\n\r\n");
    assert_eq!(c.read_response(false).unwrap().status, 404);
    server.shutdown();
    server.join();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn regex_routes_and_rewrites_see_bytes_above_0x7f() {
    let (a, _) = two_origins();
    let proxy = Proxy::start(&format!(
        "[[upstreams]]\nname = \"a\"\nendpoints = [\"{}\"]\n\
         [[routes]]\npath_regex = \"/admin/.*\"\npriority = 10\nrespond = {{ status = 403, body = \"denied\" }}\n\
         [[routes]]\npath_regex = \"/files/[^/]+\"\npriority = 10\nproxy = \"a\"\n\
         rewrite = {{ pattern = \"^/files/(.+)$\", replacement = \"/blob/$1\" }}\n\
         [[routes]]\npath_prefix = \"/\"\nproxy = \"a\"\n",
        a.addr
    ));
    let mut c = proxy.connect();
    // Raw bytes above 0x7F: UTF-8 passes the parser and is matched byte by byte.
    c.send(b"GET /admin/caf\xc3\xa9 HTTP/1.1\r\nHost: x\r\n\r\n");
    let r = c.read_response(false).unwrap();
    assert_eq!((r.status, r.text().as_str()), (403, "denied"));
    c.send(b"GET /files/caf\xc3\xa9 HTTP/1.1\r\nHost: x\r\n\r\n");
    let r = c.read_response(false).unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.body, b"a /blob/caf\xc3\xa9");
    // A target that is not UTF-8 is refused before routing, so it cannot slip past either.
    let mut c = proxy.connect();
    c.send(b"GET /admin/\xff HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(c.read_response(false).unwrap().status, 400);
}

#[test]
fn rewrites_and_path_tricks_never_reach_another_path_upstream() {
    let (a, _) = two_origins();
    let proxy = Proxy::start(&format!(
        "[[upstreams]]\nname = \"a\"\nendpoints = [\"{}\"]\n\
         [[routes]]\npath_prefix = \"/re\"\nproxy = \"a\"\n\
         rewrite = {{ pattern = \"^/re/?(.*)$\", replacement = \"/v2/$1\" }}\n\
         [[routes]]\npath_prefix = \"/api\"\nproxy = \"a\"\nstrip_prefix = \"/api\"\nadd_prefix = \"/v2\"\n\
         [[routes]]\npath_prefix = \"/\"\nproxy = \"a\"\n",
        a.addr
    ));
    // A prefix is stripped by whole segments: `..` is never left behind as a segment.
    let mut c = proxy.connect();
    assert_eq!(c.get("/api/x").text(), "a /v2/x");
    assert_eq!(c.get("/api../admin").text(), "a /v2/api../admin");
    assert_eq!(c.get("/apiary").text(), "a /v2/apiary");
    // A regex rewrite that would make a dot-segment is refused.
    let r = proxy.connect().get("/re..");
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(proxy.connect().get("/re/ok").text(), "a /v2/ok");
    // Dot-segments with a `;` parameter and backslashes, raw or encoded: refused.
    for path in [
        "/static/..;/admin",
        "/static/.;x/a",
        "/a\\..\\admin",
        "/a/%5c../admin",
    ] {
        let r = proxy.connect().get(path);
        assert_eq!(r.status, 400, "{path}: {}", r.text());
    }
    assert_eq!(a.requests().len(), 4, "nothing refused reached the origin");
}

#[test]
fn options_asterisk_is_never_routed_even_by_a_catch_all_regex() {
    let origin = Origin::ok("routed");
    let proxy = Proxy::start(&format!(
        "[[upstreams]]\nname = \"a\"\nendpoints = [\"{}\"]\n\
         [[routes]]\npath_regex = \".*\"\nproxy = \"a\"\n",
        origin.addr
    ));
    let mut c = proxy.connect();
    c.send(b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n");
    let r = c.read_response(false).expect("an answer");
    assert_eq!(
        (r.status, r.error_code().as_deref()),
        (404, Some("no_route"))
    );
    // The same request in absolute form (RFC 9112 §3.2.4: an empty path there is `*`).
    c.send(b"OPTIONS http://x HTTP/1.1\r\nHost: x\r\n\r\n");
    let r = c.read_response(false).expect("an answer");
    assert_eq!(
        (r.status, r.error_code().as_deref()),
        (404, Some("no_route"))
    );
    assert_eq!(c.get("/any").text(), "routed", "the regex serves paths");
    assert_eq!(origin.requests().len(), 1);
}
