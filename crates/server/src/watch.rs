//! The `Watch` RPC's stream: what the store's [`WatchStream`] hands over,
//! in the contract's words (lock.proto `WatchEvent`), and why it ended.

use std::pin::Pin;
use std::task::{Context, Poll};

use fencelock_api::v1::{ErrorDetail, Holding, Reason, Revision, WatchEvent, WatchEventKind};
use fencelock_multiraft::watch::{self, Change, WatchEnd, WatchItem, WatchStream};
use fencelock_statemachine::LeaseEnd;
use tonic::Status;

/// The events of one watch, then the error that ended it.
pub struct WatchEvents {
    inner: WatchStream,
    shard_id: u64,
    done: bool,
}

impl WatchEvents {
    pub fn new(inner: WatchStream, shard_id: u64) -> WatchEvents {
        WatchEvents {
            inner,
            shard_id,
            done: false,
        }
    }
}

impl tokio_stream::Stream for WatchEvents {
    type Item = Result<WatchEvent, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.done {
            return Poll::Ready(None);
        }
        match self.inner.rx.poll_recv(cx) {
            Poll::Ready(Some(item)) => Poll::Ready(Some(Ok(to_wire(item, self.shard_id)))),
            Poll::Ready(None) => {
                self.done = true;
                Poll::Ready(Some(Err(ended(self.inner.end(), self.shard_id))))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

/// The status a watch ends with: each says to watch again from the last
/// revision received.
fn ended(end: WatchEnd, shard_id: u64) -> Status {
    let (reason, message) = match end {
        WatchEnd::TooSlow => (
            Reason::ServerBusy,
            format!(
                "this watcher fell more than {} changes behind; watch again with `after` = the \
                 last revision received",
                watch::WATCH_BUFFER_EVENTS
            ),
        ),
        WatchEnd::Moved => (
            Reason::EpochNotMatch,
            "the resource moved to another shard; watch again with `after` = the last revision \
             received"
                .to_owned(),
        ),
        WatchEnd::Restart | WatchEnd::Open => (
            Reason::ShuttingDown,
            "this replica stopped serving the watch (removed, restored from a snapshot, or its \
             node is stopping); watch again with `after` = the last revision received"
                .to_owned(),
        ),
    };
    ErrorDetail {
        shard_id,
        ..ErrorDetail::new(reason, message)
    }
    .to_status()
}

fn revision(r: watch::Revision) -> Option<Revision> {
    Some(Revision {
        epoch: r.epoch,
        index: r.index,
        seq: r.seq,
    })
}

/// A `WatchRequest.after` as the store's revision.
pub fn revision_from_wire(r: Revision) -> watch::Revision {
    watch::Revision {
        epoch: r.epoch,
        index: r.index,
        seq: r.seq,
    }
}

/// One store item as a wire event.
pub fn to_wire(item: WatchItem, shard_id: u64) -> WatchEvent {
    match item {
        WatchItem::State {
            revision: r,
            view,
            gap,
        } => WatchEvent {
            kind: WatchEventKind::State as i32,
            revision: revision(r),
            held: view.is_some(),
            fencing_token: view.as_ref().map_or(0, |v| v.token.as_i64()),
            value: view
                .as_ref()
                .map_or_else(Vec::new, |v| v.value.as_bytes().to_vec()),
            expires_at_ms: view.as_ref().map_or(0, |v| v.expires_at_ms),
            gap,
            shard_id,
            holders: (view.iter().flat_map(|v| &v.holders))
                .map(|h| Holding {
                    fencing_token: h.token.as_i64(),
                    expires_at_ms: h.expires_at_ms,
                    value: h.value.as_bytes().to_vec(),
                    mode: crate::service::wire_mode(h.mode) as i32,
                })
                .collect(),
        },
        WatchItem::Change(event) => {
            let base = WatchEvent {
                revision: revision(event.revision),
                shard_id,
                ..WatchEvent::default()
            };
            match &event.change {
                Change::Granted {
                    token,
                    expires_at_ms,
                    value,
                } => WatchEvent {
                    kind: WatchEventKind::Granted as i32,
                    held: true,
                    fencing_token: token.as_i64(),
                    value: value.as_bytes().to_vec(),
                    expires_at_ms: *expires_at_ms,
                    ..base
                },
                Change::ValueChanged { token, value } => WatchEvent {
                    kind: WatchEventKind::ValueChanged as i32,
                    held: true,
                    fencing_token: token.as_i64(),
                    value: value.as_bytes().to_vec(),
                    ..base
                },
                Change::Ended { token, ended, held } => WatchEvent {
                    kind: match *ended {
                        LeaseEnd::Released => WatchEventKind::Released,
                        LeaseEnd::Expired => WatchEventKind::Expired,
                        LeaseEnd::Cancelled => WatchEventKind::Cancelled,
                    } as i32,
                    held: *held,
                    fencing_token: token.as_i64(),
                    ..base
                },
            }
        }
    }
}
