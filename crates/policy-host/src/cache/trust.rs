//! What makes an entry of the code cache trustworthy: a secret of the
//! user's that only this program reads, kept outside the cache directory,
//! and directories that nobody else can write (as ssh asks of `~/.ssh`).
//!
//! The secret keys the MAC each entry carries (`super::entry`): whoever
//! can write the cache directory but cannot read the secret can delete
//! entries, never make one this program will load.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// Bytes of the secret.
pub(super) const KEY_BYTES: usize = 32;

/// The user's secret that keys the cache's MACs.
pub(super) struct Key(pub(super) [u8; KEY_BYTES]);

/// Why the disk cache cannot be used: a sentence for the log, saying what
/// to do.
#[derive(Debug)]
pub(super) struct Refused(pub(super) String);

/// The default place of the secret: `$XDG_STATE_HOME/nyann-bench/cache-key`,
/// else `$HOME/.local/state/nyann-bench/cache-key`; `None` when neither is
/// set.
pub fn default_key_file() -> Option<PathBuf> {
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    env("XDG_STATE_HOME")
        .or_else(|| env("HOME").map(|home| home.join(".local").join("state")))
        .map(|state| state.join("nyann-bench").join("cache-key"))
}

/// Make sure `dir` exists as a directory of the user's that nobody else can
/// write, creating it (mode 0700) if need be. `what` names it in messages.
pub(super) fn own_directory(dir: &Path, what: &str) -> Result<(), Refused> {
    create_private_dir(dir)
        .map_err(|e| Refused(format!("cannot create the {what} {}: {e}", dir.display())))?;
    let meta = std::fs::metadata(dir)
        .map_err(|e| Refused(format!("cannot read the {what} {}: {e}", dir.display())))?;
    if !meta.is_dir() {
        return Err(Refused(format!(
            "the {what} {} is not a directory",
            dir.display()
        )));
    }
    check_owner_and_mode(&meta, dir, what, 0o022, "go-w")
}

/// The secret in `file`, created (random, mode 0600) on first use. The file
/// must be the user's, readable by nobody else, outside `cache_dir`, in a
/// directory nobody else can write.
pub(super) fn load_or_create_key(file: &Path, cache_dir: &Path) -> Result<Key, Refused> {
    let parent = file
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .ok_or_else(|| Refused(format!("the cache key {} has no directory", file.display())))?;
    own_directory(parent, "directory of the cache key")?;
    // Both exist now: compare where they really are.
    let (real_parent, real_cache) = (canonical(parent)?, canonical(cache_dir)?);
    if real_parent.starts_with(&real_cache) {
        return Err(Refused(format!(
            "its key {} is inside the cache directory {}, which would let whoever writes \
             entries read it: keep the key in your state directory (XDG_STATE_HOME) and the \
             cache elsewhere",
            file.display(),
            cache_dir.display()
        )));
    }
    match std::fs::symlink_metadata(file) {
        Ok(meta) => read_key(file, &meta),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => create_key(file, parent),
        Err(e) => Err(Refused(format!(
            "cannot read the cache key {}: {e}",
            file.display()
        ))),
    }
}

fn canonical(path: &Path) -> Result<PathBuf, Refused> {
    path.canonicalize()
        .map_err(|e| Refused(format!("cannot resolve {}: {e}", path.display())))
}

fn read_key(file: &Path, meta: &std::fs::Metadata) -> Result<Key, Refused> {
    if !meta.file_type().is_file() {
        return Err(Refused(format!(
            "the cache key {} is not a regular file: remove it (a new key is made)",
            file.display()
        )));
    }
    check_owner_and_mode(meta, file, "cache key", 0o077, "600")?;
    let mut key = [0u8; KEY_BYTES];
    let mut rest = Vec::new();
    std::fs::File::open(file)
        .and_then(|f| {
            let mut f = f.take(KEY_BYTES as u64 + 1);
            f.read_exact(&mut key)?;
            f.read_to_end(&mut rest)
        })
        .map_err(|e| {
            Refused(format!(
                "cannot read the cache key {}: {e}; remove it (a new key is made)",
                file.display()
            ))
        })?;
    if !rest.is_empty() {
        return Err(Refused(format!(
            "the cache key {} is longer than a key: remove it (a new key is made)",
            file.display()
        )));
    }
    Ok(Key(key))
}

/// Write a new random key next to `file` (mode 0600) and link it into
/// place; another process that won the race has its key read instead.
fn create_key(file: &Path, dir: &Path) -> Result<Key, Refused> {
    let refused = |e: std::io::Error| {
        Refused(format!(
            "cannot create the cache key {}: {e}",
            file.display()
        ))
    };
    let mut key = [0u8; KEY_BYTES];
    getrandom::fill(&mut key).map_err(|e| refused(std::io::Error::other(e.to_string())))?;
    let tmp = dir.join(format!(".cache-key.{}.tmp", std::process::id()));
    let written = private_file(&tmp)
        .and_then(|mut f| f.write_all(&key).and_then(|()| f.sync_all()))
        .and_then(|()| std::fs::hard_link(&tmp, file));
    let _ = std::fs::remove_file(&tmp);
    match written {
        Ok(()) => Ok(Key(key)),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let meta = std::fs::symlink_metadata(file).map_err(refused)?;
            read_key(file, &meta)
        }
        Err(e) => Err(refused(e)),
    }
}

/// A new file only the user can read and write.
pub(super) fn private_file(path: &Path) -> std::io::Result<std::fs::File> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options.open(path)
}

fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir)
}

/// Refuse `path` when it belongs to someone other than the user (or root),
/// or has any of the `forbidden` mode bits; `chmod` says how to fix it.
#[cfg(unix)]
fn check_owner_and_mode(
    meta: &std::fs::Metadata,
    path: &Path,
    what: &str,
    forbidden: u32,
    chmod: &str,
) -> Result<(), Refused> {
    use std::os::unix::fs::MetadataExt;
    let me = rustix::process::geteuid().as_raw();
    if meta.uid() != me && meta.uid() != 0 {
        return Err(Refused(format!(
            "the {what} {} belongs to user {}, not to you ({me}): whoever owns it could make \
             this program run their code as you; use a {what} of your own",
            path.display(),
            meta.uid()
        )));
    }
    let mode = meta.mode() & 0o7777;
    if mode & forbidden != 0 {
        let others = if forbidden & 0o044 != 0 {
            "readable or writable"
        } else {
            "writable"
        };
        return Err(Refused(format!(
            "the {what} {} is {others} by others (mode {mode:04o}): whoever can change it \
             could make this program run their code as you; `chmod {chmod} {}`, or use a \
             {what} of your own",
            path.display(),
            path.display()
        )));
    }
    Ok(())
}

#[cfg(not(unix))]
fn check_owner_and_mode(
    _: &std::fs::Metadata,
    _: &Path,
    _: &str,
    _: u32,
    _: &str,
) -> Result<(), Refused> {
    Ok(())
}
