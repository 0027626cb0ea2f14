//! Generates the Rust types and gRPC stubs from `proto/rigger/v1/*.proto` (needs `protoc`).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    tonic_prost_build::configure().compile_protos(
        &[
            "proto/rigger/v1/agent_link.proto",
            "proto/rigger/v1/control.proto",
            "proto/rigger/v1/inventory.proto",
        ],
        &["proto"],
    )?;
    Ok(())
}
