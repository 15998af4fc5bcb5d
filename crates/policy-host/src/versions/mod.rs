//! The interface versions this host supports, side by side: one bindgen
//! module per version (`v0_1`, `v0_2`, `v0_3`), each adapting its own generated
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
            fn log(&mut self, level: nyann::policy::host::Level, msg: String) {
                use nyann::policy::host::Level;
                let level = match level {
                    Level::Debug => LogLevel::Debug,
                    Level::Info => LogLevel::Info,
                    Level::Warn => LogLevel::Warn,
                };
                self.log(level, &msg);
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

        pub(super) fn judge(
            pre: &CongestionPolicyPre<HostState>,
            store: &mut Store<HostState>,
            params: &[Param],
            stage: &StageObservation,
            history: &[StageObservation],
        ) -> wasmtime::Result<Result<Verdict, String>> {
            let params = params_to_wit(params);
            let stage = stage.into();
            let history: Vec<_> = history.iter().map(wit::StageObservation::from).collect();
            let policy = pre.instantiate(&mut *store)?;
            let verdict =
                policy
                    .nyann_policy_policy()
                    .call_judge(&mut *store, &params, &stage, &history)?;
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

mod v0_1;
mod v0_2;
mod v0_3;

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
    /// `nyann:policy@0.3`: the current line, which the SDK builds.
    V0_3,
}

impl Interface {
    /// Every supported line, oldest first.
    pub const ALL: [Interface; 3] = [Interface::V0_1, Interface::V0_2, Interface::V0_3];

    /// The line new policies are built against.
    pub const NEWEST: Interface = Interface::V0_3;

    /// `0.1`, `0.2`.
    pub fn line(self) -> &'static str {
        match self {
            Interface::V0_1 => "0.1",
            Interface::V0_2 => "0.2",
            Interface::V0_3 => "0.3",
        }
    }

    /// The line's WIT text (`wit/<line>/policy.wit`).
    pub fn wit(self) -> &'static str {
        match self {
            Interface::V0_1 => include_str!("../../../../wit/0.1/policy.wit"),
            Interface::V0_2 => include_str!("../../../../wit/0.2/policy.wit"),
            Interface::V0_3 => include_str!("../../../../wit/0.3/policy.wit"),
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

/// `nyann:policy@0.1.x, nyann:policy@0.2.x, nyann:policy@0.3.x`.
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
    v0_3::add_to_linker(linker)
}

/// A component ready to instantiate, typed by its interface line: the
/// bindgen `Pre` of that line (built once per load; it type-checks the
/// exports against the line's WIT).
pub(crate) enum Pre {
    V0_1(v0_1::CongestionPolicyPre<HostState>),
    V0_2(v0_2::CongestionPolicyPre<HostState>),
    V0_3(v0_3::CongestionPolicyPre<HostState>),
}

impl Pre {
    pub fn new(interface: Interface, pre: InstancePre<HostState>) -> wasmtime::Result<Pre> {
        Ok(match interface {
            Interface::V0_1 => Pre::V0_1(v0_1::CongestionPolicyPre::new(pre)?),
            Interface::V0_2 => Pre::V0_2(v0_2::CongestionPolicyPre::new(pre)?),
            Interface::V0_3 => Pre::V0_3(v0_3::CongestionPolicyPre::new(pre)?),
        })
    }

    pub fn interface(&self) -> Interface {
        match self {
            Pre::V0_1(_) => Interface::V0_1,
            Pre::V0_2(_) => Interface::V0_2,
            Pre::V0_3(_) => Interface::V0_3,
        }
    }

    /// Instantiate in `store` and call `describe`.
    pub fn describe(&self, store: &mut Store<HostState>) -> wasmtime::Result<PolicyInfo> {
        match self {
            Pre::V0_1(pre) => v0_1::describe(pre, store),
            Pre::V0_2(pre) => v0_2::describe(pre, store),
            Pre::V0_3(pre) => v0_3::describe(pre, store),
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
        }
    }

    /// Instantiate in `store` and call `judge`.
    pub fn judge(
        &self,
        store: &mut Store<HostState>,
        params: &[Param],
        stage: &StageObservation,
        history: &[StageObservation],
    ) -> wasmtime::Result<Result<Verdict, String>> {
        match self {
            Pre::V0_1(pre) => v0_1::judge(pre, store, params, stage, history),
            Pre::V0_2(pre) => v0_2::judge(pre, store, params, stage, history),
            Pre::V0_3(pre) => v0_3::judge(pre, store, params, stage, history),
        }
    }
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
        assert_eq!(Interface::of_version("0.4.0"), None);
        assert_eq!(Interface::of_version("1.0.0"), None);
        assert_eq!(Interface::of_version(""), None);
        assert_eq!(
            Interface::of_name("nyann:policy/policy@0.2.0"),
            Some(Interface::V0_2)
        );
        assert_eq!(
            supported_versions(),
            "nyann:policy@0.1.x, nyann:policy@0.2.x, nyann:policy@0.3.x"
        );
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
