//! The built-in policy's machine code, compiled ahead of time and shipped in
//! the binary, so that its first load on a machine reads code instead of
//! running Cranelift (~0.3 s).
//!
//! `cargo xtask builtin` writes the artifact for [`TARGET`] next to
//! `builtin.wasm`, with the SHA-256 of the `builtin.wasm` it was compiled
//! from. The host uses it only when that digest is the embedded
//! `builtin.wasm`'s and wasmtime accepts it for the host's engine (same
//! wasmtime version, target, compiler settings, fuel and epoch
//! instrumentation, CPU features the host has); otherwise the built-in is
//! compiled (or read from the code cache) as any other component.
//!
//! The artifact is compiled for a fixed target with a fixed set of CPU
//! features (x86-64-v2), not for the machine that runs the xtask: the same
//! source gives the same bytes on any x86-64 machine, and any x86-64 Linux
//! host from the last fifteen years can run it.

use wasmtime::component::Component;
use wasmtime::{Config, Engine};

/// The target the artifact is compiled for.
pub const TARGET: &str = "x86_64-unknown-linux-gnu";

/// Cranelift's names of the x86-64-v2 CPU features the artifact may use:
/// wasmtime checks at load that the host has each of them.
const X86_64_V2: [&str; 5] = [
    "has_sse3",
    "has_ssse3",
    "has_sse41",
    "has_sse42",
    "has_popcnt",
];

/// The committed artifact and the digest of its source, in `sha256sum`'s
/// format (`<hex>  builtin.wasm`), embedded only where they can run: other
/// hosts compile the built-in.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
pub const BUILTIN_PRECOMPILED: Option<(&[u8], &str)> = Some((
    include_bytes!("../../../policies/builtin/builtin.x86_64-linux.cwasm"),
    include_str!("../../../policies/builtin/builtin.x86_64-linux.cwasm.sha256"),
));

/// No precompiled built-in for this host: it is compiled at first load.
#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
pub const BUILTIN_PRECOMPILED: Option<(&[u8], &str)> = None;

/// Compile a built-in component for [`TARGET`] with the engine settings the
/// host runs with. Returns the artifact and its digest line.
pub fn precompile(wasm: &[u8]) -> Result<(Vec<u8>, String), String> {
    let mut config = crate::engine_config();
    config
        .target(TARGET)
        .map_err(|e| format!("cannot compile for {TARGET}: {e:#}"))?;
    for feature in X86_64_V2 {
        // SAFETY: these flags only let Cranelift use the instructions; the
        // artifact records them and wasmtime refuses it on a host that lacks
        // any of them (see `load`), which then compiles the built-in.
        #[allow(unsafe_code)]
        unsafe {
            config.cranelift_flag_enable(feature);
        }
    }
    precompile_with(&config, wasm)
}

/// [`precompile`] with any engine settings (the tests make artifacts the
/// host must refuse).
pub(crate) fn precompile_with(config: &Config, wasm: &[u8]) -> Result<(Vec<u8>, String), String> {
    let engine = Engine::new(config).map_err(|e| format!("cannot create the engine: {e:#}"))?;
    let artifact = engine
        .precompile_component(wasm)
        .map_err(|e| format!("cannot compile the component: {e:#}"))?;
    Ok((artifact, digest_line(wasm)))
}

/// The artifact's companion file: `<sha256 hex>  builtin.wasm`.
pub fn digest_line(wasm: &[u8]) -> String {
    format!("{}  builtin.wasm\n", crate::ComponentDigest::of(wasm).hex())
}

/// The built-in's code from the shipped artifact when it is the compilation
/// of `wasm` and this engine accepts it; why not otherwise (a message for
/// the debug log: the caller compiles instead).
pub(crate) fn load(
    engine: &Engine,
    (artifact, digest): (&[u8], &str),
    wasm: &[u8],
) -> Result<Component, String> {
    if digest.trim_end() != digest_line(wasm).trim_end() {
        return Err("it was compiled from another builtin.wasm".into());
    }
    // SAFETY: the artifact is embedded in this binary, written by `cargo
    // xtask builtin` with `Engine::precompile_component` (a test checks it
    // is the compilation of the embedded builtin.wasm); wasmtime checks its
    // header and that its version, target, settings and CPU features suit
    // this engine, and refuses it otherwise.
    #[allow(unsafe_code)]
    let component = unsafe { Component::deserialize(engine, artifact) };
    component.map_err(|e| format!("{e:#}"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::{BUILTIN_WASM, CodeSource, HostConfig, PolicyHost};
    use nyann_model::observation::{RoleSignals, StageObservation};
    use nyann_model::scenario::{Param, StopCondition, Value};

    fn host(config: HostConfig) -> PolicyHost {
        PolicyHost::new(HostConfig {
            cache_dir: None,
            ..config
        })
        .unwrap()
    }

    /// The built-in's checked parameters (both thresholds are required).
    fn params(policy: &crate::Policy) -> Vec<Param> {
        let param = |name: &str, value| Param {
            name: name.into(),
            value,
        };
        policy
            .check_params(&StopCondition {
                params: vec![
                    param("waiting_requests_p50", Value::Number(32.0)),
                    param("ttft_p99", Value::Text("2s".into())),
                ],
                location: None,
                param_locations: Vec::new(),
                search: None,
            })
            .unwrap()
    }

    /// The verdict on a stage over both thresholds.
    fn judged(policy: &crate::Policy) -> nyann_model::observation::Verdict {
        let stage = StageObservation {
            index: 3,
            roles: vec![RoleSignals {
                role: "aggregate".into(),
                waiting_requests_p50: 40.0,
                ttft_p99_seconds: 5.0,
                ..Default::default()
            }],
            ..Default::default()
        };
        policy.judge_blocking(&params(policy), &stage, &[]).unwrap()
    }

    /// The committed artifact is exactly what `precompile` makes of the
    /// committed builtin.wasm (compiling is deterministic), and its digest
    /// file names that builtin.wasm: `cargo xtask builtin` was run after the
    /// last change of the built-in, its source or wasmtime.
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    #[test]
    fn shipped_artifact_is_the_compilation_of_the_shipped_builtin() {
        let (artifact, digest) = BUILTIN_PRECOMPILED.unwrap();
        let (fresh, fresh_digest) = precompile(BUILTIN_WASM).unwrap();
        assert_eq!(
            digest, fresh_digest,
            "regenerate with `cargo xtask builtin`"
        );
        assert!(
            artifact == fresh.as_slice(),
            "policies/builtin/builtin.x86_64-linux.cwasm ({} bytes) is not the compilation of \
             builtin.wasm with this wasmtime ({} bytes): regenerate it with `cargo xtask builtin`",
            artifact.len(),
            fresh.len()
        );
        assert_eq!(precompile(BUILTIN_WASM).unwrap().0, fresh, "deterministic");
    }

    /// The engine the host configures accepts the shipped artifact, and the
    /// built-in loads from it.
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    #[test]
    fn the_host_loads_the_builtin_from_the_shipped_artifact() {
        let host = host(HostConfig::default());
        let shipped = BUILTIN_PRECOMPILED.unwrap();
        load(&host.inner.engine, shipped, BUILTIN_WASM).unwrap();
        let policy = host.load_builtin().unwrap();
        assert_eq!(policy.code_source(), CodeSource::Precompiled);
        assert!(judged(&policy).congested);
    }

    /// An artifact the engine refuses, or one compiled from another
    /// builtin.wasm, is not used: the built-in is compiled, with the same
    /// description and verdicts.
    #[test]
    fn an_unusable_artifact_falls_back_to_compiling() {
        let host = host(HostConfig::default());
        let compiled = host.load_bytes(crate::BUILTIN, BUILTIN_WASM).unwrap();
        assert_eq!(compiled.code_source(), CodeSource::Compiled);
        let expected = judged(&compiled);

        // Compiled without fuel counting or epoch checks: running it would
        // escape the sandbox's budgets, and wasmtime refuses it.
        let mut no_fuel = crate::engine_config();
        no_fuel.consume_fuel(false);
        let mut no_epoch = crate::engine_config();
        no_epoch.epoch_interruption(false);
        let mut other = Vec::new();
        for config in [no_fuel, no_epoch] {
            let (artifact, digest) = precompile_with(&config, BUILTIN_WASM).unwrap();
            let refused = load(&host.inner.engine, (&artifact, &digest), BUILTIN_WASM);
            assert!(
                refused.is_err(),
                "an artifact for other settings is refused"
            );
            other.push((artifact, digest));
        }
        let (good, good_digest) = precompile_with(&crate::engine_config(), BUILTIN_WASM).unwrap();
        let mut corrupt = good.clone();
        corrupt.truncate(good.len() / 2);
        let mut alien = b"not compiled code".to_vec();
        alien.resize(4096, 0);
        let stale = digest_line(b"another builtin.wasm");
        let cases: Vec<(&[u8], &str)> = vec![
            (&other[0].0, &other[0].1),
            (&other[1].0, &other[1].1),
            (&corrupt, &good_digest),
            (&alien, &good_digest),
            (&good, &stale),
        ];
        for (i, artifact) in cases.into_iter().enumerate() {
            let policy = host
                .load_with_artifact(crate::BUILTIN, BUILTIN_WASM, Some(artifact))
                .unwrap();
            assert_eq!(policy.code_source(), CodeSource::Compiled, "case {i}");
            assert_eq!(policy.info(), compiled.info(), "case {i}");
            assert_eq!(judged(&policy), expected, "case {i}");
        }

        // The same artifact with its digest is used, with the same verdicts.
        let policy = host
            .load_with_artifact(crate::BUILTIN, BUILTIN_WASM, Some((&good, &good_digest)))
            .unwrap();
        assert_eq!(policy.code_source(), CodeSource::Precompiled);
        assert_eq!(judged(&policy), expected);
    }

    /// The sandbox's fuel budget and memory cap bound the built-in run from
    /// the artifact as they bound compiled code.
    #[test]
    fn the_sandbox_bounds_the_precompiled_builtin() {
        let (artifact, digest) = precompile_with(&crate::engine_config(), BUILTIN_WASM).unwrap();
        let artifact = Some((artifact.as_slice(), digest.as_str()));

        // Enough fuel for describe and validate at load, too little to judge.
        let starved = host(HostConfig {
            judge_fuel: 100,
            load_call_factor: 1_000_000,
            ..HostConfig::default()
        });
        let policy = starved
            .load_with_artifact(crate::BUILTIN, BUILTIN_WASM, artifact)
            .unwrap();
        assert_eq!(policy.code_source(), CodeSource::Precompiled);
        let err = policy
            .judge_blocking(&params(&policy), &StageObservation::default(), &[])
            .unwrap_err();
        assert!(
            matches!(err.failure(), Some(crate::CallFailure::Fuel(100))),
            "{err}"
        );

        // A cap below the built-in's own memory: describe() cannot run.
        let cramped = host(HostConfig {
            memory_limit_bytes: 64 << 10,
            ..HostConfig::default()
        });
        let err = cramped
            .load_with_artifact(crate::BUILTIN, BUILTIN_WASM, artifact)
            .unwrap_err();
        assert!(err.to_string().contains("memory cap"), "{err}");
    }
}
