//! Compiles the previous release's public contract, frozen in
//! `proto/<release>/fencelock/v1/`, into a client (no server: nothing
//! serves the old contract; old clients talk to new nodes) and an encoded
//! descriptor set for the schema check.
//!
//! The release is `PREVIOUS_RELEASE` below, the same commit the Makefile's
//! `PREVIOUS_RELEASE` names for `make upgrade-test` (a test checks that
//! they agree).

use std::error::Error;
use std::path::{Path, PathBuf};

/// The commit whose `proto/fencelock/v1/` is frozen here.
const PREVIOUS_RELEASE: &str = "73b04db";
/// The package directory under the release's proto root.
const PACKAGE_DIR: &str = "fencelock/v1";
/// Where the frozen descriptor set is written, relative to `OUT_DIR`.
const DESCRIPTOR_FILE: &str = "previous_descriptor.bin";

fn main() -> Result<(), Box<dyn Error>> {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    let root = manifest_dir.join("proto").join(PREVIOUS_RELEASE);
    println!("cargo:rerun-if-changed={}", root.display());
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rustc-env=FENCELOCK_PREVIOUS_RELEASE={PREVIOUS_RELEASE}");

    let mut files = Vec::new();
    for entry in std::fs::read_dir(root.join(PACKAGE_DIR))? {
        let name = PathBuf::from(entry?.file_name());
        if name.extension().is_some_and(|ext| ext == "proto") {
            files.push(Path::new(PACKAGE_DIR).join(name));
        }
    }
    if files.is_empty() {
        return Err(format!("no frozen .proto files under {}", root.display()).into());
    }
    files.sort();

    let mut compiler = protox::Compiler::new([&root])?;
    compiler.include_imports(true);
    compiler.open_files(&files)?;
    std::fs::write(
        out_dir.join(DESCRIPTOR_FILE),
        compiler.encode_file_descriptor_set(),
    )?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(false)
        .compile_fds(compiler.file_descriptor_set())?;
    Ok(())
}
