//! The leader's stage gate: the runner's [`StageHook`] around the
//! congestion check. Each stage starts when every live worker is ready,
//! each measured stage is judged on the whole fleet's statistics (at the
//! level that ran), the decision reaches every worker before the next
//! stage, a capacity search bisects the fleet's levels, and at the end the
//! workers' uploads are awaited for the merge.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use nyann_load::runner::search::{highest_below, level};
use nyann_load::{
    Bounds, CancellationToken, FinishedStage, HookDecision, HookOutcome, NextSearch, Search,
    StageHook, Vote,
};
use nyann_model::{Scenario, Stage, Step};
use tokio::sync::mpsc;

use super::{Event, Fleet};
use crate::lock;
use crate::merge::{FleetRun, Judgement, WorkerRun};
use crate::protocol::ToWorker;
use crate::share::{level_of, search_share};

/// How long the leader waits for a worker whose upload's connection broke
/// to reconnect and try again (its retries come after 1 s and 2 s).
const RETRY_WINDOW: Duration = Duration::from_secs(15);

/// The runner's hook on the leader, around the congestion check `inner`.
pub struct LeaderGate<H> {
    pub(super) inner: H,
    pub(super) fleet: Arc<Fleet>,
    pub(super) events: mpsc::Receiver<Event>,
    /// Workers 1..N still taking part in the stages.
    pub(super) live: BTreeSet<usize>,
    /// Workers 1..N whose upload is still expected on an open link.
    pub(super) awaiting: BTreeSet<usize>,
    /// Workers whose upload's link broke, until when a retry may come.
    pub(super) retrying: BTreeMap<usize, tokio::time::Instant>,
    /// The last failed upload of each worker without a successful one.
    pub(super) failed: BTreeMap<usize, WorkerRun>,
    /// Uploads received so far.
    pub(super) runs: Vec<WorkerRun>,
    /// What each judged stage's decision saw, by step.
    pub(super) judgements: BTreeMap<usize, Judgement>,
    /// Per step: the workers told to start it (0 included).
    pub(super) started: BTreeMap<usize, BTreeSet<usize>>,
    /// Per measured step: the workers whose statistics of it arrived (0 included).
    pub(super) finished: BTreeMap<usize, BTreeSet<usize>>,
    /// The whole fleet's scenario: the judge sees the fleet's stage (its
    /// concurrency or rate), not the leader's share of it. Capacity-search
    /// stages are added after the steps as they start (here and in every
    /// share), so that a search stage is looked up like a step.
    pub(super) scenario: Scenario,
    /// Each worker's share of it.
    pub(super) shares: Vec<Scenario>,
    /// Per sweep, the fleet levels judged not congested so far.
    pub(super) clean: BTreeMap<u32, Vec<f64>>,
    /// The capacity search under way, in the fleet's levels.
    pub(super) search: Option<Search>,
    pub(super) seed: u64,
    pub(super) workers: usize,
    pub(super) watch: CancellationToken,
    /// The shared-directory marker, removed at the end.
    pub(super) marker: PathBuf,
}

impl<H> LeaderGate<H> {
    /// Applies a link event to the gate's sets; returns the event when it
    /// is a stage answer (`Ready`, `Stats`) for the caller to look at.
    fn apply(&mut self, event: Event) -> Option<Event> {
        match event {
            Event::Gone { worker, connected } => {
                self.live.remove(&worker);
                if !connected {
                    self.awaiting.remove(&worker);
                }
                None
            }
            Event::Uploaded(run) => {
                self.live.remove(&run.worker);
                self.awaiting.remove(&run.worker);
                self.retrying.remove(&run.worker);
                self.failed.remove(&run.worker);
                self.runs.push(*run);
                None
            }
            Event::UploadFailed {
                worker,
                result,
                decision_waits,
                reason,
            } => {
                self.live.remove(&worker);
                self.failed.insert(
                    worker,
                    WorkerRun {
                        worker,
                        result: *result,
                        records: None,
                        records_error: Some(reason),
                        decision_waits,
                    },
                );
                None
            }
            Event::LinkEnded { worker } => {
                self.live.remove(&worker);
                if self.awaiting.remove(&worker) {
                    self.retrying
                        .insert(worker, tokio::time::Instant::now() + RETRY_WINDOW);
                }
                None
            }
            Event::Rejoined { worker } => {
                self.retrying.remove(&worker);
                self.awaiting.insert(worker);
                None
            }
            event @ (Event::Ready { .. } | Event::Stats { .. }) => Some(event),
        }
    }

    /// Waits until every live worker sent a stage answer `wanted` accepts
    /// (or is gone, or uploaded: it ended); returns those answers.
    async fn collect(&mut self, wanted: impl Fn(&Event) -> bool) -> Vec<Event> {
        let mut found = Vec::new();
        let mut answered = BTreeSet::new();
        while self.live.iter().any(|w| !answered.contains(w)) {
            let Some(event) = self.events.recv().await else {
                // Every link task ended.
                self.live.clear();
                break;
            };
            if let Some(event) = self.apply(event)
                && wanted(&event)
            {
                if let Event::Ready { worker, .. } | Event::Stats { worker, .. } = &event {
                    answered.insert(*worker);
                }
                found.push(event);
            }
        }
        found
    }

    /// Why the run was aborted, if a lost worker aborted it.
    pub fn aborted(&self) -> Option<String> {
        lock(&self.fleet.aborted).clone()
    }

    /// The workers that ran step `index` from start to end (0 included):
    /// those told to start it, less those that departed in that step
    /// without delivering its statistics.
    fn present(&self, index: usize) -> Option<Vec<usize>> {
        let started = self.started.get(&index)?;
        let finished = self.finished.get(&index);
        let departed = lock(&self.fleet.departed);
        Some(
            started
                .iter()
                .copied()
                .filter(|&w| {
                    w == 0
                        || finished.is_some_and(|f| f.contains(&w))
                        || !departed.iter().any(|d| d.worker == w && d.step == index)
                })
                .collect(),
        )
    }

    /// After the leader's own run: waits (at most `timeout`) for the other
    /// workers' uploads and returns everything the merge needs.
    pub async fn finish<A>(
        mut self,
        own: nyann_load::RunResult<A>,
        own_records: Option<PathBuf>,
        timeout: Duration,
    ) -> FleetRun<A> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let now = tokio::time::Instant::now();
            self.retrying.retain(|_, until| *until > now);
            if self.awaiting.is_empty() && self.retrying.is_empty() {
                break;
            }
            if now >= deadline {
                for &worker in self.awaiting.iter().chain(self.retrying.keys()) {
                    tracing::error!("worker {worker}: no records upload within {timeout:?}");
                }
                break;
            }
            let wake = self
                .retrying
                .values()
                .copied()
                .min()
                .map_or(deadline, |t| t.min(deadline));
            tokio::select! {
                event = self.events.recv() => match event {
                    Some(event) => { self.apply(event); }
                    None => {
                        self.awaiting.clear();
                        self.retrying.clear();
                    }
                },
                _ = tokio::time::sleep_until(wake) => {}
            }
        }
        self.watch.cancel();
        let _ = std::fs::remove_file(&self.marker);
        let presence = (0..self.scenario.steps.len())
            .filter_map(|i| Some((i, self.present(i)?)))
            .collect();
        let uploaded: BTreeSet<usize> = self.runs.iter().map(|r| r.worker).collect();
        let mut runs = std::mem::take(&mut self.runs);
        runs.extend(
            std::mem::take(&mut self.failed)
                .into_values()
                .filter(|r| !uploaded.contains(&r.worker)),
        );
        runs.sort_by_key(|r| r.worker);
        let missing = (1..self.workers)
            .filter(|w| !runs.iter().any(|r| r.worker == *w))
            .collect();
        FleetRun {
            workers: self.workers,
            seed: self.seed,
            leader: own,
            leader_records: own_records,
            runs,
            judgements: std::mem::take(&mut self.judgements),
            departed: lock(&self.fleet.departed).clone(),
            missing,
            aborted: self.aborted(),
            presence,
            shares: std::mem::take(&mut self.shares),
            scenario: self.scenario.clone(),
        }
    }
}

impl<H> LeaderGate<H> {
    /// Follows the capacity search in the fleet's levels: a judged sweep
    /// stage (`ran`, at the level it ran) that was clean is a lower bound
    /// for its sweep; a congested one with `refine=` starts a search; a
    /// search stage (`refines`) moves its bounds, and one that could not be
    /// judged ends it.
    fn track_search<A>(&mut self, ran: &Stage, refines: Option<usize>, outcome: &HookOutcome<A>) {
        let Some(level) = level(ran) else {
            return;
        };
        let stopped = matches!(outcome.decision, HookDecision::Stop { .. });
        if refines.is_some() {
            let vote = |congested| Vote {
                congested,
                margin: outcome.margin,
            };
            match (&mut self.search, stopped, outcome.congested) {
                (Some(search), false, _) => search.judged(level, vote(false)),
                (Some(search), true, true) => search.judged(level, vote(true)),
                _ => self.search = None,
            }
            // The fleet's levels, said once the search has nothing left to
            // try (the leader's own runner knows only its share of them).
            if let Some(search) = self.search.as_ref().filter(|s| s.next().is_none()) {
                tracing::info!(
                    "capacity search: the fleet's highest level not congested {}, lowest congested {}",
                    search
                        .bounds
                        .clean
                        .map_or("none".to_string(), |l| l.to_string()),
                    search.bounds.congested
                );
            }
            return;
        }
        let Some(stop) = &ran.stop else { return };
        if !stopped {
            self.clean.entry(ran.sweep).or_default().push(level);
            return;
        }
        self.search = None;
        let Some(search) = stop.search.filter(|_| outcome.congested) else {
            return;
        };
        let clean = self
            .clean
            .get(&ran.sweep)
            .and_then(|levels| highest_below(levels.iter().copied(), level));
        let mut bounds = Bounds::new(clean, level, ran.concurrency.is_some(), search.resolution);
        if bounds.streams {
            // Every worker taking part needs one stream at least.
            bounds.floor = (self.live.len() + 1) as f64;
        }
        self.search = Some(Search::new(bounds, search.stages, search.confirm));
    }
}

impl<H: StageHook> StageHook for LeaderGate<H> {
    /// The check's own record: what the fleet adds (who was judged, lost
    /// workers, the per-worker figures) goes into the merged files.
    type Annotation = H::Annotation;

    async fn before_stage(&mut self, index: usize) {
        self.fleet.step.store(index, Ordering::SeqCst);
        self.collect(|e| matches!(e, Event::Ready { stage, .. } if *stage == index))
            .await;
        let mut started: BTreeSet<usize> = self.live.clone();
        started.insert(0);
        self.started.insert(index, started);
        self.fleet.broadcast(&ToWorker::Start { stage: index });
    }

    /// The fleet bisects the fleet's levels (the levels its stages were
    /// judged at); each worker runs its share of the level, the workers
    /// still taking part dividing it.
    async fn before_search(&mut self, next: &NextSearch<'_>) -> Option<Stage> {
        let slot = next.slot;
        self.fleet.step.store(slot, Ordering::SeqCst);
        self.collect(|e| matches!(e, Event::Ready { stage, .. } if *stage == slot))
            .await;
        let workers: Vec<usize> = std::iter::once(0)
            .chain(self.live.iter().copied())
            .collect();
        let like = match self.scenario.steps.get(next.refines) {
            Some(Step::Stage(stage)) => stage.clone(),
            _ => next.like.clone(),
        };
        let fleet_next = NextSearch {
            slot,
            refines: next.refines,
            like: &like,
            level: self.search.as_ref().and_then(Search::next),
        };
        // Search stages are looked up like steps: the next one's index is
        // the number of steps so far.
        let stage = match fleet_next.level {
            Some(_) if self.scenario.steps.len() == slot => {
                // The check's wait for the server to drain comes before
                // any worker starts.
                self.inner.before_search(&fleet_next).await
            }
            Some(_) => {
                tracing::error!(
                    "capacity search: stage {slot} does not follow the {} known: the search ends",
                    self.scenario.steps.len()
                );
                None
            }
            None => None,
        };
        let level = stage.as_ref().and_then(level);
        let label = stage.as_ref().map(|s| s.label(slot)).unwrap_or_default();
        self.fleet.broadcast(&ToWorker::Search {
            stage: slot,
            level,
            workers: workers.clone(),
            label: label.clone(),
        });
        let (stage, level) = (stage?, level?);
        for (worker, share) in self.shares.iter_mut().enumerate() {
            let part = search_share(&stage, level, &workers, worker).unwrap_or_else(|| Stage {
                concurrency: stage.concurrency.map(|_| 0),
                rate: stage.rate.map(|_| 0.0),
                ..stage.clone()
            });
            share.steps.push(Step::Stage(part));
        }
        self.scenario.steps.push(Step::Stage(stage));
        self.started.insert(slot, workers.iter().copied().collect());
        let mut own = search_share(next.like, level, &workers, 0)?;
        own.name = Some(label);
        own.warmup = false;
        Some(own)
    }

    async fn after_stage(
        &mut self,
        done: &FinishedStage<'_, H::Annotation>,
    ) -> HookOutcome<H::Annotation> {
        let index = done.index;
        let answers = self
            .collect(|e| matches!(e, Event::Stats { stage, .. } if *stage == index))
            .await;
        let mut merged = done.stats.clone();
        let mut judged = vec![0];
        for answer in answers {
            if let Event::Stats { worker, stats, .. } = answer {
                merged.merge(&stats);
                judged.push(worker);
            }
        }
        judged.sort_unstable();
        self.finished
            .insert(index, judged.iter().copied().collect());
        let (client, detail) = merged.finish(done.end_unix - done.start_unix);
        // The policy judges the level that ran: the shares of the workers
        // whose statistics it sees, which is the configured level only when
        // every worker ran the whole stage.
        let mut ran: Stage = match self.scenario.steps.get(index) {
            Some(Step::Stage(fleet_stage)) => fleet_stage.clone(),
            _ => done.stage.clone(),
        };
        if judged.len() < self.workers {
            let (concurrency, rate) = level_of(&self.shares, &judged, index);
            tracing::warn!(
                "stage {}: only workers {judged:?} of {} ran it whole: it is judged at the \
                 level they ran ({})",
                done.label,
                self.workers,
                match (concurrency, rate) {
                    (_, Some(r)) => format!("rate={r}"),
                    (Some(c), None) => format!("c={c}"),
                    (None, None) => "-".into(),
                }
            );
            ran.concurrency = concurrency;
            ran.rate = rate;
        }
        let fleet_stage = FinishedStage {
            index,
            stage: &ran,
            label: done.label,
            start_unix: done.start_unix,
            end_unix: done.end_unix,
            client: &client,
            detail: &detail,
            stats: &merged,
            history: done.history,
            refines: done.refines,
        };
        let outcome = self.inner.after_stage(&fleet_stage).await;
        self.track_search(&ran, done.refines, &outcome);
        let stop = match &outcome.decision {
            HookDecision::Stop { reason } => Some(reason.clone()),
            HookDecision::Continue => None,
        };
        self.fleet
            .broadcast(&ToWorker::Decision { stage: index, stop });
        self.judgements.insert(
            index,
            Judgement {
                judged_workers: judged,
                requests_judged: client.requests_ok + client.requests_failed,
            },
        );
        outcome
    }
}
