//! Shared helpers: one host per test binary, the built-in and guest
//! components loaded once (compiling a component in a debug build takes
//! seconds), guests built with the same nested build as build.rs.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use nyann_model::scenario::{Param, SourceLocation, StopCondition, Value};
use nyann_policy_host::{HostConfig, Policy, PolicyHost};

#[path = "../../build/guest.rs"]
#[allow(dead_code)]
pub mod guest;

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

/// Build (once) and return the `.wasm` of a guest package: the example
/// policies from the repository workspace, `hostile-policy` from
/// `tests/guests`.
pub fn guest_wasm(package: &str) -> PathBuf {
    static BUILT: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let root = Path::new(env!("NYANN_POLICY_WORKSPACE_ROOT"));
    let manifest = if package == "hostile-policy" {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/guests/Cargo.toml")
    } else {
        root.join("Cargo.toml")
    };
    let target_dir = Path::new(env!("NYANN_POLICY_GUEST_TARGET_DIR"));
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    let out = target_dir.join(guest::WASM_TARGET).join("release");
    if !built.iter().any(|p| p == package) {
        guest::build(
            Path::new(env!("CARGO")),
            Path::new(env!("NYANN_POLICY_RUSTC")),
            &manifest,
            &[package],
            target_dir,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        built.push(package.to_string());
    }
    out.join(format!("{}.wasm", package.replace('-', "_")))
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
    }
}
