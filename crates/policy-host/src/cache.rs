//! A cache of compiled policy code on disk, so that starting nyann-bench
//! does not pay Cranelift's compile time (~0.3 s for the built-in in
//! release, seconds in debug) on every run.
//!
//! Entries are keyed by the SHA-256 of the component bytes and by the
//! engine's compatibility hash (wasmtime version, target, configuration),
//! written atomically (temporary file + rename), and only ever read back
//! from the cache directory this process was configured with: wasmtime's
//! deserialization trusts its input, so nothing else is ever deserialized.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

/// Compile `bytes`, or load the compiled code from `dir` when present.
/// Cache problems (unwritable directory, stale or corrupt entry) never fail
/// the load: they fall back to compiling, logged at debug level.
pub(crate) fn load_or_compile(
    engine: &Engine,
    dir: Option<&Path>,
    bytes: &[u8],
) -> wasmtime::Result<Component> {
    let Some(dir) = dir else {
        return Component::from_binary(engine, bytes);
    };
    let path = entry_path(engine, dir, bytes);
    if path.is_file() {
        match deserialize(engine, &path) {
            Ok(component) => return Ok(component),
            Err(err) => tracing::debug!(
                "ignoring policy code cache entry {}: {err:#}",
                path.display()
            ),
        }
    }
    let component = Component::from_binary(engine, bytes)?;
    if let Err(err) = store(&component, dir, &path) {
        tracing::debug!(
            "cannot write policy code cache entry {}: {err}",
            path.display()
        );
    }
    Ok(component)
}

fn entry_path(engine: &Engine, dir: &Path, bytes: &[u8]) -> PathBuf {
    let digest = Sha256::digest(bytes);
    let mut hex = String::with_capacity(64);
    for b in digest.iter() {
        hex.push_str(&format!("{b:02x}"));
    }
    // SipHash with fixed keys: stable for a given build of the host, which
    // is all that matters (a different host build simply misses).
    let mut hasher = std::hash::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut hasher);
    dir.join(format!("{hex}-{:016x}.cwasm", hasher.finish()))
}

#[allow(unsafe_code)]
fn deserialize(engine: &Engine, path: &Path) -> wasmtime::Result<Component> {
    // Read into memory rather than `deserialize_file`'s mmap: a file
    // truncated in place while mapped would crash the process (SIGBUS).
    let bytes = std::fs::read(path)?;
    // SAFETY: `path` is an entry this host wrote itself with
    // `Component::serialize` into its own cache directory (atomically, by
    // rename), named by the hash of the source bytes and the engine's
    // compatibility hash; wasmtime additionally checks the header and the
    // engine configuration.
    unsafe { Component::deserialize(engine, &bytes) }
}

fn store(component: &Component, dir: &Path, path: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let bytes = component
        .serialize()
        .map_err(|e| std::io::Error::other(format!("{e:#}")))?;
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("entry"),
        std::process::id()
    ));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

/// The default cache directory: `$NYANN_BENCH_CACHE_DIR/policies`, else
/// `$XDG_CACHE_HOME/nyann-bench/policies`, else
/// `$HOME/.cache/nyann-bench/policies`; `None` when none is set.
pub fn default_cache_dir() -> Option<PathBuf> {
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(dir) = env("NYANN_BENCH_CACHE_DIR") {
        return Some(dir.join("policies"));
    }
    if let Some(dir) = env("XDG_CACHE_HOME") {
        return Some(dir.join("nyann-bench").join("policies"));
    }
    env("HOME").map(|home| home.join(".cache").join("nyann-bench").join("policies"))
}
