//! Builds policy guest crates for wasm32-wasip2 with a nested `cargo build`.
//!
//! Shared by the build script (the embedded built-in policy) and the tests
//! (example and hostile policies), so both build guests the same way: in
//! their own target directory (never the outer build's, whose lock the
//! outer cargo holds), with the outer build's flags stripped (they are for
//! the host target and may come from clippy or a coverage tool), and with a
//! size-oriented release profile.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The wasm target policies are built for.
pub const WASM_TARGET: &str = "wasm32-wasip2";

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
            GuestBuildError::MissingTarget => write!(
                f,
                "the {WASM_TARGET} target is not installed: run `rustup target add {WASM_TARGET}`"
            ),
            GuestBuildError::Failed(msg) => f.write_str(msg),
        }
    }
}

/// True when `rustc` has a standard library for the wasm target.
pub fn target_installed(rustc: &Path) -> bool {
    let out = Command::new(rustc)
        .args(["--print", "target-libdir", "--target", WASM_TARGET])
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("RUSTC_WRAPPER")
        .output();
    match out {
        Ok(out) if out.status.success() => {
            let dir = String::from_utf8_lossy(&out.stdout).trim().to_string();
            Path::new(&dir).join("libstd.rlib").exists()
                || std::fs::read_dir(&dir)
                    .map(|entries| {
                        entries
                            .flatten()
                            .any(|e| e.file_name().to_string_lossy().starts_with("libstd-"))
                    })
                    .unwrap_or(false)
        }
        _ => false,
    }
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
        .arg("--target")
        .arg(WASM_TARGET)
        .arg("--manifest-path")
        .arg(manifest);
    for p in packages {
        cmd.arg("-p").arg(p);
    }
    // Strip what the outer build set for itself: its target dir and
    // profile, its rustc flags and wrappers (clippy-driver, coverage), the
    // per-package variables of the build script. Keep CARGO_HOME, network
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
