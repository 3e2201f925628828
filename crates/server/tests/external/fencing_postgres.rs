//! The decisive end-to-end check: a holder paused past its lease is fenced
//! off by the protected system, a real PostgreSQL server.
//!
//! Client A is a separate process (this test binary, re-run with a filter
//! that selects only `client_a_process`), so it can really be frozen with
//! SIGSTOP: no thread of it runs, no timer of it fires, exactly as in a long
//! GC pause or a VM migration. Meanwhile its lease expires, B is granted the
//! lock with a higher token and writes. A is woken with SIGCONT; its client
//! library (`fencelock-client`'s `LockGuard::lost`) reports the lock lost,
//! and A writes anyway (as a process paused between its check and its write
//! would); PostgreSQL's one-statement conditional upsert rejects it, and the
//! row keeps B's value.

use crate::common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use fencelock_client::{Client, ClientConfig, LostReason};
use fencelock_fencing::testing::PgServer;
use fencelock_fencing::{FenceError, FenceStore, FencedValue, PgFenceStore};
use tokio::sync::mpsc;

/// Set in client A's environment: it is the child, not the scenario.
const ROLE_ENV: &str = "FENCELOCK_FENCING_SCENARIO_ROLE";
const ENDPOINTS_ENV: &str = "FENCELOCK_FENCING_ENDPOINTS";
const PG_ENV: &str = "FENCELOCK_FENCING_PG";
/// The child's entry point, by its function name.
const CLIENT_A_FN: &str = "client_a_process";

/// The libtest name of the child's entry point: its path inside the test
/// binary (this module's path without the crate's name), so that `--exact`
/// selects it wherever this file sits.
fn client_a_test() -> String {
    let module = module_path!().split_once("::").map_or("", |(_, rest)| rest);
    if module.is_empty() {
        CLIENT_A_FN.to_owned()
    } else {
        format!("{module}::{CLIENT_A_FN}")
    }
}
/// What marks the child's reports in its stdout (libtest prints its own
/// lines around them).
const REPORT_PREFIX: &str = "CLIENT-A ";

const RESOURCE: &str = "acme/orders/42";
const TABLE: &str = "orders_fenced";
/// A's lease: short, so the pause outlives it quickly.
const A_TTL_MS: u64 = 1_500;
/// B's lease: long enough to outlast the rest of the test.
const B_TTL_MS: u64 = 30_000;
/// How long B waits in the resource's queue for A's lease to run out.
const B_WAIT_MS: u64 = 15_000;
/// How long A, once woken, gives its client library to signal the loss
/// (the deadline is already past, so it fires at the next timer tick).
const LOST_WITHIN: Duration = Duration::from_secs(5);
/// How long the scenario waits for any one report of the child.
const REPORT_TIMEOUT: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn paused_holder_past_its_lease_is_rejected_by_postgres_after_a_newer_holder_wrote() {
    let pg = PgServer::start().unwrap_or_else(|e| panic!("{e}"));
    let cluster = common::Cluster::start(3, |_| {}).await;
    let endpoints: Vec<String> = cluster
        .nodes
        .keys()
        .map(|id| cluster.endpoint(*id))
        .collect();
    // Opening B's handle first creates the table before A connects.
    let b_store = PgFenceStore::connect(&pg.connection_string(), TABLE)
        .await
        .expect("B connects to PostgreSQL");

    let mut a = ClientA::spawn(&endpoints, &pg.connection_string());
    let acquired = a.report("acquired").await;
    let a_token: i64 = acquired["token"].parse().unwrap();
    assert_eq!(a.report("wrote").await["result"], "accepted");
    assert_eq!(
        b_store.read(RESOURCE).await.unwrap(),
        Some(FencedValue {
            token: a_token,
            value: Some(b"written by A".to_vec()),
        })
    );

    // A freezes while it holds the lock.
    a.signal("STOP");
    a.wait_until_stopped();

    // B queues for the lock and gets it once A's lease has run out.
    let b = common::acquire(
        &cluster,
        1,
        common::acquire_req(RESOURCE, "client-b", B_TTL_MS, B_WAIT_MS),
    )
    .await
    .expect("B is granted the lock after A's lease expired");
    assert!(
        b.fencing_token > a_token,
        "B's token {} must exceed A's {a_token}",
        b.fencing_token
    );
    b_store
        .write(RESOURCE, b.fencing_token, b"written by B")
        .await
        .expect("B's write with the newer token is accepted");
    // A is still frozen: it cannot have seen any of this.
    a.wait_until_stopped();

    // A wakes up and tries its write with the old token.
    a.signal("CONT");
    a.send("write");
    let late = a.report("late_write").await;
    assert_eq!(
        late["lost_before_write"], "true",
        "A's lost() must fire before its write ({})",
        late["lost_reason"]
    );
    assert!(
        ["not_held", "unconfirmed"].contains(&late["lost_reason"].as_str()),
        "{}",
        late["lost_reason"]
    );
    assert_eq!(late["result"], "rejected", "A's stale write got through");
    assert_eq!(late["presented"], a_token.to_string());
    assert_eq!(late["highest"], b.fencing_token.to_string());
    assert_eq!(late["rejections"], "1");
    assert_eq!(
        late["released"], "false",
        "A's stale lease released something"
    );
    a.wait_for_exit();
    let now = common::get(&cluster, 1, RESOURCE).await.unwrap();
    assert!(now.held, "A's release ended B's holding");
    assert_eq!(now.fencing_token, b.fencing_token);

    // Token B was accepted; token A never changes the row again.
    assert_eq!(
        b_store.read(RESOURCE).await.unwrap(),
        Some(FencedValue {
            token: b.fencing_token,
            value: Some(b"written by B".to_vec()),
        })
    );
    assert!(matches!(
        b_store.write(RESOURCE, a_token, b"A, once more").await,
        Err(FenceError::StaleToken { presented, highest, .. })
            if presented == a_token && highest == b.fencing_token
    ));
    common::release(&cluster, 1, RESOURCE, &b.lease_id)
        .await
        .expect("B releases");
}

/// Client A's side, run in its own process by the scenario above, with the
/// Rust client library. Does nothing in an ordinary test run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_a_process() {
    if std::env::var(ROLE_ENV).as_deref() != Ok("client-a") {
        return;
    }
    let endpoints: Vec<String> = std::env::var(ENDPOINTS_ENV)
        .unwrap()
        .split(',')
        .map(str::to_string)
        .collect();
    let pg = std::env::var(PG_ENV).unwrap();

    let client = Client::connect(endpoints, ClientConfig::default())
        .await
        .expect("A's client starts");
    let guard = client
        .acquire(RESOURCE, A_TTL_MS, 0)
        .await
        .expect("A acquires");
    report("acquired", &[("token", guard.token().to_string())]);

    let store = PgFenceStore::connect(&pg, TABLE)
        .await
        .expect("A connects to PostgreSQL");
    assert!(guard.is_held());
    let first = store.write(RESOURCE, guard.token(), b"written by A").await;
    report("wrote", &[("result", outcome(&first))]);

    // Here the scenario freezes this process, lets the lease expire and
    // hands the lock to B; the line below arrives after SIGCONT.
    let line = tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).map(|_| line)
    })
    .await
    .unwrap()
    .unwrap();
    assert_eq!(line.trim(), "write");

    // Awake again, the library must say the lock is lost before any write:
    // the stop-by deadline passed while frozen, or the first renewal after
    // the pause was answered LEASE_NOT_HELD.
    let lost = tokio::time::timeout(LOST_WITHIN, guard.lost()).await;
    let lost_before_write = lost.is_ok() && !guard.is_held();
    let lost_reason = match lost {
        Ok(LostReason::NotHeld) => "not_held",
        Ok(LostReason::Unconfirmed) => "unconfirmed",
        Ok(LostReason::Released) => "released",
        Err(_) => "not_signalled",
    };
    // A correct client stops here. This one writes anyway, as one that was
    // paused between checking its lock and writing would: only the token
    // check stands between it and B's data.
    let late = store
        .write(RESOURCE, guard.token(), b"late write by A")
        .await;
    let (presented, highest) = match &late {
        Err(FenceError::StaleToken {
            presented, highest, ..
        }) => (presented.to_string(), highest.to_string()),
        _ => ("-".into(), "-".into()),
    };
    // Releasing a superseded lease must not touch B's holding.
    let released = guard.release().await.expect("release is answered");
    report(
        "late_write",
        &[
            ("lost_before_write", lost_before_write.to_string()),
            ("lost_reason", lost_reason.to_string()),
            ("result", outcome(&late)),
            ("presented", presented),
            ("highest", highest),
            ("rejections", store.rejections().to_string()),
            ("released", released.to_string()),
        ],
    );
}

fn outcome(result: &Result<(), FenceError>) -> String {
    match result {
        Ok(()) => "accepted".into(),
        Err(FenceError::StaleToken { .. }) => "rejected".into(),
        Err(e) => format!("error:{}", e.to_string().replace(' ', "_")),
    }
}

/// One line for the scenario: `CLIENT-A event=<event> key=value ...`.
fn report(event: &str, fields: &[(&str, String)]) {
    let mut line = format!("{REPORT_PREFIX}event={event}");
    for (k, v) in fields {
        line.push_str(&format!(" {k}={v}"));
    }
    println!("{line}");
}

/// The child process running `client_a_process`; killed if still running
/// when dropped (SIGKILL ends a stopped process too).
struct ClientA {
    child: Child,
    stdin: ChildStdin,
    reports: mpsc::UnboundedReceiver<String>,
}

impl ClientA {
    fn spawn(endpoints: &[String], pg: &str) -> ClientA {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .arg(client_a_test())
            .args(["--exact", "--nocapture", "--test-threads=1"])
            .env(ROLE_ENV, "client-a")
            .env(ENDPOINTS_ENV, endpoints.join(","))
            .env(PG_ENV, pg)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("client A starts");
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, reports) = mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                eprintln!("client A: {line}");
                // libtest's "test client_a_process ... " may precede a
                // report on the same line.
                if let Some((_, report)) = line.split_once(REPORT_PREFIX) {
                    if tx.send(report.to_string()).is_err() {
                        break;
                    }
                }
            }
        });
        ClientA {
            child,
            stdin,
            reports,
        }
    }

    /// Waits for the next report, which must be `event`; returns its fields.
    async fn report(&mut self, event: &str) -> HashMap<String, String> {
        let line = tokio::time::timeout(REPORT_TIMEOUT, self.reports.recv())
            .await
            .unwrap_or_else(|_| panic!("client A did not report {event} in time"))
            .unwrap_or_else(|| panic!("client A exited before reporting {event}"));
        let fields: HashMap<String, String> = line
            .split_whitespace()
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(
            fields.get("event").map(String::as_str),
            Some(event),
            "{line}"
        );
        fields
    }

    fn send(&mut self, line: &str) {
        writeln!(self.stdin, "{line}").unwrap();
        self.stdin.flush().unwrap();
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -{signal} failed");
    }

    /// Asserts the kernel reports the process as stopped (state `T`).
    fn wait_until_stopped(&self) {
        let stat_path = format!("/proc/{}/stat", self.child.id());
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let stat = std::fs::read_to_string(&stat_path).unwrap();
            // The state follows the parenthesised command name.
            let state = stat.rsplit_once(") ").map(|(_, rest)| &rest[..1]);
            if state == Some("T") {
                return;
            }
            assert!(Instant::now() < deadline, "client A is not stopped: {stat}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn wait_for_exit(&mut self) {
        let deadline = Instant::now() + REPORT_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                assert!(status.success(), "client A failed: {status}");
                return;
            }
            assert!(Instant::now() < deadline, "client A did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for ClientA {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
