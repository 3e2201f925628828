//! The placement map is applied on every meta shard replica and the planner
//! must give the same plan for the same view, so the crate stays pure: no
//! async runtime, network, storage, clock or randomness, and no runtime
//! dependencies at all. This test fails the suite if someone adds one.

const FORBIDDEN_CALLS: &[&str] = &[
    "SystemTime",
    "Instant",
    "std::fs",
    "std::net",
    "std::env",
    "std::thread",
    "std::process",
    "thread_rng",
    "HashMap",
    "HashSet",
];

/// The `[dependencies]` (and target-specific dependency) tables of the
/// manifest, as lines.
fn runtime_dependency_lines(manifest: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let mut in_runtime_table = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            let table = line.trim_matches(|c| c == '[' || c == ']');
            in_runtime_table = table == "dependencies"
                || table.starts_with("dependencies.")
                || (table.starts_with("target.")
                    && table.ends_with("dependencies")
                    && !table.ends_with("dev-dependencies"));
            continue;
        }
        if in_runtime_table && !line.is_empty() && !line.starts_with('#') {
            lines.push(line.to_owned());
        }
    }
    lines
}

#[test]
fn placement_has_no_runtime_dependencies() {
    let dir = env!("CARGO_MANIFEST_DIR");
    let manifest = std::fs::read_to_string(format!("{dir}/Cargo.toml")).unwrap();
    let deps = runtime_dependency_lines(&manifest);
    assert!(
        deps.is_empty(),
        "fencelock-placement must have no runtime dependencies, found {deps:?}"
    );
}

#[test]
fn placement_sources_use_no_io_clock_randomness_or_unordered_maps() {
    // Unordered std maps are banned too: their iteration order is seeded per
    // process, which would make plans and encodings differ between replicas.
    let dir = env!("CARGO_MANIFEST_DIR");
    for entry in std::fs::read_dir(format!("{dir}/src")).unwrap() {
        let path = entry.unwrap().path();
        let src = std::fs::read_to_string(&path).unwrap();
        for call in FORBIDDEN_CALLS {
            assert!(!src.contains(call), "{} uses {call}", path.display());
        }
    }
}

#[test]
fn the_dependency_scan_sees_runtime_tables_only() {
    let manifest = "[package]\nname = \"x\"\n[dependencies]\ntokio = \"1\"\n\
                    [dev-dependencies]\nproptest = \"1\"\n\
                    [target.'cfg(unix)'.dependencies]\nlibc = \"0.2\"\n";
    assert_eq!(
        runtime_dependency_lines(manifest),
        vec!["tokio = \"1\"".to_owned(), "libc = \"0.2\"".to_owned()]
    );
}
