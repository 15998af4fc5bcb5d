//! The standard functions and operators that could build huge lists
//! (`range`, `*`, `+`), bounded.

use std::num::NonZeroI32;

use starlark::environment::GlobalsBuilder;
use starlark::eval::Evaluator;
use starlark::starlark_module;
use starlark::values::range::Range;
use starlark::values::{UnpackValue, Value};

use super::{call_location, raise};

/// Longest `range(...)` a scenario may build. Scenarios need a few thousand
/// numbers at most; refusing huge ranges up front stops `list(range(10**9))`
/// and friends before they allocate, which the step budget cannot do.
pub const MAX_RANGE_LEN: i64 = 1_000_000;

/// Longest string or list that `*` and `+` may build, for the same reason.
pub const MAX_SEQUENCE_LEN: i64 = 1_000_000;

/// The standard functions and operators that could build huge lists,
/// bounded.
#[starlark_module]
pub(super) fn bounded_builtins(builder: &mut GlobalsBuilder) {
    /// `range` with a size limit (see [`MAX_RANGE_LEN`]); otherwise the
    /// standard one.
    fn range<'v>(
        #[starlark(require = pos)] a1: i32,
        #[starlark(require = pos)] a2: Option<i32>,
        #[starlark(require = pos, default = 1)] step: i32,
        eval: &mut Evaluator<'v, '_, '_>,
    ) -> starlark::Result<Value<'v>> {
        let (start, stop) = match a2 {
            None => (0, a1),
            Some(stop) => (a1, stop),
        };
        let Some(nonzero) = NonZeroI32::new(step) else {
            return Err(raise(
                call_location(eval),
                vec!["range(): step must not be zero".into()],
            ));
        };
        let (start64, stop64, step64) = (i64::from(start), i64::from(stop), i64::from(step));
        let len = if step64 > 0 {
            (stop64 - start64 + step64 - 1).div_euclid(step64).max(0)
        } else {
            (start64 - stop64 - step64 - 1).div_euclid(-step64).max(0)
        };
        if len > MAX_RANGE_LEN {
            return Err(raise(
                call_location(eval),
                vec![format!(
                    "range() of {len} numbers exceeds the limit of {MAX_RANGE_LEN}; a scenario needs far fewer: check the bounds"
                )],
            ));
        }
        Ok(eval.heap().alloc(Range::new(start, stop, nonzero)))
    }

    /// `a * b` (the parser rewrites every `*` to this): refuses to build
    /// strings or lists longer than [`MAX_SEQUENCE_LEN`].
    fn __nyann_mul__<'v>(
        #[starlark(require = pos)] a: Value<'v>,
        #[starlark(require = pos)] b: Value<'v>,
        eval: &mut Evaluator<'v, '_, '_>,
    ) -> starlark::Result<Value<'v>> {
        for (seq, count) in [(a, b), (b, a)] {
            if matches!(seq.get_type(), "string" | "list" | "tuple") && count.get_type() == "int" {
                let len = i64::from(seq.length()?);
                let times = i64::unpack_value(count).ok().flatten().unwrap_or(i64::MAX);
                let total = len.saturating_mul(times.max(0));
                if total > MAX_SEQUENCE_LEN {
                    return Err(raise(
                        call_location(eval),
                        vec![format!(
                            "`*` would build a {} of {total} elements; the limit is {MAX_SEQUENCE_LEN}",
                            seq.get_type()
                        )],
                    ));
                }
            }
        }
        a.mul(b, eval.heap())
    }

    /// `a + b` (the parser rewrites every `+` to this): refuses to build
    /// strings or lists longer than [`MAX_SEQUENCE_LEN`].
    fn __nyann_add__<'v>(
        #[starlark(require = pos)] a: Value<'v>,
        #[starlark(require = pos)] b: Value<'v>,
        eval: &mut Evaluator<'v, '_, '_>,
    ) -> starlark::Result<Value<'v>> {
        let (ta, tb) = (a.get_type(), b.get_type());
        if ta == tb && matches!(ta, "string" | "list" | "tuple") {
            let total = i64::from(a.length()?) + i64::from(b.length()?);
            if total > MAX_SEQUENCE_LEN {
                return Err(raise(
                    call_location(eval),
                    vec![format!(
                        "`+` would build a {ta} of {total} elements; the limit is {MAX_SEQUENCE_LEN}"
                    )],
                ));
            }
        }
        a.add(b, eval.heap())
    }
}
