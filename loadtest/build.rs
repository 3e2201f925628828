//! Compiles the benchmark's own subset of etcd's v3 gRPC API
//! (`proto/etcdbench/`) into Rust clients, with protox (no system `protoc`),
//! the same way `crates/api` compiles fencelock's contract.

use std::error::Error;
use std::path::PathBuf;

/// The files compiled, relative to the proto root.
const PROTO_FILES: &[&str] = &["kv.proto", "lock.proto"];

fn main() -> Result<(), Box<dyn Error>> {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let proto_root = manifest_dir.join("proto/etcdbench");
    println!("cargo:rerun-if-changed={}", proto_root.display());
    println!("cargo:rerun-if-changed=build.rs");

    let mut compiler = protox::Compiler::new([&proto_root])?;
    compiler.include_imports(true);
    compiler.open_files(PROTO_FILES)?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(false)
        .compile_fds(compiler.file_descriptor_set())?;
    Ok(())
}
