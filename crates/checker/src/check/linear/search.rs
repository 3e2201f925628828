//! The Wing–Gong–Lowe search for a linearization, with the state cache that
//! makes it practical (as in Lowe's "Testing for linearizability" and the
//! porcupine checker): a depth-first search over which pending operation
//! takes effect next, pruning any (set of linearized operations, model
//! states) pair already explored.
//!
//! Operations are entries in a doubly linked list ordered by time: a *call*
//! entry at invocation and a *return* entry at completion. Scanning from
//! the head, a call entry may be linearized (taken out of the list with its
//! return entry) if the model allows it; reaching a return entry means the
//! operation it belongs to had to be linearized before this point, so the
//! search backtracks. An operation with unknown outcome has no completion:
//! its return entry sorts after every other, and reaching it means all
//! definite operations are placed (the unknown ones that are left simply
//! never took effect).

use std::collections::HashSet;

use super::model::{step, LockState};
use super::LinOp;

/// What the search found.
#[derive(Debug, PartialEq, Eq)]
pub enum SearchResult {
    Linearizable,
    /// No order exists. `stuck_op` is an operation (index into the input)
    /// that could not be placed at the deepest point the search reached,
    /// after `placed` operations, when the model was in one of `states`.
    NotLinearizable {
        stuck_op: usize,
        placed: usize,
        states: Vec<LockState>,
    },
    /// `max_steps` ran out first.
    GaveUp,
}

struct Entry {
    op: usize,
    is_call: bool,
    /// For a call entry: its return entry.
    partner: usize,
}

pub fn search(ops: &[LinOp], max_steps: u64) -> SearchResult {
    if ops.is_empty() {
        return SearchResult::Linearizable;
    }
    // Entries sorted by time; at equal times calls first, which lets
    // operations that touch at one instant count as concurrent.
    let mut order: Vec<(u64, u8, usize)> = Vec::with_capacity(ops.len() * 2);
    for (i, op) in ops.iter().enumerate() {
        order.push((op.invoke_ns, 0, i));
        order.push((op.complete_ns.unwrap_or(u64::MAX), 1, i));
    }
    order.sort();
    let n = order.len();
    let mut entries: Vec<Entry> = order
        .iter()
        .map(|&(_, kind, op)| Entry {
            op,
            is_call: kind == 0,
            partner: usize::MAX,
        })
        .collect();
    let mut return_of = vec![usize::MAX; ops.len()];
    for (i, e) in entries.iter().enumerate() {
        if !e.is_call {
            return_of[e.op] = i;
        }
    }
    for e in entries.iter_mut() {
        if e.is_call {
            e.partner = return_of[e.op];
        }
    }
    // Linked list with a sentinel head at index n; n also marks the end.
    let head = n;
    let mut next = vec![head; n + 1];
    let mut prev = vec![head; n + 1];
    for i in 0..n {
        next[i] = if i + 1 < n { i + 1 } else { head };
        prev[i] = if i == 0 { head } else { i - 1 };
    }
    next[head] = 0;
    prev[head] = n - 1;
    let unlink = |next: &mut Vec<usize>, prev: &mut Vec<usize>, x: usize| {
        let (p, q) = (prev[x], next[x]);
        next[p] = q;
        prev[q] = p;
    };
    let relink = |next: &mut Vec<usize>, prev: &mut Vec<usize>, x: usize| {
        let (p, q) = (prev[x], next[x]);
        next[p] = x;
        prev[q] = x;
    };

    let words = ops.len().div_ceil(64);
    let mut placed_bits = vec![0u64; words];
    let mut placed = 0usize;
    let mut states = vec![LockState::default()];
    let mut cache: HashSet<(Vec<u64>, Vec<LockState>)> = HashSet::new();
    // (call entry, states before it)
    let mut stack: Vec<(usize, Vec<LockState>)> = Vec::new();
    let mut deepest: Option<(usize, usize, Vec<LockState>)> = None;
    let mut steps = 0u64;
    let mut cur = next[head];
    loop {
        steps += 1;
        if steps > max_steps {
            return SearchResult::GaveUp;
        }
        if cur == head {
            return SearchResult::Linearizable;
        }
        let entry = &entries[cur];
        if !entry.is_call && ops[entry.op].complete_ns.is_none() {
            // Only unknown outcomes remain: they never took effect.
            return SearchResult::Linearizable;
        }
        if entry.is_call {
            let after = step(&states, &ops[entry.op]);
            if !after.is_empty() {
                let (w, b) = (entry.op / 64, 1u64 << (entry.op % 64));
                placed_bits[w] |= b;
                if cache.insert((placed_bits.clone(), after.clone())) {
                    stack.push((cur, std::mem::replace(&mut states, after)));
                    placed += 1;
                    unlink(&mut next, &mut prev, cur);
                    unlink(&mut next, &mut prev, entry.partner);
                    cur = next[head];
                    continue;
                }
                placed_bits[w] &= !b;
            }
            cur = next[cur];
            continue;
        }
        // A return entry of an operation not yet placed: backtrack.
        if deepest.as_ref().is_none_or(|(depth, _, _)| placed > *depth) {
            deepest = Some((placed, entry.op, states.clone()));
        }
        let Some((call, before)) = stack.pop() else {
            let (placed, stuck_op, states) = deepest.expect("set above");
            return SearchResult::NotLinearizable {
                stuck_op,
                placed,
                states,
            };
        };
        let op = entries[call].op;
        relink(&mut next, &mut prev, entries[call].partner);
        relink(&mut next, &mut prev, call);
        placed_bits[op / 64] &= !(1u64 << (op % 64));
        placed -= 1;
        states = before;
        cur = next[call];
    }
}
