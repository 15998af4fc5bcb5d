//! `nyann-bench scenario FILE`: compile a scenario (`.star`, or an IR `.json`
//! to check it) and print its IR as pretty JSON on stdout; check every
//! `until_congested(...)` call's parameters against the policy `generate`
//! would use (`--policy`, the built-in by default), without running
//! anything. Errors go to stderr, one
//! `file:line:col: message` per line, and the exit code is 1.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use nyann_model::Step;

use super::check::SandboxArgs;
use super::registry::RegistryTlsArgs;
use nyann_check::check_stop_conditions;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The scenario: a Starlark file (.star) or a scenario IR file (.json).
    pub file: PathBuf,

    /// Check the parameters of every `until_congested(...)` call against
    /// this policy (`builtin`, a component file or `oci://...`), as `generate` would
    /// before sending any request.
    #[arg(long, value_name = "FILE|builtin", default_value = nyann_policy_host::BUILTIN)]
    pub policy: String,

    /// The most loop iterations and function calls a Starlark file's
    /// evaluation may take (the run service plans with 100,000).
    #[arg(long, value_name = "N", default_value_t = nyann_scenario::MAX_STEPS_EVALUATED, value_parser = clap::value_parser!(u64).range(1000..))]
    pub max_steps: u64,

    #[command(flatten)]
    pub sandbox: SandboxArgs,

    #[command(flatten)]
    pub tls: RegistryTlsArgs,
}

pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let limits = nyann_scenario::Limits {
        max_steps: args.max_steps,
    };
    let scenario = match nyann_scenario::load_file_within(&args.file, limits) {
        Ok((scenario, _)) => scenario,
        Err(e) => {
            eprintln!("{e}");
            return Ok(ExitCode::FAILURE);
        }
    };
    let has_stops = scenario
        .steps
        .iter()
        .any(|step| matches!(step, Step::Stage(stage) if stage.stop.is_some()));
    if has_stops {
        let policy = args.sandbox.load(&args.policy, &args.tls.ca_cert).await?;
        let calls = scenario
            .steps
            .iter()
            .filter_map(|step| match step {
                Step::Stage(stage) => stage.stop.as_ref(),
                Step::Barrier { .. } => None,
            })
            .fold(Vec::new(), |mut distinct, stop| {
                if !distinct.contains(&stop) {
                    distinct.push(stop);
                }
                distinct
            })
            .len();
        if let Err(errors) = check_stop_conditions(&scenario, &policy) {
            for error in errors {
                eprintln!("{error}");
            }
            return Ok(ExitCode::FAILURE);
        }
        eprintln!(
            "policy {}: the parameters of {calls} until_congested(...) call(s) are valid",
            policy.name()
        );
    }
    let json =
        serde_json::to_string_pretty(&scenario).context("cannot encode the scenario IR as JSON")?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{json}").context("cannot write to stdout")?;
    Ok(ExitCode::SUCCESS)
}
