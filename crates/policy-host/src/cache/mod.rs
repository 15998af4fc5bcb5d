//! Compiling a component, bounded in time, and a cache of compiled code on
//! disk, bounded in size, so that starting nyann-bench does not pay
//! Cranelift's compile time (~0.3 s for the built-in, 20 s for a Python
//! policy) on every run.
//!
//! What it trusts, and why: wasmtime runs deserialized code as it is given
//! (`Component::deserialize` is `unsafe` for that reason), so an entry that
//! someone else wrote would run their machine code as the user, outside
//! every limit of the sandbox. An entry is therefore loaded only when this
//! program wrote it for exactly these component bytes and this engine: it
//! carries an HMAC-SHA256 over the component's digest, the engine's
//! compatibility hash and the code, keyed by a secret of the user's kept
//! outside the cache directory (`trust`), and the MAC is checked on the
//! bytes read before anything is deserialized. An entry is read only up to
//! a size bound derived from the component. One that fails any check is
//! deleted and the component compiled again, with one line saying so. The
//! cache directory and the key's directory must be the user's own and
//! writable by nobody else; otherwise the disk cache is not used (one line
//! says why and what to do) and every load compiles.
//!
//! Entries are named by the component's SHA-256 and the engine's hash,
//! written atomically (temporary file + rename); once the directory holds
//! more than its bound, the oldest entries go.

mod trust;

use std::hash::{Hash, Hasher};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use hmac::{Hmac, Mac};
use sha2::Sha256;
use wasmtime::Engine;
use wasmtime::component::Component;

use crate::CodeSource;
use crate::bounded::{self, Unfinished};
use crate::digest::ComponentDigest;
use crate::error::human_size;

pub use trust::default_key_file;

/// The first bytes of every entry: the format of what follows.
const MAGIC: &[u8; 8] = b"NYCWASM1";
/// The MAC after the magic, then the code.
const MAC_BYTES: usize = 32;
const HEADER_BYTES: usize = MAGIC.len() + MAC_BYTES;

/// The disk cache, opened: its directory checked, the user's key read.
pub(crate) struct DiskCache {
    dir: PathBuf,
    key: trust::Key,
    max_bytes: u64,
}

impl DiskCache {
    /// Open the cache in `dir` with the key in `key_file` (created on first
    /// use), or say why it cannot be used.
    pub(crate) fn open(
        dir: &Path,
        key_file: Option<&Path>,
        max_bytes: u64,
    ) -> Result<DiskCache, String> {
        let key_file = key_file.ok_or(
            "there is no place for its key (neither XDG_STATE_HOME nor HOME is set)".to_string(),
        )?;
        trust::own_directory(dir, "cache directory").map_err(|r| r.0)?;
        let key = trust::load_or_create_key(key_file, dir).map_err(|r| r.0)?;
        Ok(DiskCache {
            dir: dir.to_path_buf(),
            key,
            max_bytes,
        })
    }

    /// Where the code of the component with `digest` is kept for `engine`,
    /// and the engine's hash the entry's MAC covers.
    fn entry(&self, engine: &Engine, digest: &ComponentDigest) -> Entry {
        // SipHash with fixed keys: stable for a given build of the host, which
        // is all that matters (a different host build simply misses).
        let mut hasher = std::hash::DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut hasher);
        let engine_hash = hasher.finish();
        Entry {
            path: self
                .dir
                .join(format!("{}-{engine_hash:016x}.cwasm", digest.hex())),
            engine_hash,
            digest: *digest,
        }
    }

    /// The MAC of `code` as the entry of `entry`.
    fn mac(&self, entry: &Entry, code: &[u8]) -> Hmac<Sha256> {
        // A key of any length is accepted by HMAC.
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.key.0)
            .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
        mac.update(b"nyann-bench policy code v1\0");
        mac.update(entry.digest.as_bytes());
        mac.update(&entry.engine_hash.to_le_bytes());
        mac.update(code);
        mac
    }

    /// The largest entry the compiled code of a component of
    /// `component_bytes` can make: compiled code is a few times the size
    /// of its source (the built-in: 3.9x; a Python policy: 2.3x), and an
    /// entry over half the cache's bound is never written.
    fn bound(&self, component_bytes: usize) -> u64 {
        let derived = (component_bytes as u64)
            .saturating_mul(8)
            .saturating_add(8 << 20);
        derived.min(self.max_bytes / 2)
    }

    /// The entry's code, when it is present and passes every check.
    /// `Ok(None)` is a miss; `Err` says what is wrong with the entry.
    fn read(
        &self,
        engine: &Engine,
        entry: &Entry,
        component_bytes: usize,
    ) -> Result<Option<Component>, String> {
        let meta = match std::fs::symlink_metadata(&entry.path) {
            Ok(meta) => meta,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("cannot be read ({e})")),
        };
        if !meta.file_type().is_file() {
            return Err("is not a regular file".into());
        }
        let bound = self.bound(component_bytes) + HEADER_BYTES as u64;
        let too_large = |size: u64| {
            format!(
                "is {}, more than the code of this {} component can be ({} at most)",
                human_size(size),
                human_size(component_bytes as u64),
                human_size(bound)
            )
        };
        if meta.len() > bound {
            return Err(too_large(meta.len()));
        }
        // Into memory rather than `deserialize_file`'s mmap: a file
        // truncated in place while mapped would crash the process (SIGBUS),
        // and the MAC is checked on exactly the bytes then loaded.
        let mut bytes = Vec::with_capacity(meta.len() as usize);
        std::fs::File::open(&entry.path)
            .and_then(|f| f.take(bound + 1).read_to_end(&mut bytes))
            .map_err(|e| format!("cannot be read ({e})"))?;
        if bytes.len() as u64 > bound {
            return Err(too_large(bytes.len() as u64));
        }
        if bytes.len() < HEADER_BYTES || &bytes[..MAGIC.len()] != MAGIC {
            return Err("is not in this program's cache format".into());
        }
        let (mac, code) = bytes[MAGIC.len()..].split_at(MAC_BYTES);
        self.mac(entry, code).verify_slice(mac).map_err(|_| {
            "fails its check: it is not code this program compiled for this component with \
             your key"
                .to_string()
        })?;
        // SAFETY: `code` is, byte for byte, what this program serialized
        // for this component and engine: its MAC, keyed by the user's
        // secret that only this program reads, was checked just above on
        // these very bytes. wasmtime also checks its header and the engine
        // settings.
        #[allow(unsafe_code)]
        let component = unsafe { Component::deserialize(engine, code) };
        component
            .map(Some)
            .map_err(|e| format!("is not usable code ({e:#})"))
    }

    /// Write `component`'s code as `entry`, then evict the oldest entries
    /// past the bound.
    fn store(
        &self,
        component: &Component,
        entry: &Entry,
        component_bytes: usize,
    ) -> std::io::Result<()> {
        let code = component
            .serialize()
            .map_err(|e| std::io::Error::other(format!("{e:#}")))?;
        let bound = self.bound(component_bytes);
        if code.len() as u64 > bound {
            return Err(std::io::Error::other(format!(
                "the compiled code ({}) is over the entry bound ({}: at most half the cache's {})",
                human_size(code.len() as u64),
                human_size(bound),
                human_size(self.max_bytes)
            )));
        }
        let mac = self.mac(entry, &code).finalize().into_bytes();
        let tmp = self.dir.join(format!(
            ".{}.{}.tmp",
            entry
                .path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("entry"),
            std::process::id()
        ));
        let _ = std::fs::remove_file(&tmp);
        let written = trust::private_file(&tmp).and_then(|mut file| {
            file.write_all(MAGIC)?;
            file.write_all(&mac)?;
            file.write_all(&code)
        });
        written
            .and_then(|()| std::fs::rename(&tmp, &entry.path))
            .inspect_err(|_| {
                let _ = std::fs::remove_file(&tmp);
            })?;
        evict_oldest(&self.dir, self.max_bytes, &entry.path)
    }
}

/// One entry of the cache.
struct Entry {
    path: PathBuf,
    engine_hash: u64,
    digest: ComponentDigest,
}

/// Compile `bytes` (whose digest is `digest`), or load its compiled code
/// from `cache` when an entry passes the checks. Cache problems never fail
/// the load: an entry that fails a check is deleted (one line says so), an
/// unwritable directory is logged at debug level, and the component is
/// compiled. The error is a message for `cannot load policy <origin>: ...`.
pub(crate) fn load_or_compile(
    engine: &Engine,
    cache: Option<&DiskCache>,
    compile_timeout: Duration,
    bytes: &[u8],
    digest: &ComponentDigest,
    code_bytes: u64,
) -> Result<(Component, CodeSource), String> {
    let Some(cache) = cache else {
        let component = compile(engine, bytes, compile_timeout, code_bytes, false)?;
        return Ok((component, CodeSource::Compiled));
    };
    let entry = cache.entry(engine, digest);
    match cache.read(engine, &entry, bytes.len()) {
        Ok(Some(component)) => return Ok((component, CodeSource::Cached)),
        Ok(None) => {}
        Err(why) => {
            let _ = std::fs::remove_file(&entry.path);
            tracing::warn!(
                "the policy code cache entry {} {why}: deleted; compiling the policy again",
                entry.path.display()
            );
        }
    }
    let component = compile(engine, bytes, compile_timeout, code_bytes, true)?;
    if let Err(err) = cache.store(&component, &entry, bytes.len()) {
        tracing::debug!(
            "cannot write policy code cache entry {}: {err}",
            entry.path.display()
        );
    }
    Ok((component, CodeSource::Compiled))
}

/// Compiles expected to take at least this long say so before they start;
/// others say so if they take longer.
const SLOW_COMPILE: Duration = Duration::from_secs(2);

/// Bytes of WebAssembly code Cranelift compiles per second on one core
/// (measured with wasmtime 48 on the CI machine: CPython's 6.3 MiB in
/// componentize-py's component took 19.7 s, StarlingMonkey's 8.8 MiB 21.9 s,
/// QuickJS's 1.1 MiB 3.2 s): the estimate said before a long compile.
const CODE_BYTES_PER_CORE_SECOND: u64 = 360_000;

/// About how long compiling `code_bytes` of code takes here, with
/// wasmtime's parallel compilation on every core.
pub(crate) fn compile_estimate(code_bytes: u64) -> Duration {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
    // Two cores do not halve it: the largest functions and the linking
    // that follows run on one.
    let rate = CODE_BYTES_PER_CORE_SECOND * (1 + cores) / 2;
    Duration::from_secs_f64(code_bytes as f64 / rate as f64)
}

/// Compile on a worker thread, abandoned past `timeout`. A compile
/// expected to be long says so first, with the estimate; `cached`: its code
/// goes to the disk cache (later loads skip it).
fn compile(
    engine: &Engine,
    bytes: &[u8],
    timeout: Duration,
    code_bytes: u64,
    cached: bool,
) -> Result<Component, String> {
    let (engine, size) = (engine.clone(), bytes.len() as u64);
    let bytes = bytes.to_vec();
    let once = if cached {
        "once: later loads read the compiled code from the cache"
    } else {
        "the code cache is off: every load compiles"
    };
    let estimate = compile_estimate(code_bytes);
    let slow = estimate >= SLOW_COMPILE;
    if slow {
        tracing::info!(
            "compiling the policy ({}) ({once}, about {} s)",
            human_size(size),
            estimate.as_secs_f64().ceil()
        );
    }
    let notice = move || {
        if !slow {
            tracing::info!(
                "compiling the policy ({}) is taking more than {} s ({once})",
                human_size(size),
                SLOW_COMPILE.as_secs()
            );
        }
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
