//! Evaluation is bounded: runaway loops, huge sequences, deep nesting and
//! huge files fail with a clear message instead of hanging or exhausting
//! memory. No timing is asserted (the budgets themselves are in the message).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use nyann_scenario::{Diagnostic, Limits, compile_str, compile_str_within};

fn only_error(src: &str) -> Diagnostic {
    let err = compile_str("t.star", src).unwrap_err();
    let all = err.diagnostics();
    assert_eq!(all.len(), 1, "{err}");
    all[0].clone()
}

/// The step budget (release builds), the time budget (debug builds, where
/// starlark is slower) or, for a loop that also allocates, the memory budget
/// stops the program; any of them is the budget message.
fn assert_budget(d: &Diagnostic) {
    assert!(
        (d.message.starts_with("evaluation exceeded its")
            || d.message.starts_with("the scenario ran past its"))
            && d.message.contains("budget")
            && d.message.contains("a scenario should"),
        "{d}"
    );
}

#[test]
fn huge_range_is_refused_up_front() {
    let d = only_error("x = 1\nfor i in range(1000000000): pass\n");
    assert_eq!(d.line, Some(2));
    assert!(
        d.message
            .contains("range() of 1000000000 numbers exceeds the limit of 1000000"),
        "{d}"
    );
    let d = only_error("x = [i for i in range(100000000)]");
    assert!(d.message.contains("exceeds the limit of 1000000"), "{d}");
    let d = only_error("x = list(range(0, 2000000000, 2))");
    assert!(d.message.contains("range() of 1000000000 numbers"), "{d}");
}

#[test]
fn runaway_pass_loop_hits_the_budget() {
    let d =
        only_error("x = 1\nfor i in range(1000000):\n    for j in range(1000000):\n        pass\n");
    assert_budget(&d);
    assert!(matches!(d.line, Some(2..=4)), "{d}");
}

/// A caller's smaller step budget (the run service's) stops what the
/// default allows, and says its own figure.
#[test]
fn a_smaller_step_budget_is_kept_and_named() {
    let src = "n = 0\nfor i in range(300000):\n    pass\nscenario(workload=workload(\"faker\"), stages=[stage(\"1s\", concurrency=1)])\n";
    compile_str("t.star", src).unwrap();
    let limits = Limits { max_steps: 100_000 };
    let err = compile_str_within("t.star", src, limits).unwrap_err();
    let d = &err.diagnostics()[0];
    assert!(
        d.message
            .starts_with("the scenario ran past its budget of 100,000 steps (loop iterations"),
        "{d}"
    );
    assert!(matches!(d.line, Some(2..=3)), "{d}");
}

#[test]
fn runaway_comprehension_hits_the_budget() {
    let d = only_error(
        "def f():\n    return [i for i in range(1000000) for j in range(1000000)]\nx = f()\n",
    );
    assert_budget(&d);
}

#[test]
fn runaway_loop_with_work_hits_the_budget() {
    let d = only_error(
        "t = 0\nfor i in range(1000000):\n    for j in range(1000000):\n        t = t + i * j\n",
    );
    assert_budget(&d);
}

#[test]
fn sequence_repetition_is_bounded() {
    let d = only_error("x = 1\ns = \"x\" * 10000000000\n");
    assert_eq!(d.line, Some(2));
    assert!(
        d.message
            .contains("`*` would build a string of 10000000000 elements; the limit is 1000000"),
        "{d}"
    );
    let d = only_error("x = [0] * 1000000000");
    assert!(
        d.message
            .contains("`*` would build a list of 1000000000 elements"),
        "{d}"
    );
    let d = only_error("x = 1000000000 * (0,)");
    assert!(d.message.contains("`*` would build a tuple"), "{d}");
    // Ordinary arithmetic and small repetitions still work.
    let s = compile_str(
        "t.star",
        "n = 3 * 4 + 1.5 * 2\nx = [stage(1)] * 2 + [barrier()] + 2 * [stage(\"1s\")]\nscenario(stages = x if n == 15.0 else [])",
    )
    .unwrap();
    assert_eq!(s.steps.len(), 5);
}

#[test]
fn doubling_by_concatenation_is_bounded() {
    let d = only_error("s = \"ab\"\nfor i in range(64):\n    s = s + s\n");
    assert!(d.message.contains("`+` would build a string of"), "{d}");
    assert_eq!(d.line, Some(3));
}

#[test]
fn doubling_in_place_hits_the_memory_budget() {
    let d = only_error("s = \"x\"\nfor i in range(64):\n    s += s\n");
    assert!(
        d.message
            .contains("evaluation exceeded its memory budget of 256 MiB"),
        "{d}"
    );
    assert_eq!(d.line, Some(3));
}

#[test]
fn multiply_assign_is_refused() {
    let d = only_error("x = 1\nx *= 2\n");
    assert_eq!(d.line, Some(2));
    assert!(d.message.contains("`*=` is not supported"), "{d}");
}

#[test]
fn oversized_sources_are_refused() {
    let src = format!("# {}\n", "x".repeat(nyann_scenario::MAX_SOURCE_BYTES));
    let d = only_error(&src);
    assert_eq!(d.line, None);
    assert!(d.message.contains("the limit is 1048576 bytes"), "{d}");
}

#[test]
fn deep_nesting_is_refused_instead_of_overflowing_the_stack() {
    let d = only_error(&format!(
        "x = 1\ny = {}1{}\n",
        "[".repeat(50_000),
        "]".repeat(50_000)
    ));
    assert_eq!(d.line, Some(2));
    assert!(
        d.message.contains("brackets are nested more than 100 deep"),
        "{d}"
    );
    let d = only_error(&format!("y = {}\n", vec!["1"; 100_000].join("+")));
    assert!(d.message.contains("more than 20000 tokens"), "{d}");
    let d = only_error(&format!("y = {}1\n", "-".repeat(10_000)));
    assert!(d.message.contains("nested too deeply"), "{d}");
    let d = only_error(&format!("y = {}1\n", "not ".repeat(10_000)));
    assert!(d.message.contains("nested too deeply"), "{d}");
}

#[test]
fn recursion_is_an_error() {
    let d = only_error("def f(n):\n    return f(n)\n\nf(1)\n");
    assert_eq!(d.line, Some(2), "{d}");
}
