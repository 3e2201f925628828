//! Raising every shard's epoch above a floor (`fencelock admin
//! raise-epochs`): the way back to safe tokens after a cluster is restored
//! from a backup or rebuilt after losing every replica, when its counters
//! would otherwise hand out tokens the protected systems have already seen
//! (docs/operations.md, "Recovery without token reuse").
//!
//! Two steps, each idempotent, so a run cut short is finished by running it
//! again: the map's epoch counter jumps above the floor
//! (`RaiseEpochFloor`), then every data shard whose leader still mints at
//! or below the floor takes a fresh epoch (`AdvanceEpoch`, the step a shard
//! low on token positions takes) and starts it (`NodeApi::adopt_epoch`).
//! What a shard mints is read from its leader, never assumed from the map.

use fencelock_api::v1::Reason;
use fencelock_placement::{PlacementCommand, PlacementError, META_SHARD_ID};
use fencelock_statemachine::FencingToken;

use crate::error::{ControllerError, Result};
use crate::nodes::NodeApi;
use crate::ops::Ops;

/// The epoch of a token a protected system has seen.
pub fn epoch_of_token(token: i64) -> Result<u64> {
    let Ok(value @ 1..) = u64::try_from(token) else {
        return Err(ControllerError::InvalidArgument {
            field: "above_token",
            reason: format!("{token} is not a fencing token (tokens are positive)"),
        });
    };
    Ok(FencingToken::from_u64(value).epoch())
}

/// What a raise did: the data shards and the epoch each mints at now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Raised {
    pub shards: Vec<(u64, u64)>,
    pub map_version: u64,
}

impl<N: NodeApi> Ops<N> {
    /// Makes every data shard mint at an epoch above `above_epoch`; see the
    /// module docs. Refused while a migration is open or a shard keeps an
    /// export of one (finish it first: its epochs lie below the floor).
    pub async fn raise_epochs(&self, above_epoch: u64) -> Result<Raised> {
        self.propose_meta(PlacementCommand::RaiseEpochFloor { above_epoch })
            .await?;
        let map = self.fresh_map().await?;
        let mut raised = Raised::default();
        let shard_ids: Vec<u64> = map
            .shards()
            .map(|s| s.shard_id)
            .filter(|&id| id != META_SHARD_ID)
            .collect();
        for shard_id in shard_ids {
            let (_, status) = self.leader(shard_id).await?;
            if let Some(&migration_id) = status.pending_exports.first() {
                return Err(PlacementError::MigrationInProgress { migration_id }.into());
            }
            if status.epoch > above_epoch {
                raised.shards.push((shard_id, status.epoch));
                continue;
            }
            let advanced = self
                .propose_meta(PlacementCommand::AdvanceEpoch { shard_id })
                .await?;
            let epoch = advanced.epoch;
            debug_assert!(epoch > above_epoch, "the floor holds for every hand-out");
            self.adopt(shard_id, epoch).await?;
            raised.shards.push((shard_id, epoch));
        }
        raised.map_version = self.fresh_map().await?.version();
        Ok(raised)
    }

    /// Has the leader of `shard_id` start `epoch`, following leadership
    /// while it moves; done once the leader's status reports it.
    async fn adopt(&self, shard_id: u64, epoch: u64) -> Result<()> {
        let mut last = None;
        for _ in 0..25 {
            let (leader, status) = self.leader(shard_id).await?;
            if status.epoch >= epoch {
                return Ok(());
            }
            match self.nodes().adopt_epoch(leader, shard_id, epoch).await {
                // Applied; the leader publishes its status a tick later.
                // Waiting for it keeps a second run from spending another
                // epoch on a shard that already took this one.
                Ok(()) => {}
                // EPOCH_NOT_MATCH: the leader's map lags the hand-out.
                Err(e) if e.is_retriable() || e.reason() == Reason::EpochNotMatch => last = Some(e),
                Err(e) => return Err(e),
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
        Err(last.unwrap_or_else(|| ControllerError::StepTimedOut {
            what: format!("shard {shard_id} starting epoch {epoch}"),
            within: std::time::Duration::from_secs(5),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tokens_epoch_is_its_high_bits_and_only_positive_tokens_have_one() {
        let token = FencingToken::new(777, 12_345);
        assert_eq!(epoch_of_token(token.as_i64()).unwrap(), 777);
        assert!(epoch_of_token(0).is_err());
        assert!(epoch_of_token(-5).is_err());
    }
}
