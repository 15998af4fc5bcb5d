//! Where the rules of [`nyann_model::rules`] meet an IR file: each problem
//! located at its stage's recorded call site when it has one, else named by
//! the stage's index.

use nyann_model::Scenario;
use nyann_model::Step;
pub(crate) use nyann_model::rules::{
    MAX_STEPS, mode_name, scenario_problems, stage_problems, workload_problems,
};

use crate::error::Diagnostic;

/// Every problem of a scenario read from an IR file, each located at its
/// stage's recorded call site when it has one, else named by its index.
pub(crate) fn ir_diagnostics(file: &str, s: &Scenario) -> Vec<Diagnostic> {
    let mut out: Vec<Diagnostic> = scenario_problems(s)
        .into_iter()
        .map(|p| Diagnostic::unlocated(file, p))
        .collect();
    for (index, step) in s.steps.iter().enumerate() {
        let Step::Stage(stage) = step else { continue };
        for problem in stage_problems(stage) {
            out.push(match &stage.location {
                Some(loc) => Diagnostic::located(
                    &loc.file,
                    loc.line,
                    loc.column,
                    format!("stage {index} ({file} steps[{index}]): {problem}"),
                ),
                None => Diagnostic::unlocated(file, format!("steps[{index}]: {problem}")),
            });
        }
    }
    out
}
