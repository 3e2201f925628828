//! The crate graph is the architecture (docs/architecture.md, "Crates"):
//! dependencies only point down, the pure and storage crates never pull in
//! gRPC, and the transport's fault rules never reach a release build.
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

/// Every package in `krate`'s normal (non-dev) dependency tree, by name.
fn normal_dependencies(krate: &str) -> BTreeSet<String> {
    cargo_tree(&["-p", krate, "-e", "normal,build", "-f", "{p}"])
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

/// The crates a release build of the node must never carry beneath these
/// layers: gRPC, HTTP, TLS.
const EDGE_ONLY: &[&str] = &["tonic", "axum", "hyper", "rustls", "tokio-rustls", "prost"];

#[test]
fn the_state_machine_placement_storage_router_and_store_loop_never_depend_on_grpc() {
    for krate in [
        "fencelock-statemachine",
        "fencelock-placement",
        "fencelock-codec",
        "fencelock-storage",
        "fencelock-router",
        "fencelock-multiraft",
    ] {
        let deps = normal_dependencies(krate);
        let edge: Vec<&&str> = EDGE_ONLY.iter().filter(|e| deps.contains(**e)).collect();
        assert!(edge.is_empty(), "{krate} depends on {edge:?}");
    }
}

/// The controller speaks to nodes through its `NodeApi` trait: gRPC is the
/// server's business. (It still reaches tonic through `fencelock-api`'s
/// generated services; its own manifest names no gRPC, HTTP or TLS crate.)
#[test]
fn the_controller_uses_no_grpc_of_its_own() {
    let direct: BTreeSet<String> = cargo_tree(&[
        "-p",
        "fencelock-controller",
        "-e",
        "normal",
        "--depth",
        "1",
        "-f",
        "{p}",
    ])
    .lines()
    .filter_map(|l| l.split_whitespace().next())
    .map(str::to_owned)
    .collect();
    assert!(
        direct.contains("fencelock-api"),
        "read the tree: {direct:?}"
    );
    let edge: Vec<&&str> = EDGE_ONLY.iter().filter(|e| direct.contains(**e)).collect();
    assert!(edge.is_empty(), "fencelock-controller depends on {edge:?}");
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
            "fencelock-multiraft",
            &[
                "fencelock-statemachine",
                "fencelock-placement",
                "fencelock-codec",
                "fencelock-storage",
                "fencelock-router",
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
