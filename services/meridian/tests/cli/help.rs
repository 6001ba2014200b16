//! Every argument of every command says what it is for.

use std::process::Command;

use crate::meridian_bin;

/// Every command's path (`["player", "kick"]`) with the command itself.
fn commands() -> Vec<(Vec<String>, clap::Command)> {
    fn walk(
        path: Vec<String>,
        command: &clap::Command,
        all: &mut Vec<(Vec<String>, clap::Command)>,
    ) {
        all.push((path.clone(), command.clone()));
        for sub in command.get_subcommands() {
            let mut sub_path = path.clone();
            sub_path.push(sub.get_name().to_string());
            walk(sub_path, sub, all);
        }
    }
    let mut root = meridian::command();
    // Propagates the global flags to every subcommand and adds `--help` everywhere.
    root.build();
    let mut all = Vec::new();
    walk(Vec::new(), &root, &mut all);
    all
}

#[test]
fn every_argument_of_every_command_has_help() {
    let all = commands();
    assert!(all.len() >= 12, "the tree has every command: {}", all.len());
    let mut missing = Vec::new();
    for (path, command) in &all {
        let name = format!("meridian {}", path.join(" "));
        if !path.is_empty() && command.get_about().is_none() {
            missing.push(format!("{name} (the command itself)"));
        }
        for arg in command.get_arguments() {
            let described = arg.get_help().or(arg.get_long_help()).is_some_and(|h| {
                let text = h.to_string();
                text.trim().len() > 3
            });
            if !described {
                let flag =
                    arg.get_long().map_or_else(|| arg.get_id().to_string(), |l| format!("--{l}"));
                missing.push(format!("{name} {flag}"));
            }
        }
    }
    assert!(missing.is_empty(), "arguments without a description:\n  {}", missing.join("\n  "));
}

/// The binary's own `--help` of each command shows every visible flag, and no former
/// millisecond flag (they are kept, hidden, for old scripts).
#[test]
fn each_commands_help_lists_its_flags_and_hides_the_old_ones() {
    // clap's own `help` subcommands take no --help.
    for (path, command) in commands().into_iter().filter(|(path, _)| !path.contains(&"help".into()))
    {
        let output = Command::new(meridian_bin())
            .args(&path)
            .arg("--help")
            .env("NO_COLOR", "1")
            .output()
            .expect("running meridian --help");
        let text = String::from_utf8_lossy(&output.stdout);
        let name = format!("meridian {} --help", path.join(" "));
        assert!(output.status.success(), "{name} exited with {}: {text}", output.status);
        for arg in command.get_arguments() {
            let Some(long) = arg.get_long() else { continue };
            if arg.is_hide_set() {
                assert!(!text.contains(&format!("--{long} ")), "{name} shows hidden --{long}");
            } else {
                assert!(text.contains(&format!("--{long}")), "{name} does not list --{long}");
            }
        }
        assert!(!text.contains("-ms "), "{name} still offers a millisecond flag:\n{text}");
    }
}
