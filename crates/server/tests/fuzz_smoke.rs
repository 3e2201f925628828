//! Fuzz smoke of the server's request checks, run by `make test` with the
//! driver of `fencelock_fuzz_targets::smoke` (corpus in
//! `fuzz/corpus/server_requests/`, then seeded random and mutated inputs):
//! each public request message decoded from bytes, then the server's own
//! checks (`fencelock_server::validate`) and, for a refusal, the gRPC status
//! and HTTP response the caller would get.
//!
//! It needs the server crate (and so RocksDB), which the coverage-guided
//! build in `fuzz/` leaves out; it fuzzes the decoders underneath (API
//! messages) instead. The store's codecs, once here, are pure and live in
//! `crates/fuzz-targets` (`log_payload`, `raft_batch`).

use fencelock_api::v1::{
    reshard_request, AcquireRequest, AddNodeRequest, GetRequest, HotResourcesRequest,
    ReleaseRequest, RenewBatchRequest, RenewRequest, ReshardRequest,
};
use fencelock_fuzz_targets::requests::{decode, REQUEST_TYPES};
use fencelock_fuzz_targets::{seeds, smoke};
use fencelock_server::errors::ServerError;
use fencelock_server::validate;
use prost::Message as _;

/// Generated inputs per target (each target takes well under a second).
const ITERATIONS: usize = 100_000;

/// A refusal must turn into a detail, a status and an HTTP response
/// without panicking, whatever the request held.
fn refuse(err: ServerError) {
    let detail = err.to_detail();
    let _ = detail.encode_to_vec();
    let status: tonic::Status = err.into();
    let _ = status.into_http::<()>();
}

fn check<T>(result: Result<T, ServerError>) -> Option<T> {
    result.map_err(refuse).ok()
}

/// Same selector as `fencelock_fuzz_targets::requests::api_requests`, so
/// the two targets share seeds.
fn server_requests(data: &[u8]) {
    let Some((&which, bytes)) = data.split_first() else {
        return;
    };
    match usize::from(which) % REQUEST_TYPES.len() {
        0 => {
            if let Some(r) = decode::<AcquireRequest>(bytes) {
                check(validate::resource(&r.resource));
                check(validate::request_id(&r.request_id));
            }
        }
        1 => {
            if let Some(r) = decode::<RenewRequest>(bytes) {
                check(validate::resource(&r.resource));
                check(validate::lease_id(&r.lease_id));
            }
        }
        2 => {
            if let Some(r) = decode::<RenewBatchRequest>(bytes) {
                if check(validate::renew_batch_len(r.items.len())).is_some() {
                    for item in &r.items {
                        check(validate::resource(&item.resource));
                        check(validate::lease_id(&item.lease_id));
                    }
                }
            }
        }
        3 => {
            if let Some(r) = decode::<ReleaseRequest>(bytes) {
                check(validate::resource(&r.resource));
                check(validate::lease_id(&r.lease_id));
            }
        }
        4 => {
            if let Some(r) = decode::<GetRequest>(bytes) {
                check(validate::resource(&r.resource));
            }
        }
        5 => {
            if let Some(r) = decode::<AddNodeRequest>(bytes) {
                check(validate::new_node_id(r.node_id));
            }
        }
        9 => {
            if let Some(ReshardRequest {
                action: Some(reshard_request::Action::MoveSlots(m)),
            }) = decode::<ReshardRequest>(bytes)
            {
                if let Some(slots) = check(validate::slots_from_ranges(&m.slots)) {
                    assert!(
                        slots.windows(2).all(|w| w[0] < w[1]),
                        "slots sorted, unique"
                    );
                    assert!(slots.iter().all(|&s| s < fencelock_placement::SLOT_COUNT));
                }
            }
        }
        10 => {
            if let Some(r) = decode::<HotResourcesRequest>(bytes) {
                if let Some(limit) = check(validate::hot_limit(r.limit)) {
                    assert!((1..=validate::MAX_HOT_LIMIT).contains(&limit));
                }
            }
        }
        // The other admin requests carry only ids the operator actions
        // check against the map; decoding them is the whole edge.
        _ => fencelock_fuzz_targets::requests::api_requests(data),
    }
}

/// Name (and corpus directory), function, seeds.
type Target = (&'static str, fn(&[u8]), seeds::Seeds);

#[test]
fn server_side_targets_survive_their_corpus_and_generated_inputs() {
    let targets: [Target; 1] = [("server_requests", server_requests, seeds::api_requests())];
    for (name, run, seeds) in targets {
        let report = smoke::run(name, run, &seeds, ITERATIONS);
        eprintln!(
            "{name}: {} corpus inputs, {} generated, {} ms",
            report.corpus, report.generated, report.millis
        );
    }
}
