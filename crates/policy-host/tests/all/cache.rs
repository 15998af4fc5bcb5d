//! The compiled-code cache: a second load reads the entry back, and a
//! corrupt entry falls back to compiling instead of failing.

use nyann_policy_host::{HostConfig, PolicyHost};

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

    let first = host.load_builtin().unwrap();
    let entries = cwasm_files(&dir);
    assert_eq!(entries.len(), 1, "{entries:?}");

    let second = host.load_builtin().unwrap();
    assert_eq!(first.info(), second.info());

    std::fs::write(&entries[0], b"not compiled code").unwrap();
    let third = host.load_builtin().unwrap();
    assert_eq!(third.info(), first.info());
    assert!(
        std::fs::metadata(&entries[0]).unwrap().len() > 1000,
        "the entry is rewritten"
    );

    let _ = std::fs::remove_dir_all(&dir);
}
