//! Shared helpers: one host per test binary, the built-in and guest
//! components loaded once (compiling a component in a debug build takes
//! seconds), guests built by nyann-guests.

use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

use nyann_guests::assembled::Assembled;
use nyann_model::scenario::{Param, SourceLocation, StopCondition, Value};
use nyann_policy_host::{HostConfig, Interface, Policy, PolicyHost};

/// A host with default limits and no code cache (tests must not touch the
/// user's cache directory).
pub fn host() -> &'static PolicyHost {
    static HOST: OnceLock<PolicyHost> = OnceLock::new();
    HOST.get_or_init(|| {
        PolicyHost::new(HostConfig {
            cache_dir: None,
            ..HostConfig::default()
        })
        .unwrap()
    })
}

pub fn builtin() -> Policy {
    static BUILTIN: OnceLock<Policy> = OnceLock::new();
    BUILTIN
        .get_or_init(|| host().load_builtin().unwrap())
        .clone()
}

/// Build (once per test binary) and return the `.wasm` of a guest package:
/// the example policies from the repository workspace, `hostile-policy` and
/// `legacy-v01-policy` from `tests/guests`.
pub fn guest_wasm(package: &str) -> PathBuf {
    static BUILT: Mutex<Vec<(String, PathBuf)>> = Mutex::new(Vec::new());
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, path)) = built.iter().find(|(p, _)| p == package) {
        return path.clone();
    }
    let path = if package == "hostile-policy" || package == "legacy-v01-policy" {
        nyann_guests::test_guest(package)
    } else {
        nyann_guests::repository_guest(package)
    }
    .unwrap_or_else(|e| panic!("{e}"));
    built.push((package.to_string(), path.clone()));
    path
}

/// Load a guest package's component (once per test binary).
pub fn guest(package: &str) -> Policy {
    static LOADED: Mutex<Vec<(String, Policy)>> = Mutex::new(Vec::new());
    if let Some((_, p)) = LOADED.lock().unwrap().iter().find(|(n, _)| n == package) {
        return p.clone();
    }
    let policy = host().load_file(&guest_wasm(package)).unwrap();
    LOADED
        .lock()
        .unwrap()
        .push((package.to_string(), policy.clone()));
    policy
}

/// An `until_congested(...)` call with these parameters, written at
/// `sweep.star:4:13` (the location parameter errors must name).
pub fn stop(params: &[(&str, Value)]) -> StopCondition {
    StopCondition {
        params: params
            .iter()
            .map(|(n, v)| Param {
                name: n.to_string(),
                value: v.clone(),
            })
            .collect(),
        location: Some(SourceLocation {
            file: "sweep.star".into(),
            line: 4,
            column: 13,
        }),
        param_locations: Vec::new(),
        search: None,
    }
}

/// A host with these settings and no code cache.
pub fn host_with(config: HostConfig) -> PolicyHost {
    PolicyHost::new(HostConfig {
        cache_dir: None,
        ..config
    })
    .unwrap()
}

/// An assembled component (see `nyann_guests::assembled`) for the WIT of
/// interface line `line` (`0.1`, `0.2`), possibly edited by `edit`.
pub fn assembled(line: &str, spec: &Assembled, edit: impl Fn(&str) -> String) -> Vec<u8> {
    let wit = match line {
        "0.1" => Interface::V0_1.wit(),
        _ => Interface::V0_2.wit(),
    };
    nyann_guests::assembled::component(&edit(wit), &format!("{line}.0"), spec)
        .unwrap_or_else(|e| panic!("{e}"))
}
