//! The real `fencelock` binary and the child processes tests start.

/// The `fencelock` binary (crates/cli) that `cargo test --workspace` built
/// beside this test binary: `target/debug/deps/<test>` → `target/debug/
/// fencelock` (or `FENCELOCK_BIN`). Panics saying how to build it.
pub fn fencelock_bin() -> std::path::PathBuf {
    if let Some(path) = std::env::var_os("FENCELOCK_BIN") {
        return path.into();
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    exe.ancestors()
        .skip(1)
        .take(2)
        .map(|dir| dir.join("fencelock"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "no fencelock binary next to {}: run these tests with `cargo test --workspace` \
                 (which builds crates/cli) or set FENCELOCK_BIN",
                exe.display()
            )
        })
}

/// A child process killed (and reaped) when the test ends, passing or not.
pub struct Proc(pub std::process::Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
