//! A development certificate authority (`fencelock dev certs`): one CA, and
//! node, client and admin certificates signed by it, with the identity URI
//! SANs of [`super::identity`]. For development, tests and examples only:
//! production certificates come from the operator's own CA.

use std::path::Path;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

use super::identity::Identity;

/// Mode of every private key file written: owner read/write only.
pub const KEY_FILE_MODE: u32 = 0o600;
/// Validity of the generated certificates, in days. Long enough for a dev
/// setup to outlive a project; these are not production certificates.
pub const DEV_CERT_VALIDITY_DAYS: i64 = 3_650;

/// What to generate.
#[derive(Clone, Debug)]
pub struct DevCertsSpec {
    /// Node certificates `node-1` ..= `node-N`.
    pub nodes: u64,
    /// DNS names and IP addresses every node certificate is valid for
    /// (clients verify the node they dial against them).
    pub hosts: Vec<String>,
    /// Client certificates: (tenant, name) pairs.
    pub tenants: Vec<(String, String)>,
    /// Admin certificates, by name.
    pub admins: Vec<String>,
}

/// One generated certificate and its key, PEM.
#[derive(Clone, Debug)]
pub struct Issued {
    /// The file stem: `ca`, `node-1`, `client-acme-worker`, `admin-ops`.
    pub name: String,
    pub cert_pem: String,
    pub key_pem: String,
}

/// A generated set: the CA first.
#[derive(Clone, Debug)]
pub struct DevCerts {
    pub issued: Vec<Issued>,
}

/// Why generating or writing certificates failed.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("certificate generation failed: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("{path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Invalid(String),
}

fn validity(params: &mut CertificateParams) {
    let now = time_now();
    params.not_before = now - time::Duration::days(1);
    params.not_after = now + time::Duration::days(DEV_CERT_VALIDITY_DAYS);
}

fn time_now() -> time::OffsetDateTime {
    time::OffsetDateTime::now_utc()
}

fn leaf(
    common_name: &str,
    identity: &Identity,
    hosts: &[String],
    server: bool,
) -> Result<CertificateParams, CertError> {
    let mut params = CertificateParams::new(hosts.to_vec())?;
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    let uri = identity
        .uri()
        .try_into()
        .map_err(|_| CertError::Invalid(format!("identity {identity} is not ASCII")))?;
    params.subject_alt_names.push(SanType::URI(uri));
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = if server {
        // Nodes are servers to clients and clients to each other.
        vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ]
    } else {
        vec![ExtendedKeyUsagePurpose::ClientAuth]
    };
    validity(&mut params);
    Ok(params)
}

impl DevCerts {
    /// Generates a CA and every certificate `spec` asks for.
    pub fn generate(spec: &DevCertsSpec) -> Result<DevCerts, CertError> {
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "fencelock development CA");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        validity(&mut ca_params);
        let ca_key = KeyPair::generate()?;
        let ca_cert = ca_params.self_signed(&ca_key)?;
        let mut issued = vec![Issued {
            name: "ca".into(),
            cert_pem: ca_cert.pem(),
            key_pem: ca_key.serialize_pem(),
        }];
        let issuer = Issuer::new(ca_params, ca_key);
        let mut sign = |name: String, params: CertificateParams| -> Result<(), CertError> {
            let key = KeyPair::generate()?;
            let cert = params.signed_by(&key, &issuer)?;
            issued.push(Issued {
                name,
                cert_pem: cert.pem(),
                key_pem: key.serialize_pem(),
            });
            Ok(())
        };
        for id in 1..=spec.nodes {
            let name = format!("node-{id}");
            sign(
                name.clone(),
                leaf(&name, &Identity::Node(id), &spec.hosts, true)?,
            )?;
        }
        for (tenant, client) in &spec.tenants {
            let identity = Identity::Client {
                tenant: tenant.clone(),
                name: client.clone(),
            };
            check(&identity)?;
            let name = format!("client-{tenant}-{client}");
            sign(name.clone(), leaf(&name, &identity, &[], false)?)?;
        }
        for admin in &spec.admins {
            let identity = Identity::Admin {
                name: admin.clone(),
            };
            check(&identity)?;
            let name = format!("admin-{admin}");
            sign(name.clone(), leaf(&name, &identity, &[], false)?)?;
        }
        Ok(DevCerts { issued })
    }

    /// Writes `<name>.crt` and `<name>.key` for every certificate into
    /// `dir` (created 0700 if missing); keys are written 0600.
    pub fn write(&self, dir: &Path) -> Result<(), CertError> {
        let io = |path: &Path| {
            let path = path.display().to_string();
            move |source| CertError::Write { path, source }
        };
        super::create_private_dir(dir).map_err(io(dir))?;
        for item in &self.issued {
            let cert = dir.join(format!("{}.crt", item.name));
            std::fs::write(&cert, &item.cert_pem).map_err(io(&cert))?;
            let key = dir.join(format!("{}.key", item.name));
            write_private(&key, item.key_pem.as_bytes()).map_err(io(&key))?;
        }
        Ok(())
    }
}

/// Refuses identities that would not parse back (bad tenant or name).
fn check(identity: &Identity) -> Result<(), CertError> {
    match Identity::parse_uri(&identity.uri()) {
        Ok(parsed) if parsed == *identity => Ok(()),
        _ => Err(CertError::Invalid(format!(
            "{} is not a valid identity (tenant: [a-z0-9-], name: [A-Za-z0-9._-])",
            identity.uri()
        ))),
    }
}

/// Writes `bytes` to a new file readable by its owner only (the mode is set
/// at creation, so the key is never briefly world-readable).
pub fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(KEY_FILE_MODE);
    }
    let mut file = options.open(path)?;
    #[cfg(unix)]
    {
        // An existing file keeps its old mode through open(): set it.
        use std::os::unix::fs::PermissionsExt;
        file.set_permissions(std::fs::Permissions::from_mode(KEY_FILE_MODE))?;
    }
    file.write_all(bytes)?;
    file.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_written_owner_only() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("certs");
        DevCerts::generate(&DevCertsSpec {
            nodes: 2,
            hosts: vec!["localhost".into()],
            tenants: vec![("acme".into(), "w".into())],
            admins: vec![],
        })
        .unwrap()
        .write(&out)
        .unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            for name in ["ca.key", "node-1.key", "node-2.key", "client-acme-w.key"] {
                let mode = std::fs::metadata(out.join(name))
                    .unwrap()
                    .permissions()
                    .mode();
                assert_eq!(mode & 0o777, KEY_FILE_MODE, "{name}");
            }
            let mode = std::fs::metadata(&out).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o700);
        }
    }

    #[test]
    fn a_key_that_is_not_the_certificates_is_refused_naming_both_files() {
        use crate::TlsMaterial;
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("certs");
        DevCerts::generate(&DevCertsSpec {
            nodes: 2,
            hosts: vec!["localhost".into()],
            tenants: vec![],
            admins: vec![],
        })
        .unwrap()
        .write(&out)
        .unwrap();
        let ca = out.join("ca.crt");
        TlsMaterial::load(&ca, &out.join("node-1.crt"), &out.join("node-1.key"))
            .expect("a matching pair loads");
        let err = TlsMaterial::load(&ca, &out.join("node-1.crt"), &out.join("node-2.key"))
            .expect_err("node 2's key with node 1's certificate")
            .to_string();
        assert!(err.contains("tls.key_file"), "{err}");
        assert!(
            err.contains("node-2.key") && err.contains("node-1.crt"),
            "{err}"
        );
        assert!(err.contains("not the private key"), "{err}");
    }

    #[test]
    fn bad_tenant_names_are_refused() {
        let err = DevCerts::generate(&DevCertsSpec {
            nodes: 0,
            hosts: vec![],
            tenants: vec![("Acme".into(), "w".into())],
            admins: vec![],
        });
        assert!(matches!(err, Err(CertError::Invalid(_))));
    }
}
