//! Scenarios, run options and a recording hook shared by the runner's
//! tests (stages, arrivals, conversations, failures, requests, startup).

use std::path::Path;
use std::time::Duration;

use nyann_load::{FinishedStage, HookOutcome, RunOptions, StageHook};
use nyann_model::{Mode, Scenario, Stage, Step, Workload, WorkloadType};

use super::TestServer;

pub fn concurrent(duration_s: f64, c: u32) -> Step {
    Step::Stage(Stage {
        concurrency: Some(c),
        ..Stage::new(duration_s, Mode::Concurrent)
    })
}

pub fn open(duration_s: f64, mode: Mode, rate: f64) -> Step {
    Step::Stage(Stage {
        rate: Some(rate),
        ..Stage::new(duration_s, mode)
    })
}

pub fn workload() -> Workload {
    Workload {
        kind: WorkloadType::Synthetic,
        isl: 16,
        osl: 4,
        turns: 1,
        chars_per_token: 4.0,
        ..Workload::default()
    }
}

pub fn scenario(steps: Vec<Step>) -> Scenario {
    Scenario {
        target: None,
        model: None,
        workload: workload(),
        steps,
    }
}

/// One stream that sends two requests, one after the other.
pub fn two_requests() -> Scenario {
    scenario(vec![Step::Stage(Stage {
        concurrency: Some(1),
        max_requests: 2,
        ..Stage::new(30.0, Mode::Concurrent)
    })])
}

pub fn options(server: &TestServer, dir: &Path) -> RunOptions {
    RunOptions {
        target: Some(server.base.clone()),
        seed: 7,
        ready_timeout: Duration::from_secs(5),
        grace: Duration::from_secs(2),
        output_dir: Some(dir.to_path_buf()),
        ..RunOptions::default()
    }
}

/// Remembers what it was shown; stops after `stop_at` if set.
#[derive(Default)]
pub struct Recorder {
    pub seen: Vec<(usize, u64, f64, f64)>,
    pub stop_at: Option<usize>,
}

impl StageHook for Recorder {
    type Annotation = serde_json::Value;
    async fn after_stage(&mut self, done: &FinishedStage<'_>) -> HookOutcome {
        self.seen.push((
            done.index,
            done.client.requests_ok,
            done.start_unix,
            done.end_unix,
        ));
        let annotation = serde_json::json!({ "seen": done.index });
        if Some(done.index) == self.stop_at {
            HookOutcome::stop("enough").with_annotation(annotation)
        } else {
            HookOutcome::proceed().with_annotation(annotation)
        }
    }
}
