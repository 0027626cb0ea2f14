//! Generates the Rust types and gRPC stubs from `proto/rigger/v1/*.proto` (needs `protoc`).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Lean buffers: the controller holds one stream per agent (see `LeanCodec`).
    tonic_prost_build::configure()
        .codec_path("crate::LeanCodec")
        .compile_protos(
            &[
                "proto/rigger/v1/agent_link.proto",
                "proto/rigger/v1/control.proto",
                "proto/rigger/v1/inventory.proto",
            ],
            &["proto"],
        )?;
    Ok(())
}
