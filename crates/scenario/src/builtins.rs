//! The scenario builtins (`workload`, `stage`, `barrier`, `until_congested`,
//! `scenario`) and the guarded replacements of `range`, `*` and `+` that keep
//! evaluation bounded.
//!
//! Every builtin checks its arguments strictly (a wrong type is an error,
//! never a silent default) and reports all problems of one call together,
//! located at the call.

// The builtins' Rust signatures mirror the Starlark ones, keyword for
// keyword, and `#[starlark_module]` emits items an item-level allow misses.
#![allow(clippy::too_many_arguments)]

use std::fmt;
use std::num::NonZeroI32;

use nyann_model::{
    CacheSalt, CapacitySearch, Mode, Param, Scenario, SourceLocation, Stage, Step, StopCondition,
    Workload, WorkloadType,
};
use starlark::collections::SmallMap;
use starlark::environment::GlobalsBuilder;
use starlark::eval::Evaluator;
use starlark::starlark_module;
use starlark::values::float::UnpackFloat;
use starlark::values::list::{AllocList, ListRef};
use starlark::values::none::NoneType;
use starlark::values::range::Range;
use starlark::values::tuple::TupleRef;
use starlark::values::{UnpackValue, Value};

use crate::validate::{MAX_STEPS, scenario_problems, stage_problems, workload_problems};
use crate::values::{BarrierValue, StageValue, State, WorkloadValue};
use nyann_model::{DURATION_HELP, parse_seconds};

/// Longest `range(...)` a scenario may build. Scenarios need a few thousand
/// numbers at most; refusing huge ranges up front stops `list(range(10**9))`
/// and friends before they allocate, which the step budget cannot do.
pub const MAX_RANGE_LEN: i64 = 1_000_000;

/// Longest string or list that `*` and `+` may build, for the same reason.
pub const MAX_SEQUENCE_LEN: i64 = 1_000_000;

/// The problems of one builtin call, raised as a single Starlark error and
/// split back into one diagnostic each (see `compile`).
#[derive(Debug)]
pub(crate) struct CallProblems {
    pub(crate) location: Option<SourceLocation>,
    pub(crate) messages: Vec<String>,
}

impl fmt::Display for CallProblems {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.messages.join("; "))
    }
}

impl std::error::Error for CallProblems {}

/// Numbers the sweeps 0, 1, ... in the order they appear in the scenario
/// (an `until_congested(...)` result left unused leaves no gap).
fn number_sweeps(steps: &mut [Step]) {
    let mut seen: Vec<u32> = Vec::new();
    for step in steps {
        if let Step::Stage(stage) = step
            && stage.stop.is_some()
        {
            let n = match seen.iter().position(|s| *s == stage.sweep) {
                Some(n) => n,
                None => {
                    seen.push(stage.sweep);
                    seen.len() - 1
                }
            };
            stage.sweep = u32::try_from(n).unwrap_or(u32::MAX);
        }
    }
}

/// Where the builtin now running was called from (1-based line and column).
fn call_location(eval: &Evaluator) -> Option<SourceLocation> {
    let span = eval.call_stack_top_location()?;
    let resolved = span.resolve();
    Some(SourceLocation {
        file: resolved.file,
        line: u32::try_from(resolved.span.begin.line + 1).unwrap_or(u32::MAX),
        column: u32::try_from(resolved.span.begin.column + 1).unwrap_or(u32::MAX),
    })
}

/// Where keyword argument `name` is written in the call now running, found
/// by scanning the call's source text for `name =` outside strings,
/// comments and nested brackets. `None` when it is not written there (for
/// example passed through `**kwargs`).
fn keyword_location(eval: &Evaluator, name: &str) -> Option<SourceLocation> {
    let call = eval.call_stack_top_location()?;
    let text = call.source_span();
    let bytes = text.as_bytes();
    let mut depth = 0u32;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'#' => {
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
            }
            quote @ (b'"' | b'\'') => {
                let triple = text[i..].starts_with(&String::from(quote as char).repeat(3));
                let (open, close) = if triple { (3, 3) } else { (1, 1) };
                i += open;
                while i < bytes.len() {
                    if bytes[i] == b'\\' {
                        i += 2;
                        continue;
                    }
                    if bytes[i] == quote
                        && (!triple || bytes[i..].starts_with(&[quote, quote, quote]))
                    {
                        i += close - 1;
                        break;
                    }
                    i += 1;
                }
            }
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' => depth = depth.saturating_sub(1),
            c if depth == 1 && (c.is_ascii_alphabetic() || c == b'_') => {
                let start = i;
                while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                    i += 1;
                }
                let rest = text[i..].trim_start();
                if &text[start..i] == name && rest.starts_with('=') && !rest.starts_with("==") {
                    let offset = u32::try_from(start).ok()?;
                    let pos = starlark::codemap::Pos::new(call.span.begin().get() + offset);
                    let resolved = call
                        .file
                        .resolve_span(starlark::codemap::Span::new(pos, pos));
                    return Some(SourceLocation {
                        file: call.filename().to_string(),
                        line: u32::try_from(resolved.begin.line + 1).unwrap_or(u32::MAX),
                        column: u32::try_from(resolved.begin.column + 1).unwrap_or(u32::MAX),
                    });
                }
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    None
}

fn raise(location: Option<SourceLocation>, messages: Vec<String>) -> starlark::Error {
    starlark::Error::new_native(anyhow::Error::new(CallProblems { location, messages }))
}

fn state<'a>(eval: &Evaluator<'_, 'a, '_>) -> starlark::Result<&'a State> {
    eval.extra
        .and_then(|extra| extra.downcast_ref::<State>())
        .ok_or_else(|| {
            starlark::Error::new_other(anyhow::anyhow!(
                "internal error: scenario builtins evaluated without their state"
            ))
        })
}

/// A value as it appears in a message: its type and a short repr.
fn show(v: Value) -> String {
    let mut repr = v.to_repr();
    if repr.chars().count() > 60 {
        repr = repr.chars().take(57).collect::<String>() + "...";
    }
    format!("{} {}", v.get_type(), repr)
}

/// Treats an explicit `None` like an omitted argument.
fn given(v: Option<Value>) -> Option<Value> {
    v.filter(|v| !v.is_none())
}

/// Collects the problems of one call while converting its arguments.
struct Args {
    func: &'static str,
    problems: Vec<String>,
}

impl Args {
    fn new(func: &'static str) -> Self {
        Args {
            func,
            problems: Vec::new(),
        }
    }

    fn problem(&mut self, message: String) {
        self.problems.push(format!("{}(): {message}", self.func));
    }

    /// An int in `min..=max`; `expected` describes the range for the message.
    fn int(&mut self, name: &str, v: Value, min: i64, max: i64, expected: &str) -> Option<i64> {
        match i64::unpack_value(v) {
            Ok(Some(n)) if (min..=max).contains(&n) => Some(n),
            Ok(Some(_)) | Err(_) if v.get_type() == "int" => {
                self.problem(format!("{name} must be {expected}, got {}", v.to_repr()));
                None
            }
            _ => {
                self.problem(format!("{name} must be {expected}, got {}", show(v)));
                None
            }
        }
    }

    /// An int that fits in `u32`. Range rules beyond that (such as `>= 1`)
    /// belong to the IR validation, which then reports them with the other
    /// problems of the call; `expected` still states them for the message.
    fn u32(&mut self, name: &str, v: Value, expected: &str) -> Option<u32> {
        let n = self.int(name, v, 0, i64::from(u32::MAX), expected)?;
        u32::try_from(n).ok()
    }

    /// An int or a float.
    fn number(&mut self, name: &str, v: Value, expected: &str) -> Option<f64> {
        match UnpackFloat::unpack_value(v) {
            Ok(Some(UnpackFloat(x))) => Some(x),
            _ => {
                self.problem(format!("{name} must be {expected}, got {}", show(v)));
                None
            }
        }
    }

    fn string(&mut self, name: &str, v: Value, expected: &str) -> Option<String> {
        match v.unpack_str() {
            Some(s) => Some(s.to_owned()),
            None => {
                self.problem(format!("{name} must be {expected}, got {}", show(v)));
                None
            }
        }
    }

    fn opt_string(&mut self, name: &str, v: Option<Value>) -> Option<String> {
        let v = given(v)?;
        self.string(name, v, "a string or None")
    }

    fn bool(&mut self, name: &str, v: Option<Value>) -> bool {
        let Some(v) = v else { return false };
        match v.unpack_bool() {
            Some(b) => b,
            None => {
                self.problem(format!("{name} must be True or False, got {}", show(v)));
                false
            }
        }
    }

    /// A duration string or integer seconds, > 0, as seconds.
    fn duration(&mut self, name: &str, v: Value) -> Option<f64> {
        let seconds = if let Some(text) = v.unpack_str() {
            match parse_seconds(text) {
                Ok(s) => s,
                Err(e) => {
                    self.problem(format!("{name}: {e}"));
                    return None;
                }
            }
        } else if v.get_type() == "int" {
            match i64::unpack_value(v) {
                Ok(Some(n)) => n as f64,
                _ => {
                    self.problem(format!("{name} is too large: {}", v.to_repr()));
                    return None;
                }
            }
        } else {
            self.problem(format!("{name} must be {DURATION_HELP}; got {}", show(v)));
            return None;
        };
        if seconds <= 0.0 {
            self.problem(format!("{name} must be > 0, got {}", v.to_repr()));
            return None;
        }
        Some(seconds)
    }

    fn finish<T>(self, location: Option<SourceLocation>, value: T) -> starlark::Result<T> {
        if self.problems.is_empty() {
            Ok(value)
        } else {
            Err(raise(location, self.problems))
        }
    }
}

/// The keywords of `until_congested(...)` that are its own, not the
/// policy's.
const SEARCH_KEYWORDS: [&str; 3] = ["refine", "resolution", "confirm"];

/// Most stages a capacity search may add after a sweep (`refine=`).
pub const MAX_REFINE: i64 = 64;

/// Most more times a close call is judged (`confirm=`).
pub const MAX_CONFIRM: i64 = 4;

/// `refine=N, resolution=R, confirm=M` of `until_congested(...)`.
fn capacity_search(
    refine: Option<&Value>,
    resolution: Option<&Value>,
    confirm: Option<&Value>,
) -> Result<Option<CapacitySearch>, Vec<String>> {
    // `None` is the documented default of all three: no search.
    let refine = refine.filter(|v| !v.is_none());
    let resolution = resolution.filter(|v| !v.is_none());
    let confirm = confirm.filter(|v| !v.is_none());
    let mut a = Args::new("until_congested");
    let stages = refine.and_then(|&v| {
        let expected = format!("an integer from 1 to {MAX_REFINE} (stages of the capacity search)");
        a.int("refine", v, 1, MAX_REFINE, &expected)
    });
    let resolution = resolution.and_then(|&v| {
        let r = a.number(
            "resolution",
            v,
            "a number > 0 (how close the search's bounds must come)",
        )?;
        if !(r.is_finite() && r > 0.0) {
            a.problem(format!(
                "resolution must be a number > 0, got {}",
                v.to_repr()
            ));
            return None;
        }
        Some(r)
    });
    let confirm = confirm.and_then(|&v| {
        let expected = format!(
            "an integer from 0 to {MAX_CONFIRM} (more verdicts on a level judged near a threshold)"
        );
        a.int("confirm", v, 0, MAX_CONFIRM, &expected)
    });
    if resolution.is_some() && refine.is_none() {
        a.problem(
            "resolution is the precision of a capacity search: give refine=N too (the search's most stages)"
                .into(),
        );
    }
    if confirm.is_some() && refine.is_none() {
        a.problem(
            "confirm judges a capacity search's close calls again: give refine=N too (the search's most stages)"
                .into(),
        );
    }
    if !a.problems.is_empty() {
        return Err(a.problems);
    }
    Ok(stages.map(|stages| CapacitySearch {
        stages: stages as u32,
        resolution,
        confirm: confirm.unwrap_or(0) as u32,
    }))
}

/// Stage and barrier values in a list or tuple, as IR steps. `func` names the
/// caller for messages.
fn list_items<'v>(func: &str, v: Value<'v>) -> Result<&'v [Value<'v>], String> {
    if let Some(list) = ListRef::from_value(v) {
        Ok(list.content())
    } else if let Some(tuple) = TupleRef::from_value(v) {
        Ok(tuple.content())
    } else {
        Err(format!(
            "{func}(): stages must be a list of stage(...) values, got {}",
            show(v)
        ))
    }
}

/// A Starlark parameter value of `until_congested` as a typed IR value.
fn param_value(v: Value) -> Result<nyann_model::Value, String> {
    if let Some(b) = v.unpack_bool() {
        return Ok(nyann_model::Value::Flag(b));
    }
    if let Some(s) = v.unpack_str() {
        return Ok(nyann_model::Value::Text(s.to_owned()));
    }
    if matches!(v.get_type(), "int" | "float") {
        if let Ok(Some(UnpackFloat(x))) = UnpackFloat::unpack_value(v)
            && x.is_finite()
        {
            return Ok(nyann_model::Value::Number(x));
        }
        return Err(format!("must be a finite number, got {}", v.to_repr()));
    }
    Err(format!(
        "must be a number, a string or a bool, got {}",
        show(v)
    ))
}

/// Every builtin of the scenario language, one module per kind.
pub(crate) fn scenario_builtins(builder: &mut GlobalsBuilder) {
    workload_builtins(builder);
    stage_builtins(builder);
    sweep_builtins(builder);
    scenario_builtin(builder);
    bounded_builtins(builder);
}

/// What the prompts look like.
#[starlark_module]
fn workload_builtins(builder: &mut GlobalsBuilder) {
    /// `workload(type, isl=128, osl=256, turns=1, subsequent_isl=None,
    /// corpus_path=None, chars_per_token=0.0, cache_salt=None, name=None,
    /// path=None, train_path=None, fewshot=0, max_isl=0, max_osl=0)`: what
    /// the prompts look like (`gsm8k` and `gpqa`: an eval dataset's
    /// questions, scored; `sharegpt`: recorded conversations replayed).
    fn workload<'v>(
        r#type: Value<'v>,
        isl: Option<Value<'v>>,
        osl: Option<Value<'v>>,
        turns: Option<Value<'v>>,
        subsequent_isl: Option<Value<'v>>,
        corpus_path: Option<Value<'v>>,
        chars_per_token: Option<Value<'v>>,
        cache_salt: Option<Value<'v>>,
        name: Option<Value<'v>>,
        path: Option<Value<'v>>,
        train_path: Option<Value<'v>>,
        fewshot: Option<Value<'v>>,
        max_isl: Option<Value<'v>>,
        max_osl: Option<Value<'v>>,
        eval: &mut Evaluator<'v, '_, '_>,
    ) -> starlark::Result<Value<'v>> {
        let location = call_location(eval);
        let mut a = Args::new("workload");
        let types = "\"synthetic\", \"faker\", \"corpus\", \"gsm8k\", \"gpqa\" or \"sharegpt\"";
        let kind = match a.string("type", r#type, types) {
            Some(t) => match t.as_str() {
                "synthetic" => Some(WorkloadType::Synthetic),
                "faker" => Some(WorkloadType::Faker),
                "corpus" => Some(WorkloadType::Corpus),
                "gsm8k" => Some(WorkloadType::Gsm8k),
                "gpqa" => Some(WorkloadType::Gpqa),
                "sharegpt" => Some(WorkloadType::ShareGpt),
                other => {
                    a.problem(format!("type must be {types}, got {other:?}"));
                    None
                }
            },
            None => None,
        };
        let defaults = Workload::default();
        let count = |a: &mut Args, name: &str, v: Option<Value>, default: u32| match v {
            None => default,
            Some(v) => a.u32(name, v, "an int >= 1").unwrap_or(default),
        };
        let isl = count(&mut a, "isl", isl, defaults.isl);
        let osl = count(&mut a, "osl", osl, defaults.osl);
        let turns = count(&mut a, "turns", turns, defaults.turns);
        let subsequent_isl =
            given(subsequent_isl).and_then(|v| a.u32("subsequent_isl", v, "an int >= 1 or None"));
        let corpus_path = a.opt_string("corpus_path", corpus_path);
        let chars_per_token = match chars_per_token {
            None => 0.0,
            Some(v) => a
                .number("chars_per_token", v, "a number >= 0 (0 = calibrate)")
                .unwrap_or(0.0),
        };
        let cache_salt = given(cache_salt).and_then(|v| {
            let expected = "\"random\" or \"fixed:VALUE\"";
            let text = a.string("cache_salt", v, expected)?;
            if text == "random" {
                Some(CacheSalt::Random)
            } else if let Some(value) = text.strip_prefix("fixed:") {
                Some(CacheSalt::Fixed(value.to_owned()))
            } else {
                a.problem(format!("cache_salt must be {expected}, got {text:?}"));
                None
            }
        });
        let name = a.opt_string("name", name);
        let path = a.opt_string("path", path);
        let train_path = a.opt_string("train_path", train_path);
        let fewshot = match fewshot {
            None => 0,
            Some(v) => a.u32("fewshot", v, "an int >= 0").unwrap_or(0),
        };
        let mut limit = |name: &str, v: Option<Value>| match v {
            None => 0,
            Some(v) => a
                .u32(name, v, "an int >= 0 (tokens; 0 = no limit)")
                .unwrap_or(0),
        };
        let max_isl = limit("max_isl", max_isl);
        let max_osl = limit("max_osl", max_osl);
        let workload = Workload {
            kind: kind.unwrap_or(WorkloadType::Faker),
            isl,
            osl,
            turns,
            subsequent_isl,
            corpus_path,
            chars_per_token,
            cache_salt,
            name,
            path,
            train_path,
            fewshot,
            max_isl,
            max_osl,
        };
        if a.problems.is_empty() {
            for p in workload_problems(&workload) {
                a.problem(p);
            }
        }
        let value = a.finish(location, WorkloadValue { workload })?;
        Ok(eval.heap().alloc(value))
    }
}

/// The steps of a scenario.
#[starlark_module]
fn stage_builtins(builder: &mut GlobalsBuilder) {
    /// `stage(duration, concurrency=10, rate=None, mode="concurrent",
    /// max_inflight=0, max_requests=0, rampup=None, workload=None,
    /// target=None, model=None, name=None, warmup=False,
    /// conversation_pool_size=0)`: a timed period of load.
    fn stage<'v>(
        duration: Value<'v>,
        concurrency: Option<Value<'v>>,
        rate: Option<Value<'v>>,
        mode: Option<Value<'v>>,
        max_inflight: Option<Value<'v>>,
        max_requests: Option<Value<'v>>,
        rampup: Option<Value<'v>>,
        workload: Option<Value<'v>>,
        target: Option<Value<'v>>,
        model: Option<Value<'v>>,
        name: Option<Value<'v>>,
        warmup: Option<Value<'v>>,
        conversation_pool_size: Option<Value<'v>>,
        eval: &mut Evaluator<'v, '_, '_>,
    ) -> starlark::Result<Value<'v>> {
        let location = call_location(eval);
        let mut a = Args::new("stage");
        let duration_s = a.duration("duration", duration);
        let modes = "\"concurrent\", \"constant\", \"poisson\" or \"conversation_pool\"";
        let mode_given = mode.is_some();
        let concurrency_given = given(concurrency).is_some();
        let mode = match mode {
            None => Some(Mode::Concurrent),
            Some(v) => match a.string("mode", v, modes).as_deref() {
                Some("concurrent") => Some(Mode::Concurrent),
                Some("constant") => Some(Mode::Constant),
                Some("poisson") => Some(Mode::Poisson),
                Some("conversation_pool") => Some(Mode::ConversationPool),
                Some(other) => {
                    a.problem(format!("mode must be {modes}, got {other:?}"));
                    None
                }
                None => None,
            },
        };
        let concurrency = given(concurrency).and_then(|v| a.u32("concurrency", v, "an int >= 1"));
        let rate =
            given(rate).and_then(|v| a.number("rate", v, "a number > 0 (requests per second)"));
        let max_inflight = max_inflight
            .and_then(|v| a.u32("max_inflight", v, "an int >= 0"))
            .unwrap_or(0);
        let max_requests = max_requests
            .and_then(|v| a.int("max_requests", v, 0, i64::MAX, "an int >= 0"))
            .and_then(|n| u64::try_from(n).ok())
            .unwrap_or(0);
        let rampup_s = given(rampup).and_then(|v| a.duration("rampup", v));
        let workload = given(workload).and_then(|v| match WorkloadValue::from_value(v) {
            Some(w) => Some(w.workload.clone()),
            None => {
                a.problem(format!(
                    "workload must be a workload(...) value or None, got {}",
                    show(v)
                ));
                None
            }
        });
        let target = a.opt_string("target", target);
        let model = a.opt_string("model", model);
        let name = a.opt_string("name", name);
        let warmup = a.bool("warmup", warmup);
        let conversation_pool_size = conversation_pool_size
            .and_then(|v| a.u32("conversation_pool_size", v, "an int >= 0"))
            .unwrap_or(0);
        let mode = mode.unwrap_or(Mode::Concurrent);
        let concurrency = match mode {
            // Closed-loop modes always have a stream count; 10 as in the Go tool.
            Mode::Concurrent | Mode::ConversationPool => Some(concurrency.unwrap_or(10)),
            Mode::Constant | Mode::Poisson => concurrency,
        };
        let stage = Stage {
            name,
            duration_s: duration_s.unwrap_or(1.0),
            mode,
            concurrency,
            rate,
            max_inflight,
            max_requests,
            rampup_s,
            workload,
            target,
            model,
            warmup,
            conversation_pool_size,
            stop: None,
            sweep: 0,
            location: location.clone(),
        };
        if let Some(rate) = stage.rate
            && !mode_given
            && !concurrency_given
        {
            // `rate=` alone: the mode is missing (no concurrency clashes).
            a.problem(
                "rate= needs an open-loop mode: add mode=\"constant\" or mode=\"poisson\" \
                 (without mode=, a stage runs `concurrency` closed-loop streams)"
                    .into(),
            );
            if !(rate.is_finite() && rate > 0.0) {
                a.problem(format!("rate must be a finite number > 0, got {rate}"));
            }
        }
        if a.problems.is_empty() {
            for p in stage_problems(&stage) {
                a.problem(p);
            }
        }
        let value = a.finish(location, StageValue { stage })?;
        Ok(eval.heap().alloc(value))
    }

    /// `barrier(drain=False)`: a synchronisation point between stages; with
    /// `drain`, wait until no request is in flight.
    fn barrier<'v>(
        drain: Option<Value<'v>>,
        eval: &mut Evaluator<'v, '_, '_>,
    ) -> starlark::Result<Value<'v>> {
        let location = call_location(eval);
        let mut a = Args::new("barrier");
        let drain = a.bool("drain", drain);
        let value = a.finish(location, BarrierValue { drain })?;
        Ok(eval.heap().alloc(value))
    }
}

/// Sweeps that stop on congestion.
#[starlark_module]
fn sweep_builtins(builder: &mut GlobalsBuilder) {
    /// `until_congested(stages, refine=None, resolution=None, confirm=None,
    /// **params)`: a copy of `stages` in which every stage stops the sweep
    /// once the active congestion policy judges it congested. `refine=N`
    /// then searches the capacity between the last clean level and the
    /// congested one with at most N more levels, until the bounds are
    /// `resolution` apart; `confirm=M` judges a level whose verdict was a
    /// close call up to M more times before the search moves on. The other
    /// keyword parameters go to that policy as written.
    fn until_congested<'v>(
        stages: Value<'v>,
        #[starlark(kwargs)] params: SmallMap<String, Value<'v>>,
        eval: &mut Evaluator<'v, '_, '_>,
    ) -> starlark::Result<Value<'v>> {
        let location = call_location(eval);
        let mut problems = Vec::new();
        let mut typed = Vec::with_capacity(params.len());
        let search = capacity_search(
            params.get("refine"),
            params.get("resolution"),
            params.get("confirm"),
        );
        let search = match search {
            Ok(search) => search,
            Err(errors) => {
                problems.extend(errors);
                None
            }
        };
        for (name, v) in &params {
            if SEARCH_KEYWORDS.contains(&name.as_str()) {
                continue;
            }
            match param_value(*v) {
                Ok(value) => typed.push(Param {
                    name: name.clone(),
                    value,
                }),
                Err(e) => problems.push(format!("until_congested(): parameter {name} {e}")),
            }
        }
        let items =
            list_items("until_congested", stages).map_err(|e| raise(location.clone(), vec![e]))?;
        if items.is_empty() {
            problems.push(
                "until_congested(): stages must be a non-empty list of stage(...) values".into(),
            );
        }
        let param_locations = typed
            .iter()
            .map(|p| keyword_location(eval, &p.name))
            .collect();
        let stop = StopCondition {
            params: typed,
            location: location.clone(),
            param_locations,
            search,
        };
        let sweeps = &state(eval)?.sweeps;
        let sweep = sweeps.get();
        sweeps.set(sweep.saturating_add(1));
        let mut out = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            if let Some(s) = StageValue::from_value(*item) {
                if let Some(earlier) = &s.stage.stop {
                    let at = earlier
                        .location
                        .as_ref()
                        .map(|l| format!(" at {l}"))
                        .unwrap_or_default();
                    problems.push(format!(
                        "until_congested(): stages[{i}] already has a stop condition (from until_congested(){at}); a stage takes only one"
                    ));
                    continue;
                }
                let mut stage = s.stage.clone();
                stage.stop = Some(stop.clone());
                stage.sweep = sweep;
                out.push(eval.heap().alloc(StageValue { stage }));
            } else if BarrierValue::from_value(*item).is_some() {
                problems.push(format!(
                    "until_congested(): stages[{i}] is a barrier; a barrier cannot be inside until_congested(...): put it outside, e.g. [barrier()] + until_congested([...])"
                ));
            } else {
                problems.push(format!(
                    "until_congested(): stages[{i}] must be a stage(...), got {}",
                    show(*item)
                ));
            }
        }
        if !problems.is_empty() {
            return Err(raise(location, problems));
        }
        Ok(eval.heap().alloc(AllocList(out)))
    }
}

/// The whole run.
#[starlark_module]
fn scenario_builtin(builder: &mut GlobalsBuilder) {
    /// `scenario(stages, target=None, model=None, workload=None)`: the whole
    /// run. Call it exactly once.
    fn scenario<'v>(
        stages: Value<'v>,
        target: Option<Value<'v>>,
        model: Option<Value<'v>>,
        workload: Option<Value<'v>>,
        eval: &mut Evaluator<'v, '_, '_>,
    ) -> starlark::Result<NoneType> {
        let location = call_location(eval);
        let state = state(eval)?;
        if let Some((_, first)) = &*state.scenario.borrow() {
            return Err(raise(
                location,
                vec![format!(
                    "scenario() must be called exactly once; it was already called at {first}"
                )],
            ));
        }
        let mut a = Args::new("scenario");
        let mut steps = Vec::new();
        match list_items("scenario", stages) {
            Err(e) => a.problems.push(e),
            Ok(items) if items.len() > MAX_STEPS => a.problem(format!(
                "stages has {} entries; the limit is {MAX_STEPS} steps (stages and barriers)",
                items.len()
            )),
            Ok(items) => {
                for (i, item) in items.iter().enumerate() {
                    if let Some(s) = StageValue::from_value(*item) {
                        steps.push(Step::Stage(s.stage.clone()));
                    } else if let Some(b) = BarrierValue::from_value(*item) {
                        steps.push(Step::Barrier { drain: b.drain });
                    } else if ListRef::from_value(*item).is_some() {
                        a.problem(format!(
                            "stages[{i}] is a list; stages must be a flat list of stage(...) and barrier(...) values: join lists with +"
                        ));
                    } else {
                        a.problem(format!(
                            "stages[{i}] must be a stage(...) or barrier(...), got {}",
                            show(*item)
                        ));
                    }
                }
            }
        }
        let target = a.opt_string("target", target);
        let model = a.opt_string("model", model);
        let workload = match given(workload) {
            None => Workload::default(),
            Some(v) => match WorkloadValue::from_value(v) {
                Some(w) => w.workload.clone(),
                None => {
                    a.problem(format!(
                        "workload must be a workload(...) value or None, got {}",
                        show(v)
                    ));
                    Workload::default()
                }
            },
        };
        number_sweeps(&mut steps);
        let scenario = Scenario {
            target,
            model,
            workload,
            steps,
        };
        if a.problems.is_empty() {
            for p in scenario_problems(&scenario) {
                a.problem(p);
            }
        }
        let scenario = a.finish(location.clone(), scenario)?;
        let location = location.unwrap_or_else(|| SourceLocation {
            file: String::new(),
            line: 0,
            column: 0,
        });
        *state.scenario.borrow_mut() = Some((scenario, location));
        Ok(NoneType)
    }
}

/// The standard functions and operators that could build huge lists,
/// bounded.
#[starlark_module]
fn bounded_builtins(builder: &mut GlobalsBuilder) {
    /// `range` with a size limit (see [`MAX_RANGE_LEN`]); otherwise the
    /// standard one.
    fn range<'v>(
        #[starlark(require = pos)] a1: i32,
        #[starlark(require = pos)] a2: Option<i32>,
        #[starlark(require = pos, default = 1)] step: i32,
        eval: &mut Evaluator<'v, '_, '_>,
    ) -> starlark::Result<Value<'v>> {
        let (start, stop) = match a2 {
            None => (0, a1),
            Some(stop) => (a1, stop),
        };
        let Some(nonzero) = NonZeroI32::new(step) else {
            return Err(raise(
                call_location(eval),
                vec!["range(): step must not be zero".into()],
            ));
        };
        let (start64, stop64, step64) = (i64::from(start), i64::from(stop), i64::from(step));
        let len = if step64 > 0 {
            (stop64 - start64 + step64 - 1).div_euclid(step64).max(0)
        } else {
            (start64 - stop64 - step64 - 1).div_euclid(-step64).max(0)
        };
        if len > MAX_RANGE_LEN {
            return Err(raise(
                call_location(eval),
                vec![format!(
                    "range() of {len} numbers exceeds the limit of {MAX_RANGE_LEN}; a scenario needs far fewer: check the bounds"
                )],
            ));
        }
        Ok(eval.heap().alloc(Range::new(start, stop, nonzero)))
    }

    /// `a * b` (the parser rewrites every `*` to this): refuses to build
    /// strings or lists longer than [`MAX_SEQUENCE_LEN`].
    fn __nyann_mul__<'v>(
        #[starlark(require = pos)] a: Value<'v>,
        #[starlark(require = pos)] b: Value<'v>,
        eval: &mut Evaluator<'v, '_, '_>,
    ) -> starlark::Result<Value<'v>> {
        for (seq, count) in [(a, b), (b, a)] {
            if matches!(seq.get_type(), "string" | "list" | "tuple") && count.get_type() == "int" {
                let len = i64::from(seq.length()?);
                let times = i64::unpack_value(count).ok().flatten().unwrap_or(i64::MAX);
                let total = len.saturating_mul(times.max(0));
                if total > MAX_SEQUENCE_LEN {
                    return Err(raise(
                        call_location(eval),
                        vec![format!(
                            "`*` would build a {} of {total} elements; the limit is {MAX_SEQUENCE_LEN}",
                            seq.get_type()
                        )],
                    ));
                }
            }
        }
        a.mul(b, eval.heap())
    }

    /// `a + b` (the parser rewrites every `+` to this): refuses to build
    /// strings or lists longer than [`MAX_SEQUENCE_LEN`].
    fn __nyann_add__<'v>(
        #[starlark(require = pos)] a: Value<'v>,
        #[starlark(require = pos)] b: Value<'v>,
        eval: &mut Evaluator<'v, '_, '_>,
    ) -> starlark::Result<Value<'v>> {
        let (ta, tb) = (a.get_type(), b.get_type());
        if ta == tb && matches!(ta, "string" | "list" | "tuple") {
            let total = i64::from(a.length()?) + i64::from(b.length()?);
            if total > MAX_SEQUENCE_LEN {
                return Err(raise(
                    call_location(eval),
                    vec![format!(
                        "`+` would build a {ta} of {total} elements; the limit is {MAX_SEQUENCE_LEN}"
                    )],
                ));
            }
        }
        a.add(b, eval.heap())
    }
}
