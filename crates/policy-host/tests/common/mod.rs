//! Shared test helpers: one host and one loaded built-in per test binary
//! (compiling a component in a debug build takes seconds).

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::sync::OnceLock;

use nyann_policy_host::{HostConfig, Policy, PolicyHost};

/// A host with default limits and no code cache (tests must not touch
/// the user's cache directory).
pub fn host() -> &'static PolicyHost {
    static HOST: OnceLock<PolicyHost> = OnceLock::new();
    HOST.get_or_init(|| PolicyHost::new(HostConfig { cache_dir: None, ..HostConfig::default() }).unwrap())
}

pub fn builtin() -> Policy {
    static BUILTIN: OnceLock<Policy> = OnceLock::new();
    BUILTIN.get_or_init(|| host().load_builtin().unwrap()).clone()
}
