//! Reading a scenario file's text: a regular file only, never more than
//! [`MAX_SOURCE_BYTES`] (counted while reading, so that a file whose
//! metadata says nothing about its length cannot be read forever), and
//! UTF-8 with the place of the first byte that is not.

use std::fs::{File, Metadata};
use std::io::Read;
use std::path::Path;

use crate::compile::MAX_SOURCE_BYTES;
use crate::error::{Diagnostic, ScenarioError};

/// The text of the scenario file at `path` (`name` in messages).
pub(crate) fn read(path: &Path, name: &str) -> Result<String, ScenarioError> {
    // `metadata` follows symlinks without opening anything: a FIFO is refused
    // here, before an open that would wait for a writer.
    if let Ok(metadata) = std::fs::metadata(path)
        && !metadata.is_file()
    {
        return Err(ScenarioError::NotAFile {
            path: name.to_owned(),
            kind: describe(path, &metadata),
        });
    }
    if !matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("star" | "json")
    ) {
        return Err(ScenarioError::UnsupportedExtension {
            path: name.to_owned(),
        });
    }
    let read_error = |error| ScenarioError::Read {
        path: name.to_owned(),
        error,
    };
    let file = File::open(path).map_err(read_error)?;
    let too_large = |size: String| {
        ScenarioError::Invalid(vec![Diagnostic::unlocated(
            name,
            format!("the scenario file is {size} bytes; the limit is {MAX_SOURCE_BYTES} bytes"),
        )])
    };
    let size = file.metadata().map_err(read_error)?.len();
    if size > MAX_SOURCE_BYTES as u64 {
        return Err(too_large(size.to_string()));
    }
    let mut bytes = Vec::with_capacity(size as usize);
    file.take(MAX_SOURCE_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(read_error)?;
    if bytes.len() > MAX_SOURCE_BYTES {
        return Err(too_large(format!("more than {MAX_SOURCE_BYTES}")));
    }
    String::from_utf8(bytes).map_err(|e| not_utf8(name, e.as_bytes(), e.utf8_error()))
}

/// What a path that is not a regular file is, for the error message.
fn describe(path: &Path, metadata: &Metadata) -> String {
    use std::os::unix::fs::FileTypeExt;
    let kind = metadata.file_type();
    let what = if kind.is_dir() {
        "a directory"
    } else if kind.is_fifo() {
        "a FIFO (named pipe)"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else if kind.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    };
    match std::fs::read_link(path) {
        Ok(target) => format!("{what} (a symlink to {})", target.display()),
        Err(_) => what.to_owned(),
    }
}

/// The first byte that is not UTF-8, with its line and column.
fn not_utf8(name: &str, bytes: &[u8], error: std::str::Utf8Error) -> ScenarioError {
    let at = error.valid_up_to();
    let before = &bytes[..at];
    let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
    let line_start = before
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |i| i + 1);
    let column = at - line_start + 1;
    let message = format!(
        "not UTF-8 text: 0x{:02x} at byte offset {at}; save the file as UTF-8",
        bytes[at]
    );
    ScenarioError::Invalid(vec![Diagnostic::located(
        name,
        u32::try_from(line).unwrap_or(u32::MAX),
        u32::try_from(column).unwrap_or(u32::MAX),
        message,
    )])
}
