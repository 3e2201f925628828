//! Token rejections as Prometheus metrics: the metered store behaves exactly
//! like the store it wraps, and counts what the protected side refused.

use fencelock_fencing::testing::{run_conformance, MemoryFactory, StoreFactory};
use fencelock_fencing::{
    FenceError, FenceMetrics, FenceStore, MemoryFenceStore, Metered, CALLS_METRIC,
    REJECTIONS_METRIC,
};
use prometheus::{Encoder, Registry, TextEncoder};

/// Metered handles on one in-memory store.
#[derive(Default)]
struct MeteredFactory {
    inner: MemoryFactory,
    metrics: FenceMetrics,
}

impl StoreFactory for MeteredFactory {
    type Store = Metered<MemoryFenceStore>;

    async fn open(&self) -> Result<Self::Store, FenceError> {
        Ok(Metered::new(self.inner.open().await?, self.metrics.clone()))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn metered_store_passes_the_conformance_suite() {
    run_conformance(|_case| MeteredFactory::default()).await;
}

#[tokio::test]
async fn a_stale_token_write_is_counted_as_a_rejection_and_exported() {
    let registry = Registry::new();
    let metrics = FenceMetrics::new();
    metrics.register(&registry).unwrap();
    let store = Metered::new(MemoryFenceStore::new(), metrics.clone());

    store.write("acme/report", 42, b"new holder").await.unwrap();
    // The paused old holder wakes up with token 41.
    let stale = store.write("acme/report", 41, b"old holder").await;
    assert!(matches!(
        stale,
        Err(FenceError::StaleToken { highest: 42, .. })
    ));
    assert!(store.check_and_record("acme/report", 40).await.is_err());
    assert!(store.write("acme/report", 0, b"bad").await.is_err());
    store.read("acme/report").await.unwrap();

    assert_eq!(metrics.rejections(), 2);
    assert_eq!(store.rejections(), 2, "the wrapped store's own count");
    assert_eq!(metrics.calls("write", "ok"), 1);
    assert_eq!(metrics.calls("write", "stale"), 1);
    assert_eq!(metrics.calls("check", "stale"), 1);
    assert_eq!(metrics.calls("write", "invalid"), 1);
    assert_eq!(metrics.calls("read", "ok"), 1);

    let mut text = Vec::new();
    TextEncoder::new()
        .encode(&registry.gather(), &mut text)
        .unwrap();
    let text = String::from_utf8(text).unwrap();
    assert!(text.contains(&format!("{REJECTIONS_METRIC} 2")), "{text}");
    assert!(
        text.contains(&format!(
            r#"{CALLS_METRIC}{{op="write",outcome="stale"}} 1"#
        )),
        "{text}"
    );
    // Never a resource name in a label.
    assert!(!text.contains("acme/report"), "{text}");
    // One set of metrics per registry.
    assert!(metrics.register(&registry).is_err());
}
