//! `until_congested(...)`: sweeps that stop on congestion, and the
//! capacity search after them.

use nyann_model::{CapacitySearch, Param, StopCondition};
use starlark::collections::SmallMap;
use starlark::environment::GlobalsBuilder;
use starlark::eval::Evaluator;
use starlark::starlark_module;
use starlark::values::float::UnpackFloat;
use starlark::values::list::AllocList;
use starlark::values::{UnpackValue, Value};

use crate::values::{BarrierValue, StageValue};

use super::args::Args;
use super::{call_location, keyword_location, list_items, raise, show, state};

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
/// Sweeps that stop on congestion.
#[starlark_module]
pub(super) fn sweep_builtins(builder: &mut GlobalsBuilder) {
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
