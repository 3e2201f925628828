//! What this node knows about where things are: the placement map (the
//! resource → slot → shard table, shard replicas, node addresses) and the
//! last leader seen per shard.
//!
//! The map is *intent* written through the meta shard's Raft log; this node
//! holds the newest version it has seen — applied by its own meta replica,
//! or fetched from a peer when it has none. Leaders are *observed*: from this
//! node's own replicas and from NOT_LEADER hints. Routing by a stale map is
//! safe: every shard checks slot ownership when it applies a command and
//! refuses slots it does not serve, so a stale route costs a retry, never a
//! wrong grant.
//!
//! Which slot a resource belongs to (the hash and the slot space) is the
//! state machine's (`fencelock_statemachine::slots`), because shards check
//! slot ownership at apply; the slot → shard table is the placement map's.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use fencelock_placement::PlacementMap;
use fencelock_statemachine::{slot_of, ResourceName};

/// The leader of a shard as this node knows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderInfo {
    /// The leader's node id (at least 1).
    pub node_id: u64,
    /// The leader's advertised `host:port`.
    pub addr: String,
}

/// Why a route could not be found.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    /// This node has no placement map yet (it joined and has not fetched
    /// one): it cannot tell which shard serves anything.
    #[error("this node does not know the placement map yet")]
    MapUnknown,
}

#[derive(Default)]
struct RouteState {
    map: Option<Arc<PlacementMap>>,
    /// shard id → node id of its last known leader.
    leaders: HashMap<u64, u64>,
    /// Addresses of the initial members (from the configuration), for
    /// before the map is known.
    seed_addrs: HashMap<u64, String>,
}

/// Called with every map the router installs.
type MapListener = Box<dyn Fn(&PlacementMap) + Send + Sync>;

/// Shared between the store loop (which publishes) and the services (which
/// read). Reads take a read lock for a few field lookups.
#[derive(Default)]
pub struct Router {
    state: RwLock<RouteState>,
    /// Told of every newer map, whoever offered it (the meta replica, an
    /// admin action's answer, a fetch from a peer): the peer transport
    /// learns new nodes' addresses here, so no path that updates the map
    /// can leave the transport without a node the map names.
    on_new_map: std::sync::OnceLock<MapListener>,
}

impl Router {
    pub fn new(seed_addrs: impl IntoIterator<Item = (u64, String)>) -> Router {
        Router {
            state: RwLock::new(RouteState {
                seed_addrs: seed_addrs.into_iter().collect(),
                ..Default::default()
            }),
            on_new_map: std::sync::OnceLock::new(),
        }
    }

    /// Sets the function told of every map installed from now on (once;
    /// a second call is refused and returns false).
    pub fn on_new_map(&self, listener: impl Fn(&PlacementMap) + Send + Sync + 'static) -> bool {
        self.on_new_map.set(Box::new(listener)).is_ok()
    }

    /// Installs `map` if it is newer than the one held. Returns whether it
    /// was installed.
    pub fn offer_map(&self, map: PlacementMap) -> bool {
        let map = Arc::new(map);
        {
            let mut st = self.state.write().expect("router lock");
            if st
                .map
                .as_ref()
                .is_some_and(|m| m.version() >= map.version())
            {
                return false;
            }
            st.map = Some(map.clone());
        }
        // Outside the lock: the listener may take its own.
        if let Some(listener) = self.on_new_map.get() {
            listener(&map);
        }
        true
    }

    /// The newest map this node knows, if any.
    pub fn map(&self) -> Option<Arc<PlacementMap>> {
        self.state.read().expect("router lock").map.clone()
    }

    pub fn map_version(&self) -> u64 {
        self.map().map(|m| m.version()).unwrap_or(0)
    }

    /// The shard serving `resource` according to the newest known map.
    pub fn shard_of(&self, resource: &ResourceName) -> Result<u64, RouteError> {
        match self.map() {
            Some(map) => Ok(map.shard_of_slot(slot_of(resource))),
            // A node that joined and has not fetched the map yet.
            None => Err(RouteError::MapUnknown),
        }
    }

    pub fn note_leader(&self, shard_id: u64, node_id: u64) {
        if node_id == 0 {
            return;
        }
        let mut st = self.state.write().expect("router lock");
        if st.leaders.get(&shard_id) != Some(&node_id) {
            st.leaders.insert(shard_id, node_id);
        }
    }

    pub fn leader_of(&self, shard_id: u64) -> Option<u64> {
        self.state
            .read()
            .expect("router lock")
            .leaders
            .get(&shard_id)
            .copied()
    }

    /// The advertised address of `node_id`: from the map, else from the
    /// configured initial members.
    pub fn node_addr(&self, node_id: u64) -> Option<String> {
        let st = self.state.read().expect("router lock");
        st.map
            .as_ref()
            .and_then(|m| m.node(node_id).map(|n| n.addr.clone()))
            .or_else(|| st.seed_addrs.get(&node_id).cloned())
    }

    /// A leader hint for `node_id`, if its address is known.
    pub fn leader_info(&self, node_id: u64) -> Option<LeaderInfo> {
        self.node_addr(node_id)
            .map(|addr| LeaderInfo { node_id, addr })
    }

    /// Nodes to try for `shard_id`, best first: the last known leader, then
    /// the shard's replicas in the map.
    pub fn candidates(&self, shard_id: u64) -> Vec<u64> {
        let st = self.state.read().expect("router lock");
        let mut out: Vec<u64> = st.leaders.get(&shard_id).copied().into_iter().collect();
        if let Some(shard) = st.map.as_ref().and_then(|m| m.shard(shard_id)) {
            for n in &shard.replicas {
                if !out.contains(n) {
                    out.push(*n);
                }
            }
        }
        out
    }

    /// Every node address known (map first, then seeds).
    pub fn all_nodes(&self) -> Vec<(u64, String)> {
        let st = self.state.read().expect("router lock");
        let mut out: Vec<(u64, String)> = match &st.map {
            Some(m) => m.nodes().map(|n| (n.node_id, n.addr.clone())).collect(),
            None => Vec::new(),
        };
        for (id, addr) in &st.seed_addrs {
            if !out.iter().any(|(i, _)| i == id) {
                out.push((*id, addr.clone()));
            }
        }
        out.sort();
        out
    }
}
