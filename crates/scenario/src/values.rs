//! The Rust types that live inside the Starlark evaluator: the values that
//! scenario builtins return (a stage, a barrier and a workload, each wrapping
//! its finished IR piece so that `scenario(...)` only has to collect them)
//! and the evaluation state the builtins share.
//!
//! starlark's `ProvidesStaticType` derive emits an `unsafe impl`; that
//! generated code is the only unsafe code here, hence the allow.
#![allow(unsafe_code)]

use std::cell::{Cell, RefCell};
use std::fmt;

use allocative::Allocative;
use nyann_model::{Scenario, SourceLocation, Stage, Workload};
use starlark::starlark_simple_value;
use starlark::values::starlark_value;
use starlark::values::{NoSerialize, ProvidesStaticType, StarlarkPagablePanic, StarlarkValue};

use crate::validate::mode_name;

/// What `stage(...)` returns (and `until_congested` returns copies of).
#[derive(Debug, Clone, ProvidesStaticType, NoSerialize, Allocative, StarlarkPagablePanic)]
pub(crate) struct StageValue {
    #[allocative(skip)]
    pub(crate) stage: Stage,
}
starlark_simple_value!(StageValue);

#[starlark_value(type = "stage")]
impl<'v> StarlarkValue<'v> for StageValue {}

impl fmt::Display for StageValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.stage;
        write!(f, "stage({}s, mode=\"{}\"", s.duration_s, mode_name(s.mode))?;
        if let Some(c) = s.concurrency {
            write!(f, ", concurrency={c}")?;
        }
        if let Some(r) = s.rate {
            write!(f, ", rate={r}")?;
        }
        if let Some(name) = &s.name {
            write!(f, ", name={name:?}")?;
        }
        if s.stop.is_some() {
            write!(f, ", until_congested")?;
        }
        write!(f, ")")
    }
}

/// What `barrier(...)` returns.
#[derive(Debug, Clone, ProvidesStaticType, NoSerialize, Allocative, StarlarkPagablePanic)]
pub(crate) struct BarrierValue {
    pub(crate) drain: bool,
}
starlark_simple_value!(BarrierValue);

#[starlark_value(type = "barrier")]
impl<'v> StarlarkValue<'v> for BarrierValue {}

impl fmt::Display for BarrierValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "barrier(drain={})",
            if self.drain { "True" } else { "False" }
        )
    }
}

/// What `workload(...)` returns.
#[derive(Debug, Clone, ProvidesStaticType, NoSerialize, Allocative, StarlarkPagablePanic)]
pub(crate) struct WorkloadValue {
    #[allocative(skip)]
    pub(crate) workload: Workload,
}
starlark_simple_value!(WorkloadValue);

#[starlark_value(type = "workload")]
impl<'v> StarlarkValue<'v> for WorkloadValue {}

impl fmt::Display for WorkloadValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let w = &self.workload;
        let kind = w.kind.name();
        write!(
            f,
            "workload(\"{kind}\", isl={}, osl={}, turns={}",
            w.isl, w.osl, w.turns
        )?;
        if let Some(name) = &w.name {
            write!(f, ", name={name:?}")?;
        }
        write!(f, ")")
    }
}

/// The per-evaluation state the builtins share, reached through `eval.extra`.
#[derive(ProvidesStaticType, Default)]
pub(crate) struct State {
    /// What `scenario(...)` produced, and where it was called.
    pub(crate) scenario: RefCell<Option<(Scenario, SourceLocation)>>,
    /// Set when the evaluation budget stopped the program, and why.
    pub(crate) budget_exceeded: Cell<Option<Budget>>,
    /// `until_congested(...)` calls so far: each call is a sweep of its own.
    pub(crate) sweeps: Cell<u32>,
}

/// Which evaluation budget ran out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Budget {
    Steps,
    Time,
    Memory,
}
