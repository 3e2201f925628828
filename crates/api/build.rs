//! Compiles the public contract in `proto/fencelock/v1/` into Rust.
//!
//! The protos are parsed by `protox`, a pure-Rust protobuf compiler, so the
//! build never needs a system `protoc` (nor the `PROTOC` variable). From its
//! descriptor set, `tonic-prost-build` generates the prost messages and,
//! with the `grpc` feature, the tonic clients and servers
//! (`$OUT_DIR/fencelock.v1.rs`), and the same descriptor set, encoded,
//! becomes `FILE_DESCRIPTOR_SET` for gRPC reflection. Without `grpc` only
//! the messages are generated, so the crates below the gRPC edge build
//! without tonic.
//!
//! It also compiles the internal peer protocol in `proto/fencelock/internal/`
//! (package `fencelock.internal.v1`: Raft message streams between nodes and
//! the `NodeControl` service), so that the transport, the server and the
//! tests share one generated copy. Internal protos are not in the
//! reflection descriptor set: they are not part of the public contract.

use std::error::Error;
use std::path::{Path, PathBuf};

/// The protobuf package this crate compiles, as a directory under the proto
/// root. Every `.proto` file in it is compiled.
const PACKAGE_DIR: &str = "fencelock/v1";
/// The internal protocol's directory under the proto root.
const INTERNAL_PACKAGE_DIR: &str = "fencelock/internal";

/// Where `FILE_DESCRIPTOR_SET` is written, relative to `OUT_DIR`.
const DESCRIPTOR_FILE: &str = "fencelock_v1_descriptor.bin";

fn main() -> Result<(), Box<dyn Error>> {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    // Cargo sets this for a build script when the crate's `grpc` feature is on.
    let grpc = std::env::var_os("CARGO_FEATURE_GRPC").is_some();
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    let proto_root = manifest_dir.join("../../proto");

    // A directory makes cargo rescan everything below it, so added, removed
    // and edited protos all trigger a rebuild.
    println!("cargo:rerun-if-changed={}", proto_root.display());
    println!("cargo:rerun-if-changed=build.rs");

    let files = proto_files(&proto_root.join(PACKAGE_DIR))?;
    let relative: Vec<PathBuf> = files
        .iter()
        .map(|f| Path::new(PACKAGE_DIR).join(f))
        .collect();

    let mut compiler = protox::Compiler::new([&proto_root])?;
    // Source info keeps the proto comments: they become rustdoc here and
    // stay visible to reflection clients.
    compiler.include_source_info(true).include_imports(true);
    compiler.open_files(&relative)?;

    std::fs::write(
        out_dir.join(DESCRIPTOR_FILE),
        compiler.encode_file_descriptor_set(),
    )?;

    tonic_prost_build::configure()
        .build_client(grpc)
        .build_server(grpc)
        .compile_fds(compiler.file_descriptor_set())?;

    // The internal protocol, compiled on its own: it imports nothing from
    // the public package, and stays out of FILE_DESCRIPTOR_SET.
    let internal: Vec<PathBuf> = proto_files(&proto_root.join(INTERNAL_PACKAGE_DIR))?
        .iter()
        .map(|f| Path::new(INTERNAL_PACKAGE_DIR).join(f))
        .collect();
    let mut compiler = protox::Compiler::new([&proto_root])?;
    compiler.include_source_info(true).include_imports(true);
    compiler.open_files(&internal)?;
    tonic_prost_build::configure()
        .build_client(grpc)
        .build_server(grpc)
        .compile_fds(compiler.file_descriptor_set())?;
    Ok(())
}

/// The `.proto` file names in `dir`, sorted so the output is deterministic.
fn proto_files(dir: &Path) -> Result<Vec<PathBuf>, Box<dyn Error>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let name = PathBuf::from(entry?.file_name());
        if name.extension().is_some_and(|ext| ext == "proto") {
            files.push(name);
        }
    }
    if files.is_empty() {
        return Err(format!("no .proto files in {}", dir.display()).into());
    }
    files.sort();
    Ok(files)
}
