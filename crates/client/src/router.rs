//! Where to send a call: the seed endpoints, the learned route of each
//! shard (its leader, or the node that last served it), which shard each
//! resource belongs to, and one connection per node.
//!
//! The client does not know the placement map. It learns routes from
//! answers: a success names the shard (`shard_id` in the response) and the
//! node that served it; a NOT_LEADER names the shard and its leader. A node
//! that forwards requests to the leader serves as well as the leader
//! itself, so a route is "a node that answered", not necessarily the leader.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tonic::transport::{Channel, Endpoint};

use crate::config::MAX_ENDPOINTS;
use crate::error::ClientError;
use crate::retry::Reroute;

/// Resources whose shard the client remembers. Past it the memory is
/// cleared (a cleared entry costs one redirect), so a client touching
/// millions of names stays bounded.
pub const MAX_CACHED_RESOURCES: usize = 65_536;

/// Shards whose route the client remembers; cleared when full, like
/// [`MAX_CACHED_RESOURCES`].
pub const MAX_CACHED_SHARDS: usize = 4_096;

/// Connections kept to nodes learned from leader hints (beyond the seeds).
/// Hints name cluster members, so this is only reached by a cluster that
/// changes members often; the learned connections are then dropped.
pub const MAX_LEARNED_CONNECTIONS: usize = 64;

/// HTTP/2 keepalive: a silently dead node is noticed within about
/// interval + timeout, instead of when the operating system gives up on the
/// TCP connection.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(5);

pub(crate) struct Router {
    /// The seed endpoints as URLs, in the caller's order, without repeats.
    seeds: Vec<String>,
    /// `http` or `https`, taken from the first seed, for hinted addresses.
    scheme: String,
    /// Mutual TLS for `https://` endpoints.
    tls: Option<crate::config::ClientTls>,
    connect_timeout: Duration,
    state: Mutex<RouteState>,
}

#[derive(Default)]
struct RouteState {
    channels: HashMap<String, Channel>,
    /// Shard id → URL of the node that last served it or was hinted as its
    /// leader.
    shard_routes: HashMap<u64, String>,
    resource_shards: HashMap<String, u64>,
    /// Index in `seeds` of the node asked when no route is known. Moves on
    /// when that node fails, so every seed gets its turn.
    preferred: usize,
}

/// `host:port` → `http://host:port` (or the given scheme); URLs unchanged.
pub(crate) fn normalize(endpoint: &str, scheme: &str) -> String {
    if endpoint.contains("://") {
        endpoint.to_owned()
    } else {
        format!("{scheme}://{endpoint}")
    }
}

impl Router {
    #[cfg(test)]
    pub fn new(endpoints: Vec<String>, connect_timeout: Duration) -> Result<Router, ClientError> {
        Self::with_tls(endpoints, connect_timeout, None)
    }

    /// [`Router::new`] with mutual TLS: endpoints without a scheme get
    /// `https://`.
    pub fn with_tls(
        endpoints: Vec<String>,
        connect_timeout: Duration,
        tls: Option<crate::config::ClientTls>,
    ) -> Result<Router, ClientError> {
        let default_scheme = if tls.is_some() { "https" } else { "http" };
        if endpoints.is_empty() {
            return Err(ClientError::InvalidEndpoint {
                endpoint: String::new(),
                reason: "at least one endpoint is needed".to_owned(),
            });
        }
        if endpoints.len() > MAX_ENDPOINTS {
            return Err(ClientError::InvalidEndpoint {
                endpoint: endpoints[MAX_ENDPOINTS].clone(),
                reason: format!("at most {MAX_ENDPOINTS} endpoints are accepted"),
            });
        }
        let mut seeds: Vec<String> = Vec::with_capacity(endpoints.len());
        for endpoint in &endpoints {
            let trimmed = endpoint.trim();
            let url = normalize(trimmed, default_scheme);
            let parsed =
                Endpoint::from_shared(url.clone()).map_err(|e| ClientError::InvalidEndpoint {
                    endpoint: endpoint.clone(),
                    reason: e.to_string(),
                })?;
            if parsed.uri().host().is_none() || trimmed.is_empty() {
                return Err(ClientError::InvalidEndpoint {
                    endpoint: endpoint.clone(),
                    reason: "no host".to_owned(),
                });
            }
            if !seeds.contains(&url) {
                seeds.push(url);
            }
        }
        let scheme = seeds[0]
            .split_once("://")
            .map(|(s, _)| s.to_owned())
            .unwrap_or_else(|| "http".to_owned());
        Ok(Router {
            seeds,
            scheme,
            tls,
            connect_timeout,
            state: Mutex::new(RouteState::default()),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, RouteState> {
        // The state is a cache: a panic elsewhere while it was locked leaves
        // nothing that could be inconsistent in a harmful way.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The node to ask about `resource` now.
    pub fn target(&self, resource: &str) -> String {
        let state = self.state();
        let route = state
            .resource_shards
            .get(resource)
            .and_then(|shard| state.shard_routes.get(shard));
        match route {
            Some(url) => url.clone(),
            None => self.seeds[state.preferred % self.seeds.len()].clone(),
        }
    }

    /// The node to ask about a shard whose id is known (held leases).
    pub fn target_for_shard(&self, shard_id: u64) -> String {
        let state = self.state();
        match state.shard_routes.get(&shard_id) {
            Some(url) => url.clone(),
            None => self.seeds[state.preferred % self.seeds.len()].clone(),
        }
    }

    /// A connection to `url`, made on first use. Connecting is lazy: the
    /// first call on it opens the connection, and a broken one is reopened
    /// by the next call.
    pub fn channel(&self, url: &str) -> Result<Channel, ClientError> {
        let mut state = self.state();
        if let Some(channel) = state.channels.get(url) {
            return Ok(channel.clone());
        }
        let learned = state
            .channels
            .keys()
            .filter(|u| !self.seeds.contains(u))
            .count();
        if learned >= MAX_LEARNED_CONNECTIONS {
            let seeds = &self.seeds;
            state.channels.retain(|u, _| seeds.contains(u));
        }
        let invalid = |e: tonic::transport::Error| ClientError::InvalidEndpoint {
            endpoint: url.to_owned(),
            reason: e.to_string(),
        };
        let mut endpoint = Endpoint::from_shared(url.to_owned()).map_err(invalid)?;
        if let (Some(tls), true) = (&self.tls, url.starts_with("https://")) {
            endpoint = endpoint.tls_config(tls.tonic_config()).map_err(invalid)?;
        }
        let channel = endpoint
            .connect_timeout(self.connect_timeout)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
            .keep_alive_timeout(KEEPALIVE_TIMEOUT)
            .keep_alive_while_idle(true)
            .connect_lazy();
        state.channels.insert(url.to_owned(), channel.clone());
        Ok(channel)
    }

    /// `url` served `shard_id` (and `resource`, when known): send them there
    /// next time.
    pub fn learn(&self, resource: Option<&str>, shard_id: u64, url: &str) {
        if shard_id == 0 {
            return;
        }
        let mut state = self.state();
        if let Some(resource) = resource {
            if state.resource_shards.len() >= MAX_CACHED_RESOURCES
                && !state.resource_shards.contains_key(resource)
            {
                state.resource_shards.clear();
            }
            state.resource_shards.insert(resource.to_owned(), shard_id);
        }
        if state.shard_routes.len() >= MAX_CACHED_SHARDS
            && !state.shard_routes.contains_key(&shard_id)
        {
            state.shard_routes.clear();
        }
        state.shard_routes.insert(shard_id, url.to_owned());
    }

    /// Applies the routing half of a failed attempt at `failed_url`; returns
    /// the node to try next.
    pub fn reroute(
        &self,
        reroute: &Reroute,
        resource: Option<&str>,
        shard_id: Option<u64>,
        failed_url: &str,
    ) -> String {
        match reroute {
            Reroute::Stay => return failed_url.to_owned(),
            Reroute::To(address) => {
                let url = normalize(address, &self.scheme);
                if let Some(shard_id) = shard_id {
                    self.learn(resource, shard_id, &url);
                }
                return url;
            }
            Reroute::Elsewhere => {
                let mut state = self.state();
                state.shard_routes.retain(|_, url| url != failed_url);
                let n = self.seeds.len();
                if self.seeds[state.preferred % n] == failed_url {
                    state.preferred = (state.preferred + 1) % n;
                }
            }
            Reroute::Refresh => {
                let mut state = self.state();
                if let Some(resource) = resource {
                    state.resource_shards.remove(resource);
                }
                if let Some(shard_id) = shard_id {
                    state.shard_routes.remove(&shard_id);
                }
            }
        }
        match (resource, shard_id) {
            (Some(resource), _) => self.target(resource),
            (None, Some(shard_id)) => self.target_for_shard(shard_id),
            (None, None) => {
                let state = self.state();
                self.seeds[state.preferred % self.seeds.len()].clone()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn router(seeds: &[&str]) -> Router {
        Router::new(
            seeds.iter().map(|s| s.to_string()).collect(),
            Duration::from_secs(1),
        )
        .unwrap()
    }

    #[test]
    fn endpoints_are_validated_and_normalized() {
        let r = router(&["127.0.0.1:7001", "http://127.0.0.1:7002", "127.0.0.1:7001"]);
        assert_eq!(
            r.seeds,
            vec!["http://127.0.0.1:7001", "http://127.0.0.1:7002"]
        );
        assert!(Router::new(vec![], Duration::from_secs(1)).is_err());
        assert!(Router::new(vec!["".into()], Duration::from_secs(1)).is_err());
        assert!(Router::new(vec!["http://".into()], Duration::from_secs(1)).is_err());
        let too_many = (0..=MAX_ENDPOINTS)
            .map(|i| format!("10.0.0.{i}:1"))
            .collect();
        assert!(Router::new(too_many, Duration::from_secs(1)).is_err());
    }

    #[test]
    fn a_leader_hint_is_remembered_per_shard_and_resource() {
        let r = router(&["a:1", "b:1"]);
        assert_eq!(r.target("t/x"), "http://a:1");
        let next = r.reroute(
            &Reroute::To("c:1".into()),
            Some("t/x"),
            Some(7),
            "http://a:1",
        );
        assert_eq!(next, "http://c:1");
        assert_eq!(r.target("t/x"), "http://c:1");
        assert_eq!(r.target_for_shard(7), "http://c:1");
        // Another resource of unknown shard still starts at the seed.
        assert_eq!(r.target("t/y"), "http://a:1");
    }

    #[test]
    fn a_failed_node_is_forgotten_and_the_next_seed_is_tried() {
        let r = router(&["a:1", "b:1", "c:1"]);
        r.learn(Some("t/x"), 1, "http://a:1");
        let next = r.reroute(&Reroute::Elsewhere, Some("t/x"), None, "http://a:1");
        assert_eq!(next, "http://b:1");
        let next = r.reroute(&Reroute::Elsewhere, Some("t/x"), None, "http://b:1");
        assert_eq!(next, "http://c:1");
        let next = r.reroute(&Reroute::Elsewhere, Some("t/x"), None, "http://c:1");
        assert_eq!(next, "http://a:1");
    }

    #[test]
    fn a_stale_shard_mapping_is_refreshed() {
        let r = router(&["a:1", "b:1"]);
        r.learn(Some("t/x"), 1, "http://b:1");
        let next = r.reroute(&Reroute::Refresh, Some("t/x"), Some(1), "http://b:1");
        assert_eq!(next, "http://a:1");
    }

    #[test]
    fn the_resource_cache_stays_bounded() {
        let r = router(&["a:1"]);
        for i in 0..=MAX_CACHED_RESOURCES {
            r.learn(Some(&format!("t/{i}")), 1, "http://a:1");
        }
        assert!(r.state().resource_shards.len() <= MAX_CACHED_RESOURCES);
    }

    #[test]
    fn hints_use_the_seed_scheme() {
        let r = router(&["https://a:1"]);
        let next = r.reroute(&Reroute::To("b:2".into()), None, Some(1), "https://a:1");
        assert_eq!(next, "https://b:2");
    }
}
