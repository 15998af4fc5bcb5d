//! What `generate` shows on stderr while it runs: on a terminal a progress
//! bar per stage (elapsed time against the stage duration, req/s, requests
//! in flight, errors, TTFT p50) and how long the rest of the run takes at
//! most; off a terminal (a CI log, `kubectl logs`) the same as a log line
//! every `--progress-interval`. Log lines are written above the bar rather
//! than through it.

use std::io::Write;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use nyann_load::{CancellationToken, Live, LiveSnapshot};
use nyann_model::{Scenario, Step};

/// How often a progress line is logged off a terminal, unless
/// `--progress-interval` says otherwise.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(30);

/// The bar being drawn, if any: log lines hide it while they are written.
static BAR: Mutex<Option<ProgressBar>> = Mutex::new(None);

fn set_bar(bar: Option<ProgressBar>) {
    *BAR.lock().unwrap_or_else(PoisonError::into_inner) = bar;
}

/// Draws progress until [`Progress::finish`].
pub struct Progress {
    task: tokio::task::JoinHandle<()>,
    stop: CancellationToken,
}

/// How progress is shown.
#[derive(Debug, Clone, Copy)]
pub enum Show {
    /// A bar redrawn on the terminal.
    Bar,
    /// A log line this often during a stage.
    Lines(Duration),
}

/// The scenario's steps as durations, for how long the run has left.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Seconds of each step (0 for a barrier), by step index.
    steps: Vec<f64>,
}

impl Plan {
    pub fn of(scenario: &Scenario) -> Plan {
        Plan {
            steps: scenario
                .steps
                .iter()
                .map(|step| match step {
                    Step::Stage(stage) => stage.duration_s,
                    Step::Barrier { .. } => 0.0,
                })
                .collect(),
        }
    }

    /// Where the run is: "stage 3 of 8, at most 14m left" while step
    /// `index` has `left` seconds to go (a capacity search's stages, past
    /// the steps, are not planned: "capacity search"). "At most": a stop
    /// skips the rest of a sweep.
    fn whereabouts(&self, index: usize, left: f64) -> String {
        let stages = self.steps.iter().filter(|&&s| s > 0.0).count();
        if index >= self.steps.len() {
            return "capacity search".into();
        }
        let number = self.steps[..=index].iter().filter(|&&s| s > 0.0).count();
        let rest: f64 = left.max(0.0) + self.steps[index + 1..].iter().sum::<f64>();
        format!(
            "stage {number} of {stages}, at most {} left",
            humantime::format_duration(Duration::from_secs(rest.round() as u64))
        )
    }
}

impl Progress {
    /// Shows `live`'s progress on stderr as `show` says.
    pub fn start(live: Arc<Live>, plan: Plan, show: Show) -> Self {
        let stop = CancellationToken::new();
        let task = match show {
            Show::Bar => tokio::spawn(draw(live, plan, stop.clone())),
            Show::Lines(every) => tokio::spawn(log_lines(live, plan, every, stop.clone())),
        };
        Progress { task, stop }
    }

    /// Removes the bar (before the stage table is printed).
    pub async fn finish(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

/// The stage's figures: `30/120s 12.3 req/s, 16 in flight, 0 errors, TTFT p50 40 ms`.
fn figures(s: &LiveSnapshot) -> String {
    let rps = if s.elapsed_s > 0.0 {
        s.stage_ok as f64 / s.elapsed_s
    } else {
        0.0
    };
    let phase = if s.elapsed_s > s.duration_s {
        " (holding)"
    } else {
        ""
    };
    format!(
        "{:.0}/{:.0}s{phase} {rps:.1} req/s, {} in flight, {} errors{}, TTFT p50 {:.0} ms",
        s.elapsed_s.min(s.duration_s),
        s.duration_s,
        s.in_flight,
        s.stage_failed,
        if s.dropped > 0 {
            format!(", {} dropped", s.dropped)
        } else {
            String::new()
        },
        s.ttft_p50_s * 1000.0
    )
}

/// Off a terminal: a line every `every` while a stage runs (none at its
/// start: the runner says when each stage starts and ends).
async fn log_lines(live: Arc<Live>, plan: Plan, every: Duration, stop: CancellationToken) {
    let start = tokio::time::Instant::now() + every;
    let mut tick = tokio::time::interval_at(start, every.max(Duration::from_millis(100)));
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        let s = live.snapshot();
        let Some(index) = s.stage_index else { continue };
        if s.elapsed_s >= s.duration_s {
            continue;
        }
        tracing::info!(
            "stage {}: {}; {}",
            s.label,
            figures(&s),
            plan.whereabouts(index, s.duration_s - s.elapsed_s)
        );
    }
}

async fn draw(live: Arc<Live>, plan: Plan, stop: CancellationToken) {
    let style = ProgressStyle::with_template("{prefix:>14} [{bar:30}] {msg}")
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
    let mut bar: Option<(usize, ProgressBar)> = None;
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        let s = live.snapshot();
        let Some(index) = s.stage_index else { continue };
        if bar.as_ref().map(|(i, _)| *i) != Some(index) {
            if let Some((_, old)) = bar.take() {
                old.finish_and_clear();
            }
            let pb = ProgressBar::with_draw_target(
                Some((s.duration_s * 1000.0) as u64),
                ProgressDrawTarget::stderr_with_hz(5),
            );
            pb.set_style(style.clone());
            pb.set_prefix(if s.warmup {
                format!("{} (warm-up)", s.label)
            } else {
                s.label.clone()
            });
            set_bar(Some(pb.clone()));
            bar = Some((index, pb));
        }
        if let Some((_, pb)) = &bar {
            pb.set_position(((s.elapsed_s.min(s.duration_s)) * 1000.0) as u64);
            pb.set_message(format!(
                "{}; {}",
                figures(&s),
                plan.whereabouts(index, s.duration_s - s.elapsed_s)
            ));
        }
    }
    set_bar(None);
    if let Some((_, pb)) = bar {
        pb.finish_and_clear();
    }
}

/// The log's writer: stderr, with the progress bar (when one is drawn)
/// hidden while a line is written and redrawn below it.
pub struct StderrAboveBar;

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for StderrAboveBar {
    type Writer = LineAboveBar;

    fn make_writer(&'a self) -> LineAboveBar {
        LineAboveBar(Vec::new())
    }
}

/// One log event, buffered and written when dropped.
pub struct LineAboveBar(Vec<u8>);

impl Write for LineAboveBar {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for LineAboveBar {
    fn drop(&mut self) {
        let write = || {
            let _ = std::io::stderr().write_all(&self.0);
        };
        let bar = BAR.lock().unwrap_or_else(PoisonError::into_inner).clone();
        match bar {
            Some(bar) => bar.suspend(write),
            None => write(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nyann_model::{Mode, Stage, Workload};

    /// How long the run has left: the stage's rest and every later step
    /// (barriers take no time; a search is not planned).
    #[test]
    fn the_rest_of_the_run_is_the_later_steps_at_most() {
        let stage = |s: f64| Step::Stage(Stage::new(s, Mode::Concurrent));
        let plan = Plan::of(&Scenario {
            target: None,
            model: None,
            workload: Workload::default(),
            steps: vec![
                stage(120.0),
                Step::Barrier { drain: true },
                stage(120.0),
                stage(120.0),
            ],
        });
        assert_eq!(
            plan.whereabouts(0, 30.0),
            "stage 1 of 3, at most 4m 30s left"
        );
        assert_eq!(plan.whereabouts(3, 60.0), "stage 3 of 3, at most 1m left");
        assert_eq!(plan.whereabouts(4, 1.0), "capacity search");
    }
}
