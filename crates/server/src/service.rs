//! The public `LockService`: validates requests, hands commands to the store
//! loop, and turns outcomes into responses and typed errors.

use std::collections::BTreeMap;

use fencelock_api::v1::lock_service_server::LockService;
use fencelock_api::v1::{
    renew_result, AcquireRequest, AcquireResponse, GetRequest, GetResponse, LeaseState,
    ReleaseRequest, ReleaseResponse, RenewBatchRequest, RenewBatchResponse, RenewRequest,
    RenewResponse, RenewResult,
};
use fencelock_statemachine::limits::{LEASE_ID_LEN, MAX_RENEW_BATCH};
use fencelock_statemachine::{
    AcquireStatus, Command, LeaseEnd, LeaseId, LockError, RenewItem, Renewed, Reply, RequestId,
    ResourceName,
};
use tokio::sync::oneshot;
use tonic::{Request, Response, Status};

use crate::errors::ServerError;
use crate::shard_map::ShardMap;
use crate::store::{Responder, StoreMsg, StoreSender};

pub struct LockServiceImpl {
    store: StoreSender,
    shards: ShardMap,
    default_lease_ttl_ms: u64,
}

impl LockServiceImpl {
    pub fn new(store: StoreSender, shards: ShardMap, default_lease_ttl_ms: u64) -> Self {
        LockServiceImpl {
            store,
            shards,
            default_lease_ttl_ms,
        }
    }

    fn send(&self, msg: StoreMsg) -> Result<(), ServerError> {
        self.store.try_send(msg).map_err(|e| match e {
            crossbeam_channel::TrySendError::Full(_) => ServerError::ServerBusy,
            crossbeam_channel::TrySendError::Disconnected(_) => ServerError::ShuttingDown,
        })
    }

    async fn propose(&self, shard_id: u64, command: Command) -> Result<Reply, ServerError> {
        let (tx, rx) = oneshot::channel();
        self.send(StoreMsg::Propose {
            shard_id,
            command,
            responder: Responder::Reply(tx),
        })?;
        rx.await.map_err(|_| ServerError::ShuttingDown)?
    }
}

fn resource(name: &str) -> Result<ResourceName, ServerError> {
    ResourceName::parse(name).map_err(|e| ServerError::Lock(LockError::InvalidResource(e)))
}

fn lease_id(bytes: &[u8]) -> Result<LeaseId, ServerError> {
    LeaseId::from_slice(bytes).ok_or_else(|| ServerError::InvalidArgument {
        field: "lease_id",
        reason: format!("must be {LEASE_ID_LEN} bytes, got {}", bytes.len()),
    })
}

fn random_lease_id() -> LeaseId {
    LeaseId(rand::random())
}

fn renewed(r: Renewed) -> RenewResponse {
    RenewResponse {
        expires_at_ms: r.expires_at_ms,
        lease_ttl_ms: r.lease_ttl_ms,
    }
}

#[tonic::async_trait]
impl LockService for LockServiceImpl {
    async fn acquire(
        &self,
        request: Request<AcquireRequest>,
    ) -> Result<Response<AcquireResponse>, Status> {
        let req = request.into_inner();
        let resource = resource(&req.resource)?;
        let request_id = RequestId::new(req.request_id).map_err(ServerError::Lock)?;
        let lease_ttl_ms = if req.lease_ttl_ms == 0 {
            self.default_lease_ttl_ms
        } else {
            req.lease_ttl_ms
        };
        let shard_id = self.shards.shard_of(&resource);
        let (tx, rx) = oneshot::channel();
        self.send(StoreMsg::Propose {
            shard_id,
            command: Command::Acquire {
                resource: resource.clone(),
                request_id,
                lease_id: random_lease_id(),
                lease_ttl_ms,
                wait_timeout_ms: req.wait_timeout_ms,
            },
            responder: Responder::Acquire { resource, tx },
        })?;
        // If this future is dropped (client went away), the store sees the
        // closed channel and removes the waiter through Raft.
        let reply = rx.await.map_err(|_| ServerError::ShuttingDown)??;
        let (token, expires_at_ms, ttl, state) = match reply.status {
            AcquireStatus::Held {
                token,
                expires_at_ms,
                lease_ttl_ms,
            } => (token, expires_at_ms, lease_ttl_ms, LeaseState::Held),
            AcquireStatus::Ended { token, ended } => (
                token,
                0,
                lease_ttl_ms,
                match ended {
                    LeaseEnd::Released => LeaseState::Released,
                    LeaseEnd::Expired => LeaseState::Expired,
                    LeaseEnd::Cancelled => LeaseState::Cancelled,
                },
            ),
            // The store answers waits that ended as errors (finish_acquire).
            AcquireStatus::Queued { .. } | AcquireStatus::WaitEnded(_) => {
                return Err(ServerError::Internal("acquire answered before it ended".into()).into())
            }
        };
        Ok(Response::new(AcquireResponse {
            lease_id: reply.lease_id.0.to_vec(),
            fencing_token: token.as_i64(),
            expires_at_ms,
            lease_ttl_ms: ttl,
            deduplicated: reply.deduplicated,
            lease_state: state as i32,
            shard_id,
            epoch: token.epoch(),
        }))
    }

    async fn renew(
        &self,
        request: Request<RenewRequest>,
    ) -> Result<Response<RenewResponse>, Status> {
        let req = request.into_inner();
        let resource = resource(&req.resource)?;
        let lease_id = lease_id(&req.lease_id)?;
        let shard_id = self.shards.shard_of(&resource);
        match self
            .propose(
                shard_id,
                Command::Renew {
                    resource,
                    lease_id,
                    lease_ttl_ms: req.lease_ttl_ms,
                },
            )
            .await?
        {
            Reply::Renewed(r) => Ok(Response::new(renewed(r))),
            other => Err(ServerError::Internal(format!("unexpected reply {other:?}")).into()),
        }
    }

    async fn renew_batch(
        &self,
        request: Request<RenewBatchRequest>,
    ) -> Result<Response<RenewBatchResponse>, Status> {
        let items = request.into_inner().items;
        if items.len() > MAX_RENEW_BATCH {
            return Err(ServerError::Lock(LockError::BatchTooLarge {
                len: items.len(),
                max: MAX_RENEW_BATCH,
            })
            .into());
        }
        // Invalid items fail alone; valid ones go to their shard as one
        // RenewBatch command per shard.
        let mut results: Vec<Option<Result<RenewResponse, ServerError>>> =
            (0..items.len()).map(|_| None).collect();
        let mut per_shard: BTreeMap<u64, Vec<(usize, RenewItem)>> = BTreeMap::new();
        for (i, item) in items.into_iter().enumerate() {
            let parsed = resource(&item.resource).and_then(|r| Ok((r, lease_id(&item.lease_id)?)));
            match parsed {
                Ok((resource, lease_id)) => per_shard
                    .entry(self.shards.shard_of(&resource))
                    .or_default()
                    .push((
                        i,
                        RenewItem {
                            resource,
                            lease_id,
                            lease_ttl_ms: item.lease_ttl_ms,
                        },
                    )),
                Err(e) => results[i] = Some(Err(e)),
            }
        }
        // Send to every shard first, then collect: the shards work in parallel.
        let mut calls = Vec::new();
        for (shard_id, batch) in per_shard {
            let (positions, items): (Vec<usize>, Vec<RenewItem>) = batch.into_iter().unzip();
            let (tx, rx) = oneshot::channel();
            let sent = self.send(StoreMsg::Propose {
                shard_id,
                command: Command::RenewBatch { items },
                responder: Responder::Reply(tx),
            });
            calls.push((positions, sent.map(|()| rx)));
        }
        for (positions, call) in calls {
            let outcome = match call {
                Ok(rx) => rx.await.unwrap_or(Err(ServerError::ShuttingDown)),
                Err(e) => Err(e),
            };
            match outcome {
                Ok(Reply::RenewedBatch(each)) => {
                    for (pos, r) in positions.into_iter().zip(each) {
                        results[pos] = Some(r.map(renewed).map_err(ServerError::Lock));
                    }
                }
                Ok(other) => {
                    for pos in positions {
                        results[pos] = Some(Err(ServerError::Internal(format!(
                            "unexpected reply {other:?}"
                        ))));
                    }
                }
                Err(e) => {
                    for pos in positions {
                        results[pos] = Some(Err(e.clone()));
                    }
                }
            }
        }
        let results = results
            .into_iter()
            .map(|r| {
                let outcome = match r.expect("every item answered") {
                    Ok(ok) => renew_result::Outcome::Renewed(ok),
                    Err(e) => renew_result::Outcome::Error(e.to_detail()),
                };
                RenewResult {
                    outcome: Some(outcome),
                }
            })
            .collect();
        Ok(Response::new(RenewBatchResponse { results }))
    }

    async fn release(
        &self,
        request: Request<ReleaseRequest>,
    ) -> Result<Response<ReleaseResponse>, Status> {
        let req = request.into_inner();
        let resource = resource(&req.resource)?;
        let lease_id = lease_id(&req.lease_id)?;
        let shard_id = self.shards.shard_of(&resource);
        match self
            .propose(shard_id, Command::Release { resource, lease_id })
            .await?
        {
            Reply::Released { released } => Ok(Response::new(ReleaseResponse { released })),
            other => Err(ServerError::Internal(format!("unexpected reply {other:?}")).into()),
        }
    }

    async fn get(&self, request: Request<GetRequest>) -> Result<Response<GetResponse>, Status> {
        let req = request.into_inner();
        let resource = resource(&req.resource)?;
        let shard_id = self.shards.shard_of(&resource);
        let (tx, rx) = oneshot::channel();
        self.send(StoreMsg::Read {
            shard_id,
            resource,
            tx,
        })?;
        let read = rx.await.map_err(|_| ServerError::ShuttingDown)??;
        let now_ms = crate::store::wall_ms();
        let response = match read.view {
            Some(v) => GetResponse {
                // A lease past its expiry that no command has retired yet is
                // reported as not held: it can no longer be renewed.
                held: v.expires_at_ms > now_ms,
                fencing_token: v.token.as_i64(),
                expires_at_ms: v.expires_at_ms,
                queue_length: v.queue_len,
                last_token: v.token.as_i64(),
                shard_id,
                epoch: read.epoch,
            },
            None => GetResponse {
                shard_id,
                epoch: read.epoch,
                ..Default::default()
            },
        };
        Ok(Response::new(response))
    }
}
