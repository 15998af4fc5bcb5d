//! The command line itself: help, exit codes, version, colour, quiet,
//! completions.

use std::process::Command;

fn nyann_bench() -> Command {
    Command::new(env!("CARGO_BIN_EXE_nyann-bench"))
}

#[test]
fn help_lists_every_command() {
    let out = nyann_bench().arg("--help").output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for command in [
        "generate",
        "demo",
        "sim",
        "scenario",
        "policy",
        "completions",
    ] {
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

/// A quick command that logs at INFO level and then fails: `generate`
/// against a listener that never answers, with a 1 s readiness wait.
fn logging_run(prefix: &[&str], env: &[(&str, &str)]) -> (std::process::Output, String) {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let target = format!("http://{}/v1", silent.local_addr().unwrap());
    let args = [
        "generate",
        "--target",
        &target,
        "--duration",
        "1s",
        "--ready-timeout",
        "1s",
    ];
    let out = nyann_bench()
        .args(prefix)
        .args(args)
        .env_remove("NO_COLOR")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out, stderr)
}

#[test]
fn a_redirected_log_has_no_colour_unless_asked() {
    let (out, plain) = logging_run(&[], &[]);
    assert_eq!(out.status.code(), Some(1), "{plain}");
    assert!(
        plain.contains("INFO") && plain.contains("waiting for"),
        "{plain}"
    );
    assert!(
        !plain.contains('\x1b'),
        "escape codes in a redirected log:\n{plain:?}"
    );

    let (_, coloured) = logging_run(&["--color", "always"], &[]);
    assert!(coloured.contains("\x1b["), "--color always:\n{coloured:?}");
    let (_, coloured) = logging_run(&["--color=always"], &[("NO_COLOR", "1")]);
    assert!(
        coloured.contains("\x1b["),
        "--color always beats NO_COLOR:\n{coloured:?}"
    );
}

/// On a terminal (a pseudo-terminal from util-linux's `script`), the log is
/// coloured unless NO_COLOR is set or `--color never` is given.
#[test]
fn a_terminal_gets_colour_unless_no_color_is_set() {
    let under_a_terminal = |env: &[(&str, &str)], flags: &str| {
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let command = format!(
            "{} {flags} generate --target http://{}/v1 --duration 1s --ready-timeout 1s",
            env!("CARGO_BIN_EXE_nyann-bench"),
            silent.local_addr().unwrap()
        );
        let out = Command::new("script")
            .args(["--quiet", "--return", "--command", &command, "/dev/null"])
            .env_remove("NO_COLOR")
            .envs(env.iter().copied())
            .output()
            .expect("util-linux `script` runs (Debian's bsdutils)");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let auto = under_a_terminal(&[], "");
    assert!(auto.contains("waiting for"), "{auto}");
    assert!(auto.contains("\x1b["), "no colour on a terminal:\n{auto:?}");
    let no_color = under_a_terminal(&[("NO_COLOR", "1")], "");
    assert!(no_color.contains("waiting for"), "{no_color}");
    assert!(
        !no_color.contains("\x1b["),
        "NO_COLOR ignored:\n{no_color:?}"
    );
    let never = under_a_terminal(&[], "--color never");
    assert!(
        !never.contains("\x1b["),
        "--color never ignored:\n{never:?}"
    );
}

#[test]
fn quiet_leaves_only_errors() {
    let (out, stderr) = logging_run(&["-q"], &[]);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(lines[0].starts_with("error: "), "{stderr}");
    let both = nyann_bench().args(["-q", "-v", "demo"]).output().unwrap();
    assert_eq!(
        both.status.code(),
        Some(2),
        "-q and -v together are a usage error"
    );
}

#[test]
fn version_names_the_commit_it_was_built_from() {
    let out = nyann_bench().arg("--version").output().unwrap();
    assert!(out.status.success());
    let version = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let head = Command::new("git")
        .args(["log", "-1", "--format=%h %cs", "--abbrev=12"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    let head = String::from_utf8_lossy(&head.stdout).trim().to_string();
    assert!(!head.is_empty(), "the tests run from a git checkout");
    assert_eq!(
        version,
        format!("nyann-bench {} ({head})", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn completions_are_valid_scripts() {
    for shell in ["bash", "zsh", "fish"] {
        let out = nyann_bench().args(["completions", shell]).output().unwrap();
        assert!(out.status.success(), "{shell}");
        let script = String::from_utf8_lossy(&out.stdout);
        for word in ["generate", "prometheus-url", "color"] {
            assert!(script.contains(word), "{shell} completions lack {word}");
        }
    }
    // bash is on every machine: check the syntax for real.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("nyann-bench.bash");
    let out = nyann_bench()
        .args(["completions", "bash"])
        .output()
        .unwrap();
    std::fs::write(&file, &out.stdout).unwrap();
    let check = Command::new("bash").arg("-n").arg(&file).output().unwrap();
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
}
