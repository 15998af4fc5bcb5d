//! `nyann-bench policy ...`: tools for policy authors. Print a policy's
//! description or the WIT contract, scaffold a new policy crate
//! (`scaffold`), check a built component end to end (load, describe,
//! validate, judge canned stages, or the stages of a recorded run), and
//! replay a recorded run with any policy and parameters.

mod push;
mod scaffold;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use nyann_model::observation::{ClientStats, ParamKind, PolicyInfo, RoleSignals, StageObservation};
use nyann_model::scenario::{Param, StopCondition, Value};
use nyann_policy_host::{BUILTIN, CallOutput, CodeSource, Interface, Policy, printable};
use serde::Deserialize;

use crate::cli::check::SandboxArgs;
use crate::cli::registry::RegistryTlsArgs;
use nyann_check::replay::{Outcome, ParamsRefused, RecordedRun, ReplayedStage, show_params};

#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Print a policy's name, version, summary and parameters.
    Describe {
        /// A policy component (.wasm), `oci://REGISTRY/REPO:TAG` (or
        /// `@sha256:DIGEST`), or `builtin`.
        #[arg(default_value = BUILTIN)]
        policy: String,
        /// Print the description as JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        sandbox: SandboxArgs,
        #[command(flatten)]
        tls: RegistryTlsArgs,
    },
    /// Print the WIT contract (nyann:policy) policies are built against.
    Wit {
        /// The interface line: the newest (the one the SDK and `policy new`
        /// build), or an older one (frozen; still loaded).
        #[arg(long, value_name = "LINE", default_value = Interface::NEWEST.line(),
              value_parser = clap::builder::PossibleValuesParser::new(Interface::ALL.map(Interface::line)))]
        version: String,
    },
    /// Create a new policy in ./NAME: self-contained (the SDK and the WIT
    /// are copied into it), it builds anywhere: a Rust crate (cargo and the
    /// wasm32-wasip2 target), or with --lang python|js a directory whose
    /// build.sh installs the pinned componentize-py or JavaScript tools.
    New {
        /// Crate and policy name (lowercase letters, digits, `-`).
        name: String,
        /// The policy's language.
        #[arg(long, value_enum, default_value_t = scaffold::Lang::Rust)]
        lang: scaffold::Lang,
    },
    /// Load a policy, run describe and validate, and judge canned stages,
    /// or with --fixture the stages of a recorded run (exit 1 when a
    /// verdict differs from the expected one).
    Check {
        /// A policy component (.wasm), `oci://REGISTRY/REPO:TAG` (or
        /// `@sha256:DIGEST`), or `builtin`.
        policy: String,
        /// Parameters for validate/judge, as NAME=VALUE (repeatable).
        /// Without --fixture, others get their default, or a sample value
        /// of their kind; with it, they replace or add to the recorded ones.
        #[arg(long = "param", value_name = "NAME=VALUE")]
        params: Vec<String>,
        /// A results directory (`generate --output-dir`): judge its stages
        /// and compare with DIR/expected.json (`[{"stage": 3, "congested":
        /// true}, ...]`), else with the verdicts recorded in the run.
        #[arg(long, value_name = "DIR")]
        fixture: Option<PathBuf>,
        #[command(flatten)]
        sandbox: SandboxArgs,
        #[command(flatten)]
        tls: RegistryTlsArgs,
    },
    /// Check a policy component as a run loads it, push it to an OCI
    /// registry (the Wasm OCI artifact layout, its name, version,
    /// interface line and source as annotations), and print the reference
    /// pinned to its digest.
    Push {
        /// The component (.wasm).
        file: PathBuf,
        /// Where to push it: `oci://REGISTRY/REPO:TAG`.
        reference: String,
        /// Where its source lives (a URL), recorded as
        /// `org.opencontainers.image.source`.
        #[arg(long, value_name = "URL")]
        source: Option<String>,
        #[command(flatten)]
        sandbox: SandboxArgs,
        #[command(flatten)]
        tls: RegistryTlsArgs,
    },
    /// Judge the stages of a recorded run again with POLICY, offline, and
    /// print each verdict next to the one recorded during the run, and where
    /// the sweep would have stopped.
    Replay {
        /// A policy component (.wasm), `oci://REGISTRY/REPO:TAG` (or
        /// `@sha256:DIGEST`), or `builtin`.
        policy: String,
        /// A results directory written by `generate --output-dir`.
        #[arg(long, value_name = "DIR")]
        run: PathBuf,
        /// Replace or add an until_congested parameter, as NAME=VALUE
        /// (repeatable), e.g. --param ttft_p99=1.5s.
        #[arg(long = "param", value_name = "NAME=VALUE")]
        params: Vec<String>,
        /// Print the stages as JSON instead of a table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        sandbox: SandboxArgs,
        #[command(flatten)]
        tls: RegistryTlsArgs,
    },
}

pub async fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Describe {
            policy,
            json,
            sandbox,
            tls,
        } => describe(&sandbox.load(&policy, &tls.ca_cert).await?, json),
        Command::Wit { version } => {
            let line = Interface::ALL
                .into_iter()
                .find(|i| i.line() == version)
                .unwrap_or(Interface::NEWEST);
            print!("{}", line.wit());
            Ok(ExitCode::SUCCESS)
        }
        Command::New { name, lang } => scaffold::new(&name, lang),
        Command::Check {
            policy,
            params,
            fixture,
            sandbox,
            tls,
        } => {
            let started = std::time::Instant::now();
            let policy = sandbox.load(&policy, &tls.ca_cert).await?;
            let load_time = started.elapsed();
            let params = parse_params(&params)?;
            match fixture {
                Some(dir) => check_fixture(&policy, &params, &dir).await,
                None => check(&policy, params, load_time).await,
            }
        }
        Command::Push {
            file,
            reference,
            source,
            sandbox,
            tls,
        } => push::push(&file, &reference, source.as_deref(), &sandbox, &tls).await,
        Command::Replay {
            policy,
            run,
            params,
            json,
            sandbox,
            tls,
        } => {
            let policy = sandbox.load(&policy, &tls.ca_cert).await?;
            replay(&policy, &run, &parse_params(&params)?, json).await
        }
    }
}

fn describe(policy: &Policy, json: bool) -> anyhow::Result<ExitCode> {
    if json {
        let text =
            serde_json::to_string_pretty(policy.info()).context("cannot encode the description")?;
        println!("{text}");
    } else {
        print!("{}", render_info(policy));
    }
    Ok(ExitCode::SUCCESS)
}

/// The description as a small report with a parameter table.
fn render_info(policy: &Policy) -> String {
    let info: &PolicyInfo = policy.info();
    let mut out = String::new();
    let _ = writeln!(out, "{} {} ({})", info.name, info.version, policy.origin());
    let _ = writeln!(out, "  {}", info.summary);
    let _ = writeln!(
        out,
        "  interface: {} (this host runs {})",
        policy.interface(),
        nyann_policy_host::supported_versions()
    );
    if info.params.is_empty() {
        let _ = writeln!(out, "\nno parameters");
        return out;
    }
    let rows: Vec<[String; 4]> = info
        .params
        .iter()
        .map(|p| {
            let default = match (&p.default, p.required) {
                (_, true) => "required".to_string(),
                (Some(v), false) => show_value(v, p.kind),
                (None, false) => "-".to_string(),
            };
            [
                p.name.clone(),
                kind_name(p.kind).to_string(),
                default,
                p.doc.clone(),
            ]
        })
        .collect();
    let header = ["PARAMETER", "KIND", "DEFAULT", "DESCRIPTION"];
    let widths: Vec<usize> = (0..3)
        .map(|i| {
            rows.iter()
                .map(|r| r[i].len())
                .chain([header[i].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let _ = writeln!(out);
    for row in std::iter::once(header.map(String::from)).chain(rows) {
        let _ = writeln!(
            out,
            "  {:w0$}  {:w1$}  {:w2$}  {}",
            row[0],
            row[1],
            row[2],
            row[3],
            w0 = widths[0],
            w1 = widths[1],
            w2 = widths[2]
        );
    }
    out
}

fn kind_name(kind: ParamKind) -> &'static str {
    match kind {
        ParamKind::Number => "number",
        ParamKind::Integer => "integer",
        ParamKind::Fraction => "fraction",
        ParamKind::Duration => "duration",
        ParamKind::Text => "text",
        ParamKind::Flag => "flag",
    }
}

/// Longest text default shown whole by `policy describe`.
const MAX_SHOWN_TEXT: usize = 80;

fn show_value(v: &Value, kind: ParamKind) -> String {
    match (v, kind) {
        (Value::Number(n), ParamKind::Duration) => format!("{n}s"),
        (Value::Number(n), _) => format!("{n}"),
        (Value::Integer(i), _) => format!("{i}"),
        // Escaped (Debug) and bounded: a policy's default is its own text.
        (Value::Text(t), _) if t.len() > MAX_SHOWN_TEXT => {
            let mut end = MAX_SHOWN_TEXT;
            while !t.is_char_boundary(end) {
                end -= 1;
            }
            format!("{:?}... ({} bytes)", &t[..end], t.len())
        }
        (Value::Text(t), _) => format!("{t:?}"),
        (Value::Flag(b), _) => if *b { "True" } else { "False" }.to_string(),
    }
}

/// A sample value of a kind, for `check` when a required parameter is not given.
fn sample(kind: ParamKind) -> Value {
    match kind {
        ParamKind::Number | ParamKind::Integer => Value::Number(1.0),
        ParamKind::Fraction => Value::Number(0.5),
        ParamKind::Duration => Value::Text("1s".into()),
        ParamKind::Text => Value::Text("sample".into()),
        ParamKind::Flag => Value::Flag(false),
    }
}

/// `NAME=VALUE` as the scenario would write it: a number, True/False, or text.
fn parse_param(arg: &str) -> anyhow::Result<Param> {
    let Some((name, value)) = arg.split_once('=') else {
        bail!("--param {arg:?}: write NAME=VALUE, e.g. --param ttft_p99=2s");
    };
    let value = match value {
        "True" | "true" => Value::Flag(true),
        "False" | "false" => Value::Flag(false),
        v => v
            .parse::<f64>()
            .map(Value::Number)
            .unwrap_or_else(|_| Value::Text(v.to_string())),
    };
    Ok(Param {
        name: name.trim().to_string(),
        value,
    })
}

/// Two canned stages: a calm one and a loaded disaggregated one (queueing
/// on prefill, KV pressure and preemptions on decode).
fn canned_stages() -> [StageObservation; 2] {
    let role = |role: &str, waiting, ttft, kv, preemptions| RoleSignals {
        role: role.to_string(),
        waiting_requests_p50: waiting,
        ttft_p99_seconds: ttft,
        kv_cache_usage_max: kv,
        preemptions,
        extra: vec![],
    };
    let client = |tps, ttft, ok, failed| ClientStats {
        requests_ok: ok,
        requests_failed: failed,
        requests_per_second: ok as f64 / 60.0,
        output_tokens_per_second: tps,
        ttft_p50_seconds: ttft / 3.0,
        ttft_p99_seconds: ttft,
        itl_p50_seconds: 0.02,
        itl_p99_seconds: 0.05,
        e2e_p50_seconds: 4.0,
        e2e_p99_seconds: 9.0,
        ..ClientStats::default()
    };
    [
        StageObservation {
            index: 0,
            name: "#0 c=64".into(),
            sweep: Default::default(),
            concurrency: Some(64),
            rate: None,
            start_unix_seconds: 1_700_000_000.0,
            end_unix_seconds: 1_700_000_060.0,
            roles: vec![
                role("prefill", 0.0, 0.2, 0.3, 0.0),
                role("decode", 0.0, 0.3, 0.4, 0.0),
            ],
            client: client(4000.0, 0.4, 600, 0),
            signal_errors: vec![],
            refines: None,
        },
        StageObservation {
            index: 1,
            name: "#1 c=128".into(),
            sweep: Default::default(),
            concurrency: Some(128),
            rate: None,
            start_unix_seconds: 1_700_000_060.0,
            end_unix_seconds: 1_700_000_120.0,
            roles: vec![
                role("prefill", 40.0, 0.8, 0.6, 0.0),
                role("decode", 3.0, 2.5, 0.98, 3.0),
            ],
            client: client(4100.0, 3.1, 640, 12),
            signal_errors: vec![],
            refines: None,
        },
    ]
}

/// Every `--param NAME=VALUE`.
fn parse_params(args: &[String]) -> anyhow::Result<Vec<Param>> {
    args.iter().map(|a| parse_param(a)).collect()
}

/// How `check` got the policy's machine code: its first load on a machine
/// compiles it (20 s for a Python or JavaScript runtime) and `check` is
/// where an author pays for it, once.
fn code_source_note(policy: &Policy, load_time: std::time::Duration) -> String {
    let took = format!("{:.1} s", load_time.as_secs_f64());
    match policy.code_source() {
        CodeSource::Precompiled => format!("shipped precompiled in this binary, {took}"),
        CodeSource::Cached => format!("machine code from the code cache, {took}"),
        CodeSource::Compiled => {
            format!("compiled in {took}; the code cache, when on, keeps it for later loads")
        }
    }
}

/// What a call wrote (stdout, stderr, log lines), indented under it, each
/// line escaped: `print` debugging and a Python traceback show here.
fn render_output(output: &CallOutput) -> String {
    let mut out = String::new();
    let log = output.log.join("\n");
    for (name, text) in [
        ("stdout", output.stdout.as_str()),
        ("stderr", output.stderr.as_str()),
        ("log", log.as_str()),
    ] {
        let text = text.trim_end();
        if text.is_empty() {
            continue;
        }
        let _ = writeln!(out, "  {name}:");
        for line in text.lines() {
            let _ = writeln!(out, "    | {}", printable(line));
        }
    }
    out
}

async fn check(
    policy: &Policy,
    mut given: Vec<Param>,
    load_time: std::time::Duration,
) -> anyhow::Result<ExitCode> {
    println!(
        "load and describe: ok ({})",
        code_source_note(policy, load_time)
    );
    print!("{}", render_output(policy.load_output()));
    println!();
    print!("{}", render_info(policy));

    for spec in &policy.info().params {
        if spec.required && !given.iter().any(|p| p.name == spec.name) {
            given.push(Param {
                name: spec.name.clone(),
                value: sample(spec.kind),
            });
        }
    }
    let shown: Vec<String> = given
        .iter()
        .map(|p| format!("{}={}", p.name, show_value(&p.value, ParamKind::Number)))
        .collect();
    println!("\nvalidate({}):", shown.join(", "));
    let (checked, output) = policy.check_params_with_output(&StopCondition {
        params: given,
        location: None,
        param_locations: Vec::new(),
        search: None,
    });
    let params = match checked {
        Ok(params) => {
            println!("  ok");
            print!("{}", render_output(&output));
            params
        }
        Err(e) => {
            println!("  FAILED: {e}");
            print!("{}", render_output(&output));
            return Ok(ExitCode::FAILURE);
        }
    };

    let stages = canned_stages();
    let mut failed = false;
    for (i, stage) in stages.iter().enumerate() {
        println!("\njudge(stage {:?}, history of {}):", stage.name, i);
        let (judged, output) = policy.judge_with_output(&params, stage, &stages[..i]).await;
        match judged {
            Ok(v) => {
                println!(
                    "  {}",
                    if v.congested {
                        "congested"
                    } else {
                        "not congested"
                    }
                );
                for r in &v.reasons {
                    println!("    - {r}");
                }
            }
            Err(e) => {
                println!("  FAILED: {e}");
                failed = true;
            }
        }
        print!("{}", render_output(&output));
    }
    println!(
        "\n{}",
        if failed {
            "check failed"
        } else {
            "check passed"
        }
    );
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// One line of `expected.json`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Expected {
    stage: u32,
    congested: bool,
}

/// `policy check --fixture DIR`: replay DIR and compare each verdict with
/// DIR/expected.json, else with the verdict recorded in the run.
async fn check_fixture(policy: &Policy, params: &[Param], dir: &Path) -> anyhow::Result<ExitCode> {
    let run = RecordedRun::read(dir).map_err(crate::cli::report::not_a_run_hint)?;
    let expected_file = dir.join("expected.json");
    let expected: Option<Vec<Expected>> = if expected_file.is_file() {
        let text = std::fs::read_to_string(&expected_file)
            .with_context(|| format!("cannot read {}", expected_file.display()))?;
        Some(serde_json::from_str(&text).with_context(|| {
            format!(
                "{} must be a list like [{{\"stage\": 3, \"congested\": true}}]",
                expected_file.display()
            )
        })?)
    } else {
        None
    };
    let replayed = replay_off_runtime(&run, policy, params).await?;
    let against = if expected.is_some() {
        expected_file.display().to_string()
    } else {
        "the verdicts recorded in the run".to_string()
    };
    println!(
        "policy {} {} on {} ({} judged stages), against {against}:",
        policy.name(),
        policy.info().version,
        dir.display(),
        replayed.len()
    );
    let mut mismatches = 0;
    for stage in &replayed {
        let want = match &expected {
            Some(list) => list
                .iter()
                .find(|e| e.stage == stage.stage)
                .map(|e| e.congested),
            None => match &stage.recorded {
                Outcome::Verdict(v) => Some(v.congested),
                Outcome::Error(_) => None,
            },
        };
        let got = &stage.replayed;
        let ok = match (want, got) {
            (Some(want), Outcome::Verdict(v)) => want == v.congested,
            (None, _) => true,
            (Some(_), Outcome::Error(_)) => false,
        };
        let want_word = match want {
            Some(true) => "congested",
            Some(false) => "ok",
            None => "(no expectation)",
        };
        println!(
            "  {} {:<16} expected {want_word:<16} got {}{}",
            if ok { "ok  " } else { "FAIL" },
            stage.name,
            got.word(),
            detail(got)
        );
        if !ok {
            mismatches += 1;
        }
    }
    if let Some(list) = &expected
        && let Some(missing) = list
            .iter()
            .find(|e| !replayed.iter().any(|s| s.stage == e.stage))
    {
        println!(
            "  FAIL stage {} is expected but the run has no judged stage with that index",
            missing.stage
        );
        mismatches += 1;
    }
    if mismatches == 0 {
        println!("fixture passed");
        Ok(ExitCode::SUCCESS)
    } else {
        println!("fixture failed: {mismatches} stage(s) differ");
        Ok(ExitCode::FAILURE)
    }
}

/// `: reason; reason` or `: error message`.
fn detail(outcome: &Outcome) -> String {
    match outcome {
        Outcome::Verdict(v) if v.reasons.is_empty() => String::new(),
        Outcome::Verdict(v) => format!(": {}", v.reasons.join("; ")),
        Outcome::Error(e) => format!(": {e}"),
    }
}

/// Replay on a blocking thread (the policy calls block until they finish).
async fn replay_off_runtime(
    run: &RecordedRun,
    policy: &Policy,
    params: &[Param],
) -> anyhow::Result<Vec<ReplayedStage>> {
    let (run, policy, params) = (run.clone(), policy.clone(), params.to_vec());
    let replayed =
        tokio::task::spawn_blocking(move || nyann_check::replay::replay(&run, &policy, &params))
            .await
            .context("the replay task failed")?;
    replayed.map_err(|err| match err.downcast_ref::<ParamsRefused>() {
        Some(refused) => {
            let cause: Vec<String> = err.chain().skip(1).map(ToString::to_string).collect();
            anyhow::anyhow!(
                "{refused}; give or fix them with --param NAME=VALUE: {}",
                cause.join(": ")
            )
        }
        None => err,
    })
}

/// `policy replay`: the table (or JSON) and where each run stops.
async fn replay(
    policy: &Policy,
    dir: &Path,
    params: &[Param],
    json: bool,
) -> anyhow::Result<ExitCode> {
    let run = RecordedRun::read(dir).map_err(crate::cli::report::not_a_run_hint)?;
    let replayed = replay_off_runtime(&run, policy, params).await?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&replayed).context("encoding the replay")?
        );
        return Ok(ExitCode::SUCCESS);
    }
    let first = &run.stages[0];
    let (recorded_name, recorded_version) = &first.policy;
    println!(
        "replaying {} ({} judged stages, recorded with policy {recorded_name} \
         {recorded_version}) with policy {} {}",
        dir.display(),
        run.stages.len(),
        policy.name(),
        policy.info().version
    );
    let recorded = if recorded_name != policy.name() {
        "not used (they are another policy's)".to_string()
    } else if first.params.is_empty() {
        "none".to_string()
    } else {
        show_params(&first.params)
    };
    let given = if params.is_empty() {
        String::new()
    } else {
        format!("; given: {}", show_params(params))
    };
    println!("parameters: recorded {recorded}{given}");
    let width = replayed
        .iter()
        .map(|s| s.name.len())
        .max()
        .unwrap_or(5)
        .max(5);
    println!(
        "\n{:<width$}  {:<9}  {:<9}  REASONS (replayed)",
        "STAGE", "RECORDED", "REPLAYED"
    );
    for stage in &replayed {
        let differs = stage.recorded.word() != stage.replayed.word();
        println!(
            "{:<width$}  {:<9}  {:<9}  {}{}",
            stage.name,
            stage.recorded.word(),
            stage.replayed.word(),
            detail(&stage.replayed).trim_start_matches(": "),
            if differs { "  <- differs" } else { "" }
        );
    }
    println!("\n{}", stop_summary(&run, &replayed));
    Ok(ExitCode::SUCCESS)
}

/// Where the run stopped and where the replay would have.
fn stop_summary(run: &RecordedRun, replayed: &[ReplayedStage]) -> String {
    let recorded = run.stopped_after().map(|s| s.observation.name.clone());
    let would = replayed
        .iter()
        .find(|s| s.replayed.congested())
        .map(|s| s.name.clone());
    let last = replayed.last().map(|s| s.name.as_str()).unwrap_or("?");
    match (recorded, would) {
        (Some(r), Some(w)) if r == w => {
            format!("the run stopped after {r}; the replay stops there too")
        }
        (Some(r), Some(w)) => {
            format!("the run stopped after {r}; the replay would have stopped after {w}")
        }
        (Some(r), None) => format!(
            "the run stopped after {r}; the replay would not have stopped there (the stages after it were not run, so whether it stops later is unknown)"
        ),
        (None, Some(w)) => {
            format!("the run did not stop on congestion; the replay would have stopped after {w}")
        }
        (None, None) => format!("neither the run nor the replay stopped (up to {last})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_parse_like_the_scenario_writes_them() {
        assert_eq!(
            parse_param("ttft_p99=2s").unwrap().value,
            Value::Text("2s".into())
        );
        assert_eq!(
            parse_param("waiting_requests_p50=32").unwrap().value,
            Value::Number(32.0)
        );
        assert_eq!(parse_param("strict=True").unwrap().value, Value::Flag(true));
        assert!(parse_param("oops").is_err());
    }
}
