//! Public API requests as they arrive: protobuf bytes decoded into each
//! request message of `fencelock.v1`, then the field checks every server
//! applies before anything is proposed (resource name, request id, lease
//! id). Decoding may fail; it must not panic, and a decoded message must
//! encode and decode back to itself.
//!
//! The server's own validation functions (`fencelock_server::validate`,
//! with their error mapping to gRPC statuses) run on the same inputs in the
//! server's smoke test (`crates/server/tests/fuzz_smoke.rs`).

use fencelock_api::v1::{
    AcquireRequest, AddNodeRequest, DrainNodeRequest, GetRequest, HotResourcesRequest,
    ListShardsRequest, MoveReplicaRequest, ReleaseRequest, RenewBatchRequest, RenewRequest,
    ReshardRequest, TransferLeaderRequest,
};
use fencelock_statemachine::{LeaseId, RequestId, ResourceName};
use prost::Message;

/// The request types, in the order of the selector byte.
pub const REQUEST_TYPES: [&str; 12] = [
    "AcquireRequest",
    "RenewRequest",
    "RenewBatchRequest",
    "ReleaseRequest",
    "GetRequest",
    "AddNodeRequest",
    "DrainNodeRequest",
    "TransferLeaderRequest",
    "MoveReplicaRequest",
    "ReshardRequest",
    "HotResourcesRequest",
    "ListShardsRequest",
];

/// Decodes `bytes` as `M`; a decoded message must survive its own
/// encoding.
pub fn decode<M: Message + Default + PartialEq>(bytes: &[u8]) -> Option<M> {
    let message = M::decode(bytes).ok()?;
    let again = M::decode(message.encode_to_vec().as_slice())
        .unwrap_or_else(|e| panic!("re-encoded message does not decode: {e}"));
    assert!(again == message, "message does not round-trip");
    Some(message)
}

fn resource(name: &str) {
    if let Ok(r) = ResourceName::parse(name) {
        // A valid name is in normal form: it is exactly what was sent.
        assert_eq!(r.as_str(), name);
        assert!(!r.tenant().is_empty());
    }
}

fn lease_id(bytes: &[u8]) {
    assert_eq!(LeaseId::from_slice(bytes).is_some(), bytes.len() == 16);
}

fn request_id(bytes: &[u8]) {
    let _ = RequestId::new(bytes.to_vec());
}

/// First byte selects the request type (see [`REQUEST_TYPES`]); the rest
/// is the message.
pub fn api_requests(data: &[u8]) {
    let Some((&which, bytes)) = data.split_first() else {
        return;
    };
    match usize::from(which) % REQUEST_TYPES.len() {
        0 => {
            if let Some(r) = decode::<AcquireRequest>(bytes) {
                resource(&r.resource);
                request_id(&r.request_id);
            }
        }
        1 => {
            if let Some(r) = decode::<RenewRequest>(bytes) {
                resource(&r.resource);
                lease_id(&r.lease_id);
            }
        }
        2 => {
            if let Some(r) = decode::<RenewBatchRequest>(bytes) {
                for item in &r.items {
                    resource(&item.resource);
                    lease_id(&item.lease_id);
                }
            }
        }
        3 => {
            if let Some(r) = decode::<ReleaseRequest>(bytes) {
                resource(&r.resource);
                lease_id(&r.lease_id);
            }
        }
        4 => {
            if let Some(r) = decode::<GetRequest>(bytes) {
                resource(&r.resource);
            }
        }
        5 => {
            decode::<AddNodeRequest>(bytes);
        }
        6 => {
            decode::<DrainNodeRequest>(bytes);
        }
        7 => {
            decode::<TransferLeaderRequest>(bytes);
        }
        8 => {
            decode::<MoveReplicaRequest>(bytes);
        }
        9 => {
            decode::<ReshardRequest>(bytes);
        }
        10 => {
            decode::<HotResourcesRequest>(bytes);
        }
        _ => {
            decode::<ListShardsRequest>(bytes);
        }
    }
}
