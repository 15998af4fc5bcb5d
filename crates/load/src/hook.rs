//! The seam between the load and whatever judges a finished stage (the
//! congestion check): [`StageHook`].
//!
//! The runner calls [`StageHook::after_stage`] once per finished measured
//! stage (never for warm-up stages or barriers), after every request sent in
//! that stage has completed and BEFORE the next stage starts. Meanwhile the
//! load holds the finished stage's level (same concurrency or arrival rate),
//! so the server stays in the steady state the stage measured; requests sent
//! in that gap are recorded with phase `hold` and count in no stage. A
//! [`HookDecision::Stop`] ends the stage's sweep (the stages of its
//! `until_congested(...)` call; for a stage outside any sweep: the run): the
//! finished stage keeps its result and every step it skips is recorded as
//! skipped with the reason.

use std::fmt::Debug;
use std::future::Future;

use nyann_model::{ClientStats, Stage};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::result::StageResult;
use crate::stats::{StageAccumulator, StageDetail};

/// What the hook is shown about a finished stage (`A`: what the hook
/// records with a stage, see [`StageHook::Annotation`]).
#[derive(Debug)]
pub struct FinishedStage<'a, A = serde_json::Value> {
    /// Position in the scenario's steps (0-based, barriers counted).
    pub index: usize,
    pub stage: &'a Stage,
    /// The stage's label in tables (`Stage::label`).
    pub label: &'a str,
    /// When the stage started and ended (unix seconds): the window in which
    /// its requests were sent.
    pub start_unix: f64,
    pub end_unix: f64,
    pub client: &'a ClientStats,
    pub detail: &'a StageDetail,
    /// The histograms behind `client` and `detail`, mergeable with other
    /// workers' (a fleet judges the sum of its workers).
    pub stats: &'a StageAccumulator,
    /// Results of the earlier steps, in order.
    pub history: &'a [StageResult<A>],
    /// A capacity-search stage (`index` past the scenario's steps): the
    /// sweep stage whose stop condition judges it.
    pub refines: Option<usize>,
}

/// The next stage of a capacity search (`refine=`), as the runner's own
/// bisection sees it; [`StageHook::before_search`] decides what runs.
#[derive(Debug)]
pub struct NextSearch<'a> {
    /// The search stage's index (past the scenario's steps).
    pub slot: usize,
    /// The congested sweep stage it refines (its index), whose shape
    /// (duration, mode, workload) every search stage keeps.
    pub refines: usize,
    pub like: &'a Stage,
    /// The level the bisection tries next (concurrency, or rate); `None`
    /// when its bounds are adjacent or the last stage could not be judged.
    pub level: Option<f64>,
}

impl NextSearch<'_> {
    /// The stage the bisection proposes: the refined one at `level`.
    pub fn proposed(&self) -> Option<Stage> {
        self.level.map(|level| self.at(level))
    }

    /// The refined stage at `level`: unnamed and measured.
    pub fn at(&self, level: f64) -> Stage {
        let mut stage = Stage {
            name: None,
            warmup: false,
            ..self.like.clone()
        };
        if stage.concurrency.is_some() {
            // Levels of streams are whole (the bisection floors them).
            stage.concurrency = Some(level as u32);
        } else {
            stage.rate = Some(level);
        }
        stage
    }
}

/// Whether the sweep goes on.
#[derive(Debug, Clone, PartialEq)]
pub enum HookDecision {
    Continue,
    /// Skip every later step; `reason` is recorded with each of them.
    Stop {
        reason: String,
    },
}

/// The hook's answer: a decision plus an optional annotation stored with the
/// stage's result (for example the policy's verdict and the server signals).
#[derive(Debug, Clone, PartialEq)]
pub struct HookOutcome<A = serde_json::Value> {
    pub decision: HookDecision,
    pub annotation: Option<A>,
    /// With a stop: whether the stage's level was too much for the server
    /// (a capacity search may follow), rather than a failure to judge it.
    pub congested: bool,
    /// How far the verdict was from flipping (relative; positive over the
    /// thresholds), when the judge can say: a capacity search with
    /// `confirm=` judges a level again when it is within
    /// [`CLOSE_CALL`](crate::CLOSE_CALL).
    pub margin: Option<f64>,
}

impl<A> HookOutcome<A> {
    /// Go on, with nothing to record.
    pub fn proceed() -> Self {
        HookOutcome {
            decision: HookDecision::Continue,
            annotation: None,
            congested: false,
            margin: None,
        }
    }

    /// Stop the sweep after this stage: it was congested.
    pub fn stop(reason: impl Into<String>) -> Self {
        HookOutcome {
            decision: HookDecision::Stop {
                reason: reason.into(),
            },
            annotation: None,
            congested: true,
            margin: None,
        }
    }

    /// Stop the sweep after this stage because it could not be judged (a
    /// failed policy call): no capacity is searched from it.
    pub fn stop_on_failure(reason: impl Into<String>) -> Self {
        HookOutcome {
            congested: false,
            ..HookOutcome::stop(reason)
        }
    }

    pub fn with_annotation(mut self, annotation: A) -> Self {
        self.annotation = Some(annotation);
        self
    }

    pub fn with_margin(mut self, margin: Option<f64>) -> Self {
        self.margin = margin;
        self
    }
}

/// Called after each finished measured stage. Implement it with an `async fn`:
///
/// ```
/// use nyann_load::{FinishedStage, HookOutcome, StageHook};
/// struct StopAfterTwo;
/// impl StageHook for StopAfterTwo {
///     type Annotation = serde_json::Value;
///     async fn after_stage(&mut self, done: &FinishedStage<'_>) -> HookOutcome {
///         if done.index >= 1 { HookOutcome::stop("two stages are enough") } else { HookOutcome::proceed() }
///     }
/// }
/// ```
///
/// Ctrl-C or an abort while the hook runs drops its future.
pub trait StageHook: Send {
    /// Called before each stage starts (warm-up or measured, not barriers);
    /// the stage starts when it returns. Alone, a process starts at once;
    /// one of several workers waits for the coordinator's start (the
    /// previous stage's level is held meanwhile).
    fn before_stage(&mut self, index: usize) -> impl Future<Output = ()> + Send {
        let _ = index;
        std::future::ready(())
    }

    /// Called before each capacity-search stage (after the requests of the
    /// stage before it ended): returns the stage to run, or `None` to end
    /// the search. By default, the bisection's next level. A congestion
    /// check first waits for the server to drain what the stage before
    /// left; a fleet's leader bisects the fleet's levels and tells every
    /// worker its share.
    fn before_search(
        &mut self,
        next: &NextSearch<'_>,
    ) -> impl Future<Output = Option<Stage>> + Send {
        std::future::ready(next.proposed())
    }

    /// What the hook records with a stage it judged: stored typed in the
    /// stage's result (and under `annotation` in `stages.json`).
    type Annotation: Serialize + DeserializeOwned + Debug + Clone + PartialEq + Send + Sync;

    fn after_stage(
        &mut self,
        done: &FinishedStage<'_, Self::Annotation>,
    ) -> impl Future<Output = HookOutcome<Self::Annotation>> + Send;
}

/// The hook that always continues.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoHook;

impl StageHook for NoHook {
    type Annotation = serde_json::Value;
    async fn after_stage(&mut self, _done: &FinishedStage<'_>) -> HookOutcome {
        HookOutcome::proceed()
    }
}

/// An optional hook: `None` always continues.
impl<H: StageHook> StageHook for Option<H> {
    type Annotation = H::Annotation;
    async fn before_stage(&mut self, index: usize) {
        if let Some(hook) = self {
            hook.before_stage(index).await;
        }
    }

    async fn before_search(&mut self, next: &NextSearch<'_>) -> Option<Stage> {
        match self {
            Some(hook) => hook.before_search(next).await,
            None => next.proposed(),
        }
    }

    async fn after_stage(
        &mut self,
        done: &FinishedStage<'_, H::Annotation>,
    ) -> HookOutcome<H::Annotation> {
        match self {
            Some(hook) => hook.after_stage(done).await,
            None => HookOutcome::proceed(),
        }
    }
}

impl<H: StageHook> StageHook for &mut H {
    type Annotation = H::Annotation;

    fn before_stage(&mut self, index: usize) -> impl Future<Output = ()> + Send {
        (**self).before_stage(index)
    }

    fn before_search(
        &mut self,
        next: &NextSearch<'_>,
    ) -> impl Future<Output = Option<Stage>> + Send {
        (**self).before_search(next)
    }

    fn after_stage(
        &mut self,
        done: &FinishedStage<'_, H::Annotation>,
    ) -> impl Future<Output = HookOutcome<H::Annotation>> + Send {
        (**self).after_stage(done)
    }
}
