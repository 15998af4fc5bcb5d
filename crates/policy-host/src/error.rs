//! The host's error type: what went wrong, with which policy, where.
//!
//! Messages follow one shape so that a user can act on them:
//! `policy <name>: <what happened> at stage <n>` for failed calls, and
//! `<file:line:col>: until_congested(...): <what>` for parameters.

use std::fmt;
use std::time::Duration;

use nyann_model::scenario::SourceLocation;

/// Anything the policy host reports.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// The component could not be loaded (not a component, wrong interface
    /// version, disallowed import, bad `describe`, ...).
    #[error("cannot load policy {origin}: {message}")]
    Load {
        /// `builtin` or the file path.
        origin: String,
        message: String,
    },

    /// The component is larger than [`crate::HostConfig::max_component_bytes`];
    /// nothing of it was compiled.
    #[error(
        "cannot load policy {origin}: it is {}, over the {} limit for policy components",
        human_size(*.size),
        human_size(*.limit)
    )]
    TooLarge {
        origin: String,
        size: u64,
        limit: u64,
    },

    /// The component's digest is not on the operator's allow list
    /// ([`crate::HostConfig::allowed`]); nothing of it was compiled or run.
    #[error("cannot load policy {origin}: its digest {digest} is not on this host's allow list")]
    NotAllowed { origin: String, digest: String },

    /// The component could not be fetched from where it was named (a
    /// registry): `error` says why, and the caller (which knows the
    /// fetcher's error type) may add what to do.
    #[error("{error}")]
    Fetch {
        origin: String,
        error: std::sync::Arc<dyn std::error::Error + Send + Sync + 'static>,
    },

    /// The parameters of an `until_congested(...)` call are wrong (checked
    /// against `describe`, or refused by `validate`).
    #[error("{}until_congested(...): {message} (policy {policy})", at_location(.location))]
    Params {
        policy: String,
        location: Option<SourceLocation>,
        message: String,
    },

    /// A call into the policy failed; the sweep decides whether to go on
    /// (fail-open) or stop.
    #[error("policy {policy}: {failure}{}", at_stage(*.stage))]
    Call {
        policy: String,
        /// `describe`, `validate` or `judge`.
        function: &'static str,
        /// The judged stage's index, for `judge`.
        stage: Option<u32>,
        failure: CallFailure,
    },

    /// The host itself could not be set up (engine, cache directory).
    #[error("policy host: {0}")]
    Host(String),
}

fn at_location(location: &Option<SourceLocation>) -> String {
    location
        .as_ref()
        .map(|l| format!("{l}: "))
        .unwrap_or_default()
}

fn at_stage(stage: Option<u32>) -> String {
    stage.map(|s| format!(" at stage {s}")).unwrap_or_default()
}

impl PolicyError {
    /// The failure of a call, if this is one.
    pub fn failure(&self) -> Option<&CallFailure> {
        match self {
            PolicyError::Call { failure, .. } => Some(failure),
            _ => None,
        }
    }
}

/// How a call into a policy failed.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum CallFailure {
    /// The guest trapped (a Rust panic is `unreachable` after printing its
    /// message to stderr, which is included).
    Crashed { trap: String, stderr: String },
    /// The call used up its fuel (instructions) budget.
    Fuel(u64),
    /// The call ran past its wall-clock limit and was stopped (or, if it
    /// was stuck outside the guest's code, abandoned) after `elapsed`.
    Deadline { limit: Duration, elapsed: Duration },
    /// The guest tried to grow its memories and tables past the cap (bytes).
    MemoryCap(usize),
    /// The guest tried to wait (sleep, or a clock subscription in the
    /// future) for this long.
    Blocked(Duration),
    /// The result or the log exceeded the host's bounds.
    OversizedOutput(String),
    /// The policy returned `err(message)`.
    Rejected(String),
    /// The policy called `exit` (WASI's `wasi:cli/exit`) with this status
    /// instead of returning.
    Exited(i32),
    /// The policy called a function of an interface its runtime imports but
    /// policies may not use (`wasi:sockets/tcp`, `wasi:http/outgoing-handler`):
    /// linked as a trap.
    Forbidden { interface: String, function: String },
    /// Something else failed inside wasmtime.
    Internal(String),
}

impl CallFailure {
    /// A stable one-word kind for records: `crashed`, `fuel`, `deadline`,
    /// `memory`, `blocked`, `output`, `rejected`, `exited`, `forbidden`,
    /// `internal`.
    pub fn kind(&self) -> &'static str {
        match self {
            CallFailure::Crashed { .. } => "crashed",
            CallFailure::Fuel(_) => "fuel",
            CallFailure::Deadline { .. } => "deadline",
            CallFailure::MemoryCap(_) => "memory",
            CallFailure::Blocked(_) => "blocked",
            CallFailure::OversizedOutput(_) => "output",
            CallFailure::Rejected(_) => "rejected",
            CallFailure::Exited(_) => "exited",
            CallFailure::Forbidden { .. } => "forbidden",
            CallFailure::Internal(_) => "internal",
        }
    }
}

impl fmt::Display for CallFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CallFailure::Crashed { trap, stderr } => {
                // Both carry the guest's words (its panic message, and
                // function names from its name section in a backtrace).
                if let Some(raised) = python_exception(stderr) {
                    return write!(f, "{raised}");
                }
                let stderr = one_line(stderr);
                let trap = printable(trap);
                if stderr.contains("expected a string, received") {
                    // StarlingMonkey, given a thrown non-string to return as `err`.
                    write!(
                        f,
                        "threw something other than a string ({stderr}): a JavaScript policy \
                         returns an error by throwing a string (the kit's SDK turns any \
                         throw into one)"
                    )
                } else if let Some(pos) = stderr.find("panicked at") {
                    write!(f, "panicked ({})", &stderr[pos..])
                } else if stderr.is_empty() {
                    write!(f, "crashed ({trap})")
                } else {
                    write!(f, "crashed ({trap}; stderr: {stderr})")
                }
            }
            CallFailure::Fuel(budget) => write!(
                f,
                "used up its fuel budget of {} instructions and was stopped",
                thousands(*budget)
            ),
            CallFailure::Deadline { limit, elapsed } => write!(
                f,
                "ran past its {} wall-clock limit and was stopped after {} (a backstop: its \
                 fuel was not used up, so the machine was overloaded or the call was stuck \
                 outside its code)",
                human_duration(*limit),
                human_duration(*elapsed)
            ),
            CallFailure::Blocked(wanted) => write!(
                f,
                "tried to wait {} (a sleep or a clock subscription) and was stopped: \
                 policies run on a virtual clock and may not block",
                human_duration(*wanted)
            ),
            CallFailure::MemoryCap(cap) => {
                write!(
                    f,
                    "hit its memory cap of {} and was stopped",
                    human_bytes(*cap)
                )
            }
            CallFailure::OversizedOutput(what) => {
                write!(f, "returned an oversized output ({what})")
            }
            CallFailure::Rejected(msg) => write!(f, "returned an error: {}", printable(msg)),
            CallFailure::Exited(status) => write!(
                f,
                "called exit (status {status}) instead of returning a result: a policy's \
                 functions must return (exit ends only the call)"
            ),
            CallFailure::Forbidden {
                interface,
                function,
            } => write!(
                f,
                "called {}, which policies may not use (`{}`: a policy gets no network; its \
                 runtime imports the interface, linked to fail when called)",
                printable(interface),
                printable(function)
            ),
            CallFailure::Internal(msg) => write!(f, "failed in the host: {msg}"),
        }
    }
}

/// A Python exception that escaped a call, from the traceback CPython
/// printed to stderr (componentize-py then aborts): `raised ValueError:
/// boom (app.py, line 26, in judge)` with the innermost frame, bounded and
/// printable; `policy check` shows the whole traceback.
fn python_exception(stderr: &str) -> Option<String> {
    const HEADER: &str = "Traceback (most recent call last):";
    let traceback = &stderr[stderr.rfind(HEADER)? + HEADER.len()..];
    let lines: Vec<&str> = traceback
        .lines()
        .map(str::trim_end)
        .filter(|l| !l.trim().is_empty())
        .collect();
    // The exception is the last line not indented, before the runtime's
    // own panic message.
    let end = lines
        .iter()
        .position(|l| l.starts_with("thread '"))
        .unwrap_or(lines.len());
    let exception = lines[..end].iter().rev().find(|l| !l.starts_with(' '))?;
    let frame = lines[..end]
        .iter()
        .rev()
        .find(|l| l.trim_start().starts_with("File \""))
        .map(|l| {
            let l = l.trim().trim_start_matches("File ");
            // `"/0/app.py", line 26, in judge`: the file without the
            // build's directory.
            let (file, rest) = l.trim_start_matches('"').split_once('"').unwrap_or((l, ""));
            let file = file.rsplit('/').next().unwrap_or(file);
            format!(" ({file}{rest})")
        })
        .unwrap_or_default();
    Some(truncate(
        &printable(&format!("raised {}{frame}", exception.trim())),
        1000,
    ))
}

/// Collapse stderr to one bounded, printable line for a message. Rust's
/// panic hint to set `RUST_BACKTRACE` is left out: the variable is the
/// host's, and it changes nothing in a policy.
fn one_line(text: &str) -> String {
    const MAX: usize = 1000;
    let joined = text
        .split('\n')
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("note: run with `RUST_BACKTRACE=1`"))
        .collect::<Vec<_>>()
        .join(" | ");
    truncate(&printable(&joined), MAX)
}

/// `text` safe to print on a terminal or in a log: control characters
/// (line breaks, carriage returns, escape sequences that clear the screen
/// or set the window title, C1 controls) and the bidirectional overrides
/// that reorder what a terminal shows are written as escapes (`\n`,
/// `\u{1b}`), so a policy can neither forge a line of the host's output
/// nor take over the terminal.
pub fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    let unsafe_char = |c: char| {
        c.is_control()
            || matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    };
    if !text.chars().any(unsafe_char) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if unsafe_char(c) => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

/// At most `max` bytes of `text` (on a char boundary), with an ellipsis.
pub(crate) fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &text[..end])
}

/// `1.5 s`, `250 ms`, `12 µs`.
pub(crate) fn human_duration(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s >= 1.0 {
        format!("{} s", round3(s))
    } else if s >= 1e-3 {
        format!("{} ms", round3(s * 1e3))
    } else {
        format!("{} µs", round3(s * 1e6))
    }
}

/// At most three decimals, without trailing zeros.
fn round3(x: f64) -> String {
    let text = format!("{x:.3}");
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// `200,000,000`.
pub(crate) fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `116.3 MiB`, `64 MiB`, `1000 bytes`: sizes that are not round.
pub(crate) fn human_size(n: u64) -> String {
    let mib = n as f64 / f64::from(1 << 20);
    if mib >= 1.0 {
        format!("{} MiB", round3((mib * 10.0).round() / 10.0))
    } else {
        human_bytes(usize::try_from(n).unwrap_or(usize::MAX))
    }
}

/// `64 MiB`, `512 KiB`, `100 bytes`.
pub(crate) fn human_bytes(n: usize) -> String {
    if n >= 1 << 20 && n.is_multiple_of(1 << 20) {
        format!("{} MiB", n >> 20)
    } else if n >= 1 << 10 && n.is_multiple_of(1 << 10) {
        format!("{} KiB", n >> 10)
    } else {
        format!("{n} bytes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn call_errors_name_policy_and_stage() {
        let e = PolicyError::Call {
            policy: "slow".into(),
            function: "judge",
            stage: Some(3),
            failure: CallFailure::Deadline {
                limit: Duration::from_secs(1),
                elapsed: Duration::from_millis(1012),
            },
        };
        assert_eq!(
            e.to_string(),
            "policy slow: ran past its 1 s wall-clock limit and was stopped after 1.012 s (a \
             backstop: its fuel was not used up, so the machine was overloaded or the call was \
             stuck outside its code) at stage 3"
        );
        let e = PolicyError::Call {
            policy: "busy".into(),
            function: "judge",
            stage: Some(2),
            failure: CallFailure::Fuel(200_000_000),
        };
        assert_eq!(
            e.to_string(),
            "policy busy: used up its fuel budget of 200,000,000 instructions and was stopped at stage 2"
        );
        let e = PolicyError::Call {
            policy: "p".into(),
            function: "judge",
            stage: Some(1),
            failure: CallFailure::Crashed {
                trap: "wasm trap: unreachable".into(),
                stderr: "\nthread '<unnamed>' panicked at src/lib.rs:3:5:\nboom\n".into(),
            },
        };
        assert_eq!(
            e.to_string(),
            "policy p: panicked (panicked at src/lib.rs:3:5: | boom) at stage 1"
        );
    }

    #[test]
    fn python_tracebacks_name_the_exception_and_the_frame() {
        let failure = CallFailure::Crashed {
            trap: "wasm trap: wasm `unreachable` instruction executed".into(),
            stderr:
                "Traceback (most recent call last):\n  File \"/0/app.py\", line 40, in judge\n    \
                     return rule(p)\n  File \"/0/app.py\", line 26, in rule\n    raise \
                     ValueError(\"boom\")\nValueError: boom\n\nthread '<unnamed>' (1) panicked at \
                     runtime/src/lib.rs:1293:29:\nPython function threw an unexpected exception\n"
                    .into(),
        };
        assert_eq!(
            failure.to_string(),
            "raised ValueError: boom (app.py, line 26, in rule)"
        );
        let forbidden = CallFailure::Forbidden {
            interface: "wasi:sockets/tcp".into(),
            function: "[method]tcp-socket.start-connect".into(),
        };
        assert!(
            forbidden
                .to_string()
                .starts_with("called wasi:sockets/tcp, which policies may not use"),
            "{forbidden}"
        );
    }

    #[test]
    fn params_errors_point_at_the_scenario() {
        let e = PolicyError::Params {
            policy: "builtin".into(),
            location: Some(SourceLocation {
                file: "s.star".into(),
                line: 3,
                column: 9,
            }),
            message: "unknown parameter `foo`".into(),
        };
        assert_eq!(
            e.to_string(),
            "s.star:3:9: until_congested(...): unknown parameter `foo` (policy builtin)"
        );
    }

    #[test]
    fn sizes_read_well() {
        assert_eq!(human_bytes(64 << 20), "64 MiB");
        assert_eq!(human_bytes(1024), "1 KiB");
        assert_eq!(human_bytes(1000), "1000 bytes");
        assert_eq!(truncate("héllo", 2), "h...");
        assert_eq!(human_size(116 << 20), "116 MiB");
        assert_eq!(human_size(121_634_816 + 300_000), "116.3 MiB");
        assert_eq!(human_duration(Duration::from_millis(250)), "250 ms");
        assert_eq!(human_duration(Duration::from_secs(10)), "10 s");
        assert_eq!(thousands(1_000), "1,000");
        assert_eq!(thousands(999), "999");
    }
}
