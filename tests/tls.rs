//! TLS termination over real sockets, with certificates made here (rcgen) and a rustls client:
//! HTTPS requests and X-Forwarded-Proto, certificate choice by SNI (exact, wildcard, default),
//! 421 for a host that is not the SNI name, certificates reloaded when their files change
//! while established connections go on, the handshake timeout, plaintext on a TLS port, and
//! a tunnel over TLS.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

mod support;

use std::io::{BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, ClientConnection, DigitallySignedStruct, SignatureScheme, StreamOwned};
use support::*;

/// A self-signed certificate for `names`: (cert PEM, key PEM, cert DER).
fn cert(names: &[&str]) -> (String, String, Vec<u8>) {
    let ck =
        rcgen::generate_simple_self_signed(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
            .unwrap();
    (
        ck.cert.pem(),
        ck.key_pair.serialize_pem(),
        ck.cert.der().to_vec(),
    )
}

/// Accepts any certificate and remembers the one presented (the tests compare it).
#[derive(Debug)]
struct Capture(Mutex<Option<Vec<u8>>>, Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for Capture {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        *self.0.lock().unwrap() = Some(end_entity.to_vec());
        Ok(ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(m, c, d, &self.1.signature_verification_algorithms)
    }
    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(m, c, d, &self.1.signature_verification_algorithms)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.1.signature_verification_algorithms.supported_schemes()
    }
}

struct TlsClient {
    stream: BufReader<StreamOwned<ClientConnection, TcpStream>>,
    presented: Vec<u8>,
}

impl TlsClient {
    fn connect(addr: SocketAddr, sni: &str) -> TlsClient {
        let (stream, presented) = handshake(addr, sni, b"http/1.1");
        TlsClient {
            stream: BufReader::new(stream),
            presented,
        }
    }

    fn request(&mut self, host: &str, path: &str) -> Response {
        self.stream
            .get_mut()
            .write_all(format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes())
            .unwrap();
        read_response(&mut self.stream, false).expect("a response")
    }

    /// Whether the server closes the connection within `wait` (with or without close_notify).
    fn closed_within(&mut self, wait: Duration) -> bool {
        let tcp = &self.stream.get_ref().sock;
        tcp.set_read_timeout(Some(wait)).unwrap();
        let mut byte = [0u8; 1];
        match self.stream.read(&mut byte) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
        }
    }
}

/// A client config offering `alpn` that takes any certificate and remembers the one
/// presented; it keeps sessions to resume, as clients do.
fn client_config(alpn: &[u8]) -> (Arc<ClientConfig>, Arc<Capture>) {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let capture = Arc::new(Capture(Mutex::new(None), provider.clone()));
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(capture.clone())
        .with_no_client_auth();
    config.alpn_protocols = vec![alpn.to_vec()];
    (Arc::new(config), capture)
}

/// A TLS connection to `addr` for `sni` that agreed on `alpn`, and the certificate presented.
fn handshake(
    addr: SocketAddr,
    sni: &str,
    alpn: &[u8],
) -> (StreamOwned<ClientConnection, TcpStream>, Vec<u8>) {
    let (config, capture) = client_config(alpn);
    let stream = handshake_with(addr, sni, &config);
    assert_eq!(
        stream.conn.alpn_protocol(),
        Some(alpn),
        "the protocol asked for"
    );
    let presented = capture.0.lock().unwrap().clone().unwrap();
    (stream, presented)
}

/// A TLS connection to `addr` for `sni` with `config`, handshake done.
fn handshake_with(
    addr: SocketAddr,
    sni: &str,
    config: &Arc<ClientConfig>,
) -> StreamOwned<ClientConnection, TcpStream> {
    let conn = ClientConnection::new(
        config.clone(),
        ServerName::try_from(sni.to_string()).unwrap(),
    )
    .unwrap();
    let tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut stream = StreamOwned::new(conn, tcp);
    stream.flush().unwrap();
    while stream.conn.is_handshaking() {
        stream
            .conn
            .complete_io(&mut stream.sock)
            .expect("handshake");
    }
    stream
}

/// A TLS listener config: `default` for `default.test`, `a` for `a.test`, `b` for
/// `*.b.test`, in `dir`; routes `/` to `origin`.
fn tls_config(dir: &Dir, origin: SocketAddr, extra_tls: &str) -> String {
    format!(
        "workers = 2\ncpus = []\nlog_level = \"warn\"\n[admin]\naddress = \"127.0.0.1:0\"\n\
         [[listeners]]\naddress = \"127.0.0.1:0\"\n\
         [listeners.tls]\ncert = \"default.pem\"\nkey = \"default.key\"\nhandshake_timeout = \"300ms\"\n{extra_tls}\n\
         [[listeners.tls.sni]]\nnames = [\"a.test\"]\ncert = \"a.pem\"\nkey = \"a.key\"\n\
         [[listeners.tls.sni]]\nnames = [\"*.b.test\"]\ncert = \"b.pem\"\nkey = \"b.key\"\n\
         [[upstreams]]\nname = \"up\"\nendpoints = [\"{origin}\"]\n\
         [[routes]]\npath_prefix = \"/\"\nproxy = \"up\"\n"
    )
    .replace("{dir}", &dir.0.display().to_string())
}

struct Certs {
    default: Vec<u8>,
    a: Vec<u8>,
    b: Vec<u8>,
}

fn write_certs(dir: &Dir) -> Certs {
    let mut ders = Vec::new();
    for (name, names) in [
        ("default", vec!["default.test"]),
        ("a", vec!["a.test"]),
        ("b", vec!["*.b.test"]),
    ] {
        let (pem, key, der) = cert(&names);
        dir.write_file(&format!("{name}.pem"), pem.as_bytes());
        dir.write_file(&format!("{name}.key"), key.as_bytes());
        ders.push(der);
    }
    Certs {
        b: ders.pop().unwrap(),
        a: ders.pop().unwrap(),
        default: ders.pop().unwrap(),
    }
}

fn start(dir: &Dir, text: &str) -> (ringway::Server, SocketAddr) {
    dir.write(text);
    ringway::observe::log::init("warn");
    let gen = ringway::config::load(&dir.config()).expect("config compiles");
    let server = ringway::Server::start(gen).expect("starts");
    let addr = server.local_addrs()[0];
    (server, addr)
}

#[test]
fn https_is_served_with_the_sni_certificate_and_forwarded_proto() {
    let dir = Dir::new("tls-sni");
    let certs = write_certs(&dir);
    let origin =
        Origin::start(|r| Reply::text(200, r.header("x-forwarded-proto").unwrap_or("none")));
    let (server, addr) = start(&dir, &tls_config(&dir, origin.addr, ""));

    let mut c = TlsClient::connect(addr, "a.test");
    assert_eq!(c.presented, certs.a, "exact name");
    let r = c.request("a.test", "/");
    assert_eq!((r.status, r.text().as_str()), (200, "https"));
    let r = c.request("A.TEST:443", "/again");
    assert_eq!(r.status, 200, "host compared without port and case");

    assert_eq!(
        TlsClient::connect(addr, "x.b.test").presented,
        certs.b,
        "wildcard"
    );
    assert_eq!(
        TlsClient::connect(addr, "y.x.b.test").presented,
        certs.default,
        "one label only"
    );
    assert_eq!(
        TlsClient::connect(addr, "other.test").presented,
        certs.default,
        "default"
    );

    let m = metric_tls(addr, "ringway_tls_handshakes_total");
    assert!(m >= 4.0, "{m}");
    server.shutdown();
    server.join();
}

#[test]
fn a_redirect_on_a_tls_listener_keeps_https() {
    let dir = Dir::new("tls-redirect");
    write_certs(&dir);
    let origin = Origin::ok("x");
    let config = tls_config(&dir, origin.addr, "").replace(
        "[[routes]]\n",
        "[[routes]]\npath_prefix = \"/old\"\nredirect = { path = \"/new\" }\n[[routes]]\n",
    );
    let (server, addr) = start(&dir, &config);
    let r = TlsClient::connect(addr, "a.test").request("a.test:8443", "/old");
    assert_eq!(r.status, 302);
    assert_eq!(r.header("location"), Some("https://a.test:8443/new"));
    server.shutdown();
    server.join();
}

/// The value of the series `series` (name and labels) scraped over TLS.
fn metric_tls(addr: SocketAddr, series: &str) -> f64 {
    let mut c = TlsClient::connect(addr, "default.test");
    let text = c.request("default.test", "/metrics").text();
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.parse().ok())
        .unwrap()
}

#[test]
fn idle_tls_connections_hold_no_head_block_and_take_key_updates() {
    const CONNS: usize = 16;
    let dir = Dir::new("tls-idle");
    write_certs(&dir);
    let origin = Origin::start(|r| Reply::text(200, &r.target));
    let (server, addr) = start(&dir, &tls_config(&dir, origin.addr, ""));
    let mut conns: Vec<TlsClient> = (0..CONNS)
        .map(|_| TlsClient::connect(addr, "a.test"))
        .collect();
    for c in &mut conns {
        assert_eq!(c.request("a.test", "/first").text(), "/first");
    }
    // Each head block is at least 16 KiB. (The gauges are set once a second; the blocks
    // the connections gave back show as idle.)
    let held = (CONNS * 16 * 1024) as f64;
    let mut blocks = (0.0, 0.0);
    let settled = wait_until(Duration::from_secs(5), || {
        let series = |state| format!("ringway_buffer_bytes{{pool=\"head\",state=\"{state}\"}}");
        blocks = (
            metric_tls(addr, &series("in_use")),
            metric_tls(addr, &series("idle")),
        );
        blocks.1 >= held
    });
    assert!(settled, "{blocks:?}");
    assert!(
        blocks.0 < held / 4.0,
        "idle connections hold their blocks: {blocks:?}"
    );
    // A key update while idle (rustls asks for one back) is taken in the wait, and the
    // connections serve what comes after.
    for (i, c) in conns.iter_mut().enumerate() {
        if i % 2 == 0 {
            c.stream.get_mut().conn.refresh_traffic_keys().unwrap();
            c.stream.get_mut().flush().unwrap();
            thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(c.request("a.test", "/second").text(), "/second");
        assert_eq!(c.request("a.test", "/third").text(), "/third");
    }
    server.shutdown();
    server.join();
}

#[test]
fn a_host_other_than_the_sni_name_gets_421_unless_relaxed() {
    let dir = Dir::new("tls-421");
    write_certs(&dir);
    let origin = Origin::ok("ok");
    let (server, addr) = start(&dir, &tls_config(&dir, origin.addr, ""));
    let mut c = TlsClient::connect(addr, "a.test");
    let r = c.request("b.test", "/");
    assert_eq!(
        (r.status, r.error_code().as_deref()),
        (421, Some("misdirected_request"))
    );
    assert_eq!(
        c.request("a.test", "/").status,
        200,
        "the connection goes on"
    );
    assert!(origin.requests().len() == 1);
    // A client that offers HTTP/1.0 only is served over it; a request without a host names
    // no other host than the SNI name.
    for request in [
        "GET / HTTP/1.0\r\nHost: a.test\r\n\r\n",
        "GET / HTTP/1.0\r\n\r\n",
    ] {
        let (mut s, _) = handshake(addr, "a.test", b"http/1.0");
        s.write_all(request.as_bytes()).unwrap();
        let r = read_response(&mut BufReader::new(s), false).expect("a response");
        assert_eq!(r.status, 200, "{request:?}");
    }
    server.shutdown();
    server.join();

    let dir = Dir::new("tls-421-off");
    write_certs(&dir);
    let slow = Origin::start(|r| {
        if r.target == "/slow" {
            std::thread::sleep(Duration::from_millis(1500));
        }
        Reply::text(200, "ok")
    });
    let (server, addr) = start(&dir, &tls_config(&dir, slow.addr, "strict_sni = false"));
    let mut busy = TlsClient::connect(addr, "a.test");
    let mut idle = TlsClient::connect(addr, "a.test");
    assert_eq!(busy.request("b.test", "/").status, 200);
    assert_eq!(idle.request("b.test", "/").status, 200);
    busy.stream
        .get_mut()
        .write_all(b"GET /slow HTTP/1.1\r\nHost: b.test\r\n\r\n")
        .unwrap();
    assert!(wait_until(Duration::from_secs(5), || slow.requests().len() == 3));
    // Made strict by a reload: a connection set up without it ends after the exchange in
    // progress, an idle one at once, and the next ones refuse another host.
    dir.write(&tls_config(&dir, slow.addr, ""));
    let g = server.reload_handle().reload_and_wait().unwrap();
    assert!(server.wait_for_generation(g, Duration::from_secs(2)));
    assert!(
        idle.closed_within(Duration::from_secs(1)),
        "an idle connection set up under the old terms stayed"
    );
    let r = read_response(&mut busy.stream, false).expect("a response");
    assert_eq!((r.status, r.header("connection")), (200, Some("close")));
    assert!(busy.closed_within(Duration::from_secs(2)));
    assert_eq!(
        TlsClient::connect(addr, "a.test")
            .request("b.test", "/")
            .status,
        421
    );
    server.shutdown();
    server.join();
}

#[test]
fn new_certificates_apply_to_new_handshakes_and_old_connections_go_on() {
    let dir = Dir::new("tls-reload");
    let certs = write_certs(&dir);
    let origin = Origin::ok("ok");
    let (server, addr) = start(&dir, &tls_config(&dir, origin.addr, ""));
    let mut old = TlsClient::connect(addr, "a.test");
    assert_eq!(old.presented, certs.a);
    assert_eq!(old.request("a.test", "/").status, 200);
    // A client that keeps its sessions: one made now (its ticket comes with the answer).
    let (resuming, _) = client_config(b"http/1.1");
    let mut s = BufReader::new(handshake_with(addr, "a.test", &resuming));
    s.get_mut()
        .write_all(b"GET / HTTP/1.1\r\nHost: a.test\r\n\r\n")
        .unwrap();
    assert_eq!(
        read_response(&mut s, false).expect("a response").status,
        200
    );

    // Replace a.test's certificate and key (a renewal): the file watch reloads.
    let (pem, key, der) = cert(&["a.test"]);
    dir.write_file("a.key", key.as_bytes());
    dir.write_file("a.pem", pem.as_bytes());
    let renewed = wait_until(Duration::from_secs(10), || {
        TlsClient::connect(addr, "a.test").presented == der
    });
    assert!(renewed, "the new certificate is served");
    assert!(server.generation() >= 2);
    // Sessions outlive the reload: the client resumes its own, no full handshake.
    let resumed = handshake_with(addr, "a.test", &resuming);
    assert_eq!(
        resumed.conn.handshake_kind(),
        Some(rustls::HandshakeKind::Resumed)
    );
    // The connection made before the renewal still serves requests.
    assert_eq!(old.request("a.test", "/still").status, 200);
    // A broken file is refused; the running certificates stay.
    dir.write_file("a.pem", b"not a certificate");
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(TlsClient::connect(addr, "a.test").presented, der);
    server.shutdown();
    server.join();
}

#[test]
fn a_silent_client_is_dropped_after_the_handshake_timeout_and_plaintext_is_refused() {
    let dir = Dir::new("tls-timeout");
    write_certs(&dir);
    let origin = Origin::ok("ok");
    let (server, addr) = start(&dir, &tls_config(&dir, origin.addr, ""));
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let started = Instant::now();
    let mut buf = [0u8; 16];
    assert_eq!(s.read(&mut buf).unwrap_or(0), 0);
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_secs(3),
        "{took:?}"
    );

    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: a.test\r\n\r\n")
        .unwrap();
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    assert!(
        !String::from_utf8_lossy(&got).contains("HTTP/1.1"),
        "no HTTP answer on a TLS port"
    );
    assert!(origin.requests().is_empty());
    server.shutdown();
    server.join();
}

#[test]
fn an_upgrade_tunnels_over_tls() {
    let dir = Dir::new("tls-tunnel");
    write_certs(&dir);
    let origin = raw_origin(|mut s| {
        let _ = read_head_raw(&mut s);
        s.write_all(
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x-echo\r\nConnection: Upgrade\r\n\r\n",
        )
        .unwrap();
        let mut buf = [0u8; 4096];
        loop {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => s.write_all(&buf[..n]).unwrap(),
            }
        }
    });
    let (server, addr) = start(&dir, &tls_config(&dir, origin, ""));
    let mut c = TlsClient::connect(addr, "a.test");
    c.stream
        .get_mut()
        .write_all(
            b"GET / HTTP/1.1\r\nHost: a.test\r\nUpgrade: x-echo\r\nConnection: upgrade\r\n\r\n",
        )
        .unwrap();
    let r = read_response(&mut c.stream, true).unwrap();
    assert_eq!(r.status, 101);
    let payload = pattern(200_000, 9);
    let s = c.stream.get_mut();
    s.write_all(&payload).unwrap();
    let mut back = vec![0u8; payload.len()];
    c.stream.read_exact(&mut back).unwrap();
    assert_eq!(fnv(&back), fnv(&payload));
    drop(c); // a tunnel holds the drain until it ends (or shutdown_timeout)
    server.shutdown();
    server.join();
}

#[test]
fn an_h2_client_that_stops_reading_loses_its_connection_after_the_send_timeout() {
    let origin = Origin::start(|_| Reply::Full(200, vec![], pattern(32 << 20, 7)));
    let dir = Dir::new("tls-h2-stall");
    write_certs(&dir);
    let text = tls_config(&dir, origin.addr, "").replace(
        "[admin]",
        "[http]\nsend_timeout = \"2s\"\nidle_timeout = \"60s\"\n[admin]",
    );
    let (_server, addr) = start(&dir, &text);
    // A 32 MiB response, every window open, and a client that reads nothing of it.
    let (mut stalled, _) = handshake(addr, "a.test", b"h2");
    stalled
        .write_all(&raw_h2_get(b"/big", b"a.test", true, true))
        .unwrap();
    stalled.flush().unwrap();
    // Its connection is reset 2 to 4 s after its socket filled (checked once a second), not
    // kept until `idle_timeout`: what it reads then ends in the reset.
    stalled
        .sock
        .set_read_timeout(Some(Duration::from_secs(3)))
        .unwrap();
    let (got, end) = read_to_end_after(&mut stalled, Duration::from_secs(6));
    assert_eq!(
        end,
        Some(std::io::ErrorKind::ConnectionReset),
        "not reset, after {got} bytes"
    );
    assert!(got < 32 << 20, "{got}");
}

#[test]
fn a_response_delimited_by_the_close_ends_with_close_notify() {
    // An HTTP/1.0 client without keep-alive, a chunked upstream response: the body goes
    // de-chunked and ends with the connection, which must end with close_notify (a clean
    // end of stream for rustls, not UnexpectedEof) so it is known complete.
    let dir = Dir::new("tls-close-notify");
    write_certs(&dir);
    let origin = Origin::start(|_| {
        Reply::Full(
            200,
            vec![("transfer-encoding".into(), "chunked".into())],
            b"complete".to_vec(),
        )
    });
    let (server, addr) = start(&dir, &tls_config(&dir, origin.addr, ""));
    let mut c = TlsClient::connect(addr, "a.test");
    c.stream
        .get_mut()
        .write_all(b"GET / HTTP/1.0\r\nHost: a.test\r\n\r\n")
        .unwrap();
    let mut all = Vec::new();
    let end = c.stream.read_to_end(&mut all);
    let text = String::from_utf8_lossy(&all).to_string();
    assert!(end.is_ok(), "{end:?} after {text:?}");
    assert!(text.ends_with("\r\n\r\ncomplete"), "{text}");
    server.shutdown();
    server.join();
}
