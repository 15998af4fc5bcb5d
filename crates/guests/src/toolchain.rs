//! Whether the toolchain can build for the wasm target. Shared by the build
//! script (which stops the build early without it) and the library.

use std::path::Path;
use std::process::Command;

/// The wasm target policies are built for.
pub const WASM_TARGET: &str = "wasm32-wasip2";

/// What to do when the target is missing.
pub const MISSING_TARGET: &str = "the wasm32-wasip2 target is not installed: run `rustup target add wasm32-wasip2` (needed to build policy components: the tests and `cargo xtask builtin`; the nyann-bench binary itself builds without it)";

/// Where `rustc` keeps (or would keep) the wasm target's libraries.
pub fn target_libdir(rustc: &Path) -> Option<String> {
    let out = Command::new(rustc)
        .args(["--print", "target-libdir", "--target", WASM_TARGET])
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("RUSTC_WRAPPER")
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// True when `rustc` has a standard library for the wasm target.
pub fn target_installed(rustc: &Path) -> bool {
    let Some(dir) = target_libdir(rustc) else {
        return false;
    };
    std::fs::read_dir(&dir).is_ok_and(|entries| {
        entries.flatten().any(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name == "libstd.rlib" || (name.starts_with("libstd-") && name.ends_with(".rlib"))
        })
    })
}
