//! The one conformance suite, run against both stores: in memory, and in a
//! real PostgreSQL server started for this test.

use fencelock_fencing::testing::{run_conformance, MemoryFactory, PgFactory, PgServer};
use fencelock_fencing::{FenceError, FenceStore, MemoryFenceStore};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_store_passes_the_conformance_suite() {
    run_conformance(|_case| MemoryFactory::default()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_store_passes_the_conformance_suite_on_a_real_server() {
    let server = PgServer::start().unwrap_or_else(|e| panic!("{e}"));
    let config = server.connection_string();
    // One table per case, so every case starts empty.
    run_conformance(|case| PgFactory {
        config: config.clone(),
        table: format!("fence_{case}").chars().take(63).collect(),
    })
    .await;
}

#[tokio::test]
async fn memory_store_refuses_new_resources_when_full_rather_than_forgetting_old_ones() {
    let store = MemoryFenceStore::with_max_resources(2);
    store.write("acme/a", 5, b"a").await.unwrap();
    store.write("acme/b", 5, b"b").await.unwrap();
    assert!(matches!(
        store.write("acme/c", 5, b"c").await,
        Err(FenceError::CapacityExceeded { max: 2 })
    ));
    // Known resources still take writes, and still refuse stale ones.
    store.write("acme/a", 6, b"a2").await.unwrap();
    assert!(matches!(
        store.write("acme/a", 5, b"stale").await,
        Err(FenceError::StaleToken { highest: 6, .. })
    ));
}
