//! A concurrency sweep against one engine, or against disaggregated
//! serving (a prefill engine in front of a decode engine), on a virtual
//! clock: what a closed-loop `nyann-bench generate` sweep would measure,
//! computed in milliseconds and the same on every run.
//!
//! It follows the stage runner's rules: a stage of concurrency `c` keeps `c`
//! streams busy (each sends its next request when the previous one ends); a
//! request belongs to the stage in which it was sent; after a stage's time
//! the load holds its level until the stage's requests are done, then the
//! next stage starts. The figures of a stage are computed the way the client
//! statistics and the server signals are: client TTFT, ITL and E2E quantiles
//! over the stage's requests, output tokens per second of stage time, and,
//! over the steady window (the stage without its first 20% and last 5%, the
//! whole stage under 5 s), the waiting p50 of the sampled gauge, the TTFT
//! p99 of vLLM's histogram as Prometheus' `histogram_quantile` reads it, the
//! KV usage max, and the preemptions of the whole stage. The window and the
//! quantiles are the signal sources' own ([`nyann_model::math`]), so the
//! simulator and a real sweep read the same samples the same way.
//!
//! Disaggregated, a request goes as the simulator's backend sends it
//! ([`crate::backend::TokenSource::disaggregated`]): the prefill engine
//! computes its prompt for one token the client never sees, then the decode
//! engine, after the KV transfer of its time model, makes every output token;
//! the client's TTFT is the decode engine's first token. Each engine's
//! signals are computed the same way, as roles `prefill` and `decode`, its
//! TTFT from the request's arrival at it.
//!
//! The fit ([`crate::fit`]) runs it for every candidate time model; the
//! tests run it to compare a profile with a recorded server.

use std::collections::HashMap;

use nyann_model::math::{self, Window};
use nyann_model::{ClientStats, RoleSignals};

use crate::engine::{Engine, EngineConfig, NewSeq, SeqId};
use crate::metrics::{EngineMetrics, Histogram, TTFT_BUCKETS};
use crate::prefix::PrefixKey;
use crate::tokens::mix;

/// Gauges are read this often (a scrape; finer than Prometheus' usual 1 s
/// so that a 10 s stage has enough samples for a stable median).
pub const SAMPLE_INTERVAL: f64 = 0.25;

/// One stage of a sweep: closed loop at `concurrency` for `duration_s`, each
/// request with `prompt_tokens` in and `output_tokens` out.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SweepStage {
    pub concurrency: u32,
    pub duration_s: f64,
    pub prompt_tokens: u32,
    pub output_tokens: u32,
}

/// What one stage measured: the client's statistics and the server's
/// signals, in the types the sweep records (`stages.json`).
#[derive(Debug, Clone, PartialEq)]
pub struct StageFigures {
    pub stage: SweepStage,
    pub client: ClientStats,
    /// The engine the client reads its tokens from: role `aggregate`, or
    /// `decode` in a disaggregated sweep. Extras `ttft_p50_seconds` and
    /// `running_requests_p50`.
    pub server: RoleSignals,
    /// A disaggregated sweep's prefill engine (role `prefill`, the same
    /// figures); `None` with one engine.
    pub prefill: Option<RoleSignals>,
}

/// A request in flight or done.
struct Request {
    /// The stage it was sent in; `None` for requests sent while holding.
    stage: Option<usize>,
    arrival: f64,
    /// When it reached the engine it is in (its TTFT there runs from then):
    /// the arrival, or when a prefill engine handed it on.
    at_engine: f64,
    first_token: Option<f64>,
    last_token: f64,
    end: Option<f64>,
    tokens: u32,
    /// Its prompt and output lengths (a request sent while holding may be
    /// handed to the decode engine after the next stage, of other lengths,
    /// began).
    shape: (u32, u32),
}

impl Request {
    fn new(stage: Option<usize>, arrival: f64, shape: (u32, u32)) -> Request {
        Request {
            stage,
            arrival,
            shape,
            at_engine: arrival,
            first_token: None,
            last_token: arrival,
            end: None,
            tokens: 0,
        }
    }
}

/// The server side of one stage on one engine: gauge samples and TTFT
/// observations over the steady window, the preemption counter over the
/// stage.
#[derive(Default)]
struct Observed {
    waiting: Vec<f64>,
    running: Vec<f64>,
    kv: Vec<f64>,
    ttft: Vec<f64>,
    preemptions_at_start: u64,
    preemptions_at_end: Option<u64>,
}

/// One engine of the served sweep, its role's name and the end of the step
/// it is running.
struct Stepper {
    role: &'static str,
    engine: Engine,
    step_end: Option<f64>,
    observed: Observed,
}

impl Stepper {
    fn new(role: &'static str, cfg: &EngineConfig) -> Stepper {
        Stepper {
            role,
            engine: Engine::new(
                cfg.clone(),
                EngineMetrics::new("sweep", "0", cfg.max_model_len()),
            ),
            step_end: None,
            observed: Observed::default(),
        }
    }

    /// The figures of the stage that just ended.
    fn signals(&mut self) -> RoleSignals {
        let now = self.engine.metrics().preemptions();
        let o = &mut self.observed;
        let preemptions = o.preemptions_at_end.unwrap_or(now) - o.preemptions_at_start;
        server_signals(self.role, o, preemptions)
    }
}

/// The engines and the requests sent to them. A request goes through the
/// engines in order: with two (disaggregated serving, as the simulator's
/// backend does it), the first computes the prompt for one token the client
/// never sees, then the second, once the prompt's KV is transferred, makes
/// every output token.
struct Load {
    engines: Vec<Stepper>,
    requests: HashMap<SeqId, Request>,
    next_id: SeqId,
    /// Requests of the current stage not finished yet.
    pending: usize,
}

impl Load {
    /// Send one request of `stage`'s shape at `at`, counted in stage `tag`.
    fn send(&mut self, stage: &SweepStage, at: f64, tag: Option<usize>) {
        let id = self.next_id;
        self.next_id += 1;
        let last = self.engines.len() - 1;
        let new = NewSeq::new(
            id,
            stage.prompt_tokens,
            if last == 0 { stage.output_tokens } else { 1 },
        );
        // Every prompt is its own (as a load generator's seeded ones are):
        // nothing is shared, but the prefix cache still keeps what a
        // preempted sequence computed, as on the real server.
        let tokens = |salt: u64, n: u32| -> Vec<u32> {
            (0..n)
                .map(|i| mix(salt ^ mix(id ^ mix(u64::from(i)))) as u32)
                .collect()
        };
        let first = &mut self.engines[0].engine;
        let key = PrefixKey::of_ids(
            &tokens(1, stage.prompt_tokens),
            &tokens(2, stage.output_tokens),
            first.config().block_size,
            None,
        );
        if first.submit_with_prefix(new, key, at).is_ok() {
            let shape = (stage.prompt_tokens, stage.output_tokens);
            self.requests.insert(id, Request::new(tag, at, shape));
            self.pending += usize::from(tag.is_some());
        }
    }

    /// The prefill engine is done with `id` at `now`: hand it to the decode
    /// engine for its output. `false` if it refused it.
    fn hand_over(&mut self, id: SeqId, now: f64) -> bool {
        let Some(r) = self.requests.get_mut(&id) else {
            return false;
        };
        r.at_engine = now;
        let (prompt, output) = r.shape;
        let new = NewSeq {
            kv_transferred: true,
            ..NewSeq::new(id, prompt, output)
        };
        let last = self.engines.len() - 1;
        let decode = &mut self.engines[last].engine;
        decode
            .submit_with_prefix(new, PrefixKey::none(), now)
            .is_ok()
    }

    /// Take the finished requests out.
    fn take_done(&mut self) -> Vec<Request> {
        let done: Vec<SeqId> = self
            .requests
            .iter()
            .filter(|(_, r)| r.end.is_some())
            .map(|(id, _)| *id)
            .collect();
        done.iter()
            .filter_map(|id| self.requests.remove(id))
            .collect()
    }

    /// Read every engine's gauges at the samples of the steady window
    /// before `until` (the engines hold their planned steps' values).
    fn sample(&mut self, next_sample: &mut f64, until: f64, steady: Window) {
        while *next_sample < until && *next_sample <= steady.end {
            if *next_sample >= steady.start {
                for s in &mut self.engines {
                    s.observed.waiting.push(s.engine.num_waiting() as f64);
                    s.observed.running.push(s.engine.num_running() as f64);
                    s.observed.kv.push(s.engine.kv_usage());
                }
            }
            *next_sample += SAMPLE_INTERVAL;
        }
    }
}

/// Run `stages` back to back against a fresh engine built from `cfg`.
pub fn run(cfg: &EngineConfig, stages: &[SweepStage]) -> Vec<StageFigures> {
    serve(vec![Stepper::new("aggregate", cfg)], stages)
}

/// Run `stages` back to back against disaggregated serving: a fresh prefill
/// engine built from `prefill` in front of a fresh decode engine built from
/// `decode` (whose time model's KV transfer delays each hand-over).
pub fn run_disaggregated(
    prefill: &EngineConfig,
    decode: &EngineConfig,
    stages: &[SweepStage],
) -> Vec<StageFigures> {
    serve(
        vec![
            Stepper::new("prefill", prefill),
            Stepper::new("decode", decode),
        ],
        stages,
    )
}

/// Run `stages` against `engines` (one, or prefill then decode), every
/// engine stepping on the same virtual clock.
fn serve(engines: Vec<Stepper>, stages: &[SweepStage]) -> Vec<StageFigures> {
    let mut load = Load {
        engines,
        requests: HashMap::new(),
        next_id: 0,
        pending: 0,
    };
    let last = load.engines.len() - 1;
    let mut streams = 0u32;
    let mut now = 0.0;
    let mut figures = Vec::with_capacity(stages.len());
    for (index, stage) in stages.iter().enumerate() {
        let end = now + stage.duration_s;
        let steady = Window::steady(Window::new(now, end));
        for s in &mut load.engines {
            s.observed = Observed {
                preemptions_at_start: s.engine.metrics().preemptions(),
                ..Observed::default()
            };
        }
        // New streams start at once; surplus ones end after their request.
        while streams < stage.concurrency {
            load.send(stage, now, Some(index));
            streams += 1;
        }
        let mut gaps = Vec::new();
        let mut next_sample = steady.start;
        while now < end || load.pending > 0 {
            for s in &mut load.engines {
                if s.step_end.is_none() {
                    s.step_end = s.engine.begin_step(now).map(|step| now + step);
                }
            }
            let step_end = load
                .engines
                .iter()
                .filter_map(|s| s.step_end)
                .reduce(f64::min);
            // When an idle engine's next request reaches its queue.
            let arrival = load
                .engines
                .iter()
                .filter(|s| s.step_end.is_none())
                .filter_map(|s| s.engine.next_arrival())
                .reduce(f64::min);
            let Some(step_end) = step_end else {
                match arrival {
                    Some(at) => now = at,
                    // Nothing to do (no stream): let the stage's time pass.
                    None => {
                        now = now.max(end);
                        break;
                    }
                }
                continue;
            };
            if let Some(at) = arrival.filter(|at| *at < step_end) {
                // An idle engine starts a step while another one runs.
                load.sample(&mut next_sample, at, steady);
                now = at;
                continue;
            }
            load.sample(&mut next_sample, step_end, steady);
            now = step_end;
            let in_steady = (steady.start..=steady.end).contains(&now);
            let mut finished = 0;
            for at in 0..=last {
                if load.engines[at].step_end != Some(now) {
                    continue;
                }
                load.engines[at].step_end = None;
                for event in load.engines[at].engine.end_step(now) {
                    let Some(r) = load.requests.get_mut(&event.id) else {
                        continue;
                    };
                    let observed = &mut load.engines[at].observed;
                    // The prefill's one token is no client's: its TTFT is
                    // the prefill engine's, then the decode engine takes over.
                    let handed = at < last;
                    match r.first_token {
                        None if in_steady => observed.ttft.push(now - r.at_engine),
                        Some(_) if r.stage == Some(index) => gaps.push(now - r.last_token),
                        _ => {}
                    }
                    if handed && load.hand_over(event.id, now) {
                        continue;
                    }
                    let Some(r) = load.requests.get_mut(&event.id) else {
                        continue;
                    };
                    if !handed {
                        r.first_token.get_or_insert(now);
                        r.last_token = now;
                        r.tokens = event.generated;
                    }
                    // Finished, or refused by the decode engine (it then
                    // ends without a token, as a failed request).
                    if event.finished || handed {
                        r.end = Some(now);
                        finished += 1;
                        load.pending -= usize::from(r.stage == Some(index));
                    }
                }
            }
            for _ in 0..finished {
                if streams > stage.concurrency {
                    streams -= 1;
                } else {
                    // Sent after the stage's time: held load, in no stage.
                    load.send(stage, now, (now < end).then_some(index));
                }
            }
            if now >= end {
                for s in &mut load.engines {
                    let preemptions = s.engine.metrics().preemptions();
                    s.observed.preemptions_at_end.get_or_insert(preemptions);
                }
            }
        }
        let done = load.take_done();
        let mut roles: Vec<RoleSignals> = load.engines.iter_mut().map(Stepper::signals).collect();
        let server = roles.pop().unwrap_or_default();
        figures.push(StageFigures {
            stage: *stage,
            client: client_stats(
                done.iter().filter(|r| r.stage == Some(index)),
                &mut gaps,
                stage.duration_s,
            ),
            server,
            prefill: roles.pop(),
        });
    }
    figures
}

/// The client statistics of a stage's requests; `itl` holds every gap
/// between two tokens of those requests.
fn client_stats<'a>(
    done: impl Iterator<Item = &'a Request>,
    itl: &mut [f64],
    duration_s: f64,
) -> ClientStats {
    let (mut ttft, mut e2e) = (Vec::new(), Vec::new());
    let (mut ok, mut tokens) = (0u64, 0u64);
    for r in done {
        let (Some(first), Some(end)) = (r.first_token, r.end) else {
            continue;
        };
        ok += 1;
        tokens += u64::from(r.tokens);
        ttft.push(first - r.arrival);
        e2e.push(end - r.arrival);
    }
    let (ttft, itl, e2e) = (sorted(&mut ttft), sorted(itl), sorted(&mut e2e));
    let per_second = |n: u64| {
        if duration_s > 0.0 {
            n as f64 / duration_s
        } else {
            0.0
        }
    };
    ClientStats {
        requests_ok: ok,
        requests_failed: 0,
        requests_per_second: per_second(ok),
        output_tokens_per_second: per_second(tokens),
        ttft_p50_seconds: quantile(ttft, 0.5),
        ttft_p99_seconds: quantile(ttft, 0.99),
        itl_p50_seconds: quantile(itl, 0.5),
        itl_p99_seconds: quantile(itl, 0.99),
        e2e_p50_seconds: quantile(e2e, 0.5),
        e2e_p99_seconds: quantile(e2e, 0.99),
        // The virtual sweep's server never sheds or outlasts a stage.
        ..ClientStats::default()
    }
}

fn server_signals(role: &str, o: &mut Observed, preemptions: u64) -> RoleSignals {
    let mut ttft = Histogram::new(TTFT_BUCKETS);
    for t in &o.ttft {
        ttft.observe(*t);
    }
    let kv_max = o.kv.iter().copied().fold(0.0, f64::max);
    RoleSignals {
        role: role.into(),
        waiting_requests_p50: quantile(sorted(&mut o.waiting), 0.5),
        ttft_p99_seconds: ttft.quantile(0.99),
        kv_cache_usage_max: kv_max,
        preemptions: preemptions as f64,
        extra: vec![
            ("ttft_p50_seconds".into(), ttft.quantile(0.5)),
            (
                "running_requests_p50".into(),
                quantile(sorted(&mut o.running), 0.5),
            ),
        ],
    }
}

/// `values` sorted in place, for [`quantile`]: a series is sorted once and
/// read at each quantile (the fit runs this sweep hundreds of times).
fn sorted(values: &mut [f64]) -> &[f64] {
    values.sort_by(f64::total_cmp);
    values
}

/// The signals' quantile ([`math::quantile`]) of a sorted series, 0 when it
/// is empty (as the client statistics report a stage without requests).
/// Every value the sweep records is finite, so nothing needs filtering.
fn quantile(sorted: &[f64], q: f64) -> f64 {
    math::quantile_of_sorted(sorted, q).unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::TimeModel;

    /// One sequence at a time, every step 1 ms, no noise.
    fn one_at_a_time() -> EngineConfig {
        EngineConfig {
            max_num_seqs: 1,
            max_num_batched_tokens: 2048,
            kv_blocks: 1000,
            block_size: 16,
            max_model_len: u32::MAX,
            prefix_caching: true,
            time: TimeModel {
                step_overhead: 0.001,
                prefill_per_token: 0.0,
                decode_per_seq: 0.0,
                decode_per_context_token: 0.0,
                request_overhead: 0.0,
                jitter: 0.0,
                drift: 0.0,
                drift_time: 0.0,
                kv_transfer: 0.0,
                kv_transfer_per_token: 0.0,
            },
            seed: 1,
        }
    }

    fn stage(concurrency: u32) -> SweepStage {
        SweepStage {
            concurrency,
            duration_s: 1.0,
            prompt_tokens: 10,
            output_tokens: 10,
        }
    }

    fn near(got: f64, want: f64, tolerance: f64) -> bool {
        (got - want).abs() <= tolerance
    }

    #[test]
    fn disaggregated_the_first_token_waits_for_the_prefill_and_the_transfer() {
        let decode = EngineConfig {
            time: TimeModel {
                kv_transfer: 0.005,
                ..one_at_a_time().time
            },
            ..one_at_a_time()
        };
        let f = run_disaggregated(&one_at_a_time(), &decode, &[stage(1)]);
        let (c, prefill) = (&f[0].client, f[0].prefill.as_ref().unwrap());
        // A prefill step, the transfer, then ten decode steps, the first
        // of which computes the prompt's last token and samples token one.
        assert!(near(c.ttft_p50_seconds, 0.007, 1e-9), "{c:?}");
        assert!(near(c.itl_p50_seconds, 0.001, 1e-9) && near(c.e2e_p50_seconds, 0.016, 1e-9));
        assert!(
            near(c.output_tokens_per_second, 10.0 / 0.016, 10.0),
            "{c:?}"
        );
        assert_eq!(
            (prefill.role.as_str(), f[0].server.role.as_str()),
            ("prefill", "decode")
        );
        // Each engine's TTFT runs from the request's arrival at it:
        // histogram_quantile in (0.001, 0.005] and (0.005, 0.01].
        assert!(prefill.ttft_p99_seconds <= 0.005, "{prefill:?}");
        assert!(f[0].server.ttft_p99_seconds > 0.005, "{:?}", f[0].server);
        assert_eq!(prefill.extra("running_requests_p50"), Some(0.0));
    }

    #[test]
    fn a_held_request_decodes_its_own_output_after_the_next_stage_began() {
        // Prompts of 100 tokens take the prefill engine 100 ms, one at a
        // time; the decode engine makes a token every 2 ms with 1600
        // tokens of KV cache.
        let prefill = EngineConfig {
            time: TimeModel {
                prefill_per_token: 0.001,
                ..one_at_a_time().time
            },
            ..one_at_a_time()
        };
        let decode = EngineConfig {
            max_num_seqs: 64,
            kv_blocks: 100,
            time: TimeModel {
                step_overhead: 0.002,
                ..one_at_a_time().time
            },
            ..one_at_a_time()
        };
        let long = SweepStage {
            concurrency: 1,
            duration_s: 0.05,
            prompt_tokens: 100,
            output_tokens: 500,
        };
        let short = SweepStage {
            duration_s: 2.0,
            output_tokens: 1,
            concurrency: 1,
            ..long
        };
        let f = run_disaggregated(&prefill, &decode, &[long, short]);
        // The first stage's one request decodes until 1.1 s; the stream then
        // sends a held request, the second stage begins, and the held
        // request is prefilled by 1.2 s: it still decodes its 500 tokens
        // (600 in the cache, until 2.2 s), not the second stage's one.
        let kv = f[1].server.kv_cache_usage_max;
        assert!(kv >= 0.3, "decode KV max {kv} in {:?}", f[1].server);
    }

    #[test]
    fn a_stream_measures_the_steps_and_a_second_one_waits_for_it() {
        let f = run(&one_at_a_time(), &[stage(1), stage(2)]);
        // A request is 10 steps of 1 ms: the prefill gives the first token.
        let (alone, c) = (&f[0], &f[0].client);
        assert!(near(c.output_tokens_per_second, 1000.0, 10.0), "{c:?}");
        assert!(near(c.ttft_p50_seconds, 0.001, 1e-9) && near(c.itl_p50_seconds, 0.001, 1e-9));
        assert!(near(c.e2e_p50_seconds, 0.010, 1e-9));
        assert_eq!(alone.server.waiting_requests_p50, 0.0);
        assert_eq!(alone.server.extra("running_requests_p50"), Some(1.0));
        // Two streams, one running: the other always waits one request.
        let (queued, c) = (&f[1], &f[1].client);
        assert!(near(c.output_tokens_per_second, 1000.0, 20.0), "{c:?}");
        assert!(near(c.ttft_p50_seconds, 0.011, 1e-9), "{c:?}");
        assert_eq!(queued.server.waiting_requests_p50, 1.0);
        assert_eq!(queued.server.preemptions, 0.0);
        // histogram_quantile in the (0.01, 0.02] bucket.
        assert!(
            near(queued.server.ttft_p99_seconds, 0.0199, 1e-4),
            "{:?}",
            queued.server
        );
    }
}
