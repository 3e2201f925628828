//! The cases every [`FenceStore`] must pass. Run them with
//! [`run_conformance`]; each case gets a fresh [`StoreFactory`] (an empty
//! store), and a factory can open several handles on the same data, as
//! several connections to one database, for the cases about sharing and
//! concurrency. Assertion failures panic, as tests do; each case is
//! announced on stderr first so a failure names its case.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use crate::{
    FenceError, FenceStore, FencedValue, MemoryFenceStore, PgFenceStore, MAX_RESOURCE_LEN,
    MAX_VALUE_LEN,
};

/// Opens handles on one store's data.
pub trait StoreFactory {
    /// The store this factory opens.
    type Store: FenceStore + 'static;

    /// Opens a handle. Every handle from one factory sees the same records;
    /// each counts its own rejections.
    fn open(&self) -> impl Future<Output = Result<Self::Store, FenceError>>;
}

/// Handles on one [`MemoryFenceStore`].
#[derive(Debug, Default)]
pub struct MemoryFactory(MemoryFenceStore);

impl StoreFactory for MemoryFactory {
    type Store = MemoryFenceStore;

    async fn open(&self) -> Result<MemoryFenceStore, FenceError> {
        Ok(self.0.handle())
    }
}

/// Handles on one table of a PostgreSQL database, each its own connection.
#[derive(Clone, Debug)]
pub struct PgFactory {
    /// libpq-style connection string, e.g. from
    /// [`PgServer::connection_string`](super::PgServer::connection_string).
    pub config: String,
    /// The table; give each case its own so cases start empty.
    pub table: String,
}

impl StoreFactory for PgFactory {
    type Store = PgFenceStore;

    async fn open(&self) -> Result<PgFenceStore, FenceError> {
        PgFenceStore::connect(&self.config, &self.table).await
    }
}

/// Runs every case in a fixed order, each on a fresh factory from `make`
/// (which gets the case's name, e.g. to pick a table). Needs a multi-thread
/// tokio runtime: the concurrency case spawns tasks.
pub async fn run_conformance<F: StoreFactory>(mut make: impl FnMut(&'static str) -> F) {
    macro_rules! run {
        ($($case:ident),* $(,)?) => {$(
            let name = stringify!($case);
            eprintln!("fence store conformance: {name}");
            let factory = make(name);
            if let Err(e) = $case(&factory).await {
                panic!("fence store conformance case {name} failed: {e}");
            }
        )*};
    }
    run!(
        first_token_for_a_resource_is_accepted_and_recorded,
        higher_token_replaces_the_value_and_becomes_the_highest,
        equal_token_is_accepted_so_one_holder_can_write_many_times,
        lower_token_is_rejected_with_the_highest_and_changes_nothing,
        once_42_is_accepted_41_never_changes_the_resource_again,
        resources_are_fenced_independently,
        bare_check_raises_the_fence_without_touching_the_value,
        bare_check_on_a_new_resource_records_a_token_without_a_value,
        invalid_arguments_are_refused_and_not_counted_as_stale,
        largest_token_longest_key_and_largest_value_fit,
        empty_value_is_a_value_not_an_absence,
        every_handle_sees_the_same_fence,
        concurrent_writers_on_many_handles_never_let_a_lower_token_win,
    );
}

const R: &str = "acme/orders/42";

fn record(token: i64, value: Option<&[u8]>) -> Option<FencedValue> {
    Some(FencedValue {
        token,
        value: value.map(<[u8]>::to_vec),
    })
}

/// Asserts `result` is the stale rejection of `presented` with `highest`.
fn assert_stale(result: Result<(), FenceError>, presented: i64, highest: i64) {
    match result {
        Err(FenceError::StaleToken {
            resource,
            presented: p,
            highest: h,
        }) => {
            assert_eq!(resource, R);
            assert_eq!((p, h), (presented, highest));
        }
        other => panic!("expected StaleToken({presented} < {highest}), got {other:?}"),
    }
}

async fn first_token_for_a_resource_is_accepted_and_recorded<F: StoreFactory>(
    f: &F,
) -> Result<(), FenceError> {
    let s = f.open().await?;
    assert_eq!(s.read(R).await?, None);
    s.write(R, 7, b"a").await?;
    assert_eq!(s.read(R).await?, record(7, Some(b"a")));
    assert_eq!(s.rejections(), 0);
    Ok(())
}

async fn higher_token_replaces_the_value_and_becomes_the_highest<F: StoreFactory>(
    f: &F,
) -> Result<(), FenceError> {
    let s = f.open().await?;
    s.write(R, 7, b"a").await?;
    s.write(R, 8, b"b").await?;
    assert_eq!(s.read(R).await?, record(8, Some(b"b")));
    // A jump across epochs (tokens are epoch << 40 | position).
    let next_epoch = (2_i64 << 40) | 1;
    s.write(R, next_epoch, b"c").await?;
    assert_eq!(s.read(R).await?, record(next_epoch, Some(b"c")));
    Ok(())
}

async fn equal_token_is_accepted_so_one_holder_can_write_many_times<F: StoreFactory>(
    f: &F,
) -> Result<(), FenceError> {
    let s = f.open().await?;
    for value in [&b"1"[..], b"2", b"3"] {
        s.write(R, 9, value).await?;
    }
    assert_eq!(s.read(R).await?, record(9, Some(b"3")));
    assert_eq!(s.rejections(), 0);
    Ok(())
}

async fn lower_token_is_rejected_with_the_highest_and_changes_nothing<F: StoreFactory>(
    f: &F,
) -> Result<(), FenceError> {
    let s = f.open().await?;
    s.write(R, 10, b"new").await?;
    assert_stale(s.write(R, 9, b"old").await, 9, 10);
    assert_eq!(s.read(R).await?, record(10, Some(b"new")));
    assert_eq!(s.rejections(), 1);
    Ok(())
}

async fn once_42_is_accepted_41_never_changes_the_resource_again<F: StoreFactory>(
    f: &F,
) -> Result<(), FenceError> {
    let a = f.open().await?;
    let b = f.open().await?;
    a.write(R, 41, b"A").await?;
    b.write(R, 42, b"B").await?;
    // However A comes back (a write, a bare check, retries), nothing moves.
    for _ in 0..3 {
        assert_stale(a.write(R, 41, b"A again").await, 41, 42);
        assert_stale(a.check_and_record(R, 41).await, 41, 42);
    }
    assert_eq!(b.read(R).await?, record(42, Some(b"B")));
    assert_eq!(a.rejections(), 6);
    assert_eq!(b.rejections(), 0);
    Ok(())
}

async fn resources_are_fenced_independently<F: StoreFactory>(f: &F) -> Result<(), FenceError> {
    let s = f.open().await?;
    s.write("acme/a", 100, b"a").await?;
    // A low token on another resource is fine: tokens order grants of one
    // resource only.
    s.write("acme/b", 1, b"b").await?;
    assert_eq!(s.read("acme/a").await?, record(100, Some(b"a")));
    assert_eq!(s.read("acme/b").await?, record(1, Some(b"b")));
    assert_eq!(s.read("acme/c").await?, None);
    Ok(())
}

async fn bare_check_raises_the_fence_without_touching_the_value<F: StoreFactory>(
    f: &F,
) -> Result<(), FenceError> {
    let s = f.open().await?;
    s.write(R, 5, b"v").await?;
    s.check_and_record(R, 6).await?;
    s.check_and_record(R, 6).await?; // equal: accepted
    assert_eq!(s.read(R).await?, record(6, Some(b"v")));
    // The raised fence now stops a write that would have passed before.
    assert_stale(s.write(R, 5, b"w").await, 5, 6);
    assert_stale(s.check_and_record(R, 4).await, 4, 6);
    assert_eq!(s.read(R).await?, record(6, Some(b"v")));
    assert_eq!(s.rejections(), 2);
    Ok(())
}

async fn bare_check_on_a_new_resource_records_a_token_without_a_value<F: StoreFactory>(
    f: &F,
) -> Result<(), FenceError> {
    let s = f.open().await?;
    s.check_and_record(R, 3).await?;
    assert_eq!(s.read(R).await?, record(3, None));
    s.write(R, 3, b"x").await?;
    assert_eq!(s.read(R).await?, record(3, Some(b"x")));
    Ok(())
}

async fn invalid_arguments_are_refused_and_not_counted_as_stale<F: StoreFactory>(
    f: &F,
) -> Result<(), FenceError> {
    let s = f.open().await?;
    for token in [0, -1, i64::MIN] {
        assert!(
            matches!(s.write(R, token, b"x").await, Err(FenceError::InvalidToken { presented }) if presented == token),
            "token {token} accepted by write"
        );
        assert!(
            matches!(
                s.check_and_record(R, token).await,
                Err(FenceError::InvalidToken { .. })
            ),
            "token {token} accepted by check"
        );
    }
    let too_long = "a".repeat(MAX_RESOURCE_LEN + 1);
    for resource in ["", too_long.as_str(), "acme/\0"] {
        assert!(
            matches!(
                s.write(resource, 1, b"x").await,
                Err(FenceError::InvalidResource { .. })
            ),
            "resource {resource:?} accepted by write"
        );
        assert!(
            matches!(
                s.check_and_record(resource, 1).await,
                Err(FenceError::InvalidResource { .. })
            ),
            "resource {resource:?} accepted by check"
        );
        assert!(
            matches!(
                s.read(resource).await,
                Err(FenceError::InvalidResource { .. })
            ),
            "resource {resource:?} accepted by read"
        );
    }
    let huge = vec![0u8; MAX_VALUE_LEN + 1];
    assert!(matches!(
        s.write(R, 1, &huge).await,
        Err(FenceError::ValueTooLarge { len, max }) if len == MAX_VALUE_LEN + 1 && max == MAX_VALUE_LEN
    ));
    assert_eq!(s.read(R).await?, None, "a refused call recorded something");
    assert_eq!(s.rejections(), 0);
    Ok(())
}

async fn largest_token_longest_key_and_largest_value_fit<F: StoreFactory>(
    f: &F,
) -> Result<(), FenceError> {
    let s = f.open().await?;
    let key = "k".repeat(MAX_RESOURCE_LEN);
    let value = vec![0xa5u8; MAX_VALUE_LEN];
    s.write(&key, i64::MAX, &value).await?;
    assert_eq!(s.read(&key).await?, record(i64::MAX, Some(&value)));
    Ok(())
}

async fn empty_value_is_a_value_not_an_absence<F: StoreFactory>(f: &F) -> Result<(), FenceError> {
    let s = f.open().await?;
    s.write(R, 1, b"").await?;
    assert_eq!(s.read(R).await?, record(1, Some(b"")));
    Ok(())
}

async fn every_handle_sees_the_same_fence<F: StoreFactory>(f: &F) -> Result<(), FenceError> {
    let first = f.open().await?;
    let second = f.open().await?;
    first.write(R, 10, b"first").await?;
    assert_eq!(second.read(R).await?, record(10, Some(b"first")));
    assert_stale(second.write(R, 9, b"second").await, 9, 10);
    second.write(R, 11, b"second").await?;
    assert_eq!(first.read(R).await?, record(11, Some(b"second")));
    assert_eq!((first.rejections(), second.rejections()), (0, 1));
    Ok(())
}

/// One attempt of the concurrency case: when it ran and how it ended.
struct Attempt {
    token: i64,
    started: Instant,
    ended: Instant,
    accepted: bool,
}

/// Handles writing at once in the concurrency case.
const CONCURRENT_HANDLES: usize = 4;
/// Distinct tokens written, spread over the handles in a scrambled order.
const CONCURRENT_TOKENS: i64 = 120;
/// Coprime with `CONCURRENT_TOKENS`, so `i * STRIDE % TOKENS` visits every
/// token once, far from sorted.
const SCRAMBLE_STRIDE: i64 = 37;

async fn concurrent_writers_on_many_handles_never_let_a_lower_token_win<F: StoreFactory>(
    f: &F,
) -> Result<(), FenceError> {
    // Opened one after the other: creating a table from several
    // connections at once is not race-free in PostgreSQL.
    let mut handles = Vec::new();
    for _ in 0..CONCURRENT_HANDLES {
        handles.push(Arc::new(f.open().await?));
    }
    let mut tasks = Vec::new();
    for (h, store) in handles.iter().enumerate() {
        let store = Arc::clone(store);
        let tokens: Vec<i64> = (0..CONCURRENT_TOKENS)
            .filter(|i| *i as usize % CONCURRENT_HANDLES == h)
            .map(|i| i * SCRAMBLE_STRIDE % CONCURRENT_TOKENS + 1)
            .collect();
        tasks.push(tokio::spawn(async move {
            let mut attempts = Vec::new();
            for token in tokens {
                let started = Instant::now();
                let result = store.write(R, token, token.to_string().as_bytes()).await;
                let accepted = match result {
                    Ok(()) => true,
                    Err(FenceError::StaleToken { highest, .. }) => {
                        assert!(highest > token, "rejected {token} below highest {highest}");
                        false
                    }
                    Err(e) => return Err(e),
                };
                attempts.push(Attempt {
                    token,
                    started,
                    ended: Instant::now(),
                    accepted,
                });
            }
            Ok(attempts)
        }));
    }
    let mut attempts = Vec::new();
    for task in tasks {
        attempts.extend(task.await.expect("writer task panicked")?);
    }

    let highest = CONCURRENT_TOKENS;
    let s = f.open().await?;
    assert_eq!(
        s.read(R).await?,
        record(highest, Some(highest.to_string().as_bytes())),
        "the highest token and its value must be what remains"
    );
    let rejected = attempts.iter().filter(|a| !a.accepted).count() as u64;
    let counted: u64 = handles.iter().map(|h| h.rejections()).sum();
    assert_eq!(
        counted, rejected,
        "rejection counters disagree with results"
    );
    // Real-time order: a write that started after an accepted write with a
    // higher token had finished must have been refused.
    for done in attempts.iter().filter(|a| a.accepted) {
        for later in attempts
            .iter()
            .filter(|a| a.started > done.ended && a.token < done.token)
        {
            assert!(
                !later.accepted,
                "token {} accepted after {} had been",
                later.token, done.token
            );
        }
    }
    Ok(())
}
