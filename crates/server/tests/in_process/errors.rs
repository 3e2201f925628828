//! Every `ServerError` and every `LockError` maps to the reason, gRPC code,
//! retry advice and hint fields of the error contract (`errors.proto`), as
//! a client reads them back from the status.

use fencelock_api::status::{code_for, default_retry};
use fencelock_api::v1::{ErrorDetail, LeaderHint, Reason, RetryPolicy};
use fencelock_server::config::ConfigError;
use fencelock_server::errors::*;
use fencelock_statemachine::{LockError, NameError};
use tonic::Code;

/// Converts like the gRPC layer does and reads the detail back like a
/// client does. Checks what holds for every error: the code matches the
/// reason, the status message starts with the reason's name, the detail's
/// message is the error's text.
fn wire(error: ServerError) -> (Code, ErrorDetail) {
    let text = error.to_string();
    let reason = error.reason();
    let expected_detail = error.to_detail();
    let status: tonic::Status = error.into();
    let detail = ErrorDetail::from_status(&status).expect("the status carries an ErrorDetail");
    assert_eq!(detail, expected_detail);
    assert_eq!(detail.reason(), reason);
    assert_eq!(status.code(), code_for(reason));
    let name = reason.as_str_name().strip_prefix("REASON_").unwrap();
    assert_eq!(status.message(), format!("{name}: {text}"));
    assert_eq!(detail.message, text);
    (status.code(), detail)
}

fn lock(error: LockError) -> (Code, ErrorDetail) {
    wire(ServerError::Lock(error))
}

/// The fields that are not set must stay at their "not applicable" zero.
fn assert_only(detail: &ErrorDetail, expected: ErrorDetail) {
    let normalized = ErrorDetail {
        message: detail.message.clone(),
        ..expected
    };
    assert_eq!(detail, &normalized);
}

fn base(reason: Reason) -> ErrorDetail {
    ErrorDetail::new(reason, "")
}

// ---- LockError ------------------------------------------------------------

#[test]
fn invalid_resource() {
    let (code, d) = lock(LockError::InvalidResource(NameError::MissingTenant));
    assert_eq!(code, Code::InvalidArgument);
    assert_eq!(d.retry(), RetryPolicy::Never);
    assert_only(
        &d,
        ErrorDetail {
            field: "resource".into(),
            ..base(Reason::InvalidResource)
        },
    );
}

#[test]
fn invalid_request_id() {
    let (code, d) = lock(LockError::InvalidRequestId { len: 65, max: 64 });
    assert_eq!(code, Code::InvalidArgument);
    assert_only(
        &d,
        ErrorDetail {
            field: "request_id".into(),
            min_allowed: 1,
            max_allowed: 64,
            ..base(Reason::InvalidRequestId)
        },
    );
}

#[test]
fn ttl_out_of_range() {
    let (code, d) = lock(LockError::TtlOutOfRange {
        ttl_ms: 5,
        min_ms: 1_000,
        max_ms: 600_000,
    });
    assert_eq!(code, Code::InvalidArgument);
    assert_only(
        &d,
        ErrorDetail {
            field: "lease_ttl_ms".into(),
            min_allowed: 1_000,
            max_allowed: 600_000,
            ..base(Reason::TtlOutOfRange)
        },
    );
}

#[test]
fn wait_timeout_out_of_range() {
    let (code, d) = lock(LockError::WaitTimeoutOutOfRange {
        wait_timeout_ms: 400_000,
        max_ms: 300_000,
    });
    assert_eq!(code, Code::InvalidArgument);
    assert_only(
        &d,
        ErrorDetail {
            field: "wait_timeout_ms".into(),
            max_allowed: 300_000,
            ..base(Reason::WaitTimeoutOutOfRange)
        },
    );
}

#[test]
fn batch_too_large() {
    let (code, d) = lock(LockError::BatchTooLarge {
        len: 2_000,
        max: 1_024,
    });
    assert_eq!(code, Code::InvalidArgument);
    assert_only(
        &d,
        ErrorDetail {
            field: "items".into(),
            max_allowed: 1_024,
            ..base(Reason::BatchTooLarge)
        },
    );
}

#[test]
fn lock_held() {
    let (code, d) = lock(LockError::LockHeld {
        holder_expires_at_ms: 1_700_000_030_000,
        queue_len: 4,
    });
    assert_eq!(code, Code::Aborted);
    assert_eq!(d.retry(), RetryPolicy::Backoff);
    assert_only(
        &d,
        ErrorDetail {
            holder_expires_at_ms: 1_700_000_030_000,
            queue_length: 4,
            ..base(Reason::LockHeld)
        },
    );
}

#[test]
fn queue_full() {
    let (code, d) = lock(LockError::QueueFull { limit: 1_024 });
    assert_eq!(code, Code::ResourceExhausted);
    assert_only(
        &d,
        ErrorDetail {
            max_allowed: 1_024,
            ..base(Reason::QueueFull)
        },
    );
}

#[test]
fn tenant_waiters_exceeded() {
    let (code, d) = lock(LockError::TenantWaitersExceeded { limit: 10_000 });
    assert_eq!(code, Code::ResourceExhausted);
    assert_only(
        &d,
        ErrorDetail {
            max_allowed: 10_000,
            ..base(Reason::TenantWaitersExceeded)
        },
    );
}

#[test]
fn dedup_table_full() {
    let (code, d) = lock(LockError::DedupTableFull { limit: 1_000_000 });
    assert_eq!(code, Code::ResourceExhausted);
    assert_only(
        &d,
        ErrorDetail {
            max_allowed: 1_000_000,
            ..base(Reason::DedupTableFull)
        },
    );
}

#[test]
fn table_full() {
    let (code, d) = lock(LockError::TableFull { limit: 500 });
    assert_eq!(code, Code::ResourceExhausted);
    assert_only(
        &d,
        ErrorDetail {
            max_allowed: 500,
            ..base(Reason::TableFull)
        },
    );
}

#[test]
fn request_id_reused() {
    let (code, d) = lock(LockError::RequestIdReused {
        original_ttl_ms: 30_000,
    });
    assert_eq!(code, Code::InvalidArgument);
    assert_eq!(d.retry(), RetryPolicy::Never);
    assert_only(
        &d,
        ErrorDetail {
            field: "request_id".into(),
            ..base(Reason::RequestIdReused)
        },
    );
}

#[test]
fn lease_not_held() {
    let (code, d) = lock(LockError::LeaseNotHeld);
    assert_eq!(code, Code::FailedPrecondition);
    assert_eq!(d.retry(), RetryPolicy::Never);
    assert_only(&d, base(Reason::LeaseNotHeld));
}

#[test]
fn lease_id_collision() {
    let (code, d) = lock(LockError::LeaseIdCollision);
    assert_eq!(code, Code::Aborted);
    assert_eq!(d.retry(), RetryPolicy::Immediately);
    assert_only(&d, base(Reason::LeaseIdCollision));
}

#[test]
fn hold_limit_reached() {
    let (code, d) = lock(LockError::HoldLimitReached {
        max_hold_ms: 86_400_000,
        granted_at_ms: 1_700_000_000_000,
    });
    assert_eq!(code, Code::FailedPrecondition);
    assert_only(
        &d,
        ErrorDetail {
            max_allowed: 86_400_000,
            ..base(Reason::HoldLimitReached)
        },
    );
}

#[test]
fn token_space_exhausted() {
    let (code, d) = lock(LockError::TokenSpaceExhausted { epoch: 7 });
    assert_eq!(code, Code::Unavailable);
    assert_eq!(d.retry(), RetryPolicy::Backoff);
    assert_only(
        &d,
        ErrorDetail {
            current_epoch: 7,
            retry_after_ms: TOKEN_SPACE_RETRY_AFTER_MS,
            ..base(Reason::TokenSpaceExhausted)
        },
    );
}

#[test]
fn lock_leader_not_ready() {
    let (code, d) = lock(LockError::LeaderNotReady {
        entry_term: 4,
        leader_term: 3,
    });
    assert_eq!(code, Code::Unavailable);
    assert_eq!(d.retry(), RetryPolicy::Backoff);
    assert_only(
        &d,
        ErrorDetail {
            retry_after_ms: LEADER_NOT_READY_RETRY_AFTER_MS,
            ..base(Reason::LeaderNotReady)
        },
    );
}

#[test]
fn stale_epoch_is_epoch_not_match_with_the_current_epoch() {
    let (code, d) = lock(LockError::StaleEpoch {
        entry_epoch: 3,
        current_epoch: 5,
    });
    assert_eq!(code, Code::Aborted);
    assert_eq!(d.retry(), RetryPolicy::Immediately);
    assert_only(
        &d,
        ErrorDetail {
            current_epoch: 5,
            ..base(Reason::EpochNotMatch)
        },
    );
}

#[test]
fn invalid_command_is_internal() {
    let (code, d) = lock(LockError::InvalidCommand {
        reason: "allowance too large",
    });
    assert_eq!(code, Code::Internal);
    assert_only(
        &d,
        ErrorDetail {
            retry_after_ms: INTERNAL_RETRY_AFTER_MS,
            ..base(Reason::Internal)
        },
    );
}

// ---- ServerError ----------------------------------------------------------

#[test]
fn not_leader_names_the_leader() {
    let (code, d) = wire(ServerError::NotLeader {
        shard_id: 5,
        leader: Some(LeaderInfo {
            node_id: 2,
            addr: "10.0.0.2:7001".into(),
        }),
    });
    assert_eq!(code, Code::Unavailable);
    assert_eq!(d.retry(), RetryPolicy::Immediately);
    assert_only(
        &d,
        ErrorDetail {
            shard_id: 5,
            leader: Some(LeaderHint {
                node_id: 2,
                address: "10.0.0.2:7001".into(),
            }),
            ..base(Reason::NotLeader)
        },
    );
    assert!(d.message.contains("10.0.0.2:7001"), "{}", d.message);
}

#[test]
fn not_leader_without_a_hint_backs_off() {
    let (code, d) = wire(ServerError::NotLeader {
        shard_id: 5,
        leader: None,
    });
    assert_eq!(code, Code::Unavailable);
    assert_only(
        &d,
        ErrorDetail {
            shard_id: 5,
            retry: RetryPolicy::Backoff as i32,
            retry_after_ms: LEADER_UNKNOWN_RETRY_AFTER_MS,
            ..base(Reason::NotLeader)
        },
    );
}

#[test]
fn leader_unknown() {
    let (code, d) = wire(ServerError::LeaderUnknown { shard_id: 3 });
    assert_eq!(code, Code::Unavailable);
    assert_eq!(d.retry(), RetryPolicy::Backoff);
    assert_only(
        &d,
        ErrorDetail {
            shard_id: 3,
            retry_after_ms: LEADER_UNKNOWN_RETRY_AFTER_MS,
            ..base(Reason::LeaderUnknown)
        },
    );
}

#[test]
fn leader_not_ready() {
    let (code, d) = wire(ServerError::LeaderNotReady { shard_id: 3 });
    assert_eq!(code, Code::Unavailable);
    assert_only(
        &d,
        ErrorDetail {
            shard_id: 3,
            retry_after_ms: LEADER_NOT_READY_RETRY_AFTER_MS,
            ..base(Reason::LeaderNotReady)
        },
    );
}

#[test]
fn outcome_unknown() {
    let (code, d) = wire(ServerError::OutcomeUnknown { shard_id: 8 });
    assert_eq!(code, Code::Unavailable);
    assert_eq!(d.retry(), RetryPolicy::Immediately);
    assert_only(
        &d,
        ErrorDetail {
            shard_id: 8,
            ..base(Reason::OutcomeUnknown)
        },
    );
}

#[test]
fn no_quorum() {
    let (code, d) = wire(ServerError::NoQuorum { shard_id: 1 });
    assert_eq!(code, Code::Unavailable);
    assert_eq!(d.retry(), RetryPolicy::Backoff);
    assert_only(
        &d,
        ErrorDetail {
            shard_id: 1,
            retry_after_ms: NO_QUORUM_RETRY_AFTER_MS,
            ..base(Reason::NoQuorum)
        },
    );
}

#[test]
fn server_busy() {
    let (code, d) = wire(ServerError::ServerBusy);
    assert_eq!(code, Code::Unavailable);
    assert_eq!(d.retry(), RetryPolicy::Backoff);
    assert_only(
        &d,
        ErrorDetail {
            retry_after_ms: SERVER_BUSY_RETRY_AFTER_MS,
            ..base(Reason::ServerBusy)
        },
    );
}

#[test]
fn shutting_down() {
    let (code, d) = wire(ServerError::ShuttingDown);
    assert_eq!(code, Code::Unavailable);
    assert_eq!(d.retry(), RetryPolicy::Backoff);
    assert_only(&d, base(Reason::ShuttingDown));
}

#[test]
fn invalid_argument_picks_the_reason_by_field() {
    let cases = [
        ("resource", Reason::InvalidResource),
        ("request_id", Reason::InvalidRequestId),
        ("lease_id", Reason::InvalidLeaseId),
        ("items.lease_id", Reason::InvalidLeaseId),
        ("items[3].resource", Reason::InvalidResource),
        ("lease_ttl_ms", Reason::TtlOutOfRange),
        ("wait_timeout_ms", Reason::WaitTimeoutOutOfRange),
        ("items", Reason::BatchTooLarge),
        ("shard_id", Reason::InvalidAdminRequest),
        ("node_id", Reason::InvalidAdminRequest),
    ];
    for (field, reason) in cases {
        let (code, d) = wire(ServerError::InvalidArgument {
            field,
            reason: "must be 16 bytes".into(),
        });
        assert_eq!(code, Code::InvalidArgument, "{field}");
        assert_eq!(d.retry(), RetryPolicy::Never, "{field}");
        assert_only(
            &d,
            ErrorDetail {
                field: field.into(),
                ..base(reason)
            },
        );
        assert!(d.message.contains(field), "{}", d.message);
    }
}

#[test]
fn wait_timed_out() {
    let (code, d) = wire(ServerError::WaitTimedOut);
    assert_eq!(code, Code::Aborted);
    assert_eq!(d.retry(), RetryPolicy::Backoff);
    assert_only(&d, base(Reason::WaitTimedOut));
}

#[test]
fn wait_cancelled() {
    let (code, d) = wire(ServerError::WaitCancelled);
    assert_eq!(code, Code::Cancelled);
    assert_eq!(d.retry(), RetryPolicy::Never);
    assert_only(&d, base(Reason::WaitCancelled));
}

#[test]
fn storage_is_internal() {
    let (code, d) = wire(ServerError::Storage("rocksdb: disk full".into()));
    assert_eq!(code, Code::Internal);
    assert_eq!(d.retry(), RetryPolicy::Backoff);
    assert!(d.message.contains("disk full"), "{}", d.message);
    assert_only(
        &d,
        ErrorDetail {
            retry_after_ms: INTERNAL_RETRY_AFTER_MS,
            ..base(Reason::Internal)
        },
    );
}

#[test]
fn config_is_internal() {
    let error = ConfigError::Invalid {
        key: "raft.election_ticks".into(),
        reason: "must be in 5..=100, got 3".into(),
    };
    let (code, d) = wire(ServerError::Config(error));
    assert_eq!(code, Code::Internal);
    assert!(d.message.contains("raft.election_ticks"), "{}", d.message);
    assert_only(
        &d,
        ErrorDetail {
            retry_after_ms: INTERNAL_RETRY_AFTER_MS,
            ..base(Reason::Internal)
        },
    );
}

#[test]
fn internal() {
    let (code, d) = wire(ServerError::Internal("unexpected reply".into()));
    assert_eq!(code, Code::Internal);
    assert_only(
        &d,
        ErrorDetail {
            retry_after_ms: INTERNAL_RETRY_AFTER_MS,
            ..base(Reason::Internal)
        },
    );
}

// ---- Across all ---------------------------------------------------------------

#[test]
fn explicit_retry_advice_differs_from_the_default_only_where_meant() {
    // Only NOT_LEADER without a hint overrides the reason's default policy;
    // everything else sends the documented default.
    let errors = [
        ServerError::Lock(LockError::LockHeld {
            holder_expires_at_ms: 1,
            queue_len: 0,
        }),
        ServerError::Lock(LockError::StaleEpoch {
            entry_epoch: 1,
            current_epoch: 2,
        }),
        ServerError::LeaderUnknown { shard_id: 1 },
        ServerError::ServerBusy,
        ServerError::ShuttingDown,
        ServerError::OutcomeUnknown { shard_id: 1 },
        ServerError::Internal(String::new()),
    ];
    for error in errors {
        let d = error.to_detail();
        assert_eq!(d.retry(), default_retry(d.reason()), "{error:?}");
    }
}

#[test]
fn a_lock_error_converts_with_question_mark() {
    fn refuse() -> Result<(), ServerError> {
        Err(LockError::LeaseNotHeld)?
    }
    let status: tonic::Status = refuse().unwrap_err().into();
    assert_eq!(status.code(), Code::FailedPrecondition);
}

#[test]
fn the_caller_can_add_the_shard_to_a_lock_error() {
    let error = ServerError::Lock(LockError::LockHeld {
        holder_expires_at_ms: 9,
        queue_len: 1,
    });
    let detail = ErrorDetail {
        shard_id: 4,
        ..error.to_detail()
    };
    let back = ErrorDetail::from_status(&detail.to_status()).unwrap();
    assert_eq!(back.shard_id, 4);
    assert_eq!(back.holder_expires_at_ms, 9);
}

/// The deterministic simulation reads the store's errors through
/// `StoreError::to_detail` (it does not build the server): the node must
/// answer every store error exactly so, or the simulation checks a
/// different contract from the one clients see.
#[test]
fn the_node_answers_every_store_error_as_the_store_maps_it() {
    use fencelock_placement::PlacementError;
    use fencelock_server::router::LeaderInfo;
    use fencelock_server::store::StoreError;

    let samples = [
        StoreError::Lock(LockError::LeaseNotHeld),
        StoreError::Lock(LockError::QueueFull { limit: 7 }),
        StoreError::NotLeader {
            shard_id: 3,
            leader: Some(LeaderInfo {
                node_id: 2,
                addr: "10.0.0.2:7000".to_owned(),
            }),
        },
        StoreError::NotLeader {
            shard_id: 3,
            leader: None,
        },
        StoreError::LeaderUnknown { shard_id: 4 },
        StoreError::LeaderNotReady { shard_id: 4 },
        StoreError::OutcomeUnknown { shard_id: 5 },
        StoreError::NoQuorum { shard_id: 6 },
        StoreError::ShuttingDown,
        StoreError::InvalidArgument {
            field: "lease_ttl_ms",
            reason: "too long".to_owned(),
        },
        StoreError::WaitTimedOut,
        StoreError::WaitCancelled,
        StoreError::Storage("disk".to_owned()),
        StoreError::Internal("bug".to_owned()),
        StoreError::ShardNotHere { shard_id: 9 },
        StoreError::Placement(PlacementError::UnknownShard { shard_id: 9 }),
    ];
    for store in samples {
        let node = ServerError::from(store.clone());
        assert_eq!(node.reason(), store.reason(), "{store:?}");
        assert_eq!(node.to_detail(), store.to_detail(), "{store:?}");
        assert_eq!(node.to_string(), store.to_string(), "{store:?}");
    }
}
