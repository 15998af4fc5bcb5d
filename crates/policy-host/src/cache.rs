//! Compiling a component, bounded in time, and a cache of compiled code on
//! disk, bounded in size, so that starting nyann-bench does not pay
//! Cranelift's compile time (~0.3 s for the built-in) on every run.
//!
//! Entries are keyed by the SHA-256 of the component bytes and by the
//! engine's compatibility hash (wasmtime version, target, configuration),
//! written atomically (temporary file + rename), and only ever read back
//! from the cache directory this process was configured with: wasmtime's
//! deserialization trusts its input, so nothing else is ever deserialized.
//! Once the directory holds more than its bound, the oldest entries go.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

use crate::CodeSource;
use crate::bounded::{self, Unfinished};
use crate::error::human_size;

/// Where and how much to cache.
#[derive(Debug, Clone)]
pub(crate) struct CacheConfig {
    pub dir: Option<PathBuf>,
    /// Total size of the entries kept.
    pub max_bytes: u64,
    /// Longest compile before the load is refused.
    pub compile_timeout: Duration,
}

/// Compile `bytes`, or load the compiled code from the cache when present.
/// Cache problems (unwritable directory, stale or corrupt entry) never fail
/// the load: they fall back to compiling, logged at debug level. The error
/// is a message for `cannot load policy <origin>: ...`.
pub(crate) fn load_or_compile(
    engine: &Engine,
    config: &CacheConfig,
    bytes: &[u8],
) -> Result<(Component, CodeSource), String> {
    let Some(dir) = &config.dir else {
        let component = compile(engine, bytes, config.compile_timeout)?;
        return Ok((component, CodeSource::Compiled));
    };
    let path = entry_path(engine, dir, bytes);
    if path.is_file() {
        match deserialize(engine, &path) {
            Ok(component) => return Ok((component, CodeSource::Cached)),
            Err(err) => tracing::debug!(
                "ignoring policy code cache entry {}: {err:#}",
                path.display()
            ),
        }
    }
    let component = compile(engine, bytes, config.compile_timeout)?;
    if let Err(err) = store(&component, dir, &path, config.max_bytes) {
        tracing::debug!(
            "cannot write policy code cache entry {}: {err}",
            path.display()
        );
    }
    Ok((component, CodeSource::Compiled))
}

/// Compiles taking longer than this say so while they run.
const SLOW_COMPILE: Duration = Duration::from_secs(1);

/// Compile on a worker thread, abandoned past `timeout`.
fn compile(engine: &Engine, bytes: &[u8], timeout: Duration) -> Result<Component, String> {
    let (engine, size) = (engine.clone(), bytes.len() as u64);
    let bytes = bytes.to_vec();
    let notice = move || {
        tracing::info!(
            "compiling the policy ({}) is taking more than {} s (once: the compiled code is cached)",
            human_size(size),
            SLOW_COMPILE.as_secs()
        );
    };
    match bounded::run_noting_delay(timeout, (SLOW_COMPILE, notice), move || {
        (Component::from_binary(&engine, &bytes), ())
    }) {
        Ok(Ok(component)) => Ok(component),
        Ok(Err(e)) => Err(format!("is not a valid component: {e:#}")),
        Err(Unfinished::Abandoned { .. }) => Err(format!(
            "compiling it took longer than {} s; a policy this large is not supported",
            timeout.as_secs_f64()
        )),
        Err(Unfinished::Failed(e)) => Err(format!("cannot be compiled: {e}")),
    }
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

fn store(component: &Component, dir: &Path, path: &Path, max_bytes: u64) -> std::io::Result<()> {
    let bytes = component
        .serialize()
        .map_err(|e| std::io::Error::other(format!("{e:#}")))?;
    // An entry larger than half the bound would evict everything else.
    if bytes.len() as u64 > max_bytes / 2 {
        return Err(std::io::Error::other(format!(
            "the compiled code ({}) is over half the cache's bound ({})",
            human_size(bytes.len() as u64),
            human_size(max_bytes)
        )));
    }
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("entry"),
        std::process::id()
    ));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })?;
    evict_oldest(dir, max_bytes, path)
}

/// Remove the least recently written entries (never `keep`) until the
/// entries total at most `max_bytes`.
fn evict_oldest(dir: &Path, max_bytes: u64, keep: &Path) -> std::io::Result<()> {
    let mut entries: Vec<(std::time::SystemTime, u64, PathBuf)> = std::fs::read_dir(dir)?
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "cwasm"))
        .filter_map(|e| {
            let meta = e.metadata().ok()?;
            Some((meta.modified().ok()?, meta.len(), e.path()))
        })
        .collect();
    let mut total: u64 = entries.iter().map(|(_, len, _)| len).sum();
    entries.sort();
    for (_, len, path) in entries {
        if total <= max_bytes {
            break;
        }
        if path != keep && std::fs::remove_file(&path).is_ok() {
            total = total.saturating_sub(len);
        }
    }
    Ok(())
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
