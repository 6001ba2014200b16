//! Generates the client protocol types from `proto/client.proto` without a system `protoc`.

fn main() {
    let proto_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../proto");
    let file = format!("{proto_dir}/client.proto");
    println!("cargo:rerun-if-changed={file}");
    let descriptors = protox::compile([&file], [proto_dir]).expect("proto/client.proto compiles");
    prost_build::Config::new()
        .compile_fds(descriptors)
        .expect("prost generates client protocol types");
}
