//! Load-time checks of a policy's bytes and component type, so that a bad
//! file is refused with a message saying what it is and what to do, before
//! wasmtime's own (more cryptic) linking errors could appear.

use wasmtime::Engine;
use wasmtime::component::Component;

/// The interface package every policy implements.
pub const PACKAGE: &str = "nyann:policy";

/// The interface version lines this host supports (a 0.x line is `0.minor`:
/// wasmtime matches any `0.1.z` export against `0.1.0`).
pub const SUPPORTED_VERSIONS: &[&str] = &["0.1"];

/// `nyann:policy@0.1.x` (and more, comma-separated, when there are more).
pub fn supported_versions() -> String {
    SUPPORTED_VERSIONS
        .iter()
        .map(|v| format!("{PACKAGE}@{v}.x"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Interfaces a policy may import: the contract's own, and the WASI 0.2
/// interfaces a Rust wasm32-wasip2 `std` links (granted over an empty
/// context: no files, environment, arguments; stdin closed). Sockets, HTTP
/// and anything unknown are refused.
const ALLOWED_IMPORTS: &[(&str, &[&str])] = &[
    ("nyann:policy", &["types", "host"]),
    (
        "wasi:cli",
        &[
            "environment",
            "exit",
            "stdin",
            "stdout",
            "stderr",
            "terminal-input",
            "terminal-output",
            "terminal-stdin",
            "terminal-stdout",
            "terminal-stderr",
        ],
    ),
    ("wasi:io", &["error", "streams", "poll"]),
    ("wasi:clocks", &["wall-clock", "monotonic-clock"]),
    ("wasi:filesystem", &["types", "preopens"]),
    ("wasi:random", &["random", "insecure", "insecure-seed"]),
];

/// Refuse anything that is not a WebAssembly component, saying what it is.
pub fn check_bytes(bytes: &[u8]) -> Result<(), String> {
    const MAGIC: &[u8] = b"\0asm";
    if Engine::detect_precompiled(bytes).is_some() {
        return Err(
            "is precompiled wasmtime code, not a component; give the .wasm file instead".into(),
        );
    }
    if bytes.len() < 8 || &bytes[..4] != MAGIC {
        return Err(
            "is not a WebAssembly component (no \\0asm header); give the .wasm file built with \
             `cargo build --release --target wasm32-wasip2`"
                .into(),
        );
    }
    // Bytes 4..8: version and layer. Core modules are layer 0, components layer 1.
    match bytes[6..8] {
        [0, 0] => Err("is a core WebAssembly module, not a component; build the policy with \
             `--target wasm32-wasip2` (the nyann-policy SDK does), or wrap it with `wasm-tools component new`"
            .into()),
        [1, 0] => Ok(()),
        _ => Err("is a WebAssembly binary of an unknown layer, not a component".into()),
    }
}

/// Check the exported interface version and every import.
pub fn check_component(engine: &Engine, component: &Component) -> Result<(), String> {
    let ty = component.component_type();
    let exports: Vec<&str> = ty.exports(engine).map(|(name, _)| name).collect();
    let policy_exports: Vec<&str> = exports
        .iter()
        .copied()
        .filter(|n| n.starts_with(&format!("{PACKAGE}/policy")))
        .collect();
    if policy_exports.is_empty() {
        let shown = if exports.is_empty() {
            "nothing".to_string()
        } else {
            exports.join(", ")
        };
        return Err(format!(
            "does not export {PACKAGE}/policy (it exports {shown}); is it a congestion policy? \
             This host supports {}",
            supported_versions()
        ));
    }
    for name in &policy_exports {
        let version = name.split_once('@').map(|(_, v)| v).unwrap_or("");
        if !version_supported(version) {
            let shown = if version.is_empty() {
                "an unversioned interface".to_string()
            } else {
                format!("{PACKAGE}@{version}")
            };
            return Err(format!(
                "is built for {shown}; this host supports {} (rebuild the policy against \
                 the WIT printed by `nyann-bench policy wit`)",
                supported_versions()
            ));
        }
    }
    for (name, _) in ty.imports(engine) {
        if !import_allowed(name) {
            return Err(format!(
                "imports `{name}`, which policies may not use (allowed: {PACKAGE}/host, and the \
                 wasi:cli, wasi:io, wasi:clocks, wasi:filesystem and wasi:random 0.2 interfaces \
                 a Rust std links, granted over an empty context)"
            ));
        }
    }
    Ok(())
}

fn version_supported(version: &str) -> bool {
    let mut parts = version.split('.');
    let (Some(major), Some(minor)) = (parts.next(), parts.next()) else {
        return false;
    };
    SUPPORTED_VERSIONS.contains(&format!("{major}.{minor}").as_str())
}

fn import_allowed(name: &str) -> bool {
    let (path, version) = name.split_once('@').unwrap_or((name, ""));
    let Some((package, interface)) = path.split_once('/') else {
        return false;
    };
    let version_ok = if package == PACKAGE {
        version_supported(version)
    } else {
        version.starts_with("0.2.")
    };
    version_ok
        && ALLOWED_IMPORTS
            .iter()
            .any(|(p, interfaces)| *p == package && interfaces.contains(&interface))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions() {
        assert!(version_supported("0.1.0"));
        assert!(version_supported("0.1.7"));
        assert!(!version_supported("0.2.0"));
        assert!(!version_supported("1.0.0"));
        assert!(!version_supported(""));
        assert_eq!(supported_versions(), "nyann:policy@0.1.x");
    }

    #[test]
    fn imports() {
        assert!(import_allowed("wasi:cli/environment@0.2.3"));
        assert!(import_allowed("wasi:io/streams@0.2.0"));
        assert!(import_allowed("nyann:policy/host@0.1.0"));
        assert!(!import_allowed("nyann:policy/host@0.2.0"));
        assert!(!import_allowed("wasi:sockets/tcp@0.2.3"));
        assert!(!import_allowed("wasi:http/outgoing-handler@0.2.3"));
        assert!(!import_allowed("wasi:cli/environment@0.3.0"));
        assert!(!import_allowed("evil"));
    }

    #[test]
    fn bytes() {
        assert!(check_bytes(b"\0asm\x0d\x00\x01\x00").is_ok());
        assert!(
            check_bytes(b"\0asm\x01\x00\x00\x00")
                .unwrap_err()
                .contains("core WebAssembly module")
        );
        assert!(
            check_bytes(b"hello world")
                .unwrap_err()
                .contains("not a WebAssembly component")
        );
        assert!(check_bytes(b"").is_err());
    }
}
