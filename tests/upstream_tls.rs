//! TLS toward upstreams over real sockets, with certificates made here (rcgen): HTTP/1.1 over
//! TLS verified against a CA file with the configured server name, pooled connections reused,
//! a wrong CA refused (502) unless verification is explicitly off, a client certificate for
//! an origin that asks for one, and HTTP/2 over TLS (ALPN h2) with trailers.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

mod support;

use std::io::{BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use support::*;

struct Ca {
    cert: rcgen::Certificate,
    key: rcgen::KeyPair,
}

impl Ca {
    fn new() -> Ca {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let cert = params.self_signed(&key).unwrap();
        Ca { cert, key }
    }

    /// A leaf for `names`, signed by this CA: (cert PEM, key PEM, DER chain, DER key).
    fn leaf(
        &self,
        names: &[&str],
    ) -> (
        String,
        String,
        Vec<CertificateDer<'static>>,
        PrivateKeyDer<'static>,
    ) {
        let key = rcgen::KeyPair::generate().unwrap();
        let params =
            rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .unwrap();
        let cert = params.signed_by(&key, &self.cert, &self.key).unwrap();
        (
            cert.pem(),
            key.serialize_pem(),
            vec![cert.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// An HTTP/1.1-over-TLS origin: answers `sni=<name> n=<request number on this connection>`,
/// and records the client certificate's presence (and a hash of it). `client_ca`: require
/// client certificates.
fn tls_origin(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    client_ca: Option<CertificateDer<'static>>,
) -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap();
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            roots.add(ca).unwrap();
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider(),
            )
            .build()
            .unwrap();
            builder.with_client_cert_verifier(verifier)
        }
    };
    let config = Arc::new(builder.with_single_cert(chain, key).unwrap());
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen2 = seen.clone();
    std::thread::spawn(move || {
        for tcp in listener.incoming().flatten() {
            let (config, seen) = (config.clone(), seen2.clone());
            std::thread::spawn(move || {
                let conn = rustls::ServerConnection::new(config).unwrap();
                let mut tls = rustls::StreamOwned::new(conn, tcp);
                let mut n = 0;
                loop {
                    let req = {
                        let mut r = BufReader::new(&mut tls);
                        read_request(&mut r, 0)
                    };
                    let Some(_req) = req else { return };
                    n += 1;
                    let sni = tls.conn.server_name().unwrap_or("-").to_string();
                    let client = tls.conn.peer_certificates().and_then(|c| c.first());
                    let hash = client.map_or(0, |c| fnv(c.as_ref()));
                    seen.lock()
                        .unwrap()
                        .push(format!("{sni} client_cert={} {hash:x}", client.is_some()));
                    let body = format!("sni={sni} n={n}");
                    let resp = format!(
                        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    if tls.write_all(resp.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, seen)
}

fn proxy(origin: SocketAddr, tls: &str, extra: &str) -> Proxy {
    Proxy::start(&format!(
        "workers = 1\n[[upstreams]]\nname = \"up\"\nendpoints = [\"{origin}\"]\ntls = {tls}\n{extra}\n\
         [[routes]]\npath_prefix = \"/\"\nproxy = \"up\"\n"
    ))
}

/// A TLS origin for `origin.test` under a fresh CA, and ringway proxying to it with that CA
/// file and server name (plus `extra` upstream keys). The directory holds the CA file.
fn verified_tls_proxy(
    name: &str,
    extra: &str,
) -> (Proxy, SocketAddr, Arc<Mutex<Vec<String>>>, Dir) {
    let dir = Dir::new(name);
    let ca = Ca::new();
    dir.write_file("ca.pem", ca.cert.pem().as_bytes());
    let (_, _, chain, key) = ca.leaf(&["origin.test"]);
    let (origin, seen) = tls_origin(chain, key, None);
    let ca_file = dir.0.join("ca.pem").display().to_string();
    let p = proxy(
        origin,
        &format!("{{ ca_file = \"{ca_file}\", server_name = \"origin.test\" }}"),
        extra,
    );
    (p, origin, seen, dir)
}

#[test]
fn http1_over_tls_is_verified_with_the_ca_file_and_pooled() {
    let (p, _origin, seen, _dir) = verified_tls_proxy("up-tls", "");
    let mut c = p.connect();
    for i in 1..=5 {
        let r = c.get("/");
        assert_eq!(
            (r.status, r.text()),
            (200, format!("sni=origin.test n={i}"))
        );
    }
    assert_eq!(seen.lock().unwrap().len(), 5);
    let m = metrics(p.addr);
    assert_eq!(
        m["ringway_upstream_pool_misses_total{upstream=\"up\"}"], 1.0,
        "one TLS connection, reused"
    );
}

#[test]
fn a_wrong_ca_is_refused_unless_verification_is_explicitly_off() {
    let dir = Dir::new("up-tls-wrong");
    let (ca, other) = (Ca::new(), Ca::new());
    dir.write_file("other.pem", other.cert.pem().as_bytes());
    let (_, _, chain, key) = ca.leaf(&["origin.test"]);
    let (origin, _) = tls_origin(chain, key, None);
    let other_file = dir.0.join("other.pem").display().to_string();
    let p = proxy(
        origin,
        &format!("{{ ca_file = \"{other_file}\", server_name = \"origin.test\" }}"),
        "retries = { attempts = 1 }",
    );
    let r = p.connect().get("/");
    assert_eq!(
        (r.status, r.error_code().as_deref()),
        (502, Some("upstream_unreachable"))
    );
    drop(p);
    let p = proxy(
        origin,
        "{ insecure_skip_verify = true, server_name = \"origin.test\" }",
        "",
    );
    assert_eq!(p.connect().get("/").status, 200);
}

/// An origin that asks for a client certificate under a fresh CA, whose files (`ca.pem`,
/// `client.pem`, `client.key`) are written to `dir`: the origin's address and record, the CA
/// (for a renewal) and the upstream's `tls` value.
fn mtls_origin(dir: &Dir) -> (SocketAddr, Arc<Mutex<Vec<String>>>, Ca, String) {
    let ca = Ca::new();
    dir.write_file("ca.pem", ca.cert.pem().as_bytes());
    let (_, _, chain, key) = ca.leaf(&["origin.test"]);
    let (cpem, ckey, _, _) = ca.leaf(&["ringway.client"]);
    dir.write_file("client.pem", cpem.as_bytes());
    dir.write_file("client.key", ckey.as_bytes());
    let (origin, seen) = tls_origin(chain, key, Some(ca.cert.der().clone()));
    let d = dir.0.display().to_string();
    let tls = format!("{{ ca_file = \"{d}/ca.pem\", server_name = \"origin.test\", client_cert = \"{d}/client.pem\", client_key = \"{d}/client.key\" }}");
    (origin, seen, ca, tls)
}

#[test]
fn a_client_certificate_is_presented_when_configured() {
    let dir = Dir::new("up-mtls");
    let (origin, seen, _, tls) = mtls_origin(&dir);
    let d = dir.0.display().to_string();
    let p = proxy(origin, &tls, "");
    assert_eq!(p.connect().get("/").status, 200);
    assert!(seen.lock().unwrap()[0].starts_with("origin.test client_cert=true "));
    drop(p);
    // Without it the origin refuses the handshake.
    let p = proxy(
        origin,
        &format!("{{ ca_file = \"{d}/ca.pem\", server_name = \"origin.test\" }}"),
        "retries = { attempts = 1 }",
    );
    assert_eq!(p.connect().get("/").status, 502);
}

#[test]
fn a_client_certificate_renewed_in_place_is_taken_up_by_itself() {
    let dir = Dir::new("up-mtls-renew");
    let (origin, seen, ca, tls) = mtls_origin(&dir);
    let (server, addr) = start_in(
        &dir,
        &format!(
            "workers = 1\ncpus = []\n[[listeners]]\naddress = \"127.0.0.1:0\"\n\
             [[upstreams]]\nname = \"up\"\nendpoints = [\"{origin}\"]\ntls = {tls}\n\
             [[routes]]\npath_prefix = \"/\"\nproxy = \"up\"\n"
        ),
    );
    assert_eq!(Client::connect(addr).get("/").status, 200);
    let first = seen.lock().unwrap()[0].clone();
    // A renewal written in place (no signal, no config edit): the files are watched, and
    // new upstream connections present the new certificate.
    let (cpem, ckey, _, _) = ca.leaf(&["ringway.client"]);
    dir.write_file("client.key", ckey.as_bytes());
    dir.write_file("client.pem", cpem.as_bytes());
    let renewed = wait_until(Duration::from_secs(10), || {
        Client::connect(addr).get("/").status == 200 && seen.lock().unwrap().last() != Some(&first)
    });
    let last = seen.lock().unwrap().last().cloned();
    assert!(renewed, "still {last:?}");
    server.shutdown();
    server.join();
}

#[test]
fn http2_over_tls_by_alpn() {
    let dir = Dir::new("up-h2-tls");
    let ca = Ca::new();
    dir.write_file("ca.pem", ca.cert.pem().as_bytes());
    let (_, _, chain, key) = ca.leaf(&["origin.test"]);
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let origin = tokio_server(move |tcp| {
        let acceptor = acceptor.clone();
        async move {
            let Ok(tls) = acceptor.accept(tcp).await else {
                return;
            };
            let Ok(mut conn) = h2::server::handshake(tls).await else {
                return;
            };
            while let Some(Ok((req, mut respond))) = conn.accept().await {
                let resp = http::Response::builder().status(200).body(()).unwrap();
                let mut send = respond.send_response(resp, false).unwrap();
                let body = format!("h2 {}", req.uri().path());
                // `:scheme` says what the connection is (RFC 9113 §8.3.1).
                let body = if req.uri().scheme_str() == Some("https") {
                    body
                } else {
                    format!("scheme {:?}", req.uri().scheme_str())
                };
                send.send_data(bytes::Bytes::from(body), false).unwrap();
                let mut t = http::HeaderMap::new();
                t.insert("x-trailer", "1".parse().unwrap());
                let _ = send.send_trailers(t);
            }
        }
    });
    let d = dir.0.display().to_string();
    let p = proxy(
        origin,
        &format!("{{ ca_file = \"{d}/ca.pem\", server_name = \"origin.test\" }}"),
        "protocol = \"h2\"",
    );
    let mut c = p.connect();
    for _ in 0..3 {
        c.send(b"GET /x HTTP/1.1\r\nHost: a\r\n\r\n");
        let r = c.read_response(false).unwrap();
        assert_eq!((r.status, r.text().as_str()), (200, "h2 /x"));
    }
    std::thread::sleep(Duration::from_millis(10));
    let m = metrics(p.addr);
    assert_eq!(
        m["ringway_upstream_pool_misses_total{upstream=\"up\"}"],
        1.0
    );
}

#[test]
fn health_checks_of_a_tls_upstream_speak_tls() {
    let (p, origin, seen, _dir) = verified_tls_proxy(
        "up-tls-health",
        "health_check = { interval = \"50ms\", timeout = \"500ms\", healthy_threshold = 1, unhealthy_threshold = 2 }",
    );
    // Probes reach the origin through TLS (verified, with the SNI name), and it stays healthy.
    assert!(wait_until(Duration::from_secs(5), || seen
        .lock()
        .unwrap()
        .len()
        >= 4));
    assert!(seen
        .lock()
        .unwrap()
        .iter()
        .all(|s| s.starts_with("origin.test ")));
    let key = format!(
        "ringway_endpoint_healthy{{upstream=\"up\",endpoint=\"{origin}\",authority=\"{origin}\"}}"
    );
    assert_eq!(metrics(p.addr).get(&key).copied(), Some(1.0));
}

#[test]
fn a_tls_endpoint_that_never_answers_the_handshake_fails_its_health_probes() {
    // Accepts, reads the ClientHello and says nothing: the probe's handshake must time out
    // (it held the health thread, and every other endpoint's checks, forever).
    let silent = raw_origin(|mut s| {
        let mut b = [0u8; 1024];
        while matches!(s.read(&mut b), Ok(n) if n > 0) {}
    });
    let p = proxy(
        silent,
        "{ insecure_skip_verify = true }",
        "health_check = { interval = \"50ms\", timeout = \"300ms\", healthy_threshold = 1, unhealthy_threshold = 2 }",
    );
    let key = format!(
        "ringway_endpoint_healthy{{upstream=\"up\",endpoint=\"{silent}\",authority=\"{silent}\"}}"
    );
    assert!(
        wait_until(Duration::from_secs(5), || metrics(p.addr)
            .get(&key)
            .copied()
            == Some(0.0)),
        "{:?}",
        metrics(p.addr).get(&key)
    );
}

#[test]
fn a_tls_upstream_closing_without_close_notify_ends_a_close_delimited_body() {
    let (_, _, chain, key) = Ca::new().leaf(&["origin.test"]);
    let config = Arc::new(
        rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .unwrap(),
    );
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let origin = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for tcp in listener.incoming().flatten() {
            let config = config.clone();
            std::thread::spawn(move || {
                let conn = rustls::ServerConnection::new(config).unwrap();
                let mut tls = rustls::StreamOwned::new(conn, tcp);
                if read_request(&mut BufReader::new(&mut tls), 0).is_none() {
                    return;
                }
                let _ =
                    tls.write_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nall of it");
                let _ = tls.flush();
                // The body ends with the TCP connection, and no close_notify (as many
                // servers do).
                let _ = tls.sock.shutdown(std::net::Shutdown::Both);
            });
        }
    });
    let p = proxy(origin, "{ insecure_skip_verify = true }", "");
    let r = p.connect().get("/");
    assert_eq!((r.status, r.text()), (200, "all of it".to_string()));
}
