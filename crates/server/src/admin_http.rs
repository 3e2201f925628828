//! The admin HTTP port (`admin_listen_addr`): what operators and Prometheus
//! read over plain HTTP.
//!
//! * `GET /metrics` — the node's metrics, Prometheus text format.
//! * `GET /` — the operator status page: nodes, shards, leaders, replicas,
//!   epochs, lock and waiter counts, hottest resources; it refreshes itself
//!   from `/status.json` every [`STATUS_REFRESH_MS`].
//! * `GET /status.json` — the cluster view the page shows, as JSON.
//! * `GET /healthz` — 200 while the node serves, 503 while it drains (the
//!   port opens only once the node serves; for HTTP-only probes — gRPC
//!   clients use `grpc.health.v1`).
//!
//! The cluster view is whatever the `AdminService` answers on this node
//! (every node can answer for the whole cluster), so the page shows the
//! same numbers as `fencelock admin nodes|shards|hot`.
//!
//! With TLS on, the port speaks HTTPS and requires a client certificate
//! from the cluster's CA (as the gRPC port does); the status page and
//! `/status.json` also require an admin identity, while `/metrics` and
//! `/healthz` take any certificate the CA signed (Prometheus, probes).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, State};
use axum::http::{header, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use fencelock_api::v1::admin_service_server::AdminService;
use fencelock_api::v1::{
    HotResourcesRequest, ListNodesRequest, ListShardsRequest, NodeState, ReplicaRole,
};
use serde_json::{json, Value};
use tokio::sync::oneshot;

use crate::admin::AdminServiceImpl;
use crate::errors::ServerError;
use crate::metrics::Metrics;
use crate::node::NodeView;
use crate::security::{Identity, TlsMaterial};

/// How often the status page asks for fresh numbers, in milliseconds.
pub const STATUS_REFRESH_MS: u64 = 2_000;
/// Hot resources the status page lists.
pub const STATUS_HOT_LIMIT: u32 = 10;

const STATUS_PAGE: &str = include_str!("status_page.html");

/// What the handlers read.
#[derive(Clone)]
pub struct HttpState {
    pub metrics: Arc<Metrics>,
    pub view: Arc<NodeView>,
    pub admin: Arc<AdminServiceImpl>,
}

/// Serves the admin port on `listener` until the returned sender fires (or
/// is dropped). Returns the stop handle, the task and the bound address.
pub fn spawn(
    listener: tokio::net::TcpListener,
    state: HttpState,
    tls: Option<Arc<TlsMaterial>>,
) -> Result<(oneshot::Sender<()>, tokio::task::JoinHandle<()>, SocketAddr), ServerError> {
    let addr = listener
        .local_addr()
        .map_err(|e| ServerError::Internal(e.to_string()))?;
    let app = axum::Router::new()
        .route("/", get(status_page))
        .route("/metrics", get(metrics))
        .route("/status.json", get(status_json))
        .route("/healthz", get(healthz))
        .with_state(state)
        .into_make_service_with_connect_info::<AdminPeer>();
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let stop = async {
        let _ = stop_rx.await;
    };
    let task = match tls {
        None => tokio::spawn(async move {
            let served = axum::serve(listener, app)
                .with_graceful_shutdown(stop)
                .await;
            if let Err(e) = served {
                tracing::error!("admin HTTP server stopped: {e}");
            }
        }),
        Some(material) => {
            let config = material
                .rustls_server_config()
                .map_err(|e| ServerError::Security(e.to_string()))?;
            let listener = TlsListener::start(listener, config);
            tokio::spawn(async move {
                let served = axum::serve(listener, app)
                    .with_graceful_shutdown(stop)
                    .await;
                if let Err(e) = served {
                    tracing::error!("admin HTTPS server stopped: {e}");
                }
            })
        }
    };
    Ok((stop_tx, task, addr))
}

/// Who is on the other end of an admin HTTP connection.
#[derive(Clone, Debug)]
pub struct AdminPeer {
    pub addr: SocketAddr,
    /// From the client certificate; [`Identity::Anonymous`] without TLS.
    pub identity: Result<Identity, String>,
}

impl AdminPeer {
    fn is_admin(&self) -> bool {
        self.identity.as_ref().is_ok_and(Identity::is_admin)
    }
}

impl
    axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, tokio::net::TcpListener>>
    for AdminPeer
{
    fn connect_info(stream: axum::serve::IncomingStream<'_, tokio::net::TcpListener>) -> Self {
        AdminPeer {
            addr: *stream.remote_addr(),
            identity: Ok(Identity::Anonymous),
        }
    }
}

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, TlsListener>>
    for AdminPeer
{
    fn connect_info(stream: axum::serve::IncomingStream<'_, TlsListener>) -> Self {
        stream.remote_addr().clone()
    }
}

/// TLS connections handshaken in the background, so one slow client does
/// not hold up the others.
pub struct TlsListener {
    accepted: tokio::sync::mpsc::Receiver<(
        tokio_rustls::server::TlsStream<tokio::net::TcpStream>,
        AdminPeer,
    )>,
    local_addr: SocketAddr,
}

/// Handshakes in progress at once on the admin port; more connections
/// wait in the kernel's backlog.
const MAX_PENDING_HANDSHAKES: usize = 64;

impl TlsListener {
    fn start(
        listener: tokio::net::TcpListener,
        config: Arc<tokio_rustls::rustls::ServerConfig>,
    ) -> TlsListener {
        let local_addr = listener
            .local_addr()
            .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
        let (tx, accepted) = tokio::sync::mpsc::channel(MAX_PENDING_HANDSHAKES);
        let acceptor = tokio_rustls::TlsAcceptor::from(config);
        let pending = Arc::new(tokio::sync::Semaphore::new(MAX_PENDING_HANDSHAKES));
        tokio::spawn(async move {
            loop {
                let Ok(permit) = pending.clone().acquire_owned().await else {
                    return;
                };
                let (tcp, addr) = match listener.accept().await {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        tracing::warn!("admin port accept failed: {e}");
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                        continue;
                    }
                };
                if tx.is_closed() {
                    return;
                }
                let acceptor = acceptor.clone();
                let tx = tx.clone();
                tokio::spawn(async move {
                    let _permit = permit;
                    let handshake = tokio::time::timeout(
                        crate::security::tls::TLS_HANDSHAKE_TIMEOUT,
                        acceptor.accept(tcp),
                    )
                    .await;
                    let Ok(Ok(stream)) = handshake else {
                        return; // refused or too slow: dropped
                    };
                    let identity = stream
                        .get_ref()
                        .1
                        .peer_certificates()
                        .and_then(|certs| certs.first())
                        .ok_or_else(|| "no client certificate".to_owned())
                        .and_then(|cert| {
                            Identity::from_certificate(cert).map_err(|e| e.to_string())
                        });
                    let _ = tx.send((stream, AdminPeer { addr, identity })).await;
                });
            }
        });
        TlsListener {
            accepted,
            local_addr,
        }
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;
    type Addr = AdminPeer;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.accepted.recv().await {
            Some(accepted) => accepted,
            // The accept task is gone (runtime stopping): wait for the
            // graceful shutdown to end the server.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(AdminPeer {
            addr: self.local_addr,
            identity: Ok(Identity::Anonymous),
        })
    }
}

/// The answer for a view that needs an admin identity.
fn forbidden() -> Response {
    (
        StatusCode::FORBIDDEN,
        "PERMISSION_DENIED: this view needs an admin identity (spiffe://fencelock/admin/<name>)\n",
    )
        .into_response()
}

async fn metrics(State(state): State<HttpState>) -> Response {
    let text = state.metrics.render(&state.view.snapshot());
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

async fn healthz(State(state): State<HttpState>) -> Response {
    // `draining` covers both starting (never set yet: serving) and
    // stopping; a node that answers HTTP has started its gRPC server.
    if state.view.is_draining() {
        (StatusCode::SERVICE_UNAVAILABLE, "draining\n").into_response()
    } else {
        (StatusCode::OK, "serving\n").into_response()
    }
}

async fn status_page(ConnectInfo(peer): ConnectInfo<AdminPeer>) -> Response {
    if !peer.is_admin() {
        return forbidden();
    }
    let page = STATUS_PAGE.replace("{{REFRESH_MS}}", &STATUS_REFRESH_MS.to_string());
    Html(page).into_response()
}

async fn status_json(
    ConnectInfo(peer): ConnectInfo<AdminPeer>,
    State(state): State<HttpState>,
) -> Response {
    if !peer.is_admin() {
        return forbidden();
    }
    let (code, body) = match cluster_view(&state).await {
        Ok(v) => (StatusCode::OK, v),
        Err(status) => (
            StatusCode::SERVICE_UNAVAILABLE,
            json!({ "error": status.message() }),
        ),
    };
    (
        code,
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        body.to_string(),
    )
        .into_response()
}

fn node_state_name(state: i32) -> &'static str {
    match NodeState::try_from(state).unwrap_or(NodeState::Unspecified) {
        NodeState::Up => "up",
        NodeState::Down => "down",
        NodeState::Draining => "draining",
        NodeState::Drained => "drained",
        NodeState::Unspecified => "unknown",
    }
}

/// The cluster as the admin API reports it, shaped for the page.
async fn cluster_view(state: &HttpState) -> Result<Value, tonic::Status> {
    let admin = &state.admin;
    let nodes = admin
        .list_nodes(tonic::Request::new(ListNodesRequest {}))
        .await?
        .into_inner();
    let shards = admin
        .list_shards(tonic::Request::new(ListShardsRequest::default()))
        .await?
        .into_inner();
    let hot = admin
        .hot_resources(tonic::Request::new(HotResourcesRequest {
            limit: STATUS_HOT_LIMIT,
        }))
        .await?
        .into_inner();
    let nodes: Vec<Value> = nodes
        .nodes
        .iter()
        .map(|n| {
            json!({
                "node_id": n.node_id,
                "address": n.address,
                "state": node_state_name(n.state),
                "replicas": n.replica_count,
                "leaders": n.leader_count,
            })
        })
        .collect();
    let shard_rows: Vec<Value> = shards
        .shards
        .iter()
        .map(|s| {
            let replicas: Vec<Value> = s
                .replicas
                .iter()
                .map(|r| {
                    let role = match ReplicaRole::try_from(r.role) {
                        Ok(ReplicaRole::Learner) => "learner",
                        _ => "voter",
                    };
                    json!({ "node_id": r.node_id, "role": role, "applied_index": r.applied_index })
                })
                .collect();
            let slots: Vec<String> = s
                .slot_ranges
                .iter()
                .map(|r| format!("{}-{}", r.start, r.end))
                .collect();
            json!({
                "shard_id": s.shard_id,
                "epoch": s.epoch,
                "leader": s.leader_node_id,
                "replicas": replicas,
                "slots": slots,
                "held_locks": s.held_locks,
                "waiters": s.waiters,
            })
        })
        .collect();
    let hot: Vec<Value> = hot
        .resources
        .iter()
        .map(|h| {
            json!({
                "resource": h.resource,
                "shard_id": h.shard_id,
                "acquires": h.acquires,
                "contended": h.contended,
            })
        })
        .collect();
    let held: u64 = shards.shards.iter().map(|s| s.held_locks).sum();
    let waiters: u64 = shards.shards.iter().map(|s| s.waiters).sum();
    Ok(json!({
        "served_by": state.view.node_id,
        // Shown as a warning banner on the page.
        "insecure": state.view.insecure,
        "generated_at_ms": crate::store::wall_ms(),
        "map_version": shards.map_version,
        "migration_id": shards.migration_id,
        "totals": { "held_locks": held, "waiters": waiters, "shards": shard_rows.len(), "nodes": nodes.len() },
        "nodes": nodes,
        "shards": shard_rows,
        "hot": hot,
    }))
}
