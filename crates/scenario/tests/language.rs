//! The scenario language end to end: the shipped examples
//! (`examples/scenarios`), the builtins and
//! their composition with ordinary Starlark, and the JSON IR round trip.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use nyann_model::{CacheSalt, Mode, Param, Scenario, Stage, Step, Value, Workload, WorkloadType};
use nyann_scenario::{ScenarioError, compile_str, load_file};

fn examples() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/scenarios")
}

fn compile(src: &str) -> Scenario {
    match compile_str("t.star", src) {
        Ok(s) => s,
        Err(e) => panic!("unexpected error:\n{e}"),
    }
}

fn stages(s: &Scenario) -> Vec<&Stage> {
    s.steps
        .iter()
        .filter_map(|step| match step {
            Step::Stage(stage) => Some(stage),
            Step::Barrier { .. } => None,
        })
        .collect()
}

fn num(name: &str, n: f64) -> Param {
    Param {
        name: name.into(),
        value: Value::Number(n),
    }
}

fn text(name: &str, t: &str) -> Param {
    Param {
        name: name.into(),
        value: Value::Text(t.into()),
    }
}

/// Checks one shipped example: stage count, concurrencies, duration, and the
/// stop condition on every stage.
fn check_seed(file: &str, count: usize, step: u32, duration_s: f64, params: Vec<Param>) {
    let path = examples().join(file);
    let scenario = load_file(&path).unwrap();
    assert_eq!(scenario.steps.len(), count, "{file}");
    let all = stages(&scenario);
    assert_eq!(all.len(), count);
    for (i, stage) in all.iter().enumerate() {
        let want = step * (i as u32 + 1);
        assert_eq!(stage.concurrency, Some(want), "{file} stage {i}");
        assert_eq!(stage.rate, None);
        assert_eq!(stage.mode, Mode::Concurrent);
        assert_eq!(stage.duration_s, duration_s);
        assert!(!stage.warmup);
        let stop = stage
            .stop
            .as_ref()
            .expect("every example stage has a stop condition");
        assert_eq!(stop.params, params, "{file} stage {i}");
        let at = stop.location.as_ref().unwrap();
        assert_eq!(at.file, path.display().to_string());
        assert!(stage.location.is_some());
    }
    assert_eq!(all.last().unwrap().concurrency, Some(step * count as u32));
}

#[test]
fn balanced_seed_is_32_stages_from_64_to_2048() {
    check_seed(
        "balanced.star",
        32,
        64,
        120.0,
        vec![
            num("waiting_requests_p50", 32.0),
            text("ttft_p99", "2s"),
            num("kv_cache_usage", 0.95),
            num("preemptions", 1.0),
        ],
    );
}

#[test]
fn latency_sensitive_seed_is_16_stages_from_16_to_256() {
    check_seed(
        "latency-sensitive.star",
        16,
        16,
        120.0,
        vec![
            num("waiting_requests_p50", 8.0),
            text("ttft_p99", "750ms"),
            num("kv_cache_usage", 0.90),
            num("preemptions", 1.0),
        ],
    );
}

#[test]
fn throughput_oriented_seed_is_32_stages_from_128_to_4096() {
    check_seed(
        "throughput-oriented.star",
        32,
        128,
        300.0,
        vec![
            num("waiting_requests_p50", 64.0),
            text("ttft_p99", "5s"),
            num("kv_cache_usage", 0.98),
            num("preemptions", 5.0),
        ],
    );
}

#[test]
fn minimal_example_is_one_stage_with_the_default_workload() {
    let s = load_file(&examples().join("minimal.star")).unwrap();
    assert_eq!(s.steps.len(), 1);
    let stage = stages(&s)[0];
    assert_eq!((stage.duration_s, stage.concurrency), (30.0, Some(8)));
    assert_eq!(s.workload, Workload::default());
}

#[test]
fn stop_location_points_at_the_until_congested_call() {
    let s = compile(
        "sweep = [stage(\"1m\", concurrency=c) for c in [1, 2]]\n\
         x = 1\n\
         scenario(stages=\n    until_congested(sweep, b=1, a=\"x\"))\n",
    );
    for stage in stages(&s) {
        let stop = stage.stop.as_ref().unwrap();
        let at = stop.location.as_ref().unwrap();
        assert_eq!((at.file.as_str(), at.line, at.column), ("t.star", 4, 5));
        // Parameters keep call order, not alphabetical order.
        assert_eq!(stop.params, vec![num("b", 1.0), text("a", "x")]);
        let at = stage.location.as_ref().unwrap();
        assert_eq!((at.line, at.column), (1, 10));
    }
}

#[test]
fn functions_loops_and_conditionals_build_stages() {
    let s = compile(
        r#"
def sweep(lo, hi, step, d = "1m"):
    out = []
    for c in range(lo, hi + 1, step):
        if c % 2 == 0:
            out.append(stage(d, concurrency = c))
        else:
            out.append(stage(d, concurrency = c, name = "odd-%d" % c))
    return out

stages = sweep(1, 4, 1, d = "1m30s")
if len(stages) == 4:
    stages = stages + [stage("30s", mode = "poisson", rate = 2.5)]
else:
    fail("unreachable")
for i in range(2):
    stages.append(stage(10 + i, concurrency = 100))
scenario(stages = stages)
"#,
    );
    let all = stages(&s);
    assert_eq!(all.len(), 7);
    let names: Vec<_> = all.iter().map(|s| s.name.clone()).collect();
    assert_eq!(
        names,
        vec![
            Some("odd-1".into()),
            None,
            Some("odd-3".into()),
            None,
            None,
            None,
            None
        ]
    );
    assert!(all[..4].iter().all(|s| s.duration_s == 90.0));
    assert_eq!(all[4].mode, Mode::Poisson);
    assert_eq!((all[4].rate, all[4].concurrency), (Some(2.5), None));
    assert_eq!((all[5].duration_s, all[6].duration_s), (10.0, 11.0));
    assert_eq!(all[6].concurrency, Some(100));
}

#[test]
fn per_stage_overrides_and_workload_reuse() {
    let s = compile(
        r#"
chat = workload("faker", isl = 64, osl = 32, turns = 3, subsequent_isl = 16,
                chars_per_token = 3.5, cache_salt = "fixed:run-7", name = "chat")
docs = workload("corpus", corpus_path = "docs.txt", cache_salt = "random")
scenario(
    target = "http://localhost:8000/v1",
    model = "base",
    workload = chat,
    stages = [
        stage("10s", workload = chat, name = "warm", warmup = True),
        barrier(),
        stage("1m", workload = docs, target = "http://other:8000/v1", model = "m2"),
        barrier(drain = True),
        stage("1m", workload = chat),
    ],
)
"#,
    );
    assert_eq!(s.target.as_deref(), Some("http://localhost:8000/v1"));
    assert_eq!(s.model.as_deref(), Some("base"));
    let chat = Workload {
        kind: WorkloadType::Faker,
        isl: 64,
        osl: 32,
        turns: 3,
        subsequent_isl: Some(16),
        corpus_path: None,
        chars_per_token: 3.5,
        cache_salt: Some(CacheSalt::Fixed("run-7".into())),
        name: Some("chat".into()),
        ..Workload::default()
    };
    assert_eq!(s.workload, chat);
    assert!(matches!(s.steps[1], Step::Barrier { drain: false }));
    assert!(matches!(s.steps[3], Step::Barrier { drain: true }));
    let all = stages(&s);
    assert_eq!(all.len(), 3);
    assert!(all[0].warmup && !all[1].warmup && !all[2].warmup);
    assert_eq!(all[0].name.as_deref(), Some("warm"));
    assert_eq!(all[0].workload.as_ref(), Some(&chat));
    assert_eq!(all[2].workload.as_ref(), Some(&chat), "one workload reused");
    let docs = all[1].workload.as_ref().unwrap();
    assert_eq!(docs.kind, WorkloadType::Corpus);
    assert_eq!(docs.corpus_path.as_deref(), Some("docs.txt"));
    assert_eq!(docs.cache_salt, Some(CacheSalt::Random));
    assert_eq!((docs.isl, docs.osl, docs.turns), (128, 256, 1));
    assert_eq!(all[1].target.as_deref(), Some("http://other:8000/v1"));
    assert_eq!(all[1].model.as_deref(), Some("m2"));
    assert_eq!(
        (all[0].target.as_ref(), all[0].model.as_ref()),
        (None, None)
    );
}

#[test]
fn default_workload_and_stage_defaults() {
    let s = compile("scenario(stages = [stage(\"2m\")])");
    assert_eq!(s.workload, Workload::default());
    assert_eq!((s.target.as_ref(), s.model.as_ref()), (None, None));
    let st = stages(&s)[0];
    assert_eq!(st.mode, Mode::Concurrent);
    assert_eq!((st.concurrency, st.rate), (Some(10), None));
    assert_eq!(
        (st.max_inflight, st.max_requests, st.conversation_pool_size),
        (0, 0, 0)
    );
    assert_eq!(
        (st.rampup_s, st.workload.as_ref(), st.stop.as_ref()),
        (None, None, None)
    );
    assert!(!st.warmup);
}

#[test]
fn modes_rates_and_limits() {
    let s = compile(
        r#"
scenario(stages = [
    stage("1m", mode = "constant", rate = 5, max_inflight = 20, max_requests = 1000),
    stage(60, mode = "poisson", rate = 0.5, rampup = "750ms"),
    stage("1h", mode = "conversation_pool", concurrency = 4, conversation_pool_size = 8),
    stage("1.5s", concurrency = 1, rampup = 1),
])
"#,
    );
    let all = stages(&s);
    assert_eq!(
        (all[0].mode, all[0].rate, all[0].concurrency),
        (Mode::Constant, Some(5.0), None)
    );
    assert_eq!((all[0].max_inflight, all[0].max_requests), (20, 1000));
    assert_eq!(
        (all[1].mode, all[1].rate, all[1].rampup_s),
        (Mode::Poisson, Some(0.5), Some(0.75))
    );
    assert_eq!(all[1].duration_s, 60.0);
    assert_eq!(all[2].mode, Mode::ConversationPool);
    assert_eq!(
        (all[2].concurrency, all[2].conversation_pool_size),
        (Some(4), 8)
    );
    assert_eq!(all[2].duration_s, 3600.0);
    assert_eq!((all[3].duration_s, all[3].rampup_s), (1.5, Some(1.0)));
}

#[test]
fn until_congested_composes_with_warmups_barriers_and_comprehensions() {
    let s = compile(
        r#"
def level(c):
    return stage("1m", concurrency = c, name = "c=%d" % c)

warm = [stage("30s", concurrency = 8, warmup = True), barrier(drain = True)]
sweep = until_congested([level(c) for c in [16, 32]], policy_flag = True, ttft_p99 = "2s")
# The result is a plain list: filter and extend it like any other.
sweep = [s for s in sweep] + until_congested(stages = [level(64)], ttft_p99 = 3)
scenario(stages = warm + sweep)
"#,
    );
    assert_eq!(s.steps.len(), 5);
    let all = stages(&s);
    assert!(all[0].warmup && all[0].stop.is_none());
    let first = &all[1].stop.as_ref().unwrap().params;
    assert_eq!(
        first,
        &vec![
            Param {
                name: "policy_flag".into(),
                value: Value::Flag(true)
            },
            text("ttft_p99", "2s")
        ]
    );
    assert_eq!(all[2].stop.as_ref().unwrap().params, *first);
    assert_eq!(
        all[3].stop.as_ref().unwrap().params,
        vec![num("ttft_p99", 3.0)]
    );
    assert_eq!(all[3].name.as_deref(), Some("c=64"));
}

/// `refine` and `resolution` are the call's own keywords: they set the
/// capacity search and never reach the policy's parameters.
#[test]
fn refine_sets_the_capacity_search_not_a_policy_parameter() {
    let s = compile(
        r#"scenario(stages = until_congested([stage("1m", concurrency = c) for c in [8, 32, 128]], refine = 4, ttft_p99 = "1s"))"#,
    );
    for stage in stages(&s) {
        let stop = stage.stop.as_ref().unwrap();
        assert_eq!(stop.params, vec![text("ttft_p99", "1s")]);
        assert_eq!(
            stop.search,
            Some(nyann_model::CapacitySearch {
                stages: 4,
                resolution: None,
                confirm: 0,
            })
        );
    }
    let s = compile(
        r#"scenario(stages = until_congested([stage("1m", rate = r, mode = "constant") for r in [10, 40]], refine = 3, resolution = 2.5))"#,
    );
    let search = stages(&s)[0].stop.as_ref().unwrap().search;
    assert_eq!(search.and_then(|s| s.resolution), Some(2.5));
    let plain = compile(r#"scenario(stages = until_congested([stage("1m")], a = 1))"#);
    assert_eq!(stages(&plain)[0].stop.as_ref().unwrap().search, None);
    // `confirm` is the search's too.
    let s = compile(
        r#"scenario(stages = until_congested([stage("1m", concurrency = 8)], refine = 4, confirm = 1, a = 1))"#,
    );
    let stop = stages(&s)[0].stop.as_ref().unwrap();
    assert_eq!(stop.search.map(|s| s.confirm), Some(1));
    assert_eq!(stop.params, vec![num("a", 1.0)]);
}

/// The documented signature, `until_congested(stages, refine=None,
/// resolution=None, **params)`, works as written: `None` is no search (a
/// scenario can pass a variable that may be `None`).
#[test]
fn refine_none_is_no_capacity_search() {
    let s = compile(
        r#"scenario(stages = until_congested([stage("1m", concurrency = 8)], refine = None, resolution = None, a = 1))"#,
    );
    let stop = stages(&s)[0].stop.as_ref().unwrap();
    assert_eq!(stop.search, None);
    assert_eq!(stop.params, vec![num("a", 1.0)]);
    let s = compile(
        r#"scenario(stages = until_congested([stage("1m", concurrency = 8)], refine = 2, resolution = None))"#,
    );
    assert_eq!(
        stages(&s)[0].stop.as_ref().unwrap().search,
        Some(nyann_model::CapacitySearch {
            stages: 2,
            resolution: None,
            confirm: 0,
        })
    );
}

#[test]
fn print_goes_to_stderr_and_does_not_break_compilation() {
    let s = compile("print('building')\nscenario(stages = [stage(1)])");
    assert_eq!(s.steps.len(), 1);
}

#[test]
fn json_ir_round_trips_through_load_file() {
    let dir = tempfile::tempdir().unwrap();
    for example in [
        "balanced.star",
        "latency-sensitive.star",
        "throughput-oriented.star",
    ] {
        let compiled = load_file(&examples().join(example)).unwrap();
        let path = dir.path().join(example.replace(".star", ".json"));
        std::fs::write(&path, serde_json::to_string_pretty(&compiled).unwrap()).unwrap();
        assert_eq!(load_file(&path).unwrap(), compiled, "{example}");
    }
    let rich = compile(
        r#"
w = workload("synthetic", cache_salt = "fixed:a", isl = 3)
scenario(workload = w, target = "http://t/v1", stages = [
    stage("1s", warmup = True, workload = w), barrier(drain = True),
    stage("2s", mode = "poisson", rate = 1.5, rampup = "1s"),
] + until_congested([stage("3s")], x = 1, y = "z", flag = False))
"#,
    );
    let path = dir.path().join("rich.json");
    std::fs::write(&path, serde_json::to_string(&rich).unwrap()).unwrap();
    assert_eq!(load_file(&path).unwrap(), rich);
}

#[test]
fn json_ir_unknown_fields_are_rejected_with_their_path() {
    // Built from a compiled scenario so the test does not depend on how
    // steps are tagged in JSON.
    let s = compile("scenario(stages = [stage(\"1.5s\", concurrency = 2)])");
    let json = serde_json::to_string(&s).unwrap();
    assert!(json.contains("\"warmup\":false"));
    let json = json.replace("\"warmup\":false", "\"warmup\":false,\"warmpu\":true");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("typo.json");
    std::fs::write(&path, json).unwrap();
    let err = load_file(&path).unwrap_err();
    let text = err.to_string();
    assert!(
        text.starts_with(&format!("{}:1:", path.display())),
        "{text}"
    );
    assert!(text.contains("invalid scenario IR at steps[0]"), "{text}");
    assert!(text.contains("unknown field `warmpu`"), "{text}");
}

#[test]
fn json_ir_syntax_errors_have_a_line_and_column() {
    let err = nyann_scenario::parse_ir("x.json", "{\n  \"steps\": [,]\n}").unwrap_err();
    let d = &err.diagnostics()[0];
    assert_eq!((d.line, d.column), (Some(2), Some(13)), "{err}");
    assert!(
        err.to_string()
            .starts_with("x.json:2:13: invalid scenario IR"),
        "{err}"
    );
}

#[test]
fn json_ir_accepts_numbers_in_any_json_spelling() {
    // Non-shortest spellings (0.950, 1e2) must parse despite starlark turning
    // on serde_json's arbitrary_precision for the whole build.
    let s = compile(
        "scenario(stages = until_congested([stage(100, mode = \"poisson\", rate = 0.25)], kv = 0.75, n = 3))",
    );
    let json = serde_json::to_string(&s).unwrap();
    for spelled in ["100.0", "0.25", "0.75"] {
        assert!(json.contains(spelled), "{json}");
    }
    let json = json
        .replace("100.0", "1e2")
        .replace("0.25", "0.250")
        .replace("0.75", "7.5E-1");
    let back = nyann_scenario::parse_ir("x.json", &json).unwrap();
    assert_eq!(back, s);
    let st = stages(&back)[0];
    assert_eq!((st.duration_s, st.rate), (100.0, Some(0.25)));
    assert_eq!(
        st.stop.as_ref().unwrap().params,
        vec![num("kv", 0.75), num("n", 3.0)]
    );
}

#[test]
fn json_ir_is_validated_with_the_starlark_rules() {
    let dir = tempfile::tempdir().unwrap();
    let mut s =
        compile("scenario(stages = [stage(\"1m\"), stage(\"1m\", mode = \"constant\", rate = 1)])");
    let Step::Stage(first) = &mut s.steps[0] else {
        unreachable!()
    };
    first.concurrency = Some(0);
    let Step::Stage(second) = &mut s.steps[1] else {
        unreachable!()
    };
    second.location = None;
    second.rate = Some(-2.0);
    s.workload.isl = 0;
    let path = dir.path().join("bad.json");
    std::fs::write(&path, serde_json::to_string(&s).unwrap()).unwrap();
    let err = load_file(&path).unwrap_err();
    let text = err.to_string();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert!(
        lines[0].ends_with("workload: isl must be an int >= 1, got 0"),
        "{text}"
    );
    // A stage compiled from Starlark keeps its location: the error points there.
    assert!(lines[1].starts_with("t.star:1:20: stage 0"), "{text}");
    assert!(
        lines[1].contains("concurrency must be an int >= 1, got 0"),
        "{text}"
    );
    assert!(
        lines[2].contains("steps[1]: rate must be a finite number > 0, got -2"),
        "{text}"
    );
}

#[test]
fn other_file_types_and_missing_files_are_clear_errors() {
    let err = load_file(std::path::Path::new("scenario.yaml")).unwrap_err();
    assert!(matches!(err, ScenarioError::UnsupportedExtension { .. }));
    assert!(
        err.to_string()
            .contains("expected a Starlark file (.star) or a scenario IR file (.json)")
    );
    let err = load_file(std::path::Path::new("/nonexistent/x.star")).unwrap_err();
    assert!(matches!(err, ScenarioError::Read { .. }), "{err}");
    assert!(
        err.to_string()
            .starts_with("/nonexistent/x.star: cannot read"),
        "{err}"
    );
}

/// `scenario(slo=)` judges every stage without its own; `stage(slo=)`
/// replaces it for that stage, through `until_congested` too.
#[test]
fn slo_is_scenario_wide_and_overridable_per_stage() {
    let s = compile(
        r#"
goals = slo(ttft = "500ms", tpot = "50ms")
strict = slo(e2e = 2)
scenario(
    slo = goals,
    stages = [stage("10s", concurrency = 1, slo = strict)]
        + until_congested([stage("10s", concurrency = c) for c in [2, 4]], ttft_p99 = "1s", waiting_requests_p50 = 4),
)
"#,
    );
    let all = stages(&s);
    let goals = nyann_model::Slo {
        ttft_s: Some(0.5),
        tpot_s: Some(0.05),
        e2e_s: None,
    };
    assert_eq!(all[0].slo.unwrap().e2e_s, Some(2.0));
    assert_eq!(all[0].slo.unwrap().ttft_s, None);
    assert_eq!(all[1].slo, Some(goals));
    assert_eq!(all[2].slo, Some(goals));
    // The IR keeps it (and reads it back).
    let json = serde_json::to_string(&s).unwrap();
    assert!(
        json.contains(r#""slo":{"ttft_s":0.5,"tpot_s":0.05}"#),
        "{json}"
    );
    assert_eq!(serde_json::from_str::<Scenario>(&json).unwrap(), s);
    // Without slo= no stage has one, and the IR does not mention it.
    let plain = compile(r#"scenario(stages = [stage("10s")])"#);
    assert_eq!(stages(&plain)[0].slo, None);
    assert!(!serde_json::to_string(&plain).unwrap().contains("slo"));
}
