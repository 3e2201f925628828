//! `fencelock acquire | renew | release | get`: one request each.
//!
//! The calls go through the `fencelock-client` library (its unguarded
//! calls: no background renewal, the lease outlives the command), so the
//! CLI follows exactly the library's routing and retry rules: leader hints
//! followed, UNAVAILABLE answers retried with jittered backoff on the next
//! of `--endpoints`, one `request_id` across an acquire's retries (never
//! granted twice), all within the call's deadline.

use clap::Args;
use fencelock_api::v1::{
    ErrorDetail, LeaseState, Reason, RetryPolicy, Revision, WatchEvent, WatchEventKind,
};
use fencelock_client::{AcquireOptions, Client, ClientConfig, ClientError, RequestId};
use tonic::Code;

use super::diagnose::Diagnosis;
use super::json::{Object, Value};
use super::{ClientOpts, Output, EXIT_LOCK, EXIT_OK, EXIT_OTHER, EXIT_UNAVAILABLE, EXIT_USAGE};

/// Bytes given in hex on the command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hex(Vec<u8>);

fn parse_request_id(s: &str) -> Result<Hex, String> {
    let bytes = hex::decode(s).map_err(|e| format!("not hex: {e}"))?;
    if bytes.is_empty() || bytes.len() > fencelock_statemachine::limits::MAX_REQUEST_ID_LEN {
        return Err(format!(
            "must be 1..={} bytes (2 hex digits per byte), got {}",
            fencelock_statemachine::limits::MAX_REQUEST_ID_LEN,
            bytes.len()
        ));
    }
    Ok(Hex(bytes))
}

fn parse_lease_id(s: &str) -> Result<Hex, String> {
    let bytes = hex::decode(s).map_err(|e| format!("not hex: {e}"))?;
    let len = fencelock_statemachine::limits::LEASE_ID_LEN;
    if bytes.len() != len {
        return Err(format!(
            "must be {len} bytes ({} hex digits), got {} bytes",
            2 * len,
            bytes.len()
        ));
    }
    Ok(Hex(bytes))
}

#[derive(Debug, Args)]
pub struct AcquireArgs {
    /// The resource, `tenant/path` (for example `demo/orders/42`).
    resource: String,
    /// Lease TTL in milliseconds. Absent or 0: the server's default.
    #[arg(long, value_name = "MS")]
    ttl_ms: Option<u64>,
    /// Wait up to this long in the resource's queue if it is held. 0: fail at
    /// once with LOCK_HELD.
    #[arg(long, value_name = "MS", default_value_t = 0)]
    wait_ms: u64,
    /// The acquire's request id in hex (1 to 64 bytes). Default: 16 random
    /// bytes, printed so that an acquire whose outcome is unknown can be
    /// retried with the same id (it is then never granted twice).
    #[arg(long, value_name = "HEX", value_parser = parse_request_id)]
    request_id: Option<Hex>,
    /// What the lease publishes while it holds (`fencelock get` shows it):
    /// for an election, the leader's address. At most 4096 bytes. Refused
    /// (FEATURE_NOT_ENABLED) while a member runs a build without values.
    #[arg(long, value_name = "TEXT")]
    value: Option<String>,
    #[command(flatten)]
    mode: crate::ModeArgs,
    #[command(flatten)]
    opts: ClientOpts,
}

#[derive(Debug, Args)]
pub struct RenewArgs {
    /// The resource the lease holds.
    resource: String,
    /// The lease id printed by `acquire` (32 hex digits).
    #[arg(value_name = "LEASE_ID_HEX", value_parser = parse_lease_id)]
    lease_id: Hex,
    /// New lease TTL in milliseconds. Absent or 0: keep the lease's TTL.
    #[arg(long, value_name = "MS")]
    ttl_ms: Option<u64>,
    #[command(flatten)]
    opts: ClientOpts,
}

#[derive(Debug, Args)]
pub struct ReleaseArgs {
    /// The resource the lease holds.
    resource: String,
    /// The lease id printed by `acquire` (32 hex digits).
    #[arg(value_name = "LEASE_ID_HEX", value_parser = parse_lease_id)]
    lease_id: Hex,
    #[command(flatten)]
    opts: ClientOpts,
}

#[derive(Debug, Args)]
pub struct GetArgs {
    /// The resource to inspect.
    resource: String,
    #[command(flatten)]
    opts: ClientOpts,
}

#[derive(Debug, Args)]
pub struct WatchArgs {
    /// The resource to follow.
    resource: String,
    /// Resume after this revision (`EPOCH.INDEX.SEQ`, as a previous watch
    /// printed it): the changes after it, or the state now marked `gap`
    /// when the nodes no longer keep them. Absent: start with the state
    /// now.
    #[arg(long, value_name = "REVISION", value_parser = parse_revision)]
    after: Option<Revision>,
    #[command(flatten)]
    opts: ClientOpts,
}

/// `3.1204.0` → the revision epoch 3, index 1204, seq 0.
fn parse_revision(text: &str) -> Result<Revision, String> {
    let parts: Vec<&str> = text.split('.').collect();
    let bad = || format!("{text:?} is not a revision: expected EPOCH.INDEX.SEQ, e.g. 3.1204.0");
    let [epoch, index, seq] = parts[..] else {
        return Err(bad());
    };
    Ok(Revision {
        epoch: epoch.parse().map_err(|_| bad())?,
        index: index.parse().map_err(|_| bad())?,
        seq: seq.parse().map_err(|_| bad())?,
    })
}

fn revision_text(revision: &Option<Revision>) -> String {
    revision.as_ref().map_or_else(String::new, |r| {
        format!("{}.{}.{}", r.epoch, r.index, r.seq)
    })
}

pub async fn watch(args: WatchArgs) -> u8 {
    let client = match client_for(&args.opts).await {
        Ok(client) => client,
        Err(code) => return code,
    };
    let mut after = args.after;
    let context = || Object::new().with("resource", args.resource.as_str());
    loop {
        let mut stream = tokio::select! {
            started = client.watch(&args.resource, after) => match started {
                Ok(stream) => stream,
                Err(e) => return report_client_error(&args.opts, &e, context()).await,
            },
            _ = tokio::signal::ctrl_c() => return EXIT_OK,
        };
        let ended = loop {
            let message = tokio::select! {
                m = stream.message() => m,
                _ = tokio::signal::ctrl_c() => return EXIT_OK,
            };
            match message {
                Ok(Some(event)) => {
                    after = event.revision.or(after);
                    print_watch_event(&args, &event);
                }
                Ok(None) => {
                    break ClientError::Grpc(Box::new(tonic::Status::unavailable(
                        "the node ended the watch",
                    )))
                }
                Err(status) => break ClientError::from_status(status),
            }
        };
        if !ended.resumes_watch() {
            return report_client_error(&args.opts, &ended, context()).await;
        }
        if args.opts.verbose {
            eprintln!(
                "fencelock: watch ended ({}); resuming after {}",
                status_of(&ended).message(),
                revision_text(&after)
            );
        }
    }
}

fn print_watch_event(args: &WatchArgs, event: &WatchEvent) {
    let kind = WatchEventKind::try_from(event.kind).unwrap_or(WatchEventKind::Unspecified);
    let name = kind
        .as_str_name()
        .strip_prefix("WATCH_EVENT_KIND_")
        .unwrap_or("UNSPECIFIED")
        .to_ascii_lowercase();
    let revision = revision_text(&event.revision);
    match args.opts.output {
        Output::Json => {
            let object = Object::new()
                .with("resource", args.resource.as_str())
                .with("revision", revision.as_str())
                .with("event", name.as_str())
                .with("held", event.held)
                .with("fencing_token", event.fencing_token)
                .with("value", printable_value(&event.value).as_str())
                .with("expires_at_ms", event.expires_at_ms)
                .with("gap", event.gap)
                .with("shard_id", event.shard_id);
            println!("{}", object.render());
        }
        Output::Human => {
            let mut line = format!("{revision} {name}");
            if kind == WatchEventKind::State {
                line.push_str(if event.held { " held" } else { " free" });
            }
            if event.fencing_token != 0 {
                line.push_str(&format!(" token={}", event.fencing_token));
            }
            if !event.value.is_empty() {
                line.push_str(&format!(" value={}", printable_value(&event.value)));
            }
            if event.gap {
                line.push_str(" (gap: earlier changes were not kept)");
            }
            println!("{line}");
        }
    }
}

/// A client for `opts` (endpoints, TLS, `--verbose` logging of the
/// library's retries), or the exit code after saying why not.
async fn client_for(opts: &ClientOpts) -> Result<Client, u8> {
    if opts.verbose {
        super::lock::init_verbose_logging();
    }
    let tls = opts.tls.client_tls().map_err(|e| {
        eprintln!("error: {e}");
        EXIT_USAGE
    })?;
    let config = ClientConfig {
        tls,
        ..ClientConfig::default()
    };
    match Client::connect(super::resolve_endpoints(&opts.endpoints), config).await {
        Ok(client) => Ok(client),
        Err(e) => Err(report_client_error(opts, &e, Object::new()).await),
    }
}

pub async fn acquire(args: AcquireArgs) -> u8 {
    let client = match client_for(&args.opts).await {
        Ok(client) => client,
        Err(code) => return code,
    };
    let request_id = match args.request_id {
        Some(Hex(bytes)) => match RequestId::from_bytes(bytes) {
            Ok(id) => id,
            Err(e) => return report_client_error(&args.opts, &e, Object::new()).await,
        },
        None => RequestId::random(),
    };
    let request_id_hex = request_id.to_string();
    let options = AcquireOptions {
        lease_ttl_ms: args.ttl_ms.unwrap_or(0),
        wait_timeout_ms: args.wait_ms,
        request_id: Some(request_id),
        value: args.value.clone().unwrap_or_default().into_bytes(),
        mode: args.mode.mode(),
    };
    let response = match client.acquire_unguarded(&args.resource, options).await {
        Ok((response, _)) => response,
        Err(error) => {
            let context = Object::new()
                .with("resource", args.resource.as_str())
                .with("request_id", request_id_hex.as_str());
            // A request that never got a connection cannot have been granted.
            let note = matches!(error, ClientError::Unavailable { sent: true, .. }).then(|| {
                format!(
                    "note: the acquire may have been granted; retry it with --request-id \
                     {request_id_hex} to get its outcome without a second grant"
                )
            });
            return report_with_note(&args.opts, &error, context, note).await;
        }
    };
    let state = response.lease_state();
    let object = Object::new()
        .with("ok", true)
        .with("resource", args.resource.as_str())
        .with("lease_id", hex::encode(&response.lease_id))
        .with("fencing_token", response.fencing_token)
        .with("expires_at_ms", response.expires_at_ms)
        .with("lease_ttl_ms", response.lease_ttl_ms)
        .with("lease_state", lease_state_name(state))
        .with("deduplicated", response.deduplicated)
        .with("shard_id", response.shard_id)
        .with("epoch", response.epoch)
        .with("request_id", request_id_hex);
    print_success(&args.opts, &format!("acquired {}", args.resource), &object);
    if state != LeaseState::Held {
        // A retry of an acquire whose lease has since ended: it reports the
        // original lease, which the caller no longer holds.
        eprintln!(
            "error: LEASE_NOT_HELD: this request id's lease is {}; you do not hold {} \
             (acquire again with a new request id)",
            lease_state_name(state),
            args.resource
        );
        return EXIT_LOCK;
    }
    EXIT_OK
}

pub async fn renew(args: RenewArgs) -> u8 {
    let client = match client_for(&args.opts).await {
        Ok(client) => client,
        Err(code) => return code,
    };
    let renewed = client
        .renew_unguarded(&args.resource, &args.lease_id.0, args.ttl_ms.unwrap_or(0))
        .await;
    match renewed {
        Ok(response) => {
            let object = Object::new()
                .with("ok", true)
                .with("resource", args.resource.as_str())
                .with("expires_at_ms", response.expires_at_ms)
                .with("lease_ttl_ms", response.lease_ttl_ms);
            print_success(&args.opts, &format!("renewed {}", args.resource), &object);
            EXIT_OK
        }
        Err(error) => {
            let context = Object::new().with("resource", args.resource.as_str());
            report_client_error(&args.opts, &error, context).await
        }
    }
}

pub async fn release(args: ReleaseArgs) -> u8 {
    let client = match client_for(&args.opts).await {
        Ok(client) => client,
        Err(code) => return code,
    };
    match client
        .release_unguarded(&args.resource, &args.lease_id.0)
        .await
    {
        Ok(released) => {
            let object = Object::new()
                .with("ok", released)
                .with("resource", args.resource.as_str())
                .with("released", released);
            if released {
                print_success(&args.opts, &format!("released {}", args.resource), &object);
                EXIT_OK
            } else {
                if args.opts.output == Output::Json {
                    println!("{}", object.render());
                }
                eprintln!(
                    "error: LEASE_NOT_HELD: the lease did not hold {} (already released, expired, \
                     superseded or never granted); nothing was changed",
                    args.resource
                );
                EXIT_LOCK
            }
        }
        Err(error) => {
            let context = Object::new().with("resource", args.resource.as_str());
            report_client_error(&args.opts, &error, context).await
        }
    }
}

pub async fn get(args: GetArgs) -> u8 {
    let client = match client_for(&args.opts).await {
        Ok(client) => client,
        Err(code) => return code,
    };
    match client.get(&args.resource).await {
        Ok(response) => {
            let object = Object::new()
                .with("ok", true)
                .with("resource", args.resource.as_str())
                .with("held", response.held)
                .with("fencing_token", response.fencing_token)
                .with("expires_at_ms", response.expires_at_ms)
                .with("queue_length", response.queue_length)
                .with("last_token", response.last_token)
                .with("shard_id", response.shard_id)
                .with("epoch", response.epoch)
                .with("value", printable_value(&response.value).as_str())
                .with("mode", mode_name(response.mode()))
                .with("permits", response.permits);
            // Every holding of a shared lock or a semaphore, oldest first.
            let object = if response.holders.len() > 1 {
                let holders: Vec<Object> = (response.holders.iter())
                    .map(|h| {
                        Object::new()
                            .with("fencing_token", h.fencing_token)
                            .with("expires_at_ms", h.expires_at_ms)
                            .with("value", printable_value(&h.value).as_str())
                    })
                    .collect();
                object.with("holders", holders)
            } else {
                object
            };
            let headline = if response.holders.len() > 1 {
                let tokens: Vec<String> = (response.holders.iter())
                    .map(|h| h.fencing_token.to_string())
                    .collect();
                format!(
                    "{} is held by {} holders (tokens {})",
                    args.resource,
                    tokens.len(),
                    tokens.join(", ")
                )
            } else if response.held {
                format!("{} is held", args.resource)
            } else {
                format!("{} is free", args.resource)
            };
            print_success(&args.opts, &headline, &object);
            EXIT_OK
        }
        Err(error) => {
            let context = Object::new().with("resource", args.resource.as_str());
            report_client_error(&args.opts, &error, context).await
        }
    }
}

/// A mode's name as `get` prints it.
fn mode_name(mode: fencelock_client::proto::AcquireMode) -> &'static str {
    use fencelock_client::proto::AcquireMode as Wire;
    match mode {
        Wire::Exclusive => "exclusive",
        Wire::Shared => "shared",
        Wire::Semaphore => "semaphore",
    }
}

/// A holder value as text: itself when it is printable UTF-8, else `hex:`
/// and its bytes in hex (never raw bytes on a terminal).
fn printable_value(value: &[u8]) -> String {
    match std::str::from_utf8(value) {
        Ok(text) if !text.chars().any(char::is_control) => text.to_owned(),
        _ => format!("hex:{}", hex::encode(value)),
    }
}

/// `127.0.0.1:7001` → `http://127.0.0.1:7001`; URLs stay as they are.
pub fn endpoint_url(endpoint: &str) -> String {
    if endpoint.contains("://") {
        endpoint.to_owned()
    } else {
        format!("http://{endpoint}")
    }
}

/// A library error as the status the error contract would have sent: the
/// server's detail where there is one, UNAVAILABLE for "no definitive
/// answer", INVALID_ARGUMENT for what the library refused itself.
fn status_of(error: &ClientError) -> tonic::Status {
    match error {
        ClientError::Rejected(detail) => detail.to_status(),
        ClientError::Grpc(status) => (**status).clone(),
        ClientError::Unavailable { .. } => tonic::Status::unavailable(error.to_string()),
        ClientError::InvalidConfig(_)
        | ClientError::InvalidEndpoint { .. }
        | ClientError::InvalidArgument(_) => tonic::Status::invalid_argument(error.to_string()),
        ClientError::LeaseEnded { .. } => tonic::Status::failed_precondition(error.to_string()),
    }
}

/// Prints `error: REASON: message` to stderr (and, with `--output json`, the
/// error as JSON on stdout), then for a failure without an answer a `hint:`
/// line naming the cause (`diagnose`); returns the exit code.
async fn report_client_error(opts: &ClientOpts, error: &ClientError, context: Object) -> u8 {
    report_with_note(opts, error, context, None).await
}

/// [`report_client_error`] with a note for an unknown outcome, left out
/// when the probes show the request cannot have reached a lock service.
async fn report_with_note(
    opts: &ClientOpts,
    error: &ClientError,
    context: Object,
    unknown_outcome_note: Option<String>,
) -> u8 {
    let status = status_of(error);
    let (reason, message) = describe(&status);
    let no_answer = match error {
        ClientError::Unavailable { .. } => true,
        ClientError::Grpc(status) => ErrorDetail::from_status(status).is_none(),
        _ => false,
    };
    let diagnosis = if no_answer {
        Some(Diagnosis::of(&super::resolve_endpoints(&opts.endpoints), opts.tls.given()).await)
    } else {
        None
    };
    eprintln!("error: {reason}: {message}");
    if opts.output == Output::Json {
        println!("{}", error_object(&status, context).render());
    }
    if let Some(note) = unknown_outcome_note {
        if Diagnosis::may_have_reached_a_node(diagnosis.as_ref()) {
            eprintln!("{note}");
        }
    }
    if let Some(diagnosis) = &diagnosis {
        diagnosis.print();
    }
    exit_code_of(error)
}

/// The exit code for a failed client call (the table in `EXIT_CODES_HELP`):
/// that of the status the error stands for, and EXIT_LOCK for a lease that
/// ended.
pub(crate) fn exit_code_of(error: &ClientError) -> u8 {
    match error {
        ClientError::LeaseEnded { .. } => EXIT_LOCK,
        _ => exit_code(&status_of(error)),
    }
}

/// `InvalidArgument` → `INVALID_ARGUMENT`.
fn code_name(code: Code) -> String {
    let mut name = String::new();
    for (i, c) in format!("{code:?}").chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            name.push('_');
        }
        name.push(c.to_ascii_uppercase());
    }
    name
}

fn reason_name(detail: &ErrorDetail) -> String {
    match Reason::try_from(detail.reason) {
        Ok(reason) => {
            let name = reason.as_str_name();
            name.strip_prefix("REASON_").unwrap_or(name).to_owned()
        }
        Err(_) => format!("REASON_{}", detail.reason),
    }
}

fn lease_state_name(state: LeaseState) -> &'static str {
    let name = state.as_str_name();
    name.strip_prefix("LEASE_STATE_").unwrap_or(name)
}

/// The reason (or, without a detail, the gRPC code) and the message.
fn describe(status: &tonic::Status) -> (String, String) {
    match ErrorDetail::from_status(status) {
        Some(detail) => (reason_name(&detail), detail.message),
        None => (code_name(status.code()), status.message().to_owned()),
    }
}

/// The exit code for a failed call (see `EXIT_CODES_HELP`).
pub fn exit_code(status: &tonic::Status) -> u8 {
    if let Some(detail) = ErrorDetail::from_status(status) {
        match detail.reason() {
            Reason::LockHeld
            | Reason::WaitTimedOut
            | Reason::QueueFull
            | Reason::TenantWaitersExceeded
            | Reason::TenantQuotaExceeded
            | Reason::LeaseNotHeld
            | Reason::HoldLimitReached => return EXIT_LOCK,
            _ => {}
        }
    }
    match status.code() {
        Code::InvalidArgument => EXIT_USAGE,
        Code::Unavailable | Code::DeadlineExceeded => EXIT_UNAVAILABLE,
        _ => EXIT_OTHER,
    }
}

/// The error as a flat JSON object: `context`, then every field of the
/// detail that is set.
fn error_object(status: &tonic::Status, context: Object) -> Object {
    let (reason, message) = describe(status);
    let mut object = Object::new().with("ok", false);
    for (key, value) in context.fields() {
        object = object.with(key, value.clone());
    }
    object = object
        .with("reason", reason)
        .with("code", code_name(status.code()))
        .with("message", message);
    let Some(d) = ErrorDetail::from_status(status) else {
        return object;
    };
    let retry = match RetryPolicy::try_from(d.retry) {
        Ok(RetryPolicy::Unspecified) | Err(_) => fencelock_api::status::default_retry(d.reason()),
        Ok(policy) => policy,
    };
    let retry = retry.as_str_name();
    object = object.with(
        "retry",
        retry.strip_prefix("RETRY_POLICY_").unwrap_or(retry),
    );
    let numbers = [
        ("retry_after_ms", d.retry_after_ms),
        ("shard_id", d.shard_id),
        ("current_epoch", d.current_epoch),
        ("map_version", d.map_version),
        ("holder_expires_at_ms", d.holder_expires_at_ms),
        ("queue_length", u64::from(d.queue_length)),
        ("min_allowed", d.min_allowed),
        ("max_allowed", d.max_allowed),
    ];
    for (key, value) in numbers {
        if value != 0 {
            object = object.with(key, value);
        }
    }
    if !d.field.is_empty() {
        object = object.with("field", d.field.clone());
    }
    if let Some(leader) = &d.leader {
        object = object
            .with("leader_node_id", leader.node_id)
            .with("leader_address", leader.address.clone());
    }
    object
}

fn print_success(opts: &ClientOpts, headline: &str, object: &Object) {
    match opts.output {
        Output::Json => println!("{}", object.render()),
        Output::Human => {
            println!("{headline}");
            let now_ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64);
            for (key, value) in object.fields() {
                if *key != "ok" && *key != "resource" {
                    let (key, value) = human_field(key, value, now_ms);
                    println!("  {key:<14} {value}");
                }
            }
        }
    }
}

/// A field as a person reads it: a `..._at_ms` wall-clock time as "in
/// 29.8 s (2026-12-02T01:52:18Z)" relative to `now_ms`, a `..._ms` duration
/// in seconds; the name loses its `_ms`. Everything else as it is. (JSON
/// output keeps the milliseconds, for programs.)
pub fn human_field(key: &str, value: &Value, now_ms: u64) -> (String, String) {
    let Value::U64(ms) = value else {
        return (key.to_owned(), value.to_string());
    };
    if let Some(name) = key.strip_suffix("_at_ms") {
        let when = if *ms == 0 {
            "-".to_owned()
        } else {
            let relative = if *ms >= now_ms {
                format!("in {}", seconds(*ms - now_ms))
            } else {
                format!("{} ago", seconds(now_ms - *ms))
            };
            format!("{relative} ({})", utc_rfc3339(*ms))
        };
        return (format!("{name}_at"), when);
    }
    if let Some(name) = key.strip_suffix("_ms") {
        return (name.to_owned(), seconds(*ms));
    }
    (key.to_owned(), value.to_string())
}

/// `ms` as seconds with one decimal ("29.8 s"), whole ones without ("30 s").
fn seconds(ms: u64) -> String {
    if ms.is_multiple_of(1000) {
        format!("{} s", ms / 1000)
    } else {
        format!("{}.{} s", ms / 1000, (ms % 1000) / 100)
    }
}

/// Milliseconds since the Unix epoch as an RFC 3339 UTC time to the second.
fn utc_rfc3339(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rest) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

/// The proleptic Gregorian date `days` after 1970-01-01 (the days-to-civil
/// arithmetic over 400-year eras of 146097 days).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468; // days since 0000-03-01
    let era = z / 146_097;
    let day_of_era = z % 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153; // 0 = March
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    };
    let year = year_of_era + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(detail: ErrorDetail) -> tonic::Status {
        detail.to_status()
    }

    #[test]
    fn a_revision_reads_as_epoch_index_seq_and_anything_else_is_refused() {
        assert_eq!(
            parse_revision("3.1204.0"),
            Ok(Revision {
                epoch: 3,
                index: 1204,
                seq: 0
            })
        );
        for bad in ["", "3.1204", "3.1204.0.1", "a.b.c", "-1.2.3"] {
            assert!(parse_revision(bad).is_err(), "{bad:?}");
        }
        assert_eq!(revision_text(&parse_revision("7.8.9").ok()), "7.8.9");
    }

    #[test]
    fn a_holder_value_prints_as_text_or_as_hex_never_raw() {
        assert_eq!(printable_value(b"10.0.0.1:7000"), "10.0.0.1:7000");
        assert_eq!(printable_value(b""), "");
        assert_eq!(printable_value(&[0xff, 0]), "hex:ff00");
        assert_eq!(printable_value(b"a\x1b[2Jb"), "hex:611b5b324a62");
    }

    #[test]
    fn exit_codes_follow_the_documented_table() {
        let code = |reason| exit_code(&status(ErrorDetail::new(reason, "")));
        assert_eq!(code(Reason::LockHeld), EXIT_LOCK);
        assert_eq!(code(Reason::WaitTimedOut), EXIT_LOCK);
        assert_eq!(code(Reason::LeaseNotHeld), EXIT_LOCK);
        assert_eq!(code(Reason::InvalidResource), EXIT_USAGE);
        assert_eq!(code(Reason::TtlOutOfRange), EXIT_USAGE);
        assert_eq!(code(Reason::NoQuorum), EXIT_UNAVAILABLE);
        assert_eq!(code(Reason::NotLeader), EXIT_UNAVAILABLE);
        assert_eq!(code(Reason::ServerBusy), EXIT_UNAVAILABLE);
        assert_eq!(code(Reason::Internal), EXIT_OTHER);
        assert_eq!(code(Reason::EpochNotMatch), EXIT_OTHER);
        assert_eq!(
            exit_code(&tonic::Status::deadline_exceeded("")),
            EXIT_UNAVAILABLE
        );
        assert_eq!(exit_code(&tonic::Status::unknown("")), EXIT_OTHER);
    }

    #[test]
    fn errors_print_as_reason_and_message() {
        let s = status(ErrorDetail::new(Reason::LockHeld, "resource is held"));
        assert_eq!(
            describe(&s),
            ("LOCK_HELD".to_owned(), "resource is held".to_owned())
        );
        let s = tonic::Status::unavailable("cannot connect");
        assert_eq!(
            describe(&s),
            ("UNAVAILABLE".to_owned(), "cannot connect".to_owned())
        );
        // The library's errors keep their reason and exit code.
        let held = ClientError::Rejected(Box::new(ErrorDetail::new(Reason::LockHeld, "held")));
        assert_eq!(describe(&status_of(&held)).0, "LOCK_HELD");
        assert_eq!(exit_code(&status_of(&held)), EXIT_LOCK);
        let gone = ClientError::Unavailable {
            timeout_ms: 10,
            attempts: 2,
            last_error: "Unavailable: tcp connect error".into(),
            request_id: None,
            sent: false,
        };
        assert_eq!(exit_code(&status_of(&gone)), EXIT_UNAVAILABLE);
        let bad = ClientError::InvalidArgument("wait too long".into());
        assert_eq!(exit_code(&status_of(&bad)), EXIT_USAGE);
    }

    #[test]
    fn error_json_carries_the_hint_fields() {
        let s = status(ErrorDetail {
            holder_expires_at_ms: 1_700_000_000_000,
            queue_length: 2,
            shard_id: 3,
            ..ErrorDetail::new(Reason::LockHeld, "held")
        });
        let json = error_object(&s, Object::new().with("resource", "demo/a")).render();
        assert_eq!(
            json,
            r#"{"ok":false,"resource":"demo/a","reason":"LOCK_HELD","code":"ABORTED","message":"held","retry":"BACKOFF","shard_id":3,"holder_expires_at_ms":1700000000000,"queue_length":2}"#
        );
    }

    #[test]
    fn people_read_times_and_durations_in_seconds() {
        let now = 1_796_090_000_000; // 2026-12-01T01:53:20Z
        assert_eq!(utc_rfc3339(now), "2026-12-01T01:53:20Z");
        assert_eq!(utc_rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc_rfc3339(951_782_400_000), "2000-02-29T00:00:00Z");
        assert_eq!(utc_rfc3339(4_107_542_399_000), "2100-02-28T23:59:59Z");
        assert_eq!(
            human_field("expires_at_ms", &Value::U64(now + 29_800), now),
            (
                "expires_at".to_owned(),
                "in 29.8 s (2026-12-01T01:53:49Z)".to_owned()
            )
        );
        assert_eq!(
            human_field("expires_at_ms", &Value::U64(now - 2_000), now).1,
            "2 s ago (2026-12-01T01:53:18Z)"
        );
        assert_eq!(human_field("expires_at_ms", &Value::U64(0), now).1, "-");
        assert_eq!(
            human_field("lease_ttl_ms", &Value::U64(30_000), now),
            ("lease_ttl".to_owned(), "30 s".to_owned())
        );
        assert_eq!(
            human_field("fencing_token", &Value::U64(42), now),
            ("fencing_token".to_owned(), "42".to_owned())
        );
    }

    #[test]
    fn ids_parse_from_hex() {
        assert_eq!(parse_request_id("00ff"), Ok(Hex(vec![0, 255])));
        assert!(parse_request_id("").is_err());
        assert!(parse_request_id(&"ab".repeat(65)).is_err());
        assert!(parse_lease_id(&"ab".repeat(16)).is_ok());
        assert!(parse_lease_id(&"ab".repeat(15)).is_err());
        assert_eq!(endpoint_url("10.0.0.1:7001"), "http://10.0.0.1:7001");
        assert_eq!(endpoint_url("https://x:1"), "https://x:1");
    }
}
