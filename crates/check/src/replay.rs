//! Replay: judge the stages of a recorded run again, offline, with any
//! policy and parameters, next to what was decided during the run. A team
//! tunes thresholds or tries a new policy on yesterday's real sweep without
//! GPU time; a policy author asserts verdicts on recorded runs in CI
//! (`policy check --fixture`).
//!
//! A results directory is read through [`nyann_results::RunDir`]
//! (`stages.json`, else the `stages` of `summary.json`), tolerantly: fields
//! it does not know are ignored and fields that older versions did not
//! write read as defaults, so runs recorded before and after a change of
//! the format replay alike. Each judged stage carries what its policy was
//! shown (signals per role, signal errors, the sweep, the parameters as
//! written) in its congestion record, and its client statistics.
//!
//! Replays are deterministic: a policy sees the same virtual clock and the
//! same random numbers for the same stage, so the same inputs give the
//! same verdicts.

use std::path::Path;

use anyhow::bail;
use nyann_model::{ClientStats, Param, StageObservation, StopCondition, Verdict};
use nyann_policy_host::Policy;
use serde::{Deserialize, Serialize};

use crate::record::{Judged, PolicyMode};

/// A stage of a results directory, as much of it as replay needs. Every
/// field is optional or defaulted: see the module doc.
#[derive(Debug, Deserialize)]
struct RecordedStage {
    index: usize,
    #[serde(default)]
    label: String,
    #[serde(default)]
    status: String,
    #[serde(default)]
    concurrency: Option<u32>,
    #[serde(default)]
    rate: Option<f64>,
    #[serde(default)]
    start_unix: Option<f64>,
    #[serde(default)]
    end_unix: Option<f64>,
    #[serde(default)]
    client: Option<ClientStats>,
    #[serde(default)]
    detail: Option<RecordedDetail>,
    #[serde(default)]
    annotation: Option<Judged>,
    /// A capacity-search stage: the sweep stage it refines.
    #[serde(default)]
    search: Option<RecordedSearch>,
}

#[derive(Debug, Deserialize)]
struct RecordedSearch {
    refines: u32,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RecordedDetail {
    dropped: u64,
}

/// A judged stage of a recorded run.
#[derive(Debug, Clone)]
pub struct JudgedStage {
    /// What the policy was shown.
    pub observation: StageObservation,
    /// The `until_congested(...)` parameters as written (empty in runs
    /// recorded before they were stored).
    pub params: Vec<Param>,
    /// What was decided during the run.
    pub recorded: Result<Verdict, String>,
    /// The mode the run judged in (a monitor run never stopped).
    pub mode: PolicyMode,
    /// The policy that judged during the run: name and version.
    pub policy: (String, String),
}

/// The judged stages of a results directory, in order.
#[derive(Debug, Clone)]
pub struct RecordedRun {
    pub stages: Vec<JudgedStage>,
}

impl RecordedRun {
    /// Read `dir/stages.json` (else `dir/summary.json`).
    pub fn read(dir: &Path) -> anyhow::Result<RecordedRun> {
        let stages: Vec<RecordedStage> = nyann_results::RunDir::open(dir)?.stages()?;
        let mut judged_stages = Vec::new();
        for stage in stages {
            let label = stage.label.clone();
            match judged(stage) {
                Ok(Some(stage)) => judged_stages.push(stage),
                Ok(None) => {}
                Err(why) => bail!(
                    "{}: stage {label}: {why}: the file was changed or is corrupt",
                    dir.display()
                ),
            }
        }
        let stages = judged_stages;
        if stages.is_empty() {
            bail!(
                "{} records no judged stage: the run had no until_congested(...) stage that \
                 finished (or was written by a version that did not record verdicts)",
                dir.display()
            );
        }
        Ok(RecordedRun { stages })
    }

    /// The stage after which the run stopped on congestion, if it did: the
    /// first congested verdict of an `enforce` run.
    pub fn stopped_after(&self) -> Option<&JudgedStage> {
        self.stages.iter().find(|s| {
            s.mode == PolicyMode::Enforce && s.recorded.as_ref().is_ok_and(|v| v.congested)
        })
    }
}

/// The judged stage a recorded stage is, if it was judged; an error when
/// its figures cannot be (they would reach the policy as they are).
fn judged(stage: RecordedStage) -> Result<Option<JudgedStage>, String> {
    if stage.status != "measured" {
        return Ok(None);
    }
    let Some(judged) = stage.annotation else {
        return Ok(None);
    };
    let record = judged.congestion;
    let recorded = match (record.verdict, record.policy_error) {
        (Some(verdict), _) => Ok(verdict),
        (None, error) => Err(error.unwrap_or_else(|| "no verdict recorded".to_string())),
    };
    let mut client = stage.client.unwrap_or_default();
    if client.dropped == 0 {
        // Recorded before the client statistics carried it.
        client.dropped = stage.detail.unwrap_or_default().dropped;
    }
    if let Some(eval) = &mut client.eval {
        let (answered, correct, unanswerable) = (eval.answered, eval.correct, eval.unanswerable);
        // Unanswerable replies are scored wrong: they and the right ones
        // are among the answered.
        if correct
            .checked_add(unanswerable)
            .is_none_or(|n| n > answered)
        {
            return Err(format!(
                "client.eval has {correct} correct and {unanswerable} unanswerable of \
                 {answered} answered, which cannot be"
            ));
        }
        // The accuracy and its interval follow from the counts.
        *eval = nyann_model::EvalStats::of(answered, correct, unanswerable);
    }
    Ok(Some(JudgedStage {
        observation: StageObservation {
            index: u32::try_from(stage.index).unwrap_or(u32::MAX),
            name: stage.label,
            sweep: record.sweep,
            concurrency: stage.concurrency,
            rate: stage.rate,
            start_unix_seconds: stage.start_unix.unwrap_or_default(),
            end_unix_seconds: stage.end_unix.unwrap_or_default(),
            roles: record.roles,
            client,
            signal_errors: record.signal_errors,
            refines: stage.search.map(|s| s.refines),
        },
        params: record.params,
        recorded,
        mode: record.mode,
        policy: (record.policy.name, record.policy.version),
    }))
}

/// One stage judged again.
#[derive(Debug, Clone, Serialize)]
pub struct ReplayedStage {
    pub stage: u32,
    pub name: String,
    /// What was decided during the run (`error` when the call failed).
    pub recorded: Outcome,
    /// What the replayed policy decides now.
    pub replayed: Outcome,
}

/// A verdict, or why there is none.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Verdict(Verdict),
    Error(String),
}

impl Outcome {
    fn of(result: Result<Verdict, String>) -> Outcome {
        match result {
            Ok(v) => Outcome::Verdict(v),
            Err(e) => Outcome::Error(e),
        }
    }

    pub fn congested(&self) -> bool {
        matches!(self, Outcome::Verdict(v) if v.congested)
    }

    /// `congested`, `ok` or `error`.
    pub fn word(&self) -> &'static str {
        match self {
            Outcome::Verdict(v) if v.congested => "congested",
            Outcome::Verdict(_) => "ok",
            Outcome::Error(_) => "error",
        }
    }
}

/// Judge every stage of `run` with `policy`, in order, each with the
/// history of its sweep as it was. `overrides` replace or add parameters to
/// the recorded ones; the recorded ones are only used when `policy` has the
/// name of the policy that recorded them (another policy has other
/// parameters: it gets `overrides` alone).
/// The policy refused the parameters a stage is replayed with (the cause
/// is the error's source): those the run recorded, with the overrides.
#[derive(Debug, thiserror::Error)]
#[error("stage {stage}: {recorded}")]
pub struct ParamsRefused {
    pub stage: String,
    /// What the run recorded of them.
    pub recorded: String,
}

pub fn replay(
    run: &RecordedRun,
    policy: &Policy,
    overrides: &[Param],
) -> anyhow::Result<Vec<ReplayedStage>> {
    let mut checked: Vec<(Vec<Param>, Vec<Param>)> = Vec::new();
    let mut out = Vec::with_capacity(run.stages.len());
    for (i, stage) in run.stages.iter().enumerate() {
        let recorded: &[Param] = if stage.policy.0 == policy.name() {
            &stage.params
        } else {
            &[]
        };
        let given = with_overrides(recorded, overrides);
        let params = match checked.iter().find(|(g, _)| *g == given) {
            Some((_, params)) => params.clone(),
            None => {
                let stop = StopCondition {
                    params: given.clone(),
                    location: None,
                    param_locations: Vec::new(),
                    search: None,
                };
                let params = policy.check_params(&stop).map_err(|source| {
                    let recorded = if stage.policy.0 != policy.name() {
                        format!(
                            "the run was judged by policy {}, whose parameters do not apply",
                            stage.policy.0
                        )
                    } else if stage.params.is_empty() {
                        "the run did not record its until_congested(...) parameters (it was \
                         written by an older nyann-bench)"
                            .to_string()
                    } else {
                        format!("the run recorded {}", show_params(&stage.params))
                    };
                    anyhow::Error::new(source).context(ParamsRefused {
                        stage: stage.observation.name.clone(),
                        recorded,
                    })
                })?;
                checked.push((given, params.clone()));
                params
            }
        };
        let history: Vec<StageObservation> = run.stages[..i]
            .iter()
            .filter(|earlier| earlier.observation.sweep.index == stage.observation.sweep.index)
            .map(|earlier| earlier.observation.clone())
            .collect();
        let replayed = policy
            .judge_blocking(&params, &stage.observation, &history)
            .map_err(|e| e.to_string());
        out.push(ReplayedStage {
            stage: stage.observation.index,
            name: stage.observation.name.clone(),
            recorded: Outcome::of(stage.recorded.clone()),
            replayed: Outcome::of(replayed),
        });
    }
    Ok(out)
}

/// `recorded` with each of `overrides` replacing the parameter of the same
/// name, or added after them.
fn with_overrides(recorded: &[Param], overrides: &[Param]) -> Vec<Param> {
    let mut params: Vec<Param> = recorded
        .iter()
        .filter(|p| !overrides.iter().any(|o| o.name == p.name))
        .cloned()
        .collect();
    params.extend(overrides.iter().cloned());
    params
}

/// `ttft_p99="2s", waiting_requests_p50=32`.
pub fn show_params(params: &[Param]) -> String {
    params
        .iter()
        .map(|p| format!("{}={}", p.name, serde_json::json!(p.value)))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use nyann_model::Value;
    use nyann_policy_host::{HostConfig, PolicyHost};

    fn p(name: &str, value: Value) -> Param {
        Param {
            name: name.into(),
            value,
        }
    }

    #[test]
    fn overrides_replace_or_add() {
        let recorded = [p("a", Value::Number(1.0)), p("b", Value::Text("2s".into()))];
        let merged = with_overrides(
            &recorded,
            &[p("a", Value::Number(5.0)), p("c", Value::Flag(true))],
        );
        assert_eq!(
            merged,
            vec![
                p("b", Value::Text("2s".into())),
                p("a", Value::Number(5.0)),
                p("c", Value::Flag(true))
            ]
        );
        assert_eq!(show_params(&merged), "b=\"2s\", a=5.0, c=true");
    }

    /// A measured, judged stage as this version's predecessors wrote it:
    /// no parameters, sweep or dropped count in the record or the client.
    const WRITTEN_BEFORE: &str = r##"[
      {"index": 0, "label": "#0 c=4", "name": null, "status": "measured", "mode": "concurrent",
       "concurrency": 4, "rate": null, "duration_s": 3.0, "start_unix": 1700000000.0,
       "end_unix": 1700000003.0,
       "client": {"requests_ok": 40, "requests_failed": 0, "requests_per_second": 13.3,
                  "output_tokens_per_second": 900.0, "ttft_p50_seconds": 0.02,
                  "ttft_p99_seconds": 0.05, "itl_p50_seconds": 0.01, "itl_p99_seconds": 0.02,
                  "e2e_p50_seconds": 0.3, "e2e_p99_seconds": 0.4},
       "detail": {"sent": 40, "cancelled": 0, "dropped": 2, "output_tokens": 2700,
                  "ttft_mean_seconds": 0.02, "ttft_p90_seconds": 0.04, "e2e_mean_seconds": 0.3},
       "annotation": {"congestion": {
          "policy": {"name": "builtin", "version": "0.1.0", "origin": "builtin"},
          "mode": "enforce",
          "roles": [{"role": "aggregate", "waiting_requests_p50": 40.0, "ttft_p99_seconds": 2.5,
                     "kv_cache_usage_max": 0.5, "preemptions": 0.0, "extra": []}],
          "signal_errors": [],
          "verdict": {"congested": true, "reasons": ["queueing"]},
          "policy_error": null, "check_seconds": 0.01}},
       "skip_reason": null},
      {"index": 1, "label": "#1 c=8", "name": null, "status": "skipped", "mode": "concurrent",
       "concurrency": 8, "rate": null, "duration_s": 3.0, "start_unix": null, "end_unix": null,
       "client": null, "detail": null, "annotation": null,
       "skip_reason": "stopped after stage #0 c=4: congested"}
    ]"##;

    /// The same stage as later versions may write it: fields this version
    /// does not know (rejected rates, signals found or missing, a sweep on
    /// the stage) and the ones it added (parameters, sweep, counts).
    const WRITTEN_AFTER: &str = r##"[
      {"index": 0, "label": "#0 c=4", "status": "measured", "concurrency": 4,
       "start_unix": 1700000000.0, "end_unix": 1700000003.0, "sweep": {"index": 0},
       "client": {"requests_ok": 40, "requests_failed": 0, "requests_per_second": 13.3,
                  "output_tokens_per_second": 900.0, "ttft_p50_seconds": 0.02,
                  "ttft_p99_seconds": 0.05, "itl_p50_seconds": 0.01, "itl_p99_seconds": 0.02,
                  "e2e_p50_seconds": 0.3, "e2e_p99_seconds": 0.4, "dropped": 2,
                  "requests_rejected": 5, "requests_late": 1,
                  "rejected_per_second": 1.6},
       "detail": {"dropped": 2, "client_lag_p99_seconds": 0.001},
       "annotation": {"congestion": {
          "policy": {"name": "builtin", "version": "0.2.0", "origin": "builtin"},
          "mode": "enforce",
          "sweep": {"index": 0, "name": "s.star:3:14"},
          "params": [{"name": "waiting_requests_p50", "value": 32},
                     {"name": "ttft_p99", "value": "2s"}],
          "roles": [{"role": "aggregate", "waiting_requests_p50": 40.0, "ttft_p99_seconds": 2.5,
                     "kv_cache_usage_max": 0.5, "preemptions": 0.0, "extra": [],
                     "found": ["waiting", "ttft"], "missing": ["kv_cache_usage"]}],
          "signal_errors": [],
          "signals_missing": true,
          "verdict": {"congested": true, "reasons": ["queueing"]},
          "policy_error": null, "check_seconds": 0.01}}}
    ]"##;

    fn run_from(stages_json: &str) -> RecordedRun {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("stages.json"), stages_json).unwrap();
        RecordedRun::read(dir.path()).unwrap()
    }

    #[test]
    fn a_directory_without_a_run_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("no-run");
        let err = RecordedRun::read(&missing).unwrap_err().to_string();
        assert!(
            err.ends_with("is not a directory: give the results directory of a run"),
            "{err}"
        );
        std::fs::create_dir_all(&missing).unwrap();
        let err = RecordedRun::read(&missing).unwrap_err().to_string();
        assert!(
            err.contains("holds no stages.json or summary.json"),
            "{err}"
        );
    }

    /// Eval counts that cannot be (more right than answered) are refused
    /// before a policy sees them; a value of the wrong type is named once.
    #[test]
    fn recorded_figures_that_cannot_be_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let eval = r#""eval": {"answered": 3, "correct": 5, "unanswerable": 0,
                               "accuracy": 1.0, "accuracy_low": 0.5, "accuracy_high": 1.0}"#;
        let forged =
            WRITTEN_AFTER.replace(r#""dropped": 2,"#, &format!(r#""dropped": 2, {eval},"#));
        assert_ne!(forged, WRITTEN_AFTER);
        std::fs::write(dir.path().join("stages.json"), &forged).unwrap();
        let err = format!("{:#}", RecordedRun::read(dir.path()).unwrap_err());
        assert!(
            err.ends_with(
                "stage #0 c=4: client.eval has 5 correct and 0 unanswerable of 3 answered, \
                 which cannot be: the file was changed or is corrupt"
            ),
            "{err}"
        );
        // Possible counts pass, with the accuracy they give (not the one
        // written).
        let fine = forged.replace(r#""answered": 3"#, r#""answered": 10"#);
        std::fs::write(dir.path().join("stages.json"), &fine).unwrap();
        let run = RecordedRun::read(dir.path()).unwrap();
        let eval = run.stages[0].observation.client.eval.unwrap();
        assert_eq!((eval.correct, eval.answered, eval.accuracy), (5, 10, 0.5));
        // serde's text, once.
        let wrong = WRITTEN_AFTER.replace(r#""requests_ok": 40"#, r#""requests_ok": -40"#);
        std::fs::write(dir.path().join("stages.json"), &wrong).unwrap();
        let err = format!("{:#}", RecordedRun::read(dir.path()).unwrap_err());
        assert_eq!(
            err.matches("invalid value: integer `-40`").count(),
            1,
            "{err}"
        );
    }

    #[test]
    fn results_written_before_and_after_format_changes_read_alike() {
        let before = run_from(WRITTEN_BEFORE);
        let after = run_from(WRITTEN_AFTER);
        assert_eq!(before.stages.len(), 1, "the skipped stage is not judged");
        assert_eq!(after.stages.len(), 1);
        let (old, new) = (&before.stages[0], &after.stages[0]);
        assert_eq!(old.observation.client.dropped, 2, "from the detail");
        assert_eq!(new.observation.client.requests_rejected, 5);
        assert_eq!(old.observation.roles, new.observation.roles);
        assert_eq!(old.recorded, new.recorded);
        assert_eq!(old.observation.sweep.index, 0);
        assert_eq!(new.observation.sweep.name, "s.star:3:14");
        assert!(old.params.is_empty());
        assert_eq!(new.params.len(), 2);
        assert_eq!(before.stopped_after().map(|s| s.observation.index), Some(0));
    }

    #[test]
    fn a_run_without_recorded_parameters_replays_with_given_ones() {
        let host = PolicyHost::new(HostConfig {
            cache_dir: None,
            ..HostConfig::default()
        })
        .unwrap();
        let builtin = host.load_builtin().unwrap();
        let before = run_from(WRITTEN_BEFORE);
        let err = replay(&before, &builtin, &[]).unwrap_err();
        let text = format!("{err:#}");
        assert!(
            text.contains("the run did not record its until_congested(...) parameters")
                && text.contains("missing required parameters `waiting_requests_p50`"),
            "{text}"
        );
        let given = [
            p("waiting_requests_p50", Value::Number(32.0)),
            p("ttft_p99", Value::Text("2s".into())),
        ];
        let replayed = replay(&before, &builtin, &given).unwrap();
        assert_eq!(replayed[0].replayed.word(), "congested");
        // The later format carries the parameters itself; both agree.
        let after = replay(&run_from(WRITTEN_AFTER), &builtin, &[]).unwrap();
        assert_eq!(after[0].replayed, replayed[0].replayed);
        // A higher threshold changes the verdict.
        let higher = replay(
            &before,
            &builtin,
            &[given[0].clone(), p("ttft_p99", Value::Text("3s".into()))],
        )
        .unwrap();
        assert_eq!(higher[0].replayed.word(), "ok");
    }
}
