//! `nyann-bench eval gsm8k|gpqa`: one closed-loop stage whose requests are
//! an eval dataset's questions, each asked once and every reply scored, as
//! the Go nyann-bench's `eval` commands run it. The stage is built from the
//! flags and run as `generate` runs a scenario (fleets included), with no
//! signal source and the default policy (it judges nothing); a sweep with
//! evals is a scenario (`workload("gsm8k", ...)` in `until_congested`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use nyann_model::{Mode, Scenario, Stage, Step, Workload, WorkloadType, parse_duration};
use nyann_run::{LeadSpec, PolicySpec, RunSpec};
use nyann_signals::SignalOptions;

use super::Ui;
use super::client::ClientArgs;
use super::fleet::{self, FleetArgs, Role};
use super::progress;
use super::run::{self, OutputArgs};

#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// GSM8K's arithmetic word problems: the number a reply ends with (or
    /// gives after `####`) against the answer's.
    Gsm8k(Gsm8kArgs),
    /// GPQA's four-choice science questions, choices shuffled with the
    /// seed: the letter a reply chooses against the correct one's.
    Gpqa(GpqaArgs),
}

#[derive(Debug, clap::Args)]
pub struct Gsm8kArgs {
    /// GSM8K's test file, JSONL of `question`/`answer` (the answer ends
    /// with `#### N`): `grade_school_math/data/test.jsonl` of
    /// github.com/openai/grade-school-math.
    #[arg(long, value_name = "FILE")]
    gsm8k_path: PathBuf,
    /// GSM8K's train file: the worked examples put before each question.
    #[arg(long, value_name = "FILE")]
    gsm8k_train_path: Option<PathBuf>,
    /// Worked examples before each question [default: 5 with
    /// --gsm8k-train-path, else 0].
    #[arg(long, value_name = "N")]
    num_fewshot: Option<u32>,
    #[command(flatten)]
    stage: StageArgs,
}

#[derive(Debug, clap::Args)]
pub struct GpqaArgs {
    /// GPQA's file: its CSV (e.g. gpqa_diamond.csv), or JSONL with the
    /// same columns (`Question`, `Correct Answer`, `Incorrect Answer 1`..`3`).
    #[arg(long, value_name = "FILE")]
    gpqa_path: PathBuf,
    #[command(flatten)]
    stage: StageArgs,
}

/// The stage and how it is run: the client and fleet flags `generate` has.
#[derive(Debug, clap::Args)]
struct StageArgs {
    /// Questions asked at once (closed-loop streams).
    #[arg(long, default_value_t = 1)]
    concurrency: u32,
    /// Most tokens of a reply; a reply cut off before its answer is scored
    /// unanswerable (or wrong): raise it for a model that reasons at length.
    #[arg(long, default_value_t = 256, value_name = "N")]
    max_tokens: u32,
    /// Questions asked [default: each of the dataset's once].
    #[arg(long, value_name = "N")]
    max_requests: Option<u64>,
    /// Longest the stage runs; the questions not asked by then are not scored.
    #[arg(long, value_parser = parse_duration, default_value = "1h")]
    duration: Duration,

    #[command(flatten)]
    output: OutputArgs,
    #[command(flatten)]
    client: Box<ClientArgs>,
    #[command(flatten)]
    fleet: Box<FleetArgs>,
}

pub async fn run(command: Command, ui: Ui) -> anyhow::Result<ExitCode> {
    let (scenario, stage) = plan(command)?;
    let summary = stage.output.summary();
    match stage.fleet.role(stage.output.output())? {
        Role::Alone => {
            let spec = stage.spec(scenario, None)?;
            run::alone(spec, summary, progress::DEFAULT_INTERVAL, ui).await
        }
        Role::Lead(lead) => fleet::lead(stage.spec(scenario, Some(lead))?, summary, ui).await,
        Role::Work(work) => {
            let spec = work.spec(stage.client.to_options()?, Some(scenario));
            fleet::work(spec, stage.output.json, ui).await
        }
    }
}

/// The scenario of `command`, and the flags it is run with.
fn plan(command: Command) -> anyhow::Result<(Scenario, StageArgs)> {
    let (workload, stage) = match command {
        Command::Gsm8k(args) => {
            let fewshot = match (args.num_fewshot, &args.gsm8k_train_path) {
                (Some(n), None) if n > 0 => anyhow::bail!(
                    "--num-fewshot {n} takes its worked examples from GSM8K's train file: give \
                     --gsm8k-train-path FILE, or --num-fewshot 0"
                ),
                (Some(n), _) => n,
                (None, Some(_)) => 5,
                (None, None) => 0,
            };
            let workload = Workload {
                kind: WorkloadType::Gsm8k,
                path: Some(path_text(&args.gsm8k_path)),
                train_path: args.gsm8k_train_path.as_deref().map(path_text),
                fewshot,
                ..Workload::default()
            };
            (workload, args.stage)
        }
        Command::Gpqa(args) => {
            let workload = Workload {
                kind: WorkloadType::Gpqa,
                path: Some(path_text(&args.gpqa_path)),
                ..Workload::default()
            };
            (workload, args.stage)
        }
    };
    Ok((stage.scenario(workload), stage))
}

fn path_text(path: &Path) -> String {
    path.display().to_string()
}

impl StageArgs {
    /// The one stage asking `workload`'s questions.
    fn scenario(&self, workload: Workload) -> Scenario {
        Scenario {
            target: None,
            model: None,
            workload: Workload {
                osl: self.max_tokens,
                ..workload
            },
            steps: vec![Step::Stage(Stage {
                concurrency: Some(self.concurrency),
                max_requests: self.max_requests.unwrap_or(0),
                ..Stage::new(self.duration.as_secs_f64(), Mode::Concurrent)
            })],
        }
    }

    /// The run of `scenario` with these flags.
    fn spec(&self, scenario: Scenario, lead: Option<LeadSpec>) -> anyhow::Result<RunSpec> {
        let load = self.client.to_options()?;
        let signals = SignalOptions {
            ca_certs: super::client::ca_certs(&load),
            ..SignalOptions::default()
        };
        Ok(RunSpec {
            scenario,
            source: None,
            load,
            signals,
            policy: PolicySpec::default(),
            output: self.output.output(),
            client_metrics: self.client.metrics,
            lead,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Eval {
        #[command(subcommand)]
        command: Command,
    }

    fn plan_of(args: &[&str]) -> anyhow::Result<Scenario> {
        let eval = Eval::try_parse_from(std::iter::once("eval").chain(args.iter().copied()))?;
        Ok(plan(eval.command)?.0)
    }

    #[test]
    fn the_stage_asks_each_question_once_at_the_concurrency() {
        let scenario = plan_of(&[
            "gsm8k",
            "--gsm8k-path",
            "t.jsonl",
            "--concurrency",
            "32",
            "--max-tokens",
            "512",
        ])
        .unwrap();
        assert_eq!(scenario.workload.kind, WorkloadType::Gsm8k);
        assert_eq!(scenario.workload.path.as_deref(), Some("t.jsonl"));
        assert_eq!(scenario.workload.osl, 512);
        assert_eq!(scenario.workload.fewshot, 0, "no train file, no examples");
        let [Step::Stage(stage)] = scenario.steps.as_slice() else {
            panic!("one stage: {:?}", scenario.steps);
        };
        assert_eq!(stage.concurrency, Some(32));
        assert_eq!(stage.max_requests, 0, "the dataset's size");
        assert_eq!(stage.duration_s, 3600.0);
        assert!(stage.stop.is_none());
        assert!(nyann_model::rules::scenario_problems(&scenario).is_empty());
    }

    #[test]
    fn few_shot_examples_come_from_the_train_file() {
        let train = [
            "gsm8k",
            "--gsm8k-path",
            "t.jsonl",
            "--gsm8k-train-path",
            "tr.jsonl",
        ];
        let scenario = plan_of(&train).unwrap();
        assert_eq!(scenario.workload.fewshot, 5);
        assert_eq!(scenario.workload.train_path.as_deref(), Some("tr.jsonl"));
        let scenario = plan_of(&[&train[..], &["--num-fewshot", "0"]].concat()).unwrap();
        assert_eq!(scenario.workload.fewshot, 0);
        let err = plan_of(&["gsm8k", "--gsm8k-path", "t", "--num-fewshot", "3"]).unwrap_err();
        assert!(
            err.to_string().contains("--num-fewshot 3 takes its worked examples from GSM8K's train file: give --gsm8k-train-path FILE"),
            "{err}"
        );
        let gpqa = plan_of(&["gpqa", "--gpqa-path", "d.csv"]).unwrap();
        assert_eq!(gpqa.workload.kind, WorkloadType::Gpqa);
        assert_eq!(gpqa.workload.osl, 256);
    }
}
