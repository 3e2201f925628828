//! The fenced resource of the harness: what a protected system looks like
//! to the checkers.
//!
//! Holders write `(resource, token, value)`. The token check itself is the
//! product's [`MemoryFenceStore`] (the library users get); around it this
//! type numbers accepted writes (`seq`, the accept order the fence checker
//! reads) and remembers the last accepted write per resource for reads.
//!
//! [`FenceMode::Unchecked`] is a deliberately broken variant that skips the
//! token check: tests run it to prove the fence checker catches a protected
//! system that does not fence.

use std::collections::BTreeMap;

use fencelock_fencing::{FenceError, FenceStore, MemoryFenceStore};
use tokio::sync::Mutex;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FenceMode {
    /// Reject tokens lower than the highest accepted (correct).
    Checked,
    /// Accept everything (broken on purpose).
    Unchecked,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WriteOutcome {
    Accepted { seq: u64 },
    Rejected { highest: i64 },
}

/// The last accepted write of a resource; `seq` 0 and no value if none.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LastWrite {
    pub token: i64,
    pub value: Option<String>,
    pub seq: u64,
}

pub struct FencedResource {
    mode: FenceMode,
    store: MemoryFenceStore,
    /// Held across the store call so `seq` order is the store's order.
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    next_seq: u64,
    last: BTreeMap<String, LastWrite>,
}

impl FencedResource {
    pub fn new(mode: FenceMode) -> FencedResource {
        FencedResource {
            mode,
            store: MemoryFenceStore::new(),
            state: Mutex::new(State {
                next_seq: 1,
                last: BTreeMap::new(),
            }),
        }
    }

    /// Writes if `token` passes the fence. Invalid arguments are errors,
    /// never counted as accepted or rejected.
    pub async fn write(
        &self,
        resource: &str,
        token: i64,
        value: &str,
    ) -> Result<WriteOutcome, FenceError> {
        let mut state = self.state.lock().await;
        if self.mode == FenceMode::Checked {
            match self.store.write(resource, token, value.as_bytes()).await {
                Ok(()) => {}
                Err(FenceError::StaleToken { highest, .. }) => {
                    return Ok(WriteOutcome::Rejected { highest })
                }
                Err(e) => return Err(e),
            }
        }
        let seq = state.next_seq;
        state.next_seq += 1;
        state.last.insert(
            resource.to_owned(),
            LastWrite {
                token,
                value: Some(value.to_owned()),
                seq,
            },
        );
        Ok(WriteOutcome::Accepted { seq })
    }

    pub async fn read(&self, resource: &str) -> LastWrite {
        let state = self.state.lock().await;
        state.last.get(resource).cloned().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_checked_resource_refuses_41_after_42() {
        let f = FencedResource::new(FenceMode::Checked);
        assert_eq!(
            f.write("t/r", 42, "b").await.unwrap(),
            WriteOutcome::Accepted { seq: 1 }
        );
        assert_eq!(
            f.write("t/r", 41, "a").await.unwrap(),
            WriteOutcome::Rejected { highest: 42 }
        );
        assert_eq!(
            f.write("t/r", 42, "c").await.unwrap(),
            WriteOutcome::Accepted { seq: 2 }
        );
        let last = f.read("t/r").await;
        assert_eq!(
            (last.token, last.value.as_deref(), last.seq),
            (42, Some("c"), 2)
        );
    }

    #[tokio::test]
    async fn the_unchecked_resource_accepts_a_stale_token() {
        let f = FencedResource::new(FenceMode::Unchecked);
        f.write("t/r", 42, "b").await.unwrap();
        assert_eq!(
            f.write("t/r", 41, "a").await.unwrap(),
            WriteOutcome::Accepted { seq: 2 }
        );
    }
}
