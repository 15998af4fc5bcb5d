//! `stage(...)` and `barrier(...)`: the steps of a scenario.

use nyann_model::{Mode, Stage};
use starlark::environment::GlobalsBuilder;
use starlark::eval::Evaluator;
use starlark::starlark_module;
use starlark::values::Value;

use crate::validate::stage_problems;
use crate::values::{BarrierValue, StageValue, WorkloadValue};

use super::args::Args;
use super::{call_location, given, show};

/// The steps of a scenario.
#[starlark_module]
pub(super) fn stage_builtins(builder: &mut GlobalsBuilder) {
    /// `stage(duration, concurrency=10, rate=None, mode="concurrent",
    /// max_inflight=0, max_requests=0, rampup=None, workload=None,
    /// target=None, model=None, name=None, warmup=False,
    /// conversation_pool_size=0, slo=None)`: a timed period of load.
    /// `slo=` (an `slo(...)`) replaces the scenario's for this stage.
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
        slo: Option<Value<'v>>,
        eval: &mut Evaluator<'v, '_, '_>,
    ) -> starlark::Result<Value<'v>> {
        let location = call_location(eval);
        let mut a = Args::new("stage");
        let slo = given(slo).and_then(|v| {
            super::slo::slo_argument("stage", v)
                .map_err(|e| a.problems.push(e))
                .ok()
        });
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
            slo,
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
