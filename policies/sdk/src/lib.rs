//! SDK for nyann-bench congestion policies.
//!
//! A policy is a WebAssembly component implementing the WIT contract
//! `nyann:policy@0.5.0` (shipped with this crate in `wit/policy.wit`, and
//! printed by `nyann-bench policy wit`). This crate hides the wit-bindgen
//! plumbing: implement [`Policy`] for a unit struct, call
//! [`export_policy!`], and build with
//! `cargo build --release --target wasm32-wasip2`.
//!
//! ```ignore
//! use nyann_policy::{Params, Policy, PolicyInfo, StageObservation, Verdict, spec};
//!
//! struct ErrorRate;
//!
//! impl Policy for ErrorRate {
//!     fn describe() -> PolicyInfo {
//!         PolicyInfo::new("error-rate", env!("CARGO_PKG_VERSION"),
//!             "Congested when more than `max_failed` requests of a stage failed.")
//!             .param(spec::number("max_failed", "failed requests per stage").default_number(10.0))
//!     }
//!
//!     fn judge(params: &Params, stage: &StageObservation, _history: &[StageObservation])
//!         -> Result<Verdict, String> {
//!         let limit = params.number("max_failed")?;
//!         let failed = stage.client.requests_failed as f64;
//!         Ok(Verdict::when(failed >= limit, || format!("{failed} requests failed (limit {limit})")))
//!     }
//! }
//!
//! nyann_policy::export_policy!(ErrorRate);
//! ```
//!
//! The rule logic is plain Rust over plain structs: test it natively with
//! `cargo test` (the generated host imports are only callable inside wasm).

// Lets the generated code name this crate by its public path
// (`::nyann_policy::...`) both here and in policy crates.
extern crate self as nyann_policy;

#[doc(hidden)]
pub use wit_bindgen;

/// The WIT contract this SDK implements (the repository's `wit/0.5`).
pub const WIT: &str = include_str!("../wit/policy.wit");

/// The interface version this SDK builds components for.
pub const INTERFACE_VERSION: &str = "0.5.0";

#[doc(hidden)]
pub mod __private {
    //! The generated bindings and the adapter from [`crate::Policy`] to the
    //! generated export trait. Not part of the public API.

    #![allow(unsafe_code, missing_docs, clippy::all)]

    pub mod bindings {
        wit_bindgen::generate!({
            path: "wit",
            world: "congestion-policy",
            runtime_path: "::nyann_policy::wit_bindgen::rt",
            pub_export_macro: true,
            export_macro_name: "__nyann_export_congestion_policy",
            default_bindings_module: "::nyann_policy::__private::bindings",
            additional_derives: [PartialEq],
        });
    }

    use std::marker::PhantomData;

    use bindings::exports::nyann::policy::policy::Guest;
    use bindings::nyann::policy::types::{Param, PolicyInfo, StageObservation, Verdict};

    /// Implements the generated export trait for any [`crate::Policy`].
    pub struct Adapter<P>(PhantomData<P>);

    impl<P: crate::Policy> Guest for Adapter<P> {
        fn describe() -> PolicyInfo {
            P::describe()
        }

        fn validate(params: Vec<Param>) -> Result<(), String> {
            P::validate(&crate::Params::new(params))
        }

        fn judge(
            params: Vec<Param>,
            stage: StageObservation,
            history: Vec<StageObservation>,
        ) -> Result<Verdict, String> {
            P::judge(&crate::Params::new(params), &stage, &history)
        }
    }
}

pub use __private::bindings::nyann::policy::types::{
    ClientStats, EvalCounts, FiredRule, Objective, Param, ParamKind, ParamSpec, PolicyInfo,
    RoleSignals, SloCounts, SloGoal, StageObservation, Sweep, Value, Verdict,
};

mod slo;

/// A congestion policy. Implement it for a unit struct and export it with
/// [`export_policy!`]. Every call gets a fresh instance: keep no state
/// between calls (everything needed arrives as arguments, including the
/// earlier stages of the sweep in `history`).
pub trait Policy {
    /// Name, version, one-sentence summary and the parameters the policy
    /// accepts in `until_congested(...)`.
    fn describe() -> PolicyInfo;

    /// Check the parameters of one `until_congested(...)` call, once, when
    /// the scenario is loaded. The host has already checked names and kinds,
    /// filled defaults and converted durations to seconds; check ranges and
    /// relations here. The default accepts everything.
    fn validate(params: &Params) -> Result<(), String> {
        let _ = params;
        Ok(())
    }

    /// Judge a finished stage. `history` holds the earlier measured stages
    /// of the same sweep in the order they ran: a capacity-search stage
    /// (`stage.refines`) comes after the whole sweep, so compare it with
    /// [`StageObservation::below`], not with the last stage. An `Err` is reported as a policy
    /// error for the stage (by default the sweep continues).
    fn judge(
        params: &Params,
        stage: &StageObservation,
        history: &[StageObservation],
    ) -> Result<Verdict, String>;
}

/// Export a [`Policy`] implementation as the component's `policy` interface.
/// Use it once per crate, at the top level. Outside wasm it exports nothing
/// (the same crate builds natively for unit tests) but still marks the
/// policy as used, so a native build has no dead-code warnings.
#[macro_export]
macro_rules! export_policy {
    ($policy:ty) => {
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            type __NyannPolicyExport = $crate::__private::Adapter<$policy>;
            $crate::__private::bindings::__nyann_export_congestion_policy!(
                __NyannPolicyExport with_types_in $crate::__private::bindings
            );
        };
        #[cfg(not(target_arch = "wasm32"))]
        const _: () = {
            #[allow(dead_code)]
            fn __nyann_policy_exported() {
                let _ = <$policy as $crate::Policy>::describe;
                let _ = <$policy as $crate::Policy>::validate;
                let _ = <$policy as $crate::Policy>::judge;
            }
        };
    };
}

/// The parameters of one `until_congested(...)` call, as the host passes
/// them: every described parameter present (defaults filled), durations
/// in seconds.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Params {
    params: Vec<Param>,
}

impl Params {
    /// Wrap a parameter list (the host's, or one built in a test).
    pub fn new(params: Vec<Param>) -> Self {
        Params { params }
    }

    /// The raw value of a parameter, if present.
    pub fn get(&self, name: &str) -> Option<&Value> {
        self.params
            .iter()
            .find(|p| p.name == name)
            .map(|p| &p.value)
    }

    /// A `number`, `fraction` or `duration` parameter (durations in seconds).
    /// An `integer` parameter reads as a number too.
    pub fn number(&self, name: &str) -> Result<f64, String> {
        match self.get(name) {
            Some(Value::Number(n)) => Ok(*n),
            Some(Value::Integer(i)) => Ok(*i as f64),
            Some(other) => Err(format!("parameter {name} must be a number, got {other:?}")),
            None => Err(format!("parameter {name} is missing")),
        }
    }

    /// An `integer` parameter.
    pub fn integer(&self, name: &str) -> Result<i64, String> {
        match self.get(name) {
            Some(Value::Integer(i)) => Ok(*i),
            Some(other) => Err(format!(
                "parameter {name} must be an integer, got {other:?}"
            )),
            None => Err(format!("parameter {name} is missing")),
        }
    }

    /// A `duration` parameter, in seconds.
    pub fn seconds(&self, name: &str) -> Result<f64, String> {
        self.number(name)
    }

    /// A `fraction` parameter (0..=1).
    pub fn fraction(&self, name: &str) -> Result<f64, String> {
        self.number(name)
    }

    /// A number parameter, or `default` when absent (for parameters that
    /// are optional without a described default).
    pub fn number_or(&self, name: &str, default: f64) -> Result<f64, String> {
        match self.get(name) {
            None => Ok(default),
            Some(_) => self.number(name),
        }
    }

    /// A `text` parameter.
    pub fn text(&self, name: &str) -> Result<&str, String> {
        match self.get(name) {
            Some(Value::Text(t)) => Ok(t),
            Some(other) => Err(format!("parameter {name} must be text, got {other:?}")),
            None => Err(format!("parameter {name} is missing")),
        }
    }

    /// A `flag` parameter.
    pub fn flag(&self, name: &str) -> Result<bool, String> {
        match self.get(name) {
            Some(Value::Flag(b)) => Ok(*b),
            Some(other) => Err(format!("parameter {name} must be a flag, got {other:?}")),
            None => Err(format!("parameter {name} is missing")),
        }
    }

    /// Check that a number parameter is `> 0` (and finite).
    pub fn require_positive(&self, name: &str) -> Result<f64, String> {
        let v = self.number(name)?;
        if v.is_finite() && v > 0.0 {
            Ok(v)
        } else {
            Err(format!("{name} must be > 0 (got {v})"))
        }
    }

    /// Check that a number parameter is in `(0, 1]`.
    pub fn require_fraction_above_zero(&self, name: &str) -> Result<f64, String> {
        let v = self.number(name)?;
        if v > 0.0 && v <= 1.0 {
            Ok(v)
        } else {
            Err(format!("{name} must be in (0, 1] (got {v})"))
        }
    }

    /// Every parameter, in the order the policy described them.
    pub fn iter(&self) -> impl Iterator<Item = &Param> {
        self.params.iter()
    }
}

impl From<Vec<Param>> for Params {
    fn from(params: Vec<Param>) -> Self {
        Params::new(params)
    }
}

impl PolicyInfo {
    /// Start a description: name, version, one-sentence summary. The policy
    /// reads server signals unless [`PolicyInfo::client_only`] says not.
    pub fn new(name: &str, version: &str, summary: &str) -> Self {
        PolicyInfo {
            name: name.to_string(),
            version: version.to_string(),
            summary: summary.to_string(),
            params: Vec::new(),
            server_signals: true,
        }
    }

    /// The policy judges the client's figures only: nyann-bench runs it
    /// without a signal source (no `--scrape` or `--prometheus-url`).
    pub fn client_only(mut self) -> Self {
        self.server_signals = false;
        self
    }

    /// Add a parameter (see [`spec`]).
    pub fn param(mut self, spec: impl Into<ParamSpec>) -> Self {
        self.params.push(spec.into());
        self
    }
}

impl Verdict {
    /// Not congested.
    pub fn ok() -> Self {
        Verdict {
            congested: false,
            reasons: Vec::new(),
            fired: Vec::new(),
        }
    }

    /// Congested for the given reasons; not congested when there are none.
    pub fn from_reasons(reasons: Vec<String>) -> Self {
        Verdict {
            congested: !reasons.is_empty(),
            reasons,
            fired: Vec::new(),
        }
    }

    /// Say which rule fired, on which role (`None`: client figures) and
    /// which figures it compared, named as in the results files
    /// (`waiting_requests_p50`, `kv_cache_usage_max`, `ttft_p99_seconds`...).
    /// The report marks exactly those.
    pub fn fired(mut self, rule: &str, role: Option<&str>, signals: &[&str]) -> Self {
        self.fired.push(FiredRule {
            rule: rule.to_string(),
            role: role.map(str::to_string),
            signals: signals.iter().map(|s| s.to_string()).collect(),
        });
        self
    }

    /// Congested with one reason when `condition` holds.
    pub fn when(condition: bool, reason: impl FnOnce() -> String) -> Self {
        if condition {
            Verdict::from_reasons(vec![reason()])
        } else {
            Verdict::ok()
        }
    }
}

impl RoleSignals {
    /// The value of a named extra figure, if the signal source provided it.
    pub fn extra(&self, name: &str) -> Option<f64> {
        self.extra.iter().find(|(n, _)| n == name).map(|(_, v)| *v)
    }
}

impl Default for ClientStats {
    /// All zero: handy for building observations in tests.
    fn default() -> Self {
        ClientStats {
            requests_ok: 0,
            requests_failed: 0,
            requests_per_second: 0.0,
            output_tokens_per_second: 0.0,
            ttft_p50_seconds: 0.0,
            ttft_p99_seconds: 0.0,
            itl_p50_seconds: 0.0,
            itl_p99_seconds: 0.0,
            e2e_p50_seconds: 0.0,
            e2e_p99_seconds: 0.0,
            dropped: 0,
            requests_rejected: 0,
            requests_late: 0,
            eval: None,
            slo: None,
        }
    }
}

impl Default for Sweep {
    /// Sweep 0, unnamed: handy in tests.
    fn default() -> Self {
        Sweep {
            index: 0,
            name: String::new(),
        }
    }
}

impl Default for StageObservation {
    /// Stage 0 of sweep 0, unnamed, no roles, zero client statistics:
    /// handy in tests.
    fn default() -> Self {
        StageObservation {
            index: 0,
            name: String::new(),
            sweep: Sweep::default(),
            concurrency: None,
            rate: None,
            start_unix_seconds: 0.0,
            end_unix_seconds: 0.0,
            roles: Vec::new(),
            client: ClientStats::default(),
            signal_errors: Vec::new(),
            refines: None,
        }
    }
}

impl StageObservation {
    /// The stage's level: its concurrency, else its rate.
    pub fn level(&self) -> Option<f64> {
        self.concurrency.map(f64::from).or(self.rate)
    }

    /// The stages of `history` at a lower level than this one, in level
    /// order: for a sweep stage, the sweep's stages before it; for a
    /// capacity-search stage, the stages it lies above (the last one is
    /// the nearest level below, whenever it ran).
    pub fn below<'a>(&self, history: &'a [StageObservation]) -> Vec<&'a StageObservation> {
        let Some(own) = self.level() else {
            return history.iter().collect();
        };
        let mut below: Vec<&StageObservation> = history
            .iter()
            .filter(|s| s.level().is_some_and(|level| level < own))
            .collect();
        below.sort_by(|a, b| {
            a.level()
                .partial_cmp(&b.level())
                .unwrap_or(std::cmp::Ordering::Equal)
        });
        below
    }
}

impl EvalCounts {
    /// The share of right answers (`None` before any was scored).
    pub fn accuracy(&self) -> Option<f64> {
        (self.answered > 0).then(|| self.correct as f64 / self.answered as f64)
    }

    /// The accuracy's 95% Wilson score interval, `(low, high)`; `(0, 1)`
    /// before any answer was scored. Unlike the normal approximation it
    /// stays within [0, 1] and is honest at small counts.
    pub fn interval95(&self) -> (f64, f64) {
        slo::wilson95(self.correct, self.answered)
    }
}

impl RoleSignals {
    /// A role with every signal at zero.
    pub fn new(role: &str) -> Self {
        RoleSignals {
            role: role.to_string(),
            waiting_requests_p50: 0.0,
            ttft_p99_seconds: 0.0,
            kv_cache_usage_max: 0.0,
            preemptions: 0.0,
            extra: Vec::new(),
        }
    }
}

impl ClientStats {
    /// Failed requests over all requests of the stage (0 when none were sent).
    pub fn error_rate(&self) -> f64 {
        let total = self.requests_ok + self.requests_failed;
        if total == 0 {
            0.0
        } else {
            self.requests_failed as f64 / total as f64
        }
    }
}

/// Builders for parameter descriptions, e.g.
/// `spec::duration("ttft_p99", "server TTFT p99 threshold").required()`.
pub mod spec {
    use crate::{ParamKind, ParamSpec, Value};

    /// A parameter description under construction; converts into a
    /// [`ParamSpec`]. Optional without a default unless told otherwise.
    #[derive(Debug, Clone)]
    pub struct Spec(ParamSpec);

    fn new(name: &str, kind: ParamKind, doc: &str) -> Spec {
        Spec(ParamSpec {
            name: name.to_string(),
            kind,
            required: false,
            default: None,
            doc: doc.to_string(),
        })
    }

    /// Any finite number.
    pub fn number(name: &str, doc: &str) -> Spec {
        new(name, ParamKind::Number, doc)
    }

    /// A whole number; arrives as `Value::Integer`.
    pub fn integer(name: &str, doc: &str) -> Spec {
        new(name, ParamKind::Integer, doc)
    }

    /// A number in 0..=1.
    pub fn fraction(name: &str, doc: &str) -> Spec {
        new(name, ParamKind::Fraction, doc)
    }

    /// A duration (`"750ms"`, `"2s"`, or seconds); arrives in seconds.
    pub fn duration(name: &str, doc: &str) -> Spec {
        new(name, ParamKind::Duration, doc)
    }

    /// Free text.
    pub fn text(name: &str, doc: &str) -> Spec {
        new(name, ParamKind::Text, doc)
    }

    /// A boolean.
    pub fn flag(name: &str, doc: &str) -> Spec {
        new(name, ParamKind::Flag, doc)
    }

    impl Spec {
        /// The scenario must give this parameter.
        pub fn required(mut self) -> Self {
            self.0.required = true;
            self.0.default = None;
            self
        }

        /// Default for a number, fraction or duration (seconds) parameter.
        pub fn default_number(mut self, value: f64) -> Self {
            self.0.default = Some(Value::Number(value));
            self.0.required = false;
            self
        }

        /// Default for an integer parameter.
        pub fn default_integer(mut self, value: i64) -> Self {
            self.0.default = Some(Value::Integer(value));
            self.0.required = false;
            self
        }

        /// Default for a text parameter.
        pub fn default_text(mut self, value: &str) -> Self {
            self.0.default = Some(Value::Text(value.to_string()));
            self.0.required = false;
            self
        }

        /// Default for a flag parameter.
        pub fn default_flag(mut self, value: bool) -> Self {
            self.0.default = Some(Value::Flag(value));
            self.0.required = false;
            self
        }
    }

    impl From<Spec> for ParamSpec {
        fn from(spec: Spec) -> Self {
            spec.0
        }
    }
}

/// Write to nyann-bench's log, attributed to the policy (bounded per call).
/// Outside wasm (native unit tests) these do nothing.
pub mod log {
    #[cfg(target_arch = "wasm32")]
    use crate::__private::bindings::nyann::policy::host::{Level, log};

    /// Debug-level line (shown with `-v`).
    pub fn debug(msg: &str) {
        #[cfg(target_arch = "wasm32")]
        log(Level::Debug, msg);
        #[cfg(not(target_arch = "wasm32"))]
        let _ = msg;
    }

    /// Info-level line.
    pub fn info(msg: &str) {
        #[cfg(target_arch = "wasm32")]
        log(Level::Info, msg);
        #[cfg(not(target_arch = "wasm32"))]
        let _ = msg;
    }

    /// Warning line.
    pub fn warn(msg: &str) {
        #[cfg(target_arch = "wasm32")]
        log(Level::Warn, msg);
        #[cfg(not(target_arch = "wasm32"))]
        let _ = msg;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_wit_is_the_interface_version() {
        assert!(WIT.contains(&format!("package nyann:policy@{INTERFACE_VERSION};")));
        // The crate's 0.x line is the interface's.
        let line = INTERFACE_VERSION.trim_end_matches(".0");
        assert!(env!("CARGO_PKG_VERSION").starts_with(&format!("{line}.")));
    }

    #[test]
    fn eval_accuracy_and_its_wilson_interval() {
        // 81 of 263 (Wilson 1927's worked figures, to 4 places): 0.2553..0.3662.
        let eval = EvalCounts {
            answered: 263,
            correct: 81,
            unanswerable: 0,
        };
        let (low, high) = eval.interval95();
        assert!((low - 0.2553).abs() < 1e-4 && (high - 0.3662).abs() < 1e-4);
        assert!((eval.accuracy().unwrap() - 81.0 / 263.0).abs() < 1e-12);
        let none = EvalCounts {
            answered: 0,
            correct: 0,
            unanswerable: 0,
        };
        assert_eq!((none.accuracy(), none.interval95()), (None, (0.0, 1.0)));
    }

    #[test]
    fn below_is_the_lower_levels_in_level_order() {
        let at = |concurrency| StageObservation {
            concurrency: Some(concurrency),
            ..StageObservation::default()
        };
        let history = [at(8), at(16), at(32), at(24)];
        let levels: Vec<_> = at(20)
            .below(&history)
            .iter()
            .map(|s| s.concurrency)
            .collect();
        assert_eq!(levels, [Some(8), Some(16)]);
        assert_eq!(at(28).below(&history).len(), 3);
    }

    #[test]
    fn params_helpers_read_values() {
        let params = Params::new(vec![
            Param {
                name: "n".into(),
                value: Value::Number(2.5),
            },
            Param {
                name: "t".into(),
                value: Value::Text("x".into()),
            },
            Param {
                name: "f".into(),
                value: Value::Flag(true),
            },
        ]);
        assert_eq!(params.number("n"), Ok(2.5));
        assert_eq!(params.text("t"), Ok("x"));
        assert_eq!(params.flag("f"), Ok(true));
        assert!(params.number("t").unwrap_err().contains("must be a number"));
        assert!(params.number("missing").unwrap_err().contains("missing"));
        assert_eq!(params.number_or("missing", 7.0), Ok(7.0));
        assert_eq!(params.require_positive("n"), Ok(2.5));
        let params = Params::new(vec![Param {
            name: "i".into(),
            value: Value::Integer(3),
        }]);
        assert_eq!(params.integer("i"), Ok(3));
        assert_eq!(params.number("i"), Ok(3.0));
        assert_eq!(params.require_positive("i"), Ok(3.0));
    }

    #[test]
    fn spec_builders_fill_the_record() {
        let info = PolicyInfo::new("p", "1", "s")
            .param(spec::duration("ttft", "d").required())
            .param(spec::fraction("kv", "d").default_number(0.95));
        assert!(info.params[0].required && info.params[0].default.is_none());
        assert!(matches!(info.params[0].kind, ParamKind::Duration));
        assert!(!info.params[1].required);
        assert_eq!(info.params[1].default, Some(Value::Number(0.95)));
    }

    #[test]
    fn verdict_helpers() {
        assert!(!Verdict::ok().congested);
        assert!(Verdict::when(true, || "r".into()).congested);
        assert!(!Verdict::from_reasons(vec![]).congested);
        let c = ClientStats {
            requests_ok: 3,
            requests_failed: 1,
            ..Default::default()
        };
        assert_eq!(c.error_rate(), 0.25);
    }
}
