//! `meridian`: one binary for every Meridian role. `main` parses and validates the
//! command line (flags with `MERIDIAN_*` environment fallbacks), sets up tracing, and hands
//! a typed config to the library crates; it holds no logic of its own beyond that.

mod cli;
mod drain;
mod node;
mod status;
mod up;

use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = cli::Cli::parse();
    meridian_observe::init_tracing(cli.log_json);
    // Every node serves many sockets: the soft open-files limit (often 1024) goes up to the
    // hard one before anything opens.
    if let Err(error) = meridian_gateway::raise_open_files_limit() {
        tracing::warn!(%error, "cannot raise the open-files limit");
    }
    let result = match cli.command {
        cli::Command::Shard(args) => args.validate().and_then(node::run_shard),
        cli::Command::Gateway(args) => args.validate().and_then(node::run_gateway),
        cli::Command::Up(args) => args.validate().and_then(up::run),
        cli::Command::Status(args) => status::run(args),
        cli::Command::Drain(args) => drain::run(args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("meridian: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
