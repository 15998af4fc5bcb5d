//! The rules every scenario obeys, checked on the IR itself so that a
//! Starlark file, a hand-written IR `.json` file and a scenario built in
//! code are held to one standard (the scenario compiler and the runner both
//! call these). Each check returns plain messages; callers attach the
//! location.

use crate::scenario::{CacheSalt, Mode, Scenario, Stage, Step, Workload, WorkloadType};

/// At most this many steps (stages and barriers) in one scenario.
pub const MAX_STEPS: usize = 10_000;

/// The spelling of a mode in a scenario file.
pub fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Concurrent => "concurrent",
        Mode::Constant => "constant",
        Mode::Poisson => "poisson",
        Mode::ConversationPool => "conversation_pool",
    }
}

/// Problems with one workload.
pub fn workload_problems(w: &Workload) -> Vec<String> {
    let mut out = Vec::new();
    for (name, value) in [("isl", w.isl), ("osl", w.osl), ("turns", w.turns)] {
        if value < 1 {
            out.push(format!("{name} must be an int >= 1, got {value}"));
        }
    }
    if w.subsequent_isl == Some(0) {
        out.push("subsequent_isl must be an int >= 1 (or None to reuse isl), got 0".into());
    }
    let has_path = w.corpus_path.as_deref().is_some_and(|p| !p.is_empty());
    match w.kind {
        WorkloadType::Corpus if !has_path => out.push(
            "type \"corpus\" needs corpus_path: the path of a text file to draw prompts from"
                .into(),
        ),
        WorkloadType::Corpus => {}
        _ if w.corpus_path.is_some() => out.push(
            "corpus_path is only used by type \"corpus\"; remove it or set type=\"corpus\"".into(),
        ),
        _ => {}
    }
    let kind = w.kind.name();
    if w.kind.is_eval() {
        if w.path.as_deref().is_none_or(str::is_empty) {
            out.push(format!(
                "type \"{kind}\" needs path: the dataset file ({})",
                if w.kind == WorkloadType::Gsm8k {
                    "GSM8K's JSONL of question/answer"
                } else {
                    "GPQA's CSV, or JSONL with its columns"
                }
            ));
        }
        if w.turns > 1 {
            out.push(format!(
                "type \"{kind}\" asks one question per request: turns must be 1"
            ));
        }
    } else if w.kind == WorkloadType::ShareGpt {
        if w.path.as_deref().is_none_or(str::is_empty) {
            out.push(
                "type \"sharegpt\" needs path: the ShareGPT file (a JSON array of conversations, or JSONL)"
                    .into(),
            );
        }
    } else if w.path.is_some() {
        out.push(format!(
            "path is only used by the dataset types \"gsm8k\", \"gpqa\" and \"sharegpt\" (type \"{kind}\" reads corpus_path)"
        ));
    }
    if w.kind != WorkloadType::ShareGpt && (w.max_isl > 0 || w.max_osl > 0) {
        out.push(format!(
            "max_isl and max_osl are only used by type \"sharegpt\" (type \"{kind}\" sets lengths with isl and osl)"
        ));
    }
    if w.kind != WorkloadType::Gsm8k && (w.train_path.is_some() || w.fewshot > 0) {
        out.push("train_path and fewshot are only used by type \"gsm8k\"".into());
    }
    if w.kind == WorkloadType::Gsm8k && w.fewshot > 0 && w.train_path.is_none() {
        out.push(format!(
            "fewshot={} needs train_path: the GSM8K train file the worked examples come from",
            w.fewshot
        ));
    }
    if !(w.chars_per_token.is_finite() && w.chars_per_token >= 0.0) {
        out.push(format!(
            "chars_per_token must be a finite number >= 0 (0 = calibrate from the server), got {}",
            w.chars_per_token
        ));
    }
    if let Some(CacheSalt::Fixed(value)) = &w.cache_salt
        && value.is_empty()
    {
        out.push("cache_salt \"fixed:\" needs a value after the colon, e.g. \"fixed:run1\"".into());
    }
    if w.name.as_deref() == Some("") {
        out.push("workload name must not be empty (or None)".into());
    }
    out
}

/// Problems with one stage (its own settings; not its place in the scenario).
pub fn stage_problems(s: &Stage) -> Vec<String> {
    let mut out = Vec::new();
    if !(s.duration_s.is_finite() && s.duration_s > 0.0) {
        out.push(format!("duration must be > 0, got {}s", s.duration_s));
    }
    let mode = mode_name(s.mode);
    match s.mode {
        Mode::Concurrent | Mode::ConversationPool => {
            match s.concurrency {
                None => out.push(format!("mode \"{mode}\" needs concurrency (an int >= 1)")),
                Some(0) => out.push("concurrency must be an int >= 1, got 0".into()),
                Some(_) => {}
            }
            if s.rate.is_some() {
                out.push(format!(
                    "concurrency and rate are mutually exclusive: mode \"{mode}\" runs `concurrency` streams and takes no rate; for a request rate use mode=\"constant\" or mode=\"poisson\" with rate=",
                ));
            }
            if s.max_inflight != 0 {
                out.push(format!(
                    "max_inflight applies only to the open-loop modes \"constant\" and \"poisson\", not to mode \"{mode}\""
                ));
            }
        }
        Mode::Constant | Mode::Poisson => {
            match s.rate {
                None => out.push(format!(
                    "mode \"{mode}\" needs rate= (requests per second, a number > 0)"
                )),
                Some(rate) if !(rate.is_finite() && rate > 0.0) => {
                    out.push(format!("rate must be a finite number > 0, got {rate}"))
                }
                Some(_) => {}
            }
            if s.concurrency.is_some() {
                out.push(format!(
                    "concurrency and rate are mutually exclusive: mode \"{mode}\" sends requests at `rate` per second and takes no concurrency"
                ));
            }
        }
    }
    if let Some(rampup) = s.rampup_s {
        if !(rampup.is_finite() && rampup > 0.0) {
            out.push(format!(
                "rampup must be > 0 (or None for no ramp), got {rampup}s"
            ));
        } else if rampup > s.duration_s {
            out.push(format!(
                "rampup ({rampup}s) must not be longer than the stage duration ({}s)",
                s.duration_s
            ));
        }
    }
    if s.conversation_pool_size != 0 {
        if s.mode != Mode::ConversationPool {
            out.push(format!(
                "conversation_pool_size applies only to mode=\"conversation_pool\", not to mode \"{mode}\""
            ));
        } else if let Some(c) = s.concurrency
            && s.conversation_pool_size < c
        {
            out.push(format!(
                "conversation_pool_size ({}) must be >= concurrency ({c}): every stream needs its own conversation",
                s.conversation_pool_size
            ));
        }
    }
    if let Some(w) = &s.workload {
        out.extend(
            workload_problems(w)
                .into_iter()
                .map(|p| format!("workload: {p}")),
        );
    }
    for (field, value) in [
        ("name", &s.name),
        ("target", &s.target),
        ("model", &s.model),
    ] {
        if value.as_deref() == Some("") {
            out.push(format!("{field} must not be empty (or None)"));
        }
    }
    if let Some(stop) = &s.stop {
        let mut seen = std::collections::HashSet::new();
        for p in &stop.params {
            if p.name.is_empty() {
                out.push("until_congested parameter names must not be empty".into());
            } else if !seen.insert(p.name.as_str()) {
                out.push(format!(
                    "until_congested parameter {:?} is given twice",
                    p.name
                ));
            }
            if let crate::scenario::Value::Number(n) = p.value
                && !n.is_finite()
            {
                out.push(format!(
                    "until_congested parameter {:?} must be finite, got {n}",
                    p.name
                ));
            }
        }
    }
    out
}

/// Problems with the scenario as a whole (not with its stages one by one).
pub fn scenario_problems(s: &Scenario) -> Vec<String> {
    let mut out = Vec::new();
    if s.steps.is_empty() {
        out.push("stages must not be empty: give at least one stage(...)".into());
    } else if !s.steps.iter().any(|step| matches!(step, Step::Stage(_))) {
        out.push("stages holds only barriers: give at least one stage(...)".into());
    }
    if s.steps.len() > MAX_STEPS {
        out.push(format!(
            "the scenario has {} steps (stages and barriers); the limit is {MAX_STEPS}",
            s.steps.len()
        ));
    }
    out.extend(
        workload_problems(&s.workload)
            .into_iter()
            .map(|p| format!("workload: {p}")),
    );
    for (field, value) in [("target", &s.target), ("model", &s.model)] {
        if value.as_deref() == Some("") {
            out.push(format!("{field} must not be empty (or None)"));
        }
    }
    out
}
