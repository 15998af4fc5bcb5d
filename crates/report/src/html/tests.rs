#![allow(clippy::unwrap_used)]

use super::levels::*;
use super::*;
use crate::charts::{LevelFigure, MarkKind, RUN_SHADES, Unit};
use nyann_check::{CongestionRecord, StageResult};
use nyann_check::{Judged, PolicyMode, PolicyRef, RunResult};
use nyann_load::StageStatus;
use nyann_load::{RunOutcome, StageDetail};
use nyann_model::{ClientStats, EvalStats, RoleSignals, Value, WorkloadType};
use nyann_model::{
    FiredRule, Mode, Param, Scenario, Stage, Step, StopCondition, Verdict, Workload,
};

fn stage(index: usize, c: u32, status: StageStatus, rps: f64) -> StageResult {
    let ran = status == StageStatus::Measured;
    StageResult {
        index,
        label: format!("#{index} c={c}"),
        name: None,
        status,
        mode: Some(Mode::Concurrent),
        concurrency: Some(c),
        rate: None,
        duration_s: 60.0,
        drain: None,
        start_unix: ran.then_some(100.0 + 70.0 * index as f64),
        end_unix: ran.then_some(160.0 + 70.0 * index as f64),
        client: ran.then(|| ClientStats {
            requests_ok: 100,
            requests_per_second: rps,
            ttft_p50_seconds: 0.0123,
            ttft_p99_seconds: 0.0456,
            ..ClientStats::default()
        }),
        detail: ran.then(StageDetail::default),
        sweep: Some(0),
        annotation: None,
        skip_reason: (!ran).then(|| "stopped after stage #1 c=128: congested".into()),
        check_interrupted: false,
        degraded: None,
        search: None,
    }
}

fn judged(mut stage: StageResult, congested: bool, roles: Vec<RoleSignals>) -> StageResult {
    let record = CongestionRecord {
        policy: PolicyRef {
            name: "builtin".into(),
            version: "0.1.0".into(),
            origin: "builtin".into(),
            digest: String::new(),
            interface: String::new(),
        },
        mode: PolicyMode::Enforce,
        sweep: Default::default(),
        params: Vec::new(),
        judged_params: Vec::new(),
        roles,
        signal_errors: vec![],
        verdict: Some(Verdict {
            congested,
            reasons: vec![],
            fired: Vec::new(),
        }),
        policy_error: None,
        stopped: false,
        refine: None,
        check_seconds: 0.1,
        coverage: vec![],
    };
    stage.annotation = Some(Judged { congestion: record });
    stage
}

fn role(waiting: f64) -> RoleSignals {
    RoleSignals {
        role: "aggregate".into(),
        waiting_requests_p50: waiting,
        ttft_p99_seconds: 1.0,
        kv_cache_usage_max: 0.5,
        preemptions: 0.0,
        extra: vec![],
    }
}

/// A sweep at c=64, 128, 256 that stopped at 128, with its scenario.
fn sweep() -> SavedRun {
    let stages = vec![
        judged(
            stage(0, 64, StageStatus::Measured, 10.0),
            false,
            vec![role(1.0)],
        ),
        judged(
            stage(1, 128, StageStatus::Measured, 15.0),
            true,
            vec![RoleSignals {
                ttft_p99_seconds: 2.5,
                ..role(40.0)
            }],
        ),
        stage(2, 256, StageStatus::Skipped, 0.0),
    ];
    let stop = StopCondition {
        params: vec![
            Param {
                name: "waiting_requests_p50".into(),
                value: Value::Number(32.0),
            },
            Param {
                name: "ttft_p99".into(),
                value: Value::Text("2s".into()),
            },
        ],
        location: None,
        param_locations: Vec::new(),
        search: None,
    };
    let scenario = Scenario {
        target: None,
        model: None,
        workload: Workload::default(),
        steps: [64, 128, 256]
            .map(|c| {
                Step::Stage(Stage {
                    concurrency: Some(c),
                    stop: Some(stop.clone()),
                    ..Stage::new(60.0, Mode::Concurrent)
                })
            })
            .to_vec(),
    };
    let result = RunResult {
        outcome: RunOutcome::Stopped {
            stage: 1,
            reason: "stopped after stage #1 c=128: congested: queueing".into(),
        },
        start_unix: 100.0,
        end_unix: 240.0,
        seed: 7,
        models: vec!["m".into()],
        targets: vec!["http://127.0.0.1:1/v1".into()],
        totals: ClientStats::default(),
        totals_detail: StageDetail::default(),
        requests_recorded: 200,
        stages,
    };
    SavedRun::new(
        "run-a".into(),
        result,
        Some(scenario),
        Some("# source".into()),
    )
}

#[test]
fn the_knee_is_the_last_stage_before_the_congested_one() {
    let run = sweep();
    assert_eq!(run.knees(), [0]);
    let page = page(std::slice::from_ref(&run)).unwrap();
    // The headline's figures are the stage's own statistics, as the
    // terminal says them.
    assert!(
        page.contains(
            "knee (the highest level not congested): <b>#0 c=64</b>: 10.0 req/s, 0 output tok/s, \
             TTFT p50/p99 12.3/45.6 ms"
        ),
        "{page}"
    );
    // And the charts mark it.
    assert!(
        page.contains("knee (highest level not congested)"),
        "the legend"
    );
    assert!(page.contains("run-a: sweep stopped after stage #1 c=128: congested: queueing"));
    assert!(page.contains("1 stage skipped: 1m of load not sent"));
    assert!(page.contains("policy builtin 0.1.0 (builtin), mode enforce"));
}

/// A capacity search after the stop is the headline's answer, and a bound
/// judged near a threshold is said as a close call.
#[test]
fn the_capacity_a_search_found_heads_the_run() {
    let mut run = sweep();
    let mut searched = judged(
        stage(3, 96, StageStatus::Measured, 14.0),
        false,
        vec![role(1.0)],
    );
    searched.search = Some(nyann_load::SearchStage { refines: 1 });
    run.records.push(CongestionRecord::of(&searched).cloned());
    run.result.stages.push(searched);
    let html = page(std::slice::from_ref(&run)).unwrap();
    // One answer: the search's clean level is the knee, with its figures,
    // and no other knee is said.
    assert_eq!(run.knees(), [3]);
    assert!(
        html.contains(
            "capacity: concurrency=96 (#3 c=96: 14.0 req/s, 0 output tok/s, TTFT p50/p99 12.3/45.6 \
             ms, ITL p50/p99 0.0/0.0 ms) not congested, concurrency=128 congested (1 search stage, 1m \
             of load; the levels are 32 apart, 5 more search stages would bring them within 1 \
             (raise refine= by 5))"
        ),
        "{html}"
    );
    assert!(!html.contains("knee (the highest"), "{html}");
    assert!(!html.contains("close call"), "{html}");
    // The curves run by level: the search's c=96 between 64 and 128.
    let figure = throughput(
        std::slice::from_ref(&run),
        &level_axis(std::slice::from_ref(&run)),
        Throughput::Requests,
    );
    let levels: Vec<f64> = figure.lines[0].points.iter().map(|p| p.0).collect();
    assert_eq!(levels, [64.0, 96.0, 128.0]);
    // The search's stage is marked apart from the sweep's, on its curve.
    let searched: Vec<(f64, Option<f64>)> = figure
        .marks
        .iter()
        .filter(|m| m.kind == MarkKind::Searched)
        .map(|m| (m.x, m.y))
        .collect();
    assert_eq!(searched, [(96.0, Some(14.0))]);
    assert!(html.contains("capacity search stage"), "the chart's legend");
    // So do the server signals' curves and their thresholds.
    let waiting = server_signal(
        std::slice::from_ref(&run),
        &level_axis(std::slice::from_ref(&run)),
        SIGNALS[0],
    );
    for line in &waiting.lines {
        let levels: Vec<f64> = line.points.iter().map(|p| p.0).collect();
        assert!(levels.is_sorted(), "{}: {levels:?}", line.name);
    }
    assert!(
        waiting
            .marks
            .iter()
            .any(|m| m.kind == MarkKind::Searched && m.x == 96.0 && m.y == Some(1.0))
    );
    // The congested bound judged 2% over the standard thresholds.
    let record = &mut run.result.stages[1].annotation.as_mut().unwrap().congestion;
    record.judged_params = [
        ("waiting_requests_p50", 39.2),
        ("ttft_p99", 2.0),
        ("kv_cache_usage", 0.95),
        ("preemptions", 1.0),
    ]
    .map(|(name, value)| Param {
        name: name.into(),
        value: Value::Number(value),
    })
    .to_vec();
    let html = page(std::slice::from_ref(&run)).unwrap();
    assert!(
        html.contains("close call: concurrency=128 was judged congested 2% over a threshold"),
        "{html}"
    );
}

#[test]
fn thresholds_are_drawn_from_the_stop_condition_at_every_stage_that_carries_it() {
    let run = sweep();
    let axis = level_axis(std::slice::from_ref(&run));
    let waiting = server_signal(std::slice::from_ref(&run), &axis, SIGNALS[0]);
    let threshold = waiting.lines.iter().find(|l| l.dashed).unwrap();
    assert_eq!(
        threshold.points,
        vec![(64.0, 32.0), (128.0, 32.0), (256.0, 32.0)]
    );
    let ttft = server_signal(std::slice::from_ref(&run), &axis, SIGNALS[1]);
    let threshold = ttft.lines.iter().find(|l| l.dashed).unwrap();
    assert_eq!(threshold.points[0], (64.0, 2.0), "\"2s\" is 2 seconds");
    let measured = waiting.lines.iter().find(|l| !l.dashed).unwrap();
    assert_eq!(measured.points, vec![(64.0, 1.0), (128.0, 40.0)]);
    assert!(
        waiting
            .marks
            .iter()
            .any(|m| m.kind == MarkKind::Congested && m.x == 128.0 && m.y == Some(40.0))
    );
}

/// Parameters the scenario did not write were judged with the policy's
/// defaults: drawn and named as such. A congested stage is circled only
/// on the charts of the rule that fired (here queueing: not the KV
/// chart, although KV usage reached 95%, since the preemptions threshold
/// of 1,000,000 switched that rule off).
#[test]
fn defaults_are_drawn_and_only_the_rule_that_fired_is_marked() {
    let mut run = sweep();
    let param = |name: &str, value: f64| Param {
        name: name.into(),
        value: Value::Number(value),
    };
    for (i, stage) in run.result.stages.iter_mut().enumerate().take(2) {
        let record = &mut stage.annotation.as_mut().unwrap().congestion;
        // As written in the scenario: kv_cache_usage is left out.
        record.params = vec![
            param("waiting_requests_p50", 32.0),
            Param {
                name: "ttft_p99".into(),
                value: Value::Text("2s".into()),
            },
            param("preemptions", 1_000_000.0),
        ];
        record.judged_params = vec![
            param("waiting_requests_p50", 32.0),
            param("ttft_p99", 2.0),
            param("kv_cache_usage", 0.95),
            param("preemptions", 1_000_000.0),
        ];
        record.roles[0].kv_cache_usage_max = if i == 1 { 1.0 } else { 0.5 };
        record.roles[0].preemptions = 52.0;
        run.records[i] = Some(record.clone());
    }
    let axis = level_axis(std::slice::from_ref(&run));
    let kv = server_signal(std::slice::from_ref(&run), &axis, SIGNALS[2]);
    let threshold = kv.lines.iter().find(|l| l.dashed).unwrap();
    assert_eq!(threshold.name, "threshold kv_cache_usage (policy default)");
    assert_eq!(
        threshold.points,
        vec![(64.0, 0.95), (128.0, 0.95), (256.0, 0.95)]
    );
    assert!(
        !kv.marks.iter().any(|m| m.kind == MarkKind::Congested),
        "{:?}",
        kv.marks
    );
    let waiting = server_signal(std::slice::from_ref(&run), &axis, SIGNALS[0]);
    assert_eq!(
        waiting.lines.iter().find(|l| l.dashed).unwrap().name,
        "threshold waiting_requests_p50"
    );
    assert!(
        waiting
            .marks
            .iter()
            .any(|m| m.kind == MarkKind::Congested && m.x == 128.0 && m.y == Some(40.0))
    );
    let page = page(std::slice::from_ref(&run)).unwrap();
    assert!(
        page.contains("kv_cache_usage=0.95 (policy default)"),
        "listed"
    );
    assert!(
        page.contains("threshold preemptions 1000000 ↑"),
        "off the axis"
    );
}

/// A verdict that names its rules (interface 0.3) is taken at its word,
/// whatever the parameters: here a custom policy with no thresholds
/// fired on the decode role's KV figures only.
#[test]
fn the_rules_a_verdict_names_are_the_ones_marked() {
    let mut run = sweep();
    let record = &mut run.result.stages[1].annotation.as_mut().unwrap().congestion;
    let mut decode = record.roles[0].clone();
    decode.role = "decode".into();
    decode.kv_cache_usage_max = 0.9;
    record.roles[0].kv_cache_usage_max = 0.99;
    record.roles.push(decode);
    record.verdict.as_mut().unwrap().fired = vec![FiredRule {
        rule: "kv-cache".into(),
        role: Some("decode".into()),
        signals: vec!["kv_cache_usage_max".into()],
    }];
    run.records[1] = Some(record.clone());
    let axis = level_axis(std::slice::from_ref(&run));
    let marks = |signal: Signal| -> Vec<(f64, Option<f64>)> {
        server_signal(std::slice::from_ref(&run), &axis, signal)
            .marks
            .iter()
            .filter(|m| m.kind == MarkKind::Congested)
            .map(|m| (m.x, m.y))
            .collect()
    };
    assert_eq!(marks(SIGNALS[2]), [(128.0, Some(0.9))], "decode's KV only");
    assert_eq!(marks(SIGNALS[0]), [], "no waiting mark");
    assert_eq!(marks(SIGNALS[3]), [], "no preemptions mark");
}

/// Two runs: a table of their figures at the levels both measured.
#[test]
fn overlaid_runs_are_compared_at_equal_levels() {
    let (a, mut b) = (sweep(), sweep());
    b.label = "run-b".into();
    b.result.stages[0]
        .client
        .as_mut()
        .unwrap()
        .requests_per_second = 12.0;
    let page = page(&[a, b]).unwrap();
    assert!(page.contains("<h2>Compared at equal levels</h2>"), "{page}");
    assert!(
        page.contains("<td class=\"num\">10.0</td><td class=\"num\">12.0</td><td class=\"num better\">+20.0%</td>"),
        "{page}"
    );
}

#[test]
fn a_judged_stage_without_signals_is_marked_no_data() {
    let mut run = sweep();
    run.result.stages[0] = judged(stage(0, 64, StageStatus::Measured, 10.0), false, vec![]);
    run.records[0] = CongestionRecord::of(&run.result.stages[0]).cloned();
    let axis = level_axis(std::slice::from_ref(&run));
    let figure = server_signal(std::slice::from_ref(&run), &axis, SIGNALS[0]);
    assert!(
        figure
            .marks
            .iter()
            .any(|m| m.kind == MarkKind::NoData && m.x == 64.0 && m.y.is_none()),
        "{:?}",
        figure.marks
    );
}

/// A signal whose series were missing reads 0 for the policy, but the
/// report shows "no data", never a measured 0.
#[test]
fn a_signal_without_series_is_no_data_not_zero() {
    let mut run = sweep();
    let judged = run.result.stages[0].annotation.as_mut().unwrap();
    judged.congestion.coverage = serde_json::from_value(serde_json::json!([{
        "role": "aggregate",
        "signals": [
            {"signal": "waiting_requests_p50", "status": "missing"},
            {"signal": "kv_cache_usage_max", "status": "found", "metric": "vllm:kv_cache_usage_perc"}
        ]
    }]))
    .unwrap();
    run.records[0] = CongestionRecord::of(&run.result.stages[0]).cloned();
    let axis = level_axis(std::slice::from_ref(&run));
    let waiting = server_signal(std::slice::from_ref(&run), &axis, SIGNALS[0]);
    let measured = waiting.lines.iter().find(|l| !l.dashed).unwrap();
    assert_eq!(measured.points, vec![(128.0, 40.0)], "no point at c=64");
    assert!(
        waiting
            .marks
            .iter()
            .any(|m| m.kind == MarkKind::NoData && m.x == 64.0)
    );
    let kv = server_signal(std::slice::from_ref(&run), &axis, SIGNALS[2]);
    let measured = kv.lines.iter().find(|l| !l.dashed).unwrap();
    assert_eq!(measured.points.len(), 2, "found signals are drawn");
}

#[test]
fn overlaid_runs_are_named_in_every_series() {
    let (a, mut b) = (sweep(), sweep());
    b.label = "run-b".into();
    let runs = [a, b];
    let axis = level_axis(&runs);
    let figure = throughput(&runs, &axis, Throughput::Requests);
    let names: Vec<&str> = figure.lines.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(names, vec!["run-a: req/s", "run-b: req/s"]);
    assert_ne!(figure.lines[0].color, figure.lines[1].color);
    let page = page(&runs).unwrap();
    assert!(page.contains("2 runs compared"));
}

/// A run whose readings are as extreme as a float gets (a TTFT of
/// `f64::MAX`: a `+Inf` quantile whose bucket bounds could not be read)
/// gives a page, in bounded time, that marks them off the axis.
/// (Scaling the axis to them made the chart code spin forever.)
#[test]
fn extreme_readings_give_a_page() {
    for extreme in [f64::MAX, 1e300, f64::INFINITY] {
        let mut run = sweep();
        let judged = run.result.stages[1].annotation.as_mut().unwrap();
        judged.congestion.roles[0].ttft_p99_seconds = extreme;
        judged.congestion.roles[0].waiting_requests_p50 = extreme;
        let client = run.result.stages[1].client.as_mut().unwrap();
        client.ttft_p99_seconds = extreme;
        client.requests_per_second = extreme;
        run.records[1] = CongestionRecord::of(&run.result.stages[1]).cloned();
        let page = page(std::slice::from_ref(&run)).unwrap();
        assert!(page.contains("above the axis (value shown)"), "{extreme}");
        assert!(!page.contains("NaN"), "{extreme}");
    }
}

#[test]
fn text_is_escaped() {
    assert_eq!(
        esc("<a href=\"x\">&'"),
        "&lt;a href=&quot;x&quot;&gt;&amp;&#39;"
    );
}

/// A GSM8K sweep: its stages scored eval answers, and a capacity search
/// added c=96 between 64 and 128 (after them in the stages).
fn eval_sweep() -> SavedRun {
    let mut run = sweep();
    run.scenario.as_mut().unwrap().workload.kind = WorkloadType::Gsm8k;
    let scores = [EvalStats::of(200, 180, 2), EvalStats::of(200, 150, 9)];
    for (stage, eval) in run.result.stages.iter_mut().zip(scores) {
        stage.client.as_mut().unwrap().eval = Some(eval);
    }
    let mut searched = judged(
        stage(3, 96, StageStatus::Measured, 14.0),
        false,
        vec![role(1.0)],
    );
    searched.search = Some(nyann_load::SearchStage { refines: 1 });
    searched.client.as_mut().unwrap().eval = Some(EvalStats::of(200, 170, 1));
    run.records.push(CongestionRecord::of(&searched).cloned());
    run.result.stages.push(searched);
    run
}

fn marks_of(figure: &LevelFigure, kind: MarkKind) -> Vec<(f64, Option<f64>)> {
    figure
        .marks
        .iter()
        .filter(|m| m.kind == kind)
        .map(|m| (m.x, m.y))
        .collect()
}

/// No eval answer scored, no accuracy chart (an empty chart reads as a
/// measurement of nothing); with several runs, only those that scored
/// have a curve, in their own colour.
#[test]
fn accuracy_is_charted_only_for_runs_that_scored_eval_answers() {
    let plain = sweep();
    let axis = level_axis(std::slice::from_ref(&plain));
    assert!(accuracy(std::slice::from_ref(&plain), &axis).is_none());
    let html = page(std::slice::from_ref(&plain)).unwrap();
    assert!(!html.contains("Eval accuracy"), "{html}");
    // Eval figures of no answer scored are no data.
    let mut unscored = sweep();
    unscored.result.stages[0].client.as_mut().unwrap().eval = Some(EvalStats::of(0, 0, 0));
    assert!(accuracy(std::slice::from_ref(&unscored), &axis).is_none());

    let run = eval_sweep();
    let html = page(std::slice::from_ref(&run)).unwrap();
    assert!(
        html.contains("<h2>Eval accuracy against the stage level</h2>"),
        "{html}"
    );
    assert!(html.contains("95% interval"), "the whiskers' legend");
    // The stage table shows the same figures.
    assert!(html.contains("<th>accuracy</th>"), "{html}");
    let c64 = EvalStats::of(200, 180, 2);
    let cell = format!(
        "<td class=\"num\">90.0% ({:.0}-{:.0})</td>",
        100.0 * c64.accuracy_low,
        100.0 * c64.accuracy_high
    );
    assert!(html.contains(&cell), "{cell} in {html}");

    let mut scored = eval_sweep();
    scored.label = "run-b".into();
    let runs = [plain, scored];
    let figure = accuracy(&runs, &level_axis(&runs)).unwrap();
    let names: Vec<&str> = figure.lines.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(names, ["run-b: accuracy"]);
    assert_eq!(figure.lines[0].color, RUN_SHADES[1][0], "run-b's colour");
    assert_eq!(figure.error_bars.len(), 1);
    assert!(page(&runs).unwrap().contains("run-b: 95% interval"));
}

/// The accuracy per stage runs by level (the search's c=96 between 64 and
/// 128), on an axis from 0 to 100%, its whiskers the stages' Wilson
/// intervals, the congested stage circled, the search's squared and the
/// skipped one crossed, as on the other level charts.
#[test]
fn accuracy_runs_by_level_with_its_interval_and_marks() {
    let run = eval_sweep();
    let figure = accuracy(
        std::slice::from_ref(&run),
        &level_axis(std::slice::from_ref(&run)),
    )
    .unwrap();
    assert_eq!((figure.unit, figure.y_max), (Unit::Percent, Some(1.0)));
    assert_eq!(figure.lines.len(), 1);
    assert_eq!(
        figure.lines[0].points,
        [(64.0, 0.9), (96.0, 0.85), (128.0, 0.75)]
    );
    let bars = &figure.error_bars[0].points;
    for ((level, low, high), index) in bars.iter().zip([0, 3, 1]) {
        let eval = run.result.stages[index].client.as_ref().unwrap().eval;
        let eval = eval.unwrap();
        assert_eq!(
            (*level, *low, *high),
            (
                run.result.stages[index].concurrency.unwrap() as f64,
                eval.accuracy_low,
                eval.accuracy_high
            )
        );
        assert!(*low < eval.accuracy && eval.accuracy < *high, "{eval:?}");
    }
    assert_eq!(
        marks_of(&figure, MarkKind::Congested),
        [(128.0, Some(0.75))]
    );
    assert_eq!(marks_of(&figure, MarkKind::Searched), [(96.0, Some(0.85))]);
    assert_eq!(marks_of(&figure, MarkKind::Skipped), [(256.0, None)]);
    let svg = crate::charts::level_chart(&figure).unwrap();
    for text in [
        "Eval accuracy",
        "congested",
        "capacity search stage",
        "skipped (not run, no value)",
        ">\n100%\n<",
    ] {
        assert!(svg.contains(text), "{text} missing");
    }
}

/// In a run that asked eval questions at some stages only, the others
/// have no point and no mark; a congested eval stage that scored nothing
/// (every request failed) is not circled at 0%.
#[test]
fn stages_that_scored_no_eval_answer_are_left_out_of_the_accuracy_chart() {
    let mut run = eval_sweep();
    // c=64 sends the synthetic workload, the rest GSM8K.
    run.result.stages[0].client.as_mut().unwrap().eval = None;
    let scenario = run.scenario.as_mut().unwrap();
    let Step::Stage(first) = &mut scenario.steps[0] else {
        unreachable!()
    };
    first.workload = Some(Workload::default());
    let axis = level_axis(std::slice::from_ref(&run));
    let figure = accuracy(std::slice::from_ref(&run), &axis).unwrap();
    let levels: Vec<f64> = figure.lines[0].points.iter().map(|p| p.0).collect();
    assert_eq!(levels, [96.0, 128.0]);
    let bars: Vec<f64> = figure.error_bars[0].points.iter().map(|p| p.0).collect();
    assert_eq!(bars, [96.0, 128.0]);
    assert!(
        figure.marks.iter().all(|m| m.x != 64.0),
        "{:?}",
        figure.marks
    );
    assert_eq!(marks_of(&figure, MarkKind::Skipped), [(256.0, None)]);

    // The scenario says the skipped c=256 was a synthetic stage: no cross.
    let mut synthetic = run.scenario.clone().unwrap();
    synthetic.workload.kind = WorkloadType::Synthetic;
    let mut mixed = eval_sweep();
    mixed.scenario = Some(synthetic.clone());
    let figure = accuracy(std::slice::from_ref(&mixed), &axis).unwrap();
    assert_eq!(marks_of(&figure, MarkKind::Skipped), []);
    // Without a scenario, its sweep scored eval answers: crossed.
    mixed.scenario = None;
    let figure = accuracy(std::slice::from_ref(&mixed), &axis).unwrap();
    assert_eq!(marks_of(&figure, MarkKind::Skipped), [(256.0, None)]);

    // The congested c=128 scored nothing: no point, and no circle.
    let mut failed = eval_sweep();
    failed.result.stages[1].client.as_mut().unwrap().eval = None;
    let figure = accuracy(std::slice::from_ref(&failed), &axis).unwrap();
    assert_eq!(figure.lines[0].points, [(64.0, 0.9), (96.0, 0.85)]);
    assert_eq!(marks_of(&figure, MarkKind::Congested), []);
}

/// A policy that judged client figures alone, with no signal source, has
/// no server signals: no chart of them is drawn (four empty ones were).
#[test]
fn a_run_without_server_signals_draws_no_signal_chart() {
    let mut run = sweep();
    for stage in &mut run.result.stages {
        if let Some(judged) = &mut stage.annotation {
            judged.congestion.roles.clear();
        }
    }
    run.records = run
        .result
        .stages
        .iter()
        .map(|s| CongestionRecord::of(s).cloned())
        .collect();
    let html = page(std::slice::from_ref(&run)).unwrap();
    assert!(!html.contains("Server signals the policy judged"), "{html}");
    assert!(html.contains("Client latency against the stage level"));
}

/// A custom policy's parameters are its own (its `ttft_p99` may be a
/// client figure): they are drawn as no server threshold, and the caption
/// does not call them the built-in's.
#[test]
fn a_custom_policys_parameters_are_no_server_thresholds() {
    let builtin = sweep();
    let axis = level_axis(std::slice::from_ref(&builtin));
    let ttft = server_signal(std::slice::from_ref(&builtin), &axis, SIGNALS[1]);
    assert!(
        ttft.lines.iter().any(|l| l.dashed),
        "the built-in's threshold"
    );
    let mut custom = sweep();
    for stage in &mut custom.result.stages {
        if let Some(judged) = &mut stage.annotation {
            judged.congestion.policy.origin = "client-slo.wasm".into();
        }
    }
    custom.records = custom
        .result
        .stages
        .iter()
        .map(|s| CongestionRecord::of(s).cloned())
        .collect();
    let ttft = server_signal(std::slice::from_ref(&custom), &axis, SIGNALS[1]);
    assert!(!ttft.lines.iter().any(|l| l.dashed), "{:?}", ttft.lines);
    let html = page(std::slice::from_ref(&custom)).unwrap();
    assert!(html.contains("Server signals the policy judged"));
    assert!(!html.contains("built-in policy"), "{html}");
}

/// The stage table's verdict sits right after the status (it was the last
/// of 22 columns, off-screen at 1400 px).
#[test]
fn the_verdict_column_follows_the_status() {
    let html = page(std::slice::from_ref(&sweep())).unwrap();
    assert!(
        html.contains("<tr><th>stage</th><th>status</th><th>judged</th><th>level</th>"),
        "{html}"
    );
    assert!(
        html.contains("<td>#1 c=128</td><td>CONGESTED</td><td>congested</td><td>c=128</td>"),
        "{html}"
    );
}

/// An eval run (one stage, no sweep) is not headlined as a "knee": its
/// headline gives the accuracy it measured.
#[test]
fn an_eval_runs_headline_gives_its_accuracy() {
    let mut stage = stage(0, 64, StageStatus::Measured, 10.0);
    stage.sweep = None;
    if let Some(client) = &mut stage.client {
        client.eval = Some(EvalStats {
            answered: 1319,
            correct: 1148,
            unanswerable: 3,
            accuracy: 0.8704,
            accuracy_low: 0.8512,
            accuracy_high: 0.8873,
        });
    }
    let mut run = sweep();
    run.result.stages = vec![stage];
    run.result.outcome = RunOutcome::Completed;
    run.records = vec![None];
    run.scenario = None;
    let html = page(std::slice::from_ref(&run)).unwrap();
    assert!(
        html.contains(
            "<div>eval at <b>#0 c=64</b>, accuracy 87.0% (95% interval 85.1-88.7%) of 1319 answered</div>"
        ),
        "{html}"
    );
    assert!(!html.contains("knee"), "{html}");
}

/// Under an SLO the requests chart draws the goodput beside the
/// throughput, dashed; without one it draws the throughput alone.
#[test]
fn goodput_is_drawn_beside_the_throughput() {
    let mut run = sweep();
    let plain = throughput(
        std::slice::from_ref(&run),
        &level_axis(std::slice::from_ref(&run)),
        Throughput::Requests,
    );
    assert_eq!(plain.lines.len(), 1);
    let goals = nyann_model::Slo {
        ttft_s: Some(0.5),
        ..nyann_model::Slo::default()
    };
    for stage in &mut run.result.stages {
        if let Some(client) = stage.client.as_mut() {
            let met = (client.requests_per_second / 2.0).round() as u64;
            client.slo = Some(nyann_model::SloStats::of(
                goals,
                2 * met,
                met,
                [met, 0, 0],
                1.0,
            ));
        }
    }
    let runs = std::slice::from_ref(&run);
    let figure = throughput(runs, &level_axis(runs), Throughput::Requests);
    assert_eq!(figure.lines.len(), 2);
    let goodput = &figure.lines[1];
    assert_eq!(goodput.name, "goodput (met the SLO)");
    assert!(goodput.dashed);
    assert_eq!(goodput.points.len(), figure.lines[0].points.len());
    for (good, all) in goodput.points.iter().zip(&figure.lines[0].points) {
        assert_eq!(good.0, all.0);
        assert!(good.1 <= all.1, "{good:?} {all:?}");
    }
    let tokens = throughput(runs, &level_axis(runs), Throughput::Tokens);
    assert_eq!(tokens.lines.len(), 1, "goodput is in requests, not tokens");
    assert!(page(runs).unwrap().contains("goodput (met the SLO)"));
}
