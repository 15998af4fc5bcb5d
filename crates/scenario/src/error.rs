//! The error type of this crate: what went wrong, and where in the scenario file.

use std::fmt;

/// One problem found in a scenario file, with its position when known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    /// The file as the user named it (or the name given to `compile_str`).
    pub file: String,
    /// 1-based line of the offending call, when the problem has one.
    pub line: Option<u32>,
    /// 1-based column of the offending call, when the problem has one.
    pub column: Option<u32>,
    /// What is wrong and what is expected.
    pub message: String,
}

impl Diagnostic {
    pub(crate) fn located(file: &str, line: u32, column: u32, message: impl Into<String>) -> Self {
        Diagnostic {
            file: file.to_owned(),
            line: Some(line),
            column: Some(column),
            message: message.into(),
        }
    }

    pub(crate) fn unlocated(file: &str, message: impl Into<String>) -> Self {
        Diagnostic {
            file: file.to_owned(),
            line: None,
            column: None,
            message: message.into(),
        }
    }
}

impl fmt::Display for Diagnostic {
    /// `file:line:col: message`, or `file: message` when there is no position.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.line, self.column) {
            (Some(line), Some(column)) => {
                write!(f, "{}:{}:{}: {}", self.file, line, column, self.message)
            }
            (Some(line), None) => write!(f, "{}:{}: {}", self.file, line, self.message),
            _ => write!(f, "{}: {}", self.file, self.message),
        }
    }
}

/// Why a scenario could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    /// The file could not be read. (The OS error is part of the message
    /// and not a `source`, so that a printed error chain says it once.)
    #[error("{path}: cannot read the scenario file: {error}")]
    Read { path: String, error: std::io::Error },
    /// The path is a directory, a FIFO, a device...: never opened or read.
    #[error(
        "{path}: is {kind}, not a scenario file; expected a Starlark file (.star) or a scenario IR file (.json)"
    )]
    NotAFile { path: String, kind: String },
    /// The file name ends in neither `.star` nor `.json`.
    #[error(
        "{path}: unsupported scenario file type; expected a Starlark file (.star) or a scenario IR file (.json)"
    )]
    UnsupportedExtension { path: String },
    /// The scenario itself is wrong: one or several located problems.
    #[error("{}", DisplayAll(.0))]
    Invalid(Vec<Diagnostic>),
}

impl ScenarioError {
    /// The individual problems (empty for I/O and file-type errors).
    pub fn diagnostics(&self) -> &[Diagnostic] {
        match self {
            ScenarioError::Invalid(all) => all,
            _ => &[],
        }
    }
}

/// One diagnostic per line.
struct DisplayAll<'a>(&'a [Diagnostic]);

impl fmt::Display for DisplayAll<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{d}")?;
        }
        Ok(())
    }
}
