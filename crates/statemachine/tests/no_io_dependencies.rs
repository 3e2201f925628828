//! The state machine must stay a pure function: no async runtime, network,
//! storage, clock or randomness. This test fails the build of the suite if
//! someone adds one.

const FORBIDDEN_CRATES: &[&str] = &[
    "tokio", "tonic", "rocksdb", "raft", "rand", "chrono", "time", "hyper",
];
const FORBIDDEN_CALLS: &[&str] = &[
    "SystemTime",
    "Instant",
    "std::fs",
    "std::net",
    "thread_rng",
    "std::env",
    "std::thread",
];

#[test]
fn state_machine_has_no_io_or_clock_dependencies() {
    let dir = env!("CARGO_MANIFEST_DIR");
    let manifest = std::fs::read_to_string(format!("{dir}/Cargo.toml")).unwrap();
    let deps: String = manifest
        .split("\n[")
        .filter(|section| section.starts_with("dependencies") || section.starts_with("target"))
        .collect();
    for krate in FORBIDDEN_CRATES {
        assert!(
            !deps
                .lines()
                .any(|l| l.trim_start().starts_with(&format!("{krate} "))
                    || l.trim_start().starts_with(&format!("{krate}="))),
            "fencelock-statemachine must not depend on {krate}"
        );
    }
    for entry in std::fs::read_dir(format!("{dir}/src")).unwrap() {
        let path = entry.unwrap().path();
        let src = std::fs::read_to_string(&path).unwrap();
        for call in FORBIDDEN_CALLS {
            assert!(!src.contains(call), "{} uses {call}", path.display());
        }
    }
}
