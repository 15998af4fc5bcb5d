//! Runs engines on the wall clock and hands each request a [`TokenSource`]:
//! the stream of "N output tokens exist now" updates the HTTP layer turns
//! into response chunks.
//!
//! Three backends: one engine (aggregate), a prefill engine then a decode
//! engine (disaggregated: the client's first token is the decode engine's,
//! as in llm-d's and vLLM's P/D serving), or no engine at all (the fast profile: fixed TTFT
//! and per-token time per request, no shared state on the token path, so
//! thousands of concurrent streams cost only their timers).
//!
//! An engine runs in its own task: plan a step, sleep until the step's end,
//! finish it and publish progress to each sequence's `watch` channel (which
//! never blocks the engine and coalesces updates a slow client has not read).
//! Step ends are scheduled from the previous step's end, not from the
//! wake-up time, so timer granularity (about 1 ms) does not accumulate.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, watch};

use crate::engine::{Engine, NewSeq, SeqEvent, SeqId, SubmitError};
use crate::metrics::{EngineMetrics, Finished, FinishedReason};
use crate::prefix::PrefixKey;

/// How far the engine clock may lag the wall clock before it gives up
/// catching up (after an overloaded moment the schedule restarts from now).
const MAX_LAG: Duration = Duration::from_millis(5);

/// Output produced so far for one sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Progress {
    pub generated: u32,
    pub finished: bool,
    /// Prompt tokens served from the prefix cache (known once the request
    /// is admitted; 0 without a cache).
    pub cached_tokens: u32,
}

/// Why a request could not be queued.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueueError {
    #[error(transparent)]
    Rejected(#[from] SubmitError),
    #[error(
        "the server is overloaded: {waiting} requests are waiting (--max-waiting {limit}); retry later"
    )]
    Overloaded { waiting: usize, limit: usize },
    #[error("the simulator is shutting down")]
    ShuttingDown,
}

struct State {
    engine: Engine,
    subs: HashMap<SeqId, watch::Sender<Progress>>,
    stopped: bool,
    /// How far the engine clock was behind the wall clock when the current
    /// step began: a submission is dated on the engine clock, or a request
    /// arriving while the engine catches up would wait that much longer.
    lag: Duration,
}

struct Shared {
    state: Mutex<State>,
    epoch: Instant,
    wake: Notify,
    max_waiting: Option<usize>,
}

/// A running engine (cheap to clone).
#[derive(Clone)]
pub struct EngineHandle {
    shared: Arc<Shared>,
}

fn lock(shared: &Shared) -> MutexGuard<'_, State> {
    // A poisoned lock means a panic elsewhere already failed loudly; keep serving.
    shared.state.lock().unwrap_or_else(|p| p.into_inner())
}

impl EngineHandle {
    /// Start `engine`'s stepping task on the current runtime.
    pub fn spawn(
        engine: Engine,
        max_waiting: Option<usize>,
    ) -> (EngineHandle, tokio::task::JoinHandle<()>) {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                engine,
                subs: HashMap::new(),
                stopped: false,
                lag: Duration::ZERO,
            }),
            epoch: Instant::now(),
            wake: Notify::new(),
            max_waiting,
        });
        let task = tokio::spawn(run_engine(shared.clone()));
        (EngineHandle { shared }, task)
    }

    fn secs(&self, t: Instant) -> f64 {
        t.saturating_duration_since(self.shared.epoch).as_secs_f64()
    }

    /// Queue a sequence whose token blocks hash to `prefix`; its progress
    /// arrives on the returned stream.
    pub fn submit(&self, new: NewSeq, prefix: PrefixKey) -> Result<SeqStream, QueueError> {
        let rx = {
            let mut st = lock(&self.shared);
            let wall = Instant::now();
            let now = self.secs(wall.checked_sub(st.lag).unwrap_or(wall));
            if st.stopped {
                return Err(QueueError::ShuttingDown);
            }
            if let Some(limit) = self.shared.max_waiting {
                let waiting = st.engine.num_waiting();
                if waiting >= limit {
                    return Err(QueueError::Overloaded { waiting, limit });
                }
            }
            st.engine.submit_with_prefix(new, prefix, now)?;
            let (tx, rx) = watch::channel(Progress::default());
            st.subs.insert(new.id, tx);
            rx
        };
        self.shared.wake.notify_one();
        Ok(SeqStream {
            rx,
            id: new.id,
            handle: self.clone(),
            finished: false,
        })
    }

    /// Render this engine's `/metrics` text.
    pub fn render_metrics(&self, out: &mut String) {
        lock(&self.shared).engine.metrics().render(out);
    }

    /// A copy of the current metric values.
    pub fn metrics(&self) -> EngineMetrics {
        lock(&self.shared).engine.metrics().clone()
    }

    /// Stop stepping; open streams end with an error.
    pub fn stop(&self) {
        let mut st = lock(&self.shared);
        st.stopped = true;
        st.subs.clear();
        drop(st);
        self.shared.wake.notify_one();
    }

    fn abort(&self, id: SeqId) {
        let now = self.secs(Instant::now());
        let mut st = lock(&self.shared);
        st.subs.remove(&id);
        st.engine.abort(id, now);
    }
}

async fn run_engine(shared: Arc<Shared>) {
    let secs = |t: Instant| t.saturating_duration_since(shared.epoch).as_secs_f64();
    let mut prev_end: Option<Instant> = None;
    loop {
        let now = Instant::now();
        let start = match prev_end {
            Some(p) if p + MAX_LAG >= now => p,
            _ => now,
        };
        let (planned, next_arrival) = {
            let mut st = lock(&shared);
            if st.stopped {
                return;
            }
            st.lag = now.saturating_duration_since(start);
            let planned = st.engine.begin_step(secs(start));
            (planned, st.engine.next_arrival())
        };
        let Some(duration) = planned else {
            prev_end = None;
            match next_arrival {
                // A request is on its way to the queue (request overhead): wake
                // when it arrives, or earlier for a new submission.
                // Woken by the timer, the step starts when the request
                // arrived, not a timer tick later.
                Some(at) => {
                    let at = shared.epoch + Duration::from_secs_f64(at);
                    let notified = shared.wake.notified();
                    if tokio::time::timeout_at(at.into(), notified).await.is_err() {
                        prev_end = Some(at);
                    }
                }
                None => shared.wake.notified().await,
            }
            continue;
        };
        let end = start + Duration::from_secs_f64(duration);
        tokio::time::sleep_until(end.into()).await;
        let mut st = lock(&shared);
        let events = st.engine.end_step(secs(end));
        publish(&mut st.subs, &events);
        prev_end = Some(end);
    }
}

fn publish(subs: &mut HashMap<SeqId, watch::Sender<Progress>>, events: &[SeqEvent]) {
    for ev in events {
        if let Some(tx) = subs.get(&ev.id) {
            tx.send_replace(Progress {
                generated: ev.generated,
                finished: ev.finished,
                cached_tokens: ev.cached_tokens,
            });
        }
        if ev.finished {
            subs.remove(&ev.id);
        }
    }
}

/// Progress of one sequence in one engine; dropping it before the end
/// aborts the sequence (the client went away).
pub struct SeqStream {
    rx: watch::Receiver<Progress>,
    id: SeqId,
    handle: EngineHandle,
    finished: bool,
}

impl SeqStream {
    /// The next progress update; `None` if the engine stopped.
    async fn next(&mut self) -> Option<Progress> {
        if self.rx.changed().await.is_err() {
            // Sender gone: either finished (the final value is readable) or stopped.
            let last = *self.rx.borrow();
            if last.finished && !self.finished {
                self.finished = true;
                return Some(last);
            }
            return None;
        }
        let p = *self.rx.borrow_and_update();
        self.finished = p.finished;
        Some(p)
    }
}

impl Drop for SeqStream {
    fn drop(&mut self) {
        if !self.finished {
            self.handle.abort(self.id);
        }
    }
}

/// The fast profile: no engine, fixed timings, in-flight count as the only shared state.
pub struct FastBackend {
    pub ttft: Duration,
    pub per_token: Duration,
    metrics: Mutex<EngineMetrics>,
    in_flight: AtomicUsize,
}

impl FastBackend {
    pub fn new(ttft: Duration, per_token: Duration, metrics: EngineMetrics) -> FastBackend {
        FastBackend {
            ttft,
            per_token,
            metrics: Mutex::new(metrics),
            in_flight: AtomicUsize::new(0),
        }
    }

    fn metrics(&self) -> MutexGuard<'_, EngineMetrics> {
        self.metrics.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn render_metrics(&self, out: &mut String) {
        self.metrics().render(out);
    }

    pub fn metrics_snapshot(&self) -> EngineMetrics {
        self.metrics().clone()
    }

    fn set_running(&self) {
        let n = self.in_flight.load(Ordering::Relaxed);
        self.metrics().set_gauges(n, 0, 0.0);
    }
}

/// The stream of output progress of one request, whatever the backend.
pub struct TokenSource {
    inner: Source,
}

enum Source {
    Engine {
        stream: SeqStream,
        /// Disaggregated: the decode engine and the sequence to hand it once
        /// the prefill engine is done (its one token is not the client's).
        then: Option<(EngineHandle, NewSeq)>,
        /// Prompt tokens the engine that computed the prompt found cached
        /// (disaggregated: the prefill engine; the decode engine looks nothing up).
        cached_tokens: u32,
    },
    Fast(FastSource),
}

struct FastSource {
    backend: Arc<FastBackend>,
    start: Instant,
    total: u32,
    produced: u32,
    prompt_tokens: u32,
    finish: FinishedReason,
    done: bool,
}

impl Drop for FastSource {
    fn drop(&mut self) {
        self.backend.in_flight.fetch_sub(1, Ordering::Relaxed);
        if !self.done {
            let mut m = self.backend.metrics();
            m.observe_finished(fast_finished(self, FinishedReason::Abort));
        }
        self.backend.set_running();
    }
}

fn fast_finished(s: &FastSource, reason: FinishedReason) -> Finished {
    let e2e = s.start.elapsed().as_secs_f64();
    let ttft = s.backend.ttft.as_secs_f64();
    Finished {
        reason,
        e2e,
        queued: 0.0,
        inference: e2e,
        prefill: ttft.min(e2e),
        decode: (e2e - ttft).max(0.0),
        tpot: (s.produced > 1).then(|| s.backend.per_token.as_secs_f64()),
        prompt_tokens: s.prompt_tokens,
        generation_tokens: s.produced,
        max_tokens: s.total,
        preemptions: 0,
        prefill_kv_computed: u64::from(s.prompt_tokens),
    }
}

impl TokenSource {
    /// Aggregate mode: one engine does everything.
    pub fn engine(
        handle: &EngineHandle,
        new: NewSeq,
        prefix: PrefixKey,
    ) -> Result<TokenSource, QueueError> {
        Ok(TokenSource {
            inner: Source::Engine {
                stream: handle.submit(new, prefix)?,
                then: None,
                cached_tokens: 0,
            },
        })
    }

    /// Disaggregated mode, as llm-d's routing sidecar drives vLLM's P/D:
    /// the prefill engine computes the prompt (its prefix cache skips what it
    /// holds of `prefix`) for a request of one token, which the client never
    /// sees; then the decode engine, once the prompt's KV is transferred and
    /// the sequence admitted, produces every output token, the first one
    /// included.
    pub fn disaggregated(
        prefill: &EngineHandle,
        decode: &EngineHandle,
        new: NewSeq,
        prefix: PrefixKey,
    ) -> Result<TokenSource, QueueError> {
        let first = NewSeq {
            max_tokens: 1,
            ..new
        };
        let then = NewSeq {
            kv_transferred: true,
            ..new
        };
        Ok(TokenSource {
            inner: Source::Engine {
                stream: prefill.submit(first, prefix)?,
                then: Some((decode.clone(), then)),
                cached_tokens: 0,
            },
        })
    }

    /// Fast profile: fixed timings from now.
    pub fn fast(
        backend: &Arc<FastBackend>,
        prompt_tokens: u32,
        max_tokens: u32,
        finish: FinishedReason,
    ) -> TokenSource {
        backend.in_flight.fetch_add(1, Ordering::Relaxed);
        backend.set_running();
        TokenSource {
            inner: Source::Fast(FastSource {
                backend: backend.clone(),
                start: Instant::now(),
                total: max_tokens,
                produced: 0,
                prompt_tokens,
                finish,
                done: false,
            }),
        }
    }

    /// Wait for more output. `Ok(progress)` with `finished` on the last one;
    /// an error if the engine stopped or the decode engine refused the request.
    pub async fn next(&mut self) -> Result<Progress, QueueError> {
        match &mut self.inner {
            Source::Engine {
                stream,
                then,
                cached_tokens,
            } => loop {
                let Some(mut p) = stream.next().await else {
                    return Err(QueueError::ShuttingDown);
                };
                // Set once, at the prompt's first admission; the decode engine reports 0.
                *cached_tokens = p.cached_tokens.max(*cached_tokens);
                p.cached_tokens = *cached_tokens;
                match then.take() {
                    // The prefill is done: the client waits on for the decode engine.
                    Some((decode, new)) if p.finished => {
                        *stream = decode.submit(new, PrefixKey::none())?;
                    }
                    // Prefill progress is no output of the client's.
                    Some(pending) => *then = Some(pending),
                    None => return Ok(p),
                }
            },
            Source::Fast(f) => {
                let now = Instant::now();
                let due_at = |i: u32| f.start + f.backend.ttft + f.backend.per_token * i;
                if now < due_at(f.produced) {
                    tokio::time::sleep_until(due_at(f.produced).into()).await;
                }
                let now = Instant::now();
                // Every token whose time has come, at least the one we waited for.
                let mut n = f.produced + 1;
                while n < f.total && due_at(n) <= now {
                    n += 1;
                }
                let first = f.produced == 0;
                let prev = f.produced;
                f.produced = n;
                let finished = n >= f.total;
                {
                    let mut m = f.backend.metrics();
                    m.add_generation_tokens(u64::from(n - prev));
                    if first {
                        m.observe_ttft(now.duration_since(f.start).as_secs_f64());
                        m.add_prompt_tokens(u64::from(f.prompt_tokens));
                    }
                    if finished {
                        m.observe_itl_n(
                            f.backend.per_token.as_secs_f64(),
                            u64::from(n.saturating_sub(1)),
                        );
                    }
                }
                if finished {
                    f.done = true;
                    let fin = fast_finished(f, f.finish);
                    f.backend.metrics().observe_finished(fin);
                }
                Ok(Progress {
                    generated: n,
                    finished,
                    cached_tokens: 0,
                })
            }
        }
    }
}
