//! TLS termination: certificates per SNI name, built into a rustls server config per listener
//! when a generation is compiled (so a reload, or a change of a certificate file, brings new
//! certificates to the next handshake while established connections keep theirs).
//!
//! Ownership: a [`TlsListener`] belongs to a generation's listener config (`Arc`, shared by all
//! workers; rustls configs are `Send + Sync`). The per-connection state is in [`stream`].

pub mod client;
pub mod stream;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

pub use stream::{TlsReadHalf, TlsStream, TlsWriteHalf};

/// ALPN protocols offered to clients, most preferred first.
pub const ALPN_HTTP11: &[u8] = b"http/1.1";

/// ALPN protocol id of HTTP/1.0: offered too, so that a client that offers only it (as some
/// curl versions do with `--http1.0`) is not refused the handshake (RFC 7301 §3.2's alert).
pub const ALPN_HTTP10: &[u8] = b"http/1.0";

/// A listener's TLS settings, compiled.
#[derive(Debug)]
pub struct TlsListener {
    /// The rustls configuration (certificates, versions, ALPN).
    pub config: Arc<rustls::ServerConfig>,
    /// Answer 421 when a request's host is not the SNI name of its connection.
    pub strict_sni: bool,
    /// Time a client has to complete the handshake.
    pub handshake_timeout: Duration,
    /// Certificate and key files (watched for changes), each stamped just before it was
    /// read.
    pub files: Vec<(PathBuf, Option<crate::config::FileStamp>)>,
}

impl TlsListener {
    /// The same settings, with `other`'s session cache: sessions made before a reload (a
    /// route edit, a renewed certificate) are resumed after it, not all handshaken again.
    pub fn keeping_sessions_of(&self, other: &TlsListener) -> TlsListener {
        let mut config = (*self.config).clone();
        config.session_storage = other.config.session_storage.clone();
        TlsListener {
            config: Arc::new(config),
            strict_sni: self.strict_sni,
            handshake_timeout: self.handshake_timeout,
            files: self.files.clone(),
        }
    }
}

/// Two listeners' TLS settings are the same when they are the same compiled object.
impl PartialEq for TlsListener {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self, other)
    }
}

impl Eq for TlsListener {}

/// One certificate as configured.
#[derive(Debug, Clone)]
pub struct CertSpec {
    /// PEM chain file (end-entity first).
    pub cert: PathBuf,
    /// PEM private key file.
    pub key: PathBuf,
    /// Names it serves (`example.com`, `*.example.com`); empty for the default certificate.
    pub names: Vec<String>,
}

/// What a listener's `tls` table says, with paths resolved.
#[derive(Debug, Clone)]
pub struct TlsSpec {
    /// The certificate for handshakes without SNI or with a name no other one serves.
    pub default: CertSpec,
    /// Certificates chosen by SNI name.
    pub sni: Vec<CertSpec>,
    /// Lowest protocol version: TLS 1.2 or 1.3.
    pub min_version_13: bool,
    /// See [`TlsListener::strict_sni`].
    pub strict_sni: bool,
    /// See [`TlsListener::handshake_timeout`].
    pub handshake_timeout: Duration,
    /// Offer HTTP/2 by ALPN.
    pub h2: bool,
}

/// The crypto provider every TLS config uses.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn load_cert(spec: &CertSpec, provider: &CryptoProvider) -> Result<Arc<CertifiedKey>, String> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&spec.cert)
        .map_err(|e| format!("cannot read certificate file {}: {e}", spec.cert.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("invalid certificate file {}: {e}", spec.cert.display()))?;
    if chain.is_empty() {
        return Err(format!("no certificate in {}", spec.cert.display()));
    }
    let key = PrivateKeyDer::from_pem_file(&spec.key)
        .map_err(|e| format!("cannot read private key file {}: {e}", spec.key.display()))?;
    let ck = CertifiedKey::from_der(chain, key, provider).map_err(|e| {
        format!(
            "certificate {} with key {}: {e}",
            spec.cert.display(),
            spec.key.display()
        )
    })?;
    Ok(Arc::new(ck))
}

/// Builds a listener's TLS config; the error names the file at fault.
pub fn build(spec: &TlsSpec) -> Result<TlsListener, String> {
    let provider = provider();
    let mut files = Vec::with_capacity(2 + 2 * spec.sni.len());
    let mut stamp_pair = |c: &CertSpec| {
        for f in [&c.cert, &c.key] {
            files.push((f.clone(), crate::config::stamp(f)));
        }
    };
    stamp_pair(&spec.default);
    for c in &spec.sni {
        stamp_pair(c);
    }
    let default = load_cert(&spec.default, &provider)?;
    let mut resolver = SniResolver {
        exact: HashMap::new(),
        wildcard: HashMap::new(),
        default,
    };
    for c in &spec.sni {
        let ck = load_cert(c, &provider)?;
        for name in &c.names {
            let name = name.to_ascii_lowercase();
            match name.strip_prefix("*.") {
                Some(suffix) => resolver.wildcard.insert(suffix.to_string(), ck.clone()),
                None => resolver.exact.insert(name, ck.clone()),
            };
        }
    }
    let versions: &[&rustls::SupportedProtocolVersion] = if spec.min_version_13 {
        &[&rustls::version::TLS13]
    } else {
        &[&rustls::version::TLS13, &rustls::version::TLS12]
    };
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(versions)
        .map_err(|e| format!("TLS versions: {e}"))?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(resolver));
    config.alpn_protocols = if spec.h2 {
        vec![b"h2".to_vec(), ALPN_HTTP11.to_vec(), ALPN_HTTP10.to_vec()]
    } else {
        vec![ALPN_HTTP11.to_vec(), ALPN_HTTP10.to_vec()]
    };
    Ok(TlsListener {
        config: Arc::new(config),
        strict_sni: spec.strict_sni,
        handshake_timeout: spec.handshake_timeout,
        files,
    })
}

/// Picks the certificate for a handshake: the exact SNI name, else the nearest wildcard
/// (`*.example.com` serves `a.example.com`, not `a.b.example.com`), else the default.
#[derive(Debug)]
struct SniResolver {
    exact: HashMap<String, Arc<CertifiedKey>>,
    wildcard: HashMap<String, Arc<CertifiedKey>>,
    default: Arc<CertifiedKey>,
}

impl SniResolver {
    fn pick(&self, name: Option<&str>) -> Arc<CertifiedKey> {
        let Some(name) = name else {
            return self.default.clone();
        };
        let name = name.to_ascii_lowercase();
        if let Some(ck) = self.exact.get(&name) {
            return ck.clone();
        }
        if let Some((_, parent)) = name.split_once('.') {
            if let Some(ck) = self.wildcard.get(parent) {
                return ck.clone();
            }
        }
        self.default.clone()
    }
}

impl ResolvesServerCert for SniResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.pick(hello.server_name()))
    }
}

/// Resolves `path` against the config file's directory.
pub fn resolve_path(base: &Path, path: &str) -> PathBuf {
    let p = Path::new(path);
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        base.join(p)
    }
}
