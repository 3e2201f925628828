//! Leader election on a fenced lock (etcd's `v3election`, Curator's
//! LeaderLatch, `consul lock`): candidates queue FIFO on one resource; the
//! holder leads, publishes its value (an address) with the lease, and
//! every write it makes as leader carries the lease's fencing token, so a
//! leader that lost its lease cannot overwrite its successor.
//!
//! | etcd `v3election` | here |
//! |---|---|
//! | `Campaign` | [`Election::campaign`] → a [`LockGuard`] |
//! | `Proclaim` | [`LockGuard::proclaim`] |
//! | `Resign` | [`LockGuard::release`] (or drop it) |
//! | `Leader` | [`Election::leader`] |
//! | `Observe` | [`Election::observe`] (a watch of the resource) |

use fencelock_api::v1::{Revision, WatchEvent};

use crate::client::{AcquireOptions, Client};
use crate::config::MAX_WAIT_TIMEOUT_MS;
use crate::error::ClientError;
use crate::lease::LockGuard;

/// One election: a resource candidates campaign on.
#[derive(Clone)]
pub struct Election {
    client: Client,
    name: String,
}

/// Who leads: the value its lease publishes and its fencing token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leader {
    pub value: Vec<u8>,
    pub fencing_token: i64,
}

impl Client {
    /// The election on resource `name` (`tenant/path`).
    pub fn election(&self, name: impl Into<String>) -> Election {
        Election {
            client: self.clone(),
            name: name.into(),
        }
    }
}

impl Election {
    /// The election's resource.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Waits, in the resource's FIFO queue and for as long as it takes,
    /// until this candidate leads; publishes `value` from then on. The
    /// guard's [`lost`](LockGuard::lost) says when leadership is lost;
    /// [`token`](LockGuard::token) goes with every write made as leader.
    /// Cancel the future to stop campaigning (the wait leaves the queue).
    pub async fn campaign(
        &self,
        value: impl Into<Vec<u8>>,
        lease_ttl_ms: u64,
    ) -> Result<LockGuard, ClientError> {
        let value = value.into();
        loop {
            let options = AcquireOptions {
                lease_ttl_ms,
                wait_timeout_ms: MAX_WAIT_TIMEOUT_MS,
                value: value.clone(),
                ..AcquireOptions::default()
            };
            match self.client.acquire_with(&self.name, options).await {
                // Waited the longest one acquire may: queue again.
                Err(e) if e.is_lock_held() => continue,
                other => return other,
            }
        }
    }

    /// Who leads now (a linearizable read), or `None` between leaders.
    pub async fn leader(&self) -> Result<Option<Leader>, ClientError> {
        let now = self.client.get(&self.name).await?;
        Ok(now.held.then_some(Leader {
            value: now.value,
            fencing_token: now.fencing_token,
        }))
    }

    /// Every change of leadership as it commits: a watch of the resource
    /// ([`Client::watch`]; resume with the last revision received).
    pub async fn observe(
        &self,
        after: Option<Revision>,
    ) -> Result<tonic::Streaming<WatchEvent>, ClientError> {
        self.client.watch(&self.name, after).await
    }
}
