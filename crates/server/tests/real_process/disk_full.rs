//! A disk that runs full, for real: the node's data directory is a small
//! tmpfs that the test fills. Below `edge.min_free_disk_bytes` the node
//! refuses new acquires (`SERVER_BUSY`, saying the disk is low) while the
//! locks it holds are renewed and read as before, and once space returns it
//! takes acquires again by itself; nothing held is lost.
//!
//! Needs root to mount the tmpfs, as the chaos tests need it for network
//! namespaces (docs/testing.md).

use crate::common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fencelock_api::v1::lock_service_client::LockServiceClient;
use fencelock_api::v1::{GetRequest, RenewRequest};
use tonic::transport::Channel;

const MIB: u64 = 1 << 20;
/// The tmpfs the node's data directory lives on.
const DISK_BYTES: u64 = 256 * MIB;
/// What the node must keep free.
const MIN_FREE_BYTES: u64 = 64 * MIB;
/// What the filler leaves free: below the minimum, far from full.
const LEFT_FREE_BYTES: u64 = 24 * MIB;

/// The mounted data directory and the node on it; unmounted after the node
/// is gone, whatever the test's end.
struct NodeOnTmpfs {
    child: Child,
    data: PathBuf,
}

impl Drop for NodeOnTmpfs {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = Command::new("umount").arg(&self.data).status();
    }
}

/// A tmpfs of `bytes` mounted at `dir/data` (needs root).
fn mount_tmpfs(dir: &Path, bytes: u64) -> PathBuf {
    let data = dir.join("data");
    std::fs::create_dir(&data).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o"])
        .arg(format!("size={bytes},mode=0700"))
        .arg("tmpfs")
        .arg(&data)
        .status()
        .unwrap();
    assert!(
        mounted.success(),
        "mounting a tmpfs for the data directory needs root ({mounted})"
    );
    data
}

/// A one-node, one-shard cluster's config in `dir`, its data directory on
/// the tmpfs at `dir/data`; and its port.
fn single_node_on(dir: &Path) -> (PathBuf, u16) {
    let port = common::free_port();
    let config = dir.join("node.toml");
    std::fs::write(
        &config,
        format!(
            "node_id = 1\nlisten_addr = \"127.0.0.1:{port}\"\ndata_dir = \"data/node\"\n\
             peers = [{{ id = 1, addr = \"127.0.0.1:{port}\" }}]\n\
             shard_count = 1\nreplication_factor = 1\n\n[tls]\ninsecure = true\n"
        ),
    )
    .unwrap();
    (config, port)
}

fn free_bytes(path: &Path) -> u64 {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid path and a writable statvfs.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(c_path.as_ptr(), &mut stat) }, 0);
    stat.f_bavail * stat.f_frsize
}

/// Writes a file of `bytes` real bytes (a tmpfs holds them in memory).
fn fill(path: &Path, bytes: u64) {
    let mut f = std::fs::File::create(path).unwrap();
    let chunk = vec![0x5au8; MIB as usize];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(MIB) as usize;
        f.write_all(&chunk[..n]).unwrap();
        left -= n as u64;
    }
    f.sync_all().unwrap();
}

async fn connect(endpoint: &str, stderr: &Path) -> LockServiceClient<Channel> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(c) = LockServiceClient::connect(endpoint.to_owned()).await {
            return c;
        }
        assert!(
            Instant::now() < deadline,
            "the node never answered:\n{}",
            std::fs::read_to_string(stderr).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Retries `acquire` of `resource` until `done` says its outcome is the
/// one waited for (at most 15 s: the node reads its free space every
/// second); returns that outcome.
async fn acquire_until(
    client: &mut LockServiceClient<Channel>,
    resource: &str,
    request_id: &str,
    done: impl Fn(&Result<fencelock_api::v1::AcquireResponse, tonic::Status>) -> bool,
) -> Result<fencelock_api::v1::AcquireResponse, tonic::Status> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let req = common::acquire_req(resource, request_id, 60_000, 0);
        let out = client.acquire(req).await.map(|r| r.into_inner());
        if done(&out) || Instant::now() > deadline {
            return out;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_disk_runs_low_refuses_new_acquires_keeps_its_locks_and_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let data = mount_tmpfs(dir.path(), DISK_BYTES);
    let (config, port) = single_node_on(dir.path());
    let stderr = dir.path().join("stderr.log");
    let child = Command::new(common::fencelock_bin())
        .args(["serve", "--config"])
        .arg(&config)
        .env(
            "FENCELOCK_EDGE_MIN_FREE_DISK_BYTES",
            MIN_FREE_BYTES.to_string(),
        )
        .env(
            "FENCELOCK_ADMIN_LISTEN_ADDR",
            format!("127.0.0.1:{}", common::free_port()),
        )
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .spawn()
        .unwrap();
    let _node = NodeOnTmpfs {
        child,
        data: data.clone(),
    };
    let mut client = connect(&format!("http://127.0.0.1:{port}"), &stderr).await;
    let held = acquire_until(&mut client, "acme/held", "h1", |r| r.is_ok())
        .await
        .expect("a lock is granted while the disk has room");

    // The disk runs low: 24 MiB left, under the 64 MiB minimum.
    let filler = data.join("filler");
    fill(&filler, free_bytes(&data).saturating_sub(LEFT_FREE_BYTES));
    let refused = acquire_until(&mut client, "acme/new", "n1", |r| r.is_err())
        .await
        .expect_err("a new acquire is refused while the disk is low");
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    assert!(refused.message().contains("disk is low"), "{refused:?}");
    // What the node holds goes on: renewed, and read with its token.
    client
        .renew(RenewRequest {
            resource: "acme/held".into(),
            lease_id: held.lease_id.clone(),
            lease_ttl_ms: 0,
        })
        .await
        .expect("a renewal goes on while the disk is low");
    let got = client
        .get(GetRequest {
            resource: "acme/held".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(got.held, "{got:?}");
    assert_eq!(got.fencing_token, held.fencing_token);

    // Space returns: acquires are taken again, by the node itself.
    std::fs::remove_file(&filler).unwrap();
    let granted = acquire_until(&mut client, "acme/new", "n1", |r| r.is_ok())
        .await
        .expect("acquires are taken again once space returns");
    assert!(granted.fencing_token > held.fencing_token, "{granted:?}");
    let log = std::fs::read_to_string(&stderr).unwrap();
    assert!(log.contains("disk is low"), "{log}");
    assert!(log.contains("has room again"), "{log}");
}

/// The reserve off (`edge.min_free_disk_bytes = 0`) and the disk filled to
/// the last byte: the node's next write fails (ENOSPC) and it stops, never
/// answering a request it could not persist (fail-stop, like a failed
/// fsync). Once space returns it starts from its data with every lock it
/// granted, and grants above them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_disk_fills_to_the_last_byte_stops_and_restarts_with_every_lock() {
    let dir = tempfile::tempdir().unwrap();
    let data = mount_tmpfs(dir.path(), 96 * MIB);
    let (config, port) = single_node_on(dir.path());
    let start = |log: &str| {
        Command::new(common::fencelock_bin())
            .args(["serve", "--config"])
            .arg(&config)
            .env("FENCELOCK_EDGE_MIN_FREE_DISK_BYTES", "0")
            .env(
                "FENCELOCK_ADMIN_LISTEN_ADDR",
                format!("127.0.0.1:{}", common::free_port()),
            )
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join(log)).unwrap())
            .spawn()
            .unwrap()
    };
    let stderr = dir.path().join("first.log");
    let mut node = NodeOnTmpfs {
        child: start("first.log"),
        data: data.clone(),
    };
    let endpoint = format!("http://127.0.0.1:{port}");
    let mut client = connect(&endpoint, &stderr).await;
    let held = acquire_until(&mut client, "acme/held", "h1", |r| r.is_ok())
        .await
        .expect("a lock is granted while the disk has room");

    // Fill the disk to the last byte.
    let filler = data.join("filler");
    {
        let mut f = std::fs::File::create(&filler).unwrap();
        let chunk = vec![0x5au8; MIB as usize];
        while f.write_all(&chunk).is_ok() {}
        let mut byte = [0x5au8; 1];
        while f.write_all(&byte).is_ok() {
            byte[0] ^= 1;
        }
    }
    // Acquire, with 4 KiB values to use up what RocksDB preallocated for
    // its log, until the node stops; every grant answered must survive.
    let granted = std::sync::Arc::new(std::sync::Mutex::new(vec![(
        String::from("acme/held"),
        held.fencing_token,
    )]));
    let writers: Vec<_> = (0..8)
        .map(|w| {
            let mut client = client.clone();
            let granted = granted.clone();
            tokio::spawn(async move {
                for i in 0.. {
                    let resource = format!("acme/full-{w}-{i}");
                    let mut req = common::acquire_req(&resource, &format!("f{w}-{i}"), 600_000, 0);
                    req.value = vec![b'v'; 4096];
                    match tokio::time::timeout(Duration::from_secs(2), client.acquire(req)).await {
                        Ok(Ok(answer)) => {
                            let token = answer.into_inner().fencing_token;
                            granted.lock().unwrap().push((resource, token));
                        }
                        // Values not on yet, or the node is gone.
                        Ok(Err(_)) | Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                    }
                }
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(status) = node.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the node kept running on a full disk ({} grants):\n{}",
            granted.lock().unwrap().len(),
            std::fs::read_to_string(&stderr).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    for w in writers {
        w.abort();
    }
    let granted = granted.lock().unwrap().clone();
    assert!(!status.success(), "{status}");
    let log = std::fs::read_to_string(&stderr).unwrap();
    assert!(log.contains("No space left on device"), "{log}");
    println!(
        "stopped ({status}) after {} grants; its last words: {}",
        granted.len(),
        log.lines()
            .rev()
            .find(|l| l.contains("No space"))
            .unwrap_or("")
    );

    // Space returns; the node starts from its data with every lock.
    std::fs::remove_file(&filler).unwrap();
    node.child = start("second.log");
    let mut client = connect(&endpoint, &dir.path().join("second.log")).await;
    for (resource, token) in &granted {
        let deadline = Instant::now() + Duration::from_secs(30);
        let got = loop {
            match client
                .get(GetRequest {
                    resource: resource.clone(),
                })
                .await
            {
                Ok(got) => break got.into_inner(),
                Err(e) => {
                    assert!(Instant::now() < deadline, "{resource}: {e}");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        };
        assert!(
            got.held,
            "{resource} granted before the disk filled is lost"
        );
        assert_eq!(got.fencing_token, *token, "{resource}");
    }
    let max = granted.iter().map(|g| g.1).max().unwrap();
    let next = acquire_until(&mut client, "acme/after", "a1", |r| r.is_ok())
        .await
        .expect("the node grants again");
    assert!(next.fencing_token > max, "{next:?} not above {max}");
}
