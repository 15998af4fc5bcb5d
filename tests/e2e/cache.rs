//! The compiled-code cache tried as an attacker would, through the binary
//! (what used to happen was a crash, which must not take the tests down):
//! machine code written into a cache entry is never run, however the entry
//! was changed; the entry is deleted and the policy compiled again.

use std::ops::Range;
use std::path::{Path, PathBuf};

use crate::support::{nyann_bench, policy_wasm};

/// `policy check FILE` with the cache and its key in `home`.
async fn policy_check(home: &Path, wasm: &Path) -> (Option<i32>, String) {
    let out = nyann_bench()
        .args(["policy", "check"])
        .arg(wasm)
        .env("NYANN_BENCH_CACHE_DIR", home.join("cache"))
        .env("XDG_STATE_HOME", home.join("state"))
        .env_remove("NYANN_BENCH_POLICY_CACHE")
        .output()
        .await
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

fn entries(home: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(home.join("cache").join("policies"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "cwasm"))
        .collect()
}

/// The byte range of the ELF section `name` in `bytes` (an entry holds
/// wasmtime's ELF image, after whatever header the cache puts first).
fn elf_section(bytes: &[u8], name: &str) -> Range<usize> {
    let start = bytes
        .windows(4)
        .position(|w| w == b"\x7fELF")
        .expect("an ELF image");
    let elf = &bytes[start..];
    let u16_at = |at: usize| u16::from_le_bytes([elf[at], elf[at + 1]]) as usize;
    let u32_at = |at: usize| u32::from_le_bytes(elf[at..at + 4].try_into().unwrap()) as usize;
    let u64_at = |at: usize| u64::from_le_bytes(elf[at..at + 8].try_into().unwrap()) as usize;
    let (table, entry_size, count, names) =
        (u64_at(0x28), u16_at(0x3a), u16_at(0x3c), u16_at(0x3e));
    let header = |i: usize| table + i * entry_size;
    let names_at = u64_at(header(names) + 24);
    (0..count)
        .map(header)
        .find(|&h| {
            let at = names_at + u32_at(h);
            let end = at + elf[at..].iter().position(|&b| b == 0).unwrap();
            &elf[at..end] == name.as_bytes()
        })
        .map(|h| start + u64_at(h + 24)..start + u64_at(h + 24) + u64_at(h + 32))
        .unwrap_or_else(|| panic!("no section {name}"))
}

/// x86-64: `mov edi, 42; mov eax, 231 (exit_group); syscall`.
const EXIT_42: [u8; 12] = [
    0xbf, 0x2a, 0x00, 0x00, 0x00, 0xb8, 0xe7, 0x00, 0x00, 0x00, 0x0f, 0x05,
];

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn machine_code_written_into_a_cache_entry_is_never_run() {
    let home = tempfile::tempdir().unwrap();
    let wasm = policy_wasm("legacy-v01-policy");
    let (code, out) = policy_check(home.path(), &wasm).await;
    assert_eq!(code, Some(0), "{out}");
    let entry = entries(home.path()).pop().expect("the code is cached");
    let good = std::fs::read(&entry).unwrap();
    let text = elf_section(&good, ".text");
    let info = elf_section(&good, ".wasmtime.info");

    // Each was run as it was given before the entries carried a MAC: the
    // attacker's exit(42); SIGTRAP (133); a panic inside wasmtime (101).
    let mut sled = good.clone();
    sled[text.clone()].fill(0x90);
    let payload = text.end - EXIT_42.len()..text.end;
    sled[payload].copy_from_slice(&EXIT_42);
    let mut traps = good.clone();
    traps[text].fill(0xcc);
    let mut no_info = good.clone();
    no_info[info].fill(0);
    for (case, bytes) in [
        ("a NOP sled into exit(42)", sled),
        ("int3 over the code", traps),
        (".wasmtime.info zeroed", no_info),
    ] {
        std::fs::write(&entry, bytes).unwrap();
        let (code, out) = policy_check(home.path(), &wasm).await;
        assert_eq!(code, Some(0), "{case}: {out}");
        assert!(out.contains("check passed"), "{case}: {out}");
        assert!(
            out.contains(&format!(
                "the policy code cache entry {} fails its check",
                entry.display()
            )) && out.contains("deleted; compiling the policy again"),
            "{case}: {out}"
        );
        assert_eq!(std::fs::read(&entry).unwrap(), good, "{case}: rewritten");
    }

    // The next run reads its own entry back, with nothing to say.
    let (code, out) = policy_check(home.path(), &wasm).await;
    assert_eq!(code, Some(0), "{out}");
    assert!(!out.contains("policy code cache"), "{out}");
}

/// `--policy-cache off` (or its variable) writes nothing to disk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_disk_cache_can_be_turned_off() {
    let home = tempfile::tempdir().unwrap();
    let wasm = policy_wasm("legacy-v01-policy");
    let out = nyann_bench()
        .args(["policy", "check", "--policy-cache", "off"])
        .arg(&wasm)
        .env("NYANN_BENCH_CACHE_DIR", home.path().join("cache"))
        .env("XDG_STATE_HOME", home.path().join("state"))
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let out = nyann_bench()
        .args(["policy", "describe"])
        .arg(&wasm)
        .env("NYANN_BENCH_POLICY_CACHE", "off")
        .env("NYANN_BENCH_CACHE_DIR", home.path().join("cache"))
        .env("XDG_STATE_HOME", home.path().join("state"))
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(!home.path().join("cache").exists());
    assert!(!home.path().join("state").exists());
}
