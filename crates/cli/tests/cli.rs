//! The `fencelock` binary starts and describes itself. (The binary's
//! behaviour against real clusters is tested in crates/server/tests/
//! real_process/, which finds the binary this crate builds.)

use std::process::Command;

#[test]
fn the_binary_answers_version_and_help() {
    let bin = env!("CARGO_BIN_EXE_fencelock");
    let version = Command::new(bin).arg("--version").output().expect("runs");
    assert!(version.status.success(), "{version:?}");
    let text = String::from_utf8_lossy(&version.stdout);
    assert!(
        text.starts_with("fencelock ") && text.contains(env!("CARGO_PKG_VERSION")),
        "{text}"
    );
    let help = Command::new(bin).arg("--help").output().expect("runs");
    assert!(help.status.success(), "{help:?}");
    let text = String::from_utf8_lossy(&help.stdout);
    for command in ["serve", "dev", "acquire", "lock", "admin"] {
        assert!(text.contains(command), "--help lists `{command}`: {text}");
    }
}
