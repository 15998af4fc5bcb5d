//! The scenario builtins (`workload`, `stage`, `barrier`, `until_congested`,
//! `slo`, `scenario`) and the guarded replacements of `range`, `*` and `+` that keep
//! evaluation bounded.
//!
//! Every builtin checks its arguments strictly (a wrong type is an error,
//! never a silent default) and reports all problems of one call together,
//! located at the call.

// The builtins' Rust signatures mirror the Starlark ones, keyword for
// keyword, and `#[starlark_module]` emits items an item-level allow misses.
#![allow(clippy::too_many_arguments)]

mod args;
mod bounded;
mod scenario;
mod slo;
mod stage;
mod sweep;
mod workload;

use std::fmt;

use nyann_model::SourceLocation;
use starlark::environment::GlobalsBuilder;
use starlark::eval::Evaluator;
use starlark::values::Value;
use starlark::values::list::ListRef;
use starlark::values::tuple::TupleRef;

use crate::values::State;

pub use bounded::{MAX_RANGE_LEN, MAX_SEQUENCE_LEN};

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

/// Every builtin of the scenario language, one module per kind.
pub(crate) fn scenario_builtins(builder: &mut GlobalsBuilder) {
    workload::workload_builtins(builder);
    stage::stage_builtins(builder);
    sweep::sweep_builtins(builder);
    scenario::scenario_builtin(builder);
    slo::slo_builtin(builder);
    bounded::bounded_builtins(builder);
}
