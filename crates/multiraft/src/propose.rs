//! Proposing: each shard's queued commands become few Raft entries, stamped
//! with the leader's time.

use fencelock_placement::PlacementCommand;
use fencelock_statemachine::Command;

use crate::apply::respond_err;
use crate::msg::{Caller, Responder};
use crate::store::Store;
use crate::{encode_payload, encode_payload_at_epoch, payload, StoreError};

impl Store {
    /// Proposes each shard's queued commands as few entries.
    pub(crate) fn flush_proposals(&mut self) {
        let max = self.config.raft.max_commands_per_entry as usize;
        let allowance = self.leader_changed_allowance_ms();
        let now = self.time.now();
        let shard_ids: Vec<u64> = self.peers.keys().copied().collect();
        for shard_id in shard_ids {
            let needs_lc = {
                let peer = self.peers.get_mut(&shard_id).expect("listed");
                if peer.awaits_lease_clock()
                    && peer.needs_leader_changed
                    && crate::replica::may_start_lease_clock(peer)
                {
                    crate::replica::start_lease_clock(peer, self.time.as_ref());
                    #[cfg(feature = "simulation")]
                    if self.sim_fault == Some(crate::SimFault::TrustWallClockOnNewLeader) {
                        crate::replica::start_from_wall_clock(peer, self.time.as_ref());
                    }
                }
                // Without a clock (entries of earlier terms not applied
                // yet) the LeaderChanged waits for a later flush.
                peer.is_leader()
                    && peer.clock.is_some()
                    && std::mem::take(&mut peer.needs_leader_changed)
            };
            if needs_lc {
                let id = self.next_proposal_id();
                let peer = self.peers.get_mut(&shard_id).expect("listed");
                let now_ms = peer
                    .clock
                    .expect("LeaderChanged waits for the lease clock")
                    .now_ms(now);
                let cmd = Command::LeaderChanged {
                    clock_offset_allowance_ms: allowance,
                };
                let data = encode_payload(now_ms, std::slice::from_ref(&cmd));
                if peer.raw.propose(id.to_be_bytes().to_vec(), data).is_ok() {
                    peer.leader_changed_at = Some(now);
                    peer.track(id, vec![Responder::None], now);
                }
            }
            let adopt = {
                let peer = self.peers.get_mut(&shard_id).expect("listed");
                // A leader whose lease clock has not started yet keeps it
                // for a later flush (it proposes nothing before its clock).
                if peer.awaits_lease_clock() {
                    None
                } else {
                    peer.epoch_queued.take()
                }
            };
            if let Some((epoch, tx)) = adopt {
                let id = self.next_proposal_id();
                let peer = self.peers.get_mut(&shard_id).expect("listed");
                let responder = Responder::Reply(tx);
                match peer.clock.filter(|_| peer.is_leader()) {
                    None => respond_err(responder, StoreError::LeaderUnknown { shard_id }),
                    Some(clock) => {
                        // A Tick: the entry must carry a command for the
                        // table to apply at the new epoch, and a Tick
                        // changes nothing that is not due anyway.
                        let data =
                            encode_payload_at_epoch(clock.now_ms(now), epoch, &[Command::Tick]);
                        match peer.raw.propose(id.to_be_bytes().to_vec(), data) {
                            Ok(()) => peer.track_commands(id, vec![responder], vec![None], now),
                            Err(_) => {
                                respond_err(responder, StoreError::LeaderUnknown { shard_id })
                            }
                        }
                    }
                }
            }
            let mut refused_cancels = Vec::new();
            loop {
                let peer = self.peers.get_mut(&shard_id).expect("listed");
                // A new leader waits for its lease clock (the entries of
                // earlier terms applied): the commands stay queued, to be
                // stamped by it. Losing leadership instead answers them.
                if peer.queued.is_empty() || peer.awaits_lease_clock() {
                    break;
                }
                let take = peer.queued.len().min(max);
                let chunk: Vec<(Command, Responder, Caller)> = peer.queued.drain(..take).collect();
                let id = self.next_proposal_id();
                let peer = self.peers.get_mut(&shard_id).expect("listed");
                let Some(clock) = peer.clock.filter(|_| peer.is_leader()) else {
                    let hint_err = StoreError::LeaderUnknown { shard_id };
                    for (_, r, _) in chunk {
                        respond_err(r, hint_err.clone());
                    }
                    continue;
                };
                let mut commands = Vec::with_capacity(chunk.len());
                let mut responders = Vec::with_capacity(chunk.len());
                let mut callers = Vec::with_capacity(chunk.len());
                for (command, responder, caller) in chunk {
                    commands.push(command);
                    responders.push(responder);
                    callers.push(caller);
                }
                let is_tick = commands.iter().any(|c| matches!(c, Command::Tick));
                let data = encode_payload(clock.now_ms(now), &commands);
                match peer.raw.propose(id.to_be_bytes().to_vec(), data) {
                    Ok(()) => {
                        if is_tick {
                            peer.tick_in_flight = Some(id);
                        }
                        self.obs.metrics.commands_since_sync += commands.len() as u64;
                        peer.track_commands(id, responders, callers, now);
                    }
                    Err(_) => {
                        // Refused while leading (a leadership transfer in
                        // progress): a cancel for a gone caller is kept for
                        // the next flush; if leadership moves, the next
                        // leader cancels the waiter (`sweep_orphans`).
                        let chunk = commands.into_iter().zip(responders).zip(callers);
                        for ((command, responder), caller) in chunk {
                            match (command, responder) {
                                (command @ Command::Cancel { .. }, Responder::None) => {
                                    refused_cancels.push((command, Responder::None, caller));
                                }
                                (_, r) => respond_err(r, StoreError::LeaderUnknown { shard_id }),
                            }
                        }
                    }
                }
            }
            let peer = self.peers.get_mut(&shard_id).expect("listed");
            peer.queued.append(&mut refused_cancels);
            if peer.meta_queued.is_empty() || peer.awaits_lease_clock() {
                continue;
            }
            let chunk = std::mem::take(&mut peer.meta_queued);
            let (commands, txs): (Vec<PlacementCommand>, Vec<_>) = chunk.into_iter().unzip();
            let responders: Vec<Responder> = txs.into_iter().map(Responder::Meta).collect();
            let Some(clock) = peer.clock.filter(|_| peer.is_leader()) else {
                for r in responders {
                    respond_err(r, StoreError::LeaderUnknown { shard_id });
                }
                continue;
            };
            let data = payload::encode_placement_payload(clock.now_ms(now), &commands);
            let id = self.next_proposal_id();
            let peer = self.peers.get_mut(&shard_id).expect("listed");
            match peer.raw.propose(id.to_be_bytes().to_vec(), data) {
                Ok(()) => peer.track(id, responders, now),
                Err(_) => {
                    for r in responders {
                        respond_err(r, StoreError::LeaderUnknown { shard_id });
                    }
                }
            }
        }
    }
}
