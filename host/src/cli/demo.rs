//! `nyann-bench demo`: the whole feature in one command, on this machine
//! alone. Starts the built-in simulator in-process on ephemeral loopback
//! ports, runs `examples/scenarios/demo.star` (embedded in the binary)
//! against it with the `--scrape` signal source and the built-in policy, and
//! shows where and why the sweep stopped.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use nyann_load::RunOptions;
use nyann_run::{Output, PolicySpec, RunSpec};
use nyann_signals::SignalOptions;
use nyann_sim::SimConfig;

use super::Ui;
use super::progress;
use super::run::{self, Summary};

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

    /// Replace the run --output-dir already holds.
    #[arg(long)]
    pub overwrite: bool,
}

pub async fn run(args: Args, ui: Ui) -> anyhow::Result<ExitCode> {
    let scenario = nyann_scenario::compile_str(SCENARIO_PATH, SCENARIO)
        .context("the embedded demo scenario does not compile")?;
    let sim = nyann_sim::start(SimConfig {
        seed: args.seed,
        ..SimConfig::default()
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

    // Every setting at its default but the demo's own.
    let spec = RunSpec {
        source: Some(SCENARIO.to_string()),
        load: RunOptions {
            target: Some(sim.base_url()),
            seed: args.seed,
            ..RunOptions::default()
        },
        signals: SignalOptions {
            scrape: vec![nyann_signals::ScrapeTarget {
                role: "aggregate".into(),
                url: format!("http://{metrics}/metrics"),
            }],
            // Sixteen samples of a 4-second stage rather than four: the KV
            // usage swings at each preemption, and its max should not
            // depend on where four samples happen to fall.
            scrape_interval: Duration::from_millis(250),
            ..SignalOptions::default()
        },
        policy: PolicySpec {
            host: super::check::default_host_config()?,
            ..PolicySpec::default()
        },
        output: args.output_dir.clone().map(|dir| Output {
            dir,
            overwrite: args.overwrite,
        }),
        ..RunSpec::new(scenario)
    };
    let code = run::alone(spec, Summary::Quiet, progress::DEFAULT_INTERVAL, ui).await;
    sim.shutdown().await;
    if code.is_ok() && !ui.quiet {
        eprintln!("{}", next_steps(args.output_dir.as_deref()));
    }
    code
}

/// A sweep to run against a real server, written out whole: it must work
/// from any directory (the examples are only in a checkout).
const YOUR_SWEEP: &str = r#"scenario(
    workload = workload("faker", isl=128, osl=256),
    stages = until_congested(
        [stage("1m", concurrency=c) for c in [8, 16, 32, 64, 128, 256]],
        waiting_requests_p50=8,
        ttft_p99="2s",
    ),
)
"#;

/// What to do after the demo: a runnable scenario for one's own server
/// (written beside the demo's results when there is an output directory).
fn next_steps(dir: Option<&std::path::Path>) -> String {
    let written = dir
        .map(|d| d.join("your-sweep.star"))
        .filter(|path| std::fs::write(path, YOUR_SWEEP).is_ok());
    let (file, shown) = match &written {
        Some(path) => (path.display().to_string(), String::new()),
        None => (
            "sweep.star".to_string(),
            format!("\nSave this as sweep.star:\n\n{YOUR_SWEEP}"),
        ),
    };
    format!(
        "{shown}\nNext: the same kind of sweep against your own server (set the thresholds to \
         your latency goals):\n  nyann-bench generate --config {file} --target http://HOST:8000/v1 \\\n    \
         --scrape http://HOST:8000/metrics --output-dir results/     (or --prometheus-url URL --deploy-name NAME)"
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_sweep_it_suggests_compiles_with_a_stop_condition() {
        let scenario = nyann_scenario::compile_str("your-sweep.star", super::YOUR_SWEEP).unwrap();
        let stops = scenario
            .steps
            .iter()
            .filter(|s| matches!(s, nyann_model::Step::Stage(stage) if stage.stop.is_some()))
            .count();
        assert_eq!(stops, 6);
    }
}
