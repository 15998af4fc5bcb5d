//! Builds policy guest components for wasm32-wasip2 with a nested `cargo
//! build`, the way every part of the repository needs them:
//!
//! - the built-in policy, whose component is committed as
//!   `policies/builtin/builtin.wasm` (the nyann-bench binary embeds that file,
//!   so building the binary needs no wasm toolchain); `cargo xtask builtin`
//!   regenerates it and a test checks that it matches its source;
//! - the example policies and the policy host's hostile test guests, which
//!   the tests load;
//! - components assembled without a compiler ([`assembled`]), for hostile
//!   tests that Rust cannot express (several memories, huge code, a shape
//!   that differs from the WIT).
//!
//! Guests build in their own target directory (never the outer build's,
//! whose lock the outer cargo holds), with the outer build's flags stripped
//! (they are for the host target and may come from clippy or a coverage
//! tool), with a size-oriented release profile, and with the machine's
//! paths remapped so that the same source gives the same bytes on any
//! machine with the pinned toolchain.

pub mod assembled;
mod toolchain;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

pub use toolchain::{MISSING_TARGET, WASM_TARGET, target_installed};

/// The package of the built-in policy.
pub const BUILTIN_PACKAGE: &str = "nyann-builtin-policy";

/// Where the built-in component is committed, relative to the repository root.
pub const BUILTIN_COMMITTED: &str = "policies/builtin/builtin.wasm";

/// Where the built-in's precompiled code for x86-64 Linux is committed
/// (`nyann_policy_host::precompiled`).
pub const BUILTIN_PRECOMPILED_COMMITTED: &str = "policies/builtin/builtin.x86_64-linux.cwasm";

/// The digest of the `builtin.wasm` that [`BUILTIN_PRECOMPILED_COMMITTED`]
/// was compiled from (`sha256sum -c` reads it).
pub const BUILTIN_PRECOMPILED_DIGEST: &str = "policies/builtin/builtin.x86_64-linux.cwasm.sha256";

/// The command that regenerates [`BUILTIN_COMMITTED`].
pub const REGENERATE_BUILTIN: &str = "cargo xtask builtin";

/// Why a guest could not be built.
#[derive(Debug)]
pub enum GuestBuildError {
    /// The toolchain lacks the wasm32-wasip2 standard library.
    MissingTarget,
    /// `cargo` could not be started or the build failed.
    Failed(String),
}

impl std::fmt::Display for GuestBuildError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GuestBuildError::MissingTarget => f.write_str(MISSING_TARGET),
            GuestBuildError::Failed(msg) => f.write_str(msg),
        }
    }
}

impl std::error::Error for GuestBuildError {}

/// The repository's root directory.
pub fn repository_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Builds a guest package of the repository's workspace (the built-in, the
/// example policies) and returns its `.wasm`.
pub fn repository_guest(package: &str) -> Result<PathBuf, GuestBuildError> {
    build_shared(&repository_root().join("Cargo.toml"), package)
}

/// Builds a guest package of the policy host's test guests
/// (`crates/policy-host/tests/guests`, a workspace of its own so that native
/// clippy and tests never build them) and returns its `.wasm`.
pub fn test_guest(package: &str) -> Result<PathBuf, GuestBuildError> {
    let manifest = repository_root().join("crates/policy-host/tests/guests/Cargo.toml");
    build_shared(&manifest, package)
}

/// One nested build at a time per process (they share a target directory,
/// and cargo would only make the others wait on its lock).
fn build_shared(manifest: &Path, package: &str) -> Result<PathBuf, GuestBuildError> {
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let _turn = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let dir = build(
        Path::new(env!("CARGO")),
        Path::new(env!("NYANN_GUESTS_RUSTC")),
        manifest,
        &[package],
        Path::new(env!("NYANN_GUESTS_TARGET_DIR")),
    )?;
    Ok(dir.join(format!("{}.wasm", package.replace('-', "_"))))
}

/// Build `packages` of the workspace whose manifest is `manifest` in
/// release mode for wasm32-wasip2 into `target_dir`; returns the directory
/// holding the `.wasm` files (`<target_dir>/wasm32-wasip2/release`).
pub fn build(
    cargo: &Path,
    rustc: &Path,
    manifest: &Path,
    packages: &[&str],
    target_dir: &Path,
) -> Result<PathBuf, GuestBuildError> {
    if !target_installed(rustc) {
        return Err(GuestBuildError::MissingTarget);
    }
    let mut cmd = Command::new(cargo);
    cmd.arg("build")
        .arg("--release")
        .arg("--locked")
        .arg("--target")
        .arg(WASM_TARGET)
        .arg("--manifest-path")
        .arg(manifest);
    for p in packages {
        cmd.arg("-p").arg(p);
    }
    // Strip what the outer build set for itself: its target dir and
    // profile, its rustc flags and wrappers (clippy-driver, coverage), the
    // per-package variables of a build script. Keep CARGO_HOME, network
    // and registry settings, and the jobserver (CARGO_MAKEFLAGS) so the
    // nested build shares the outer one's job tokens.
    for (key, _) in std::env::vars_os() {
        let Some(key) = key.to_str() else { continue };
        let keep = matches!(key, "CARGO_HOME" | "CARGO_MAKEFLAGS")
            || key.starts_with("CARGO_NET_")
            || key.starts_with("CARGO_HTTP_")
            || key.starts_with("CARGO_REGISTRIES_")
            || key.starts_with("CARGO_REGISTRY_");
        let strip = (key.starts_with("CARGO_") && !keep)
            || matches!(
                key,
                "RUSTFLAGS"
                    | "RUSTDOCFLAGS"
                    | "RUSTC"
                    | "RUSTC_WRAPPER"
                    | "RUSTC_WORKSPACE_WRAPPER"
                    | "RUSTC_LINKER"
                    | "CLIPPY_ARGS"
                    | "CLIPPY_CONF_DIR"
                    | "TARGET"
                    | "HOST"
                    | "OUT_DIR"
                    | "OPT_LEVEL"
                    | "PROFILE"
                    | "DEBUG"
                    | "NUM_JOBS"
                    | "LLVM_PROFILE_FILE"
            );
        if strip {
            cmd.env_remove(key);
        }
    }
    cmd.env("RUSTC", rustc)
        .env("CARGO_TARGET_DIR", target_dir)
        .env("CARGO_ENCODED_RUSTFLAGS", remap_machine_paths(manifest))
        // Small components: they are embedded, loaded and compiled per run.
        .env("CARGO_PROFILE_RELEASE_DEBUG", "false")
        .env("CARGO_PROFILE_RELEASE_STRIP", "true")
        .env("CARGO_PROFILE_RELEASE_OPT_LEVEL", "s")
        .env("CARGO_PROFILE_RELEASE_LTO", "true")
        .env("CARGO_PROFILE_RELEASE_CODEGEN_UNITS", "1")
        .env("CARGO_PROFILE_RELEASE_PANIC", "abort");
    let out = cmd
        .output()
        .map_err(|e| GuestBuildError::Failed(format!("cannot run {}: {e}", cargo.display())))?;
    if !out.status.success() {
        return Err(GuestBuildError::Failed(format!(
            "building {} for {WASM_TARGET} failed:\n{}",
            packages.join(", "),
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(target_dir.join(WASM_TARGET).join("release"))
}

/// rustc flags (cargo's `\x1f`-separated encoding) that replace the paths
/// of this machine compiled into panic locations (the checkout, cargo's
/// registry) with fixed ones, so a component is the same bytes wherever it
/// is built.
fn remap_machine_paths(manifest: &Path) -> OsString {
    let mut prefixes: Vec<(PathBuf, &str)> = Vec::new();
    for (dir, fixed) in [
        (manifest.parent().map(Path::to_path_buf), "/workspace"),
        (Some(repository_root()), "/nyann"),
        (cargo_home(), "/cargo"),
    ] {
        let Some(dir) = dir else { continue };
        if let Ok(canonical) = dir.canonicalize() {
            prefixes.push((canonical, fixed));
        }
        prefixes.push((dir, fixed));
    }
    let mut flags = OsString::new();
    for (i, (dir, fixed)) in prefixes.iter().enumerate() {
        if i > 0 {
            flags.push("\x1f");
        }
        flags.push("--remap-path-prefix=");
        flags.push(dir.as_os_str());
        flags.push("=");
        flags.push(fixed);
    }
    flags
}

fn cargo_home() -> Option<PathBuf> {
    std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| Path::new(&home).join(".cargo")))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// A toolchain without the wasm target gets the one-line instruction,
    /// before cargo is run.
    #[test]
    fn missing_target_says_how_to_install_it() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        // A rustc whose wasm32-wasip2 library directory does not exist.
        let fake = dir.join("rustc");
        std::fs::write(
            &fake,
            "#!/bin/sh\necho /nonexistent/lib/rustlib/wasm32-wasip2/lib\n",
        )
        .unwrap();
        Command::new("chmod").arg("+x").arg(&fake).status().unwrap();

        let err = build(
            Path::new("/nonexistent/cargo"),
            &fake,
            Path::new("Cargo.toml"),
            &["x"],
            dir,
        )
        .unwrap_err();
        assert_eq!(err.to_string(), MISSING_TARGET);
        assert!(MISSING_TARGET.contains("run `rustup target add wasm32-wasip2`"));
    }

    #[test]
    fn machine_paths_are_remapped_to_fixed_ones() {
        let flags = remap_machine_paths(&repository_root().join("Cargo.toml"));
        let flags = flags.to_string_lossy();
        let root = repository_root().canonicalize().unwrap();
        assert!(
            flags
                .split('\x1f')
                .any(|f| f == format!("--remap-path-prefix={}=/nyann", root.display())),
            "{flags}"
        );
        assert!(flags.contains("=/cargo"), "{flags}");
    }
}
