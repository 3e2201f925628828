//! Node-wide metadata in the `meta` column family: the on-disk format
//! version, the node's identity (cluster id, node id) and the list of shards
//! hosted here.
//!
//! The identity check exists so that a data directory copied to, or left
//! behind on, the wrong node is refused at startup instead of joining a Raft
//! group under someone else's id. The shard list is what the node walks at
//! startup to reopen every [`crate::ShardStorage`]; registering a shard is
//! staged into the same batch as the shard's first state so the two cannot
//! disagree after a crash.

use crate::engine::{Cf, Engine, WriteBatch};
use crate::error::{Error, Result};
use crate::keys;

/// Version of the whole key layout (see [`crate::keys`]). Bump on any
/// incompatible change; a store written by another version is refused.
pub const FORMAT_VERSION: u32 = 1;

/// Most shards one node may host. The design calls for "a modest number of
/// shards"; the bound keeps startup (one `ShardStorage::open` each) and the
/// per-shard memory (entry cache) predictable.
pub const MAX_SHARDS_PER_NODE: usize = 16_384;

/// Version byte of the encoded identity.
const IDENT_VERSION: u8 = 1;
/// version + cluster id + node id.
const IDENT_LEN: usize = 1 + 8 + 8;

/// Who this node is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeIdent {
    /// Cluster this store belongs to.
    pub cluster_id: u64,
    /// This node's id (also its Raft peer id in every shard).
    pub node_id: u64,
}

impl NodeIdent {
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(IDENT_LEN);
        out.push(IDENT_VERSION);
        out.extend_from_slice(&self.cluster_id.to_be_bytes());
        out.extend_from_slice(&self.node_id.to_be_bytes());
        out
    }

    fn decode(key: &[u8], bytes: &[u8]) -> Result<Self> {
        if bytes.len() != IDENT_LEN || bytes[0] != IDENT_VERSION {
            return Err(Error::corruption(
                Cf::Meta,
                key,
                format!("bad node identity record ({} bytes)", bytes.len()),
            ));
        }
        let mut cluster = [0u8; 8];
        let mut node = [0u8; 8];
        cluster.copy_from_slice(&bytes[1..9]);
        node.copy_from_slice(&bytes[9..17]);
        Ok(NodeIdent {
            cluster_id: u64::from_be_bytes(cluster),
            node_id: u64::from_be_bytes(node),
        })
    }
}

/// Prepares a store for use by this node: records the format version and
/// identity on first use (synced), and on later starts checks that both
/// match. Call once at startup, before opening any shard.
pub fn init_store<E: Engine + ?Sized>(engine: &E, ident: NodeIdent) -> Result<()> {
    let version_key = keys::meta_key(keys::TAG_FORMAT_VERSION);
    let ident_key = keys::meta_key(keys::TAG_NODE_IDENT);
    let mut batch = WriteBatch::new();
    match engine.get(Cf::Meta, &version_key)? {
        None => batch.put(Cf::Meta, version_key, FORMAT_VERSION.to_be_bytes().to_vec()),
        Some(bytes) => {
            let found = <[u8; 4]>::try_from(bytes.as_slice())
                .map(u32::from_be_bytes)
                .map_err(|_| Error::corruption(Cf::Meta, &version_key, "bad format version"))?;
            if found != FORMAT_VERSION {
                return Err(Error::MetaMismatch(format!(
                    "store has format version {found}, this build reads {FORMAT_VERSION}"
                )));
            }
        }
    }
    match load_ident(engine)? {
        None => batch.put(Cf::Meta, ident_key, ident.encode()),
        Some(found) if found == ident => {}
        Some(found) => {
            return Err(Error::MetaMismatch(format!(
                "store belongs to {found:?}, this node is {ident:?}"
            )))
        }
    }
    engine.write(&batch, true)
}

/// The identity recorded by [`init_store`], if any.
pub fn load_ident<E: Engine + ?Sized>(engine: &E) -> Result<Option<NodeIdent>> {
    let key = keys::meta_key(keys::TAG_NODE_IDENT);
    engine
        .get(Cf::Meta, &key)?
        .map(|bytes| NodeIdent::decode(&key, &bytes))
        .transpose()
}

/// Stages registration of a shard hosted on this node.
pub fn register_shard(batch: &mut WriteBatch, shard_id: u64) {
    batch.put(
        Cf::Meta,
        keys::shard_key(keys::TAG_SHARD, shard_id),
        Vec::new(),
    );
}

/// Stages removal of a shard from this node's list (pair it with
/// [`crate::ShardStorage::destroy`] in the same batch).
pub fn unregister_shard(batch: &mut WriteBatch, shard_id: u64) {
    batch.delete(Cf::Meta, keys::shard_key(keys::TAG_SHARD, shard_id));
}

/// Every registered shard id, ascending. Refuses a list longer than
/// [`MAX_SHARDS_PER_NODE`] as corruption rather than loading it all.
pub fn registered_shards<E: Engine + ?Sized>(engine: &E) -> Result<Vec<u64>> {
    let start = keys::shard_key(keys::TAG_SHARD, 0);
    let end = vec![keys::TAG_SHARD + 1];
    let found = engine.scan(Cf::Meta, &start, &end, MAX_SHARDS_PER_NODE + 1)?;
    if found.len() > MAX_SHARDS_PER_NODE {
        return Err(Error::corruption(
            Cf::Meta,
            &start,
            format!("more than {MAX_SHARDS_PER_NODE} shards registered"),
        ));
    }
    found
        .into_iter()
        .map(|(key, _)| {
            let id = <[u8; 8]>::try_from(&key[1..])
                .map(u64::from_be_bytes)
                .map_err(|_| Error::corruption(Cf::Meta, &key, "bad shard registration key"))?;
            Ok(id)
        })
        .collect()
}
