//! Every strictness rule of the scenario language: each error names the
//! file, line and column of the offending call and says what is expected.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use nyann_scenario::{Diagnostic, compile_str};

fn errors(src: &str) -> Vec<Diagnostic> {
    match compile_str("t.star", src) {
        Ok(s) => panic!("expected an error, got {s:?}"),
        Err(e) => {
            // The Display form lists one `file:line:col: message` per problem.
            let shown = e.to_string();
            assert_eq!(shown.lines().count(), e.diagnostics().len(), "{shown}");
            e.diagnostics().to_vec()
        }
    }
}

/// Asserts exactly one error, at `line`, whose message contains every needle.
#[track_caller]
fn assert_error(src: &str, line: u32, needles: &[&str]) -> Diagnostic {
    let all = errors(src);
    assert_eq!(all.len(), 1, "{all:#?}");
    let d = all.into_iter().next().unwrap();
    assert_eq!(d.file, "t.star");
    assert_eq!(d.line, Some(line), "{d}");
    assert!(d.column.is_some(), "{d}");
    for needle in needles {
        assert!(d.message.contains(needle), "{needle:?} not in {d}");
    }
    assert!(d.to_string().starts_with(&format!("t.star:{line}:")), "{d}");
    d
}

/// A scenario whose line 3 holds the expression under test.
fn on_line_3(expr: &str) -> String {
    format!("# header\nx = 1\ns = {expr}\nscenario(stages = [stage(\"1m\")])\n")
}

#[test]
fn wrong_types_are_errors_not_zero() {
    let d = assert_error(
        &on_line_3("stage(\"1m\", concurrency = \"64\")"),
        3,
        &["stage(): concurrency must be an int >= 1, got string \"64\""],
    );
    assert_eq!(d.column, Some(5));
    assert_error(
        &on_line_3("stage(\"1m\", concurrency = 2.0)"),
        3,
        &["concurrency must be an int >= 1, got float"],
    );
    assert_error(
        &on_line_3("workload(\"faker\", isl = \"128\")"),
        3,
        &["workload(): isl must be an int >= 1, got string"],
    );
    assert_error(
        &on_line_3("stage(\"1m\", warmup = 1)"),
        3,
        &["warmup must be True or False, got int 1"],
    );
    assert_error(
        &on_line_3("stage(\"1m\", workload = \"faker\")"),
        3,
        &["workload must be a workload(...) value or None"],
    );
    assert_error(
        &on_line_3("stage(\"1m\", mode = \"closed\")"),
        3,
        &[
            "mode must be \"concurrent\", \"constant\", \"poisson\" or \"conversation_pool\", got \"closed\"",
        ],
    );
    assert_error(
        &on_line_3("workload(\"random\")"),
        3,
        &[
            "type must be \"synthetic\", \"faker\", \"corpus\", \"gsm8k\", \"gpqa\" or \"sharegpt\", got \"random\"",
        ],
    );
    assert_error(
        &on_line_3("barrier(drain = \"yes\")"),
        3,
        &["drain must be True or False"],
    );
    assert_error(
        &on_line_3("stage(\"1m\", name = 3)"),
        3,
        &["name must be a string or None, got int 3"],
    );
}

#[test]
fn unknown_keywords_are_errors_that_show_the_signature() {
    assert_error(
        &on_line_3("stage(\"1m\", concurency = 4)"),
        3,
        &["concurency", "expected stage(duration, concurrency=10,"],
    );
    assert_error(
        &on_line_3("workload(\"faker\", ils = 4)"),
        3,
        &["ils", "expected workload(type, isl=128"],
    );
    assert_error(
        &on_line_3("barrier(drian = True)"),
        3,
        &["drian", "expected barrier(drain=False)"],
    );
    assert_error(
        "scenario(stages = [stage(1)], targets = \"x\")",
        1,
        &["targets", "expected scenario(stages, target=None"],
    );
    assert_error(
        &on_line_3("stage()"),
        3,
        &["Missing parameter `duration`", "expected stage("],
    );
}

#[test]
fn numeric_ranges() {
    assert_error(
        &on_line_3("stage(\"1m\", concurrency = 0)"),
        3,
        &["concurrency must be an int >= 1, got 0"],
    );
    assert_error(
        &on_line_3("stage(\"1m\", concurrency = -4)"),
        3,
        &["concurrency must be an int >= 1, got -4"],
    );
    for rate in ["0", "-1.5", "float(\"inf\")", "float(\"nan\")"] {
        assert_error(
            &on_line_3(&format!(
                "stage(\"1m\", mode = \"constant\", rate = {rate})"
            )),
            3,
            &["rate must be a finite number > 0"],
        );
    }
    for field in ["isl", "osl", "turns"] {
        assert_error(
            &on_line_3(&format!("workload(\"faker\", {field} = 0)")),
            3,
            &[&format!("workload(): {field} must be an int >= 1, got 0")],
        );
    }
    assert_error(
        &on_line_3("workload(\"faker\", subsequent_isl = 0)"),
        3,
        &["subsequent_isl must be an int >= 1"],
    );
    assert_error(
        &on_line_3("workload(\"faker\", chars_per_token = -1)"),
        3,
        &["chars_per_token must be a finite number >= 0"],
    );
    assert_error(
        &on_line_3("stage(\"1m\", max_requests = -1)"),
        3,
        &["max_requests must be an int >= 0, got -1"],
    );
}

#[test]
fn conversation_pool_size_must_cover_concurrency() {
    assert_error(
        &on_line_3(
            "stage(\"1m\", mode = \"conversation_pool\", concurrency = 8, conversation_pool_size = 4)",
        ),
        3,
        &["conversation_pool_size (4) must be >= concurrency (8)"],
    );
    assert_error(
        &on_line_3("stage(\"1m\", conversation_pool_size = 40)"),
        3,
        &["conversation_pool_size applies only to mode=\"conversation_pool\""],
    );
}

#[test]
fn cache_salt_is_random_or_fixed_value() {
    assert_error(
        &on_line_3("workload(\"faker\", cache_salt = \"yes\")"),
        3,
        &["cache_salt must be \"random\" or \"fixed:VALUE\", got \"yes\""],
    );
    assert_error(
        &on_line_3("workload(\"faker\", cache_salt = \"fixed:\")"),
        3,
        &["cache_salt \"fixed:\" needs a value after the colon"],
    );
    assert_error(
        &on_line_3("workload(\"faker\", cache_salt = True)"),
        3,
        &["cache_salt must be \"random\" or \"fixed:VALUE\", got bool True"],
    );
}

#[test]
fn eval_workloads_need_their_dataset_and_ask_one_question_per_request() {
    assert_error(
        &on_line_3("workload(\"gsm8k\")"),
        3,
        &["type \"gsm8k\" needs path: the dataset file (GSM8K's JSONL"],
    );
    assert_error(
        &on_line_3("workload(\"gpqa\", path = \"g.csv\", turns = 2)"),
        3,
        &["type \"gpqa\" asks one question per request: turns must be 1"],
    );
    assert_error(
        &on_line_3("workload(\"gsm8k\", path = \"t.jsonl\", fewshot = 5)"),
        3,
        &["fewshot=5 needs train_path"],
    );
    assert_error(
        &on_line_3("workload(\"gpqa\", path = \"g.csv\", fewshot = 5)"),
        3,
        &["train_path and fewshot are only used by type \"gsm8k\""],
    );
    assert_error(
        &on_line_3("workload(\"faker\", path = \"t.jsonl\")"),
        3,
        &["path is only used by the dataset types \"gsm8k\", \"gpqa\" and \"sharegpt\""],
    );
    assert_error(
        &on_line_3("workload(\"mmlu\")"),
        3,
        &["type must be \"synthetic\", \"faker\", \"corpus\", \"gsm8k\", \"gpqa\" or \"sharegpt\""],
    );
}

#[test]
fn sharegpt_needs_its_file_and_alone_takes_length_limits() {
    assert_error(
        &on_line_3("workload(\"sharegpt\", turns = 3)"),
        3,
        &["type \"sharegpt\" needs path: the ShareGPT file"],
    );
    assert_error(
        &on_line_3("workload(\"faker\", max_isl = 1024)"),
        3,
        &["max_isl and max_osl are only used by type \"sharegpt\""],
    );
    assert_error(
        &on_line_3("workload(\"sharegpt\", path = \"s.json\", max_osl = -1)"),
        3,
        &["max_osl must be an int >= 0 (tokens; 0 = no limit), got"],
    );
    assert_error(
        &on_line_3("workload(\"sharegpt\", path = \"s.json\", fewshot = 2)"),
        3,
        &["train_path and fewshot are only used by type \"gsm8k\""],
    );
    assert_error(
        &on_line_3("workload(\"sharegpt\", path = \"s.json\", max_tokens = 9)"),
        3,
        &["max_tokens", "max_isl=0, max_osl=0)"],
    );
}

#[test]
fn corpus_needs_corpus_path() {
    assert_error(
        &on_line_3("workload(\"corpus\")"),
        3,
        &["type \"corpus\" needs corpus_path"],
    );
    assert_error(
        &on_line_3("workload(\"faker\", corpus_path = \"x.txt\")"),
        3,
        &["corpus_path is only used by type \"corpus\""],
    );
}

#[test]
fn concurrency_and_rate_are_mutually_exclusive() {
    assert_error(
        &on_line_3("stage(\"1m\", mode = \"constant\", rate = 5, concurrency = 4)"),
        3,
        &["concurrency and rate are mutually exclusive"],
    );
    assert_error(
        &on_line_3("stage(\"1m\", concurrency = 4, rate = 5)"),
        3,
        &[
            "concurrency and rate are mutually exclusive",
            "mode=\"constant\" or mode=\"poisson\"",
        ],
    );
    assert_error(
        &on_line_3("stage(\"1m\", max_inflight = 3)"),
        3,
        &["max_inflight applies only to the open-loop modes"],
    );
}

/// `rate=` alone (no `mode=`, no `concurrency=`) is a missing mode, not a
/// clash with a concurrency the user never wrote.
#[test]
fn a_rate_without_a_mode_asks_for_the_mode() {
    for (rate, also) in [
        ("5", None),
        ("0", Some("rate must be a finite number > 0, got 0")),
    ] {
        let all = errors(&on_line_3(&format!("stage(\"1m\", rate = {rate})")));
        let text: Vec<String> = all.iter().map(Diagnostic::to_string).collect();
        assert!(
            text.iter().all(|d| !d.contains("mutually exclusive")),
            "{text:#?}"
        );
        assert!(
            text.iter().any(|d| d.starts_with("t.star:3:")
                && d.contains("rate= needs an open-loop mode")
                && d.contains("mode=\"constant\" or mode=\"poisson\"")),
            "{text:#?}"
        );
        if let Some(also) = also {
            assert!(text.iter().any(|d| d.contains(also)), "{text:#?}");
        }
    }
}

#[test]
fn rate_modes_need_a_rate() {
    for mode in ["constant", "poisson"] {
        assert_error(
            &on_line_3(&format!("stage(\"1m\", mode = \"{mode}\")")),
            3,
            &[&format!("mode \"{mode}\" needs rate=")],
        );
    }
}

#[test]
fn durations() {
    assert_error(
        &on_line_3("stage(\"2x\")"),
        3,
        &["invalid duration \"2x\": unknown unit \"x\"", "\"1m30s\""],
    );
    assert_error(
        &on_line_3("stage(\"1.5\")"),
        3,
        &["missing unit after \"1.5\" (write e.g. \"1.5s\")"],
    );
    assert_error(&on_line_3("stage(0)"), 3, &["duration must be > 0, got 0"]);
    assert_error(&on_line_3("stage(\"0s\")"), 3, &["duration must be > 0"]);
    assert_error(
        &on_line_3("stage(-5)"),
        3,
        &["duration must be > 0, got -5"],
    );
    assert_error(
        &on_line_3("stage(1.5)"),
        3,
        &[
            "duration must be a duration like \"750ms\"",
            "got float 1.5",
        ],
    );
    assert_error(
        &on_line_3("stage(\"1m\", rampup = \"2m\")"),
        3,
        &["rampup (120s) must not be longer than the stage duration (60s)"],
    );
    assert_error(
        &on_line_3("stage(\"1m\", rampup = 0)"),
        3,
        &["rampup must be > 0"],
    );
}

#[test]
fn several_problems_of_one_call_are_reported_together() {
    let all = errors(&on_line_3(
        "stage(\"1m\", concurrency = \"a\", warmup = 2, rate = [])",
    ));
    assert_eq!(all.len(), 3, "{all:#?}");
    assert!(all.iter().all(|d| d.line == Some(3) && d.column == Some(5)));
    assert!(all[0].message.contains("concurrency must be"));
    assert!(all[1].message.contains("rate must be"));
    assert!(all[2].message.contains("warmup must be"));
}

#[test]
fn errors_inside_functions_point_at_the_call_in_the_function() {
    assert_error(
        "def make(c):\n    return stage(\"1m\", concurrency = c)\n\nscenario(stages = [make(c) for c in [4, 0]])\n",
        2,
        &["concurrency must be an int >= 1, got 0"],
    );
}

#[test]
fn barrier_inside_until_congested_is_an_error() {
    let d = assert_error(
        "x = 1\nsweep = until_congested([stage(\"1m\"), barrier()], ttft_p99 = \"2s\")\n",
        2,
        &["stages[1] is a barrier", "put it outside"],
    );
    assert_eq!(d.column, Some(9));
}

#[test]
fn until_congested_arguments() {
    assert_error(
        "until_congested([], a = 1)",
        1,
        &["until_congested(): stages must be a non-empty list of stage(...) values"],
    );
    assert_error(
        "until_congested(stage(\"1m\"))",
        1,
        &["until_congested(): stages must be a list of stage(...) values, got stage"],
    );
    assert_error(
        "until_congested([stage(\"1m\"), 3])",
        1,
        &["stages[1] must be a stage(...), got int 3"],
    );
    assert_error(
        "until_congested([stage(\"1m\")], limits = [1, 2])",
        1,
        &["parameter limits must be a number, a string or a bool, got list [1, 2]"],
    );
    assert_error(
        "until_congested([stage(\"1m\")], refine = 0)",
        1,
        &[
            "until_congested(): refine must be an integer from 1 to 64 (stages of the capacity search), got 0",
        ],
    );
    assert_error(
        "until_congested([stage(\"1m\")], refine = \"4\")",
        1,
        &["refine must be an integer from 1 to 64"],
    );
    assert_error(
        "until_congested([stage(\"1m\")], refine = 2, resolution = 0)",
        1,
        &["resolution must be a number > 0, got 0"],
    );
    assert_error(
        "until_congested([stage(\"1m\")], resolution = 2)",
        1,
        &["resolution is the precision of a capacity search: give refine=N too"],
    );
    assert_error(
        "until_congested([stage(\"1m\")], refine = 2, confirm = 5)",
        1,
        &[
            "confirm must be an integer from 0 to 4 (more verdicts on a level judged near a threshold), got 5",
        ],
    );
    assert_error(
        "until_congested([stage(\"1m\")], confirm = 1)",
        1,
        &["confirm judges a capacity search's close calls again: give refine=N too"],
    );
    assert_error(
        "s = until_congested([stage(\"1m\")], a = 1)\nt = until_congested(s, b = 2)",
        2,
        &["stages[0] already has a stop condition (from until_congested() at t.star:1:5)"],
    );
}

#[test]
fn scenario_stages_must_be_a_non_empty_flat_list() {
    assert_error(
        "x = 1\nscenario(stages = [])",
        2,
        &["stages must not be empty"],
    );
    assert_error(
        "scenario(stages = [barrier()])",
        1,
        &["stages holds only barriers"],
    );
    assert_error(
        "scenario(stages = [[stage(1)]])",
        1,
        &["stages[0] is a list", "join lists with +"],
    );
    assert_error(
        "scenario(stages = [stage(1), \"x\"])",
        1,
        &["stages[1] must be a stage(...) or barrier(...), got string \"x\""],
    );
    assert_error(
        "scenario(stages = stage(1))",
        1,
        &["stages must be a list of stage(...) values, got stage"],
    );
    assert_error(
        "scenario(stages = [stage(1)], workload = \"faker\")",
        1,
        &["scenario(): workload must be a workload(...) value or None"],
    );
}

#[test]
fn too_many_steps_is_an_error_naming_the_limit() {
    assert_error(
        "x = [stage(1)] * 10001\nscenario(stages = x)",
        2,
        &["stages has 10001 entries; the limit is 10000 steps"],
    );
    // Exactly at the limit is fine.
    let s = compile_str("t.star", "scenario(stages = [stage(1)] * 10000)").unwrap();
    assert_eq!(s.steps.len(), 10_000);
}

#[test]
fn scenario_must_be_called_exactly_once() {
    let d = assert_error(
        "scenario(stages = [stage(1)])\n\nscenario(stages = [stage(2)])\n",
        3,
        &["scenario() must be called exactly once; it was already called at t.star:1:1"],
    );
    assert_eq!(d.column, Some(1));
    let all = errors("s = stage(1)\n");
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].line, None);
    assert!(all[0].message.contains("scenario(...) was never called"));
    assert_eq!(
        all[0].to_string(),
        "t.star: scenario(...) was never called: the file must call scenario(stages=[...]) exactly once"
    );
}

#[test]
fn load_is_disabled() {
    assert_error(
        "x = 1\nload(\"common.star\", \"sweep\")\n",
        2,
        &["load(\"common.star\") is disabled", "self-contained"],
    );
}

#[test]
fn ordinary_starlark_errors_are_located_too() {
    assert_error(
        "x = 1\ny = undefined_name\n",
        2,
        &["Variable `undefined_name` not found"],
    );
    assert_error("x = 1\ny = )\n", 2, &["Parse error"]);
    assert_error("x = 1\n\nfail(\"stop here\")\n", 3, &["stop here"]);
    assert_error(
        "x = 1 + \"a\"\n",
        1,
        &["`+` not supported for types `int` and `string`"],
    );
}

#[test]
fn a_malformed_slo_is_refused_at_its_call() {
    assert_error(
        &on_line_3("slo(ttft = \"fast\")"),
        3,
        &["slo(): ttft: invalid duration \"fast\""],
    );
    assert_error(
        &on_line_3("slo(tpot = 0)"),
        3,
        &["slo(): tpot must be > 0, got 0"],
    );
    assert_error(
        &on_line_3("slo(e2e = 1.5)"),
        3,
        &["slo(): e2e must be a duration like"],
    );
    assert_error(
        &on_line_3("slo()"),
        3,
        &["slo(): give at least one goal: ttft=, tpot= or e2e="],
    );
    assert_error(&on_line_3("slo(itl_p99 = \"5ms\")"), 3, &["itl_p99"]);
    assert_error(
        &on_line_3("stage(\"1m\", slo = {\"ttft\": \"1s\"})"),
        3,
        &["stage(): slo must be an slo(...) value or None, got dict"],
    );
    assert_error(
        "x = 1\nscenario(\n  stages = [stage(\"1m\")],\n  slo = \"ttft=1s\")\n",
        2,
        &["scenario(): slo must be an slo(...) value or None, got string"],
    );
}
