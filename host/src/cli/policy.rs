//! `nyann-bench policy ...`: tools for policy authors. Print a policy's
//! description, print the WIT contract, scaffold a new policy crate, and
//! check a built component end to end (load, describe, validate, judge a
//! canned observation).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use nyann_model::observation::{ClientStats, ParamKind, PolicyInfo, RoleSignals, StageObservation};
use nyann_model::scenario::{Param, StopCondition, Value};
use nyann_policy_host::{BUILTIN, HostConfig, Policy, PolicyHost};

#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Print a policy's name, version, summary and parameters.
    Describe {
        /// A policy component (.wasm), or `builtin`.
        #[arg(default_value = BUILTIN)]
        policy: String,
        /// Print the description as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print the WIT contract (nyann:policy) policies are built against.
    Wit,
    /// Create a new policy crate (Rust, the nyann-policy SDK) in ./NAME.
    New {
        /// Crate and policy name (lowercase letters, digits, `-`).
        name: String,
        /// Path to the SDK crate (policies/sdk of a nyann-bench checkout).
        /// Default: the checkout this binary was built from, if present.
        #[arg(long, conflicts_with = "sdk_git")]
        sdk_path: Option<PathBuf>,
        /// Git URL of the nyann-bench repository, instead of a path.
        #[arg(long)]
        sdk_git: Option<String>,
    },
    /// Load a policy, run describe and validate, and judge canned stages.
    Check {
        /// A policy component (.wasm), or `builtin`.
        policy: String,
        /// Parameters for validate/judge, as NAME=VALUE (repeatable).
        /// Others get their default, or a sample value of their kind.
        #[arg(long = "param", value_name = "NAME=VALUE")]
        params: Vec<String>,
    },
}

pub async fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Describe { policy, json } => describe(&policy, json),
        Command::Wit => {
            print!("{}", nyann_policy_host::WIT);
            Ok(ExitCode::SUCCESS)
        }
        Command::New {
            name,
            sdk_path,
            sdk_git,
        } => new(&name, sdk_path, sdk_git),
        Command::Check { policy, params } => check(&policy, &params).await,
    }
}

fn load(policy: &str) -> anyhow::Result<Policy> {
    let host = PolicyHost::new(HostConfig::default())?;
    let loaded = if policy == BUILTIN {
        host.load_builtin()?
    } else {
        host.load_file(Path::new(policy))?
    };
    Ok(loaded)
}

fn describe(policy: &str, json: bool) -> anyhow::Result<ExitCode> {
    let policy = load(policy)?;
    if json {
        let text =
            serde_json::to_string_pretty(policy.info()).context("cannot encode the description")?;
        println!("{text}");
    } else {
        print!("{}", render_info(policy.info(), policy.origin()));
    }
    Ok(ExitCode::SUCCESS)
}

/// The description as a small report with a parameter table.
fn render_info(info: &PolicyInfo, origin: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{} {} ({origin})", info.name, info.version);
    let _ = writeln!(out, "  {}", info.summary);
    let _ = writeln!(
        out,
        "  interface: {}",
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
        ParamKind::Fraction => "fraction",
        ParamKind::Duration => "duration",
        ParamKind::Text => "text",
        ParamKind::Flag => "flag",
    }
}

fn show_value(v: &Value, kind: ParamKind) -> String {
    match (v, kind) {
        (Value::Number(n), ParamKind::Duration) => format!("{n}s"),
        (Value::Number(n), _) => format!("{n}"),
        (Value::Text(t), _) => format!("{t:?}"),
        (Value::Flag(b), _) => if *b { "True" } else { "False" }.to_string(),
    }
}

/// A sample value of a kind, for `check` when a required parameter is not given.
fn sample(kind: ParamKind) -> Value {
    match kind {
        ParamKind::Number => Value::Number(1.0),
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
        },
        StageObservation {
            index: 1,
            name: "#1 c=128".into(),
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
        },
    ]
}

async fn check(policy_arg: &str, param_args: &[String]) -> anyhow::Result<ExitCode> {
    let policy = load(policy_arg)?;
    println!("load and describe: ok\n");
    print!("{}", render_info(policy.info(), policy.origin()));

    let mut given: Vec<Param> = param_args
        .iter()
        .map(|a| parse_param(a))
        .collect::<anyhow::Result<_>>()?;
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
    let params = match policy.check_params(&StopCondition {
        params: given,
        location: None,
    }) {
        Ok(params) => {
            println!("  ok");
            params
        }
        Err(e) => {
            println!("  FAILED: {e}");
            return Ok(ExitCode::FAILURE);
        }
    };

    let stages = canned_stages();
    let mut failed = false;
    for (i, stage) in stages.iter().enumerate() {
        println!("\njudge(stage {:?}, history of {}):", stage.name, i);
        match policy.judge(&params, stage, &stages[..i]).await {
            Ok(v) if v.congested => {
                println!("  congested");
                for r in &v.reasons {
                    println!("    - {r}");
                }
            }
            Ok(v) => {
                println!("  not congested");
                for r in &v.reasons {
                    println!("    - {r}");
                }
            }
            Err(e) => {
                println!("  FAILED: {e}");
                failed = true;
            }
        }
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

/// The SDK checkout this binary was built from (`<repo>/policies/sdk`).
fn default_sdk_path() -> Option<PathBuf> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies/sdk");
    path.join("Cargo.toml")
        .is_file()
        .then(|| path.canonicalize().unwrap_or(path))
}

fn new(name: &str, sdk_path: Option<PathBuf>, sdk_git: Option<String>) -> anyhow::Result<ExitCode> {
    let valid = !name.is_empty()
        && name.len() <= 64
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if !valid {
        bail!(
            "policy name {name:?}: use lowercase letters, digits and `-`, starting with a letter"
        );
    }
    let dir = PathBuf::from(name);
    if dir.exists() {
        bail!(
            "{} already exists; pick another name or remove it",
            dir.display()
        );
    }
    let dependency = match (sdk_path, sdk_git) {
        (_, Some(url)) => format!("{{ git = {url:?} }}"),
        (Some(path), None) => {
            let path = path
                .canonicalize()
                .with_context(|| format!("--sdk-path {}", path.display()))?;
            format!("{{ path = {:?} }}", path.display().to_string())
        }
        (None, None) => match default_sdk_path() {
            Some(path) => format!("{{ path = {:?} }}", path.display().to_string()),
            None => bail!(
                "cannot find the nyann-policy SDK next to this binary's sources; pass --sdk-path \
                 <nyann-bench checkout>/policies/sdk or --sdk-git <nyann-bench repository URL>"
            ),
        },
    };
    let files = scaffold(name, &dependency);
    std::fs::create_dir_all(dir.join("src"))
        .with_context(|| format!("cannot create {}", dir.display()))?;
    for (path, content) in &files {
        let path = dir.join(path);
        std::fs::write(&path, content)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    let wasm = format!(
        "{name}/target/wasm32-wasip2/release/{}.wasm",
        name.replace('-', "_")
    );
    println!("created {name}/ (Cargo.toml, src/lib.rs, .gitignore)\n");
    println!("build it:   cd {name} && cargo build --release --target wasm32-wasip2");
    println!("test rules: cd {name} && cargo test");
    println!("check it:   nyann-bench policy check {wasm}");
    println!("use it:     nyann-bench generate --policy {wasm} ...");
    println!("\n(needs the target once: rustup target add wasm32-wasip2)");
    Ok(ExitCode::SUCCESS)
}

/// The files of a new policy crate: a complete, working policy.
fn scaffold(name: &str, dependency: &str) -> Vec<(&'static str, String)> {
    let cargo_toml = format!(
        r#"[package]
name = "{name}"
version = "0.1.0"
edition = "2024"
publish = false

# cdylib: the WebAssembly component; rlib: native `cargo test` of the rules.
[lib]
crate-type = ["cdylib", "rlib"]

[dependencies]
nyann-policy = {dependency}

# Small components load fast.
[profile.release]
opt-level = "s"
lto = true
strip = true
codegen-units = 1

# A standalone crate, even when created inside another workspace.
[workspace]
"#
    );
    let lib_rs = format!(
        r#"//! {name}: a nyann-bench congestion policy.
//!
//! Build: `cargo build --release --target wasm32-wasip2`
//! Use:   `nyann-bench generate --policy target/wasm32-wasip2/release/{file}.wasm ...`

use nyann_policy::{{Params, Policy, PolicyInfo, StageObservation, Verdict, spec}};

struct MyPolicy;

impl Policy for MyPolicy {{
    fn describe() -> PolicyInfo {{
        PolicyInfo::new("{name}", env!("CARGO_PKG_VERSION"), "Congested when client TTFT p99 or the error rate is too high.")
            .param(spec::duration("ttft_p99", "client TTFT p99 limit").required())
            .param(spec::fraction("max_error_rate", "largest share of failed requests").default_number(0.01))
    }}

    fn validate(params: &Params) -> Result<(), String> {{
        params.require_positive("ttft_p99")?;
        Ok(())
    }}

    fn judge(params: &Params, stage: &StageObservation, _history: &[StageObservation]) -> Result<Verdict, String> {{
        Ok(rule(params.seconds("ttft_p99")?, params.fraction("max_error_rate")?, stage))
    }}
}}

/// The rule, as plain Rust: `cargo test` runs it natively.
fn rule(ttft_limit: f64, max_error_rate: f64, stage: &StageObservation) -> Verdict {{
    let mut reasons = Vec::new();
    if stage.client.ttft_p99_seconds > ttft_limit {{
        reasons.push(format!("client TTFT p99 {{:.3}}s > {{ttft_limit}}s", stage.client.ttft_p99_seconds));
    }}
    if stage.client.error_rate() > max_error_rate {{
        reasons.push(format!("error rate {{:.1}}% > {{:.1}}%", stage.client.error_rate() * 100.0, max_error_rate * 100.0));
    }}
    Verdict::from_reasons(reasons)
}}

nyann_policy::export_policy!(MyPolicy);

#[cfg(test)]
mod tests {{
    use super::*;
    use nyann_policy::ClientStats;

    #[test]
    fn slow_stage_is_congested() {{
        let stage = StageObservation {{
            client: ClientStats {{ ttft_p99_seconds: 3.0, requests_ok: 100, ..Default::default() }},
            ..Default::default()
        }};
        assert!(rule(2.0, 0.01, &stage).congested);
        assert!(!rule(5.0, 0.01, &stage).congested);
    }}
}}
"#,
        file = name.replace('-', "_")
    );
    vec![
        ("Cargo.toml", cargo_toml),
        ("src/lib.rs", lib_rs),
        (".gitignore", "/target\n".to_string()),
    ]
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

    #[test]
    fn scaffold_names_the_crate_and_the_sdk() {
        let files = scaffold("my-policy", "{ path = \"/sdk\" }");
        assert!(files[0].1.contains("name = \"my-policy\""));
        assert!(files[0].1.contains("nyann-policy = { path = \"/sdk\" }"));
        assert!(files[1].1.contains("PolicyInfo::new(\"my-policy\""));
        assert!(files[1].1.contains("release/my_policy.wasm"));
    }
}
