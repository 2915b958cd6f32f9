//! TLS toward upstreams: a rustls client config per upstream, built when a generation is
//! compiled (trust anchors: a CA file, else the system store; optional client certificate;
//! verification can only be turned off with an explicit key).

use std::path::PathBuf;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

use super::provider;

/// An upstream's `tls` table, paths resolved.
#[derive(Debug, Clone, Default)]
pub struct UpstreamTlsSpec {
    /// PEM file of trust anchors (else the system store).
    pub ca_file: Option<PathBuf>,
    /// Name sent as SNI and verified (else each endpoint's host).
    pub server_name: Option<String>,
    /// Client certificate chain and key (PEM), for upstreams that ask for one.
    pub client_cert: Option<(PathBuf, PathBuf)>,
    /// Accept any certificate (signatures still checked): tests and lab setups only.
    pub insecure_skip_verify: bool,
}

/// An upstream's compiled TLS settings.
#[derive(Debug)]
pub struct UpstreamTls {
    /// The client config (ALPN set for the upstream's protocol).
    pub config: Arc<ClientConfig>,
    /// See [`UpstreamTlsSpec::server_name`].
    pub server_name: Option<String>,
    /// A digest of everything a connection made with these settings depends on: the spec,
    /// the ALPN list and the bytes of the trust anchors and client certificate and key as
    /// read. Equal across reloads when nothing changed (connections stay pooled), different
    /// when a file was rotated in place.
    pub fingerprint: u64,
    /// The CA file and client certificate and key (watched for changes, as a listener's
    /// certificates), each stamped just before it was read.
    pub files: Vec<(std::path::PathBuf, Option<crate::config::FileStamp>)>,
}

impl PartialEq for UpstreamTls {
    fn eq(&self, other: &Self) -> bool {
        self.fingerprint == other.fingerprint
    }
}

impl UpstreamTls {
    /// The name to present and verify for an endpoint whose authority is `authority`.
    pub fn name_for(&self, authority: &str) -> Result<ServerName<'static>, String> {
        let host = match &self.server_name {
            Some(n) => n.as_str(),
            None => {
                let (h, _) = crate::http1::head::split_host_port(authority.as_bytes());
                std::str::from_utf8(h).unwrap_or("")
            }
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        ServerName::try_from(host.to_string()).map_err(|e| format!("`{host}`: {e}"))
    }
}

/// Builds the client config; `alpn` lists the protocols offered.
pub fn build(spec: &UpstreamTlsSpec, alpn: &[&[u8]]) -> Result<UpstreamTls, String> {
    use std::hash::{Hash, Hasher};
    if let Some(name) = &spec.server_name {
        ServerName::try_from(name.as_str())
            .map_err(|_| format!("tls.server_name `{name}` is not a DNS name or IP address"))?;
    }
    let mut paths: Vec<&PathBuf> = spec.ca_file.iter().collect();
    if let Some((cert, key)) = &spec.client_cert {
        paths.extend([cert, key]);
    }
    let files = paths
        .into_iter()
        .map(|f| (f.clone(), crate::config::stamp(f)))
        .collect();
    // Deterministic within the process, which is all the comparison needs.
    let mut digest = std::hash::DefaultHasher::new();
    (spec.insecure_skip_verify, &spec.server_name, alpn).hash(&mut digest);
    let provider = provider();
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS versions: {e}"))?;
    let builder = if spec.insecure_skip_verify {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AcceptAny(provider)))
    } else {
        let mut roots = RootCertStore::empty();
        match &spec.ca_file {
            Some(path) => {
                for cert in CertificateDer::pem_file_iter(path)
                    .map_err(|e| format!("cannot read ca_file {}: {e}", path.display()))?
                {
                    let cert =
                        cert.map_err(|e| format!("invalid ca_file {}: {e}", path.display()))?;
                    cert.as_ref().hash(&mut digest);
                    roots
                        .add(cert)
                        .map_err(|e| format!("ca_file {}: {e}", path.display()))?;
                }
            }
            None => {
                let found = rustls_native_certs::load_native_certs();
                for cert in found.certs {
                    cert.as_ref().hash(&mut digest);
                    let _ = roots.add(cert);
                }
            }
        }
        if roots.is_empty() {
            return Err("no trust anchors: set tls.ca_file (the system store is empty)".into());
        }
        builder.with_root_certificates(roots)
    };
    let mut config = match &spec.client_cert {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
                .map_err(|e| format!("cannot read client_cert {}: {e}", cert.display()))?
                .collect::<Result<_, _>>()
                .map_err(|e| format!("invalid client_cert {}: {e}", cert.display()))?;
            let key = PrivateKeyDer::from_pem_file(key)
                .map_err(|e| format!("cannot read client_key {}: {e}", key.display()))?;
            for c in &chain {
                c.as_ref().hash(&mut digest);
            }
            key.secret_der().hash(&mut digest);
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| format!("client certificate: {e}"))?
        }
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(UpstreamTls {
        config: Arc::new(config),
        server_name: spec.server_name.clone(),
        fingerprint: digest.finish(),
        files,
    })
}

/// Accepts any server certificate; handshake signatures are still verified.
#[derive(Debug)]
struct AcceptAny(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AcceptAny {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
