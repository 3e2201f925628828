//! The peer transport: Raft messages of every shard between fencelock nodes.
//!
//! This module owns both ends of the internal `RaftTransport` protocol
//! (`proto/fencelock/internal/raft.proto`):
//!
//! - [`Transport`], the sending side. The store loop (a plain thread) hands
//!   it the messages of one `Ready` with [`Transport::send`], which never
//!   blocks: it puts the messages on
//!   the destination peer's bounded queue. One task per peer owns one
//!   long-lived client-streaming call to that peer and sends everything
//!   queued at that moment as one `RaftBatch`, so under load many Raft
//!   messages share one gRPC frame, and when idle a message leaves at once.
//! - [`RaftService`], the receiving side: decodes each batch and passes the
//!   messages to a callback (the store's inbox).
//!
//! Delivery is best effort, which is all Raft needs: a full queue, an
//! unreachable peer, a broken stream or a fault rule drops messages, and
//! Raft retransmits. Drops are counted ([`Transport::dropped_total`]), never
//! retried here: a retried message would only be staler than the one Raft
//! sends next.

use std::collections::BTreeMap;
use std::fmt;
#[cfg(feature = "fault-rules")]
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use protobuf::Message as _;
use raft::prelude::Message as RaftMessage;
use rand::Rng as _;
use tokio::runtime::Handle;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Endpoint;
use tonic::{Request, Response, Status, Streaming};

use fencelock_api::internal::raft_transport_client::RaftTransportClient;
use fencelock_api::internal::raft_transport_server::{self, RaftTransportServer};
use fencelock_api::internal::{RaftBatch, RaftEnvelope, StreamAck};
#[cfg(feature = "fault-rules")]
pub mod netfilter;
pub mod tls;

#[cfg(feature = "fault-rules")]
use crate::netfilter::{NetworkRules, Verdict};
/// The store owns the message type and the sink trait the transport implements.
pub use fencelock_multiraft::{Envelope, PeerSink};

/// Most messages the sender puts in one `RaftBatch`. Bounds the work and
/// memory of one frame; under a burst the rest simply go in the next one.
pub const MAX_BATCH_MESSAGES: usize = 4096;

/// Encoded size at which the sender closes a `RaftBatch` and starts the next.
/// A single larger message (a snapshot) still travels, alone in its batch.
pub const MAX_BATCH_BYTES: usize = 4 * 1024 * 1024;

/// Largest encoded `RaftBatch` the receiver accepts (the gRPC decoding
/// limit). Sized for Raft snapshots, which travel as one message; the
/// stream ends with an error if a peer exceeds it.
pub const MAX_INBOUND_BATCH_BYTES: usize = 64 * 1024 * 1024;

/// Most messages the receiver accepts in one batch; a larger batch is
/// dropped whole and counted. Twice the sender's cap, so a peer running a
/// version with a larger cap still gets through.
pub const MAX_INBOUND_BATCH_MESSAGES: usize = 2 * MAX_BATCH_MESSAGES;

/// Room left in [`MAX_INBOUND_BATCH_BYTES`] for the batch's own fields and
/// the envelope framing (tags, lengths, `from_node`, `shard_id`: a few dozen
/// bytes; rounded up generously).
const BATCH_FRAMING_BYTES: usize = 1024;

/// Largest encoded Raft message the sender accepts. Anything larger could
/// never be received (it would exceed [`MAX_INBOUND_BATCH_BYTES`] and break
/// the stream for everyone), so it is dropped and counted at the sender.
const MAX_MESSAGE_BYTES: usize = MAX_INBOUND_BATCH_BYTES - BATCH_FRAMING_BYTES;

/// Batches handed to the gRPC stream but not yet written to the socket.
/// Small on purpose: when the connection is slower than the store, messages
/// wait in the peer queue, where the next batch picks all of them up, and
/// the queue's bound turns overload into counted drops instead of memory.
const STREAM_BUFFER_BATCHES: usize = 2;

/// First pause before reconnecting to a peer after a failure.
const INITIAL_RECONNECT_BACKOFF: Duration = Duration::from_millis(20);

/// Longest pause between reconnect attempts. Also bounds how long a
/// restarted peer waits to hear from us: well under the seconds a Raft
/// group tolerates before electing around a silent peer matters.
const MAX_RECONNECT_BACKOFF: Duration = Duration::from_secs(1);

/// A stream that stayed up this long counts as healthy: the next failure
/// starts the backoff from [`INITIAL_RECONNECT_BACKOFF`] again. Without it, a
/// peer that accepts connections and then fails every stream would be
/// hammered at the initial rate.
const HEALTHY_STREAM_AGE: Duration = MAX_RECONNECT_BACKOFF;

/// Limit on opening the TCP connection to a peer, so a black-holed address
/// fails into the backoff instead of hanging.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// HTTP/2 ping interval on peer connections. The stream stays open forever,
/// so only pings notice a peer that vanished without closing the socket.
const HTTP2_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);

/// How long a ping may stay unanswered before the connection is declared
/// dead and the stream reconnects.
const HTTP2_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(5);

/// Most messages waiting out a fault rule's delay at once, over all peers.
/// Each one holds a timer; beyond this, delayed messages are dropped.
#[cfg(feature = "fault-rules")]
const MAX_DELAYED_MESSAGES: usize = 65_536;

/// The callback [`RaftService`] hands inbound messages to: the sending node
/// id and the decoded messages of one batch, in order.
pub type InboundFn = Arc<dyn Fn(u64, Vec<Envelope>) + Send + Sync>;

/// State shared by [`Transport`], its peer tasks and its delay timers.
#[derive(Debug, Default)]
struct Shared {
    /// Set by [`Transport::shutdown`]; later sends are dropped.
    stopped: AtomicBool,
    /// Messages dropped for any reason before reaching a stream.
    dropped_total: AtomicU64,
    /// `RaftBatch` frames handed to a stream.
    batches_sent_total: AtomicU64,
    /// Messages handed to a stream, over all batches.
    messages_sent_total: AtomicU64,
    /// Messages currently waiting out a delay rule.
    #[cfg(feature = "fault-rules")]
    delayed_in_flight: AtomicUsize,
}

impl Shared {
    fn count_dropped(&self, messages: usize) {
        self.dropped_total
            .fetch_add(messages as u64, Ordering::Relaxed);
    }
}

/// The sending side of the peer transport; see the module documentation.
pub struct Transport {
    self_id: u64,
    /// Test builds only (feature `fault-rules`): what the network does to
    /// each message. Absent from production builds, so the send path there
    /// has no fault code on it at all.
    #[cfg(feature = "fault-rules")]
    rules: Arc<NetworkRules>,
    runtime: Handle,
    /// The queue of each known peer, drained by that peer's task. Grows
    /// when the placement map learns a new node ([`Transport::add_peer`]).
    queues: std::sync::RwLock<BTreeMap<u64, mpsc::Sender<Envelope>>>,
    queue_depth: usize,
    /// The peer tasks, aborted on shutdown.
    tasks: Mutex<Vec<JoinHandle<()>>>,
    shared: Arc<Shared>,
    /// How peers are dialed: mutual TLS with the node's certificate, or
    /// plaintext in insecure mode.
    tls: crate::tls::PeerTls,
}

impl fmt::Debug for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Transport")
            .field("self_id", &self.self_id)
            .field(
                "peers",
                &self
                    .queues
                    .read()
                    .map(|q| q.keys().copied().collect::<Vec<_>>())
                    .unwrap_or_default(),
            )
            .field("shared", &self.shared)
            .finish_non_exhaustive()
    }
}

impl Transport {
    /// Starts one sending task per peer on `runtime`.
    ///
    /// `peers` maps node ids to `host:port`; an entry for `self_id` is
    /// ignored. Each peer gets a queue of `queue_depth` messages. A peer
    /// whose address is not a valid URI authority is logged and treated as
    /// unknown: everything sent to it is dropped and counted.
    ///
    /// # Panics
    /// If `queue_depth` is zero.
    pub fn new(
        self_id: u64,
        peers: BTreeMap<u64, String>,
        queue_depth: usize,
        runtime: Handle,
    ) -> Transport {
        Self::with_tls(
            self_id,
            peers,
            queue_depth,
            runtime,
            crate::tls::PeerTls::insecure(),
        )
    }

    /// [`Transport::new`] dialing peers with `tls`.
    pub fn with_tls(
        self_id: u64,
        peers: BTreeMap<u64, String>,
        queue_depth: usize,
        runtime: Handle,
        tls: crate::tls::PeerTls,
    ) -> Transport {
        assert!(queue_depth > 0, "peer queue depth must be positive");
        let transport = Transport {
            self_id,
            #[cfg(feature = "fault-rules")]
            rules: Arc::new(NetworkRules::default()),
            runtime,
            queues: std::sync::RwLock::new(BTreeMap::new()),
            queue_depth,
            tasks: Mutex::new(Vec::new()),
            shared: Arc::new(Shared::default()),
            tls,
        };
        for (peer_id, address) in peers {
            transport.add_peer(peer_id, &address);
        }
        transport
    }

    /// Starts a sending task for `peer_id` at `address` unless the peer is
    /// known already (or is this node). An invalid address is logged and
    /// the peer stays unknown: messages to it are dropped and counted.
    pub fn add_peer(&self, peer_id: u64, address: &str) {
        if peer_id == self.self_id {
            return;
        }
        let mut queues = self.queues.write().unwrap_or_else(|p| p.into_inner());
        if queues.contains_key(&peer_id) {
            return;
        }
        let endpoint = match peer_endpoint(&self.tls, address) {
            Ok(endpoint) => endpoint,
            Err(error) => {
                tracing::error!(
                    peer_id,
                    %address,
                    %error,
                    "invalid peer address; messages to it are dropped"
                );
                return;
            }
        };
        let (queue_tx, queue_rx) = mpsc::channel(self.queue_depth);
        let link = PeerLink {
            self_id: self.self_id,
            peer_id,
            endpoint,
            queue: queue_rx,
            shared: self.shared.clone(),
        };
        let task = self.runtime.spawn(link.run());
        self.tasks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(task);
        queues.insert(peer_id, queue_tx);
    }

    /// Queues `msgs` for node `to`. Never blocks and never fails: messages
    /// to an unknown peer, over a full queue, cut by a rule or sent after
    /// [`shutdown`](Self::shutdown) are dropped and counted. Callable from
    /// any thread, inside or outside the runtime.
    pub fn send(&self, to: u64, msgs: Vec<Envelope>) {
        if msgs.is_empty() {
            return;
        }
        let queue = self.queues.read().ok().and_then(|q| q.get(&to).cloned());
        let queue = match queue {
            Some(queue) if !self.shared.stopped.load(Ordering::Acquire) => queue,
            _ => {
                self.shared.count_dropped(msgs.len());
                return;
            }
        };
        #[cfg(feature = "fault-rules")]
        let mut delayed = Vec::new();
        for envelope in msgs {
            // One verdict per message, so a drop rate loses single messages
            // the way a lossy network does, not whole `Ready`s.
            #[cfg(feature = "fault-rules")]
            let envelope = match self.rules.verdict(self.self_id, to) {
                Verdict::Deliver => envelope,
                Verdict::Drop => {
                    self.shared.count_dropped(1);
                    continue;
                }
                Verdict::Delay(delay) => {
                    delayed.push((delay, envelope));
                    continue;
                }
            };
            if queue.try_send(envelope).is_err() {
                self.shared.count_dropped(1);
            }
        }
        #[cfg(feature = "fault-rules")]
        if !delayed.is_empty() {
            self.deliver_later(queue.clone(), delayed);
        }
    }

    /// Makes every later message obey `rules` (test builds only).
    #[cfg(feature = "fault-rules")]
    pub fn with_fault_rules(mut self, rules: Arc<NetworkRules>) -> Transport {
        self.rules = rules;
        self
    }

    /// Messages dropped so far, for any reason, before reaching a stream.
    /// Batches already handed to a stream that then broke are not included
    /// (at most a few batches per break).
    pub fn dropped_total(&self) -> u64 {
        self.shared.dropped_total.load(Ordering::Relaxed)
    }

    /// `RaftBatch` frames handed to peer streams so far, over all peers.
    pub fn batches_sent_total(&self) -> u64 {
        self.shared.batches_sent_total.load(Ordering::Relaxed)
    }

    /// Messages handed to peer streams so far, over all peers.
    pub fn messages_sent_total(&self) -> u64 {
        self.shared.messages_sent_total.load(Ordering::Relaxed)
    }

    /// Stops every peer task, closing their streams. Idempotent; later sends
    /// are dropped and counted. Also done on drop.
    pub fn shutdown(&self) {
        self.shared.stopped.store(true, Ordering::Release);
        let tasks = std::mem::take(&mut *self.tasks.lock().unwrap_or_else(|p| p.into_inner()));
        for task in tasks {
            task.abort();
        }
    }

    /// Puts `delayed` on `queue` once each message's delay has passed,
    /// without holding up the caller. Messages keep their order; the delay
    /// counts from now, not from when the previous one was queued.
    #[cfg(feature = "fault-rules")]
    fn deliver_later(&self, queue: mpsc::Sender<Envelope>, delayed: Vec<(Duration, Envelope)>) {
        let count = delayed.len();
        let in_flight = self
            .shared
            .delayed_in_flight
            .fetch_add(count, Ordering::Relaxed)
            + count;
        if in_flight > MAX_DELAYED_MESSAGES {
            self.shared
                .delayed_in_flight
                .fetch_sub(count, Ordering::Relaxed);
            self.shared.count_dropped(count);
            return;
        }
        let sent_at = Instant::now();
        let shared = self.shared.clone();
        self.runtime.spawn(async move {
            for (delay, envelope) in delayed {
                tokio::time::sleep_until(sent_at + delay).await;
                shared.delayed_in_flight.fetch_sub(1, Ordering::Relaxed);
                let stopped = shared.stopped.load(Ordering::Acquire);
                if stopped || queue.try_send(envelope).is_err() {
                    shared.count_dropped(1);
                }
            }
        });
    }
}

impl Drop for Transport {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The gRPC endpoint for a peer at `host:port`.
fn peer_endpoint(
    tls: &crate::tls::PeerTls,
    address: &str,
) -> Result<Endpoint, tonic::transport::Error> {
    Ok(tls
        .endpoint(address)?
        .connect_timeout(CONNECT_TIMEOUT)
        // Raft heartbeats and votes are tiny and latency-bound: never let
        // Nagle hold them back.
        .tcp_nodelay(true)
        .http2_keep_alive_interval(HTTP2_KEEPALIVE_INTERVAL)
        .keep_alive_timeout(HTTP2_KEEPALIVE_TIMEOUT)
        .keep_alive_while_idle(true))
}

/// Why a stream to a peer ended.
enum StreamEnd {
    /// The [`Transport`] is gone: stop the task.
    QueueClosed,
    /// The connection or stream failed: back off and reconnect.
    Broken(String),
}

/// The sending task of one peer: owns its queue and its one stream.
struct PeerLink {
    self_id: u64,
    peer_id: u64,
    endpoint: Endpoint,
    queue: mpsc::Receiver<Envelope>,
    shared: Arc<Shared>,
}

impl PeerLink {
    /// Streams to the peer until the transport goes away, reconnecting with
    /// jittered exponential backoff whenever the stream breaks.
    async fn run(mut self) {
        let mut backoff = INITIAL_RECONNECT_BACKOFF;
        loop {
            let opened_at = Instant::now();
            let reason = match self.stream_once().await {
                StreamEnd::QueueClosed => return,
                StreamEnd::Broken(reason) => reason,
            };
            if opened_at.elapsed() >= HEALTHY_STREAM_AGE {
                // Losing a working stream is news; each failed retry while
                // the peer stays down is not.
                tracing::warn!(
                    self_id = self.self_id,
                    peer_id = self.peer_id,
                    %reason,
                    "raft stream to peer broke; reconnecting"
                );
                backoff = INITIAL_RECONNECT_BACKOFF;
            } else {
                tracing::debug!(
                    self_id = self.self_id,
                    peer_id = self.peer_id,
                    %reason,
                    ?backoff,
                    "raft stream to peer failed; retrying"
                );
            }
            let pause = jittered(backoff);
            backoff = (backoff * 2).min(MAX_RECONNECT_BACKOFF);
            if !self.discard_for(pause).await {
                return;
            }
        }
    }

    /// Connects, opens the stream and pumps the queue into it until
    /// something breaks.
    async fn stream_once(&mut self) -> StreamEnd {
        let channel = match self.endpoint.connect().await {
            Ok(channel) => channel,
            Err(error) => return StreamEnd::Broken(format!("connect: {error}")),
        };
        let mut client = RaftTransportClient::new(channel);
        let (batch_tx, batch_rx) = mpsc::channel(STREAM_BUFFER_BATCHES);
        // The call stays pending for as long as the stream is healthy: the
        // server answers only when the stream ends. Its completion is how a
        // broken stream is noticed.
        let call = client.stream(ReceiverStream::new(batch_rx));
        tokio::pin!(call);
        let mut taken = Vec::with_capacity(MAX_BATCH_MESSAGES);
        loop {
            tokio::select! {
                // Notice a dead stream before feeding it more.
                biased;
                result = &mut call => return StreamEnd::Broken(call_ended(result)),
                received = self.queue.recv_many(&mut taken, MAX_BATCH_MESSAGES) => {
                    if received == 0 {
                        return StreamEnd::QueueClosed;
                    }
                    let batches = self.encode(&mut taken);
                    let mut unsent: usize = batches.iter().map(|b| b.messages.len()).sum();
                    for batch in batches {
                        let count = batch.messages.len();
                        tokio::select! {
                            biased;
                            result = &mut call => {
                                self.shared.count_dropped(unsent);
                                return StreamEnd::Broken(call_ended(result));
                            }
                            sent = batch_tx.send(batch) => {
                                if sent.is_err() {
                                    self.shared.count_dropped(unsent);
                                    return StreamEnd::Broken("request stream closed".to_owned());
                                }
                            }
                        }
                        unsent -= count;
                        self.shared.batches_sent_total.fetch_add(1, Ordering::Relaxed);
                        self.shared
                            .messages_sent_total
                            .fetch_add(count as u64, Ordering::Relaxed);
                    }
                }
            }
        }
    }

    /// Encodes `envelopes` (emptying it) into batches within
    /// [`MAX_BATCH_MESSAGES`] and [`MAX_BATCH_BYTES`], dropping messages
    /// that fail to encode or could never be received.
    fn encode(&self, envelopes: &mut Vec<Envelope>) -> Vec<RaftBatch> {
        let mut batches = Vec::new();
        let mut current = self.empty_batch();
        let mut current_bytes = 0;
        for envelope in envelopes.drain(..) {
            let message = match envelope.msg.write_to_bytes() {
                Ok(bytes) if bytes.len() <= MAX_MESSAGE_BYTES => bytes,
                Ok(bytes) => {
                    tracing::warn!(
                        peer_id = self.peer_id,
                        shard_id = envelope.shard_id,
                        bytes = bytes.len(),
                        "raft message too large for any peer; dropped"
                    );
                    self.shared.count_dropped(1);
                    continue;
                }
                Err(error) => {
                    tracing::warn!(
                        peer_id = self.peer_id,
                        %error,
                        "raft message failed to encode; dropped"
                    );
                    self.shared.count_dropped(1);
                    continue;
                }
            };
            let wire = RaftEnvelope {
                shard_id: envelope.shard_id,
                message,
            };
            let wire_bytes = envelope_wire_len(&wire);
            let full = current.messages.len() >= MAX_BATCH_MESSAGES
                || current_bytes + wire_bytes > MAX_BATCH_BYTES;
            if full && !current.messages.is_empty() {
                batches.push(std::mem::replace(&mut current, self.empty_batch()));
                current_bytes = 0;
            }
            current.messages.push(wire);
            current_bytes += wire_bytes;
        }
        if !current.messages.is_empty() {
            batches.push(current);
        }
        batches
    }

    fn empty_batch(&self) -> RaftBatch {
        RaftBatch {
            from_node: self.self_id,
            messages: Vec::new(),
        }
    }

    /// Waits `pause` while dropping (and counting) whatever is queued: those
    /// messages cannot be sent now and will be stale by the time they could.
    /// Returns false if the transport went away meanwhile.
    async fn discard_for(&mut self, pause: Duration) -> bool {
        let deadline = tokio::time::sleep(pause);
        tokio::pin!(deadline);
        let mut taken = Vec::new();
        loop {
            tokio::select! {
                () = &mut deadline => return true,
                received = self.queue.recv_many(&mut taken, MAX_BATCH_MESSAGES) => {
                    if received == 0 {
                        return false;
                    }
                    self.shared.count_dropped(received);
                    taken.clear();
                }
            }
        }
    }
}

/// Bytes `envelope` adds to an encoded `RaftBatch`: its tag, its length
/// prefix and its body.
fn envelope_wire_len(envelope: &RaftEnvelope) -> usize {
    /// The key of field 2 (`messages`) fits one byte.
    const FIELD_TAG_BYTES: usize = 1;
    let body = prost::Message::encoded_len(envelope);
    FIELD_TAG_BYTES + prost::length_delimiter_len(body) + body
}

/// Describes how a stream call finished; any end is a break, even a clean
/// one (the peer closing the stream to shut down).
fn call_ended(result: Result<Response<StreamAck>, Status>) -> String {
    match result {
        Ok(_) => "peer closed the stream".to_owned(),
        Err(status) => format!("{}: {}", status.code(), status.message()),
    }
}

/// `backoff` with "equal jitter": a uniform pause in `[backoff/2, backoff]`,
/// so peers that lost the same node do not reconnect in lockstep, while the
/// pause still grows with the backoff.
fn jittered(backoff: Duration) -> Duration {
    let half = backoff / 2;
    let jitter_nanos = rand::rng().random_range(0..=half.as_nanos() as u64);
    half + Duration::from_nanos(jitter_nanos)
}

/// The receiving side of the peer transport: implements the
/// `RaftTransport` service. Cheap to clone; clones share the callback,
/// counters and the closed flag.
#[derive(Clone)]
pub struct RaftService {
    inner: Arc<ServiceInner>,
}

struct ServiceInner {
    deliver: InboundFn,
    /// True once [`RaftService::close`] was called.
    closed: watch::Sender<bool>,
    messages_received_total: AtomicU64,
    malformed_total: AtomicU64,
    rejected_batches_total: AtomicU64,
}

impl fmt::Debug for RaftService {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RaftService")
            .field("closed", &*self.inner.closed.borrow())
            .field("messages_received_total", &self.messages_received_total())
            .field("malformed_total", &self.malformed_total())
            .field("rejected_batches_total", &self.rejected_batches_total())
            .finish_non_exhaustive()
    }
}

impl RaftService {
    /// A service handing each decoded batch to `deliver`, called on a
    /// runtime worker: it must not block (queue the messages and return).
    pub fn new(deliver: InboundFn) -> RaftService {
        RaftService {
            inner: Arc::new(ServiceInner {
                deliver,
                closed: watch::Sender::new(false),
                messages_received_total: AtomicU64::new(0),
                malformed_total: AtomicU64::new(0),
                rejected_batches_total: AtomicU64::new(0),
            }),
        }
    }

    /// The tonic server for this service, accepting batches up to
    /// [`MAX_INBOUND_BATCH_BYTES`].
    pub fn into_server(self) -> RaftTransportServer<RaftService> {
        RaftTransportServer::new(self).max_decoding_message_size(MAX_INBOUND_BATCH_BYTES)
    }

    /// Ends every open inbound stream (peers see `UNAVAILABLE` and
    /// reconnect with backoff) and refuses new ones. Call it before a
    /// graceful server shutdown: peers' streams never end on their own, so
    /// the server would otherwise wait for them forever.
    pub fn close(&self) {
        self.inner.closed.send_replace(true);
    }

    /// Messages decoded and handed to the callback so far.
    pub fn messages_received_total(&self) -> u64 {
        self.inner.messages_received_total.load(Ordering::Relaxed)
    }

    /// Envelopes skipped so far because their message did not decode.
    pub fn malformed_total(&self) -> u64 {
        self.inner.malformed_total.load(Ordering::Relaxed)
    }

    /// Batches dropped whole so far for holding more than
    /// [`MAX_INBOUND_BATCH_MESSAGES`] messages.
    pub fn rejected_batches_total(&self) -> u64 {
        self.inner.rejected_batches_total.load(Ordering::Relaxed)
    }

    /// Decodes `batch` and hands its messages to the callback.
    fn accept(&self, batch: RaftBatch) {
        let inner = &self.inner;
        if batch.messages.len() > MAX_INBOUND_BATCH_MESSAGES {
            tracing::warn!(
                from_node = batch.from_node,
                messages = batch.messages.len(),
                limit = MAX_INBOUND_BATCH_MESSAGES,
                "raft batch over the message limit; dropped"
            );
            inner.rejected_batches_total.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let mut decoded = Vec::with_capacity(batch.messages.len());
        let mut malformed = 0_u64;
        let mut first_error = None;
        for envelope in batch.messages {
            match RaftMessage::parse_from_bytes(&envelope.message) {
                Ok(msg) => decoded.push(Envelope {
                    shard_id: envelope.shard_id,
                    msg,
                }),
                Err(error) => {
                    malformed += 1;
                    first_error.get_or_insert((envelope.shard_id, error));
                }
            }
        }
        if let Some((shard_id, error)) = first_error {
            // One line per batch, not per envelope: a broken peer must not
            // be able to flood the log.
            tracing::warn!(
                from_node = batch.from_node,
                malformed,
                first_shard_id = shard_id,
                %error,
                "malformed raft messages skipped"
            );
            inner
                .malformed_total
                .fetch_add(malformed, Ordering::Relaxed);
        }
        if decoded.is_empty() {
            return;
        }
        inner
            .messages_received_total
            .fetch_add(decoded.len() as u64, Ordering::Relaxed);
        (inner.deliver)(batch.from_node, decoded);
    }
}

#[tonic::async_trait]
impl raft_transport_server::RaftTransport for RaftService {
    async fn stream(
        &self,
        request: Request<Streaming<RaftBatch>>,
    ) -> Result<Response<StreamAck>, Status> {
        let mut closed = self.inner.closed.subscribe();
        if *closed.borrow_and_update() {
            return Err(Status::unavailable("node is shutting down"));
        }
        let mut batches = request.into_inner();
        loop {
            tokio::select! {
                biased;
                _ = closed.wait_for(|closed| *closed) => {
                    return Err(Status::unavailable("node is shutting down"));
                }
                next = batches.message() => match next? {
                    Some(batch) => self.accept(batch),
                    None => return Ok(Response::new(StreamAck {})),
                },
            }
        }
    }
}

impl PeerSink for Transport {
    fn send(&self, to: u64, envelopes: Vec<Envelope>) {
        Transport::send(self, to, envelopes);
    }

    fn add_peer(&self, node_id: u64, addr: &str) {
        Transport::add_peer(self, node_id, addr);
    }
}
