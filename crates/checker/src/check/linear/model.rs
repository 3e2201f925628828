//! The lock model the linearizability search runs operations against: one
//! resource, at most one holder, tokens rising with every grant, and lease
//! expiry as a move the service may make on its own once a lease's time is
//! certainly up.
//!
//! The model is nondeterministic (a lease may or may not have expired; an
//! operation with unknown outcome may or may not take effect), so a step
//! maps a *set* of states to the set of all possible next states; an empty
//! set means the operation cannot be linearized there.

use std::collections::BTreeSet;

use super::LinOp;

/// Which lease holds the lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LeaseRef {
    /// A lease some client saw (an interned lease id).
    Known(u32),
    /// A lease granted by the operation with this index whose outcome is
    /// unknown: nobody saw its id, so nobody renews or releases it.
    Unseen(u32),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Holder {
    pub lease: LeaseRef,
    /// 0 while unknown (granted by an unseen lease and not yet read).
    pub token: i64,
    /// The lease cannot end before this (client clock, ns).
    pub earliest_end_ns: u64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LockState {
    pub holder: Option<Holder>,
    /// The highest token of any grant linearized so far (0: none seen).
    pub last_token: i64,
}

/// What an operation did, as the model needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Effect {
    /// Acquire answered with a grant.
    Granted {
        lease: u32,
        token: i64,
        earliest_end_ns: u64,
    },
    /// Acquire refused because the lock was held (not waiting, or the wait
    /// ran out).
    RefusedHeld,
    /// Acquire with unknown outcome: granted an unseen lease, or nothing.
    MaybeGranted {
        op: u32,
        earliest_end_ns: u64,
    },
    Renewed {
        lease: u32,
        earliest_end_ns: u64,
    },
    /// Renew refused with LEASE_NOT_HELD.
    RenewRefused {
        lease: u32,
    },
    MaybeRenewed {
        lease: u32,
        earliest_end_ns: u64,
    },
    Released {
        lease: u32,
        released: bool,
    },
    MaybeReleased {
        lease: u32,
    },
    Read {
        held: bool,
        token: i64,
    },
    /// A definite failure that changed nothing and says nothing.
    Nothing,
}

/// The states `state` may be in just before `op` takes effect: unchanged,
/// or with its lease expired if that lease's time is certainly up by the
/// time `op` completed (an unknown outcome never completes).
fn before(state: &LockState, op: &LinOp) -> impl Iterator<Item = LockState> {
    let expired = match state.holder {
        Some(h) if op.complete_ns.is_none_or(|c| c >= h.earliest_end_ns) => Some(LockState {
            holder: None,
            last_token: state.last_token,
        }),
        _ => None,
    };
    std::iter::once(*state).chain(expired)
}

/// All states after `op` from any state in `states`. For operations with
/// unknown outcome only the branches where it took effect are returned: the
/// search covers "not (yet)" by not linearizing it here.
pub fn step(states: &[LockState], op: &LinOp) -> Vec<LockState> {
    let mut out = BTreeSet::new();
    for state in states {
        for s in before(state, op) {
            apply(&s, &op.effect, &mut out);
        }
    }
    out.into_iter().collect()
}

fn holds(s: &LockState, lease: u32) -> bool {
    matches!(s.holder, Some(h) if h.lease == LeaseRef::Known(lease))
}

fn apply(s: &LockState, effect: &Effect, out: &mut BTreeSet<LockState>) {
    match *effect {
        Effect::Granted {
            lease,
            token,
            earliest_end_ns,
        } => {
            if s.holder.is_none() && token > s.last_token {
                out.insert(LockState {
                    holder: Some(Holder {
                        lease: LeaseRef::Known(lease),
                        token,
                        earliest_end_ns,
                    }),
                    last_token: token,
                });
            }
        }
        Effect::RefusedHeld => {
            if s.holder.is_some() {
                out.insert(*s);
            }
        }
        Effect::MaybeGranted {
            op,
            earliest_end_ns,
        } => {
            if s.holder.is_none() {
                out.insert(LockState {
                    holder: Some(Holder {
                        lease: LeaseRef::Unseen(op),
                        token: 0,
                        earliest_end_ns,
                    }),
                    last_token: s.last_token,
                });
            }
        }
        Effect::Renewed {
            lease,
            earliest_end_ns,
        }
        | Effect::MaybeRenewed {
            lease,
            earliest_end_ns,
        } => {
            if let Some(h) = s.holder.filter(|_| holds(s, lease)) {
                out.insert(LockState {
                    holder: Some(Holder {
                        earliest_end_ns: h.earliest_end_ns.max(earliest_end_ns),
                        ..h
                    }),
                    last_token: s.last_token,
                });
            }
        }
        Effect::RenewRefused { lease } => {
            if !holds(s, lease) {
                out.insert(*s);
            }
        }
        Effect::Released { lease, released } => {
            if holds(s, lease) == released {
                let holder = if released { None } else { s.holder };
                out.insert(LockState {
                    holder,
                    last_token: s.last_token,
                });
            }
        }
        Effect::MaybeReleased { lease } => {
            if holds(s, lease) {
                out.insert(LockState {
                    holder: None,
                    last_token: s.last_token,
                });
            }
        }
        Effect::Read { held, token } => match (s.holder, held) {
            (None, false) => {
                out.insert(*s);
            }
            (Some(h), true) if h.token == token => {
                out.insert(*s);
            }
            // An unseen lease's token shows up: it is the one granted after
            // every token linearized so far.
            (Some(h), true) if h.token == 0 && token > s.last_token => {
                out.insert(LockState {
                    holder: Some(Holder { token, ..h }),
                    last_token: token,
                });
            }
            _ => {}
        },
        Effect::Nothing => {
            out.insert(*s);
        }
    }
}
