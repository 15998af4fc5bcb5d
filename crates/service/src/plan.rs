//! Plan: a client's scenario compiled in a bounded child process and
//! checked against its target's bounds and signal source (whose preflight
//! runs now when a stage stops on congestion), before anything is queued. The answer is the effective plan: the stages, how long the
//! run may last, what a stop on congestion could save.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use nyann_model::{Mode, Scenario, Step};
use serde::{Deserialize, Serialize};
use tokio::io::AsyncReadExt;

use crate::launcher::Launcher;
use crate::targets::{Target, Targets};

/// What the compiling child knows the client's scenario as.
const SCENARIO_FILE: &str = "scenario.star";
/// The largest scenario source accepted.
pub const MAX_SOURCE_BYTES: usize = 64 * 1024;
/// Loop iterations and function calls the compile may take: a plan is a
/// small program (real scenarios take a few thousand), and a service
/// compiles others' programs.
pub const MAX_STEPS: u64 = 100_000;
/// How long the compile may take before its process is killed.
pub const COMPILE_TIME: Duration = Duration::from_secs(3);
/// The most IR the compile may print (128 stages take far less).
const MAX_IR_BYTES: u64 = 8 * 1024 * 1024;
/// The most of the compile's error text kept.
const MAX_ERROR_BYTES: u64 = 16 * 1024;

/// What a client asks for.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PlanRequest {
    /// The target's name, from the targets file.
    pub target: String,
    /// The scenario's Starlark text.
    pub scenario: String,
    /// A label shown in lists.
    #[serde(default)]
    pub label: Option<String>,
    /// The congestion policy: `builtin` (the default) or one the target allows.
    #[serde(default)]
    pub policy: Option<String>,
}

impl PlanRequest {
    pub fn policy(&self) -> &str {
        self.policy.as_deref().unwrap_or("builtin")
    }
}

/// The effective plan.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
pub struct Plan {
    pub target: String,
    pub policy: String,
    pub stages: Vec<PlannedStage>,
    /// Seconds if every stage runs.
    pub longest_s: f64,
    /// Seconds if the first stage under `until_congested` stops the run:
    /// what a stop may save is `longest_s` less this.
    pub shortest_s: f64,
    pub until_congested: bool,
    pub warnings: Vec<String>,
    /// The compiled scenario (the IR), as the run will get it.
    #[schemars(with = "serde_json::Value")]
    pub scenario: Scenario,
}

/// One stage of the plan.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
pub struct PlannedStage {
    pub index: usize,
    pub name: Option<String>,
    pub mode: Mode,
    pub concurrency: Option<u32>,
    pub rate: Option<f64>,
    pub duration_s: f64,
    pub until_congested: bool,
}

/// Why a plan was refused; each says what to change.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("unknown target {name:?}: the service's targets are {known}")]
    UnknownTarget { name: String, known: String },
    #[error("target {target:?} does not allow policy {policy:?}: it allows {allowed}")]
    PolicyNotAllowed {
        target: String,
        policy: String,
        allowed: String,
    },
    #[error(
        "the scenario is {0} bytes; the limit is {MAX_SOURCE_BYTES} bytes: a scenario is a small program"
    )]
    TooLarge(usize),
    #[error(
        "the scenario's compile ran past its {}-second limit and was stopped: look for a runaway loop",
        COMPILE_TIME.as_secs()
    )]
    CompileTime,
    #[error("the scenario's compile printed more than {MAX_IR_BYTES} bytes: write fewer stages")]
    CompileOutput,
    #[error("the scenario does not compile:\n{0}")]
    Scenario(String),
    #[error("the scenario breaks target {target:?}'s bounds:\n{}", .errors.join("\n"))]
    Bounds { target: String, errors: Vec<String> },
    #[error(
        "target {target:?}'s signal source fails its preflight, so until_congested could not judge a stage: {reason}\nask the operator to fix the target's signals in the targets file"
    )]
    Signals { target: String, reason: String },
    #[error("the cluster refuses the run's objects (a server-side dry run): {0}")]
    Cluster(String),
    #[error("the compile could not run: {0}")]
    Internal(String),
}

impl PlanError {
    /// The client's fault (400), or the service's (500).
    pub fn is_internal(&self) -> bool {
        matches!(self, PlanError::Internal(_))
    }
}

/// Plans `request`: checks the target and policy, compiles the scenario in
/// a child process (`scratch` is a directory for its file), and checks the
/// result against the target.
pub async fn plan(
    targets: &Targets,
    launcher: &dyn Launcher,
    scratch: &Path,
    request: &PlanRequest,
) -> Result<Plan, PlanError> {
    let target = targets
        .get(&request.target)
        .ok_or_else(|| PlanError::UnknownTarget {
            name: request.target.clone(),
            known: targets.names(),
        })?;
    let policy = request.policy();
    if !target.policies.iter().any(|p| p == policy) {
        return Err(PlanError::PolicyNotAllowed {
            target: target.name.clone(),
            policy: policy.to_string(),
            allowed: target.policies.join(", "),
        });
    }
    if request.scenario.len() > MAX_SOURCE_BYTES {
        return Err(PlanError::TooLarge(request.scenario.len()));
    }
    let scenario = compile(launcher, scratch, &request.scenario, policy).await?;
    let mut plan = check(target, policy, scenario)?;
    if plan.until_congested {
        let warnings = crate::preflight::check(&target.signals)
            .await
            .map_err(|reason| PlanError::Signals {
                target: target.name.clone(),
                reason,
            })?;
        plan.warnings
            .extend(warnings.into_iter().map(|w| format!("signals: {w}")));
    }
    Ok(plan)
}

/// The child's compile, bounded in time and output.
async fn compile(
    launcher: &dyn Launcher,
    scratch: &Path,
    source: &str,
    policy: &str,
) -> Result<Scenario, PlanError> {
    let internal = |what: &str, e: std::io::Error| PlanError::Internal(format!("{what}: {e}"));
    // The child compiles `scenario.star` in a directory of its own: the
    // names it derives from the file (a sweep's, "scenario.star:3:14")
    // and its errors then show clients no path of the service's machine.
    let dir = tempfile::Builder::new()
        .prefix("plan-")
        .tempdir_in(scratch)
        .map_err(|e| internal("cannot write the scenario", e))?;
    std::fs::write(dir.path().join(SCENARIO_FILE), source)
        .map_err(|e| internal("cannot write the scenario", e))?;
    let policy = match policy {
        "builtin" => policy.into(),
        reference if nyann_oci::OciReference::is_reference(reference) => reference.into(),
        file => std::path::absolute(file).map_err(|e| internal("cannot find the policy", e))?,
    };
    let mut command = launcher.compile(
        Path::new(SCENARIO_FILE),
        &policy.to_string_lossy(),
        MAX_STEPS,
    );
    command
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = command
        .spawn()
        .map_err(|e| internal("cannot start the compile", e))?;
    let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
        return Err(PlanError::Internal(
            "the compile's pipes are missing".into(),
        ));
    };
    // Its output is read as it comes (a full pipe would stall the child);
    // too much IR ends the compile at once (the child is dropped, so killed).
    let work = async {
        let out = async {
            let mut out = Vec::new();
            stdout.take(MAX_IR_BYTES + 1).read_to_end(&mut out).await?;
            if out.len() as u64 > MAX_IR_BYTES {
                return Err(Failure::Output);
            }
            Ok(out)
        };
        let (out, err) = tokio::try_join!(out, read_keeping(stderr, MAX_ERROR_BYTES))?;
        Ok::<_, Failure>((child.wait().await?, out, err))
    };
    let (status, out, err) = match tokio::time::timeout(COMPILE_TIME, work).await {
        Err(_) => return Err(PlanError::CompileTime),
        Ok(Err(Failure::Output)) => return Err(PlanError::CompileOutput),
        Ok(Err(Failure::Io(e))) => return Err(internal("the compile failed", e)),
        Ok(Ok(done)) => done,
    };
    if !status.success() {
        let text = String::from_utf8_lossy(&err);
        return Err(PlanError::Scenario(text.trim().to_string()));
    }
    serde_json::from_slice(&out)
        .map_err(|e| PlanError::Internal(format!("the compile's IR does not parse: {e}")))
}

/// Why reading the compile's output stopped.
enum Failure {
    Output,
    Io(std::io::Error),
}

impl From<std::io::Error> for Failure {
    fn from(e: std::io::Error) -> Self {
        Failure::Io(e)
    }
}

/// Reads `reader` to its end, keeping its first `limit` bytes.
async fn read_keeping(
    mut reader: impl tokio::io::AsyncRead + Unpin,
    limit: u64,
) -> Result<Vec<u8>, Failure> {
    let mut kept = Vec::new();
    (&mut reader).take(limit).read_to_end(&mut kept).await?;
    tokio::io::copy(&mut reader, &mut tokio::io::sink()).await?;
    Ok(kept)
}

/// The scenario against the target's bounds and signal source.
fn check(target: &Target, policy: &str, scenario: Scenario) -> Result<Plan, PlanError> {
    let bounds = &target.bounds;
    let mut errors = Vec::new();
    if scenario.target.is_some() {
        errors.push(
            "the scenario sets `target`: the service's target gives the URL; remove it".to_string(),
        );
    }
    let mut stages = Vec::new();
    for step in &scenario.steps {
        let Step::Stage(stage) = step else { continue };
        let index = stages.len();
        let at = format!("stage {index}");
        if stage.target.is_some() {
            errors.push(format!(
                "{at} sets `target`: the service's target gives the URL; remove it"
            ));
        }
        if let Some(c) = stage.concurrency
            && c > bounds.max_concurrency
        {
            errors.push(format!(
                "{at}: concurrency {c} is above the target's max_concurrency {}",
                bounds.max_concurrency
            ));
        }
        if let Some(rate) = stage.rate
            && rate > bounds.max_rate
        {
            errors.push(format!(
                "{at}: rate {rate}/s is above the target's max_rate {}/s",
                bounds.max_rate
            ));
        }
        if stage.duration_s > bounds.max_stage_duration_s {
            errors.push(format!(
                "{at}: {}s is longer than the target's max_stage_duration_s {}s",
                stage.duration_s, bounds.max_stage_duration_s
            ));
        }
        let workloads = std::iter::once(&scenario.workload).chain(stage.workload.as_ref());
        for workload in workloads {
            if workload.path.is_some()
                || workload.train_path.is_some()
                || workload.corpus_path.is_some()
            {
                errors.push(format!(
                    "{at}: a workload reads a file (path, train_path or corpus_path): the service runs only scenarios that need no file of its machine"
                ));
                break;
            }
        }
        stages.push(PlannedStage {
            index,
            name: stage.name.clone(),
            mode: stage.mode,
            concurrency: stage.concurrency,
            rate: stage.rate,
            duration_s: stage.duration_s,
            until_congested: stage.stop.is_some(),
        });
    }
    if stages.len() > bounds.max_stages {
        errors.push(format!(
            "the scenario has {} stages; target {:?} allows at most {} (max_stages)",
            stages.len(),
            target.name,
            bounds.max_stages
        ));
    }
    let longest_s: f64 = stages.iter().map(|s| s.duration_s).sum();
    if longest_s > bounds.max_total_duration_s {
        errors.push(format!(
            "the stages last {longest_s}s together; the target's max_total_duration_s is {}s",
            bounds.max_total_duration_s
        ));
    }
    let until_congested = stages.iter().any(|s| s.until_congested);
    if until_congested && !target.signals.is_configured() {
        errors.push(format!(
            "the scenario uses until_congested, but target {:?} has no signal source: ask the operator to give it signals.prometheus_url and deploy_name, or signals.scrape, in the targets file",
            target.name
        ));
    }
    if !errors.is_empty() {
        return Err(PlanError::Bounds {
            target: target.name.clone(),
            errors,
        });
    }
    // A stop can come after the first judged stage at the earliest.
    let shortest_s = match stages.iter().position(|s| s.until_congested) {
        Some(first) => stages[..=first].iter().map(|s| s.duration_s).sum(),
        None => longest_s,
    };
    let mut warnings = Vec::new();
    if stages.is_empty() {
        warnings.push("the scenario has no stage: the run sends nothing".to_string());
    }
    Ok(Plan {
        target: target.name.clone(),
        policy: policy.to_string(),
        stages,
        longest_s,
        shortest_s,
        until_congested,
        warnings,
        scenario,
    })
}
