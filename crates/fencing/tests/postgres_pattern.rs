//! The SQL of `docs/fencing.md`, verbatim, on a real PostgreSQL server: the
//! documented pattern must do what the page says, including under the race
//! it exists for.

use std::time::{Duration, Instant};

use fencelock_fencing::testing::PgServer;
use tokio_postgres::{Client, NoTls};

// ---- Copied from docs/fencing.md; keep the two in step. ----------------------

const CREATE_ORDERS: &str = "
CREATE TABLE orders (
    id          bigint PRIMARY KEY,
    status      text   NOT NULL,
    fence_token bigint NOT NULL DEFAULT 0   -- highest token accepted for this row
)";

const FENCED_UPDATE: &str = "
UPDATE orders
   SET status = $1, fence_token = $2
 WHERE id = $3 AND fence_token <= $2";

const FENCED_UPSERT: &str = "
INSERT INTO orders AS o (id, status, fence_token) VALUES ($3, $1, $2)
ON CONFLICT (id) DO UPDATE
   SET status = EXCLUDED.status, fence_token = EXCLUDED.fence_token
 WHERE o.fence_token <= EXCLUDED.fence_token
RETURNING o.fence_token";

const FENCE_FIRST: &str = "
UPDATE fences SET token = $1
 WHERE resource = $2 AND token <= $1";

// ------------------------------------------------------------------------------

/// How long a statement may take to show up as waiting on a lock.
const LOCK_WAIT_TIMEOUT: Duration = Duration::from_secs(10);

async fn connect(server: &PgServer) -> Client {
    let (client, connection) = tokio_postgres::connect(&server.connection_string(), NoTls)
        .await
        .expect("connect");
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

async fn order(c: &Client, id: i64) -> (String, i64) {
    let row = c
        .query_one(
            "SELECT status, fence_token FROM orders WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

/// Waits until the backend `pid` is blocked on a lock, so the race below is
/// the one meant and not a lucky ordering.
async fn wait_until_blocked_on_a_lock(observer: &Client, pid: i32) {
    let deadline = Instant::now() + LOCK_WAIT_TIMEOUT;
    loop {
        let row = observer
            .query_one(
                "SELECT coalesce(wait_event_type, '') FROM pg_stat_activity WHERE pid = $1",
                &[&pid],
            )
            .await
            .unwrap();
        if row.get::<_, String>(0) == "Lock" {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "backend {pid} never waited on a lock"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn backend_pid(c: &Client) -> i32 {
    c.query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn documented_conditional_update_accepts_equal_and_higher_tokens_and_rejects_lower() {
    let server = PgServer::start().unwrap_or_else(|e| panic!("{e}"));
    let c = connect(&server).await;
    c.batch_execute(CREATE_ORDERS).await.unwrap();
    c.execute("INSERT INTO orders (id, status) VALUES (1, 'new')", &[])
        .await
        .unwrap();

    let update = |status: &'static str, token: i64| {
        let c = &c;
        async move {
            c.execute(FENCED_UPDATE, &[&status, &token, &1_i64])
                .await
                .unwrap()
        }
    };
    assert_eq!(update("paid by A", 41).await, 1);
    assert_eq!(update("shipped by B", 42).await, 1);
    assert_eq!(update("cancelled by A", 41).await, 0, "stale token updated");
    assert_eq!(update("delivered by B", 42).await, 1, "equal token refused");
    assert_eq!(order(&c, 1).await, ("delivered by B".into(), 42));

    // The upsert form inserts a missing row and fences an existing one.
    let upsert = |status: &'static str, token: i64| {
        let c = &c;
        async move {
            c.query_opt(FENCED_UPSERT, &[&status, &token, &2_i64])
                .await
                .unwrap()
                .map(|r| r.get::<_, i64>(0))
        }
    };
    assert_eq!(upsert("new by B", 42).await, Some(42));
    assert_eq!(upsert("new by A", 41).await, None, "stale upsert applied");
    assert_eq!(order(&c, 2).await, ("new by B".into(), 42));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_update_waiting_behind_a_newer_holders_write_rechecks_and_updates_nothing() {
    let server = PgServer::start().unwrap_or_else(|e| panic!("{e}"));
    let setup = connect(&server).await;
    setup.batch_execute(CREATE_ORDERS).await.unwrap();
    setup
        .execute(
            "INSERT INTO orders (id, status, fence_token) VALUES (1, 'new', 40)",
            &[],
        )
        .await
        .unwrap();

    // B (token 42) has updated the row but not committed: it holds the row
    // lock. A (token 41) read the row before that, saw token 40 and goes
    // ahead; its statement waits for B's lock.
    let b = connect(&server).await;
    b.batch_execute("BEGIN").await.unwrap();
    let n = b
        .execute(FENCED_UPDATE, &[&"shipped by B", &42_i64, &1_i64])
        .await
        .unwrap();
    assert_eq!(n, 1);

    let a = connect(&server).await;
    let a_pid = backend_pid(&a).await;
    let a_update = tokio::spawn(async move {
        a.execute(FENCED_UPDATE, &[&"cancelled by A", &41_i64, &1_i64])
            .await
            .unwrap()
    });
    wait_until_blocked_on_a_lock(&setup, a_pid).await;

    b.batch_execute("COMMIT").await.unwrap();
    // PostgreSQL re-evaluates A's WHERE against B's committed row: 41 <= 42
    // is false, so nothing is updated.
    assert_eq!(a_update.await.unwrap(), 0, "the stale write got through");
    assert_eq!(order(&setup, 1).await, ("shipped by B".into(), 42));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_row_first_in_a_transaction_stops_a_stale_holders_whole_transaction() {
    let server = PgServer::start().unwrap_or_else(|e| panic!("{e}"));
    let setup = connect(&server).await;
    setup
        .batch_execute(
            "CREATE TABLE fences (resource text PRIMARY KEY, token bigint NOT NULL);
             INSERT INTO fences VALUES ('acme/orders/1', 40);
             CREATE TABLE order_lines (order_id bigint, line text, token bigint);",
        )
        .await
        .unwrap();
    let resource = "acme/orders/1";

    // B's transaction passes the fence and holds its row lock to COMMIT.
    let b = connect(&server).await;
    b.batch_execute("BEGIN").await.unwrap();
    assert_eq!(
        b.execute(FENCE_FIRST, &[&42_i64, &resource]).await.unwrap(),
        1
    );

    // A's transaction stops at its first statement until B commits, then
    // finds the fence raised and rolls back without writing anything.
    let a = connect(&server).await;
    let a_pid = backend_pid(&a).await;
    let a_txn = tokio::spawn(async move {
        a.batch_execute("BEGIN").await.unwrap();
        let passed = a.execute(FENCE_FIRST, &[&41_i64, &resource]).await.unwrap();
        if passed == 1 {
            a.execute("INSERT INTO order_lines VALUES (1, 'by A', 41)", &[])
                .await
                .unwrap();
            a.batch_execute("COMMIT").await.unwrap();
        } else {
            a.batch_execute("ROLLBACK").await.unwrap();
        }
        passed
    });
    wait_until_blocked_on_a_lock(&setup, a_pid).await;
    b.execute("INSERT INTO order_lines VALUES (1, 'by B', 42)", &[])
        .await
        .unwrap();
    b.batch_execute("COMMIT").await.unwrap();

    assert_eq!(a_txn.await.unwrap(), 0, "A passed the fence after B");
    let lines: Vec<String> = setup
        .query("SELECT line FROM order_lines ORDER BY line", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(lines, vec!["by B".to_string()]);
}
