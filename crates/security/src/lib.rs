//! Security at the node's edge (docs/security.md): mutual TLS, caller
//! identities, who may call which service, per-tenant request rates and
//! private data directories.
//!
//! * [`tls`] — loading the CA, certificate and key; server and client TLS.
//! * [`identity`] — identities from certificate URI SANs.
//! * [`certs`] — the development CA behind `fencelock dev certs`.
//! * [`rate`] — the per-tenant token bucket.
//! * [`conn`] — the connection caps of the gRPC port (in all, per source
//!   address) and its handshake timeout.
//! * [`malformed`] — requests that do not decode answered as typed errors.
//!
//! Who may call what, with TLS on:
//!
//! | service | identities |
//! | --- | --- |
//! | `LockService` | clients, their own tenant only (admins: `Get` of any tenant); nodes forwarding for a client, which pass the client's identity in [`IDENTITY_HEADER`] |
//! | `AdminService`, admin HTTP views | admins |
//! | `RaftTransport`, `NodeControl` (internal) | nodes |
//! | health, reflection | any certificate the CA signed |
//!
//! Without TLS (`tls.insecure = true`, development only) every caller is
//! [`Identity::Anonymous`] and may do everything.

pub mod certs;
pub mod conn;
pub mod identity;
pub mod malformed;
pub mod rate;
/// TLS material and how peers are dialed: the transport's.
pub use fencelock_transport::tls;

use std::path::Path;

use fencelock_api::v1::{ErrorDetail, Reason};
use tonic::{Request, Status};

pub use identity::{Identity, IdentityError};
pub use tls::{PeerTls, TlsMaterial};

pub use fencelock_api::headers::IDENTITY_HEADER;
/// Mode of the data directory: owner only. The lock state, lease ids and
/// audit trail are in there.
pub const DATA_DIR_MODE: u32 = 0o700;

/// A refusal with reason PERMISSION_DENIED and a message that names only
/// what the caller lacks, never the resource or lease.
pub fn permission_denied(message: impl Into<String>) -> Status {
    ErrorDetail::new(Reason::PermissionDenied, message).to_status()
}

/// Which identities a service accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Audience {
    /// `LockService`: clients, admins (reads only, checked per call), and
    /// nodes forwarding for one of them.
    Clients,
    /// `AdminService`.
    Admins,
    /// The internal services.
    Nodes,
}

/// The interceptor in front of every gRPC service: finds the caller's
/// identity, refuses callers the service does not accept, and leaves the
/// identity in the request's extensions for the service.
#[derive(Clone, Debug)]
pub struct Gate {
    secure: bool,
    audience: Audience,
}

impl Gate {
    pub fn new(secure: bool, audience: Audience) -> Gate {
        Gate { secure, audience }
    }

    fn peer(&self, request: &Request<()>) -> Result<Identity, Status> {
        let certs = request
            .peer_certs()
            .ok_or_else(|| permission_denied("no client certificate"))?;
        let first = certs
            .first()
            .ok_or_else(|| permission_denied("no client certificate"))?;
        Identity::from_certificate(first).map_err(|e| permission_denied(e.to_string()))
    }

    fn identify(&self, request: &Request<()>) -> Result<Identity, Status> {
        if !self.secure {
            return Ok(Identity::Anonymous);
        }
        let peer = self.peer(request)?;
        let relayed = request.metadata().get(IDENTITY_HEADER);
        match self.audience {
            Audience::Nodes if matches!(peer, Identity::Node(_)) => Ok(peer),
            Audience::Nodes => Err(permission_denied("this service is for cluster nodes only")),
            Audience::Admins if matches!(peer, Identity::Admin { .. }) => Ok(peer),
            Audience::Admins => Err(permission_denied("this service needs an admin identity")),
            Audience::Clients => match (&peer, relayed) {
                (Identity::Node(_), Some(value)) => {
                    let uri = value
                        .to_str()
                        .map_err(|_| permission_denied("malformed forwarded identity"))?;
                    match Identity::parse_uri(uri) {
                        Ok(id @ (Identity::Client { .. } | Identity::Admin { .. })) => Ok(id),
                        _ => Err(permission_denied("malformed forwarded identity")),
                    }
                }
                (Identity::Node(_), None) => Err(permission_denied(
                    "a node may only call this service for a client",
                )),
                (_, Some(_)) => Err(permission_denied(
                    "only cluster nodes may pass an identity on",
                )),
                (Identity::Client { .. } | Identity::Admin { .. }, None) => Ok(peer),
                (Identity::Anonymous, None) => Err(permission_denied("no identity")),
            },
        }
    }
}

/// Whether a request reached this node through another node's forwarding
/// (then it was counted against its tenant's rate there). With TLS only a
/// node certificate makes a request relayed: a client cannot skip its rate
/// limit by setting the forwarding headers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Relayed(pub bool);

impl tonic::service::Interceptor for Gate {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        let identity = self.identify(&request)?;
        let relayed = if self.secure {
            request.metadata().contains_key(IDENTITY_HEADER)
        } else {
            request
                .metadata()
                .contains_key(fencelock_api::headers::CALLER_HEADER)
        };
        request.extensions_mut().insert(identity);
        request.extensions_mut().insert(Relayed(relayed));
        Ok(request)
    }
}

/// Whether the [`Gate`] found `request` forwarded by a node (false for
/// in-process calls).
pub fn relayed_of<T>(request: &Request<T>) -> bool {
    request.extensions().get::<Relayed>().is_some_and(|r| r.0)
}

/// The identity the [`Gate`] left on a request; anonymous when the
/// service was reached without one (in-process calls, insecure mode).
pub fn identity_of<T>(request: &Request<T>) -> Identity {
    request
        .extensions()
        .get::<Identity>()
        .cloned()
        .unwrap_or(Identity::Anonymous)
}

/// Creates `dir` (and missing parents) with mode 0700 for the last part.
pub fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        builder.mode(DATA_DIR_MODE);
    }
    builder.create(dir)
}

/// Why a data directory was refused.
#[derive(Clone, Debug, thiserror::Error)]
pub enum DataDirError {
    #[error("cannot create data directory {path}: {reason}")]
    Create { path: String, reason: String },
    #[error("data directory {path} has mode {mode:04o}: group and others must have no access (chmod 700 {path})")]
    TooOpen { path: String, mode: u32 },
}

/// Creates the data directory 0700 if it is missing, and refuses one that
/// group or others can access: it holds every lease id.
pub fn prepare_data_dir(dir: &Path) -> Result<(), DataDirError> {
    let path = dir.display().to_string();
    create_private_dir(dir).map_err(|e| DataDirError::Create {
        path: path.clone(),
        reason: e.to_string(),
    })?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir)
            .map_err(|e| DataDirError::Create {
                path: path.clone(),
                reason: e.to_string(),
            })?
            .permissions()
            .mode()
            & 0o7777;
        if mode & 0o077 != 0 {
            return Err(DataDirError::TooOpen { path, mode });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(unix)]
    #[test]
    fn data_dir_is_created_private_and_an_open_one_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("data");
        prepare_data_dir(&dir).unwrap();
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, DATA_DIR_MODE);
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let err = prepare_data_dir(&dir).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("0755") && text.contains(&dir.display().to_string()),
            "{text}"
        );
    }

    #[test]
    fn insecure_gate_makes_everyone_anonymous() {
        use tonic::service::Interceptor;
        for audience in [Audience::Clients, Audience::Admins, Audience::Nodes] {
            let mut gate = Gate::new(false, audience);
            let request = gate.call(Request::new(())).unwrap();
            assert_eq!(identity_of(&request), Identity::Anonymous);
        }
    }

    #[test]
    fn secure_gate_refuses_a_call_without_a_certificate() {
        use tonic::service::Interceptor;
        let mut gate = Gate::new(true, Audience::Clients);
        let status = gate.call(Request::new(())).unwrap_err();
        assert_eq!(status.code(), tonic::Code::PermissionDenied);
    }
}
