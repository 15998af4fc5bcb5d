#![allow(clippy::unwrap_used)]

use super::*;
use crate::record::{Judged, PolicyMode, PolicyRef};
use nyann_load::{RunOutcome, StageDetail};
use nyann_model::{ClientStats, Mode, SweepRef, Verdict};

fn stage(index: usize, c: u32, congested: Option<bool>) -> StageResult {
    let ran = congested.is_some();
    StageResult {
        index,
        label: format!("#{index} c={c}"),
        name: None,
        status: if ran {
            StageStatus::Measured
        } else {
            StageStatus::Skipped
        },
        mode: Some(Mode::Concurrent),
        concurrency: Some(c),
        rate: None,
        duration_s: 60.0,
        drain: None,
        sweep: Some(0),
        start_unix: None,
        end_unix: None,
        client: ran.then(|| ClientStats {
            requests_per_second: f64::from(c),
            ttft_p99_seconds: 0.25,
            ..ClientStats::default()
        }),
        detail: ran.then(StageDetail::default),
        annotation: congested.map(|congested| Judged {
            congestion: CongestionRecord {
                policy: PolicyRef {
                    name: "builtin".into(),
                    version: "0".into(),
                    origin: "builtin".into(),
                    digest: String::new(),
                    interface: String::new(),
                },
                mode: PolicyMode::Enforce,
                sweep: SweepRef {
                    index: 0,
                    name: "sweep.star:3:10".into(),
                },
                params: vec![],
                judged_params: Vec::new(),
                roles: vec![],
                coverage: vec![],
                signal_errors: vec![],
                verdict: Some(Verdict {
                    congested,
                    reasons: vec![],
                    fired: Vec::new(),
                }),
                policy_error: None,
                stopped: congested,
                refine: None,
                check_seconds: 0.0,
            },
        }),
        skip_reason: None,
        check_interrupted: false,
        degraded: None,
        search: None,
    }
}

fn run(stages: Vec<StageResult>) -> RunResult {
    RunResult {
        outcome: RunOutcome::Completed,
        start_unix: 0.0,
        end_unix: 1.0,
        seed: 1,
        models: vec![],
        targets: vec![],
        totals: ClientStats::default(),
        totals_detail: StageDetail::default(),
        requests_recorded: 0,
        stages,
    }
}

#[test]
fn the_knee_is_the_last_stage_before_the_first_congested_one() {
    let result = run(vec![
        stage(0, 8, Some(false)),
        stage(1, 16, Some(false)),
        stage(2, 32, Some(true)),
        stage(3, 64, None),
        stage(4, 128, None),
    ]);
    let conclusion = Conclusion::of(&result, 3);
    let sweep = &conclusion.sweeps[0];
    let knee = sweep.knee.as_ref().unwrap();
    assert_eq!((knee.stage.stage, knee.requests_per_second), (1, 16.0));
    assert_eq!(sweep.congested.as_ref().unwrap().label, "#2 c=32");
    assert_eq!(sweep.suggested_start, None);
    assert_eq!(
        conclusion.load_not_sent,
        LoadNotSent {
            stages: 2,
            seconds: 120.0,
            worker_seconds: 360.0
        }
    );
    assert_eq!(
        conclusion.lines(),
        "knee (congested from #2 c=32): #1 c=16 (concurrency=16): 16.0 req/s, 0 output tok/s, \
         TTFT p50/p99 0.0/250 ms, ITL p50/p99 0.0/0.0 ms\n\
         load not sent: 2 stages skipped, 2m (6m of worker time)\n"
    );
    let json = serde_json::to_value(&conclusion).unwrap();
    assert_eq!(json["sweeps"][0]["knee"]["concurrency"], 16);
    assert_eq!(json["sweeps"][0]["knee"]["label"], "#1 c=16");
    assert_eq!(json["load_not_sent"]["seconds"], 120.0);
}

/// `stage` judged by the built-in's thresholds (waiting p50 8, TTFT
/// p99 1 s, KV 0.95, 1 preemption) on one role's signals.
fn judged(mut stage: StageResult, waiting: f64, ttft: f64, kv: f64, preempted: f64) -> StageResult {
    let record = &mut stage.annotation.as_mut().unwrap().congestion;
    record.judged_params = [
        ("waiting_requests_p50", 8.0),
        ("ttft_p99", 1.0),
        ("kv_cache_usage", 0.95),
        ("preemptions", 1.0),
    ]
    .into_iter()
    .map(|(name, value)| nyann_model::Param {
        name: name.into(),
        value: nyann_model::Value::Number(value),
    })
    .collect();
    record.roles = vec![nyann_model::RoleSignals {
        role: "aggregate".into(),
        waiting_requests_p50: waiting,
        ttft_p99_seconds: ttft,
        kv_cache_usage_max: kv,
        preemptions: preempted,
        extra: vec![],
    }];
    stage
}

/// The margin is the rule nearest to firing, only as far over as its
/// least condition; it is claimed only where the verdict is the rules'.
#[test]
fn a_verdicts_margin_is_the_nearest_rules_least_condition() {
    let margin = |stage: &StageResult| CongestionRecord::of(stage).unwrap().margin();
    // Queueing: waiting 12 is 50% over, TTFT 1.1 s 10% over: 10% over.
    let over = judged(stage(0, 32, Some(true)), 12.0, 1.1, 0.5, 0.0);
    assert!((margin(&over).unwrap() - 0.10).abs() < 1e-9);
    // Clean: queueing is 50% under on TTFT; KV 0.9 is 5% under with
    // 3 preemptions: the KV rule is nearer.
    let under = judged(stage(0, 16, Some(false)), 20.0, 0.5, 0.9025, 3.0);
    assert!((margin(&under).unwrap() + 0.05).abs() < 1e-9);
    // A verdict the rules do not give (a custom policy's logic), or no
    // standard thresholds: no margin.
    let custom = judged(stage(0, 16, Some(true)), 1.0, 0.1, 0.1, 0.0);
    assert_eq!(margin(&custom), None);
    assert_eq!(margin(&stage(0, 16, Some(true))), None);
}

/// The verdicts a capacity rests on, when near a threshold, are said.
#[test]
fn a_close_call_at_the_capacitys_bounds_is_said() {
    let search = |index, c, congested, waiting| {
        let mut s = judged(stage(index, c, Some(congested)), waiting, 2.0, 0.1, 0.0);
        s.search = Some(nyann_load::SearchStage { refines: 1 });
        s
    };
    let result = run(vec![
        judged(stage(0, 8, Some(false)), 0.0, 2.0, 0.1, 0.0),
        judged(stage(1, 32, Some(true)), 30.0, 2.0, 0.1, 0.0),
        search(2, 20, true, 8.4),
        search(3, 14, false, 4.0),
        search(4, 17, false, 7.6),
    ]);
    let conclusion = Conclusion::of(&result, 1);
    let capacity = conclusion.sweeps[0].capacity.as_ref().unwrap();
    assert_eq!(capacity.congested.level.concurrency, Some(20));
    assert!((capacity.congested.margin.unwrap() - 0.05).abs() < 1e-9);
    assert!(
        conclusion.lines().contains(
            "close call: concurrency=17 was judged not congested 5% under a threshold, \
             concurrency=20 was judged congested 5% over a threshold; a level this near"
        ),
        "{}",
        conclusion.lines()
    );
    // Far from every threshold: nothing to say.
    let result = run(vec![
        judged(stage(0, 8, Some(false)), 0.0, 2.0, 0.1, 0.0),
        judged(stage(1, 32, Some(true)), 30.0, 2.0, 0.1, 0.0),
    ]);
    assert!(!Conclusion::of(&result, 1).lines().contains("close call"));
}

/// `stage` of a sweep that searches its capacity with `refine=4,
/// resolution=`resolution`.
fn refined(mut stage: StageResult, resolution: Option<f64>) -> StageResult {
    let record = &mut stage.annotation.as_mut().unwrap().congestion;
    record.refine = Some(Refine {
        stages: 4,
        resolution,
        confirm: 0,
    });
    stage
}

/// A search that needs no stage (the sweep's clean and congested levels
/// are within the resolution already) still has its bounds: they are
/// the capacity, said as such.
#[test]
fn a_search_that_needs_no_stage_still_says_the_capacity() {
    let result = run(vec![
        refined(stage(0, 10, Some(false)), Some(10.0)),
        refined(stage(1, 20, Some(true)), Some(10.0)),
        stage(2, 40, None),
    ]);
    let conclusion = Conclusion::of(&result, 1);
    let capacity = conclusion.sweeps[0].capacity.as_ref().unwrap();
    assert_eq!(capacity.clean.as_ref().unwrap().level.concurrency, Some(10));
    assert_eq!(capacity.congested.level.concurrency, Some(20));
    assert_eq!(
        (capacity.gap, capacity.resolution),
        (Some(10.0), Some(10.0))
    );
    assert!(capacity.stages.is_empty());
    assert!(
        conclusion.lines().contains(
            "capacity: concurrency=10 (#0 c=10: 10.0 req/s, 0 output tok/s, TTFT p50/p99 \
             0.0/250 ms, ITL p50/p99 0.0/0.0 ms) not congested, concurrency=20 congested (no \
             search stage needed: the sweep's levels are within the resolution)\n"
        ),
        "{}",
        conclusion.lines()
    );
    let json = serde_json::to_value(&conclusion).unwrap();
    assert_eq!(json["sweeps"][0]["capacity"]["clean"]["concurrency"], 10);
    // Adjacent levels at the default resolution (one stream) alike.
    let result = run(vec![
        refined(stage(0, 7, Some(false)), None),
        refined(stage(1, 8, Some(true)), None),
    ]);
    let capacity = Conclusion::of(&result, 1).sweeps[0]
        .capacity
        .clone()
        .unwrap();
    assert_eq!((capacity.gap, capacity.resolution), (Some(1.0), Some(1.0)));
    // Congested at one stream: nothing lower to search.
    let result = run(vec![refined(stage(0, 1, Some(true)), None)]);
    let lines = Conclusion::of(&result, 1).lines();
    assert!(
        lines.contains(
            "capacity: not found: congested down to concurrency=1 (no search stage: nothing \
             below one stream to try)"
        ),
        "{lines}"
    );
    // Without `refine=` there is no capacity to say.
    let result = run(vec![stage(0, 10, Some(false)), stage(1, 20, Some(true))]);
    assert_eq!(Conclusion::of(&result, 1).sweeps[0].capacity, None);
}

/// A search stage of `refine=4` at level `c`.
fn search(index: usize, c: u32, congested: bool, waiting: f64) -> StageResult {
    let mut s = judged(stage(index, c, Some(congested)), waiting, 2.0, 0.1, 0.0);
    s.search = Some(nyann_load::SearchStage { refines: 1 });
    s.annotation.as_mut().unwrap().congestion.stopped = false;
    s
}

/// The run has one answer: a clean search stage above the sweep's
/// knee is the knee, said once (with its figures on the capacity line),
/// the same in summary.json. On the real vLLM the knee said c=4 and
/// the capacity c=21.
#[test]
fn a_clean_search_stage_is_the_knee() {
    let result = run(vec![
        refined(judged(stage(0, 4, Some(false)), 0.0, 2.0, 0.1, 0.0), None),
        refined(judged(stage(1, 32, Some(true)), 30.0, 2.0, 0.1, 0.0), None),
        stage(2, 64, None),
        search(3, 18, false, 2.0),
        search(4, 25, true, 20.0),
        search(5, 21, false, 4.0),
        search(6, 23, true, 20.0),
    ]);
    let conclusion = Conclusion::of(&result, 1);
    let sweep = &conclusion.sweeps[0];
    let knee = sweep.knee.as_ref().unwrap();
    assert_eq!((knee.stage.stage, knee.requests_per_second), (5, 21.0));
    let capacity = sweep.capacity.as_ref().unwrap();
    assert_eq!(capacity.clean.as_ref().unwrap(), &knee.stage);
    // The search ran out of stages 2 apart: one more would close it.
    assert_eq!(
        (capacity.gap, capacity.stages_to_close),
        (Some(2.0), Some(1))
    );
    let lines = conclusion.lines();
    assert_eq!(
        lines,
        "capacity: concurrency=21 (#5 c=21: 21.0 req/s, 0 output tok/s, TTFT p50/p99 0.0/250 \
         ms, ITL p50/p99 0.0/0.0 ms) not congested, concurrency=23 congested (4 search stages, \
         0s of load; the levels are 2 apart, 1 more search stage would bring them within 1 \
         (raise refine= by 1))\n\
         load not sent: 1 stage skipped, 1m\n"
    );
    assert!(
        !lines.contains("knee (congested from"),
        "said once: {lines}"
    );
    let json = serde_json::to_value(&conclusion).unwrap();
    assert_eq!(json["sweeps"][0]["knee"]["concurrency"], 21);
    assert_eq!(json["sweeps"][0]["capacity"]["stages_to_close"], 1);
}

/// `stage` (`c` requests/s) with an SLO met by `percent`% of its
/// requests over 10 s, judged by a rule on `slo.attainment` when
/// congested.
fn with_slo(mut stage: StageResult, percent: u64) -> StageResult {
    let goals = nyann_model::Slo::parse("ttft=500ms,tpot=50ms").unwrap();
    let requests = u64::from(stage.concurrency.unwrap()) * 10;
    let met = requests * percent / 100;
    let client = stage.client.as_mut().unwrap();
    client.slo = Some(nyann_model::SloStats::of(
        goals,
        requests,
        met,
        [requests - met, 0, 0],
        10.0,
    ));
    let record = &mut stage.annotation.as_mut().unwrap().congestion;
    if let Some(verdict) = record.verdict.as_mut().filter(|v| v.congested) {
        verdict.fired = vec![nyann_model::observation::FiredRule {
            rule: "goodput-floor".into(),
            role: None,
            signals: vec!["slo.attainment".into()],
        }];
    }
    stage
}

/// Judged by the SLO (a rule on `slo.attainment`), the capacity is said
/// under it, with the share met at the clean level; the level of most
/// goodput is named: not c=32, the highest throughput, whose requests
/// mostly missed.
#[test]
fn a_capacity_judged_by_the_slo_is_said_under_it_with_the_most_goodput() {
    let result = run(vec![
        with_slo(refined(stage(0, 8, Some(false)), None), 99),
        with_slo(refined(stage(1, 16, Some(false)), None), 45),
        with_slo(refined(stage(2, 32, Some(true)), None), 10),
        with_slo(search(3, 24, true, 0.0), 20),
        with_slo(search(4, 20, false, 0.0), 91),
        with_slo(search(5, 22, true, 0.0), 50),
        with_slo(search(6, 21, false, 0.0), 90),
    ]);
    let conclusion = Conclusion::of(&result, 1);
    let sweep = &conclusion.sweeps[0];
    let capacity = sweep.capacity.as_ref().unwrap();
    assert_eq!(
        capacity.under_slo,
        Some(UnderSlo {
            slo: "ttft≤500ms, tpot≤50ms".into(),
            attainment: Some(0.9)
        })
    );
    let most = sweep.most_goodput.as_ref().unwrap();
    assert_eq!((most.stage, most.goodput_per_second), (6, 18.9));
    let lines = conclusion.lines();
    assert!(
        lines.starts_with(
            "capacity under SLO ttft≤500ms, tpot≤50ms (90% met): concurrency=21 (#6 c=21: \
             21.0 req/s"
        ),
        "{lines}"
    );
    assert!(
        lines.contains(
            "most goodput: #6 c=21 (concurrency=21): 18.9 req/s met ttft≤500ms, tpot≤50ms \
             (90% of 21.0 req/s)\n"
        ),
        "{lines}"
    );
    let json = serde_json::to_value(&conclusion).unwrap();
    assert_eq!(json["sweeps"][0]["most_goodput"]["concurrency"], 21);
    assert_eq!(
        json["sweeps"][0]["capacity"]["under_slo"]["slo"],
        "ttft≤500ms, tpot≤50ms"
    );
    // The SLO reported but not judged by (the built-in's rules): the
    // capacity is not said under it; the most goodput still is.
    let unjudged = |mut s: StageResult| {
        let record = &mut s.annotation.as_mut().unwrap().congestion;
        if let Some(v) = record.verdict.as_mut() {
            v.fired.clear();
        }
        s
    };
    let result = run(vec![
        unjudged(with_slo(refined(stage(0, 8, Some(false)), None), 99)),
        unjudged(with_slo(refined(stage(1, 16, Some(true)), None), 45)),
    ]);
    let conclusion = Conclusion::of(&result, 1);
    let lines = conclusion.lines();
    assert!(lines.starts_with("capacity: concurrency=8"), "{lines}");
    assert!(
        lines.contains("most goodput: #0 c=8 (concurrency=8): 7.9 req/s met"),
        "{lines}"
    );
    // No SLO: no such line.
    let result = run(vec![stage(0, 8, Some(false)), stage(1, 16, Some(true))]);
    assert!(!Conclusion::of(&result, 1).lines().contains("goodput"));
}

/// A KV-cache usage cannot pass 100%: against 95% its margin is its
/// share of the 5 points of headroom, so a stage at 99% with 30
/// preemptions is no close call (it was 4% over before), and one at
/// 95.2% with one preemption is.
#[test]
fn a_kv_verdicts_margin_is_measured_against_its_headroom() {
    let margin = |kv: f64, preempted: f64, congested: bool| {
        let s = judged(stage(0, 16, Some(congested)), 0.0, 0.01, kv, preempted);
        CongestionRecord::of(&s).unwrap().margin().unwrap()
    };
    // The demo's congested stage and a saturated one.
    assert!((margin(0.991, 30.0, true) - 0.82).abs() < 1e-9);
    assert!((margin(1.0, 65.0, true) - 1.0).abs() < 1e-9);
    // Near the threshold with one preemption: close.
    assert!(margin(0.952, 1.0, true) < CLOSE_CALL);
    // Clean at 92% with no preemption: the rule needs both, and it is
    // a whole threshold of preemptions away.
    assert!((margin(0.92, 0.0, false) + 1.0).abs() < 1e-9);
    let result = run(vec![
        judged(stage(0, 8, Some(false)), 0.0, 0.01, 0.5, 0.0),
        judged(stage(1, 16, Some(true)), 0.0, 0.01, 0.991, 30.0),
    ]);
    assert!(!Conclusion::of(&result, 1).lines().contains("close call"));
}

/// `confirm=`: a level judged again is one level of the search, settled
/// by its verdicts; the answer says so, and it is no close call any
/// more. An unconfirmed close call gets the line that judges it again.
#[test]
fn a_confirmed_level_is_settled_and_said() {
    let result = run(vec![
        refined(judged(stage(0, 8, Some(false)), 0.0, 2.0, 0.1, 0.0), None),
        refined(judged(stage(1, 32, Some(true)), 30.0, 2.0, 0.1, 0.0), None),
        // c=20 at the threshold exactly, then 12% under: clean.
        search(2, 20, true, 8.0),
        search(3, 20, false, 7.0),
        search(4, 26, true, 20.0),
        // c=23 4% under, never confirmed: a close call.
        search(5, 23, false, 7.7),
        search(6, 24, true, 30.0),
    ]);
    let conclusion = Conclusion::of(&result, 1);
    let capacity = conclusion.sweeps[0].capacity.as_ref().unwrap();
    assert_eq!(capacity.clean.as_ref().unwrap().level.concurrency, Some(23));
    assert_eq!(capacity.congested.level.concurrency, Some(24));
    assert_eq!(
        capacity.confirmed,
        [Confirmed {
            level: Level {
                concurrency: Some(20),
                rate: None
            },
            verdicts: 2,
            congested_verdicts: 1,
            congested: false
        }]
    );
    assert_eq!(capacity.stages.len(), 5);
    let lines = conclusion.lines();
    assert!(
        lines.contains("(5 search stages, 0s of load; concurrency=20 judged 2 times (1 congested): not congested)"),
        "{lines}"
    );
    assert!(
        lines.contains(
            "close call: concurrency=23 was judged not congested 4% under a threshold; a level \
             this near can be judged the other way on another run: judge it again with longer \
             stages, until_congested([stage(\"2m\", concurrency=23)])"
        ),
        "{lines}"
    );
    assert_eq!(
        conclusion.sweeps[0].rejudge.as_deref(),
        Some("until_congested([stage(\"2m\", concurrency=23)])")
    );
}

/// A first stage congested at one stream has nothing below it to start
/// from: the advice says so instead of "start lower, at concurrency=1".
#[test]
fn a_first_stage_congested_at_one_stream_suggests_no_lower_start() {
    let result = run(vec![stage(0, 1, Some(true)), stage(1, 2, None)]);
    let conclusion = Conclusion::of(&result, 1);
    assert_eq!(conclusion.sweeps[0].suggested_start, None);
    let lines = conclusion.lines();
    assert!(
        lines.starts_with(
            "the first stage (#0 c=1) was already congested, at one stream: no knee in this \
             sweep and no lower level to start from; the server does not meet these \
             thresholds even at one stream"
        ),
        "{lines}"
    );
    assert!(!lines.contains("start lower"), "{lines}");
    // Two streams still have one below them.
    let result = run(vec![stage(0, 2, Some(true))]);
    assert_eq!(
        Conclusion::of(&result, 1).sweeps[0].suggested_start,
        Some(Level {
            concurrency: Some(1),
            rate: None
        })
    );
}

/// A sweep congested from its first stage has no knee: it says so and
/// where to start (a quarter of the first level), not "knee: none".
#[test]
fn a_first_stage_congested_suggests_where_to_start() {
    let result = run(vec![stage(0, 64, Some(true)), stage(1, 128, None)]);
    let conclusion = Conclusion::of(&result, 1);
    let sweep = &conclusion.sweeps[0];
    assert_eq!(sweep.knee, None);
    assert_eq!(
        sweep.suggested_start,
        Some(Level {
            concurrency: Some(16),
            rate: None
        })
    );
    assert!(
        conclusion.lines().starts_with(
            "the first stage (#0 c=64) was already congested: no knee in this sweep; start \
             lower, e.g. at concurrency=16\n"
        ),
        "{}",
        conclusion.lines()
    );
    // Nothing congested: the highest level is said as such.
    let calm = Conclusion::of(&run(vec![stage(0, 8, Some(false))]), 1);
    assert!(
        calm.lines()
            .starts_with("no stage was congested; the highest level: #0 c=8"),
        "{}",
        calm.lines()
    );
}
