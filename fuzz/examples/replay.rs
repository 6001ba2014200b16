//! Replays fuzz inputs through a target's checks without libFuzzer or a sanitizer, on any
//! toolchain: `cargo run --manifest-path fuzz/Cargo.toml --example replay -- TARGET FILE...`.
//! With `MERIDIAN_FUZZ_TRACE=1`, `gateway_core` prints each operation as it runs it.

fn main() {
    let mut args = std::env::args().skip(1);
    let target = args.next().expect("usage: replay TARGET FILE...");
    for path in args {
        let data = std::fs::read(&path).unwrap_or_else(|e| panic!("cannot read {path}: {e}"));
        eprintln!("--- {target} {path}");
        match target.as_str() {
            "frame" => meridian_fuzz::frame::check(&data),
            "resume_token" => meridian_fuzz::resume_token::check(&data),
            "gateway_core" => eprintln!("{:?}", meridian_fuzz::gateway_core::run(&data)),
            other => panic!("no target {other}"),
        }
    }
}
