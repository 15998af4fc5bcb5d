//! The live progress bar on stderr: one bar per stage showing elapsed time
//! against the stage duration, req/s, requests in flight, errors and TTFT p50.

use std::sync::Arc;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::live::Live;

/// Draws progress until dropped (or [`Progress::finish`]).
pub struct Progress {
    task: tokio::task::JoinHandle<()>,
    stop: tokio_util::sync::CancellationToken,
}

impl Progress {
    /// Starts redrawing `live` on stderr every 200 ms (hidden when stderr is not a terminal).
    pub fn start(live: Arc<Live>) -> Self {
        let stop = tokio_util::sync::CancellationToken::new();
        let task = tokio::spawn(draw(live, stop.clone()));
        Progress { task, stop }
    }

    /// Removes the bar (before the stage table is printed).
    pub async fn finish(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

async fn draw(live: Arc<Live>, stop: tokio_util::sync::CancellationToken) {
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
            bar = Some((index, pb));
        }
        if let Some((_, pb)) = &bar {
            pb.set_position(((s.elapsed_s.min(s.duration_s)) * 1000.0) as u64);
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
            pb.set_message(format!(
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
            ));
        }
    }
    if let Some((_, pb)) = bar {
        pb.finish_and_clear();
    }
}
