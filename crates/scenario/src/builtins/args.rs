//! The argument checker every builtin uses: converts each argument,
//! collecting every problem of one call to raise them together.

use nyann_model::SourceLocation;
use starlark::values::float::UnpackFloat;
use starlark::values::{UnpackValue, Value};

use super::{given, raise, show};
use nyann_model::{DURATION_HELP, parse_seconds};

/// Collects the problems of one call while converting its arguments.
pub(super) struct Args {
    func: &'static str,
    pub(super) problems: Vec<String>,
}

impl Args {
    pub(super) fn new(func: &'static str) -> Self {
        Args {
            func,
            problems: Vec::new(),
        }
    }

    pub(super) fn problem(&mut self, message: String) {
        self.problems.push(format!("{}(): {message}", self.func));
    }

    /// An int in `min..=max`; `expected` describes the range for the message.
    pub(super) fn int(
        &mut self,
        name: &str,
        v: Value,
        min: i64,
        max: i64,
        expected: &str,
    ) -> Option<i64> {
        match i64::unpack_value(v) {
            Ok(Some(n)) if (min..=max).contains(&n) => Some(n),
            Ok(Some(_)) | Err(_) if v.get_type() == "int" => {
                self.problem(format!("{name} must be {expected}, got {}", v.to_repr()));
                None
            }
            _ => {
                self.problem(format!("{name} must be {expected}, got {}", show(v)));
                None
            }
        }
    }

    /// An int that fits in `u32`. Range rules beyond that (such as `>= 1`)
    /// belong to the IR validation, which then reports them with the other
    /// problems of the call; `expected` still states them for the message.
    pub(super) fn u32(&mut self, name: &str, v: Value, expected: &str) -> Option<u32> {
        let n = self.int(name, v, 0, i64::from(u32::MAX), expected)?;
        u32::try_from(n).ok()
    }

    /// An int or a float.
    pub(super) fn number(&mut self, name: &str, v: Value, expected: &str) -> Option<f64> {
        match UnpackFloat::unpack_value(v) {
            Ok(Some(UnpackFloat(x))) => Some(x),
            _ => {
                self.problem(format!("{name} must be {expected}, got {}", show(v)));
                None
            }
        }
    }

    pub(super) fn string(&mut self, name: &str, v: Value, expected: &str) -> Option<String> {
        match v.unpack_str() {
            Some(s) => Some(s.to_owned()),
            None => {
                self.problem(format!("{name} must be {expected}, got {}", show(v)));
                None
            }
        }
    }

    pub(super) fn opt_string(&mut self, name: &str, v: Option<Value>) -> Option<String> {
        let v = given(v)?;
        self.string(name, v, "a string or None")
    }

    pub(super) fn bool(&mut self, name: &str, v: Option<Value>) -> bool {
        let Some(v) = v else { return false };
        match v.unpack_bool() {
            Some(b) => b,
            None => {
                self.problem(format!("{name} must be True or False, got {}", show(v)));
                false
            }
        }
    }

    /// A duration string or integer seconds, > 0, as seconds.
    pub(super) fn duration(&mut self, name: &str, v: Value) -> Option<f64> {
        let seconds = if let Some(text) = v.unpack_str() {
            match parse_seconds(text) {
                Ok(s) => s,
                Err(e) => {
                    self.problem(format!("{name}: {e}"));
                    return None;
                }
            }
        } else if v.get_type() == "int" {
            match i64::unpack_value(v) {
                Ok(Some(n)) => n as f64,
                _ => {
                    self.problem(format!("{name} is too large: {}", v.to_repr()));
                    return None;
                }
            }
        } else {
            self.problem(format!("{name} must be {DURATION_HELP}; got {}", show(v)));
            return None;
        };
        if seconds <= 0.0 {
            self.problem(format!("{name} must be > 0, got {}", v.to_repr()));
            return None;
        }
        Some(seconds)
    }

    pub(super) fn finish<T>(
        self,
        location: Option<SourceLocation>,
        value: T,
    ) -> starlark::Result<T> {
        if self.problems.is_empty() {
            Ok(value)
        } else {
            Err(raise(location, self.problems))
        }
    }
}
