//! The admin HTTP port (`admin_listen_addr`): what operators and Prometheus
//! read over plain HTTP.
//!
//! * `GET /metrics` — the node's metrics, Prometheus text format.
//! * `GET /` — the operator status page ([`crate::status`]), rendered on the
//!   server: charts of request rates, latency, locks and leaders per node
//!   over the last minutes, then nodes, shards, leaders, replicas, epochs,
//!   lock and waiter counts and the hottest resources. An open page swaps in
//!   a fresh copy every [`STATUS_REFRESH_MS`].
//! * `GET /status.json` — the same view as JSON, with the charts' figures
//!   (`series`).
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
use std::sync::{Arc, Mutex, PoisonError};

use axum::extract::{ConnectInfo, State};
use axum::http::{header, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use fencelock_api::v1::admin_service_server::AdminService;
use fencelock_api::v1::{HotResourcesRequest, ListNodesRequest, ListShardsRequest};
use serde_json::json;
use tokio::sync::oneshot;

use crate::admin::AdminServiceImpl;
use crate::errors::ServerError;
use crate::metrics::Metrics;
use crate::node::NodeView;
use crate::ops::Ops;
use crate::security::{Identity, TlsMaterial};
use crate::status::history::History;
use crate::status::page;
use crate::status::view::{ClusterView, Served};
use crate::status::{STATUS_HISTORY_SAMPLES, STATUS_HOT_LIMIT, STATUS_REFRESH_MS};

/// What the handlers read.
#[derive(Clone)]
pub struct HttpState {
    pub metrics: Arc<Metrics>,
    pub view: Arc<NodeView>,
    pub admin: Arc<AdminServiceImpl>,
    /// The status page's samples, fed by [`crate::status::sampler`].
    pub history: Arc<Mutex<History>>,
    /// What the sampler asks the nodes through.
    pub ops: Ops,
}

impl HttpState {
    pub fn new(
        metrics: Arc<Metrics>,
        view: Arc<NodeView>,
        ops: Ops,
        admin: Arc<AdminServiceImpl>,
    ) -> HttpState {
        HttpState {
            metrics,
            view,
            admin,
            history: Arc::new(Mutex::new(History::new(STATUS_HISTORY_SAMPLES))),
            ops,
        }
    }
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
    let sampler = crate::status::sampler::spawn(
        state.ops.clone(),
        state.history.clone(),
        crate::store::wall_ms,
    );
    let app = axum::Router::new()
        .route("/", get(status_page))
        .route("/metrics", get(metrics))
        .route("/status.json", get(status_json))
        .route("/healthz", get(healthz))
        .with_state(state)
        .into_make_service_with_connect_info::<AdminPeer>();
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    // The sampler stops with the port: nobody reads its samples after.
    let stop = async move {
        let _ = stop_rx.await;
        sampler.abort();
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

async fn status_page(
    ConnectInfo(peer): ConnectInfo<AdminPeer>,
    State(state): State<HttpState>,
) -> Response {
    if !peer.is_admin() {
        return forbidden();
    }
    let listed = cluster_view(&state).await;
    let history = state.history.lock().unwrap_or_else(PoisonError::into_inner);
    let (code, content) = match &listed {
        Ok(view) => (StatusCode::OK, page::Content::View(view)),
        Err(status) => (
            StatusCode::SERVICE_UNAVAILABLE,
            page::Content::Unavailable {
                node_id: state.view.node_id,
                reason: status.message(),
            },
        ),
    };
    let html = page::render(content, &history, STATUS_REFRESH_MS);
    (code, [(header::CACHE_CONTROL, "no-store")], Html(html)).into_response()
}

async fn status_json(
    ConnectInfo(peer): ConnectInfo<AdminPeer>,
    State(state): State<HttpState>,
) -> Response {
    if !peer.is_admin() {
        return forbidden();
    }
    let (code, body) = match cluster_view(&state).await {
        Ok(view) => {
            // The charts' figures, one entry per sampling interval.
            let points = state
                .history
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .points();
            let mut body =
                serde_json::to_value(&view).unwrap_or_else(|e| json!({ "error": e.to_string() }));
            body["series"] = serde_json::to_value(points).unwrap_or_default();
            (StatusCode::OK, body)
        }
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

/// The cluster as the admin API reports it, shaped for the page.
async fn cluster_view(state: &HttpState) -> Result<ClusterView, tonic::Status> {
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
    let served = Served {
        by_node: state.view.node_id,
        insecure: state.view.insecure,
        at_ms: crate::store::wall_ms(),
    };
    Ok(ClusterView::from_admin(served, &nodes, &shards, &hot))
}
