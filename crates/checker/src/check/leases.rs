//! What a history tells about each lease: who got it, with which token, how
//! long it certainly lasted, and when its holder stopped relying on it.

use std::collections::BTreeMap;

use super::CheckConfig;
use crate::history::{Call, History, Mode, Operation, ProcessId};

/// One answer that gave the lease time, as a client following the contract
/// counts it: from the send of the answered call, for the TTL the answer
/// granted. Its stop-by deadline is `sent_ns + ttl_ms`, less a drift margin.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Promise {
    pub sent_ns: u64,
    pub ttl_ms: u64,
}

/// Facts about one granted lease (one lease id).
#[derive(Clone, Debug)]
pub struct LeaseFacts<'h> {
    pub resource: &'h str,
    pub lease_id: &'h str,
    pub token: i64,
    /// How its acquire asked to hold.
    pub mode: Mode,
    pub process: ProcessId,
    /// The first ok acquire that returned this lease.
    pub grant: &'h Operation,
    /// When the logical acquire was first sent: the earliest invocation of
    /// its request id (a re-sent request returns the original grant).
    pub sent_ns: u64,
    /// When a client first learned of the grant.
    pub granted_ns: u64,
    /// Every answer that gave the lease time, in history order. The first
    /// is the logical acquire: its first send plus the TTL asked for (a
    /// fresh grant gives exactly that, counted from its apply, which is
    /// later). Then each ok acquire answer of the lease that states what it
    /// granted (a re-send answered from the dedup table states only what
    /// was left), and each ok renewal with the TTL it answered (the TTL
    /// asked for when the history lacks it).
    pub promises: Vec<Promise>,
    /// The lease cannot have ended on the server before this (client clock),
    /// and its holder relied on it until then: the latest deadline any
    /// promise gave, minus the clock allowance. A client keeps the longest
    /// deadline it was given, so this is its stop-by deadline; if a server
    /// answered more time than the lease had, this reaches past the lease's
    /// real end and the next holder's window overlaps it.
    pub earliest_end_ns: u64,
    /// When the holder stopped relying on the lease: the first release it
    /// sent, or `earliest_end_ns` (its stop-by deadline) if sooner.
    pub window_end_ns: u64,
    /// The first release of this lease, if any.
    pub release: Option<&'h Operation>,
    /// Renewals of this lease, in invocation order.
    pub renews: Vec<&'h Operation>,
}

impl LeaseFacts<'_> {
    /// The holder's validity window starts when it learned of the grant.
    pub fn window_start_ns(&self) -> u64 {
        self.granted_ns
    }

    /// The earliest end as known to calls sent before `before_ns`: the
    /// logical acquire's promise and every later one sent before then (an
    /// answer cannot be explained by a promise made after it was asked).
    pub fn earliest_end_before(&self, config: &CheckConfig, before_ns: u64) -> u64 {
        self.promises
            .iter()
            .enumerate()
            .filter(|(i, p)| *i == 0 || p.sent_ns < before_ns)
            .map(|(_, p)| config.earliest_end_ns(p.sent_ns, p.ttl_ms))
            .max()
            .unwrap_or(0)
    }
}

/// The earliest invocation of every `(resource, request id)`.
pub fn first_sends(history: &History) -> BTreeMap<(&str, &str), u64> {
    let mut sends: BTreeMap<(&str, &str), u64> = BTreeMap::new();
    for op in &history.ops {
        if let Call::Acquire {
            resource,
            request_id,
            ..
        } = &op.call
        {
            let t = sends.entry((resource, request_id)).or_insert(op.invoke_ns);
            *t = (*t).min(op.invoke_ns);
        }
    }
    sends
}

fn promise((sent_ns, ttl_ms): (u64, u64)) -> Promise {
    Promise { sent_ns, ttl_ms }
}

/// Every lease granted in `history`, in order of grant.
pub fn lease_facts<'h>(history: &'h History, config: &CheckConfig) -> Vec<LeaseFacts<'h>> {
    let sends = first_sends(history);
    let mut leases: BTreeMap<(&str, &str), LeaseFacts<'h>> = BTreeMap::new();
    for op in &history.ops {
        let (
            Call::Acquire {
                ttl_ms,
                request_id,
                mode,
                ..
            },
            Some((lease_id, token)),
        ) = (&op.call, op.grant())
        else {
            continue;
        };
        let resource = op.call.resource();
        let sent_ns = sends[&(resource, request_id.as_str())];
        let lease = leases
            .entry((resource, lease_id))
            .or_insert_with(|| LeaseFacts {
                resource,
                lease_id,
                token,
                mode: *mode,
                process: op.process,
                grant: op,
                sent_ns,
                granted_ns: op.complete_ns,
                promises: vec![Promise {
                    sent_ns,
                    ttl_ms: *ttl_ms,
                }],
                earliest_end_ns: 0,
                window_end_ns: 0,
                release: None,
                renews: Vec::new(),
            });
        lease.granted_ns = lease.granted_ns.min(op.complete_ns);
        lease.promises.extend(op.promise().map(promise));
    }
    for op in &history.ops {
        match &op.call {
            Call::Renew {
                resource, lease_id, ..
            } => {
                if let Some(lease) = leases.get_mut(&(resource.as_str(), lease_id.as_str())) {
                    lease.renews.push(op);
                    lease.promises.extend(op.promise().map(promise));
                }
            }
            Call::Release { resource, lease_id } => {
                if let Some(lease) = leases.get_mut(&(resource.as_str(), lease_id.as_str())) {
                    if lease.release.is_none() {
                        lease.release = Some(op);
                    }
                }
            }
            _ => {}
        }
    }
    let mut out: Vec<LeaseFacts<'h>> = leases
        .into_values()
        .map(|mut lease| {
            lease.earliest_end_ns = lease.earliest_end_before(config, u64::MAX);
            lease.window_end_ns = match lease.release {
                Some(release) => release.invoke_ns.min(lease.earliest_end_ns),
                None => lease.earliest_end_ns,
            };
            lease
        })
        .collect();
    out.sort_by_key(|l| (l.granted_ns, l.grant.id));
    out
}
