//! Evaluates a Starlark scenario file, within bounds, to the scenario IR.
//!
//! Bounds, and why each is needed (a scenario is a program: each bound
//! stops one way a file could hang or exhaust the process):
//! - source size: refuse huge files before parsing;
//! - nesting: refuse deep brackets and overlong statements before parsing
//!   (see `shape`) and deep syntax trees after it, and run on a thread with
//!   a large stack, because starlark's parser and compiler recurse;
//! - a step budget and a wall-clock budget, both enforced by starlark's
//!   periodic check (every 1000 loop iterations or calls), which also fires
//!   inside comprehensions and `pass`-only loops, unlike a statement hook;
//! - `range()`, `*` and `+` refuse to build huge sequences, because a single
//!   such operation allocates before any periodic check can run;
//! - `*=` is refused outright (it cannot be rewritten like `*`);
//! - a heap cap as a last line of defence;
//! - `load()` is disabled: a scenario is one self-contained file.

use std::cell::Cell;
use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::rc::Rc;
use std::time::{Duration, Instant};

use nyann_model::Scenario;
use starlark::codemap::{CodeMap, FileSpanRef, Span};
use starlark::environment::LibraryExtension;
use starlark::environment::{GlobalsBuilder, Module};
use starlark::eval::{BeforeStmtFunc, BeforeStmtFuncDyn, Evaluator};
use starlark::syntax::ast::{AssignOp, AstStmt, Stmt};
use starlark::syntax::{AstModule, Dialect};
use starlark_syntax::syntax::uniplate::Visit;

use crate::builtins::{CallProblems, scenario_builtins};
use crate::error::{Diagnostic, ScenarioError};
use crate::values::{Budget, State};

/// Largest scenario source accepted, in bytes.
pub const MAX_SOURCE_BYTES: usize = 1024 * 1024;
/// Loop iterations plus function calls one evaluation may take. Real
/// scenarios take a few thousand.
pub const MAX_STEPS_EVALUATED: u64 = 10_000_000;
/// Wall-clock time one evaluation may take: a backstop well above what the
/// step and memory budgets allow (they are deterministic; this one would
/// trip first on a busy machine if it were close to them).
pub const MAX_EVAL_TIME: Duration = Duration::from_secs(10);
/// Starlark heap cap, checked before every statement and every 1000 steps.
const MAX_HEAP_BYTES: usize = 256 * 1024 * 1024;
/// Deepest syntax tree accepted (expressions and blocks); real scenarios
/// nest about ten levels.
pub const MAX_NESTING: usize = 100;
/// Stack of the thread that compiles: starlark's compiler and evaluator
/// recurse with large frames (in debug builds above all). Only the pages
/// actually touched are committed.
const COMPILE_STACK_BYTES: usize = 256 * 1024 * 1024;
/// starlark checks its cancellation hook once per this many steps.
const STEPS_PER_CHECK: u64 = 1000;

/// Starlark as in the Go nyann-bench: standard, plus top-level `for`/`if`.
fn dialect() -> Dialect {
    Dialect {
        enable_top_level_stmt: true,
        ..Dialect::Standard
    }
}

/// What one evaluation may take, where callers differ: every command
/// compiles with the default; the run service plans others' scenarios with
/// a far smaller step budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Loop iterations plus function calls (counted per 1000).
    pub max_steps: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_steps: MAX_STEPS_EVALUATED,
        }
    }
}

/// Compiles the Starlark `source` of `file` to the scenario IR, on a thread
/// of its own with a large stack (see [`COMPILE_STACK_BYTES`]).
pub(crate) fn compile(file: &str, source: &str, limits: Limits) -> Result<Scenario, ScenarioError> {
    let failed =
        |message: String| ScenarioError::Invalid(vec![Diagnostic::unlocated(file, message)]);
    std::thread::scope(|scope| {
        let worker = std::thread::Builder::new()
            .name("scenario-compile".into())
            .stack_size(COMPILE_STACK_BYTES)
            .spawn_scoped(scope, || compile_here(file, source, limits))
            .map_err(|e| failed(format!("cannot start the scenario compiler thread: {e}")))?;
        worker.join().map_err(|panic| {
            failed(format!(
                "the scenario compiler failed: {}",
                panic_text(&*panic)
            ))
        })?
    })
}

fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_owned())
}

fn compile_here(file: &str, source: &str, limits: Limits) -> Result<Scenario, ScenarioError> {
    if source.len() > MAX_SOURCE_BYTES {
        return Err(ScenarioError::Invalid(vec![Diagnostic::unlocated(
            file,
            format!(
                "the scenario file is {} bytes; the limit is {MAX_SOURCE_BYTES} bytes",
                source.len()
            ),
        )]));
    }
    if let Some(d) = crate::shape::check(file, source) {
        return Err(ScenarioError::Invalid(vec![d]));
    }
    let mut ast = AstModule::parse(file, source.to_owned(), &dialect())
        .map_err(|e| ScenarioError::Invalid(vec![diagnostic_of(file, &e)]))?;
    let mut refused = too_deep(file, &ast);
    if refused.is_empty() {
        refused = refused_syntax(file, &ast);
    }
    if !refused.is_empty() {
        return Err(ScenarioError::Invalid(refused));
    }
    ast.replace_binary_operators(&HashMap::from([
        ("*".to_owned(), "__nyann_mul__".to_owned()),
        ("+".to_owned(), "__nyann_add__".to_owned()),
    ]));

    let globals = GlobalsBuilder::extended_by(&[LibraryExtension::Print])
        .with(scenario_builtins)
        .build();
    let state = State::default();
    // The statement running when a budget runs out: the budget's error
    // carries no position of its own.
    let codemap = ast.file_span(Span::default()).file;
    let last_statement: Rc<Cell<Option<Span>>> = Rc::default();
    let evaluated = std::panic::catch_unwind(AssertUnwindSafe(|| {
        Module::with_temp_heap(|module| {
            let mut eval = Evaluator::new(&module);
            eval.extra = Some(&state);
            eval.before_stmt_for_dap(BeforeStmtFunc::Dyn(Box::new(StatementGuard {
                last_statement: last_statement.clone(),
            })));
            let started = Instant::now();
            let checks = Cell::new(0_u64);
            let state_ref = &state;
            // starlark calls this every STEPS_PER_CHECK loop iterations or
            // calls, including in comprehensions and `pass`-only loops.
            eval.set_check_cancelled(Box::new(move || {
                let n = checks.get() + 1;
                checks.set(n);
                let exceeded = if n * STEPS_PER_CHECK > limits.max_steps {
                    Some(Budget::Steps)
                } else if started.elapsed() > MAX_EVAL_TIME {
                    Some(Budget::Time)
                } else {
                    None
                };
                if exceeded.is_some() {
                    state_ref.budget_exceeded.set(exceeded);
                }
                exceeded.is_some()
            }));
            // Only fails when called twice; this is the first call.
            let _ = eval.set_max_heap_size(MAX_HEAP_BYTES);
            let result = eval.eval_module(ast, &globals).map(|_| ());
            if let Err(e) = &result
                && state.budget_exceeded.get().is_none()
                && (module.heap().peak_allocated_bytes() > MAX_HEAP_BYTES
                    // starlark's own periodic check also counts the frozen heap.
                    || e.without_diagnostic().to_string().starts_with("Heap memory limit of"))
            {
                state.budget_exceeded.set(Some(Budget::Memory));
            }
            result
        })
    }));
    let result = match evaluated {
        Ok(result) => result,
        Err(panic) => {
            let what = panic_text(&*panic);
            let mut d = Diagnostic::unlocated(
                file,
                format!(
                    "the Starlark evaluator failed ({what}); this usually means a value grew far too large"
                ),
            );
            locate_at_last_statement(&mut d, &codemap, last_statement.get());
            return Err(ScenarioError::Invalid(vec![d]));
        }
    };
    if let Err(e) = result {
        let mut found = diagnostics_of(file, &e, &state, limits);
        if state.budget_exceeded.get().is_some() {
            for d in &mut found {
                locate_at_last_statement(d, &codemap, last_statement.get());
            }
        }
        return Err(ScenarioError::Invalid(found));
    }
    match state.scenario.into_inner() {
        Some((scenario, _)) => Ok(scenario),
        None => Err(ScenarioError::Invalid(vec![Diagnostic::unlocated(
            file,
            "scenario(...) was never called: the file must call scenario(stages=[...]) exactly once",
        )])),
    }
}

/// Records the statement about to run (to locate budget errors) and stops
/// the evaluation once the heap outgrows its cap. Running before every
/// statement, it catches a value doubling in a loop long before starlark's
/// own periodic heap check (every 1000 steps) would.
struct StatementGuard {
    last_statement: Rc<Cell<Option<Span>>>,
}

impl<'e> BeforeStmtFuncDyn<'e> for StatementGuard {
    fn call<'v>(
        &mut self,
        at: FileSpanRef,
        _continued: bool,
        eval: &mut Evaluator<'v, '_, 'e>,
    ) -> starlark::Result<()> {
        self.last_statement.set(Some(at.span));
        if eval.heap().peak_allocated_bytes() > MAX_HEAP_BYTES {
            return Err(starlark::Error::new_other(anyhow::anyhow!(
                "memory budget exceeded"
            )));
        }
        Ok(())
    }
}

/// Points `d` at the statement that was running, when known.
fn locate_at_last_statement(d: &mut Diagnostic, codemap: &CodeMap, span: Option<Span>) {
    if let Some(span) = span {
        let at = codemap.resolve_span(span).begin;
        d.line = Some(to_u32(at.line + 1));
        d.column = Some(to_u32(at.column + 1));
    }
}

/// Refuses programs nested deeper than [`MAX_NESTING`]. starlark's compiler
/// recurses over the syntax tree with large frames, so a deeply nested
/// expression (`[[[[...]]]]`, `1+1+...+1`) would overflow the stack and
/// abort the process instead of failing with a message. The walk itself uses
/// an explicit stack.
fn too_deep(file: &str, ast: &AstModule) -> Vec<Diagnostic> {
    let mut stack = vec![(Visit::Stmt(ast.statement()), 1_usize)];
    while let Some((node, depth)) = stack.pop() {
        if depth > MAX_NESTING {
            let span = match node {
                Visit::Stmt(s) => s.span,
                Visit::Expr(e) => e.span,
            };
            let at = ast.file_span(span).resolve().span.begin;
            return vec![Diagnostic::located(
                file,
                to_u32(at.line + 1),
                to_u32(at.column + 1),
                format!(
                    "the program is nested too deeply here (more than {MAX_NESTING} levels of expressions and blocks); split it into smaller expressions or functions"
                ),
            )];
        }
        node.visit_children(|child| stack.push((child, depth + 1)));
    }
    Vec::new()
}

/// Syntax the language allows but scenario files may not use.
fn refused_syntax(file: &str, ast: &AstModule) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    for load in ast.loads() {
        let at = load.span.resolve().span.begin;
        out.push(Diagnostic::located(
            file,
            to_u32(at.line + 1),
            to_u32(at.column + 1),
            format!(
                "load({:?}) is disabled: a scenario is one self-contained file; copy the definitions you need into it",
                load.module_id
            ),
        ));
    }
    fn walk(stmt: &AstStmt, found: &mut Vec<Span>) {
        if let Stmt::AssignModify(_, AssignOp::Multiply, _) = &stmt.node {
            found.push(stmt.span);
        }
        stmt.visit_stmt(|child| walk(child, found));
    }
    let mut spans = Vec::new();
    walk(ast.statement(), &mut spans);
    for span in spans {
        let at = ast.file_span(span).resolve().span.begin;
        out.push(Diagnostic::located(
            file,
            to_u32(at.line + 1),
            to_u32(at.column + 1),
            "`*=` is not supported in scenario files (it escapes the size limits); write `x = x * n`",
        ));
    }
    out
}

/// `100,000`.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn to_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// The diagnostics of a failed evaluation.
fn diagnostics_of(
    file: &str,
    e: &starlark::Error,
    state: &State,
    limits: Limits,
) -> Vec<Diagnostic> {
    if let Some(budget) = state.budget_exceeded.get() {
        let message = match budget {
            Budget::Steps => format!(
                "the scenario ran past its budget of {} steps (loop iterations and function calls); a scenario should be a small program: look for a runaway loop",
                thousands(limits.max_steps)
            ),
            Budget::Memory => format!(
                "evaluation exceeded its memory budget of {} MiB; a scenario should build small values: look for a value that keeps growing",
                MAX_HEAP_BYTES / (1024 * 1024)
            ),
            Budget::Time => format!(
                "evaluation exceeded its time budget of {} s; a scenario should be a small program: look for a runaway loop",
                MAX_EVAL_TIME.as_secs_f64()
            ),
        };
        let mut d = diagnostic_of(file, e);
        d.message = message;
        return vec![d];
    }
    let problems = match e.kind() {
        starlark::ErrorKind::Native(inner)
        | starlark::ErrorKind::Other(inner)
        | starlark::ErrorKind::Function(inner)
        | starlark::ErrorKind::Value(inner) => inner.downcast_ref::<CallProblems>(),
        _ => None,
    };
    match problems {
        Some(p) => {
            let at = diagnostic_of(file, e);
            p.messages
                .iter()
                .map(|m| match &p.location {
                    Some(loc) => Diagnostic::located(&loc.file, loc.line, loc.column, m.clone()),
                    None => Diagnostic {
                        message: m.clone(),
                        ..at.clone()
                    },
                })
                .collect()
        }
        None => vec![diagnostic_of(file, e)],
    }
}

/// One diagnostic from a starlark error: its own span if it has one, else the
/// innermost located frame of its call stack.
fn diagnostic_of(file: &str, e: &starlark::Error) -> Diagnostic {
    let message = with_signature(e.without_diagnostic().to_string().trim().to_owned());
    let span = e.span().cloned().or_else(|| {
        e.call_stack()
            .frames
            .iter()
            .rev()
            .find_map(|f| f.location.clone())
    });
    match span {
        Some(span) => {
            let r = span.resolve();
            Diagnostic::located(
                &r.file,
                to_u32(r.span.begin.line + 1),
                to_u32(r.span.begin.column + 1),
                message,
            )
        }
        None => Diagnostic::unlocated(file, message),
    }
}

/// The builtins' signatures, appended to starlark's argument-matching errors
/// ("Found `x` extra named parameter(s) for call to stage") so that the
/// message says what is expected.
const SIGNATURES: &[(&str, &str)] = &[
    (
        "workload",
        "workload(type, isl=128, osl=256, turns=1, subsequent_isl=None, corpus_path=None, chars_per_token=0.0, cache_salt=None, name=None, path=None, train_path=None, fewshot=0, max_isl=0, max_osl=0)",
    ),
    (
        "stage",
        "stage(duration, concurrency=10, rate=None, mode=\"concurrent\", max_inflight=0, max_requests=0, rampup=None, workload=None, target=None, model=None, name=None, warmup=False, conversation_pool_size=0)",
    ),
    ("barrier", "barrier(drain=False)"),
    ("until_congested", "until_congested(stages, **params)"),
    (
        "scenario",
        "scenario(stages, target=None, model=None, workload=None)",
    ),
];

fn with_signature(message: String) -> String {
    for (name, signature) in SIGNATURES {
        let plain = format!("for call to {name}");
        let quoted = format!("for call to `{name}`");
        if message.ends_with(&plain) || message.ends_with(&quoted) {
            return format!("{message}; expected {signature}");
        }
    }
    message
}
