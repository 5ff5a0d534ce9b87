fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/gnomon/worker/v1/worker.proto");
    println!("cargo:rerun-if-changed=proto/gnomon/raft/v1/raft.proto");
    // The services (tonic) only with the `grpc` feature; the messages always.
    let grpc = std::env::var_os("CARGO_FEATURE_GRPC").is_some();
    tonic_build::configure()
        .build_client(grpc)
        .build_server(grpc)
        .compile_protos(&["proto/gnomon/worker/v1/worker.proto", "proto/gnomon/raft/v1/raft.proto"], &["proto"])?;
    Ok(())
}
