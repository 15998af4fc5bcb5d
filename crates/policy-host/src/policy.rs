//! A loaded policy: checking `until_congested(...)` parameters against it
//! and calling `judge`, each call in a fresh sandboxed instance bounded in
//! fuel, time, memory and output.

use std::sync::Arc;
use std::time::{Duration, Instant};

use nyann_model::observation::{FiredRule, PolicyInfo, StageObservation, Verdict};
use nyann_model::scenario::{Param, StopCondition};
use wasmtime::{Engine, Store};

use crate::bounded::{self, Unfinished};
use crate::digest::ComponentDigest;
use crate::error::{CallFailure, PolicyError, human_bytes, printable, truncate};
use crate::params;
use crate::sandbox::{self, Budget, CallOutput, CallStore, CallWorld, HostState, Limits};
use crate::versions::{Interface, Pre};

/// How much longer than its wall-clock limit the host waits for a call
/// before abandoning it: the epoch deadline stops guest code at the limit,
/// so only a call stuck outside the guest's code gets this far.
const ABANDON_GRACE: Duration = Duration::from_secs(1);

/// A loaded policy. Cheap to clone; calls may run concurrently.
#[derive(Clone)]
pub struct Policy {
    pub(crate) inner: Arc<PolicyInner>,
    pub(crate) info: Arc<PolicyInfo>,
    /// `info.name`, shared with every call's log sink.
    pub(crate) name: Arc<str>,
    pub(crate) code_source: CodeSource,
    pub(crate) digest: ComponentDigest,
    /// What `describe` wrote at load.
    pub(crate) load_output: Arc<CallOutput>,
}

/// Where a loaded policy's machine code came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CodeSource {
    /// The artifact shipped in the binary (the built-in only).
    Precompiled,
    /// The code cache on disk.
    Cached,
    /// Compiled by this load.
    Compiled,
}

pub(crate) struct PolicyInner {
    pub(crate) engine: Engine,
    pub(crate) pre: Pre,
    pub(crate) origin: String,
    pub(crate) limits: Limits,
    pub(crate) judge: Budget,
    pub(crate) load: Budget,
    pub(crate) max_reasons: usize,
    pub(crate) max_reason_bytes: usize,
}

impl std::fmt::Debug for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Policy")
            .field("name", &self.info.name)
            .field("origin", &self.inner.origin)
            .finish()
    }
}

impl Policy {
    /// What `describe()` returned at load.
    pub fn info(&self) -> &PolicyInfo {
        &self.info
    }

    /// The policy's name (from `describe()`), used in every message.
    pub fn name(&self) -> &str {
        &self.info.name
    }

    /// `builtin` or the file it was loaded from.
    pub fn origin(&self) -> &str {
        &self.inner.origin
    }

    /// The interface line the component implements.
    pub fn interface(&self) -> Interface {
        self.inner.pre.interface()
    }

    /// Where its machine code came from.
    pub fn code_source(&self) -> CodeSource {
        self.code_source
    }

    /// The SHA-256 of the component's bytes: what judged, whatever its
    /// name, version or file.
    pub fn digest(&self) -> ComponentDigest {
        self.digest
    }

    /// Check one `until_congested(...)` call's parameters: against
    /// `describe()` (unknown name, duplicate, missing required, wrong kind;
    /// defaults filled, durations converted to seconds), then the policy's
    /// own `validate()`. Errors point at the offending keyword when they
    /// name one, else at the call. Returns the parameters to pass to
    /// [`Policy::judge`].
    pub fn check_params(&self, stop: &StopCondition) -> Result<Vec<Param>, PolicyError> {
        self.check_params_with_output(stop).0
    }

    /// [`Policy::check_params`], and what `validate` wrote (nothing when
    /// the parameters were refused before it was called).
    pub fn check_params_with_output(
        &self,
        stop: &StopCondition,
    ) -> (Result<Vec<Param>, PolicyError>, CallOutput) {
        let params_err = |message: String| PolicyError::Params {
            policy: self.name().to_string(),
            location: params::offending(&stop.params, &message)
                .and_then(|name| stop.location_of(name))
                .or(stop.location.as_ref())
                .cloned(),
            message,
        };
        let params = match params::check(&self.info, &stop.params) {
            Ok(params) => params,
            Err(message) => return (Err(params_err(message)), CallOutput::default()),
        };
        let checked = params.clone();
        let world = CallWorld::at_load(1);
        let (result, output) = self.inner.call(
            &self.name,
            "validate",
            None,
            self.inner.load,
            world,
            move |s, p| p.validate(s, &checked),
        );
        let result = match result {
            Ok(Ok(())) => Ok(params),
            Ok(Err(msg)) => Err(params_err(truncate(
                &printable(&msg),
                self.inner.max_reason_bytes,
            ))),
            Err(err) => Err(params_err(format!(
                "the policy's validate() {}",
                err.failure().map(ToString::to_string).unwrap_or_default()
            ))),
        };
        (result, output)
    }

    /// Judge a finished stage: `params` from [`Policy::check_params`],
    /// `history` the earlier measured stages of the sweep, oldest first.
    /// Runs off the async runtime (a fresh instance on a worker thread of
    /// the host's, bounded in fuel, time and memory; the task awaits it,
    /// which needs Tokio's time driver). Errors read
    /// `policy <name>: <what happened> at stage <n>`.
    pub async fn judge(
        &self,
        params: &[Param],
        stage: &StageObservation,
        history: &[StageObservation],
    ) -> Result<Verdict, PolicyError> {
        self.judge_with_output(params, stage, history).await.0
    }

    /// [`Policy::judge`], and what the call wrote (stdout, stderr, log
    /// lines): `policy check` shows it.
    pub async fn judge_with_output(
        &self,
        params: &[Param],
        stage: &StageObservation,
        history: &[StageObservation],
    ) -> (Result<Verdict, PolicyError>, CallOutput) {
        let args = self.inner.pre.judge_args(params, stage, history);
        let (index, world) = (stage.index, CallWorld::of_stage(stage));
        let (result, output) = self
            .inner
            .call_async(
                &self.name,
                "judge",
                Some(index),
                self.inner.judge,
                world,
                move |s, p| p.judge(s, &args),
            )
            .await;
        (self.judged(index, result), output)
    }

    /// [`Policy::judge`] for synchronous callers (it blocks the calling
    /// thread until the verdict is in, at most the wall-clock backstop).
    pub fn judge_blocking(
        &self,
        params: &[Param],
        stage: &StageObservation,
        history: &[StageObservation],
    ) -> Result<Verdict, PolicyError> {
        let args = self.inner.pre.judge_args(params, stage, history);
        let (index, world) = (stage.index, CallWorld::of_stage(stage));
        let (result, _) = self.inner.call(
            &self.name,
            "judge",
            Some(index),
            self.inner.judge,
            world,
            move |s, p| p.judge(s, &args),
        );
        self.judged(index, result)
    }

    /// What `describe` wrote when the policy was loaded.
    pub fn load_output(&self) -> &CallOutput {
        &self.load_output
    }

    /// The verdict of a finished `judge` call, checked and made printable.
    fn judged(
        &self,
        index: u32,
        result: Result<Result<Verdict, String>, PolicyError>,
    ) -> Result<Verdict, PolicyError> {
        let verdict = result?.map_err(|msg| {
            self.call_error(
                index,
                CallFailure::Rejected(truncate(&msg, self.inner.max_reason_bytes)),
            )
        })?;
        self.check_verdict(&verdict)
            .map_err(|what| self.call_error(index, CallFailure::OversizedOutput(what)))?;
        // Reasons reach the stage table, the log and the stop line; rule
        // names the report.
        let text = |t: String| printable(&t).into_owned();
        Ok(Verdict {
            reasons: verdict.reasons.into_iter().map(text).collect(),
            fired: verdict
                .fired
                .into_iter()
                .map(|f| FiredRule {
                    rule: text(f.rule),
                    role: f.role.map(text),
                    signals: f.signals.into_iter().map(text).collect(),
                })
                .collect(),
            ..verdict
        })
    }

    /// Refuse a verdict larger than the limits: as many fired rules as
    /// reasons, as many signals per rule, every text within the reason size.
    fn check_verdict(&self, verdict: &Verdict) -> Result<(), String> {
        let (max_items, max_bytes) = (self.inner.max_reasons, self.inner.max_reason_bytes);
        let count = |what: &str, n: usize| {
            if n > max_items {
                Err(format!("{n} {what}; the limit is {max_items}"))
            } else {
                Ok(())
            }
        };
        let size = |what: String, text: &str| {
            if text.len() > max_bytes {
                Err(format!(
                    "{what} is {} bytes; the limit is {}",
                    text.len(),
                    human_bytes(max_bytes)
                ))
            } else {
                Ok(())
            }
        };
        count("reasons", verdict.reasons.len())?;
        for (i, reason) in verdict.reasons.iter().enumerate() {
            size(format!("reason {}", i + 1), reason)?;
        }
        count("fired rules", verdict.fired.len())?;
        for (i, fired) in verdict.fired.iter().enumerate() {
            let what = format!("fired rule {}", i + 1);
            count(&format!("signals in {what}"), fired.signals.len())?;
            for text in [&fired.rule]
                .into_iter()
                .chain(&fired.role)
                .chain(&fired.signals)
            {
                size(format!("a name in {what}"), text)?;
            }
        }
        Ok(())
    }

    fn call_error(&self, stage: u32, failure: CallFailure) -> PolicyError {
        PolicyError::Call {
            policy: self.name.to_string(),
            function: "judge",
            stage: Some(stage),
            failure,
        }
    }
}

impl CallWorld {
    /// What `describe` and `validate` see: the Unix epoch, a clock at zero,
    /// a fixed seed per function.
    pub(crate) fn at_load(function: u64) -> CallWorld {
        CallWorld {
            wall_unix_seconds: 0.0,
            monotonic_ns: 0,
            seed: sandbox::mix(function),
        }
    }

    /// What `judge` sees: the stage's own timeline, and a seed drawn from
    /// the stage's identity (the same stage always gets the same numbers).
    fn of_stage(stage: &StageObservation) -> CallWorld {
        let length = (stage.end_unix_seconds - stage.start_unix_seconds).max(0.0);
        CallWorld {
            wall_unix_seconds: stage.end_unix_seconds.max(0.0),
            monotonic_ns: (length * 1e9) as u64,
            seed: sandbox::mix(
                u64::from(stage.index)
                    ^ stage.end_unix_seconds.to_bits().rotate_left(17)
                    ^ u64::from(stage.sweep.index).rotate_left(41),
            ),
        }
    }
}

impl PolicyInner {
    /// Run one export in a fresh store and instance on a worker thread,
    /// bounded by `budget`; classify failures. Returns what the call wrote
    /// too (nothing when it was abandoned).
    pub(crate) fn call<R: Send + 'static>(
        self: &Arc<Self>,
        name: &Arc<str>,
        function: &'static str,
        stage: Option<u32>,
        budget: Budget,
        world: CallWorld,
        f: impl FnOnce(&mut Store<HostState>, &Pre) -> wasmtime::Result<R> + Send + 'static,
    ) -> (Result<R, PolicyError>, CallOutput) {
        let started = Instant::now();
        let (inner, policy) = (self.clone(), name.clone());
        let limit = budget.wall.saturating_add(ABANDON_GRACE);
        let outcome = bounded::run(limit, move || {
            inner.call_here(policy, function, budget, world, f)
        });
        call_outcome(outcome, name, function, stage, budget, started)
    }

    /// [`PolicyInner::call`] for an async caller: the task awaits the
    /// worker (no thread of the runtime's blocks, none is handed the call
    /// in between).
    async fn call_async<R: Send + 'static>(
        self: &Arc<Self>,
        name: &Arc<str>,
        function: &'static str,
        stage: Option<u32>,
        budget: Budget,
        world: CallWorld,
        f: impl FnOnce(&mut Store<HostState>, &Pre) -> wasmtime::Result<R> + Send + 'static,
    ) -> (Result<R, PolicyError>, CallOutput) {
        let started = Instant::now();
        let (inner, policy) = (self.clone(), name.clone());
        let limit = budget.wall.saturating_add(ABANDON_GRACE);
        let outcome = bounded::run_async(limit, move || {
            inner.call_here(policy, function, budget, world, f)
        })
        .await;
        call_outcome(outcome, name, function, stage, budget, started)
    }

    /// The body of [`PolicyInner::call`], on a worker thread. Returns the
    /// store too, for the worker to drop once the caller has the result.
    fn call_here<R>(
        &self,
        policy: Arc<str>,
        function: &str,
        budget: Budget,
        world: CallWorld,
        f: impl FnOnce(&mut Store<HostState>, &Pre) -> wasmtime::Result<R>,
    ) -> ((Result<R, CallFailure>, CallOutput), Option<CallStore>) {
        match CallStore::new(&self.engine, policy.clone(), &self.limits, budget, world) {
            Ok(mut cs) => {
                let result = self.call_in(&mut cs, &policy, function, budget, f);
                let output = cs.take_output();
                ((result, output), Some(cs))
            }
            Err(e) => (
                (
                    Err(CallFailure::Internal(format!(
                        "cannot create the store: {e:#}"
                    ))),
                    CallOutput::default(),
                ),
                None,
            ),
        }
    }

    /// Call `f` in the fresh store `cs`; log what the call left (dropped
    /// log lines, stdout and stderr, fuel used) and classify a failure.
    fn call_in<R>(
        &self,
        cs: &mut CallStore,
        policy: &str,
        function: &str,
        budget: Budget,
        f: impl FnOnce(&mut Store<HostState>, &Pre) -> wasmtime::Result<R>,
    ) -> Result<R, CallFailure> {
        let started = Instant::now();
        let result = f(&mut cs.store, &self.pre);
        let elapsed = started.elapsed();
        let dropped = cs.dropped_log_lines();
        if dropped > 0 {
            tracing::warn!(
                policy,
                "dropped {dropped} log line(s) over the {} per-call limit",
                human_bytes(self.limits.log_bytes)
            );
        }
        match result {
            Ok(value) => {
                for (name, text) in [("stdout", cs.stdout()), ("stderr", cs.stderr())] {
                    if !text.trim().is_empty() {
                        tracing::debug!(
                            policy,
                            "{function} wrote to {name}: {}",
                            truncate(&printable(text.trim()), 4096)
                        );
                    }
                }
                tracing::trace!(
                    policy,
                    "{function} used {} fuel in {elapsed:?}",
                    cs.fuel_used(budget)
                );
                Ok(value)
            }
            Err(err) => Err(cs.failure(&err, &self.limits, budget, elapsed)),
        }
    }
}

/// A call's result, or its failure classified, and what it wrote: a call
/// abandoned past its wall-clock limit (plus grace) missed its deadline.
fn call_outcome<R>(
    outcome: Result<(Result<R, CallFailure>, CallOutput), Unfinished>,
    name: &Arc<str>,
    function: &'static str,
    stage: Option<u32>,
    budget: Budget,
    started: Instant,
) -> (Result<R, PolicyError>, CallOutput) {
    let fail = |failure| PolicyError::Call {
        policy: name.to_string(),
        function,
        stage,
        failure,
    };
    match outcome {
        Ok((result, output)) => (result.map_err(fail), output),
        Err(Unfinished::Abandoned { .. }) => (
            Err(fail(CallFailure::Deadline {
                limit: budget.wall,
                elapsed: started.elapsed(),
            })),
            CallOutput::default(),
        ),
        Err(Unfinished::Failed(e)) => (Err(fail(CallFailure::Internal(e))), CallOutput::default()),
    }
}
