//! Field checks of the public API requests, as pure functions: from the
//! decoded request's fields to the values the state machine takes, or the
//! [`ServerError`] the caller gets (with its `ErrorDetail`). `service.rs`
//! and `admin.rs` call them before anything is routed or proposed; the fuzz
//! smoke (`tests/fuzz_smoke.rs`) feeds them arbitrary decoded requests.
//!
//! Checks that need cluster state (which shard, whether a node exists,
//! whether the caller may touch a tenant) stay with the services.

use fencelock_api::v1::SlotRange;
use fencelock_placement::SLOT_COUNT;
use fencelock_statemachine::limits::{LEASE_ID_LEN, MAX_RENEW_BATCH};
use fencelock_statemachine::{LeaseId, LockError, RequestId, ResourceName};

use crate::errors::ServerError;

/// Entries `HotResources` returns when the request asks for 0.
pub const DEFAULT_HOT_LIMIT: u32 = 20;
/// Most entries one `HotResources` call returns.
pub const MAX_HOT_LIMIT: u32 = 1_000;

/// A resource name: validated, never rewritten.
pub fn resource(name: &str) -> Result<ResourceName, ServerError> {
    ResourceName::parse(name).map_err(|e| ServerError::Lock(LockError::InvalidResource(e)))
}

/// A lease id: exactly [`LEASE_ID_LEN`] bytes.
pub fn lease_id(bytes: &[u8]) -> Result<LeaseId, ServerError> {
    LeaseId::from_slice(bytes).ok_or_else(|| ServerError::InvalidArgument {
        field: "lease_id",
        reason: format!("must be {LEASE_ID_LEN} bytes, got {}", bytes.len()),
    })
}

/// A caller's request id (1..=64 bytes).
pub fn request_id(bytes: &[u8]) -> Result<RequestId, ServerError> {
    RequestId::new(bytes.to_vec()).map_err(ServerError::Lock)
}

/// The number of leases one `RenewBatch` call may carry.
pub fn renew_batch_len(len: usize) -> Result<(), ServerError> {
    if len > MAX_RENEW_BATCH {
        return Err(ServerError::Lock(LockError::BatchTooLarge {
            len,
            max: MAX_RENEW_BATCH,
        }));
    }
    Ok(())
}

fn invalid(field: &'static str, reason: impl Into<String>) -> ServerError {
    ServerError::InvalidArgument {
        field,
        reason: reason.into(),
    }
}

/// Expands inclusive slot ranges (`ReshardRequest.move_slots`) into sorted,
/// unique slots. At most [`SLOT_COUNT`] ranges: more can only repeat slots,
/// and each range costs up to `SLOT_COUNT` steps to expand.
pub fn slots_from_ranges(ranges: &[SlotRange]) -> Result<Vec<u32>, ServerError> {
    if ranges.len() > SLOT_COUNT as usize {
        return Err(invalid(
            "slots",
            format!("{} ranges; at most {SLOT_COUNT}", ranges.len()),
        ));
    }
    let mut slots = std::collections::BTreeSet::new();
    for r in ranges {
        if r.start > r.end || r.end >= SLOT_COUNT {
            return Err(invalid(
                "slots",
                format!(
                    "range {}..={} is not within 0..={}",
                    r.start,
                    r.end,
                    SLOT_COUNT - 1
                ),
            ));
        }
        slots.extend(r.start..=r.end);
    }
    if slots.is_empty() {
        return Err(invalid("slots", "no slots given"));
    }
    Ok(slots.into_iter().collect())
}

/// `AddNodeRequest.node_id`: the new node's id, never 0.
pub fn new_node_id(node_id: u64) -> Result<u64, ServerError> {
    if node_id == 0 {
        return Err(invalid("node_id", "must be the new node's id (≥ 1)"));
    }
    Ok(node_id)
}

/// `HotResourcesRequest.limit`: 0 means [`DEFAULT_HOT_LIMIT`].
pub fn hot_limit(limit: u32) -> Result<u32, ServerError> {
    match limit {
        0 => Ok(DEFAULT_HOT_LIMIT),
        n if n <= MAX_HOT_LIMIT => Ok(n),
        n => Err(invalid(
            "limit",
            format!("must be in 0..={MAX_HOT_LIMIT}, got {n}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(start: u32, end: u32) -> SlotRange {
        SlotRange { start, end }
    }

    #[test]
    fn slot_ranges_expand_sorted_unique_and_bounded() {
        assert_eq!(
            slots_from_ranges(&[range(5, 6), range(1, 2), range(2, 5)]).unwrap(),
            vec![1, 2, 3, 4, 5, 6]
        );
        assert!(slots_from_ranges(&[]).is_err());
        assert!(slots_from_ranges(&[range(3, 2)]).is_err());
        assert!(slots_from_ranges(&[range(0, SLOT_COUNT)]).is_err());
        // Many ranges can only repeat slots: refused before any expansion.
        let many = vec![range(0, SLOT_COUNT - 1); SLOT_COUNT as usize + 1];
        assert!(slots_from_ranges(&many).is_err());
        let most = vec![range(0, SLOT_COUNT - 1); SLOT_COUNT as usize];
        assert_eq!(slots_from_ranges(&most).unwrap().len(), SLOT_COUNT as usize);
    }

    #[test]
    fn scalar_fields() {
        assert_eq!(hot_limit(0).unwrap(), DEFAULT_HOT_LIMIT);
        assert_eq!(hot_limit(MAX_HOT_LIMIT).unwrap(), MAX_HOT_LIMIT);
        assert!(hot_limit(MAX_HOT_LIMIT + 1).is_err());
        assert!(new_node_id(0).is_err());
        assert_eq!(new_node_id(4).unwrap(), 4);
        assert!(renew_batch_len(MAX_RENEW_BATCH).is_ok());
        assert!(renew_batch_len(MAX_RENEW_BATCH + 1).is_err());
        assert!(lease_id(&[0; 15]).is_err());
        assert!(lease_id(&[0; 16]).is_ok());
        assert!(request_id(b"").is_err());
        assert!(resource("acme/a").is_ok());
        assert!(resource("Acme/a").is_err());
    }
}
