//! The crate graph is the architecture (docs/architecture.md, "Crates"):
//! dependencies only point down, the pure and storage crates never pull in
//! protobuf or gRPC, the store loop, the controller and the deterministic
//! simulation never pull in gRPC, HTTP or TLS, and the transport's fault
//! rules never reach a release build.
//! Checked with `cargo tree` on the workspace these tests were built from.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `cargo tree` with `args`, one package (or feature) per line, no prefix.
fn cargo_tree(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO"))
        .current_dir(workspace_root())
        .args(["tree", "--locked", "--prefix", "none"])
        .args(args)
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "cargo tree {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8")
}

/// Every package in the dependency tree of `krate` over `edges`, by name,
/// with the features a build of `krate` alone resolves (so a feature that
/// only another workspace member enables does not count).
fn dependencies(krate: &str, edges: &str) -> BTreeSet<String> {
    cargo_tree(&["-p", krate, "-e", edges, "-f", "{p}"])
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

/// Every package in `krate`'s normal (non-dev) dependency tree, by name.
fn normal_dependencies(krate: &str) -> BTreeSet<String> {
    dependencies(krate, "normal,build")
}

/// gRPC, HTTP and TLS: the node's edge (server, transport, CLI, clients)
/// only. Code generators (`tonic-build`) are not among them.
const GRPC_HTTP_TLS: &[&str] = &[
    "tonic",
    "tonic-prost",
    "axum",
    "hyper",
    "h2",
    "rustls",
    "tokio-rustls",
];

fn found<'a>(deps: &BTreeSet<String>, forbidden: &[&'a str]) -> Vec<&'a str> {
    forbidden
        .iter()
        .copied()
        .filter(|f| deps.contains(*f))
        .collect()
}

#[test]
fn the_state_machine_placement_codec_storage_and_router_never_depend_on_protobuf_or_grpc() {
    let mut forbidden = GRPC_HTTP_TLS.to_vec();
    forbidden.push("prost");
    for krate in [
        "fencelock-statemachine",
        "fencelock-placement",
        "fencelock-codec",
        "fencelock-storage",
        "fencelock-router",
    ] {
        let edge = found(&normal_dependencies(krate), &forbidden);
        assert!(edge.is_empty(), "{krate} depends on {edge:?}");
    }
}

/// The store loop answers in the contract's messages (its errors' wire
/// form) and the controller speaks to nodes through its `NodeApi` trait:
/// both use `fencelock-api` without its `grpc` feature, so neither reaches
/// tonic, HTTP or TLS, directly or through the API crate. The
/// configuration crate builds on both and stays as free of the edge, and
/// so does the status page (only the admin port's wiring serves it).
#[test]
fn the_store_loop_and_the_controller_build_without_grpc_http_or_tls() {
    for krate in [
        "fencelock-multiraft",
        "fencelock-controller",
        "fencelock-config",
        "fencelock-status",
    ] {
        let deps = normal_dependencies(krate);
        assert!(
            deps.contains("fencelock-api"),
            "{krate}: read the tree: {deps:?}"
        );
        let edge = found(&deps, GRPC_HTTP_TLS);
        assert!(edge.is_empty(), "{krate} depends on {edge:?}");
    }
}

/// The deterministic simulation runs the real store loop and the
/// controller's migration protocol without the node's edge: no gRPC, HTTP
/// or TLS anywhere in what its tests build (dev-dependencies included).
#[test]
fn the_deterministic_simulation_builds_without_grpc_http_or_tls() {
    let deps = dependencies("fencelock-simulation", "normal,build,dev");
    for needed in [
        "fencelock-multiraft",
        "fencelock-controller",
        "fencelock-nemesis",
    ] {
        assert!(deps.contains(needed), "read the tree: {deps:?}");
    }
    let edge = found(&deps, GRPC_HTTP_TLS);
    assert!(
        edge.is_empty(),
        "the simulation depends on {edge:?}: `cargo tree -p fencelock-simulation -e normal,build,dev -i {}` says through what",
        edge[0]
    );
    assert!(
        !deps.contains("fencelock-server") && !deps.contains("fencelock-transport"),
        "the simulation builds the node's edge: {deps:?}"
    );
}

#[test]
fn the_crate_dependencies_only_point_down() {
    // Each crate, and the workspace crates it may build on.
    let allowed: &[(&str, &[&str])] = &[
        ("fencelock-statemachine", &[]),
        ("fencelock-placement", &["fencelock-statemachine"]),
        (
            "fencelock-codec",
            &["fencelock-statemachine", "fencelock-placement"],
        ),
        ("fencelock-storage", &[]),
        (
            "fencelock-router",
            &["fencelock-statemachine", "fencelock-placement"],
        ),
        (
            "fencelock-api",
            &["fencelock-statemachine", "fencelock-placement"],
        ),
        (
            "fencelock-multiraft",
            &[
                "fencelock-statemachine",
                "fencelock-placement",
                "fencelock-codec",
                "fencelock-storage",
                "fencelock-router",
                "fencelock-api",
            ],
        ),
        (
            "fencelock-controller",
            &[
                "fencelock-statemachine",
                "fencelock-placement",
                "fencelock-router",
                "fencelock-api",
            ],
        ),
        (
            "fencelock-config",
            &[
                "fencelock-statemachine",
                "fencelock-placement",
                "fencelock-codec",
                "fencelock-storage",
                "fencelock-router",
                "fencelock-api",
                "fencelock-multiraft",
                "fencelock-controller",
            ],
        ),
        // The edge's security uses the transport's TLS material (and so
        // reaches what the transport builds on), never the configuration,
        // the controller or the server.
        (
            "fencelock-security",
            &[
                "fencelock-statemachine",
                "fencelock-placement",
                "fencelock-codec",
                "fencelock-storage",
                "fencelock-router",
                "fencelock-api",
                "fencelock-multiraft",
                "fencelock-transport",
            ],
        ),
        // The status page reads the contract's messages and asks nodes
        // through the controller's `NodeApi`: no store, no RocksDB.
        (
            "fencelock-status",
            &[
                "fencelock-statemachine",
                "fencelock-placement",
                "fencelock-router",
                "fencelock-api",
                "fencelock-controller",
            ],
        ),
    ];
    for (krate, may) in allowed {
        let ours: BTreeSet<String> = normal_dependencies(krate)
            .into_iter()
            .filter(|p| p.starts_with("fencelock-") && p != krate)
            .collect();
        let extra: Vec<&String> = ours.iter().filter(|p| !may.contains(&p.as_str())).collect();
        assert!(extra.is_empty(), "{krate} depends on {extra:?}, above it");
    }
}

/// Fault rules (partitions, drops, delays) are test code: the feature that
/// compiles them into the transport is enabled by dev-dependencies only, so
/// `cargo build --release` of the `fencelock` binary never has them.
#[test]
fn the_fault_rule_hook_is_not_compiled_into_a_release_build() {
    let features = |edges: &str| {
        cargo_tree(&[
            "--workspace",
            "-e",
            edges,
            "-i",
            "fencelock-transport",
            "-f",
            "{p} {f}",
        ])
    };
    // What a test build enables: the fault rules are there, so this check
    // can see the feature when it is on.
    let test_build = features("features");
    assert!(
        test_build.contains("feature \"fault-rules\""),
        "the test build should have fault rules: {test_build}"
    );
    // What a release build of the workspace enables (no dev-dependencies).
    let release_build = features("features,normal,build");
    assert!(
        !release_build.contains("fault-rules"),
        "a normal dependency enables the fault rules, so release builds carry them:\n{release_build}"
    );
}
