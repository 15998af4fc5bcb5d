//! The command line itself: help, exit codes, version, colour, quiet,
//! completions.

use std::process::Command;

fn nyann_bench() -> Command {
    Command::new(env!("CARGO_BIN_EXE_nyann-bench"))
}

/// `--help` works from the binary (the text of every command's help is a
/// snapshot test of `cli`).
#[test]
fn help_is_printed_on_stdout() {
    let out = nyann_bench().arg("--help").output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("Load generator"));
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

/// bash completes the flags of subcommands, nested ones too, driven the way
/// bash drives it (`COMP_WORDS`, `COMP_CWORD`, the function's arguments).
/// (clap_complete's script selected no subcommand case for a hyphenated
/// binary name: below the top level nothing completed.)
#[test]
fn bash_completes_the_flags_of_subcommands() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("nyann-bench.bash");
    let out = nyann_bench()
        .args(["completions", "bash"])
        .output()
        .unwrap();
    std::fs::write(&file, &out.stdout).unwrap();
    let complete = |words: &[&str]| -> Vec<String> {
        let cword = words.len() - 1;
        let quoted: Vec<String> = words.iter().map(|w| format!("'{w}'")).collect();
        let script = format!(
            "source '{}'\nCOMP_WORDS=({})\nCOMP_CWORD={cword}\n_nyann__bench nyann-bench '{}' '{}'\nprintf '%s\\n' \"${{COMPREPLY[@]}}\"\n",
            file.display(),
            quoted.join(" "),
            words[cword],
            words[cword - 1],
        );
        let out = Command::new("bash").arg("-c").arg(script).output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect()
    };
    let generate = complete(&["nyann-bench", "generate", "--scr"]);
    assert!(
        generate.contains(&"--scrape".to_string())
            && generate.contains(&"--scrape-interval".to_string()),
        "{generate:?}"
    );
    let replay = complete(&["nyann-bench", "policy", "replay", "--pa"]);
    assert_eq!(replay, ["--param"], "{replay:?}");
    let top = complete(&["nyann-bench", "gen"]);
    assert_eq!(top, ["generate"]);
}

/// On a terminal a run ends with the table and the answer, not with the
/// JSON summary (95 lines for two stages, which scrolled the answer away):
/// the knee and the load not sent close stderr, and stdout holds nothing.
/// Piped, stdout is the summary, with its `conclusion`; `--json` prints it
/// on a terminal too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminal_ends_with_the_answer_and_a_pipe_gets_the_json() {
    let _serial = crate::support::serial().await;
    let sim = crate::support::simulator(false).await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("sweep.star");
    std::fs::write(
        &config,
        crate::support::sweep(&[2, 16, 64, 128], crate::sweep::STOPS_AT_16),
    )
    .unwrap();
    let metrics = crate::support::scrape_flags(&sim).join(" ");
    let command = |out: &str, extra: &str| {
        format!(
            "{} generate --config {} --target {} {metrics} --seed 1 --output-dir {} {extra} 2>{}",
            env!("CARGO_BIN_EXE_nyann-bench"),
            config.display(),
            sim.base_url(),
            dir.path().join(out).display(),
            dir.path().join(format!("{out}.stderr")).display(),
        )
    };
    let under_a_terminal = |command: String| {
        let out = Command::new("script")
            .args(["--quiet", "--return", "--command", &command, "/dev/null"])
            .env("NO_COLOR", "1")
            .output()
            .expect("util-linux `script` runs (Debian's bsdutils)");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (code, stdout) = under_a_terminal(command("tty", ""));
    let stderr = std::fs::read_to_string(dir.path().join("tty.stderr")).unwrap();
    assert_eq!(code, Some(0), "{stderr}");
    assert!(!stdout.contains('{'), "JSON on a terminal:\n{stdout}");
    let ending: Vec<&str> = stderr.lines().rev().take(4).collect();
    assert!(
        ending[0].starts_with("results: ")
            && ending[1].starts_with("load not sent: 2 stages skipped, 6s"),
        "{stderr}"
    );
    assert!(
        ending[2].starts_with("knee (congested from #1 c=16): #0 c=2 (concurrency=2): ")
            && ending[2].contains("req/s")
            && ending[2].contains("TTFT p50/p99"),
        "{stderr}"
    );
    assert!(
        ending[3].starts_with("sweep stopped after stage #1 c=16"),
        "{stderr}"
    );

    let (_, stdout) = under_a_terminal(command("json", "--json"));
    assert!(stdout.contains("\"conclusion\""), "{stdout}");

    let piped = tokio::process::Command::new("bash")
        .arg("-c")
        .arg(command("pipe", ""))
        .output()
        .await
        .unwrap();
    let summary: serde_json::Value = serde_json::from_slice(&piped.stdout).unwrap();
    let knee = &summary["conclusion"]["sweeps"][0]["knee"];
    assert_eq!(knee["concurrency"], 2, "{summary}");
    assert!(knee["requests_per_second"].as_f64().unwrap() > 0.0);
    assert_eq!(summary["conclusion"]["load_not_sent"]["stages"], 2);
    // summary.json says the same.
    let written: serde_json::Value = serde_json::from_slice(
        &std::fs::read(dir.path().join("pipe").join("summary.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(written["conclusion"], summary["conclusion"]);
}

/// A directory that holds a run is not overwritten by mistake (668 KB of
/// results became 6 KB): refused with the fix before any load, replaced
/// with --overwrite.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_output_dir_that_holds_a_run_is_refused_unless_told_to_overwrite() {
    let _serial = crate::support::serial().await;
    let sim = crate::support::simulator(false).await;
    let dir = tempfile::tempdir().unwrap();
    let run = |extra: &[&str]| {
        nyann_bench()
            .args(["generate", "--target", &sim.base_url(), "--duration", "1s"])
            .arg("--output-dir")
            .arg(dir.path())
            .args(extra)
            .output()
            .unwrap()
    };
    assert_eq!(run(&[]).status.code(), Some(0));
    let again = run(&[]);
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert_eq!(again.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("already holds a run (summary.json, written ")
            && stderr.contains("--overwrite to replace it"),
        "{stderr}"
    );
    assert_eq!(run(&["--overwrite"]).status.code(), Some(0));
}

/// Load flags that contradict each other are refused, as the scenario
/// language refuses them (`--rate 5 --concurrency 32` ran at 5/s).
#[test]
fn contradictory_load_flags_are_refused() {
    for (flags, expected) in [
        (
            &["--rate", "5", "--concurrency", "32"][..],
            "--rate 5 and --concurrency 32 are two kinds of load",
        ),
        (
            &["--mode", "concurrent", "--rate", "5"][..],
            "--mode concurrent runs closed-loop streams",
        ),
        (
            &["--mode", "poisson", "--concurrency", "3"][..],
            "--mode poisson is an open loop",
        ),
    ] {
        let out = nyann_bench()
            .args(["generate", "--target", "http://127.0.0.1:9/v1"])
            .args(flags)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains(expected), "{flags:?}: {stderr}");
    }
}

/// Off a terminal (a CI log, a pod's log) a long stage says how it is
/// going every `--progress-interval`, with how long the run has left at
/// most; before, nothing came between a stage's start and its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_off_a_terminal_gets_progress_lines_with_the_time_left() {
    let _serial = crate::support::serial().await;
    let sim = crate::support::simulator(false).await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("stages.star");
    std::fs::write(
        &config,
        "scenario(stages = [stage(\"3s\", concurrency=2), stage(\"3s\", concurrency=4)])\n",
    )
    .unwrap();
    let out = crate::support::nyann_bench()
        .arg("generate")
        .arg("--config")
        .arg(&config)
        .args(["--target", &sim.base_url(), "--progress-interval", "1s"])
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let first = stderr
        .lines()
        .find(|l| l.contains("INFO stage #0 c=2: ") && l.contains(" req/s, "))
        .unwrap_or_else(|| panic!("no progress line:\n{stderr}"));
    assert!(first.contains("; stage 1 of 2, at most "), "{first}");
    assert!(
        stderr
            .lines()
            .any(|l| l.contains("INFO stage #1 c=4: ") && l.contains("; stage 2 of 2, at most ")),
        "{stderr}"
    );
}
