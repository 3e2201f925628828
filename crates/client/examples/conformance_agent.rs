//! The Rust conformance agent (`clients/conformance/PROTOCOL.md`): drives
//! `fencelock-client` on behalf of the conformance suite, JSON lines on
//! stdin/stdout. Commands run concurrently, each on its own task.
//!
//! Build: `cargo build -p fencelock-client --example conformance_agent`.

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fencelock_client::{
    AcquireOptions, Client, ClientConfig, ClientError, ClientTls, LeaseStatus, LockGuard,
    LostReason, RequestId,
};
use serde_json::{json, Map, Value};

type Reply = Result<Value, Value>;

#[derive(Default)]
struct Agent {
    client: Mutex<Option<Client>>,
    leases: Mutex<HashMap<String, Arc<LockGuard>>>,
    next: AtomicU64,
}

fn emit(msg: Value) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{msg}");
    let _ = out.flush();
}

fn err(kind: &str, message: impl ToString, reason: Option<String>, code: Option<String>) -> Value {
    json!({"kind": kind, "reason": reason, "code": code, "message": message.to_string()})
}

fn reason_name(reason: i32) -> String {
    match fencelock_client::proto::Reason::try_from(reason) {
        Ok(r) => r.as_str_name().trim_start_matches("REASON_").to_string(),
        Err(_) => format!("REASON_{reason}"),
    }
}

/// gRPC code names as in the protocol (`ABORTED`, ...).
fn code_name(code: tonic::Code) -> String {
    const NAMES: [&str; 17] = [
        "OK",
        "CANCELLED",
        "UNKNOWN",
        "INVALID_ARGUMENT",
        "DEADLINE_EXCEEDED",
        "NOT_FOUND",
        "ALREADY_EXISTS",
        "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED",
        "FAILED_PRECONDITION",
        "ABORTED",
        "OUT_OF_RANGE",
        "UNIMPLEMENTED",
        "INTERNAL",
        "UNAVAILABLE",
        "DATA_LOSS",
        "UNAUTHENTICATED",
    ];
    NAMES
        .get(code as usize)
        .map_or_else(|| format!("CODE_{}", code as i32), |s| s.to_string())
}

fn map_error(e: &ClientError) -> Value {
    match e {
        ClientError::Rejected(detail) => err(
            "rejected",
            e,
            Some(reason_name(detail.reason)),
            Some(code_name(detail.code())),
        ),
        ClientError::Unavailable { .. } => err("unavailable", e, None, None),
        ClientError::LeaseEnded { state, .. } => err(
            "lease_ended",
            e,
            Some(
                state
                    .as_str_name()
                    .trim_start_matches("LEASE_STATE_")
                    .to_string(),
            ),
            None,
        ),
        ClientError::InvalidConfig(_) | ClientError::InvalidEndpoint { .. } => {
            err("invalid_config", e, None, None)
        }
        ClientError::InvalidArgument(_) => err("invalid_argument", e, None, None),
        ClientError::Grpc(status) => err("rejected", e, None, Some(code_name(status.code()))),
    }
}

fn ms_until(deadline: Instant) -> i64 {
    let now = Instant::now();
    if deadline >= now {
        (deadline - now).as_millis() as i64
    } else {
        -((now - deadline).as_millis() as i64)
    }
}

fn lost_name(reason: LostReason) -> &'static str {
    match reason {
        LostReason::NotHeld => "not_held",
        LostReason::Unconfirmed => "unconfirmed",
        LostReason::Released => "released",
    }
}

fn str_arg<'a>(m: &'a Map<String, Value>, key: &str) -> Result<&'a str, Value> {
    m.get(key).and_then(Value::as_str).ok_or_else(|| {
        err(
            "agent",
            format!("missing string argument {key}"),
            None,
            None,
        )
    })
}

fn u64_arg(m: &Map<String, Value>, key: &str) -> u64 {
    m.get(key).and_then(Value::as_u64).unwrap_or(0)
}

impl Agent {
    fn client(&self) -> Result<Client, Value> {
        self.client
            .lock()
            .unwrap()
            .clone()
            .ok_or_else(|| err("agent", "connect first", None, None))
    }

    fn lease(&self, m: &Map<String, Value>) -> Result<Arc<LockGuard>, Value> {
        let handle = str_arg(m, "handle")?;
        self.leases
            .lock()
            .unwrap()
            .get(handle)
            .cloned()
            .ok_or_else(|| err("agent", format!("unknown handle {handle:?}"), None, None))
    }

    fn status(guard: &LockGuard) -> Value {
        let lost = match *guard.subscribe().borrow() {
            LeaseStatus::Lost(reason) => Some(lost_name(reason)),
            LeaseStatus::Held { .. } => None,
        };
        // The watch turns Lost at stop-by within milliseconds; `is_held`
        // checks the deadline itself.
        let lost = lost.or_else(|| (Instant::now() >= guard.stop_by()).then_some("unconfirmed"));
        json!({
            "held": guard.is_held(),
            "lost": lost.is_some(),
            "lost_reason": lost,
            "stop_by_in_ms": ms_until(guard.stop_by()),
            "token": guard.token().to_string(),
        })
    }

    async fn handle(self: Arc<Self>, op: &str, m: Map<String, Value>) -> Reply {
        match op {
            "hello" => Ok(
                json!({"agent": "rust", "client_version": env!("CARGO_PKG_VERSION"), "protocol": 1}),
            ),
            "connect" => {
                let endpoints: Vec<String> = m
                    .get("endpoints")
                    .and_then(Value::as_array)
                    .map(|a| {
                        a.iter()
                            .filter_map(|v| v.as_str().map(String::from))
                            .collect()
                    })
                    .unwrap_or_default();
                let mut config = ClientConfig::default();
                if let Some(tls) = m.get("tls").and_then(Value::as_object) {
                    let get = |k: &str| tls.get(k).and_then(Value::as_str).unwrap_or_default();
                    config.tls = Some(
                        ClientTls::from_files(get("ca_file"), get("cert_file"), get("key_file"))
                            .map_err(|e| map_error(&e))?,
                    );
                }
                if let Some(v) = m.get("stop_by_margin_percent").and_then(Value::as_u64) {
                    config.stop_by_margin_percent = v as u32;
                }
                if let Some(v) = m.get("call_timeout_ms").and_then(Value::as_u64) {
                    config.call_timeout_ms = v;
                }
                if let Some(v) = m.get("attempt_timeout_ms").and_then(Value::as_u64) {
                    config.attempt_timeout_ms = v;
                }
                let client = Client::connect(endpoints, config)
                    .await
                    .map_err(|e| map_error(&e))?;
                *self.client.lock().unwrap() = Some(client);
                Ok(json!({}))
            }
            "acquire" => {
                let client = self.client()?;
                let resource = str_arg(&m, "resource")?;
                let request_id = match m.get("request_id").and_then(Value::as_str) {
                    Some(hex_id) => Some(
                        RequestId::from_bytes(
                            hex::decode(hex_id).map_err(|e| err("agent", e, None, None))?,
                        )
                        .map_err(|e| map_error(&e))?,
                    ),
                    None => None,
                };
                let guard = client
                    .acquire_with(
                        resource,
                        AcquireOptions {
                            lease_ttl_ms: u64_arg(&m, "ttl_ms"),
                            wait_timeout_ms: u64_arg(&m, "wait_ms"),
                            request_id,
                            value: Vec::new(),
                            ..Default::default()
                        },
                    )
                    .await
                    .map_err(|e| map_error(&e))?;
                let handle = match m.get("handle").and_then(Value::as_str) {
                    Some(h) => h.to_string(),
                    None => format!("h{}", self.next.fetch_add(1, Ordering::Relaxed) + 1),
                };
                let reply = json!({
                    "handle": handle,
                    "token": guard.token().to_string(),
                    "lease_ttl_ms": guard.lease_ttl_ms(),
                    "deduplicated": guard.deduplicated(),
                    "shard_id": guard.shard_id(),
                    "request_id": guard.request_id().to_string(),
                    "stop_by_in_ms": ms_until(guard.stop_by()),
                });
                let h = handle.clone();
                let watch_guard = guard.subscribe();
                guard.on_lost(move |reason| {
                    let stop_by = match *watch_guard.borrow() {
                        LeaseStatus::Held { stop_by, .. } => ms_until(stop_by),
                        LeaseStatus::Lost(_) => 0,
                    };
                    emit(json!({"event": "lost", "handle": h, "lost_reason": lost_name(reason), "stop_by_in_ms": stop_by}));
                });
                self.leases.lock().unwrap().insert(handle, Arc::new(guard));
                Ok(reply)
            }
            "status" => {
                let guard = self.lease(&m)?;
                Ok(Self::status(&guard))
            }
            "wait_lost" => {
                let guard = self.lease(&m)?;
                let timeout = Duration::from_millis(u64_arg(&m, "timeout_ms"));
                let _ = tokio::time::timeout(timeout, guard.lost()).await;
                let st = Self::status(&guard);
                Ok(
                    json!({"lost": st["lost"], "lost_reason": st["lost_reason"], "stop_by_in_ms": st["stop_by_in_ms"]}),
                )
            }
            "release" => {
                let handle = str_arg(&m, "handle")?.to_string();
                let guard = self.leases.lock().unwrap().remove(&handle).ok_or_else(|| {
                    err("agent", format!("unknown handle {handle:?}"), None, None)
                })?;
                let guard = Arc::try_unwrap(guard)
                    .map_err(|_| err("agent", "lease busy in another command", None, None))?;
                let released = guard.release().await.map_err(|e| map_error(&e))?;
                Ok(json!({"released": released}))
            }
            "get" => {
                let client = self.client()?;
                let g = client
                    .get(str_arg(&m, "resource")?)
                    .await
                    .map_err(|e| map_error(&e))?;
                Ok(json!({
                    "held": g.held, "token": g.fencing_token.to_string(),
                    "last_token": g.last_token.to_string(), "queue_length": g.queue_length,
                    "shard_id": g.shard_id, "epoch": g.epoch,
                }))
            }
            "fenced_write" => {
                let guard = self.lease(&m)?;
                let check = m
                    .get("check_lease")
                    .and_then(Value::as_bool)
                    .unwrap_or(true);
                if check && !guard.is_held() {
                    return Err(err(
                        "lost",
                        "the lease is lost or past its stop-by; nothing was written",
                        None,
                        None,
                    ));
                }
                let store = str_arg(&m, "store")?;
                let line = json!({
                    "key": str_arg(&m, "key")?,
                    "token": guard.token().to_string(),
                    "value": m.get("value").and_then(Value::as_str).unwrap_or(""),
                });
                // Blocking std I/O on a blocking thread, bounded by 5 s.
                let store = store.to_string();
                let io = tokio::task::spawn_blocking(move || -> std::io::Result<String> {
                    use std::net::ToSocketAddrs;
                    let addr = store.to_socket_addrs()?.next().ok_or_else(|| {
                        std::io::Error::new(std::io::ErrorKind::NotFound, "no address")
                    })?;
                    let mut s =
                        std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
                    s.set_read_timeout(Some(Duration::from_secs(5)))?;
                    s.set_write_timeout(Some(Duration::from_secs(5)))?;
                    s.write_all(format!("{line}\n").as_bytes())?;
                    let mut answer = String::new();
                    std::io::BufReader::new(s).read_line(&mut answer)?;
                    Ok(answer)
                });
                let answer = io
                    .await
                    .map_err(|e| err("agent", e, None, None))?
                    .map_err(|e| err("agent", e, None, None))?;
                let v: Value =
                    serde_json::from_str(&answer).map_err(|e| err("agent", e, None, None))?;
                if let Some(e) = v.get("error") {
                    return Err(err("agent", format!("fenced store: {e}"), None, None));
                }
                Ok(json!({"accepted": v["accepted"], "highest": v["highest"]}))
            }
            "stats" => {
                let s = self.client()?.stats();
                Ok(
                    json!({"renew_calls": s.renew_batch_calls, "renewed_items": s.renewed_items, "renew_failures": s.renew_failures}),
                )
            }
            other => Err(err(
                "unsupported",
                format!("unknown op {other:?}"),
                None,
                None,
            )),
        }
    }
}

#[tokio::main]
async fn main() {
    let agent = Arc::new(Agent::default());
    // stdin is read on a thread (blocking), commands run as tasks.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut tasks = Vec::new();
    while let Some(line) = rx.recv().await {
        if line.trim().is_empty() {
            continue;
        }
        let msg: Value = match serde_json::from_str(&line) {
            Ok(v) => v,
            Err(e) => {
                emit(
                    json!({"id": null, "ok": false, "error": err("agent", format!("bad JSON: {e}"), None, None)}),
                );
                continue;
            }
        };
        let agent = agent.clone();
        tasks.push(tokio::spawn(async move {
            let id = msg.get("id").cloned().unwrap_or(Value::Null);
            let op = msg
                .get("op")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            let args = msg.as_object().cloned().unwrap_or_default();
            match agent.handle(&op, args).await {
                Ok(Value::Object(mut fields)) => {
                    fields.insert("id".into(), id);
                    fields.insert("ok".into(), Value::Bool(true));
                    emit(Value::Object(fields));
                }
                Ok(_) => emit(json!({"id": id, "ok": true})),
                Err(error) => emit(json!({"id": id, "ok": false, "error": error})),
            }
        }));
    }
    // EOF: release what is held, at most 2 s.
    let guards: Vec<Arc<LockGuard>> = agent
        .leases
        .lock()
        .unwrap()
        .drain()
        .map(|(_, g)| g)
        .collect();
    let release = async {
        for g in guards {
            if let Ok(g) = Arc::try_unwrap(g) {
                let _ = g.release().await;
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(2), release).await;
    let _ = tasks;
}
