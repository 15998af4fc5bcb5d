//! Scenario files to the scenario IR ([`nyann_model::Scenario`]), with
//! validation and bounded evaluation.
//!
//! A scenario is either a Starlark program (`.star`) that calls the builtins
//! `workload`, `stage`, `barrier`, `until_congested` and `scenario`, or the IR
//! itself as JSON (`.json`, strict: unknown fields are errors). Both go
//! through the same validation rules, so downstream code can trust any
//! `Scenario` this crate returns. Durations in the IR are seconds (`f64`).

mod builtins;
mod compile;
mod error;
mod shape;
mod source;
mod validate;
mod values;

use std::path::Path;

pub use nyann_model::Scenario;

pub use crate::builtins::{MAX_RANGE_LEN, MAX_SEQUENCE_LEN};
pub use crate::compile::{
    Limits, MAX_EVAL_TIME, MAX_NESTING, MAX_SOURCE_BYTES, MAX_STEPS_EVALUATED,
};
pub use crate::error::{Diagnostic, ScenarioError};
pub use nyann_model::rules::MAX_STEPS;

/// Loads a scenario file: `.star` is evaluated, `.json` is parsed as the IR
/// and validated with the same rules. Anything but a regular file (a
/// directory, a FIFO, a device, even behind a symlink) and any other
/// extension is an error; at most [`MAX_SOURCE_BYTES`] are ever read.
pub fn load_file(path: &Path) -> Result<Scenario, ScenarioError> {
    load_file_with_source(path).map(|(scenario, _)| scenario)
}

/// [`load_file`], also returning the text it read (to save with the results).
pub fn load_file_with_source(path: &Path) -> Result<(Scenario, String), ScenarioError> {
    load_file_within(path, Limits::default())
}

/// [`load_file_with_source`] within `limits` (a Starlark file's evaluation).
pub fn load_file_within(path: &Path, limits: Limits) -> Result<(Scenario, String), ScenarioError> {
    let name = path.display().to_string();
    let source = source::read(path, &name)?;
    let mut scenario = if path.extension().and_then(|e| e.to_str()) == Some("json") {
        parse_ir(&name, &source)
    } else {
        compile::compile(&name, &source, limits)
    }?;
    if let Some(dir) = path.parent() {
        datasets_from(&mut scenario, dir);
    }
    Ok((scenario, source))
}

/// Datasets' relative paths (`path`, `train_path`) are the scenario file's neighbours: made
/// absolute from `dir`, so that the run finds them from any directory.
fn datasets_from(scenario: &mut Scenario, dir: &Path) {
    let stages = scenario.steps.iter_mut().filter_map(|step| match step {
        nyann_model::Step::Stage(stage) => stage.workload.as_mut(),
        nyann_model::Step::Barrier { .. } => None,
    });
    for workload in std::iter::once(&mut scenario.workload).chain(stages) {
        for path in [&mut workload.path, &mut workload.train_path]
            .into_iter()
            .flatten()
        {
            if Path::new(path.as_str()).is_relative() {
                *path = dir.join(&*path).display().to_string();
            }
        }
    }
}

/// Compiles Starlark `source` (named `file_name` in error messages and in the
/// IR's source locations) to a validated scenario.
pub fn compile_str(file_name: &str, source: &str) -> Result<Scenario, ScenarioError> {
    compile_str_within(file_name, source, Limits::default())
}

/// [`compile_str`] within `limits`.
pub fn compile_str_within(
    file_name: &str,
    source: &str,
    limits: Limits,
) -> Result<Scenario, ScenarioError> {
    compile::compile(file_name, source, limits)
}

/// Parses the IR as JSON (strict) and validates it. `file_name` names the
/// source in error messages: every error carries a line and column, and
/// structural ones (unknown field, wrong type) the JSON path of the field.
pub fn parse_ir(file_name: &str, json: &str) -> Result<Scenario, ScenarioError> {
    let invalid = |line: Option<u32>, column: Option<u32>, message: String| {
        ScenarioError::Invalid(vec![Diagnostic {
            file: file_name.to_owned(),
            line,
            column,
            message,
        }])
    };
    let mut json = serde_json::Deserializer::from_str(json);
    let scenario: Scenario = serde_path_to_error::deserialize(&mut json).map_err(|e| {
        let path = e.path().to_string();
        let e = e.into_inner();
        let at = if path == "." {
            String::new()
        } else {
            format!(" at {path}")
        };
        invalid(
            u32::try_from(e.line()).ok().filter(|&l| l > 0),
            u32::try_from(e.column()).ok().filter(|&c| c > 0),
            format!("invalid scenario IR{at}: {e}"),
        )
    })?;
    let problems = validate::ir_diagnostics(file_name, &scenario);
    if problems.is_empty() {
        Ok(scenario)
    } else {
        Err(ScenarioError::Invalid(problems))
    }
}
