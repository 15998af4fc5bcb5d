//! `scenario(...)`: the whole run.

use nyann_model::{Scenario, SourceLocation, Step, Workload};
use starlark::environment::GlobalsBuilder;
use starlark::eval::Evaluator;
use starlark::starlark_module;
use starlark::values::Value;
use starlark::values::list::ListRef;
use starlark::values::none::NoneType;

use crate::validate::{MAX_STEPS, scenario_problems};
use crate::values::{BarrierValue, StageValue, WorkloadValue};

use super::args::Args;
use super::{call_location, given, list_items, raise, show, state};

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
/// The whole run.
#[starlark_module]
pub(super) fn scenario_builtin(builder: &mut GlobalsBuilder) {
    /// `scenario(stages, target=None, model=None, workload=None,
    /// slo=None)`: the whole run. Call it exactly once. `slo=` (an
    /// `slo(...)`) judges the requests of every stage without its own.
    fn scenario<'v>(
        stages: Value<'v>,
        target: Option<Value<'v>>,
        model: Option<Value<'v>>,
        workload: Option<Value<'v>>,
        slo: Option<Value<'v>>,
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
        if let Some(v) = given(slo) {
            match super::slo::slo_argument("scenario", v) {
                Ok(goals) => super::slo::apply_default(&mut steps, goals),
                Err(e) => a.problems.push(e),
            }
        }
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
