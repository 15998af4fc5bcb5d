//! Policy tools end to end: a policy scaffolded outside the repository,
//! built and used in a sweep; replay and fixture checks of a recorded run;
//! scenario parameter checks without a run.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

use crate::support::{generate, nyann_bench, policy_wasm, scrape_flags, serial, simulator, sweep};
use crate::sweep::{LEVELS, STOPS_AT_16};

/// `cargo ARGS` in `dir` as a policy author would run it: a clean
/// environment (no variables of the test's own build), the toolchain the
/// tests run with (it has the wasm32-wasip2 target), crates.io reachable.
fn cargo(dir: &Path, args: &[&str]) -> std::process::Output {
    let mut command = Command::new("cargo");
    command.current_dir(dir).args(args).env_clear();
    for (key, value) in std::env::vars_os() {
        let Some(name) = key.to_str() else { continue };
        let keep = matches!(
            name,
            "PATH" | "HOME" | "CARGO_HOME" | "RUSTUP_HOME" | "RUSTUP_TOOLCHAIN" | "TMPDIR"
        ) || name.starts_with("CARGO_NET_")
            || name.starts_with("CARGO_HTTP_")
            || name.starts_with("CARGO_REGISTRIES_")
            || name.starts_with("RUSTUP_AUTO")
            || name.ends_with("_PROXY")
            || name.ends_with("_proxy");
        if keep {
            command.env(key, value);
        }
    }
    command.output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_policy_builds_outside_the_repository_and_stops_a_sweep() {
    let dir = tempfile::tempdir().unwrap();
    let out = nyann_bench()
        .current_dir(dir.path())
        .args(["policy", "new", "my-policy"])
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let crate_dir = dir.path().join("my-policy");
    let manifest = std::fs::read_to_string(crate_dir.join("Cargo.toml")).unwrap();
    let checkout = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    assert!(
        !manifest.contains(&checkout.display().to_string()),
        "the scaffold must not point at this checkout:\n{manifest}"
    );

    // The rules build and test natively without a warning.
    let test = cargo(&crate_dir, &["test", "--release"]);
    let stderr = text(&test.stderr);
    assert!(test.status.success(), "{stderr}");
    assert!(!stderr.contains("warning"), "{stderr}");

    let build = cargo(
        &crate_dir,
        &["build", "--release", "--target", "wasm32-wasip2"],
    );
    assert!(build.status.success(), "{}", text(&build.stderr));
    let wasm = crate_dir.join("target/wasm32-wasip2/release/my_policy.wasm");

    let check = nyann_bench()
        .args(["policy", "check"])
        .arg(&wasm)
        .args(["--param", "ttft_p99=1s"])
        .output()
        .await
        .unwrap();
    let stdout = text(&check.stdout);
    assert_eq!(
        check.status.code(),
        Some(0),
        "{stdout}{}",
        text(&check.stderr)
    );
    assert!(stdout.contains("interface: nyann:policy@0.5"), "{stdout}");
    assert!(stdout.contains("check passed"), "{stdout}");

    // In a sweep: client TTFT p99 ~50 ms at c=8, ~400 ms at c=16. The
    // scaffold's policy judges client figures only and says so: it runs
    // with no --scrape and no Prometheus.
    let _serial = serial().await;
    let sim = simulator(false).await;
    let args = vec!["--policy".to_string(), wasm.display().to_string()];
    let run = generate(&sim, &sweep(&LEVELS, r#"ttft_p99="200ms""#), &args).await;
    assert_eq!(run.stopped_at(), Some(2), "{}", run.stderr());
    assert_eq!(run.congestion(2)["policy"]["name"], "my-policy");
    // What judged is named by the digest of its bytes, whatever its name.
    let sha256sum = std::process::Command::new("sha256sum")
        .arg(&wasm)
        .output()
        .unwrap();
    let hex = text(&sha256sum.stdout);
    let hex = hex.split_whitespace().next().unwrap();
    for stage in 0..3 {
        assert_eq!(
            run.congestion(stage)["policy"]["digest"],
            format!("sha256:{hex}").as_str()
        );
        assert_eq!(
            run.congestion(stage)["policy"]["interface"],
            "nyann:policy@0.5"
        );
    }
    assert_eq!(run.congestion(2)["roles"], serde_json::json!([]));
    assert!(
        run.stderr()
            .contains("server signals: none (the policy judges client figures only)"),
        "{}",
        run.stderr()
    );
}

async fn nyann(args: &[&str], dir: &Path) -> (Option<i32>, String, String) {
    let out = nyann_bench()
        .args(args)
        .arg("--run")
        .arg(dir)
        .output()
        .await
        .unwrap();
    (out.status.code(), text(&out.stdout), text(&out.stderr))
}

/// A replay is a pure function of the record, so every threshold below is
/// read from the run itself: no assertion depends on the run's timing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_reproduces_a_recorded_sweep_and_moves_the_stop_with_the_threshold() {
    let _serial = serial().await;
    let sim = simulator(false).await;
    // Monitor mode: every stage is run and judged, so a replay can stop
    // anywhere.
    let mut args = scrape_flags(&sim);
    args.extend(["--policy-mode".into(), "monitor".into()]);
    let run = generate(&sim, &sweep(&LEVELS, STOPS_AT_16), &args).await;
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(run.stopped_at(), None);

    // Same policy, recorded parameters: the recorded verdicts, reasons and all.
    let (code, stdout, stderr) = nyann(&["policy", "replay", "builtin", "--json"], run.dir()).await;
    assert_eq!(code, Some(0), "{stderr}");
    let replayed: Value = serde_json::from_str(&stdout).unwrap();
    let stages = replayed.as_array().unwrap();
    assert_eq!(stages.len(), 4);
    for (i, stage) in stages.iter().enumerate() {
        assert_eq!(stage["stage"], i as u64);
        assert_eq!(stage["recorded"], stage["replayed"], "stage {i}: {stage}");
        assert_eq!(
            stage["replayed"]["verdict"],
            run.congestion(i)["verdict"],
            "stage {i}"
        );
    }

    // Another policy with two thresholds between recorded client TTFT p99s
    // (~50 ms at c=8, ~400 ms at c=16, more at c=32): two different stops.
    let ttft = |i: usize| run.stage(i)["client"]["ttft_p99_seconds"].as_f64().unwrap();
    let (t8, t16, t32) = (ttft(1), ttft(2), ttft(3));
    assert!(
        t8 < t16 && t16 < t32,
        "client TTFT p99 grows: {t8} {t16} {t32}"
    );
    let slo = policy_wasm("client-slo-policy");
    let slo = slo.to_str().unwrap();
    // Without its parameters, the other policy is refused with what to give.
    let (code, _, stderr) = nyann(&["policy", "replay", slo], run.dir()).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr
            .contains("whose parameters do not apply; give or fix them with --param NAME=VALUE: "),
        "{stderr}"
    );
    for (threshold, stop) in [
        ((t8 + t16) / 2.0, "#2 c=16"),
        ((t16 + t32) / 2.0, "#3 c=32"),
    ] {
        let param = format!("ttft_p99={threshold}");
        let (code, table, stderr) =
            nyann(&["policy", "replay", slo, "--param", &param], run.dir()).await;
        assert_eq!(code, Some(0), "{stderr}");
        assert!(
            table.contains(&format!(
                "the run did not stop on congestion; the replay would have stopped after {stop}"
            )),
            "{param}: {table}"
        );
        assert!(table.contains("parameters: recorded not used (they are another policy's)"));
    }

    // The same as an assertion: against the recorded verdicts, then
    // against an expectation file that disagrees on stage 2.
    let check = |dir: &Path| {
        let dir = dir.to_path_buf();
        async move {
            let out = nyann_bench()
                .args(["policy", "check", "builtin", "--fixture"])
                .arg(&dir)
                .output()
                .await
                .unwrap();
            (out.status.code(), text(&out.stdout))
        }
    };
    let (code, stdout) = check(run.dir()).await;
    assert_eq!(code, Some(0), "{stdout}");
    assert!(stdout.contains("fixture passed"), "{stdout}");
    let flipped = !run.congested(2);
    std::fs::write(
        run.dir().join("expected.json"),
        format!(r#"[{{"stage": 2, "congested": {flipped}}}]"#),
    )
    .unwrap();
    let (code, stdout) = check(run.dir()).await;
    assert_eq!(code, Some(1), "{stdout}");
    assert!(
        stdout.contains("FAIL #2 c=16") && stdout.contains("fixture failed: 1 stage(s) differ"),
        "{stdout}"
    );
}

/// `nyann-bench scenario` (the built-in policy by default, as `generate`)
/// on a scenario sweeping `levels` with `params`: the exit code, stdout and
/// stderr. (Without `--policy` it once checked nothing.)
async fn scenario_check(dir: &Path, levels: &[u32], params: &str) -> (Option<i32>, String, String) {
    let file = dir.join("s.star");
    std::fs::write(&file, sweep(levels, params)).unwrap();
    let out = nyann_bench()
        .arg("scenario")
        .arg(&file)
        .output()
        .await
        .unwrap();
    (out.status.code(), text(&out.stdout), text(&out.stderr))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_parameters_are_checked_against_a_policy_without_a_run() {
    let dir = tempfile::tempdir().unwrap();
    let (code, _, stderr) =
        scenario_check(dir.path(), &[4, 8], r#"waiting_requests_p50=8, ttft="1s""#).await;
    assert_eq!(code, Some(1), "{stderr}");
    let file = dir.path().join("s.star");
    assert!(
        stderr.contains(&format!(
            "{}:5:33: until_congested(...): unknown parameter `ttft`",
            file.display()
        )),
        "{stderr}"
    );
    // The policy's own validate() messages point at their keyword too.
    let (code, _, stderr) =
        scenario_check(dir.path(), &[4], r#"ttft_p99="1s", waiting_requests_p50=0"#).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains(":5:24: until_congested(...): waiting_requests_p50 must be > 0"),
        "{stderr}"
    );

    let (code, stdout, stderr) = scenario_check(dir.path(), &[4, 8], STOPS_AT_16).await;
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr
            .contains("policy builtin: the parameters of 1 until_congested(...) call(s) are valid"),
        "{stderr}"
    );
    let ir: Value = serde_json::from_str(&stdout).unwrap();
    assert!(ir["steps"].is_array());
}

/// What a policy says reaches the terminal escaped: its description
/// (`policy describe` / `check`, which also bound the 70,000-byte default
/// a format width overflowed on), its reasons in the stage table and the
/// final line, its log lines. Nothing clears the screen, sets the window
/// title or forges a line of the host's own output.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_policy_says_reaches_the_terminal_escaped() {
    let hostile = policy_wasm("hostile-policy");
    let forged = |text: &str| {
        text.lines().any(|l| {
            l.trim_start()
                .starts_with("sweep stopped after stage #0: forged")
        })
    };
    let raw = |text: &str| text.chars().any(|c| c.is_control() && c != '\n');
    for command in ["describe", "check"] {
        let out = nyann_bench()
            .args(["policy", command])
            .arg(&hostile)
            .output()
            .await
            .unwrap();
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert_eq!(out.status.code(), Some(0), "{command}: {stderr}");
        assert!(!raw(&stdout) && !raw(&stderr), "{command}: {stdout:?}");
        assert!(!forged(&stdout), "{command}: {stdout}");
        assert!(
            stdout.contains("\\u{1b}[2J") && stdout.contains("(70000 bytes)"),
            "{command}: {stdout}"
        );
        assert!(stdout.len() < 20_000, "{command}: {} bytes", stdout.len());
    }

    let _serial = serial().await;
    let sim = simulator(false).await;
    let mut args = scrape_flags(&sim);
    args.extend(["--policy".into(), hostile.display().to_string()]);
    let run = generate(&sim, &sweep(&[2, 2], r#"mode="escape""#), &args).await;
    let stderr = run.stderr();
    assert_eq!(run.code(), Some(0), "{stderr}");
    assert_eq!(run.stopped_at(), Some(0), "{stderr}");
    assert!(!raw(&stderr), "{stderr:?}");
    assert!(!forged(&stderr), "{stderr}");
    assert!(
        stderr.contains("sweep stopped after stage #0 c=2: congested: \\u{1b}[2J\\rreal reason\\nsweep stopped after stage #0: forged"),
        "{stderr}"
    );
    // The log line, one line.
    assert!(
        stderr.contains("log line\\nstage #9: a forged log line\\u{1b}[2J"),
        "{stderr}"
    );
}

/// `policy wit` prints the contract new policies are built against: the
/// newest line by default (it printed 0.2 as "current" while the host, the
/// SDK and `policy new` were at 0.4), and any supported line on request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_wit_prints_the_newest_line_by_default() {
    let wit = |args: &[&str]| {
        let mut command = nyann_bench();
        command.args(["policy", "wit"]).args(args);
        async move { command.output().await.unwrap() }
    };
    let out = wit(&[]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        nyann_policy_host::Interface::NEWEST.wit()
    );
    for line in nyann_policy_host::Interface::ALL {
        let out = wit(&["--version", line.line()]).await;
        assert_eq!(out.status.code(), Some(0));
        assert_eq!(text(&out.stdout), line.wit(), "{}", line.line());
    }
}
