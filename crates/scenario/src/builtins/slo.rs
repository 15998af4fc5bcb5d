//! `slo(ttft=None, tpot=None, e2e=None)`: the latency goals a stage's
//! requests are judged by (goodput and attainment), given to `scenario(...,
//! slo=)` for every stage or to `stage(..., slo=)` for one.
//!
//! starlark's `ProvidesStaticType` derive emits an `unsafe impl`; that
//! generated code is the only unsafe code here, hence the allow.
#![allow(unsafe_code)]

use std::fmt;

use allocative::Allocative;
use nyann_model::{DURATION_HELP, Objective, Slo, parse_seconds};
use starlark::environment::GlobalsBuilder;
use starlark::eval::Evaluator;
use starlark::starlark_module;
use starlark::starlark_simple_value;
use starlark::values::{
    NoSerialize, ProvidesStaticType, StarlarkPagablePanic, StarlarkValue, UnpackValue, Value,
    starlark_value,
};

use super::{call_location, raise};

/// What `slo(...)` returns.
#[derive(Debug, Clone, ProvidesStaticType, NoSerialize, Allocative, StarlarkPagablePanic)]
pub(super) struct SloValue {
    #[allocative(skip)]
    pub(super) slo: Slo,
}
starlark_simple_value!(SloValue);

#[starlark_value(type = "slo")]
impl<'v> StarlarkValue<'v> for SloValue {}

impl fmt::Display for SloValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let goals: Vec<String> = self
            .slo
            .goals()
            .map(|(o, g)| format!("{}={g}s", o.name()))
            .collect();
        write!(f, "slo({})", goals.join(", "))
    }
}

/// The `slo=` argument of `stage(...)` and `scenario(...)`: an `slo(...)`
/// value (the caller has already treated `None` as absent).
pub(super) fn slo_argument(func: &str, v: Value) -> Result<Slo, String> {
    SloValue::from_value(v).map(|s| s.slo).ok_or_else(|| {
        format!(
            "{func}(): slo must be an slo(...) value or None, got {} {}",
            v.get_type(),
            v.to_repr()
        )
    })
}

/// One goal of `slo(...)`: a duration string or integer seconds, > 0.
fn goal(name: &str, v: Value) -> Result<f64, String> {
    let seconds = if let Some(text) = v.unpack_str() {
        parse_seconds(text).map_err(|e| format!("slo(): {name}: {e}"))?
    } else if v.get_type() == "int" {
        match i64::unpack_value(v) {
            Ok(Some(n)) => n as f64,
            _ => return Err(format!("slo(): {name} is too large: {}", v.to_repr())),
        }
    } else {
        return Err(format!(
            "slo(): {name} must be {DURATION_HELP}; got {} {}",
            v.get_type(),
            v.to_repr()
        ));
    };
    if seconds <= 0.0 {
        return Err(format!("slo(): {name} must be > 0, got {}", v.to_repr()));
    }
    Ok(seconds)
}

#[starlark_module]
pub(super) fn slo_builtin(builder: &mut GlobalsBuilder) {
    /// `slo(ttft=None, tpot=None, e2e=None)`: latency goals, each a
    /// duration. A request meets the SLO when its TTFT, TPOT (time per
    /// output token after the first, as vLLM defines it) and E2E are at
    /// most their goals; failed, rejected, dropped and late requests miss
    /// it. Give it to `scenario(slo=)` or `stage(slo=)`.
    fn slo<'v>(
        ttft: Option<Value<'v>>,
        tpot: Option<Value<'v>>,
        e2e: Option<Value<'v>>,
        eval: &mut Evaluator<'v, '_, '_>,
    ) -> starlark::Result<Value<'v>> {
        let location = call_location(eval);
        let mut slo = Slo::default();
        let mut messages = Vec::new();
        for (objective, v) in [
            (Objective::Ttft, ttft),
            (Objective::Tpot, tpot),
            (Objective::E2e, e2e),
        ] {
            let Some(v) = v.filter(|v| !v.is_none()) else {
                continue;
            };
            match goal(objective.name(), v) {
                Ok(seconds) => match objective {
                    Objective::Ttft => slo.ttft_s = Some(seconds),
                    Objective::Tpot => slo.tpot_s = Some(seconds),
                    Objective::E2e => slo.e2e_s = Some(seconds),
                },
                Err(e) => messages.push(e),
            }
        }
        if messages.is_empty() && slo.goals().next().is_none() {
            messages.push(
                "slo(): give at least one goal: ttft=, tpot= or e2e= (a duration, e.g. ttft=\"500ms\")"
                    .into(),
            );
        }
        if !messages.is_empty() {
            return Err(raise(location, messages));
        }
        Ok(eval.heap().alloc(SloValue { slo }))
    }
}

/// `scenario(slo=)`: the goals of every stage that has none of its own.
pub(super) fn apply_default(steps: &mut [nyann_model::Step], goals: Slo) {
    for step in steps {
        if let nyann_model::Step::Stage(stage) = step
            && stage.slo.is_none()
        {
            stage.slo = Some(goals);
        }
    }
}
