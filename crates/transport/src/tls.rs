//! TLS material of a node (or a CLI client) and the channels it builds.
//!
//! Every connection is mutual TLS against one CA: a node presents its node
//! certificate as a server and as a client of other nodes, and accepts
//! only clients whose certificate the CA signed. Hostnames are verified by
//! rustls against the certificate's DNS and IP SANs.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity, ServerTlsConfig};

/// Longest PEM file read (a CA bundle of a few certificates is a few KB).
pub const MAX_PEM_FILE_BYTES: u64 = 1 << 20;
/// How long a TLS handshake may take before the connection is dropped: a
/// client that opens a socket and says nothing must not hold it forever.
pub const TLS_HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Why TLS material could not be loaded.
#[derive(Clone, Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {key} {}: {reason}", path.display())]
    Read {
        key: &'static str,
        path: PathBuf,
        reason: String,
    },
    #[error("{key} {}: {reason}", path.display())]
    Invalid {
        key: &'static str,
        path: PathBuf,
        reason: String,
    },
    #[error("TLS setup failed: {0}")]
    Setup(String),
}

/// The CA, certificate and key, PEM, checked to parse.
#[derive(Clone)]
pub struct TlsMaterial {
    ca_pem: Vec<u8>,
    cert_pem: Vec<u8>,
    key_pem: Vec<u8>,
}

impl std::fmt::Debug for TlsMaterial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the key.
        f.debug_struct("TlsMaterial").finish_non_exhaustive()
    }
}

fn read_pem(key: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    let read_error = |e: std::io::Error| TlsError::Read {
        key,
        path: path.to_owned(),
        reason: e.to_string(),
    };
    let len = std::fs::metadata(path).map_err(read_error)?.len();
    if len > MAX_PEM_FILE_BYTES {
        return Err(TlsError::Invalid {
            key,
            path: path.to_owned(),
            reason: format!("is {len} bytes, more than {MAX_PEM_FILE_BYTES}"),
        });
    }
    std::fs::read(path).map_err(read_error)
}

/// The certificates in a PEM text.
pub fn parse_certificates(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("not PEM certificates: {e}"))?;
    if certs.is_empty() {
        return Err("holds no certificate".into());
    }
    Ok(certs)
}

fn parse_key(pem: &[u8]) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_slice(pem).map_err(|e| format!("no PEM private key: {e}"))
}

/// Whether `key` is the private key of the first certificate in `certs`: a
/// swapped or stale key file otherwise fails only at the first handshake,
/// with words that do not name the file.
fn check_key_pair(
    certs: Vec<CertificateDer<'static>>,
    key: &PrivateKeyDer<'_>,
) -> Result<(), String> {
    use rustls::sign::CertifiedKey;
    let signing = rustls::crypto::ring::sign::any_supported_type(key)
        .map_err(|e| format!("unsupported private key: {e}"))?;
    match CertifiedKey::new(certs, signing).keys_match() {
        Ok(()) => Ok(()),
        // A key type whose public half rustls cannot derive: the handshake
        // will tell.
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => Ok(()),
        Err(e) => Err(format!("is not the private key of the certificate: {e}")),
    }
}

impl TlsMaterial {
    /// Reads and checks the three files. Errors name the config key and
    /// the path.
    pub fn load(
        ca_file: &Path,
        cert_file: &Path,
        key_file: &Path,
    ) -> Result<TlsMaterial, TlsError> {
        let ca_pem = read_pem("tls.ca_file", ca_file)?;
        let cert_pem = read_pem("tls.cert_file", cert_file)?;
        let key_pem = read_pem("tls.key_file", key_file)?;
        let invalid = |key, path: &Path| {
            let path = path.to_owned();
            move |reason| TlsError::Invalid { key, path, reason }
        };
        parse_certificates(&ca_pem).map_err(invalid("tls.ca_file", ca_file))?;
        let certs = parse_certificates(&cert_pem).map_err(invalid("tls.cert_file", cert_file))?;
        let key = parse_key(&key_pem).map_err(invalid("tls.key_file", key_file))?;
        check_key_pair(certs, &key)
            .map_err(|reason| format!("{reason} in tls.cert_file ({})", cert_file.display()))
            .map_err(invalid("tls.key_file", key_file))?;
        Ok(TlsMaterial {
            ca_pem,
            cert_pem,
            key_pem,
        })
    }

    /// From PEM text already in memory (tests, the client library).
    pub fn from_pem(
        ca_pem: &[u8],
        cert_pem: &[u8],
        key_pem: &[u8],
    ) -> Result<TlsMaterial, TlsError> {
        let invalid = |what: &str, reason: String| TlsError::Setup(format!("{what}: {reason}"));
        parse_certificates(ca_pem).map_err(|r| invalid("CA", r))?;
        let certs = parse_certificates(cert_pem).map_err(|r| invalid("certificate", r))?;
        let key = parse_key(key_pem).map_err(|r| invalid("key", r))?;
        check_key_pair(certs, &key).map_err(|r| invalid("key", r))?;
        Ok(TlsMaterial {
            ca_pem: ca_pem.to_vec(),
            cert_pem: cert_pem.to_vec(),
            key_pem: key_pem.to_vec(),
        })
    }

    pub fn ca_pem(&self) -> &[u8] {
        &self.ca_pem
    }
    pub fn cert_pem(&self) -> &[u8] {
        &self.cert_pem
    }
    pub fn key_pem(&self) -> &[u8] {
        &self.key_pem
    }

    /// The gRPC server side: our certificate, client certificates required
    /// and verified against the CA.
    pub fn server_config(&self) -> ServerTlsConfig {
        ServerTlsConfig::new()
            .identity(Identity::from_pem(&self.cert_pem, &self.key_pem))
            .client_ca_root(Certificate::from_pem(&self.ca_pem))
            .timeout(TLS_HANDSHAKE_TIMEOUT)
    }

    /// The gRPC client side: trust only the CA, present our certificate.
    pub fn client_config(&self) -> ClientTlsConfig {
        ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&self.ca_pem))
            .identity(Identity::from_pem(&self.cert_pem, &self.key_pem))
    }

    /// A rustls server config with the same rules, for the admin HTTP port.
    pub fn rustls_server_config(&self) -> Result<Arc<rustls::ServerConfig>, TlsError> {
        let setup = |e: &dyn std::fmt::Display| TlsError::Setup(e.to_string());
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        for ca in parse_certificates(&self.ca_pem).map_err(|e| setup(&e))? {
            roots.add(ca).map_err(|e| setup(&e))?;
        }
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            provider.clone(),
        )
        .build()
        .map_err(|e| setup(&e))?;
        let certs = parse_certificates(&self.cert_pem).map_err(|e| setup(&e))?;
        let key = parse_key(&self.key_pem).map_err(|e| setup(&e))?;
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| setup(&e))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(certs, key)
            .map_err(|e| setup(&e))?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

/// The TLS a node uses to dial other nodes: none (insecure mode) or its
/// material. Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct PeerTls(Option<Arc<TlsMaterial>>);

impl PeerTls {
    pub fn insecure() -> PeerTls {
        PeerTls(None)
    }

    pub fn new(material: Option<Arc<TlsMaterial>>) -> PeerTls {
        PeerTls(material)
    }

    pub fn material(&self) -> Option<&Arc<TlsMaterial>> {
        self.0.as_ref()
    }

    pub fn is_secure(&self) -> bool {
        self.0.is_some()
    }

    /// `http://` or `https://`.
    pub fn scheme(&self) -> &'static str {
        if self.0.is_some() {
            "https"
        } else {
            "http"
        }
    }

    /// An endpoint for `addr` (`host:port`, or a URL whose scheme is
    /// replaced by the right one).
    pub fn endpoint(&self, addr: &str) -> Result<Endpoint, tonic::transport::Error> {
        let host_port = addr
            .strip_prefix("http://")
            .or_else(|| addr.strip_prefix("https://"))
            .unwrap_or(addr);
        let endpoint = Endpoint::from_shared(format!("{}://{host_port}", self.scheme()))?;
        match &self.0 {
            Some(material) => endpoint.tls_config(material.client_config()),
            None => Ok(endpoint),
        }
    }
}
