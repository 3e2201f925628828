//! The PostgreSQL fence store: check and record in ONE conditional statement.
//!
//! The whole trick is the `WHERE` of an upsert:
//!
//! ```sql
//! INSERT INTO fenced (resource, fence_token, value) VALUES ($1, $2, $3)
//! ON CONFLICT (resource) DO UPDATE
//!    SET fence_token = EXCLUDED.fence_token, value = EXCLUDED.value
//!  WHERE fenced.fence_token <= EXCLUDED.fence_token
//! RETURNING fence_token
//! ```
//!
//! `ON CONFLICT DO UPDATE` locks the existing row and evaluates the `WHERE`
//! against its latest committed version, so two writers racing on one
//! resource are serialised by the row lock and the lower token loses, at any
//! isolation level and over any number of connections. No row returned means
//! the token was stale. A read-then-write in two statements would not do:
//! another writer could commit between them.

use std::sync::atomic::{AtomicU64, Ordering};

use tokio_postgres::{Client, NoTls, Statement};

use crate::{validate, validate_resource, FenceError, FenceStore, FencedValue};

/// PostgreSQL truncates identifiers longer than this (NAMEDATALEN - 1), which
/// would silently make two table names one.
const MAX_TABLE_NAME_LEN: usize = 63;

/// A [`FenceStore`] in a PostgreSQL table, one row per resource:
/// `(resource text PRIMARY KEY, fence_token bigint, value bytea)`.
///
/// Any number of handles, connections and processes may share the table;
/// PostgreSQL's row lock is what makes each check-and-record atomic. Rows
/// are never deleted by this type (a deleted row would let a stale token in
/// again).
pub struct PgFenceStore {
    client: Client,
    table: String,
    write: Statement,
    check: Statement,
    read: Statement,
    rejections: AtomicU64,
}

impl std::fmt::Debug for PgFenceStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgFenceStore")
            .field("table", &self.table)
            .field("rejections", &self.rejections)
            .finish_non_exhaustive()
    }
}

impl PgFenceStore {
    /// Connects without TLS (for loopback and tests; bring a TLS connector
    /// through [`PgFenceStore::new`] otherwise), drives the connection on the
    /// current tokio runtime, and opens `table` as with [`PgFenceStore::new`].
    pub async fn connect(config: &str, table: &str) -> Result<PgFenceStore, FenceError> {
        check_table_name(table)?;
        let (client, connection) = tokio_postgres::connect(config, NoTls).await?;
        // The connection ends with an error when the server goes away; the
        // client then fails every later call with that error, so nothing is
        // lost by dropping it here.
        tokio::spawn(async move {
            let _ = connection.await;
        });
        PgFenceStore::new(client, table).await
    }

    /// Uses `client` for `table`, creating the table if it does not exist and
    /// preparing the statements. Creating one table from several connections
    /// at the same moment can fail in PostgreSQL (`CREATE TABLE IF NOT
    /// EXISTS` is not race-free), so open the first handle before the others
    /// or create the table with [`PgFenceStore::create_table_sql`] in a
    /// migration.
    pub async fn new(client: Client, table: &str) -> Result<PgFenceStore, FenceError> {
        client
            .batch_execute(&PgFenceStore::create_table_sql(table)?)
            .await?;
        let write = client
            .prepare(&format!(
                "INSERT INTO {table} AS f (resource, fence_token, value) VALUES ($1, $2, $3) \
                 ON CONFLICT (resource) DO UPDATE \
                 SET fence_token = EXCLUDED.fence_token, value = EXCLUDED.value \
                 WHERE f.fence_token <= EXCLUDED.fence_token \
                 RETURNING f.fence_token"
            ))
            .await?;
        // The bare check: the same statement without the value, so a new row
        // starts with a NULL value and an existing row keeps its value.
        let check = client
            .prepare(&format!(
                "INSERT INTO {table} AS f (resource, fence_token) VALUES ($1, $2) \
                 ON CONFLICT (resource) DO UPDATE \
                 SET fence_token = EXCLUDED.fence_token \
                 WHERE f.fence_token <= EXCLUDED.fence_token \
                 RETURNING f.fence_token"
            ))
            .await?;
        let read = client
            .prepare(&format!(
                "SELECT fence_token, value FROM {table} WHERE resource = $1"
            ))
            .await?;
        Ok(PgFenceStore {
            client,
            table: table.to_string(),
            write,
            check,
            read,
            rejections: AtomicU64::new(0),
        })
    }

    /// The table this store uses, as SQL (`CREATE TABLE IF NOT EXISTS`).
    pub fn create_table_sql(table: &str) -> Result<String, FenceError> {
        check_table_name(table)?;
        Ok(format!(
            "CREATE TABLE IF NOT EXISTS {table} (\
             resource text PRIMARY KEY, \
             fence_token bigint NOT NULL CHECK (fence_token > 0), \
             value bytea)"
        ))
    }

    /// The table name this store writes to.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// Runs one of the conditional upserts; `None` back means the row's
    /// token was higher, so the attempt is reported as stale.
    async fn fence(
        &self,
        statement: &Statement,
        resource: &str,
        token: i64,
        value: Option<&[u8]>,
    ) -> Result<(), FenceError> {
        validate(resource, token, value.map_or(0, <[u8]>::len))?;
        let row = match value {
            Some(v) => {
                self.client
                    .query_opt(statement, &[&resource, &token, &v])
                    .await?
            }
            None => {
                self.client
                    .query_opt(statement, &[&resource, &token])
                    .await?
            }
        };
        if row.is_some() {
            return Ok(());
        }
        self.rejections.fetch_add(1, Ordering::Relaxed);
        // Only for the error report: the decision was already made by the
        // statement above. A row that refused a token is never deleted by
        // this store; if someone else deleted it, report the presented token
        // plus one, the least the refusing token can have been.
        let highest = self
            .read_record(resource)
            .await?
            .map_or(token.saturating_add(1), |r| r.token);
        Err(FenceError::StaleToken {
            resource: resource.to_string(),
            presented: token,
            highest,
        })
    }

    async fn read_record(&self, resource: &str) -> Result<Option<FencedValue>, FenceError> {
        let row = self.client.query_opt(&self.read, &[&resource]).await?;
        Ok(row.map(|r| FencedValue {
            token: r.get(0),
            value: r.get(1),
        }))
    }
}

impl FenceStore for PgFenceStore {
    async fn write(&self, resource: &str, token: i64, value: &[u8]) -> Result<(), FenceError> {
        self.fence(&self.write, resource, token, Some(value)).await
    }

    async fn check_and_record(&self, resource: &str, token: i64) -> Result<(), FenceError> {
        self.fence(&self.check, resource, token, None).await
    }

    async fn read(&self, resource: &str) -> Result<Option<FencedValue>, FenceError> {
        validate_resource(resource)?;
        self.read_record(resource).await
    }

    fn rejections(&self) -> u64 {
        self.rejections.load(Ordering::Relaxed)
    }
}

/// Table names are spliced into SQL text (statements cannot take an
/// identifier as a parameter), so only names that need no quoting pass.
fn check_table_name(name: &str) -> Result<(), FenceError> {
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_');
    let rest_ok = chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if first_ok && rest_ok && name.len() <= MAX_TABLE_NAME_LEN {
        Ok(())
    } else {
        Err(FenceError::InvalidTableName {
            name: name.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_that_would_need_quoting_are_refused() {
        for bad in [
            "",
            "Fenced",
            "9lives",
            "a-b",
            "x; DROP TABLE y",
            "a\"b",
            &"t".repeat(64),
        ] {
            assert!(
                matches!(
                    check_table_name(bad),
                    Err(FenceError::InvalidTableName { .. })
                ),
                "{bad:?} accepted"
            );
        }
        for good in ["fenced", "_f", "orders_fence_2", &"t".repeat(63)] {
            check_table_name(good).unwrap_or_else(|e| panic!("{good:?}: {e}"));
        }
    }
}
