//! What `generate` shows on stderr while it runs: a progress bar per stage
//! on a terminal (elapsed time against the stage duration, req/s, requests
//! in flight, errors, TTFT p50), and log lines written above the bar rather
//! than through it. Without a terminal there is no bar: the runner's
//! one-line-per-stage log says the same.

use std::io::Write;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use nyann_load::{CancellationToken, Live};

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

impl Progress {
    /// Starts redrawing `live` on stderr every 200 ms. Call it only when
    /// stderr is a terminal.
    pub fn start(live: Arc<Live>) -> Self {
        let stop = CancellationToken::new();
        let task = tokio::spawn(draw(live, stop.clone()));
        Progress { task, stop }
    }

    /// Removes the bar (before the stage table is printed).
    pub async fn finish(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

async fn draw(live: Arc<Live>, stop: CancellationToken) {
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
