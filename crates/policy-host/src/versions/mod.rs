//! The interface versions this host supports, side by side: one bindgen
//! module per version (`v0_1` .. `v0_5`), each adapting its own generated
//! types to the shared model (`nyann_model`), the way Zed keeps its
//! `since_v*` extension interfaces. The model follows the newest version;
//! an older component sees it through its own, smaller records.
//!
//! Each version's WIT lives once, in the repository's `wit/<line>/`: bindgen
//! reads it at build time, the structural check (`shape`) parses the same
//! text at run time, and `nyann-bench policy wit` prints it. The changes
//! wanted for the next line wait in `wit/NEXT.md`.

/// The glue every version module shares, written once: the `host` import
/// (`log`), linking, the conversions of the records every line has alike
/// (`param`, `role-signals`), and `describe`/`validate`/`judge` over the
/// module's own `From` conversions between its records and the model's
/// (`value`, `param-kind`, `client-stats`, `stage-observation`, `verdict`)
/// and its `server_signals`. Use it right after the module's `bindgen!`.
macro_rules! version_glue {
    () => {
        use nyann::policy::types as wit;

        impl wit::Host for HostState {}

        impl nyann::policy::host::Host for HostState {
            fn log(
                &mut self,
                level: nyann::policy::host::Level,
                msg: String,
            ) -> wasmtime::Result<()> {
                use nyann::policy::host::Level;
                let level = match level {
                    Level::Debug => LogLevel::Debug,
                    Level::Info => LogLevel::Info,
                    Level::Warn => LogLevel::Warn,
                };
                self.log(level, &msg)
            }
        }

        pub(super) fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
            CongestionPolicy::add_to_linker::<HostState, HasSelf<HostState>>(linker, |s| s)
        }

        pub(super) fn describe(
            pre: &CongestionPolicyPre<HostState>,
            store: &mut Store<HostState>,
        ) -> wasmtime::Result<PolicyInfo> {
            let policy = pre.instantiate(&mut *store)?;
            let info = policy.nyann_policy_policy().call_describe(&mut *store)?;
            Ok(PolicyInfo {
                server_signals: server_signals(&info),
                name: info.name,
                version: info.version,
                summary: info.summary,
                params: info
                    .params
                    .into_iter()
                    .map(|s| nyann_model::observation::ParamSpec {
                        name: s.name,
                        kind: s.kind.into(),
                        required: s.required,
                        default: s.default.map(Value::from),
                        doc: s.doc,
                    })
                    .collect(),
            })
        }

        pub(super) fn validate(
            pre: &CongestionPolicyPre<HostState>,
            store: &mut Store<HostState>,
            params: &[Param],
        ) -> wasmtime::Result<Result<(), String>> {
            let policy = pre.instantiate(&mut *store)?;
            policy
                .nyann_policy_policy()
                .call_validate(&mut *store, &params_to_wit(params))
        }

        /// The arguments of `judge` in this line's own records.
        pub(crate) struct JudgeArgs {
            params: Vec<wit::Param>,
            stage: wit::StageObservation,
            history: Vec<wit::StageObservation>,
        }

        pub(super) fn judge_args(
            params: &[Param],
            stage: &StageObservation,
            history: &[StageObservation],
        ) -> JudgeArgs {
            JudgeArgs {
                params: params_to_wit(params),
                stage: stage.into(),
                history: history.iter().map(wit::StageObservation::from).collect(),
            }
        }

        pub(super) fn judge(
            pre: &CongestionPolicyPre<HostState>,
            store: &mut Store<HostState>,
            args: &JudgeArgs,
        ) -> wasmtime::Result<Result<Verdict, String>> {
            let policy = pre.instantiate(&mut *store)?;
            let verdict = policy.nyann_policy_policy().call_judge(
                &mut *store,
                &args.params,
                &args.stage,
                &args.history,
            )?;
            Ok(verdict.map(Verdict::from))
        }

        fn params_to_wit(params: &[Param]) -> Vec<wit::Param> {
            params
                .iter()
                .map(|p| wit::Param {
                    name: p.name.clone(),
                    value: (&p.value).into(),
                })
                .collect()
        }

        impl From<&RoleSignals> for wit::RoleSignals {
            fn from(r: &RoleSignals) -> Self {
                wit::RoleSignals {
                    role: r.role.clone(),
                    waiting_requests_p50: r.waiting_requests_p50,
                    ttft_p99_seconds: r.ttft_p99_seconds,
                    kv_cache_usage_max: r.kv_cache_usage_max,
                    preemptions: r.preemptions,
                    extra: r.extra.clone(),
                }
            }
        }
    };
}

/// The `value` and `param-kind` conversions of the lines that have the
/// `integer` kind (0.2 on), written once.
macro_rules! integer_values {
    () => {
        impl From<&Value> for wit::Value {
            fn from(v: &Value) -> Self {
                match v {
                    Value::Number(n) => wit::Value::Number(*n),
                    Value::Integer(i) => wit::Value::Integer(*i),
                    Value::Text(t) => wit::Value::Text(t.clone()),
                    Value::Flag(b) => wit::Value::Flag(*b),
                }
            }
        }

        impl From<wit::Value> for Value {
            fn from(v: wit::Value) -> Self {
                match v {
                    wit::Value::Number(n) => Value::Number(n),
                    wit::Value::Integer(i) => Value::Integer(i),
                    wit::Value::Text(t) => Value::Text(t),
                    wit::Value::Flag(b) => Value::Flag(b),
                }
            }
        }

        impl From<wit::ParamKind> for ParamKind {
            fn from(k: wit::ParamKind) -> Self {
                match k {
                    wit::ParamKind::Number => ParamKind::Number,
                    wit::ParamKind::Integer => ParamKind::Integer,
                    wit::ParamKind::Fraction => ParamKind::Fraction,
                    wit::ParamKind::Duration => ParamKind::Duration,
                    wit::ParamKind::Text => ParamKind::Text,
                    wit::ParamKind::Flag => ParamKind::Flag,
                }
            }
        }
    };
}

/// What the lines that say which rules fired (0.3 on) share: `verdict`
/// with its `fired` rules, and `policy-info.server-signals`.
macro_rules! fired_rules {
    () => {
        fn server_signals(info: &wit::PolicyInfo) -> bool {
            info.server_signals
        }

        impl From<wit::Verdict> for Verdict {
            fn from(v: wit::Verdict) -> Self {
                Verdict {
                    congested: v.congested,
                    reasons: v.reasons,
                    fired: v
                        .fired
                        .into_iter()
                        .map(|f| FiredRule {
                            rule: f.rule,
                            role: f.role,
                            signals: f.signals,
                        })
                        .collect(),
                }
            }
        }
    };
}

mod v0_1;
mod v0_2;
mod v0_3;
mod v0_4;
mod v0_5;

use nyann_model::observation::{PolicyInfo, StageObservation, Verdict};
use nyann_model::scenario::Param;
use wasmtime::Store;
use wasmtime::component::{InstancePre, Linker};

use crate::sandbox::HostState;

/// The interface package every policy implements.
pub const PACKAGE: &str = "nyann:policy";

/// One compatibility line of the interface (for 0.x, `0.minor`: wasmtime
/// matches any `0.2.z` export against `0.2.0`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Interface {
    /// `nyann:policy@0.1`: frozen; adapted to the model by the host.
    V0_1,
    /// `nyann:policy@0.2`: frozen; adapted to the model by the host.
    V0_2,
    /// `nyann:policy@0.3`: frozen; adapted to the model by the host.
    V0_3,
    /// `nyann:policy@0.4`: frozen; adapted to the model by the host.
    V0_4,
    /// `nyann:policy@0.5`: the current line, which the SDK builds.
    V0_5,
}

impl Interface {
    /// Every supported line, oldest first.
    pub const ALL: [Interface; 5] = [
        Interface::V0_1,
        Interface::V0_2,
        Interface::V0_3,
        Interface::V0_4,
        Interface::V0_5,
    ];

    /// The line new policies are built against.
    pub const NEWEST: Interface = Interface::V0_5;

    /// `0.1`, `0.2`.
    pub fn line(self) -> &'static str {
        match self {
            Interface::V0_1 => "0.1",
            Interface::V0_2 => "0.2",
            Interface::V0_3 => "0.3",
            Interface::V0_4 => "0.4",
            Interface::V0_5 => "0.5",
        }
    }

    /// The line's WIT text (`wit/<line>/policy.wit`).
    pub fn wit(self) -> &'static str {
        match self {
            Interface::V0_1 => include_str!("../../../../wit/0.1/policy.wit"),
            Interface::V0_2 => include_str!("../../../../wit/0.2/policy.wit"),
            Interface::V0_3 => include_str!("../../../../wit/0.3/policy.wit"),
            Interface::V0_4 => include_str!("../../../../wit/0.4/policy.wit"),
            Interface::V0_5 => include_str!("../../../../wit/0.5/policy.wit"),
        }
    }

    /// The line of a semver string (`0.2.0`, `0.2.7` → 0.2), if supported.
    pub fn of_version(version: &str) -> Option<Interface> {
        let mut parts = version.split('.');
        let line = format!("{}.{}", parts.next()?, parts.next()?);
        Interface::ALL.into_iter().find(|i| i.line() == line)
    }

    /// The line of an export or import name such as
    /// `nyann:policy/policy@0.2.0`, if supported.
    pub fn of_name(name: &str) -> Option<Interface> {
        name.split_once('@')
            .and_then(|(_, version)| Interface::of_version(version))
    }
}

impl std::fmt::Display for Interface {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{PACKAGE}@{}", self.line())
    }
}

/// `nyann:policy@0.1.x, nyann:policy@0.2.x, ...`.
pub fn supported_versions() -> String {
    Interface::ALL
        .iter()
        .map(|i| format!("{i}.x"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Link the host imports (`host`, `types`) of every supported line.
pub(crate) fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    v0_1::add_to_linker(linker)?;
    v0_2::add_to_linker(linker)?;
    v0_3::add_to_linker(linker)?;
    v0_4::add_to_linker(linker)?;
    v0_5::add_to_linker(linker)
}

/// A component ready to instantiate, typed by its interface line: the
/// bindgen `Pre` of that line (built once per load; it type-checks the
/// exports against the line's WIT).
pub(crate) enum Pre {
    V0_1(v0_1::CongestionPolicyPre<HostState>),
    V0_2(v0_2::CongestionPolicyPre<HostState>),
    V0_3(v0_3::CongestionPolicyPre<HostState>),
    V0_4(v0_4::CongestionPolicyPre<HostState>),
    V0_5(v0_5::CongestionPolicyPre<HostState>),
}

impl Pre {
    pub fn new(interface: Interface, pre: InstancePre<HostState>) -> wasmtime::Result<Pre> {
        Ok(match interface {
            Interface::V0_1 => Pre::V0_1(v0_1::CongestionPolicyPre::new(pre)?),
            Interface::V0_2 => Pre::V0_2(v0_2::CongestionPolicyPre::new(pre)?),
            Interface::V0_3 => Pre::V0_3(v0_3::CongestionPolicyPre::new(pre)?),
            Interface::V0_4 => Pre::V0_4(v0_4::CongestionPolicyPre::new(pre)?),
            Interface::V0_5 => Pre::V0_5(v0_5::CongestionPolicyPre::new(pre)?),
        })
    }

    pub fn interface(&self) -> Interface {
        match self {
            Pre::V0_1(_) => Interface::V0_1,
            Pre::V0_2(_) => Interface::V0_2,
            Pre::V0_3(_) => Interface::V0_3,
            Pre::V0_4(_) => Interface::V0_4,
            Pre::V0_5(_) => Interface::V0_5,
        }
    }

    /// Instantiate in `store` and call `describe`.
    pub fn describe(&self, store: &mut Store<HostState>) -> wasmtime::Result<PolicyInfo> {
        match self {
            Pre::V0_1(pre) => v0_1::describe(pre, store),
            Pre::V0_2(pre) => v0_2::describe(pre, store),
            Pre::V0_3(pre) => v0_3::describe(pre, store),
            Pre::V0_4(pre) => v0_4::describe(pre, store),
            Pre::V0_5(pre) => v0_5::describe(pre, store),
        }
    }

    /// Instantiate in `store` and call `validate`.
    pub fn validate(
        &self,
        store: &mut Store<HostState>,
        params: &[Param],
    ) -> wasmtime::Result<Result<(), String>> {
        match self {
            Pre::V0_1(pre) => v0_1::validate(pre, store, params),
            Pre::V0_2(pre) => v0_2::validate(pre, store, params),
            Pre::V0_3(pre) => v0_3::validate(pre, store, params),
            Pre::V0_4(pre) => v0_4::validate(pre, store, params),
            Pre::V0_5(pre) => v0_5::validate(pre, store, params),
        }
    }

    /// The arguments of `judge` in the records of this component's line,
    /// made on the caller's thread (the call runs on another, which then
    /// needs no copy of the model's). A line before 0.4 does not know
    /// capacity-search stages: it is shown one as a stage of the sweep,
    /// after the stages of lower level ([`below`]).
    pub fn judge_args(
        &self,
        params: &[Param],
        stage: &StageObservation,
        history: &[StageObservation],
    ) -> JudgeArgs {
        let below_it;
        let history = if self.interface() < Interface::V0_4 && stage.refines.is_some() {
            below_it = below(stage, history);
            &below_it[..]
        } else {
            history
        };
        match self {
            Pre::V0_1(_) => JudgeArgs::V0_1(v0_1::judge_args(params, stage, history)),
            Pre::V0_2(_) => JudgeArgs::V0_2(v0_2::judge_args(params, stage, history)),
            Pre::V0_3(_) => JudgeArgs::V0_3(v0_3::judge_args(params, stage, history)),
            Pre::V0_4(_) => JudgeArgs::V0_4(v0_4::judge_args(params, stage, history)),
            Pre::V0_5(_) => JudgeArgs::V0_5(v0_5::judge_args(params, stage, history)),
        }
    }

    /// Instantiate in `store` and call `judge` with `args` from
    /// [`Pre::judge_args`].
    pub fn judge(
        &self,
        store: &mut Store<HostState>,
        args: &JudgeArgs,
    ) -> wasmtime::Result<Result<Verdict, String>> {
        match (self, args) {
            (Pre::V0_1(pre), JudgeArgs::V0_1(args)) => v0_1::judge(pre, store, args),
            (Pre::V0_2(pre), JudgeArgs::V0_2(args)) => v0_2::judge(pre, store, args),
            (Pre::V0_3(pre), JudgeArgs::V0_3(args)) => v0_3::judge(pre, store, args),
            (Pre::V0_4(pre), JudgeArgs::V0_4(args)) => v0_4::judge(pre, store, args),
            (Pre::V0_5(pre), JudgeArgs::V0_5(args)) => v0_5::judge(pre, store, args),
            _ => wasmtime::bail!("judge arguments made for another interface line"),
        }
    }
}

/// [`Pre::judge_args`]: the arguments in the records of one line.
pub(crate) enum JudgeArgs {
    V0_1(v0_1::JudgeArgs),
    V0_2(v0_2::JudgeArgs),
    V0_3(v0_3::JudgeArgs),
    V0_4(v0_4::JudgeArgs),
    V0_5(v0_5::JudgeArgs),
}

/// The stages of `history` at a lower level than `stage`, in level order
/// (a stage's level: its concurrency, else its rate), as a sweep that had
/// tried `stage`'s level in its place would have shown them: the stage
/// before it is the nearest level below.
fn below(stage: &StageObservation, history: &[StageObservation]) -> Vec<StageObservation> {
    let level = |s: &StageObservation| s.concurrency.map(f64::from).or(s.rate);
    let Some(own) = level(stage) else {
        return history.to_vec();
    };
    let mut below: Vec<StageObservation> = history
        .iter()
        .filter(|s| level(s).is_some_and(|l| l < own))
        .cloned()
        .collect();
    below.sort_by(|a, b| {
        level(a)
            .partial_cmp(&level(b))
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    below
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_map_to_lines() {
        assert_eq!(Interface::of_version("0.1.0"), Some(Interface::V0_1));
        assert_eq!(Interface::of_version("0.1.7"), Some(Interface::V0_1));
        assert_eq!(Interface::of_version("0.2.3"), Some(Interface::V0_2));
        assert_eq!(Interface::of_version("0.3.0"), Some(Interface::V0_3));
        assert_eq!(Interface::of_version("0.4.0"), Some(Interface::V0_4));
        assert_eq!(Interface::of_version("0.5.0"), Some(Interface::V0_5));
        assert_eq!(Interface::of_version("0.6.0"), None);
        assert_eq!(Interface::of_version("1.0.0"), None);
        assert_eq!(Interface::of_version(""), None);
        assert_eq!(
            Interface::of_name("nyann:policy/policy@0.2.0"),
            Some(Interface::V0_2)
        );
        assert_eq!(
            supported_versions(),
            "nyann:policy@0.1.x, nyann:policy@0.2.x, nyann:policy@0.3.x, nyann:policy@0.4.x, \
             nyann:policy@0.5.x"
        );
    }

    #[test]
    fn an_older_line_sees_a_search_stage_after_the_levels_below_it() {
        let stage = |index: u32, concurrency: u32, refines: Option<u32>| StageObservation {
            index,
            concurrency: Some(concurrency),
            refines,
            ..StageObservation::default()
        };
        // The sweep 8, 16, 32 (congested), then search stages 24 and 20.
        let history = [
            stage(0, 8, None),
            stage(1, 16, None),
            stage(2, 32, None),
            stage(3, 24, Some(2)),
        ];
        let shown = below(&stage(4, 20, Some(2)), &history);
        let levels: Vec<_> = shown.iter().map(|s| s.concurrency).collect();
        assert_eq!(levels, [Some(8), Some(16)]);
        let shown = below(&stage(4, 28, Some(2)), &history);
        let levels: Vec<_> = shown.iter().map(|s| s.concurrency).collect();
        assert_eq!(levels, [Some(8), Some(16), Some(24)]);
    }

    #[test]
    fn each_line_has_its_own_wit() {
        for interface in Interface::ALL {
            assert!(
                interface
                    .wit()
                    .contains(&format!("package {PACKAGE}@{}.0;", interface.line())),
                "{interface}"
            );
        }
    }
}
