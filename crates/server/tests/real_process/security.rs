//! Security with real processes and sockets (docs/security.md): a
//! three-node `fencelock serve` cluster with mutual TLS, certificates made
//! at test time by `fencelock dev certs`. One cluster serves every check of
//! [`a_tls_cluster_enforces_identities_tenants_and_quotas`] (each a named
//! step) to keep the test time down; the start-up refusals run without a
//! cluster.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fencelock_api::v1::admin_service_client::AdminServiceClient;
use fencelock_api::v1::lock_service_client::LockServiceClient;
use fencelock_api::v1::{
    renew_result, AcquireRequest, ErrorDetail, GetRequest, ListNodesRequest, Reason,
    ReleaseRequest, RenewBatchRequest, RenewRequest,
};
use fencelock_server::internal::node_control_client::NodeControlClient;
use fencelock_server::security::{PeerTls, TlsMaterial};
use tonic::transport::Channel;
use tonic::Code;

fn fencelock(args: &[&str]) -> std::process::Output {
    Command::new(common::fencelock_bin())
        .args(args)
        .output()
        .expect("fencelock runs")
}

/// `fencelock dev certs` into `dir`: 3 nodes, clients acme/alice,
/// acme/mallory, beta/bob, quota/q, flood/f, and admin `ops`.
fn make_certs(dir: &Path) {
    let out = fencelock(&[
        "dev",
        "certs",
        "--out",
        dir.to_str().unwrap(),
        "--nodes",
        "3",
        "--tenant",
        "acme:alice",
        "--tenant",
        "acme:mallory",
        "--tenant",
        "beta:bob",
        "--tenant",
        "quota:q",
        "--tenant",
        "flood:f",
        "--admin",
        "ops",
    ]);
    assert!(
        out.status.success(),
        "dev certs: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn tls_of(certs: &Path, name: &str) -> PeerTls {
    let material = TlsMaterial::load(
        &certs.join("ca.crt"),
        &certs.join(format!("{name}.crt")),
        &certs.join(format!("{name}.key")),
    )
    .unwrap();
    PeerTls::new(Some(Arc::new(material)))
}

async fn channel(tls: &PeerTls, addr: &str) -> Result<Channel, tonic::transport::Error> {
    tls.endpoint(addr)?
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(10))
        .connect()
        .await
}

fn reason(status: &tonic::Status) -> Reason {
    ErrorDetail::from_status(status)
        .map(|d| d.reason())
        .unwrap_or(Reason::Unspecified)
}

fn assert_denied(what: &str, status: &tonic::Status) {
    assert_eq!(status.code(), Code::PermissionDenied, "{what}: {status:?}");
    assert_eq!(
        reason(status),
        Reason::PermissionDenied,
        "{what}: {status:?}"
    );
}

fn acquire_req(resource: &str, request_id: &str, wait_ms: u64) -> AcquireRequest {
    AcquireRequest {
        resource: resource.into(),
        request_id: request_id.as_bytes().to_vec(),
        lease_ttl_ms: 30_000,
        wait_timeout_ms: wait_ms,
        value: Vec::new(),
        ..Default::default()
    }
}

struct TlsCluster {
    _dir: tempfile::TempDir,
    certs: PathBuf,
    addrs: Vec<String>,
    admin_addrs: Vec<String>,
    _procs: Vec<common::Proc>,
}

impl TlsCluster {
    fn start() -> TlsCluster {
        let dir = tempfile::tempdir().unwrap();
        let certs = dir.path().join("certs");
        make_certs(&certs);
        let ports: Vec<u16> = (0..3).map(|_| common::free_port()).collect();
        let admin_ports: Vec<u16> = (0..3).map(|_| common::free_port()).collect();
        let peers: Vec<String> = ports
            .iter()
            .enumerate()
            .map(|(i, p)| format!("{{ id = {}, addr = \"127.0.0.1:{p}\" }}", i + 1))
            .collect();
        let mut procs = Vec::new();
        for id in 1..=3usize {
            // One shard, so the per-shard hold quota is the tenant's total.
            let text = format!(
                "node_id = {id}\nlisten_addr = \"127.0.0.1:{}\"\n\
                 admin_listen_addr = \"127.0.0.1:{}\"\ndata_dir = \"data{id}\"\n\
                 peers = [{}]\nshard_count = 1\n\n\
                 [raft]\ntick_interval_ms = 50\nelection_ticks = 10\nproposal_timeout_ms = 2000\n\n\
                 [lock]\nmax_held_per_tenant = 2\n\n\
                 [edge]\ntenant_requests_per_sec = 20\ntenant_burst = 60\n\n\
                 [tls]\nca_file = \"certs/ca.crt\"\ncert_file = \"certs/node-{id}.crt\"\n\
                 key_file = \"certs/node-{id}.key\"\n",
                ports[id - 1],
                admin_ports[id - 1],
                peers.join(", ")
            );
            let path = dir.path().join(format!("node{id}.toml"));
            std::fs::write(&path, text).unwrap();
            let log = std::fs::File::create(dir.path().join(format!("node{id}.log"))).unwrap();
            let child = Command::new(common::fencelock_bin())
                .args(["serve", "--config"])
                .arg(&path)
                .env("RUST_LOG", "warn")
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .expect("fencelock starts");
            procs.push(common::Proc(child));
        }
        TlsCluster {
            certs,
            addrs: ports.iter().map(|p| format!("127.0.0.1:{p}")).collect(),
            admin_addrs: admin_ports
                .iter()
                .map(|p| format!("127.0.0.1:{p}"))
                .collect(),
            _dir: dir,
            _procs: procs,
        }
    }

    /// A lock client on node 1 (requests for shards it does not lead are
    /// forwarded, with the caller's identity, to the leader).
    async fn lock_client(&self, name: &str) -> LockServiceClient<Channel> {
        let tls = tls_of(&self.certs, name);
        // Lazy: the nodes may still be starting.
        let channel = tls
            .endpoint(&self.addrs[0])
            .unwrap()
            .connect_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(10))
            .connect_lazy();
        LockServiceClient::new(channel)
    }

    /// Waits until an acquire as `name` works (leaders elected, the
    /// leader-changed entry committed).
    async fn wait_ready(&self, name: &str, resource: &str) -> Vec<u8> {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut client = self.lock_client(name).await;
        loop {
            match client.acquire(acquire_req(resource, "ready", 0)).await {
                Ok(r) => return r.into_inner().lease_id,
                Err(_) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(status) => panic!("cluster never became ready: {status:?}"),
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tls_cluster_enforces_identities_tenants_and_quotas() {
    let cluster = TlsCluster::start();
    let alice_lease = cluster.wait_ready("client-acme-alice", "acme/job").await;
    let mut alice = cluster.lock_client("client-acme-alice").await;
    let mut bob = cluster.lock_client("client-beta-bob").await;
    let mut mallory = cluster.lock_client("client-acme-mallory").await;

    // ---- tenant_b_cannot_release_tenant_a_resource
    let status = bob
        .release(ReleaseRequest {
            resource: "acme/job".into(),
            lease_id: alice_lease.clone(),
        })
        .await
        .unwrap_err();
    assert_denied("bob releases acme/job", &status);

    // ---- tenant_b_cannot_renew_tenant_a_resource
    let status = bob
        .renew(RenewRequest {
            resource: "acme/job".into(),
            lease_id: alice_lease.clone(),
            lease_ttl_ms: 0,
        })
        .await
        .unwrap_err();
    assert_denied("bob renews acme/job", &status);
    let batch = bob
        .renew_batch(RenewBatchRequest {
            items: vec![RenewRequest {
                resource: "acme/job".into(),
                lease_id: alice_lease.clone(),
                lease_ttl_ms: 0,
            }],
        })
        .await
        .unwrap()
        .into_inner();
    match &batch.results[0].outcome {
        Some(renew_result::Outcome::Error(d)) => assert_eq!(d.reason(), Reason::PermissionDenied),
        other => panic!("bob's batch item: {other:?}"),
    }

    // ---- tenant_b_cannot_read_tenant_a_resource (and learns nothing: a
    // held resource and a free one are refused alike)
    let held = bob
        .get(GetRequest {
            resource: "acme/job".into(),
        })
        .await
        .unwrap_err();
    let free = bob
        .get(GetRequest {
            resource: "acme/nothing-here".into(),
        })
        .await
        .unwrap_err();
    assert_denied("bob reads acme/job", &held);
    assert_eq!(held.message(), free.message());

    // ---- tenant_b_cannot_queue_on_tenant_a_resource
    let status = bob
        .acquire(acquire_req("acme/job", "bob-wait", 1_000))
        .await
        .unwrap_err();
    assert_denied("bob waits for acme/job", &status);

    // ---- stolen_lease_id_is_useless_to_another_identity_of_the_tenant
    let status = mallory
        .renew(RenewRequest {
            resource: "acme/job".into(),
            lease_id: alice_lease.clone(),
            lease_ttl_ms: 0,
        })
        .await
        .unwrap_err();
    assert_denied("mallory renews alice's lease", &status);
    let status = mallory
        .release(ReleaseRequest {
            resource: "acme/job".into(),
            lease_id: alice_lease.clone(),
        })
        .await
        .unwrap_err();
    assert_denied("mallory releases alice's lease", &status);
    // Same request id, other identity: a new acquire, not alice's lease.
    let status = mallory
        .acquire(acquire_req("acme/job", "ready", 0))
        .await
        .unwrap_err();
    assert_eq!(reason(&status), Reason::LockHeld, "{status:?}");
    let view = alice
        .get(GetRequest {
            resource: "acme/job".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(view.held);
    alice
        .renew(RenewRequest {
            resource: "acme/job".into(),
            lease_id: alice_lease.clone(),
            lease_ttl_ms: 0,
        })
        .await
        .expect("the owner renews");

    // ---- a_client_cannot_claim_another_identity_in_metadata
    let mut forged = tonic::Request::new(GetRequest {
        resource: "beta/x".into(),
    });
    forged.metadata_mut().insert(
        "x-fencelock-identity",
        "spiffe://fencelock/tenant/beta/bob".parse().unwrap(),
    );
    assert_denied(
        "alice claims bob's identity",
        &alice.get(forged).await.unwrap_err(),
    );

    // ---- internal_and_admin_services_refuse_client_identities
    let tls = tls_of(&cluster.certs, "client-acme-alice");
    let mut control = NodeControlClient::new(channel(&tls, &cluster.addrs[1]).await.unwrap());
    assert_denied(
        "alice calls NodeControl",
        &control
            .get_map(fencelock_server::internal::GetMapRequest::default())
            .await
            .unwrap_err(),
    );
    let mut admin_as_alice =
        AdminServiceClient::new(channel(&tls, &cluster.addrs[0]).await.unwrap());
    assert_denied(
        "alice calls AdminService",
        &admin_as_alice
            .list_nodes(ListNodesRequest {})
            .await
            .unwrap_err(),
    );
    let ops = tls_of(&cluster.certs, "admin-ops");
    let mut admin = AdminServiceClient::new(channel(&ops, &cluster.addrs[0]).await.unwrap());
    let nodes = admin.list_nodes(ListNodesRequest {}).await.unwrap();
    assert_eq!(nodes.into_inner().nodes.len(), 3);
    // An admin may read any tenant's lock, but not take one.
    let mut ops_locks = LockServiceClient::new(channel(&ops, &cluster.addrs[0]).await.unwrap());
    assert!(
        ops_locks
            .get(GetRequest {
                resource: "acme/job".into()
            })
            .await
            .unwrap()
            .into_inner()
            .held
    );
    assert_denied(
        "admin acquires",
        &ops_locks
            .acquire(acquire_req("acme/other", "ops-1", 0))
            .await
            .unwrap_err(),
    );

    // ---- admin_http_views_need_an_admin_certificate
    let status_url = format!("https://{}/status.json", cluster.admin_addrs[0]);
    let curl = |name: &str| {
        let out = Command::new("curl")
            .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "--cacert"])
            .arg(cluster.certs.join("ca.crt"))
            .arg("--cert")
            .arg(cluster.certs.join(format!("{name}.crt")))
            .arg("--key")
            .arg(cluster.certs.join(format!("{name}.key")))
            .arg(&status_url)
            .output()
            .expect("curl runs");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(curl("client-acme-alice"), "403");
    assert_eq!(curl("admin-ops"), "200");

    // ---- the_cli_speaks_tls_from_flags_and_environment
    let cert = |name: &str, ext: &str| {
        cluster
            .certs
            .join(format!("{name}.{ext}"))
            .display()
            .to_string()
    };
    let cli = |args: &[&str], name: &str| {
        Command::new(common::fencelock_bin())
            .args(args)
            .env("FENCELOCK_TLS_CA_FILE", cert("ca", "crt"))
            .env("FENCELOCK_TLS_CERT_FILE", cert(name, "crt"))
            .env("FENCELOCK_TLS_KEY_FILE", cert(name, "key"))
            .output()
            .expect("fencelock runs")
    };
    let endpoint = cluster.addrs[1].clone();
    let out = cli(
        &["acquire", "beta/cli", "--endpoint", &endpoint],
        "client-beta-bob",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = cli(
        &[
            "lock",
            "beta/cli-lock",
            "--endpoints",
            &endpoint,
            "--",
            "true",
        ],
        "client-beta-bob",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = cli(&["admin", "nodes", "--endpoint", &endpoint], "admin-ops");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Bob's certificate is not an admin's.
    let out = cli(
        &["admin", "nodes", "--endpoint", &endpoint],
        "client-beta-bob",
    );
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("PERMISSION_DENIED"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // ---- plaintext_connection_to_a_tls_node_is_refused
    let plain = PeerTls::insecure();
    let refused = match channel(&plain, &cluster.addrs[0]).await {
        Err(_) => true,
        Ok(ch) => LockServiceClient::new(ch)
            .get(GetRequest {
                resource: "acme/job".into(),
            })
            .await
            .is_err(),
    };
    assert!(refused, "a plaintext call was answered");

    // ---- a_client_certificate_from_an_unknown_ca_is_refused
    let rogue_dir = tempfile::tempdir().unwrap();
    let rogue = rogue_dir.path().join("certs");
    make_certs(&rogue);
    // Trusts the real CA (so the server is verified), presents a
    // certificate of another CA with a valid-looking identity.
    let material = TlsMaterial::from_pem(
        &std::fs::read(cluster.certs.join("ca.crt")).unwrap(),
        &std::fs::read(rogue.join("client-acme-alice.crt")).unwrap(),
        &std::fs::read(rogue.join("client-acme-alice.key")).unwrap(),
    )
    .unwrap();
    let rogue_tls = PeerTls::new(Some(Arc::new(material)));
    let refused = match channel(&rogue_tls, &cluster.addrs[0]).await {
        Err(_) => true,
        Ok(ch) => LockServiceClient::new(ch)
            .get(GetRequest {
                resource: "acme/job".into(),
            })
            .await
            .is_err(),
    };
    assert!(refused, "a certificate of another CA was accepted");

    // ---- an_oversized_message_is_refused_at_the_edge
    let status = bob
        .get(GetRequest {
            resource: format!("beta/{}", "x".repeat(5 << 20)),
        })
        .await
        .unwrap_err();
    assert!(
        matches!(status.code(), Code::OutOfRange | Code::ResourceExhausted),
        "{status:?}"
    );

    // ---- tenant_hold_quota_is_resource_exhausted_and_spares_other_tenants
    let mut quota = cluster.lock_client("client-quota-q").await;
    for (i, r) in ["quota/a", "quota/b"].into_iter().enumerate() {
        quota
            .acquire(acquire_req(r, &format!("q{i}"), 0))
            .await
            .unwrap();
    }
    let status = quota
        .acquire(acquire_req("quota/c", "q2", 0))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert_eq!(reason(&status), Reason::TenantQuotaExceeded);
    bob.acquire(acquire_req("beta/x", "b1", 0))
        .await
        .expect("another tenant still acquires");

    // ---- tenant_rate_limit_is_resource_exhausted_and_spares_other_tenants
    let mut flood = cluster.lock_client("client-flood-f").await;
    let mut limited = None;
    for _ in 0..500 {
        if let Err(status) = flood
            .get(GetRequest {
                resource: "flood/x".into(),
            })
            .await
        {
            limited = Some(status);
            break;
        }
    }
    let status = limited.expect("the flood is limited");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert_eq!(reason(&status), Reason::RateLimited);
    assert!(ErrorDetail::from_status(&status).unwrap().retry_after_ms > 0);
    bob.get(GetRequest {
        resource: "beta/x".into(),
    })
    .await
    .expect("another tenant is not rate limited");
}

#[test]
fn a_config_without_tls_or_insecure_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let port = common::free_port();
    let path = dir.path().join("node.toml");
    std::fs::write(
        &path,
        format!(
            "node_id = 1\nlisten_addr = \"127.0.0.1:{port}\"\ndata_dir = \"data\"\n\
             peers = [{{ id = 1, addr = \"127.0.0.1:{port}\" }}]\n"
        ),
    )
    .unwrap();
    for args in [
        vec!["serve", "--config", path.to_str().unwrap()],
        vec!["config", "check", path.to_str().unwrap()],
    ] {
        let out = fencelock(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} started");
        assert!(
            stderr.contains("`tls`") && stderr.contains("tls.insecure"),
            "{args:?}: {stderr}"
        );
    }
    assert!(!dir.path().join("data").exists(), "nothing was created");
}

#[cfg(unix)]
#[test]
fn a_data_dir_open_to_others_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).unwrap();
    let port = common::free_port();
    let path = dir.path().join("node.toml");
    std::fs::write(
        &path,
        format!(
            "node_id = 1\nlisten_addr = \"127.0.0.1:{port}\"\ndata_dir = \"data\"\n\
             peers = [{{ id = 1, addr = \"127.0.0.1:{port}\" }}]\n\
             replication_factor = 1\n\n[tls]\ninsecure = true\n"
        ),
    )
    .unwrap();
    let mut child = Command::new(common::fencelock_bin())
        .args(["serve", "--config"])
        .arg(&path)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("a node with a 0755 data dir kept running");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    use std::io::Read as _;
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(!status.success());
    assert!(
        stderr.contains("0755") && stderr.contains(&data.display().to_string()),
        "{stderr}"
    );
    assert!(!data.join("db").exists(), "the store was not opened");
}
