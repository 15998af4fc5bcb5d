//! `workload(...)`: what the prompts look like.

use nyann_model::{CacheSalt, Workload, WorkloadType};
use starlark::environment::GlobalsBuilder;
use starlark::eval::Evaluator;
use starlark::starlark_module;
use starlark::values::Value;

use crate::validate::workload_problems;
use crate::values::WorkloadValue;

use super::args::Args;
use super::{call_location, given};

/// What the prompts look like.
#[starlark_module]
pub(super) fn workload_builtins(builder: &mut GlobalsBuilder) {
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
