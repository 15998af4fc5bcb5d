//! The command line itself: help and exit codes.

use std::process::Command;

fn nyann_bench() -> Command {
    Command::new(env!("CARGO_BIN_EXE_nyann-bench"))
}

#[test]
fn help_lists_every_command() {
    let out = nyann_bench().arg("--help").output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for command in ["generate", "demo", "sim", "scenario", "policy"] {
        assert!(
            help.contains(command),
            "`{command}` missing from --help:\n{help}"
        );
    }
}

#[test]
fn unknown_command_is_a_usage_error() {
    let out = nyann_bench().arg("frobnicate").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}
