//! Caller identities, read from the URI SAN of a TLS client certificate.
//!
//! The convention (docs/security.md):
//!
//! | identity | URI SAN |
//! | --- | --- |
//! | a client of tenant `acme` named `worker-1` | `spiffe://fencelock/tenant/acme/worker-1` |
//! | an operator named `alice` | `spiffe://fencelock/admin/alice` |
//! | node 3 | `spiffe://fencelock/node/3` |
//!
//! A certificate must carry exactly one `spiffe://fencelock/` URI; other
//! SANs (the DNS names and IPs nodes are dialed by) are ignored here.
//! Without TLS every caller is [`Identity::Anonymous`].

use fencelock_statemachine::limits::{MAX_OWNER_LEN, MAX_TENANT_LEN};
use fencelock_statemachine::Owner;

/// The prefix of every identity URI.
pub const IDENTITY_PREFIX: &str = "spiffe://fencelock/";
/// Longest name part of a client or admin identity, in bytes.
pub const MAX_IDENTITY_NAME_LEN: usize = 128;

/// Who is calling.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Identity {
    /// A server without TLS (dev mode): every caller, allowed everything.
    Anonymous,
    /// Another node of the cluster: Raft, node control, forwarding.
    Node(u64),
    /// An operator: the admin API and the admin HTTP views.
    Admin { name: String },
    /// A lock client of one tenant.
    Client { tenant: String, name: String },
}

/// Why a certificate or URI names no identity.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    #[error("the certificate cannot be parsed")]
    BadCertificate,
    #[error("the certificate has no `spiffe://fencelock/` URI SAN")]
    Missing,
    #[error("the certificate has more than one `spiffe://fencelock/` URI SAN")]
    Ambiguous,
    #[error("`{0}` is not a fencelock identity (spiffe://fencelock/tenant/<tenant>/<name>, spiffe://fencelock/admin/<name> or spiffe://fencelock/node/<id>)")]
    Malformed(String),
}

fn is_tenant(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_TENANT_LEN
        && !s.starts_with('-')
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_IDENTITY_NAME_LEN
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

impl Identity {
    /// Parses an identity URI (the form [`Identity::uri`] writes).
    pub fn parse_uri(uri: &str) -> Result<Identity, IdentityError> {
        let malformed = || IdentityError::Malformed(uri.chars().take(MAX_OWNER_LEN).collect());
        let rest = uri.strip_prefix(IDENTITY_PREFIX).ok_or_else(malformed)?;
        let parts: Vec<&str> = rest.split('/').collect();
        match parts.as_slice() {
            ["tenant", tenant, name] if is_tenant(tenant) && is_name(name) => {
                Ok(Identity::Client {
                    tenant: (*tenant).to_owned(),
                    name: (*name).to_owned(),
                })
            }
            ["admin", name] if is_name(name) => Ok(Identity::Admin {
                name: (*name).to_owned(),
            }),
            ["node", id] => match id.parse::<u64>() {
                // No leading zeros or signs: one spelling per node.
                Ok(n) if n >= 1 && n.to_string() == *id => Ok(Identity::Node(n)),
                _ => Err(malformed()),
            },
            _ => Err(malformed()),
        }
    }

    /// The identity of a DER certificate: its one fencelock URI SAN.
    pub fn from_certificate(der: &[u8]) -> Result<Identity, IdentityError> {
        use x509_parser::extensions::GeneralName;
        use x509_parser::prelude::FromDer;
        let (_, cert) = x509_parser::certificate::X509Certificate::from_der(der)
            .map_err(|_| IdentityError::BadCertificate)?;
        let san = cert
            .subject_alternative_name()
            .map_err(|_| IdentityError::BadCertificate)?;
        let mut found = None;
        for name in san.iter().flat_map(|s| s.value.general_names.iter()) {
            if let GeneralName::URI(uri) = name {
                if uri.starts_with(IDENTITY_PREFIX) {
                    if found.is_some() {
                        return Err(IdentityError::Ambiguous);
                    }
                    found = Some(Identity::parse_uri(uri)?);
                }
            }
        }
        found.ok_or(IdentityError::Missing)
    }

    /// The identity as a URI (empty for [`Identity::Anonymous`]).
    pub fn uri(&self) -> String {
        match self {
            Identity::Anonymous => String::new(),
            Identity::Node(id) => format!("{IDENTITY_PREFIX}node/{id}"),
            Identity::Admin { name } => format!("{IDENTITY_PREFIX}admin/{name}"),
            Identity::Client { tenant, name } => {
                format!("{IDENTITY_PREFIX}tenant/{tenant}/{name}")
            }
        }
    }

    /// The owner recorded with the leases this identity acquires.
    pub fn owner(&self) -> Owner {
        // Parsed identities are short printable ASCII, so this cannot fail;
        // anonymous is the fallback that can never match a real identity.
        Owner::new(self.uri()).unwrap_or_else(|_| Owner::anonymous())
    }

    /// Whether this identity may take, renew, release or wait for locks of
    /// `tenant`.
    pub fn may_lock(&self, tenant: &str) -> bool {
        match self {
            Identity::Anonymous => true,
            Identity::Client { tenant: own, .. } => own == tenant,
            Identity::Node(_) | Identity::Admin { .. } => false,
        }
    }

    /// Whether this identity may read the lock state of `tenant`'s
    /// resources: its own tenant's, and an operator any tenant's.
    pub fn may_read(&self, tenant: &str) -> bool {
        self.may_lock(tenant) || matches!(self, Identity::Admin { .. })
    }

    /// Whether this identity may use the admin API and admin HTTP views.
    pub fn is_admin(&self) -> bool {
        matches!(self, Identity::Anonymous | Identity::Admin { .. })
    }

    /// Whether this identity is a node (or anything goes, without TLS).
    pub fn is_node(&self) -> bool {
        matches!(self, Identity::Anonymous | Identity::Node(_))
    }

    /// The tenant whose request rate this identity's calls count against.
    pub fn tenant(&self) -> Option<&str> {
        match self {
            Identity::Client { tenant, .. } => Some(tenant),
            _ => None,
        }
    }
}

impl std::fmt::Display for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Identity::Anonymous => f.write_str("anonymous"),
            other => f.write_str(&other.uri()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_admin_and_node_uris_parse() {
        assert_eq!(
            Identity::parse_uri("spiffe://fencelock/tenant/acme/worker-1"),
            Ok(Identity::Client {
                tenant: "acme".into(),
                name: "worker-1".into()
            })
        );
        assert_eq!(
            Identity::parse_uri("spiffe://fencelock/admin/alice"),
            Ok(Identity::Admin {
                name: "alice".into()
            })
        );
        assert_eq!(
            Identity::parse_uri("spiffe://fencelock/node/3"),
            Ok(Identity::Node(3))
        );
    }

    #[test]
    fn uris_round_trip() {
        for uri in [
            "spiffe://fencelock/tenant/acme/worker-1",
            "spiffe://fencelock/admin/alice",
            "spiffe://fencelock/node/12",
        ] {
            assert_eq!(Identity::parse_uri(uri).unwrap().uri(), uri);
        }
    }

    #[test]
    fn malformed_uris_are_refused() {
        for bad in [
            "",
            "spiffe://other/tenant/acme/w",
            "spiffe://fencelock/tenant/acme",
            "spiffe://fencelock/tenant/Acme/w",
            "spiffe://fencelock/tenant/-acme/w",
            "spiffe://fencelock/tenant/acme/w/x",
            "spiffe://fencelock/tenant/acme/w x",
            "spiffe://fencelock/admin/",
            "spiffe://fencelock/node/0",
            "spiffe://fencelock/node/03",
            "spiffe://fencelock/node/+3",
            "spiffe://fencelock/node/x",
            "spiffe://fencelock/root",
        ] {
            assert!(Identity::parse_uri(bad).is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn clients_lock_only_their_own_tenant() {
        let c = Identity::parse_uri("spiffe://fencelock/tenant/acme/w").unwrap();
        assert!(c.may_lock("acme"));
        assert!(!c.may_lock("beta"));
        assert!(!c.may_read("beta"));
        assert!(!c.is_admin());
        assert!(!c.is_node());
        let admin = Identity::parse_uri("spiffe://fencelock/admin/a").unwrap();
        assert!(!admin.may_lock("acme"));
        assert!(admin.may_read("acme"));
        assert!(admin.is_admin());
        let node = Identity::Node(1);
        assert!(!node.may_lock("acme"));
        assert!(!node.is_admin());
        assert!(Identity::Anonymous.may_lock("acme"));
        assert!(Identity::Anonymous.is_admin() && Identity::Anonymous.is_node());
    }

    #[test]
    fn identity_comes_from_the_certificate_uri_san() {
        let dir = tempfile::tempdir().unwrap();
        let set = crate::certs::DevCerts::generate(&crate::certs::DevCertsSpec {
            nodes: 1,
            hosts: vec!["localhost".into(), "127.0.0.1".into()],
            tenants: vec![("acme".into(), "worker".into())],
            admins: vec!["ops".into()],
        })
        .unwrap();
        set.write(dir.path()).unwrap();
        let der = |name: &str| {
            let pem = std::fs::read(dir.path().join(format!("{name}.crt"))).unwrap();
            crate::tls::parse_certificates(&pem).unwrap()[0].to_vec()
        };
        assert_eq!(
            Identity::from_certificate(&der("node-1")),
            Ok(Identity::Node(1))
        );
        assert_eq!(
            Identity::from_certificate(&der("client-acme-worker")),
            Ok(Identity::Client {
                tenant: "acme".into(),
                name: "worker".into()
            })
        );
        assert_eq!(
            Identity::from_certificate(&der("admin-ops")),
            Ok(Identity::Admin { name: "ops".into() })
        );
        // The CA names nobody.
        assert_eq!(
            Identity::from_certificate(&der("ca")),
            Err(IdentityError::Missing)
        );
        assert_eq!(
            Identity::from_certificate(b"not a certificate"),
            Err(IdentityError::BadCertificate)
        );
    }
}
