//! The operator status page (`GET /` on the admin port) and what feeds it.
//!
//! * [`view`] — the cluster now, as the admin API reports it (also
//!   `/status.json`);
//! * [`history`] — a bounded ring of cluster samples and the rates and
//!   latencies between them (pure);
//! * [`sampler`] — the task that takes a sample every [`STATUS_SAMPLE_MS`]
//!   from every node's `NodeControl.Status` (I/O);
//! * [`charts`], [`page`] — the HTML and its SVG charts, rendered on the
//!   server (pure).

pub mod charts;
pub mod history;
pub mod page;
pub mod sampler;
pub mod view;

/// How often an open status page swaps in fresh numbers, in milliseconds.
pub const STATUS_REFRESH_MS: u64 = 2_000;
/// How often the sampler looks at the cluster, in milliseconds.
pub const STATUS_SAMPLE_MS: u64 = 2_000;
/// Samples the charts span: 150 × 2 s = the last 5 minutes.
pub const STATUS_HISTORY_SAMPLES: usize = 150;
/// Hot resources the status page lists.
pub const STATUS_HOT_LIMIT: u32 = 10;
