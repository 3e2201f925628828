//! Wiring of one node: storage, store loop, transport, gRPC server (lock,
//! admin, peer, health and reflection services), the admin HTTP port and
//! the audit writer; and their orderly shutdown.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use fencelock_api::v1::lock_service_server::LockServiceServer;
use fencelock_storage::RocksEngine;
use tokio::sync::oneshot;
use tonic::service::interceptor::InterceptedService;

use crate::audit::{AuditLog, AuditStats};
use crate::config::NodeConfig;
use crate::errors::ServerError;
use crate::lifecycle::Lifecycle;
use crate::metrics::{Metrics, NodeSnapshot};
#[cfg(feature = "fault-rules")]
use crate::netfilter::NetworkRules;
use crate::peers::PeerChannels;
use crate::router::Router;
use crate::security::conn::{ConnLimits, Refusals};
use crate::security::malformed::TypedDecodeErrors;
use crate::security::rate::TenantRateLimiter;
use crate::security::{Audience, Gate, PeerTls, TlsMaterial};
use crate::service::LockServiceImpl;
use crate::store::{MembershipChange, Observers, ShardStatus, Store, StoreMsg, StoreSender};
use crate::transport::{RaftService, Transport};

/// How long shutdown waits for in-flight client calls to finish.
const SERVER_STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// How often the gRPC port pings a connection that has been quiet, and how
/// long it waits for the answer before closing it (module docs of
/// `security::conn`: a dead peer's connection must give its place back).
const HTTP2_KEEPALIVE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(30);
const HTTP2_KEEPALIVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// A running node. `shutdown` stops it gracefully; dropping it stops it
/// abruptly (the store loop still ends and closes RocksDB, so the process
/// never exits with the database open).
pub struct Node {
    node_id: u64,
    addr: SocketAddr,
    admin_addr: Option<SocketAddr>,
    store_tx: StoreSender,
    store_thread: Option<std::thread::JoinHandle<()>>,
    server_stop: Option<oneshot::Sender<()>>,
    server_task: Option<tokio::task::JoinHandle<()>>,
    transport: Arc<Transport>,
    raft_service: RaftService,
    status: Arc<Mutex<Vec<ShardStatus>>>,
    router: Arc<Router>,
    map_task: tokio::task::JoinHandle<()>,
    /// The meta leader's look for migrations left open.
    reshard_task: tokio::task::JoinHandle<()>,
    epoch_task: tokio::task::JoinHandle<()>,
    /// Watches the data directory's free space (`edge.min_free_disk_bytes`).
    disk_task: tokio::task::JoinHandle<()>,
    /// The controller's own rounds (absent with repair, balance and split
    /// by load all off).
    repair_task: Option<tokio::task::JoinHandle<()>>,
    ops: crate::ops::Ops,
    metrics: Arc<Metrics>,
    life: Arc<Lifecycle>,
    audit: AuditLog,
    view: Arc<NodeView>,
    http_stop: Option<oneshot::Sender<()>>,
    http_task: Option<tokio::task::JoinHandle<()>>,
    drain_timeout: std::time::Duration,
}

/// What a graceful shutdown achieved before the node stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShutdownReport {
    /// Shards this node still led at the deadline (they elect a new leader
    /// after an election timeout); empty when every leadership moved.
    pub leaderships_left: Vec<u64>,
    /// Whether every in-flight client request finished in time.
    pub drained: bool,
}

/// What the node publishes for observers (metrics, the status page): cheap
/// handles to state other parts own.
pub struct NodeView {
    pub node_id: u64,
    status: Arc<Mutex<Vec<ShardStatus>>>,
    store_tx: StoreSender,
    store_capacity: usize,
    transport: Arc<Transport>,
    life: Arc<Lifecycle>,
    audit: AuditStats,
    engine: Arc<RocksEngine>,
    disk: Arc<crate::disk_space::DiskSpace>,
    /// Running without TLS (`tls.insecure = true`): the status page warns.
    pub insecure: bool,
}

impl NodeView {
    /// Whether the node is shutting down (health NOT_SERVING).
    pub fn is_draining(&self) -> bool {
        self.life.is_draining()
    }

    /// The numbers the metrics read at scrape time.
    pub fn snapshot(&self) -> NodeSnapshot {
        NodeSnapshot {
            shards: self.status.lock().map(|s| s.clone()).unwrap_or_default(),
            store_queue_depth: self.store_tx.len(),
            store_queue_capacity: self.store_capacity,
            in_flight_requests: self.life.in_flight(),
            draining: self.life.is_draining(),
            transport_dropped_total: self.transport.dropped_total(),
            transport_batches_total: self.transport.batches_sent_total(),
            transport_messages_total: self.transport.messages_sent_total(),
            audit_lines_total: self.audit.lines_total(),
            audit_dropped_total: self.audit.dropped_total(),
            engine_memory: self.engine.memory(),
            resident_bytes: crate::metrics::resident_bytes(),
            disk_free_bytes: self.disk.free_bytes(),
            disk_low: self.disk.is_low(),
        }
    }
}

/// Loads the node's TLS material, or warns loudly that there is none.
fn load_tls(config: &NodeConfig) -> Result<PeerTls, ServerError> {
    let tls = &config.tls;
    match (&tls.ca_file, &tls.cert_file, &tls.key_file) {
        (Some(ca), Some(cert), Some(key)) => {
            let material = TlsMaterial::load(ca, cert, key)
                .map_err(|e| ServerError::Security(e.to_string()))?;
            // Built once here so that a key that does not fit its
            // certificate stops the start before anything runs.
            material
                .rustls_server_config()
                .map_err(|e| ServerError::Security(e.to_string()))?;
            Ok(PeerTls::new(Some(Arc::new(material))))
        }
        _ => {
            tracing::warn!(
                node_id = config.node_id,
                "INSECURE MODE (tls.insecure = true): no TLS, no authentication, every caller \
                 may take, release and administer everything. For development only; see \
                 docs/security.md"
            );
            Ok(PeerTls::insecure())
        }
    }
}

/// How often a node refreshes its placement map from peers when it has no
/// meta replica of its own (a node with one is updated at apply).
const MAP_REFRESH_INTERVAL: std::time::Duration = std::time::Duration::from_secs(2);

async fn refresh_map(ops: crate::ops::Ops, status: Arc<Mutex<Vec<ShardStatus>>>) {
    let mut interval = tokio::time::interval(MAP_REFRESH_INTERVAL);
    loop {
        interval.tick().await;
        let has_meta = status
            .lock()
            .map(|s| {
                s.iter().any(|r| {
                    r.shard_id == fencelock_placement::META_SHARD_ID && r.applied_index > 0
                })
            })
            .unwrap_or(false);
        if !has_meta {
            let _ = ops.fresh_map().await;
        }
    }
}

/// How often the meta shard's leader looks for a migration left open.
const RESHARD_WATCH_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);
/// Every this many looks it also sweeps every shard for exports left behind
/// by ended migrations.
const RESHARD_SWEEP_EVERY: u32 = 12;

/// The meta shard's leader finishes migrations nobody is finishing: at once
/// when it becomes leader (so after a restart or a leader change, an open
/// migration does not wait for an operator), when a migration stays open
/// across two looks (its orchestrator died or gave up), and now and then to
/// clear leftovers. Running next to a live orchestrator is safe: every step
/// is idempotent and decided from the shards' replicated state
/// ([`crate::reshard`]).
/// How often the meta shard's leader runs a round. Bounded by the
/// shortest `controller.node_down_after_ms`, so a node is replaced within
/// one interval of the bound.
const CONTROL_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// The controller's own moves, on the meta shard's leader only: every
/// [`CONTROL_INTERVAL`] one round (`fencelock_controller::act`) observes
/// the cluster once and repairs, splits by lock count or balances, as the
/// `[controller]` section allows. Rounds do not overlap (one task, one at a
/// time); a node that stops leading the meta shard forgets what it
/// observed, and the next leader observes for itself.
async fn act_on_placement(
    ops: crate::ops::Ops,
    status: Arc<Mutex<Vec<ShardStatus>>>,
    config: fencelock_controller::act::ActConfig,
    metrics: crate::metrics::ControllerMetrics,
    audit: AuditLog,
) {
    use fencelock_controller::act::{reason, Work};
    let started = std::time::Instant::now();
    let mut memory = fencelock_controller::act::Memory::default();
    let mut interval = tokio::time::interval(CONTROL_INTERVAL);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        let leads_meta = status.lock().is_ok_and(|s| {
            s.iter()
                .any(|r| r.shard_id == fencelock_placement::META_SHARD_ID && r.is_leader)
        });
        if !leads_meta {
            memory.forget();
            metrics.nodes_down.set(0);
            continue;
        }
        let now_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let (round, failure) = match ops.act_round(&mut memory, now_ms, &config).await {
            Ok(round) => (round, None),
            Err((round, e)) => (round, Some(e)),
        };
        metrics
            .nodes_down
            .set(i64::try_from(round.down.len()).unwrap_or(i64::MAX));
        if let Some(format) = round.cluster_format_raised_to {
            tracing::info!(
                format,
                "controller: every member reads placement format {format}; the cluster format is now {format}"
            );
            audit.record_decision(fencelock_multiraft::audit::DecisionRecord {
                time_ms: fencelock_multiraft::wall_ms(),
                kind: "cluster_format",
                step: format!("raise the cluster format to {format}"),
                reason: "every member of the map reports that it reads it".into(),
                outcome: "done".into(),
            });
        }
        let (started, done, failed) = match &round.work {
            Work::Nothing => {
                if let Some(e) = failure {
                    tracing::warn!("controller: observing the cluster failed: {e}");
                }
                continue;
            }
            Work::MarkDown(_) => (None, &metrics.marked_down, None),
            Work::Return(_) => (None, &metrics.returned_up, None),
            Work::Repair(_) => (
                Some(&metrics.moves_started),
                &metrics.moves_done,
                Some(&metrics.moves_failed),
            ),
            Work::Balance(_) => (
                Some(&metrics.balance_started),
                &metrics.balance_done,
                Some(&metrics.balance_failed),
            ),
            Work::Split { .. } => (
                Some(&metrics.splits_started),
                &metrics.splits_done,
                Some(&metrics.splits_failed),
            ),
        };
        if let Some(started) = started {
            started.inc_by(round.done as u64 + u64::from(failure.is_some()));
        }
        let kind = round.work.kind();
        let why = reason(&config, &round.work);
        done.inc_by(round.done as u64);
        let decision = |i: usize, outcome: String| fencelock_multiraft::audit::DecisionRecord {
            time_ms: fencelock_multiraft::wall_ms(),
            kind,
            step: round.work.describe_step(i).unwrap_or_default(),
            reason: why.clone(),
            outcome,
        };
        for i in 0..round.done {
            let step = round.work.describe_step(i).unwrap_or_default();
            tracing::info!(down = ?round.down, reason = %why, "controller {kind}: {step}: done");
            audit.record_decision(decision(i, "done".into()));
        }
        if let Some(e) = failure {
            if let Some(failed) = failed {
                failed.inc();
            }
            let step = round.work.describe_step(round.done).unwrap_or_default();
            tracing::warn!(down = ?round.down, reason = %why, "controller {kind}: {step}: failed (the next round decides again): {e}");
            audit.record_decision(decision(round.done, format!("failed: {e}")));
        }
    }
}

async fn watch_migrations(
    ops: crate::ops::Ops,
    router: Arc<Router>,
    status: Arc<Mutex<Vec<ShardStatus>>>,
) {
    let mut interval = tokio::time::interval(RESHARD_WATCH_INTERVAL);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut led_in_term: Option<u64> = None;
    let mut open_before: Option<u64> = None;
    let mut looks = 0u32;
    loop {
        interval.tick().await;
        let meta_term = status.lock().ok().and_then(|s| {
            s.iter()
                .find(|r| r.shard_id == fencelock_placement::META_SHARD_ID && r.is_leader)
                .map(|r| r.term)
        });
        let Some(term) = meta_term else {
            led_in_term = None;
            open_before = None;
            continue;
        };
        looks += 1;
        let open = router.map().and_then(|m| m.migration().map(|m| m.id));
        let new_leader = led_in_term != Some(term);
        let stalled = open.is_some() && open == open_before;
        let sweep = looks.is_multiple_of(RESHARD_SWEEP_EVERY);
        led_in_term = Some(term);
        open_before = open;
        if !(new_leader || stalled || sweep) {
            continue;
        }
        match ops.resume_unless_busy().await {
            Ok(Some(done)) => tracing::info!(
                migration_id = done.migration_id,
                resources = done.resources,
                "finished a migration left open"
            ),
            Ok(None) => {}
            Err(e) => tracing::warn!("resuming resharding: {e}"),
        }
        open_before = router.map().and_then(|m| m.migration().map(|m| m.id));
    }
}

/// How often a node looks at the token positions of the shards it leads.
const EPOCH_CHECK_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);

/// Gives the shards this node leads a new epoch before their token
/// positions run out (docs/safety.md, "Fencing tokens").
async fn advance_epochs(
    ops: crate::ops::Ops,
    status: Arc<Mutex<Vec<ShardStatus>>>,
    store_tx: StoreSender,
) {
    let mut interval = tokio::time::interval(EPOCH_CHECK_INTERVAL);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        let shards = status.lock().map(|s| s.clone()).unwrap_or_default();
        let below = crate::store::EPOCH_ADVANCE_POSITIONS_LEFT;
        for (shard_id, result) in advance_low_epochs(&ops, &store_tx, &shards, below).await {
            match result {
                Ok(epoch) => tracing::info!(
                    shard_id,
                    epoch,
                    "token positions ran low: the shard moved to a new epoch"
                ),
                Err(e) => tracing::warn!(
                    shard_id,
                    "token positions run low and the shard has no new epoch yet (retried): {}",
                    e.message()
                ),
            }
        }
    }
}

/// For every shard in `shards` that this node leads with fewer than
/// `below` token positions left: takes a new epoch from the placement
/// controller's counter (`AdvanceEpoch`, the same step that gives a
/// migration's source a fresh epoch when it takes its slots back) and has
/// the shard start it at a new entry (`StoreMsg::AdoptEpoch`). Returns each
/// such shard with its new epoch or why it has none yet; a later call tries
/// again (the controller refuses while a migration involves the shard, and
/// an epoch handed out but never started is simply never used).
async fn advance_low_epochs(
    ops: &crate::ops::Ops,
    store_tx: &StoreSender,
    shards: &[ShardStatus],
    below: u64,
) -> Vec<(u64, Result<u64, tonic::Status>)> {
    let mut out = Vec::new();
    for shard in shards {
        let low = shard.is_leader
            && shard.shard_id != fencelock_placement::META_SHARD_ID
            && shard.token_positions_left < below;
        if !low {
            continue;
        }
        let shard_id = shard.shard_id;
        let result = async {
            let advanced = ops
                .propose_meta(fencelock_placement::PlacementCommand::AdvanceEpoch { shard_id })
                .await
                .map_err(crate::ops::status_of)?;
            let (tx, rx) = oneshot::channel();
            let epoch = advanced.epoch;
            store_tx
                .try_send(StoreMsg::AdoptEpoch {
                    shard_id,
                    epoch,
                    tx,
                })
                .map_err(|_| ServerError::ServerBusy)?;
            rx.await
                .map_err(|_| ServerError::ShuttingDown)?
                .map_err(ServerError::from)?;
            Ok::<u64, tonic::Status>(epoch)
        }
        .await;
        out.push((shard_id, result));
    }
    out
}

impl Node {
    /// Starts a node with no injected faults.
    pub async fn start(config: NodeConfig) -> Result<Node, ServerError> {
        Self::open(config, |transport| transport).await
    }

    /// Starts a node whose outgoing peer traffic obeys `rules` (test builds
    /// only: feature `fault-rules`).
    #[cfg(feature = "fault-rules")]
    pub async fn start_with_rules(
        config: NodeConfig,
        rules: Arc<NetworkRules>,
    ) -> Result<Node, ServerError> {
        Self::open(config, move |transport| transport.with_fault_rules(rules)).await
    }

    /// Starts a node; `transport` may change the peer transport before it
    /// is used (fault rules in tests).
    async fn open(
        config: NodeConfig,
        transport: impl FnOnce(Transport) -> Transport,
    ) -> Result<Node, ServerError> {
        config.validate().map_err(ServerError::Config)?;
        crate::security::prepare_data_dir(&config.data_dir)
            .map_err(|e| ServerError::Security(e.to_string()))?;
        let tls = load_tls(&config)?;
        let engine = Arc::new(RocksEngine::open(config.data_dir.join("db")).map_err(|e| {
            if e.is_damage() {
                ServerError::Damaged(e.to_string())
            } else {
                ServerError::Storage(e.to_string())
            }
        })?);
        let listener = tokio::net::TcpListener::bind(&config.listen_addr)
            .await
            .map_err(|e| listen_error("listen_addr", &config.listen_addr, &e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| ServerError::Internal(e.to_string()))?;
        // Bound before anything starts, so a taken admin port fails the
        // start instead of leaving a node nobody can scrape.
        let admin_listener = match &config.admin_listen_addr {
            Some(a) => Some(
                tokio::net::TcpListener::bind(a)
                    .await
                    .map_err(|e| listen_error("admin_listen_addr", a, &e))?,
            ),
            None => None,
        };
        let audit = AuditLog::start(
            config.node_id,
            &config.audit_target(),
            config.audit.include_renewals,
        )
        .map_err(|e| ServerError::Storage(format!("cannot open the audit log: {e}")))?;
        let metrics = Arc::new(Metrics::new(config.node_id));
        let transport = Arc::new(transport(Transport::with_tls(
            config.node_id,
            config.peer_map(),
            config.raft.peer_queue_depth,
            tokio::runtime::Handle::current(),
            tls.clone(),
        )));
        let (store_tx, store_rx) = crossbeam_channel::bounded(config.raft.store_queue_depth);
        let status = Arc::new(Mutex::new(Vec::new()));
        let disk = crate::disk_space::DiskSpace::new(config.edge.min_free_disk_bytes);
        let disk_task = tokio::spawn(crate::disk_space::watch(
            config.data_dir.clone(),
            disk.clone(),
        ));
        let router = Arc::new(Router::new(config.peer_map()));
        let peers = Arc::new(PeerChannels::new(tls.clone()));
        let default_ttl = config.lock.default_lease_ttl_ms;
        let store = Store::open(
            config.store_config(),
            engine.clone(),
            transport.clone(),
            store_rx,
            status.clone(),
            router.clone(),
            Observers {
                metrics: metrics.store_locals(),
                audit: audit.clone(),
            },
        )?;
        let store_thread = std::thread::Builder::new()
            .name(format!("store-{}", config.node_id))
            .spawn(move || store.run())
            .map_err(|e| ServerError::Internal(e.to_string()))?;

        let inbound = store_tx.clone();
        let raft_service = RaftService::new(Arc::new(move |_from, envelopes| {
            // A full inbox drops the batch: Raft retransmits.
            let _ = inbound.try_send(StoreMsg::Raft { envelopes });
        }));
        let raft_service_handle = raft_service.clone();
        let (health_reporter, health_service) = tonic_health::server::health_reporter();
        let life = Arc::new(Lifecycle::new(health_reporter));
        // Not serving until the server below is up.
        life.set_starting().await;
        let reflection = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(fencelock_api::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .build_v1()
            .map_err(|e| ServerError::Internal(format!("reflection: {e}")))?;
        let lock_service = LockServiceImpl::new(
            config.node_id,
            store_tx.clone(),
            router.clone(),
            peers.clone(),
            default_ttl,
            metrics.clone(),
            life.clone(),
        )
        .with_rate_limit(Arc::new(TenantRateLimiter::new(
            config.edge.tenant_requests_per_sec,
            config.edge.tenant_burst,
        )))
        .with_disk_space(disk.clone())
        .with_shard_status(status.clone());
        let control = crate::control::NodeControlImpl::new(
            config.node_id,
            store_tx.clone(),
            router.clone(),
            status.clone(),
            metrics.clone(),
            config.max_placement_format,
        );
        let ops = crate::ops::new(
            router.clone(),
            peers.clone(),
            config.raft.clock_offset_allowance_ms,
        );
        let admin = Arc::new(crate::admin::AdminServiceImpl::new(
            ops.clone(),
            config.controller.act_config(),
        ));
        // A node without a replica of the meta shard (one added later) gets
        // the map from its peers: at start, then every few seconds. The meta
        // leader finishes migrations left open.
        let map_task = tokio::spawn(refresh_map(ops.clone(), status.clone()));
        let reshard_task = tokio::spawn(watch_migrations(
            ops.clone(),
            router.clone(),
            status.clone(),
        ));
        let controller = &config.controller;
        let repair_task = controller.acts().then(|| {
            tokio::spawn(act_on_placement(
                ops.clone(),
                status.clone(),
                controller.act_config(),
                metrics.controller.clone(),
                audit.clone(),
            ))
        });
        let epoch_task = tokio::spawn(advance_epochs(
            ops.clone(),
            status.clone(),
            store_tx.clone(),
        ));
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let incoming = crate::security::conn::limited_incoming(
            listener,
            ConnLimits {
                max_connections: config.edge.max_connections,
                max_connections_per_source: config.edge.max_connections_per_source,
                handshake_timeout: std::time::Duration::from_millis(
                    config.edge.handshake_timeout_ms,
                ),
            },
            Arc::new(Refusals::new(metrics.connection_refusals())),
        );
        let secure = tls.is_secure();
        let gate = |audience| Gate::new(secure, audience);
        let max_message = config.edge.max_message_bytes;
        // Pings find connections whose peer went away without a FIN (a
        // host powered off, a partition) and close them, giving their
        // places back; a live client or peer answers them.
        let mut builder = tonic::transport::Server::builder()
            .max_concurrent_streams(Some(config.edge.max_concurrent_streams))
            .http2_keepalive_interval(Some(HTTP2_KEEPALIVE_INTERVAL))
            .http2_keepalive_timeout(Some(HTTP2_KEEPALIVE_TIMEOUT));
        if let Some(material) = tls.material() {
            builder = builder
                .tls_config(material.server_config())
                .map_err(|e| ServerError::Security(format!("TLS setup: {e}")))?;
        }
        // Every service of ours answers undecodable requests with a typed
        // error (security::malformed), not tonic's bare INTERNAL.
        let router_svc = builder
            .add_service(TypedDecodeErrors::new(
                InterceptedService::new(
                    LockServiceServer::new(lock_service)
                        .max_decoding_message_size(max_message)
                        .max_encoding_message_size(max_message),
                    gate(Audience::Clients),
                ),
                max_message,
            ))
            .add_service(InterceptedService::new(
                raft_service.into_server(),
                gate(Audience::Nodes),
            ))
            .add_service(TypedDecodeErrors::new(
                InterceptedService::new(
                    control
                        .into_server()
                        .max_decoding_message_size(max_message)
                        .max_encoding_message_size(max_message),
                    gate(Audience::Nodes),
                ),
                max_message,
            ))
            .add_service(TypedDecodeErrors::new(
                InterceptedService::new(
                    admin
                        .clone()
                        .into_server()
                        .max_decoding_message_size(max_message)
                        .max_encoding_message_size(max_message),
                    gate(Audience::Admins),
                ),
                max_message,
            ))
            .add_service(health_service)
            .add_service(reflection);
        let server_task = tokio::spawn(async move {
            let result = router_svc
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = stop_rx.await;
                })
                .await;
            if let Err(e) = result {
                tracing::error!("gRPC server stopped: {e}");
            }
        });
        life.serving().await;
        let view = Arc::new(NodeView {
            node_id: config.node_id,
            status: status.clone(),
            store_tx: store_tx.clone(),
            store_capacity: config.raft.store_queue_depth,
            transport: transport.clone(),
            life: life.clone(),
            audit: audit.stats(),
            engine,
            disk,
            insecure: !secure,
        });
        let (admin_addr, http_stop, http_task) = match admin_listener {
            Some(listener) => {
                let (stop, task, addr) = crate::admin_http::spawn(
                    listener,
                    crate::admin_http::HttpState::new(
                        metrics.clone(),
                        view.clone(),
                        ops.clone(),
                        admin.clone(),
                    ),
                    tls.material().cloned(),
                )?;
                (Some(addr), Some(stop), Some(task))
            }
            None => (None, None, None),
        };
        tracing::info!(node_id = config.node_id, %addr, ?admin_addr, "node started");
        Ok(Node {
            node_id: config.node_id,
            addr,
            admin_addr,
            store_tx,
            store_thread: Some(store_thread),
            server_stop: Some(stop_tx),
            server_task: Some(server_task),
            transport,
            raft_service: raft_service_handle,
            status,
            router,
            map_task,
            reshard_task,
            epoch_task,
            disk_task,
            repair_task,
            ops,
            metrics,
            life,
            audit,
            view,
            http_stop,
            http_task,
            drain_timeout: config.shutdown.drain_timeout(),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The admin HTTP address (`/metrics`, the status page), when enabled.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin_addr
    }

    /// The node's metrics in the Prometheus text format (what `/metrics`
    /// serves).
    pub fn render_metrics(&self) -> String {
        self.metrics.render(&self.view.snapshot())
    }

    /// The node's audit sink (`reopen` it after log rotation).
    pub fn audit(&self) -> &AuditLog {
        &self.audit
    }

    /// Stops gracefully (see [`crate::lifecycle`]): not serving, leaderships
    /// handed to other nodes, requests drained, then [`Node::shutdown`].
    /// Bounded by `shutdown.drain_timeout_ms`.
    pub async fn shutdown_gracefully(self) -> ShutdownReport {
        let deadline = tokio::time::Instant::now() + self.drain_timeout;
        self.life.stop_accepting().await;
        let left = crate::lifecycle::move_leaderships_away(
            self.node_id,
            &self.status,
            &self.ops,
            deadline,
        )
        .await;
        if left.is_empty() {
            tracing::info!("every leadership handed over");
        } else {
            tracing::warn!(shards = ?left, "still leading these shards; they will elect a new leader");
        }
        self.life.refuse_new();
        let drained = self.life.wait_idle(deadline).await;
        if !drained {
            tracing::warn!(
                in_flight = self.life.in_flight(),
                "requests still in flight at the drain deadline"
            );
        }
        self.shutdown().await;
        ShutdownReport {
            leaderships_left: left,
            drained,
        }
    }

    /// Leadership and progress of every shard on this node.
    pub fn shard_status(&self) -> Vec<ShardStatus> {
        self.status.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Adds or removes a replica of `shard_id`. Must be sent to the shard's
    /// leader (otherwise NOT_LEADER with a hint); answers once the change
    /// has been committed and applied here.
    pub async fn change_membership(
        &self,
        shard_id: u64,
        change: MembershipChange,
        node_id: u64,
    ) -> Result<(), ServerError> {
        let (tx, rx) = oneshot::channel();
        self.store_tx
            .try_send(StoreMsg::ChangeMembership {
                shard_id,
                change,
                node_id,
                tx,
            })
            .map_err(|_| ServerError::ServerBusy)?;
        rx.await
            .map_err(|_| ServerError::ShuttingDown)?
            .map_err(ServerError::from)
    }

    /// Proposes `command` to this node's replica of `shard_id` exactly as
    /// given, bypassing routing: for tests and tools that must reach one
    /// particular shard (for example to show that a shard refuses a slot it
    /// does not own).
    pub async fn propose_to_shard(
        &self,
        shard_id: u64,
        command: fencelock_statemachine::Command,
    ) -> Result<fencelock_statemachine::Reply, ServerError> {
        let (tx, rx) = oneshot::channel();
        self.store_tx
            .try_send(StoreMsg::Propose {
                shard_id,
                command,
                responder: crate::store::Responder::Reply(tx),
                caller: None,
            })
            .map_err(|_| ServerError::ServerBusy)?;
        rx.await
            .map_err(|_| ServerError::ShuttingDown)?
            .map_err(ServerError::from)
    }

    /// What the node's epoch task does every few seconds, now and with any
    /// threshold: every shard this node leads with fewer than `below` token
    /// positions left moves to a new epoch from the placement controller.
    /// Returns each such shard with its new epoch or the failure.
    pub async fn advance_epochs(&self, below: u64) -> Vec<(u64, Result<u64, tonic::Status>)> {
        let shards = self.shard_status();
        advance_low_epochs(&self.ops, &self.store_tx, &shards, below).await
    }

    /// This node's view of the placement map and shard leaders.
    pub fn router(&self) -> &Arc<Router> {
        &self.router
    }

    /// Stops serving, stops the store loop (answering what is in flight with
    /// SHUTTING_DOWN), flushes and closes the database and the audit log.
    pub async fn shutdown(mut self) {
        self.map_task.abort();
        self.reshard_task.abort();
        self.epoch_task.abort();
        self.disk_task.abort();
        if let Some(task) = &self.repair_task {
            task.abort();
        }
        if let Some(stop) = self.http_stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.http_task.take() {
            let _ = task.await;
        }
        // Peer streams never end on their own: close them first, or peers
        // would keep feeding a stopped store through live connections.
        self.raft_service.close();
        if let Some(stop) = self.server_stop.take() {
            let _ = stop.send(());
        }
        if let Some(mut task) = self.server_task.take() {
            if tokio::time::timeout(SERVER_STOP_GRACE, &mut task)
                .await
                .is_err()
            {
                task.abort();
                let _ = task.await;
            }
        }
        self.transport.shutdown();
        // The inbox may be full; a blocking send still gets through once the
        // loop drains it.
        let _ = self.store_tx.send(StoreMsg::Shutdown);
        if let Some(thread) = self.store_thread.take() {
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        }
        // The store (the only other holder) is gone: the writer drains what
        // is queued and flushes.
        let mut audit = std::mem::replace(&mut self.audit, AuditLog::disabled());
        let _ = tokio::task::spawn_blocking(move || audit.close()).await;
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.map_task.abort();
        self.reshard_task.abort();
        self.epoch_task.abort();
        self.disk_task.abort();
        if let Some(task) = &self.repair_task {
            task.abort();
        }
        if let Some(task) = self.http_task.take() {
            task.abort();
        }
        let Some(thread) = self.store_thread.take() else {
            return; // already shut down
        };
        self.raft_service.close();
        if let Some(stop) = self.server_stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.server_task.take() {
            task.abort();
        }
        self.transport.shutdown();
        let _ = self.store_tx.send(StoreMsg::Shutdown);
        let _ = thread.join();
    }
}

/// A bind failure of the configuration key `key` (`addr`), saying what
/// usually causes it.
fn listen_error(key: &str, addr: &str, e: &std::io::Error) -> ServerError {
    let hint = match e.kind() {
        std::io::ErrorKind::AddrInUse => "; another process (another node?) holds that port",
        std::io::ErrorKind::AddrNotAvailable => "; that address is not one of this machine's",
        std::io::ErrorKind::PermissionDenied => "; ports below 1024 need privileges",
        _ => "",
    };
    ServerError::Listen(format!("{key} {addr}: {e}{hint}"))
}
