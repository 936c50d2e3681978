//! Pure-Rust protobuf pipeline: protox compiles the .proto files into a
//! FileDescriptorSet and tonic-prost-build generates code from it, so no
//! system `protoc` is needed.
use prost::Message;
use std::{env, fs, path::PathBuf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["toolfleet/v1/agent.proto"];
    println!("cargo:rerun-if-changed=toolfleet");
    let fds = protox::compile(protos, ["."])?;

    // The descriptor set also feeds gRPC server reflection in the orchestrator.
    let out = PathBuf::from(env::var("OUT_DIR")?);
    fs::write(out.join("toolfleet_descriptor.bin"), fds.encode_to_vec())?;

    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}
