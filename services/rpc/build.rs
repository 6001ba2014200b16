//! Generates the gateway<->shard gRPC code from `proto/cluster.proto` without a system `protoc`.

fn main() {
    let proto_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../proto");
    for file in ["cluster.proto", "client.proto"] {
        println!("cargo:rerun-if-changed={proto_dir}/{file}");
    }
    let descriptors = protox::compile([format!("{proto_dir}/cluster.proto")], [proto_dir])
        .expect("proto/cluster.proto compiles");
    tonic_prost_build::configure()
        // The client protocol's messages are generated once, in meridian-protocol.
        .extern_path(".meridian.client.v1", "::meridian_protocol::pb")
        // Delivery.frames is decoded as `Bytes`: a view into the received buffer, no copy.
        .bytes(".meridian.cluster.v1.Delivery.frames")
        .compile_fds(descriptors)
        .expect("tonic generates cluster protocol code");
}
