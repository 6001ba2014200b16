//! The stock `meridian` binary: every command, the world with no game rules by default,
//! and the example game (`--game wolves`). See the library's `run` for a studio's own.

fn main() -> std::process::ExitCode {
    meridian::run_with(meridian::Games::stock())
}
