//! `nyann-bench demo`: the whole feature in one command, on this machine
//! alone. Starts the built-in simulator in-process on ephemeral loopback
//! ports, runs `examples/scenarios/demo.star` (embedded in the binary)
//! against it with the `--scrape` signal source and the built-in policy, and
//! shows where and why the sweep stopped.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use nyann_sim::SimArgs;

use super::Ui;
use super::generate::{self, Summary};

const SCENARIO_PATH: &str = "examples/scenarios/demo.star";
const SCENARIO: &str = include_str!("../../../examples/scenarios/demo.star");

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Also write requests.jsonl, stages.json, summary.json and the HTML
    /// report (report.html) here.
    #[arg(long, value_name = "DIR")]
    pub output_dir: Option<PathBuf>,

    /// Seed of the simulator and of the prompts (same seed, same run shape).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

/// `generate`'s flags, parsed from the argument list the demo builds.
#[derive(Debug, Parser)]
struct GenerateCommand {
    #[command(flatten)]
    args: generate::Args,
}

pub async fn run(args: Args, ui: Ui) -> anyhow::Result<ExitCode> {
    let scenario = nyann_scenario::compile_str(SCENARIO_PATH, SCENARIO)
        .context("the embedded demo scenario does not compile")?;
    let sim = nyann_sim::start(SimArgs {
        seed: args.seed,
        ..SimArgs::for_tests()
    })
    .await
    .context("starting the simulator")?;
    let Some((_, metrics)) = sim.metrics_endpoints().into_iter().next() else {
        anyhow::bail!("the simulator serves no /metrics endpoint");
    };
    if !ui.quiet {
        eprintln!(
            "simulated vLLM server (16 running sequences, 224 KV blocks): {}  metrics: http://{metrics}/metrics",
            sim.base_url()
        );
        eprintln!(
            "scenario {SCENARIO_PATH}: 4-second stages at concurrency 4, 8, 16, 32, 64, 128 until congested\n"
        );
    }

    let mut argv = vec![
        "generate".to_string(),
        "--target".into(),
        sim.base_url(),
        "--scrape".into(),
        format!("aggregate=http://{metrics}/metrics"),
        // Sixteen samples of a 4-second stage rather than four: the KV
        // usage swings at each preemption, and its max should not depend
        // on where four samples happen to fall.
        "--scrape-interval".into(),
        "250ms".into(),
        "--seed".into(),
        args.seed.to_string(),
    ];
    if let Some(dir) = &args.output_dir {
        argv.extend(["--output-dir".into(), dir.display().to_string()]);
    }
    let generate = GenerateCommand::try_parse_from(argv).context("the demo's generate flags")?;
    let code = generate::run_scenario(
        &scenario,
        Some(SCENARIO),
        &generate.args,
        Summary::Quiet,
        ui,
    )
    .await;
    sim.shutdown().await;
    if code.is_ok() && !ui.quiet {
        eprintln!(
            "\nNext: run the same kind of sweep against your own server with\n  \
             nyann-bench generate --config examples/scenarios/balanced.star --target http://HOST:8000/v1 \\\n    \
             --scrape http://HOST:8000/metrics     (or --prometheus-url URL --deploy-name NAME)"
        );
    }
    code
}
