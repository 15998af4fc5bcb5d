//! The compiled-code cache: a second load reads the entry back, a corrupt
//! entry falls back to compiling instead of failing, and the directory stays
//! within its bound.

use nyann_policy_host::{BUILTIN, BUILTIN_WASM, CodeSource, HostConfig, Policy, PolicyHost};

/// The built-in as any component (`load_builtin` takes its shipped code).
fn builtin(host: &PolicyHost) -> Policy {
    host.load_bytes(BUILTIN, BUILTIN_WASM).unwrap()
}

fn cwasm_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|e| e == "cwasm"))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn compiled_code_is_cached_and_corrupt_entries_are_recompiled() {
    let dir = std::env::temp_dir().join(format!("nyann-policy-cache-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let host = PolicyHost::new(HostConfig {
        cache_dir: Some(dir.clone()),
        ..HostConfig::default()
    })
    .unwrap();

    let first = builtin(&host);
    assert_eq!(first.code_source(), CodeSource::Compiled);
    let entries = cwasm_files(&dir);
    assert_eq!(entries.len(), 1, "{entries:?}");

    let second = builtin(&host);
    assert_eq!(second.code_source(), CodeSource::Cached);
    assert_eq!(first.info(), second.info());

    std::fs::write(&entries[0], b"not compiled code").unwrap();
    let third = builtin(&host);
    assert_eq!(third.code_source(), CodeSource::Compiled);
    assert_eq!(third.info(), first.info());
    assert!(
        std::fs::metadata(&entries[0]).unwrap().len() > 1000,
        "the entry is rewritten"
    );

    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_cache_stays_within_its_bound() {
    let dir = std::env::temp_dir().join(format!("nyann-policy-cache-bound-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let files = [
        crate::common::guest_wasm("legacy-v01-policy"),
        crate::common::guest_wasm("hostile-policy"),
    ];
    // Measure the entries, then allow two of the largest: three cannot fit.
    let measure = PolicyHost::new(HostConfig {
        cache_dir: Some(dir.clone()),
        ..HostConfig::default()
    })
    .unwrap();
    builtin(&measure);
    for file in &files {
        measure.load_file(file).unwrap();
    }
    let sizes: Vec<u64> = cwasm_files(&dir)
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .collect();
    assert_eq!(sizes.len(), 3);
    let bound = 2 * sizes.iter().max().unwrap() + 1;
    assert!(sizes.iter().sum::<u64>() > bound);
    std::fs::remove_dir_all(&dir).unwrap();

    let host = PolicyHost::new(HostConfig {
        cache_dir: Some(dir.clone()),
        cache_max_bytes: bound,
        ..HostConfig::default()
    })
    .unwrap();
    builtin(&host);
    for file in &files {
        host.load_file(file).unwrap();
    }
    let kept = cwasm_files(&dir);
    let total: u64 = kept
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum();
    assert!(
        kept.len() < 3 && total <= bound,
        "{kept:?}: {total} > {bound}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Where the binary ships the built-in's code, loading it neither compiles
/// nor writes the cache.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[test]
fn the_shipped_builtin_leaves_the_cache_alone() {
    let dir =
        std::env::temp_dir().join(format!("nyann-policy-cache-shipped-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let host = PolicyHost::new(HostConfig {
        cache_dir: Some(dir.clone()),
        ..HostConfig::default()
    })
    .unwrap();
    let policy = host.load_builtin().unwrap();
    assert_eq!(policy.code_source(), CodeSource::Precompiled);
    assert!(cwasm_files(&dir).is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}
