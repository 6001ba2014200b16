//! `meridian`: one binary for every Meridian role. `main` parses and validates the
//! command line (flags with `MERIDIAN_*` environment fallbacks), sets up tracing, and hands
//! a typed config to the library crates; it holds no logic of its own beyond that.

mod cli;
mod drain;
mod node;
mod player;
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
        cli::Command::Player(args) => player::run(args),
        cli::Command::Token(args) => {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0);
            let token = meridian_gateway::accounts::mint_dev_token(
                &args.sub,
                args.name.as_deref(),
                now,
                args.ttl,
            );
            println!("{token}");
            Ok(())
        }
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("meridian: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
