//! The scenario's rules, checked before anything is sent: the very rules
//! (and words) of the scenario language ([`nyann_model::rules`]), so that a
//! scenario built in code or read from an IR file gets no further than a
//! Starlark one would.

use nyann_model::rules::{scenario_problems, stage_problems};
use nyann_model::{Scenario, Stage, Step};

use crate::runner::RunError;

/// Every problem of `scenario`, each prefixed with where its stage is.
pub(super) fn scenario(scenario: &Scenario) -> Result<(), RunError> {
    let mut problems = scenario_problems(scenario);
    for (index, step) in scenario.steps.iter().enumerate() {
        let Step::Stage(stage) = step else { continue };
        let at = where_(stage, index);
        problems.extend(
            stage_problems(stage)
                .into_iter()
                .map(|p| format!("{at}{p}")),
        );
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(RunError::Invalid(problems))
    }
}

/// `file:line:col: stage LABEL: ` (or without the location when unknown).
fn where_(stage: &Stage, index: usize) -> String {
    match &stage.location {
        Some(loc) => format!("{loc}: stage {}: ", stage.label(index)),
        None => format!("stage {}: ", stage.label(index)),
    }
}
