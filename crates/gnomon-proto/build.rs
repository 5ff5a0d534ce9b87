fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/gnomon/worker/v1/worker.proto");
    tonic_build::configure().compile_protos(&["proto/gnomon/worker/v1/worker.proto"], &["proto"])?;
    Ok(())
}
