//! Compiles the internal peer protocol in `proto/fencelock/internal/` into
//! Rust (package `fencelock.internal.v1`, included by `src/lib.rs` as
//! `internal`).
//!
//! `protox`, a pure-Rust protobuf compiler, parses the protos, so the build
//! needs no system `protoc`. `tonic-prost-build` turns its descriptor set into
//! prost messages plus the tonic client (the sending side of the transport)
//! and server (the receiving side).

use std::error::Error;
use std::path::{Path, PathBuf};

/// The directory, relative to the proto root, holding the internal protos.
/// Every `.proto` file in it is compiled.
const INTERNAL_PROTO_DIR: &str = "fencelock/internal";

fn main() -> Result<(), Box<dyn Error>> {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let proto_root = manifest_dir.join("../../proto");
    let internal_dir = proto_root.join(INTERNAL_PROTO_DIR);

    // Watching the directory (not each file) makes cargo notice protos that
    // are added or removed, not only edited.
    println!("cargo:rerun-if-changed={}", internal_dir.display());
    println!("cargo:rerun-if-changed=build.rs");

    let relative: Vec<PathBuf> = proto_files(&internal_dir)?
        .into_iter()
        .map(|name| Path::new(INTERNAL_PROTO_DIR).join(name))
        .collect();

    let mut compiler = protox::Compiler::new([&proto_root])?;
    // Source info carries the proto comments over as rustdoc on the
    // generated types.
    compiler.include_source_info(true).include_imports(true);
    compiler.open_files(&relative)?;

    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(compiler.file_descriptor_set())?;
    Ok(())
}

/// The `.proto` file names in `dir`, sorted so the generated code does not
/// depend on directory order.
fn proto_files(dir: &Path) -> Result<Vec<PathBuf>, Box<dyn Error>> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let name = PathBuf::from(entry?.file_name());
        if name.extension().is_some_and(|ext| ext == "proto") {
            names.push(name);
        }
    }
    if names.is_empty() {
        return Err(format!("no .proto files in {}", dir.display()).into());
    }
    names.sort();
    Ok(names)
}
