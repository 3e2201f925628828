//! What a history tells about each lease: who got it, with which token, how
//! long it certainly lasted, and when its holder stopped relying on it.

use std::collections::BTreeMap;

use super::CheckConfig;
use crate::history::{Call, History, Operation, ProcessId, Reply};

/// Facts about one granted lease (one lease id).
#[derive(Clone, Debug)]
pub struct LeaseFacts<'h> {
    pub resource: &'h str,
    pub lease_id: &'h str,
    pub token: i64,
    pub process: ProcessId,
    /// The first ok acquire that returned this lease.
    pub grant: &'h Operation,
    /// When the logical acquire was first sent: the earliest invocation of
    /// its request id (a re-sent request returns the original grant).
    pub sent_ns: u64,
    /// When a client first learned of the grant.
    pub granted_ns: u64,
    /// The lease cannot have ended on the server before this (client clock):
    /// the latest confirmed grant or renewal send plus its TTL, minus the
    /// clock allowance.
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

/// Every lease granted in `history`, in order of grant.
pub fn lease_facts<'h>(history: &'h History, config: &CheckConfig) -> Vec<LeaseFacts<'h>> {
    let sends = first_sends(history);
    let mut leases: BTreeMap<(&str, &str), LeaseFacts<'h>> = BTreeMap::new();
    for op in &history.ops {
        let (
            Call::Acquire {
                ttl_ms, request_id, ..
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
                process: op.process,
                grant: op,
                sent_ns,
                granted_ns: op.complete_ns,
                earliest_end_ns: config.earliest_end_ns(sent_ns, *ttl_ms),
                window_end_ns: 0,
                release: None,
                renews: Vec::new(),
            });
        lease.granted_ns = lease.granted_ns.min(op.complete_ns);
    }
    for op in &history.ops {
        match &op.call {
            Call::Renew {
                resource,
                lease_id,
                ttl_ms,
            } => {
                if let Some(lease) = leases.get_mut(&(resource.as_str(), lease_id.as_str())) {
                    lease.renews.push(op);
                    if matches!(op.reply(), Some(Reply::Renewed)) {
                        lease.earliest_end_ns = lease
                            .earliest_end_ns
                            .max(config.earliest_end_ns(op.invoke_ns, *ttl_ms));
                    }
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
