//! The compiled-code cache: a second load reads the entry back; an entry
//! this program did not write for exactly these component bytes (another
//! component's code, corrupt bytes, an oversized file, another key) is
//! deleted and recompiled with one line saying so; a directory or key that
//! others can change is not used; the directory stays within its bound.
//! (Entries whose machine code was tampered with are tried by the binary:
//! `tests/e2e/cache.rs`, as a crash there must not take these tests down.)

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use nyann_policy_host::{BUILTIN, BUILTIN_WASM, CodeSource, HostConfig, Policy, PolicyHost};
use tempfile::TempDir;

/// A cache directory and a key file of the test's own.
struct Cache {
    _tmp: TempDir,
    dir: PathBuf,
    key: PathBuf,
}

impl Cache {
    fn new() -> Cache {
        let tmp = tempfile::tempdir().unwrap();
        let (dir, key) = (
            tmp.path().join("cache"),
            tmp.path().join("state").join("cache-key"),
        );
        Cache {
            _tmp: tmp,
            dir,
            key,
        }
    }

    fn host(&self) -> PolicyHost {
        self.host_with(HostConfig::default())
    }

    fn host_with(&self, config: HostConfig) -> PolicyHost {
        PolicyHost::new(HostConfig {
            cache_dir: Some(self.dir.clone()),
            cache_key_file: Some(self.key.clone()),
            ..config
        })
        .unwrap()
    }

    fn entries(&self) -> Vec<PathBuf> {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(&self.dir)
            .map(|d| {
                d.flatten()
                    .map(|e| e.path())
                    .filter(|p| p.extension().is_some_and(|e| e == "cwasm"))
                    .collect()
            })
            .unwrap_or_default();
        entries.sort();
        entries
    }

    /// The one entry of the component `bytes`.
    fn entry_of(&self, bytes: &[u8]) -> PathBuf {
        let hex = nyann_policy_host::ComponentDigest::of(bytes).hex();
        let found: Vec<PathBuf> = self
            .entries()
            .into_iter()
            .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with(&hex))
            .collect();
        assert_eq!(found.len(), 1, "{found:?}");
        found[0].clone()
    }
}

/// The built-in as any component (`load_builtin` takes its shipped code).
fn builtin(host: &PolicyHost) -> Policy {
    host.load_bytes(BUILTIN, BUILTIN_WASM).unwrap()
}

/// What `f` logged at warn level or above, and its result.
fn warnings<R>(f: impl FnOnce() -> R) -> (String, R) {
    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Buffer {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let buffer = Buffer::default();
    let writer = buffer.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let result = tracing::subscriber::with_default(subscriber, f);
    let text = String::from_utf8_lossy(&buffer.0.lock().unwrap()).into_owned();
    (text, result)
}

#[cfg(unix)]
fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[cfg(unix)]
fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

#[test]
fn compiled_code_is_cached_under_a_private_key_and_read_back() {
    let cache = Cache::new();
    let host = cache.host();
    let first = builtin(&host);
    assert_eq!(first.code_source(), CodeSource::Compiled);
    assert_eq!(cache.entries().len(), 1);
    let second = builtin(&host);
    assert_eq!(second.code_source(), CodeSource::Cached);
    assert_eq!(first.info(), second.info());
    assert_eq!(first.digest(), second.digest());
    // A second process (a new host) reads the same key and the same entry.
    assert_eq!(builtin(&cache.host()).code_source(), CodeSource::Cached);
    #[cfg(unix)]
    {
        assert_eq!(mode(&cache.key), 0o600, "the key is the user's alone");
        assert_eq!(mode(&cache.dir), 0o700);
        assert_eq!(mode(&cache.entries()[0]), 0o600);
    }
}

/// One component's entry copied under another's name used to load and
/// judge as the first (a sweep stopped on a rule of a policy it was not
/// given). The MAC covers the component's digest: the entry is refused.
#[test]
fn another_components_code_under_this_ones_name_is_not_loaded() {
    let cache = Cache::new();
    let host = cache.host();
    let other_path = crate::common::guest_wasm("legacy-v01-policy");
    let other_bytes = std::fs::read(&other_path).unwrap();
    let other = host.load_file(&other_path).unwrap();
    let builtin_info = builtin(&host).info().clone();
    assert_ne!(other.info().name, builtin_info.name);

    std::fs::copy(cache.entry_of(&other_bytes), cache.entry_of(BUILTIN_WASM)).unwrap();
    let (log, swapped) = warnings(|| builtin(&cache.host()));
    assert_eq!(swapped.info(), &builtin_info, "it runs its own code");
    assert_eq!(swapped.code_source(), CodeSource::Compiled);
    assert!(
        log.contains("fails its check") && log.contains("deleted; compiling the policy again"),
        "{log}"
    );
    // The entry was rewritten with the right code.
    assert_eq!(builtin(&cache.host()).code_source(), CodeSource::Cached);
}

/// Entries corrupted behind an intact header used to crash the process
/// (SIGTRAP, SIGSEGV, a panic inside wasmtime) on every later run. Each
/// is now deleted and recompiled.
#[test]
fn a_corrupt_entry_is_deleted_and_recompiled() {
    let cache = Cache::new();
    let expected = builtin(&cache.host()).info().clone();
    let entry = cache.entry_of(BUILTIN_WASM);
    let good = std::fs::read(&entry).unwrap();

    let mut flipped = good.clone();
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..200 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let at = 64 + (seed as usize) % (good.len() - 64);
        flipped[at] ^= 1 << (seed % 8);
    }
    let mut zeroed_tail = good.clone();
    let half = good.len() / 2;
    zeroed_tail[half..].fill(0);
    let cases: [(&str, Vec<u8>); 4] = [
        ("200 bytes flipped", flipped),
        ("the second half zeroed", zeroed_tail),
        ("truncated", good[..good.len() / 3].to_vec()),
        ("not compiled code", b"not compiled code".to_vec()),
    ];
    for (case, bytes) in cases {
        std::fs::write(&entry, &bytes).unwrap();
        let (log, policy) = warnings(|| builtin(&cache.host()));
        assert_eq!(policy.code_source(), CodeSource::Compiled, "{case}");
        assert_eq!(policy.info(), &expected, "{case}");
        assert!(
            log.contains("deleted; compiling the policy again"),
            "{case}: {log}"
        );
        assert_eq!(std::fs::read(&entry).unwrap(), good, "{case}: rewritten");
    }
}

/// A 2 GiB (sparse) file under an entry's name used to be read whole
/// before any check (13 s, 4.2 GB peak). An entry is read only up to what
/// the component's code can be.
#[test]
fn an_oversized_entry_is_refused_before_it_is_read() {
    let cache = Cache::new();
    builtin(&cache.host());
    let entry = cache.entry_of(BUILTIN_WASM);
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&entry)
        .unwrap();
    file.set_len(2 << 30).unwrap();
    drop(file);
    let (log, policy) = warnings(|| builtin(&cache.host()));
    assert_eq!(policy.code_source(), CodeSource::Compiled);
    assert!(
        log.contains("is 2048 MiB, more than the code of this") && log.contains("deleted"),
        "{log}"
    );
    assert!(std::fs::metadata(&entry).unwrap().len() < 10 << 20);
}

/// An entry made with another key (another user's, or the key replaced)
/// is not this program's for this user.
#[test]
fn an_entry_made_under_another_key_is_refused() {
    let cache = Cache::new();
    builtin(&cache.host());
    std::fs::remove_file(&cache.key).unwrap();
    let (log, policy) = warnings(|| builtin(&cache.host()));
    assert_eq!(policy.code_source(), CodeSource::Compiled);
    assert!(log.contains("fails its check"), "{log}");
}

/// A cache directory others can write is not used, nor a key others can
/// read, nor a key kept inside the cache directory: each is said once,
/// naming the fix, and every load compiles.
#[cfg(unix)]
#[test]
fn a_cache_others_can_change_is_not_used() {
    // The directory, writable by all.
    let cache = Cache::new();
    std::fs::create_dir_all(&cache.dir).unwrap();
    set_mode(&cache.dir, 0o777);
    let host = cache.host();
    let (log, first) = warnings(|| builtin(&host));
    let (again, second) = warnings(|| builtin(&host));
    assert_eq!(first.code_source(), CodeSource::Compiled);
    assert_eq!(second.code_source(), CodeSource::Compiled);
    assert!(cache.entries().is_empty(), "nothing is written there");
    assert!(
        log.contains("writable by others (mode 0777)")
            && log.contains(&format!("chmod go-w {}", cache.dir.display())),
        "{log}"
    );
    assert!(again.is_empty(), "said once per host: {again}");

    // The directory fixed, the key readable by others.
    set_mode(&cache.dir, 0o755);
    builtin(&cache.host());
    assert_eq!(cache.entries().len(), 1);
    set_mode(&cache.key, 0o644);
    let (log, policy) = warnings(|| builtin(&cache.host()));
    assert_eq!(policy.code_source(), CodeSource::Compiled);
    assert!(
        log.contains("readable or writable by others (mode 0644)")
            && log.contains(&format!("chmod 600 {}", cache.key.display())),
        "{log}"
    );

    // The key inside the cache directory.
    let inside = Cache::new();
    let host = PolicyHost::new(HostConfig {
        cache_dir: Some(inside.dir.clone()),
        cache_key_file: Some(inside.dir.join("keys").join("cache-key")),
        ..HostConfig::default()
    })
    .unwrap();
    let (log, policy) = warnings(|| builtin(&host));
    assert_eq!(policy.code_source(), CodeSource::Compiled);
    assert!(log.contains("inside the cache directory"), "{log}");
    assert!(inside.entries().is_empty());
}

/// A directory of another user's is refused (needs root to make one).
#[cfg(unix)]
#[test]
fn a_cache_directory_of_another_user_is_not_used() {
    if effective_uid() != 0 {
        eprintln!("skipped: making a directory of another user's needs root");
        return;
    }
    let cache = Cache::new();
    std::fs::create_dir_all(&cache.dir).unwrap();
    std::os::unix::fs::chown(&cache.dir, Some(65534), Some(65534)).unwrap();
    let (log, policy) = warnings(|| builtin(&cache.host()));
    assert_eq!(policy.code_source(), CodeSource::Compiled);
    assert!(log.contains("belongs to user 65534"), "{log}");
}

#[cfg(unix)]
fn effective_uid() -> u32 {
    use std::os::unix::fs::MetadataExt;
    // The owner of a file this process just made is its effective user.
    let probe = tempfile::NamedTempFile::new().unwrap();
    probe.as_file().metadata().unwrap().uid()
}

#[test]
fn the_cache_stays_within_its_bound() {
    let files = [
        crate::common::guest_wasm("legacy-v01-policy"),
        crate::common::guest_wasm("hostile-policy"),
    ];
    // Measure the entries, then allow two of the largest: three cannot fit.
    let measure = Cache::new();
    let host = measure.host();
    builtin(&host);
    for file in &files {
        host.load_file(file).unwrap();
    }
    let sizes: Vec<u64> = measure
        .entries()
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .collect();
    assert_eq!(sizes.len(), 3);
    let bound = 2 * sizes.iter().max().unwrap() + 1;
    assert!(sizes.iter().sum::<u64>() > bound);

    let cache = Cache::new();
    let host = cache.host_with(HostConfig {
        cache_max_bytes: bound,
        ..HostConfig::default()
    });
    builtin(&host);
    for file in &files {
        host.load_file(file).unwrap();
    }
    let kept = cache.entries();
    let total: u64 = kept
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum();
    assert!(
        kept.len() < 3 && total <= bound,
        "{kept:?}: {total} > {bound}"
    );
}

/// Where the binary ships the built-in's code, loading it neither compiles
/// nor touches the cache.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[test]
fn the_shipped_builtin_leaves_the_cache_alone() {
    let cache = Cache::new();
    let policy = cache.host().load_builtin().unwrap();
    assert_eq!(policy.code_source(), CodeSource::Precompiled);
    assert!(!cache.dir.exists() && !cache.key.exists());
}
