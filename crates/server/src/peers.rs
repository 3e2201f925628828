//! gRPC channels from this node to other nodes, for request forwarding and
//! operator actions (the Raft transport has its own streams).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tonic::transport::Channel;

use crate::errors::ServerError;
use crate::security::PeerTls;

/// How long connecting to a peer may take before a call fails.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Most peer channels kept (one per node address; the cluster limit on
/// nodes is far below this).
const MAX_CHANNELS: usize = 256;

/// One lazily connected channel per peer address, shared by all calls
/// (HTTP/2 multiplexes them).
#[derive(Default)]
pub struct PeerChannels {
    channels: Mutex<HashMap<String, Channel>>,
    /// Mutual TLS with the node's certificate, or none (insecure mode).
    tls: PeerTls,
}

impl PeerChannels {
    pub fn new(tls: PeerTls) -> PeerChannels {
        PeerChannels {
            channels: Mutex::new(HashMap::new()),
            tls,
        }
    }

    pub fn tls(&self) -> &PeerTls {
        &self.tls
    }

    pub fn channel(&self, addr: &str) -> Result<Channel, ServerError> {
        let mut channels = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(ch) = channels.get(addr) {
            return Ok(ch.clone());
        }
        let endpoint = self
            .tls
            .endpoint(addr)
            .map_err(|e| ServerError::Internal(format!("peer address {addr:?}: {e}")))?
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true);
        let ch = endpoint.connect_lazy();
        if channels.len() >= MAX_CHANNELS {
            channels.clear();
        }
        channels.insert(addr.to_owned(), ch.clone());
        Ok(ch)
    }
}
