//! The congestion check: after each measured stage that carries an
//! `until_congested(...)` stop condition, read the server signals of the
//! stage, ask the policy for a verdict, and stop the sweep when it says
//! "congested". Each `until_congested(...)` call is a sweep of its own: the
//! policy's history holds that sweep's stages only, and its stop skips the
//! rest of that sweep only.
//!
//! It plugs into the stage runner as its [`StageHook`], so it runs after the
//! stage's requests completed and before the next stage starts, while the
//! load holds the finished stage's level. Everything it can check up front
//! (a signal source is configured, the policy loads, every stop condition's
//! parameters pass the policy's `describe`/`validate`, the signal source
//! answers and every role finds its server's series) is checked before any
//! request is sent: by [`CongestionCheck::new`], and by the source's
//! preflight, which the caller runs.
//!
//! Failures never stop a sweep by themselves unless asked to: a failed
//! signal query reads as zero and is recorded with the stage (fail-open); a failed policy call is recorded and, by default, the
//! sweep goes on ([`OnPolicyError::Stop`] changes that). A signal without
//! series also reads zero, but the record says "no data" for it, and a stage
//! judged with a whole role missing is a warning naming the role.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use nyann_load::{FinishedStage, HookDecision, HookOutcome, NextSearch, StageHook};
use nyann_model::{
    Param, RoleCoverage, RoleSignals, Scenario, Stage, StageObservation, Step, StopCondition,
    SweepRef, Verdict,
};
use nyann_policy_host::Policy;
use nyann_signals::{ClientEvidence, SignalSource, StageSignals};

use crate::record::{CongestionRecord, Judged, OnPolicyError, PolicyMode, PolicyRef};

/// The stage hook that judges congestion.
pub struct CongestionCheck {
    /// `None` when the policy judges client figures only and no source was
    /// given.
    source: Option<SignalSource>,
    policy: Policy,
    mode: PolicyMode,
    on_error: OnPolicyError,
    server_drain_wait: Duration,
    /// For each step that carries a stop condition, by step index: its
    /// condition, checked parameters (defaults filled, durations in
    /// seconds) and sweep.
    stops: BTreeMap<usize, Stop>,
    /// Per sweep (`until_congested(...)` call), the stages judged so far,
    /// oldest first: the policy's `history` (a sweep never sees another's).
    history: BTreeMap<u32, Vec<StageObservation>>,
}

/// How a congestion check uses its verdicts.
#[derive(Debug, Clone, Copy)]
pub struct CheckSettings {
    pub mode: PolicyMode,
    pub on_error: OnPolicyError,
    /// Before each capacity-search stage, the longest wait for the server
    /// to drain (every role's waiting requests back to 0); zero skips it.
    pub server_drain_wait: Duration,
}

impl Default for CheckSettings {
    /// Verdicts enforced, a failed policy call recorded and the sweep
    /// going on, a minute at most for the server to drain.
    fn default() -> Self {
        CheckSettings {
            mode: PolicyMode::Enforce,
            on_error: OnPolicyError::Continue,
            server_drain_wait: Duration::from_secs(60),
        }
    }
}

/// Why a congestion check cannot judge the scenario.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// The policy reads server signals and no source was given.
    #[error(
        "the scenario stops on congestion{} but no server signals are configured \
         (a policy that judges client figures only says so and needs none)",
        .at.as_ref().map(|at| format!(" (until_congested at {at})")).unwrap_or_default()
    )]
    NoSignalSource { at: Option<String> },
    /// Parameters of `until_congested(...)` calls the policy refused, one
    /// message per call.
    #[error("{}", .0.join("\n"))]
    Params(Vec<String>),
}

/// Whether any stage of `scenario` carries a stop condition (is judged).
pub fn judges_any_stage(scenario: &Scenario) -> bool {
    stop_steps(scenario).next().is_some()
}

/// The steps that carry a stop condition: index, stage, condition.
fn stop_steps(
    scenario: &Scenario,
) -> impl Iterator<Item = (usize, &nyann_model::Stage, &StopCondition)> {
    scenario
        .steps
        .iter()
        .enumerate()
        .filter_map(|(index, step)| match step {
            Step::Stage(stage) => stage.stop.as_ref().map(|stop| (index, stage, stop)),
            Step::Barrier { .. } => None,
        })
}

impl CongestionCheck {
    /// The check of `scenario` by `policy`, reading `source` (`None`: no
    /// server signals, which only a policy that judges client figures
    /// accepts). Every `until_congested(...)` call's parameters must pass
    /// the policy's checks (all errors reported at once). The source's
    /// preflight is the caller's, before load ([`CongestionCheck::source`]).
    pub fn new(
        scenario: &Scenario,
        policy: Policy,
        source: Option<SignalSource>,
        settings: CheckSettings,
    ) -> Result<CongestionCheck, CheckError> {
        if source.is_none() && policy.info().server_signals {
            let at = stop_steps(scenario)
                .next()
                .and_then(|(_, _, stop)| stop.location.as_ref().map(ToString::to_string));
            return Err(CheckError::NoSignalSource { at });
        }
        let checked = check_stop_conditions(scenario, &policy).map_err(CheckError::Params)?;
        let stops = stop_steps(scenario)
            .zip(checked)
            .map(|((index, stage, stop), params)| {
                let stop = Stop {
                    condition: stop.clone(),
                    params,
                    sweep: sweep_of(stage.sweep, stop),
                };
                (index, stop)
            })
            .collect();
        Ok(CongestionCheck {
            source,
            policy,
            mode: settings.mode,
            on_error: settings.on_error,
            server_drain_wait: settings.server_drain_wait,
            stops,
            history: BTreeMap::new(),
        })
    }

    /// Where the server signals come from, if anywhere.
    pub fn source(&self) -> Option<&SignalSource> {
        self.source.as_ref()
    }

    /// The policy that judges.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Starts sampling the servers' `/metrics` (for `--scrape`; a no-op for
    /// Prometheus). Call it before the first stage.
    pub fn start(&self) {
        if let Some(source) = &self.source {
            source.start();
        }
    }

    async fn judge(
        &mut self,
        done: &FinishedStage<'_, Judged>,
        stop: &Stop,
    ) -> HookOutcome<Judged> {
        let started = Instant::now();
        let signals = match &self.source {
            Some(source) => {
                let client = ClientEvidence {
                    longest_first_token_wait_seconds: done.stats.longest_first_token_wait(),
                };
                source
                    .stage_signals(done.start_unix, done.end_unix, client)
                    .await
            }
            None => StageSignals::default(),
        };
        let observation = StageObservation {
            index: u32::try_from(done.index).unwrap_or(u32::MAX),
            name: done.label.to_string(),
            sweep: stop.sweep.clone(),
            concurrency: done.stage.concurrency,
            rate: done.stage.rate,
            start_unix_seconds: done.start_unix,
            end_unix_seconds: done.end_unix,
            roles: signals.roles,
            client: done.client.clone(),
            signal_errors: signals.errors,
            refines: done.refines.map(|i| u32::try_from(i).unwrap_or(u32::MAX)),
        };
        for error in &observation.signal_errors {
            tracing::warn!("stage {}: {error} (reads as 0)", done.label);
        }
        for (role, coverage) in observation.roles.iter().zip(&signals.coverage) {
            if coverage.nothing_found()
                && let Some(source) = &self.source
            {
                tracing::warn!(
                    "stage {}: role {} has no series of any signal ({}): every signal of the role reads 0 for this verdict",
                    done.label,
                    role.role,
                    source.place(&role.role)
                );
            }
            tracing::info!("stage {}: {}", done.label, describe_role(role, coverage));
        }
        let history = self.history.entry(stop.sweep.index).or_default();
        let judged = self.policy.judge(&stop.params, &observation, history).await;
        let info = self.policy.info();
        let mut record = CongestionRecord {
            policy: PolicyRef {
                name: info.name.clone(),
                version: info.version.clone(),
                origin: self.policy.origin().to_string(),
                digest: self.policy.digest().to_string(),
                interface: self.policy.interface().to_string(),
            },
            mode: self.mode,
            sweep: stop.sweep.clone(),
            params: stop.condition.params.clone(),
            judged_params: stop.params.clone(),
            roles: observation.roles.clone(),
            coverage: signals.coverage,
            signal_errors: observation.signal_errors.clone(),
            verdict: None,
            policy_error: None,
            stopped: false,
            refine: stop.condition.search.map(Into::into),
            check_seconds: 0.0,
        };
        history.push(observation);

        let outcome = match judged {
            Ok(verdict) => {
                log_verdict(done.label, &verdict);
                let stop = verdict.congested && self.mode == PolicyMode::Enforce;
                let reason = format!("congested: {}", verdict.reasons.join("; "));
                record.verdict = Some(verdict);
                if stop {
                    HookOutcome::stop(reason)
                } else {
                    HookOutcome::proceed()
                }
            }
            Err(err) => {
                let message = err.to_string();
                record.policy_error = Some(message.clone());
                match self.on_error {
                    OnPolicyError::Continue => {
                        tracing::warn!(
                            "{message}; the sweep goes on (on a policy error: continue)"
                        );
                        HookOutcome::proceed()
                    }
                    OnPolicyError::Stop => {
                        tracing::error!("{message}; the sweep stops (on a policy error: stop)");
                        HookOutcome::stop_on_failure(format!(
                            "policy error at stage {}: {message}",
                            done.label
                        ))
                    }
                }
            }
        };
        // A search stage found congested bounds the search; its sweep had
        // stopped already.
        record.stopped =
            matches!(outcome.decision, HookDecision::Stop { .. }) && done.refines.is_none();
        record.check_seconds = started.elapsed().as_secs_f64();
        outcome
            .with_margin(record.margin())
            .with_annotation(Judged { congestion: record })
    }
}

impl StageHook for CongestionCheck {
    type Annotation = Judged;

    /// A search stage starts once the server drained what the stage before
    /// left (requests this client abandoned at its drain timeout, which a
    /// server that does not abort on disconnect still serves; another
    /// client's): a lower level is not judged on an earlier level's queue.
    async fn before_search(&mut self, next: &NextSearch<'_>) -> Option<Stage> {
        next.level?;
        if let Some(source) = &self.source {
            wait_for_server_drain(source, self.server_drain_wait).await;
        }
        next.proposed()
    }

    async fn after_stage(&mut self, done: &FinishedStage<'_, Judged>) -> HookOutcome<Judged> {
        // A capacity-search stage is judged by the stop condition of the
        // sweep stage it refines.
        match self.stops.get(&done.refines.unwrap_or(done.index)).cloned() {
            Some(stop) => self.judge(done, &stop).await,
            None => HookOutcome::proceed(),
        }
    }
}

/// Polls `source` until no role has requests waiting, for at most `wait`.
/// A failed query reads 0 (fail-open, like a stage's signals).
async fn wait_for_server_drain(source: &SignalSource, wait: Duration) {
    drain(wait, DRAIN_POLL, || source.waiting_now()).await;
}

/// How often the wait for the server to drain asks again.
const DRAIN_POLL: Duration = Duration::from_millis(250);

/// Asks `waiting_now` every `poll` until no role has requests waiting, for
/// at most `wait` (zero: not at all); returns the roles still waiting when
/// it gave up (`decode 3`), none when the server drained.
async fn drain<F: Future<Output = StageSignals>>(
    wait: Duration,
    poll: Duration,
    mut waiting_now: impl FnMut() -> F,
) -> Vec<String> {
    if wait.is_zero() {
        return Vec::new();
    }
    let started = Instant::now();
    let mut said = false;
    loop {
        let now = waiting_now().await;
        let waiting: Vec<String> = now
            .roles
            .iter()
            .filter(|role| role.waiting_requests_p50 >= 0.5)
            .map(|role| format!("{} {}", role.role, role.waiting_requests_p50))
            .collect();
        if waiting.is_empty() {
            if said {
                tracing::info!(
                    "capacity search: the server drained in {:.1}s",
                    started.elapsed().as_secs_f64()
                );
            }
            return waiting;
        }
        if started.elapsed() >= wait {
            tracing::warn!(
                "capacity search: requests still waiting on the server after {} ({}): the \
                 search stage starts, and its verdict may carry that queue (a longer \
                 server drain wait gives it time)",
                humantime::format_duration(wait),
                waiting.join(", ")
            );
            return waiting;
        }
        if !said {
            tracing::info!(
                "capacity search: waiting (at most {}) for the requests waiting on the server \
                 to drain before the next stage: {}",
                humantime::format_duration(wait),
                waiting.join(", ")
            );
            said = true;
        }
        tokio::time::sleep(poll).await;
    }
}

/// One step's stop condition, ready to judge.
#[derive(Debug, Clone)]
struct Stop {
    condition: StopCondition,
    params: Vec<Param>,
    sweep: SweepRef,
}

/// Check every `until_congested(...)` call of `scenario` against `policy`
/// (each distinct call once: one call gives every stage of its list the
/// same condition): the checked parameters of each stage that carries a
/// condition, in step order, or every error at once.
pub fn check_stop_conditions(
    scenario: &Scenario,
    policy: &Policy,
) -> Result<Vec<Vec<Param>>, Vec<String>> {
    let mut checked: Vec<(&StopCondition, Result<Vec<Param>, String>)> = Vec::new();
    let mut positions = Vec::new();
    for (_, _, stop) in stop_steps(scenario) {
        let known = checked.iter().position(|(seen, _)| *seen == stop);
        positions.push(known.unwrap_or_else(|| {
            checked.push((stop, policy.check_params(stop).map_err(|e| e.to_string())));
            checked.len() - 1
        }));
    }
    let errors: Vec<String> = checked
        .iter()
        .filter_map(|(_, r)| r.as_ref().err().cloned())
        .collect();
    if !errors.is_empty() {
        return Err(errors);
    }
    Ok(positions
        .into_iter()
        .map(|p| checked[p].1.clone().unwrap_or_default())
        .collect())
}

/// The sweep a judged stage belongs to: its `until_congested(...)` call
/// (each call is a sweep of its own), named after where it was called.
fn sweep_of(index: u32, stop: &StopCondition) -> SweepRef {
    SweepRef {
        index,
        name: stop
            .location
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_else(|| format!("sweep {index}")),
    }
}

/// `[decode] waiting_p50=40 ttft_p99=2.500s kv_usage_max=98.0% preemptions=3`,
/// with `no data` for a signal without series and `>=` before a lower bound.
fn describe_role(role: &RoleSignals, coverage: &RoleCoverage) -> String {
    let show = |signal: &str, text: String| match coverage.get(signal) {
        Some(c) if c.status.no_data() => "no data".to_string(),
        Some(c) if c.lower_bound => format!(">={text}"),
        _ => text,
    };
    format!(
        "[{}] waiting_p50={} ttft_p99={} kv_usage_max={} preemptions={}",
        role.role,
        show(
            "waiting_requests_p50",
            role.waiting_requests_p50.to_string()
        ),
        show("ttft_p99_seconds", seconds(role.ttft_p99_seconds)),
        show(
            "kv_cache_usage_max",
            format!("{:.1}%", role.kv_cache_usage_max * 100.0)
        ),
        show("preemptions", format!("{:.0}", role.preemptions))
    )
}

/// Seconds for the log: `2.500s`; a reading beyond any histogram (the
/// largest number) as `1.8e308s`, not 309 digits.
fn seconds(s: f64) -> String {
    if !s.is_finite() || s.abs() >= 1e12 {
        format!("{s:.1e}s")
    } else {
        format!("{s:.3}s")
    }
}

fn log_verdict(label: &str, verdict: &Verdict) {
    if verdict.congested {
        tracing::warn!("stage {label}: CONGESTED: {}", verdict.reasons.join("; "));
    } else if verdict.reasons.is_empty() {
        tracing::info!("stage {label}: not congested");
    } else {
        tracing::info!(
            "stage {label}: not congested ({})",
            verdict.reasons.join("; ")
        );
    }
}

/// The check's decisions, judged by the client-slo example policy (client
/// figures only: no signal source, no simulator). It says congested when
/// the client's TTFT p99 is over `ttft_p99` for `consecutive` stages in a
/// row; its component is built once per test binary, the built-in loads
/// precompiled.
#[cfg(test)]
mod tests {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use nyann_load::StageDetail;
    use nyann_load::stats::StageAccumulator;
    use nyann_model::{ClientStats, Value};
    use nyann_policy_host::{HostConfig, PolicyHost};

    use super::*;

    fn host() -> &'static PolicyHost {
        static HOST: OnceLock<PolicyHost> = OnceLock::new();
        // No code cache: tests must not touch the user's cache directory.
        HOST.get_or_init(|| {
            PolicyHost::new(HostConfig {
                cache_dir: None,
                ..HostConfig::default()
            })
            .unwrap()
        })
    }

    fn client_slo() -> Policy {
        static POLICY: OnceLock<Policy> = OnceLock::new();
        POLICY
            .get_or_init(|| {
                let wasm = nyann_guests::repository_guest("client-slo-policy")
                    .unwrap_or_else(|e| panic!("{e}"));
                host().load_file(&wasm).unwrap()
            })
            .clone()
    }

    /// A concurrency stage of `level` streams; with `stop: (sweep, N)`,
    /// judged by `until_congested(ttft_p99="1s", consecutive=N)`, the
    /// sweep's call, written at line `sweep + 1`.
    fn stage(level: u32, stop: Option<(u32, u32)>) -> serde_json::Value {
        let sweep = stop.map_or(0, |(sweep, _)| sweep);
        let stop = stop.map(|(sweep, consecutive)| {
            serde_json::json!({
                "params": [
                    {"name": "ttft_p99", "value": "1s"},
                    {"name": "consecutive", "value": consecutive},
                ],
                "location": {"file": "sweep.star", "line": sweep + 1, "column": 5},
            })
        });
        serde_json::json!({"stage": {
            "duration_s": 10.0, "mode": "concurrent", "concurrency": level,
            "stop": stop, "sweep": sweep,
        }})
    }

    fn scenario(steps: &[serde_json::Value]) -> Scenario {
        serde_json::from_value(serde_json::json!({
            "workload": {"type": "faker", "isl": 16, "osl": 16, "turns": 1},
            "steps": steps,
        }))
        .unwrap()
    }

    /// One sweep of two judged stages (4 and 8 streams) and a stage
    /// outside it, judged stage by stage (`consecutive=1`).
    fn one_sweep() -> Scenario {
        scenario(&[
            stage(4, Some((0, 1))),
            stage(8, Some((0, 1))),
            stage(16, None),
        ])
    }

    fn check(scenario: &Scenario, mode: PolicyMode, on_error: OnPolicyError) -> CongestionCheck {
        let settings = CheckSettings {
            mode,
            on_error,
            server_drain_wait: Duration::from_secs(3600),
        };
        CongestionCheck::new(scenario, client_slo(), None, settings).unwrap()
    }

    /// What the runner shows the hook of a finished stage.
    struct Finished {
        stage: Stage,
        client: ClientStats,
        detail: StageDetail,
        stats: StageAccumulator,
    }

    impl Finished {
        /// Step `index` of `scenario`, its client TTFT p99 `ttft`.
        fn step(scenario: &Scenario, index: usize, ttft: f64) -> Finished {
            let Step::Stage(stage) = &scenario.steps[index] else {
                panic!("step {index} is a barrier")
            };
            Finished {
                stage: stage.clone(),
                client: ClientStats {
                    requests_ok: 100,
                    ttft_p99_seconds: ttft,
                    ..ClientStats::default()
                },
                detail: StageDetail::default(),
                stats: StageAccumulator::default(),
            }
        }

        fn shown(&self, index: usize, refines: Option<usize>) -> FinishedStage<'_, Judged> {
            FinishedStage {
                index,
                stage: &self.stage,
                label: "#stage",
                start_unix: 1_700_000_000.0,
                end_unix: 1_700_000_010.0,
                client: &self.client,
                detail: &self.detail,
                stats: &self.stats,
                history: &[],
                refines,
            }
        }
    }

    /// Judges step `index` (or, with `refines`, a search stage past the
    /// steps refining that step) with client TTFT p99 `ttft`.
    async fn judge(
        check: &mut CongestionCheck,
        scenario: &Scenario,
        index: usize,
        refines: Option<usize>,
        ttft: f64,
    ) -> (HookOutcome<Judged>, Option<CongestionRecord>) {
        let finished = Finished::step(scenario, refines.unwrap_or(index), ttft);
        let outcome = check.after_stage(&finished.shown(index, refines)).await;
        let record = outcome.annotation.clone().map(|a| a.congestion);
        (outcome, record)
    }

    /// Makes the policy's `judge` fail for step `index`'s condition: it
    /// refuses `consecutive=0` (which its `validate` refused up front), as
    /// a policy with a bug in `judge` would fail.
    fn break_judge(check: &mut CongestionCheck, index: usize) {
        let stop = check.stops.get_mut(&index).unwrap();
        let consecutive = stop
            .params
            .iter_mut()
            .find(|p| p.name == "consecutive")
            .unwrap();
        consecutive.value = Value::Integer(0);
    }

    fn stopped_with(outcome: &HookOutcome<Judged>) -> Option<&str> {
        match &outcome.decision {
            HookDecision::Stop { reason } => Some(reason),
            HookDecision::Continue => None,
        }
    }

    #[tokio::test]
    async fn enforce_stops_on_a_congested_verdict_monitor_only_records_it() {
        let scenario = one_sweep();
        let mut enforce = check(&scenario, PolicyMode::Enforce, OnPolicyError::Continue);
        let (calm, record) = judge(&mut enforce, &scenario, 0, None, 0.5).await;
        let record = record.unwrap();
        assert_eq!(stopped_with(&calm), None);
        assert_eq!(record.verdict.map(|v| v.congested), Some(false));
        assert!(!record.stopped);

        let (congested, record) = judge(&mut enforce, &scenario, 1, None, 2.5).await;
        let record = record.unwrap();
        let reason = stopped_with(&congested).unwrap();
        assert!(reason.starts_with("congested: client SLO"), "{reason}");
        assert!(congested.congested, "a congested stop may start a search");
        assert!(record.stopped);
        assert_eq!(record.mode, PolicyMode::Enforce);
        assert_eq!(record.policy.name, "client-slo");

        let mut monitor = check(&scenario, PolicyMode::Monitor, OnPolicyError::Continue);
        let (watched, record) = judge(&mut monitor, &scenario, 1, None, 2.5).await;
        let record = record.unwrap();
        assert_eq!(stopped_with(&watched), None, "monitor never stops");
        assert!(!watched.congested);
        let verdict = record.verdict.unwrap();
        assert!(verdict.congested, "the verdict is recorded all the same");
        assert!(!record.stopped);
        assert_eq!(record.mode, PolicyMode::Monitor);
    }

    /// A policy call that fails (here: parameters the policy's `judge`
    /// refuses, as a buggy policy would) is recorded; the sweep goes on or
    /// stops as asked, and such a stop is no congestion to search from.
    #[tokio::test]
    async fn a_failed_policy_call_continues_or_stops_as_asked() {
        let scenario = one_sweep();
        for on_error in [OnPolicyError::Continue, OnPolicyError::Stop] {
            let mut check = check(&scenario, PolicyMode::Enforce, on_error);
            break_judge(&mut check, 0);
            // Congested figures: only the failure decides.
            let (outcome, record) = judge(&mut check, &scenario, 0, None, 2.5).await;
            let record = record.unwrap();
            let error = record.policy_error.as_deref().unwrap();
            assert!(
                error.contains("consecutive must be from 1 to 100"),
                "{error}"
            );
            assert_eq!(record.verdict, None);
            assert!(!outcome.congested);
            match on_error {
                OnPolicyError::Continue => {
                    assert_eq!(stopped_with(&outcome), None);
                    assert!(!record.stopped);
                }
                OnPolicyError::Stop => {
                    let reason = stopped_with(&outcome).unwrap();
                    assert!(
                        reason.starts_with("policy error at stage #stage: "),
                        "{reason}"
                    );
                    assert!(record.stopped);
                }
            }
        }
    }

    /// A capacity-search stage (past the steps, refining a sweep stage) is
    /// judged by that stage's condition; a congested verdict or a failed
    /// call stops it (bounding the search) but never marks the stage as
    /// the one that stopped its sweep, which had stopped already.
    #[tokio::test]
    async fn search_stages_never_mark_their_sweep_stopped() {
        let scenario = one_sweep();
        let search = scenario.steps.len();
        let mut enforce = check(&scenario, PolicyMode::Enforce, OnPolicyError::Stop);
        let (congested, record) = judge(&mut enforce, &scenario, search, Some(1), 2.5).await;
        let record = record.unwrap();
        assert!(stopped_with(&congested).is_some() && congested.congested);
        assert_eq!(record.verdict.map(|v| v.congested), Some(true));
        assert!(!record.stopped);
        let (calm, record) = judge(&mut enforce, &scenario, search + 1, Some(1), 0.5).await;
        assert_eq!(stopped_with(&calm), None);
        assert!(!record.unwrap().stopped);

        break_judge(&mut enforce, 1);
        let (failed, record) = judge(&mut enforce, &scenario, search + 2, Some(1), 2.5).await;
        let record = record.unwrap();
        assert!(record.policy_error.is_some());
        assert!(stopped_with(&failed).is_some() && !failed.congested);
        assert!(!record.stopped);
    }

    #[tokio::test]
    async fn a_stage_without_a_stop_condition_is_not_judged() {
        let scenario = one_sweep();
        let mut check = check(&scenario, PolicyMode::Enforce, OnPolicyError::Stop);
        let (outcome, record) = judge(&mut check, &scenario, 2, None, 9.0).await;
        assert_eq!(outcome, HookOutcome::proceed());
        assert_eq!(record, None);
        assert!(check.history.is_empty(), "nothing shown to the policy");
    }

    /// Each `until_congested(...)` call is a sweep of its own: the policy's
    /// history holds that sweep's stages only. With `consecutive=2`, a
    /// slow stage is congested only after a slow stage below it in its own
    /// sweep: the slow 2 streams of the other sweep do not count.
    #[tokio::test]
    async fn each_sweep_has_its_own_history() {
        let scenario = scenario(&[
            stage(4, Some((0, 2))),
            stage(8, Some((0, 2))),
            stage(2, Some((1, 2))),
        ]);
        let mut check = check(&scenario, PolicyMode::Enforce, OnPolicyError::Stop);
        let (other, record) = judge(&mut check, &scenario, 2, None, 2.5).await;
        assert_eq!(stopped_with(&other), None, "one slow stage of two");
        assert_eq!(record.unwrap().sweep.name, "sweep.star:2:5");
        let (first, record) = judge(&mut check, &scenario, 0, None, 2.5).await;
        assert_eq!(
            stopped_with(&first),
            None,
            "the other sweep's slow stage does not count"
        );
        assert_eq!(record.unwrap().sweep.index, 0);
        let (second, _) = judge(&mut check, &scenario, 1, None, 2.5).await;
        let reason = stopped_with(&second).unwrap();
        assert!(reason.contains("2 stages in a row"), "{reason}");
        assert_eq!(check.history[&0].len(), 2);
        assert_eq!(check.history[&1].len(), 1);
    }

    /// Only a policy that judges client figures alone runs without server
    /// signals; the built-in reads them, and the error names the call.
    #[test]
    fn a_policy_that_reads_server_signals_needs_a_source() {
        let scenario = one_sweep();
        let settings = CheckSettings {
            mode: PolicyMode::Enforce,
            on_error: OnPolicyError::Continue,
            server_drain_wait: Duration::ZERO,
        };
        assert!(!client_slo().info().server_signals);
        let builtin = host().load_builtin().unwrap();
        let Err(error) = CongestionCheck::new(&scenario, builtin, None, settings) else {
            panic!("the built-in judged without server signals");
        };
        assert!(
            matches!(&error, CheckError::NoSignalSource { at: Some(at) } if at == "sweep.star:1:5"),
            "{error}"
        );
    }

    /// Without a signal source there is nothing to wait for: the search
    /// stage the bisection proposes starts at once (the wait is an hour).
    #[tokio::test]
    async fn without_a_source_a_search_stage_starts_at_once() {
        let scenario = one_sweep();
        let mut check = check(&scenario, PolicyMode::Enforce, OnPolicyError::Continue);
        let Step::Stage(like) = &scenario.steps[1] else {
            unreachable!()
        };
        let next = |level| NextSearch {
            slot: 3,
            refines: 1,
            like,
            level,
        };
        let started = Instant::now();
        let stage = check.before_search(&next(Some(6.0))).await.unwrap();
        assert_eq!(stage.concurrency, Some(6));
        assert!(stage.stop.is_some(), "judged like the stage it refines");
        assert_eq!(check.before_search(&next(None)).await, None);
        assert!(started.elapsed() < Duration::from_secs(1));
    }

    /// What a source answers while `decode` has `waiting` requests queued.
    fn waiting(waiting: f64) -> StageSignals {
        StageSignals {
            roles: vec![
                RoleSignals {
                    role: "prefill".into(),
                    ..RoleSignals::default()
                },
                RoleSignals {
                    role: "decode".into(),
                    waiting_requests_p50: waiting,
                    ..RoleSignals::default()
                },
            ],
            ..StageSignals::default()
        }
    }

    /// The wait for the server to drain asks until no role has a request
    /// waiting (under half a request counts as none), gives up after its
    /// limit naming the roles still waiting, and asks nothing when the
    /// limit is zero.
    #[tokio::test]
    async fn the_drain_wait_ends_when_the_server_drained_or_at_its_limit() {
        let poll = Duration::from_millis(4);
        let asked = AtomicUsize::new(0);
        // Waiting requests 3, 2, 1, 0.4: drained at the fourth answer.
        let draining = || {
            let n = asked.fetch_add(1, Ordering::SeqCst);
            std::future::ready(waiting([3.0, 2.0, 1.0, 0.4][n.min(3)]))
        };
        let left = drain(Duration::from_secs(60), poll, draining).await;
        assert_eq!(left, Vec::<String>::new());
        assert_eq!(asked.load(Ordering::SeqCst), 4);

        let asked = AtomicUsize::new(0);
        let stuck = || {
            asked.fetch_add(1, Ordering::SeqCst);
            std::future::ready(waiting(7.0))
        };
        let limit = Duration::from_millis(40);
        let started = Instant::now();
        let left = drain(limit, poll, stuck).await;
        assert_eq!(left, vec!["decode 7".to_string()]);
        assert!(started.elapsed() >= limit);
        let asks = asked.load(Ordering::SeqCst);
        // One ask per poll (sleeps may run late), not a busy loop.
        assert!(
            (2..=11).contains(&asks),
            "{asks} asks in {limit:?}, one per {poll:?}"
        );

        let asked = AtomicUsize::new(0);
        let left = drain(Duration::ZERO, poll, || {
            asked.fetch_add(1, Ordering::SeqCst);
            std::future::ready(waiting(7.0))
        })
        .await;
        assert!(left.is_empty());
        assert_eq!(asked.load(Ordering::SeqCst), 0, "a zero wait asks nothing");
    }
}
