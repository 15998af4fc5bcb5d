//! The fit's round trip on the virtual clock: sweep an engine with a known
//! time model (two workloads, so that every cost shows), hand the figures
//! to the fit as a recording, and get the costs back: within 5% (10% for
//! the request overhead, which only TTFT shows). The recording's seed
//! differs from the fit's, as a real recording's noise would. The round
//! trip through real processes and files is in tests/e2e/twin.rs.

use nyann_model::ClientStats;
use nyann_sim::engine::TimeModel;
use nyann_sim::fit::{FitError, FitSettings, RecordedRun, RecordedStage, fit};
use nyann_sim::profile::{EngineSpec, Limits};
use nyann_sim::sweep::{StageFigures, SweepStage, run, run_disaggregated};

const LIMITS: Limits = Limits {
    max_num_seqs: 32,
    max_num_batched_tokens: 2048,
    kv_blocks: 1024,
    block_size: 16,
    max_model_len: None,
    enable_prefix_caching: true,
};

const KNOWN: TimeModel = TimeModel {
    step_overhead: 2000e-6,
    prefill_per_token: 30e-6,
    decode_per_seq: 200e-6,
    decode_per_context_token: 0.5e-6,
    request_overhead: 3000e-6,
    jitter: 0.1,
    drift: 0.0,
    drift_time: 0.0,
    kv_transfer: 0.0,
    kv_transfer_per_token: 0.0,
};

/// A recording of `levels` with `prompt` and `output` tokens per request.
fn record(name: &str, levels: &[u32], prompt: u32, output: u32) -> RecordedRun {
    let cfg = EngineSpec {
        limits: LIMITS,
        time: KNOWN,
    }
    .config(99);
    recording(name, levels, prompt, output, |stages| run(&cfg, stages))
}

/// What `sweep` measured of `levels` (10-second stages), as a recording.
fn recording(
    name: &str,
    levels: &[u32],
    prompt: u32,
    output: u32,
    sweep: impl FnOnce(&[SweepStage]) -> Vec<StageFigures>,
) -> RecordedRun {
    let stages: Vec<SweepStage> = levels
        .iter()
        .map(|&concurrency| SweepStage {
            concurrency,
            duration_s: 10.0,
            prompt_tokens: prompt,
            output_tokens: output,
        })
        .collect();
    RecordedRun {
        name: name.into(),
        stages: sweep(&stages)
            .into_iter()
            .map(|f| RecordedStage {
                label: format!("c={}", f.stage.concurrency),
                concurrency: f.stage.concurrency,
                duration_s: f.stage.duration_s,
                prompt_tokens: f64::from(prompt),
                output_tokens: f64::from(output),
                client: f.client,
                server: Some(f.server),
                prefill: f.prefill,
            })
            .collect(),
    }
}

fn settings() -> FitSettings {
    FitSettings {
        limits: LIMITS,
        prefill: None,
        noise: KNOWN,
        seed: 1,
        max_evaluations: 400,
    }
}

#[test]
fn the_fit_recovers_a_known_time_model() {
    let runs = [
        record("short prompts", &[1, 4, 16, 32], 64, 128),
        record("long prompts", &[1, 4, 16], 512, 64),
    ];
    let fitted = fit(&runs, &settings()).unwrap();
    let t = fitted.time;
    let close = |name: &str, got: f64, want: f64, tolerance: f64| {
        assert!(
            (got / want - 1.0).abs() <= tolerance,
            "{name}: fitted {got:.3e}, known {want:.3e} (tolerance {tolerance}); {fitted:#?}"
        );
    };
    close("step_overhead", t.step_overhead, KNOWN.step_overhead, 0.05);
    close(
        "decode_per_seq",
        t.decode_per_seq,
        KNOWN.decode_per_seq,
        0.05,
    );
    close(
        "prefill_per_token",
        t.prefill_per_token,
        KNOWN.prefill_per_token,
        0.05,
    );
    close(
        "decode_per_context_token",
        t.decode_per_context_token,
        KNOWN.decode_per_context_token,
        0.05,
    );
    close(
        "request_overhead",
        t.request_overhead,
        KNOWN.request_overhead,
        0.1,
    );
    assert!(fitted.rms < 0.03, "rms {}", fitted.rms);
    assert!(
        fitted.notes.iter().all(|n| !n.text.contains("held at 0")),
        "two workloads: the context cost is fitted: {:?}",
        fitted.notes
    );
}

#[test]
fn one_workload_holds_the_context_cost_and_says_so() {
    let runs = [record("short prompts", &[1, 8, 32], 64, 128)];
    let fitted = fit(
        &runs,
        &FitSettings {
            max_evaluations: 120,
            ..settings()
        },
    )
    .unwrap();
    assert_eq!(fitted.time.decode_per_context_token, 0.0);
    assert!(
        fitted.notes.iter().any(|n| n.text.contains(
            "decode_per_context_token held at 0: every stage had the same prompt and output lengths"
        )),
        "{:?}",
        fitted.notes
    );
}

#[test]
fn a_recording_that_cannot_run_is_refused() {
    let empty = RecordedRun {
        name: "x".into(),
        stages: vec![RecordedStage {
            label: "c=4".into(),
            concurrency: 4,
            duration_s: 10.0,
            prompt_tokens: 64.0,
            output_tokens: 64.0,
            client: ClientStats::default(),
            server: None,
            prefill: None,
        }],
    };
    assert_eq!(fit(&[empty], &settings()), Err(FitError::NoStages));
    let mut too_long = record("long", &[1], 64, 64);
    too_long.stages[0].prompt_tokens = 20_000.0;
    let err = fit(&[too_long], &settings()).unwrap_err();
    assert!(
        err.to_string()
            .contains("do not fit the KV cache (16384 tokens)"),
        "{err}"
    );
}

/// A disaggregated server's engines: distinct step costs, the costs an
/// engine never shows (the prefill engine's decode costs, the decode
/// engine's prompt cost) and the request overhead alike, as the fit holds
/// them (its notes say so).
const PREFILL_KNOWN: TimeModel = TimeModel {
    step_overhead: 1500e-6,
    prefill_per_token: 40e-6,
    ..DECODE_KNOWN
};

const DECODE_KNOWN: TimeModel = TimeModel {
    step_overhead: 3000e-6,
    prefill_per_token: 40e-6,
    decode_per_seq: 150e-6,
    decode_per_context_token: 0.4e-6,
    request_overhead: 2000e-6,
    jitter: 0.1,
    drift: 0.0,
    drift_time: 0.0,
    kv_transfer: 1000e-6,
    kv_transfer_per_token: 2e-6,
};

const PREFILL_LIMITS: Limits = Limits {
    kv_blocks: 512,
    ..LIMITS
};

/// A recording of a disaggregated server: the client's figures and the
/// signals of both roles.
fn record_disaggregated(name: &str, levels: &[u32], prompt: u32, output: u32) -> RecordedRun {
    let spec = |limits, time| EngineSpec { limits, time }.config(99);
    let (prefill, decode) = (
        spec(PREFILL_LIMITS, PREFILL_KNOWN),
        spec(LIMITS, DECODE_KNOWN),
    );
    recording(name, levels, prompt, output, |stages| {
        run_disaggregated(&prefill, &decode, stages)
    })
}

/// The round trip of a disaggregated server (the long prompts queue on the
/// prefill engine): each engine's costs come back from the client's
/// figures and each role's signals, the KV transfer given; as close as a
/// single engine's, the prefill engine's step overhead, which its steps
/// show beside 64 to 1024 prompt tokens, within 10%.
#[test]
fn the_fit_recovers_each_engine_of_a_disaggregated_server() {
    let runs = [
        record_disaggregated("short prompts", &[1, 4, 16, 32], 64, 128),
        record_disaggregated("long prompts", &[1, 4, 16], 1024, 32),
    ];
    assert!(runs.iter().all(RecordedRun::is_disaggregated));
    let fitted = fit(
        &runs,
        &FitSettings {
            prefill: Some(PREFILL_LIMITS),
            noise: DECODE_KNOWN,
            ..settings()
        },
    )
    .unwrap();
    let prefill = fitted.prefill.expect("a prefill engine is fitted");
    let decode = fitted.time;
    let close = |name: &str, got: f64, want: f64, tolerance: f64| {
        assert!(
            (got / want - 1.0).abs() <= tolerance,
            "{name}: fitted {got:.3e}, known {want:.3e} (tolerance {tolerance}); {fitted:#?}"
        );
    };
    for (name, got, want, tolerance) in [
        (
            "prefill step_overhead",
            prefill.step_overhead,
            PREFILL_KNOWN.step_overhead,
            0.1,
        ),
        (
            "prefill prefill_per_token",
            prefill.prefill_per_token,
            PREFILL_KNOWN.prefill_per_token,
            0.05,
        ),
        (
            "decode step_overhead",
            decode.step_overhead,
            DECODE_KNOWN.step_overhead,
            0.05,
        ),
        (
            "decode decode_per_seq",
            decode.decode_per_seq,
            DECODE_KNOWN.decode_per_seq,
            0.05,
        ),
        (
            "decode decode_per_context_token",
            decode.decode_per_context_token,
            DECODE_KNOWN.decode_per_context_token,
            0.05,
        ),
        (
            "request_overhead",
            decode.request_overhead,
            DECODE_KNOWN.request_overhead,
            0.1,
        ),
    ] {
        close(name, got, want, tolerance);
    }
    assert_eq!(prefill.request_overhead, decode.request_overhead);
    assert!(fitted.rms < 0.03, "rms {}", fitted.rms);
    for held in [
        "request_overhead: one value for both engines",
        "KV transfer held",
    ] {
        assert!(
            fitted.notes.iter().any(|n| n.text.starts_with(held)),
            "{held}: {:?}",
            fitted.notes
        );
    }
}
