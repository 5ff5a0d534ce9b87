fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/gnomon/worker/v1/worker.proto");
    println!("cargo:rerun-if-changed=proto/gnomon/raft/v1/raft.proto");
    tonic_build::configure().compile_protos(&["proto/gnomon/worker/v1/worker.proto", "proto/gnomon/raft/v1/raft.proto"], &["proto"])?;
    Ok(())
}
