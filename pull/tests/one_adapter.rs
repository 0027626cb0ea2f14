//! containerd's protocol is spoken in one file of the engine: `src/containerd/grpc.rs`.
//! Everything else reaches containerd through `containerd::Containerd`, which the
//! in-memory containerd also implements (so the pipeline is tested without a lab).

#![allow(clippy::unwrap_used, clippy::panic)] // test code

use std::path::Path;

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn only_the_grpc_adapter_names_containerd_client() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let adapter = src.join("containerd").join("grpc.rs");
    let naming: Vec<_> = files
        .iter()
        .filter(|f| **f != adapter)
        .filter(|f| {
            std::fs::read_to_string(f)
                .unwrap()
                .contains("containerd_client")
        })
        .collect();
    assert!(naming.is_empty(), "{naming:?} name containerd_client");
}
