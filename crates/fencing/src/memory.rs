//! The in-memory fence store.

use std::collections::HashMap;
use std::future::{ready, Future};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::{validate, validate_resource, FenceError, FenceStore, FencedValue};

/// Default bound on the number of resources one in-memory store tracks: the
/// product's design input of 100,000 lockable resources.
pub const DEFAULT_MAX_RESOURCES: usize = 100_000;

type Records = HashMap<String, FencedValue>;

/// A [`FenceStore`] in process memory: one mutex makes check and record one
/// step. It fences only writers that go through this process (for example a
/// proxy that is the single writer of what it protects), and its records end
/// with the process, so a restarted proxy must not accept writes until it has
/// reloaded or re-derived the highest tokens.
#[derive(Debug)]
pub struct MemoryFenceStore {
    records: Arc<Mutex<Records>>,
    max_resources: usize,
    rejections: AtomicU64,
}

impl Default for MemoryFenceStore {
    fn default() -> Self {
        MemoryFenceStore::new()
    }
}

impl MemoryFenceStore {
    /// An empty store bounded to [`DEFAULT_MAX_RESOURCES`] resources.
    pub fn new() -> MemoryFenceStore {
        MemoryFenceStore::with_max_resources(DEFAULT_MAX_RESOURCES)
    }

    /// An empty store that refuses new resources beyond `max_resources`.
    pub fn with_max_resources(max_resources: usize) -> MemoryFenceStore {
        MemoryFenceStore {
            records: Arc::default(),
            max_resources,
            rejections: AtomicU64::new(0),
        }
    }

    /// Another handle on the same records with its own rejection counter,
    /// as a second connection to one database would be.
    pub fn handle(&self) -> MemoryFenceStore {
        MemoryFenceStore {
            records: Arc::clone(&self.records),
            max_resources: self.max_resources,
            rejections: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Records> {
        // A panic while the lock was held cannot leave a record half-written:
        // every mutation below is a single assignment made after all checks,
        // so the map is consistent and poisoning can be ignored.
        self.records.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The shared step of `write` and `check_and_record`: `value` is `None`
    /// for a bare check, which keeps whatever value is stored.
    fn fence(&self, resource: &str, token: i64, value: Option<&[u8]>) -> Result<(), FenceError> {
        validate(resource, token, value.map_or(0, <[u8]>::len))?;
        let mut records = self.lock();
        let full = records.len() >= self.max_resources;
        match records.get_mut(resource) {
            Some(record) if token < record.token => {
                self.rejections.fetch_add(1, Ordering::Relaxed);
                Err(FenceError::StaleToken {
                    resource: resource.to_string(),
                    presented: token,
                    highest: record.token,
                })
            }
            Some(record) => {
                record.token = token;
                if let Some(v) = value {
                    record.value = Some(v.to_vec());
                }
                Ok(())
            }
            None if full => Err(FenceError::CapacityExceeded {
                max: self.max_resources,
            }),
            None => {
                records.insert(
                    resource.to_string(),
                    FencedValue {
                        token,
                        value: value.map(<[u8]>::to_vec),
                    },
                );
                Ok(())
            }
        }
    }
}

impl FenceStore for MemoryFenceStore {
    fn write(
        &self,
        resource: &str,
        token: i64,
        value: &[u8],
    ) -> impl Future<Output = Result<(), FenceError>> + Send {
        ready(self.fence(resource, token, Some(value)))
    }

    fn check_and_record(
        &self,
        resource: &str,
        token: i64,
    ) -> impl Future<Output = Result<(), FenceError>> + Send {
        ready(self.fence(resource, token, None))
    }

    fn read(
        &self,
        resource: &str,
    ) -> impl Future<Output = Result<Option<FencedValue>, FenceError>> + Send {
        ready(validate_resource(resource).map(|()| self.lock().get(resource).cloned()))
    }

    fn rejections(&self) -> u64 {
        self.rejections.load(Ordering::Relaxed)
    }
}
