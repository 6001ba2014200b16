//! Generates the gateway<->shard gRPC code from `proto/cluster.proto` without a system `protoc`:
//! messages and tonic services with the `grpc` feature, the messages alone without it.

fn main() {
    let proto_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../proto");
    for file in ["cluster.proto", "client.proto"] {
        println!("cargo:rerun-if-changed={proto_dir}/{file}");
    }
    let descriptors = protox::compile([format!("{proto_dir}/cluster.proto")], [proto_dir])
        .expect("proto/cluster.proto compiles");
    // The client protocol's messages are generated once, in meridian-protocol.
    let client = (".meridian.client.v1", "::meridian_protocol::pb");
    // Delivery.frames is decoded as `Bytes`: a view into the received buffer, no copy.
    let frames = ".meridian.cluster.v1.Delivery.frames";
    if std::env::var_os("CARGO_FEATURE_GRPC").is_some() {
        tonic_prost_build::configure()
            .extern_path(client.0, client.1)
            .bytes(frames)
            .compile_fds(descriptors)
            .expect("tonic generates cluster protocol code");
    } else {
        // The same messages, without the services (prost alone, as tonic does inside).
        prost_build::Config::new()
            .extern_path(client.0, client.1)
            .bytes([frames])
            .compile_fds(descriptors)
            .expect("prost generates cluster protocol messages");
    }
}
