//! The dedup table's key: which acquire an entry remembers.
//!
//! An acquire is named by `(resource, owner, request id)`: request ids are
//! the caller's, so two identities using the same id name two acquires and
//! one can never read the other's outcome.
//!
//! The table keeps an entry for every acquire of the last
//! `dedup_retention_ms` — at the design load hundreds of thousands per node,
//! by far the most numerous thing in memory — and indexes each one twice
//! (by key, and by forget time). So the three parts are packed into **one
//! shared allocation**: `resource NUL owner NUL request-id`. Neither a
//! resource name nor an owner can contain NUL (both are validated to a
//! printable charset), so the packing is unambiguous, and since NUL sorts
//! below every byte they can hold, the packed keys sort exactly as the
//! `(resource, owner, request id)` tuples do: snapshots list entries in the
//! same order as before the packing. Cloning a key (for the forget index,
//! for an export) copies a pointer, not the bytes.

use std::sync::Arc;

use crate::cow_map::Spread;
use crate::name::ResourceName;
use crate::slots::slot_of_name;
use crate::types::{Owner, RequestId};

#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct DedupKey(Arc<[u8]>);

const SEPARATOR: u8 = 0;

impl DedupKey {
    pub(crate) fn new(resource: &ResourceName, owner: &Owner, request_id: &RequestId) -> DedupKey {
        let (resource, owner) = (resource.as_str().as_bytes(), owner.as_str().as_bytes());
        debug_assert!(!resource.contains(&SEPARATOR) && !owner.contains(&SEPARATOR));
        let mut packed =
            Vec::with_capacity(resource.len() + owner.len() + 2 + request_id.as_bytes().len());
        packed.extend_from_slice(resource);
        packed.push(SEPARATOR);
        packed.extend_from_slice(owner);
        packed.push(SEPARATOR);
        packed.extend_from_slice(request_id.as_bytes());
        DedupKey(packed.into())
    }

    /// The three parts, as packed by [`DedupKey::new`].
    fn parts(&self) -> (&[u8], &[u8], &[u8]) {
        let mut parts = self.0.splitn(3, |&b| b == SEPARATOR);
        let resource = parts.next().expect("packed by new");
        let owner = parts.next().expect("packed by new");
        let request_id = parts.next().expect("packed by new");
        (resource, owner, request_id)
    }

    pub(crate) fn resource(&self) -> &str {
        std::str::from_utf8(self.parts().0).expect("packed from a resource name")
    }

    pub(crate) fn owner(&self) -> &str {
        std::str::from_utf8(self.parts().1).expect("packed from an owner")
    }

    pub(crate) fn request_id(&self) -> &[u8] {
        self.parts().2
    }

    /// The slot of the key's resource (as [`crate::slot_of`] computes it).
    pub(crate) fn slot(&self) -> u32 {
        slot_of_name(self.parts().0)
    }
}

/// The whole key, not only its resource: one hot resource's many
/// remembered acquires spread over every bucket.
impl Spread for DedupKey {
    fn spread(&self) -> u64 {
        crate::slots::fnv1a64(&self.0)
    }
}

impl std::fmt::Debug for DedupKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DedupKey")
            .field("resource", &self.resource())
            .field("owner", &self.owner())
            .field("request_id", &self.request_id())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slots::slot_of;

    fn key(resource: &str, owner: &str, request_id: &[u8]) -> DedupKey {
        DedupKey::new(
            &ResourceName::parse(resource).unwrap(),
            &Owner::new(owner).unwrap(),
            &RequestId::new(request_id.to_vec()).unwrap(),
        )
    }

    /// An ended acquire's forget-index entry points at the very bytes its
    /// table key holds: the memory figures in docs/operations.md count one
    /// copy per entry.
    #[test]
    fn an_ended_acquire_shares_its_key_with_the_forget_index() {
        use crate::{ApplyContext, Command, LeaseId, Limits, LockTable};
        let mut table = LockTable::new(Limits::default()).unwrap();
        let mut index = 0;
        let mut apply = |table: &mut LockTable, c: Command| {
            index += 1;
            let ctx = ApplyContext {
                index,
                term: 1,
                epoch: 1,
                now_ms: 1_000_000,
            };
            table.apply(&c, &ctx).reply.unwrap();
        };
        apply(
            &mut table,
            Command::LeaderChanged {
                clock_offset_allowance_ms: 0,
            },
        );
        let resource = ResourceName::parse("acme/a").unwrap();
        apply(
            &mut table,
            Command::Acquire {
                owner: Owner::anonymous(),
                resource: resource.clone(),
                request_id: RequestId::new(b"r".to_vec()).unwrap(),
                lease_id: LeaseId([1; 16]),
                lease_ttl_ms: 10_000,
                wait_timeout_ms: 0,
                value: crate::HolderValue::none(),
                mode: crate::AcquireMode::Exclusive,
            },
        );
        apply(
            &mut table,
            Command::Release {
                owner: Owner::anonymous(),
                resource,
                lease_id: LeaseId([1; 16]),
            },
        );
        let (stored, _) = table.dedup.iter().next().unwrap();
        let (_, indexed) = table.forget_index.first().unwrap();
        assert!(Arc::ptr_eq(&stored.0, &indexed.0));
    }

    #[test]
    fn packed_key_gives_back_its_parts_and_slot() {
        let k = key(
            "acme/orders-7",
            "spiffe://fencelock/tenant/acme/w1",
            b"\0req\0",
        );
        assert_eq!(k.resource(), "acme/orders-7");
        assert_eq!(k.owner(), "spiffe://fencelock/tenant/acme/w1");
        // A request id may hold NUL bytes: it is the last part.
        assert_eq!(k.request_id(), b"\0req\0");
        assert_eq!(
            k.slot(),
            slot_of(&ResourceName::parse("acme/orders-7").unwrap())
        );
        let anonymous = key("acme/a", "", b"r");
        assert_eq!((anonymous.owner(), anonymous.request_id()), ("", &b"r"[..]));
    }

    #[test]
    fn packed_keys_sort_as_their_tuples() {
        let tuples: Vec<(&str, &str, &[u8])> = vec![
            ("acme/a", "", b"z"),
            ("acme/a", "o", b"\0"),
            ("acme/a", "o", b"\0\0"),
            ("acme/a", "o", b"a"),
            ("acme/a", "oo", b"a"),
            ("acme/a-", "", b"a"),
            ("acme/ab", "", b"a"),
            ("acme/b", "", b"\xff"),
            ("b/a", "", b"a"),
        ];
        let mut sorted = tuples.clone();
        sorted.sort();
        assert_eq!(sorted, tuples, "the list above is in tuple order");
        let keys: Vec<DedupKey> = tuples.iter().map(|(r, o, q)| key(r, o, q)).collect();
        for pair in keys.windows(2) {
            assert!(pair[0] < pair[1], "{pair:?}");
        }
    }
}
