"""SDK for nyann-bench congestion policies written in Python.

A policy is a WebAssembly component implementing the WIT contract
`nyann:policy@0.5.0` (`wit/policy.wit`, printed by `nyann-bench policy wit`),
built with componentize-py. This module mirrors the Rust SDK (nyann-policy):
write a class with `describe`, `validate` and `judge`, export it, build.

    import nyann_policy as nyann
    from nyann_policy import Params, spec

    class ErrorRate:
        def describe(self):
            return nyann.info("error-rate", "0.1.0",
                              "Congested when more than `max_failed` requests of a stage failed.") \\
                .client_only() \\
                .param(spec.number("max_failed", "failed requests per stage").default(10))

        def judge(self, params: Params, stage, history):
            limit = params.number("max_failed")
            failed = stage.client.requests_failed
            return nyann.when(failed >= limit, lambda: f"{failed} requests failed (limit {nyann.fmt(limit)})")

    Policy = nyann.export(ErrorRate)   # componentize-py looks for `Policy`

Errors: raise `PolicyError("message")` (the `Params` readers and checks do)
to answer `err(message)`: the host reports it as the policy's error for the
stage (validate: the scenario is refused with it). Any other exception is a
bug: the call fails, and the host shows the exception and where it was
raised (`nyann-bench policy check` prints the whole traceback).

Everything this module needs is imported here, at the top: componentize-py
snapshots the interpreter after importing the app, and a module imported
for the first time inside `judge` is not found (`ModuleNotFoundError`).
"""

import math
import sys
from typing import Callable, Iterable, List, Optional, Sequence, Union

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import host
from wit_world.imports.types import (
    ClientStats,
    EvalCounts,
    FiredRule,
    Param,
    ParamKind,
    ParamSpec,
    PolicyInfo,
    RoleSignals,
    StageObservation,
    Sweep,
    Value_Flag,
    Value_Integer,
    Value_Number,
    Value_Text,
    Verdict,
)

__all__ = [
    "INTERFACE_VERSION", "PolicyError", "Params", "Info", "Spec", "spec", "info",
    "ok", "from_reasons", "congested", "when", "fired", "level", "below",
    "error_rate", "accuracy", "interval95", "extra", "log", "fmt", "fixed",
    "export", "observation", "client_stats", "role_signals",
    "ClientStats", "EvalCounts", "FiredRule", "Param", "ParamKind", "ParamSpec",
    "PolicyInfo", "RoleSignals", "StageObservation", "Sweep", "Verdict",
]

#: The interface version this SDK builds components for.
INTERFACE_VERSION = "0.5.0"


class PolicyError(Exception):
    """The policy's answer `err(message)`: raise it from `validate` or
    `judge` (the `Params` readers raise it for a missing or mistyped
    parameter)."""


# --- numbers as the Rust SDK's policies print them --------------------------


def fmt(x: float) -> str:
    """`x` as Rust's `{}` prints an f64: the shortest text that reads back
    as `x`, without an exponent and without a trailing `.0` (`1`, `1.5`,
    `0.0000001`). A reason written with it reads as a Rust policy's."""
    x = float(x)
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    text = repr(x)
    sign = "-" if text.startswith("-") else ""
    text = text.lstrip("-")
    mantissa, _, exponent = text.partition("e")
    whole, _, fraction = mantissa.partition(".")
    digits = whole + fraction
    point = len(whole) + (int(exponent) if exponent else 0)
    if point <= 0:
        whole, fraction = "0", "0" * -point + digits
    elif point >= len(digits):
        whole, fraction = digits + "0" * (point - len(digits)), ""
    else:
        whole, fraction = digits[:point], digits[point:]
    whole = whole.lstrip("0") or "0"
    fraction = fraction.rstrip("0")
    return sign + whole + ("." + fraction if fraction else "")


def fixed(x: float, places: int) -> str:
    """`x` with `places` decimals, as Rust's `{:.N}` prints it (exact
    value, ties to even)."""
    x = float(x)
    if not math.isfinite(x):
        return fmt(x)
    return f"{x:.{places}f}"


# --- parameters -------------------------------------------------------------


def _show(value) -> str:
    """A value as the Rust SDK's messages show it (`Text("x")`)."""
    if isinstance(value, Value_Number):
        return f"Number({fmt(value.value)})"
    if isinstance(value, Value_Integer):
        return f"Integer({value.value})"
    if isinstance(value, Value_Text):
        return 'Text("' + value.value.replace("\\", "\\\\").replace('"', '\\"') + '")'
    if isinstance(value, Value_Flag):
        return f"Flag({'true' if value.value else 'false'})"
    return repr(value)


def _value(x):
    """A Python value as a WIT `value`: bool flag, int integer, float
    number, str text (a WIT value passes through)."""
    if isinstance(x, (Value_Number, Value_Integer, Value_Text, Value_Flag)):
        return x
    if isinstance(x, bool):
        return Value_Flag(x)
    if isinstance(x, int):
        return Value_Integer(x)
    if isinstance(x, float):
        return Value_Number(x)
    if isinstance(x, str):
        return Value_Text(x)
    raise TypeError(f"no parameter value of type {type(x).__name__}")


class Params:
    """The parameters of one `until_congested(...)` call, as the host passes
    them: every described parameter present (defaults filled), durations in
    seconds. The readers raise `PolicyError` with the Rust SDK's messages."""

    def __init__(self, params: Iterable[Param] = ()):
        self._params = list(params)

    @classmethod
    def of(cls, **values) -> "Params":
        """For tests: `Params.of(ttft_p99=1.0, consecutive=2)` (float:
        number, int: integer, str: text, bool: flag)."""
        return cls(Param(name=k, value=_value(v)) for k, v in values.items())

    def __iter__(self):
        return iter(self._params)

    def __repr__(self) -> str:
        return "Params(" + ", ".join(f"{p.name}={_show(p.value)}" for p in self._params) + ")"

    def get(self, name: str):
        """The raw value of a parameter (`Value_Number`...), or None."""
        for p in self._params:
            if p.name == name:
                return p.value
        return None

    def _typed(self, name: str, kinds, what: str):
        value = self.get(name)
        if value is None:
            raise PolicyError(f"parameter {name} is missing")
        if not isinstance(value, kinds):
            raise PolicyError(f"parameter {name} must be {what}, got {_show(value)}")
        return value.value

    def number(self, name: str) -> float:
        """A `number`, `fraction` or `duration` parameter (durations in
        seconds). An `integer` parameter reads as a number too."""
        return float(self._typed(name, (Value_Number, Value_Integer), "a number"))

    def integer(self, name: str) -> int:
        """An `integer` parameter."""
        return int(self._typed(name, Value_Integer, "an integer"))

    def seconds(self, name: str) -> float:
        """A `duration` parameter, in seconds."""
        return self.number(name)

    def fraction(self, name: str) -> float:
        """A `fraction` parameter (0..1)."""
        return self.number(name)

    def number_or(self, name: str, default: float) -> float:
        """A number parameter, or `default` when absent."""
        return default if self.get(name) is None else self.number(name)

    def text(self, name: str) -> str:
        """A `text` parameter."""
        return self._typed(name, Value_Text, "text")

    def flag(self, name: str) -> bool:
        """A `flag` parameter."""
        return bool(self._typed(name, Value_Flag, "a flag"))

    def require_positive(self, name: str) -> float:
        """A number parameter that must be > 0 (and finite)."""
        v = self.number(name)
        if math.isfinite(v) and v > 0:
            return v
        raise PolicyError(f"{name} must be > 0 (got {fmt(v)})")

    def require_fraction_above_zero(self, name: str) -> float:
        """A number parameter that must be in (0, 1]."""
        v = self.number(name)
        if 0 < v <= 1:
            return v
        raise PolicyError(f"{name} must be in (0, 1] (got {fmt(v)})")


# --- the description ----------------------------------------------------------


class Spec:
    """A parameter description under construction (see `spec`). Optional
    without a default unless told otherwise."""

    def __init__(self, name: str, kind: ParamKind, doc: str):
        self.name, self.kind, self.doc = name, kind, doc
        self.is_required, self.default_value = False, None

    def required(self) -> "Spec":
        """The scenario must give this parameter."""
        self.is_required, self.default_value = True, None
        return self

    def default(self, value) -> "Spec":
        """Its default: a number (seconds for a duration), an int, a str or
        a bool, as the kind takes it."""
        if self.kind == ParamKind.INTEGER:
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"the default of integer parameter {self.name} must be an int")
            v = Value_Integer(value)
        elif self.kind == ParamKind.TEXT:
            v = Value_Text(str(value))
        elif self.kind == ParamKind.FLAG:
            v = Value_Flag(bool(value))
        else:
            v = Value_Number(float(value))
        self.default_value, self.is_required = v, False
        return self

    # The Rust SDK's names.
    default_number = default_integer = default_text = default_flag = default

    def to_wit(self) -> ParamSpec:
        return ParamSpec(name=self.name, kind=self.kind, required=self.is_required,
                         default=self.default_value, doc=self.doc)


class spec:
    """Builders of parameter descriptions, e.g.
    `spec.duration("ttft_p99", "client TTFT p99 limit").required()`."""

    @staticmethod
    def number(name: str, doc: str) -> Spec:
        """Any finite number."""
        return Spec(name, ParamKind.NUMBER, doc)

    @staticmethod
    def integer(name: str, doc: str) -> Spec:
        """A whole number; read it with `params.integer`."""
        return Spec(name, ParamKind.INTEGER, doc)

    @staticmethod
    def fraction(name: str, doc: str) -> Spec:
        """A number in 0..1."""
        return Spec(name, ParamKind.FRACTION, doc)

    @staticmethod
    def duration(name: str, doc: str) -> Spec:
        """A duration (`"750ms"`, `"2s"`, or seconds); arrives in seconds."""
        return Spec(name, ParamKind.DURATION, doc)

    @staticmethod
    def text(name: str, doc: str) -> Spec:
        """Free text."""
        return Spec(name, ParamKind.TEXT, doc)

    @staticmethod
    def flag(name: str, doc: str) -> Spec:
        """A boolean (`True` / `False` in the scenario)."""
        return Spec(name, ParamKind.FLAG, doc)


class Info:
    """A policy's description under construction (see `info`)."""

    def __init__(self, name: str, version: str, summary: str):
        self.name, self.version, self.summary = name, version, summary
        self.params: List[Spec] = []
        self.server_signals = True

    def client_only(self) -> "Info":
        """The policy judges the client's figures only: nyann-bench runs it
        without a signal source (no `--scrape` or `--prometheus-url`)."""
        self.server_signals = False
        return self

    def param(self, spec: Union[Spec, ParamSpec]) -> "Info":
        """Add a parameter (see `spec`)."""
        self.params.append(spec)
        return self

    def to_wit(self) -> PolicyInfo:
        return PolicyInfo(
            name=self.name, version=self.version, summary=self.summary,
            params=[p.to_wit() if isinstance(p, Spec) else p for p in self.params],
            server_signals=self.server_signals,
        )


def info(name: str, version: str, summary: str) -> Info:
    """Start a description: name, version, one-sentence summary. The policy
    reads server signals unless `.client_only()` says not."""
    return Info(name, version, summary)


# --- verdicts ---------------------------------------------------------------


def ok() -> Verdict:
    """Not congested."""
    return Verdict(congested=False, reasons=[], fired=[])


def from_reasons(reasons: Sequence[str]) -> Verdict:
    """Congested for the given reasons; not congested when there are none."""
    reasons = [str(r) for r in reasons]
    return Verdict(congested=bool(reasons), reasons=reasons, fired=[])


def congested(*reasons: str) -> Verdict:
    """Congested, for these reasons."""
    return Verdict(congested=True, reasons=[str(r) for r in reasons], fired=[])


def when(condition: bool, reason: Union[str, Callable[[], str]]) -> Verdict:
    """Congested with one reason when `condition` holds (`reason` may be a
    function, called only then)."""
    if not condition:
        return ok()
    return from_reasons([reason() if callable(reason) else reason])


def fired(verdict: Verdict, rule: str, role: Optional[str] = None,
          signals: Sequence[str] = ()) -> Verdict:
    """Say which rule fired, on which role (None: client figures) and which
    figures it compared, named as in the results files
    (`waiting_requests_p50`, `ttft_p99_seconds`...). Returns the verdict."""
    verdict.fired.append(FiredRule(rule=rule, role=role, signals=list(signals)))
    return verdict


# --- reading observations -----------------------------------------------------


def level(stage: StageObservation) -> Optional[float]:
    """The stage's level: its concurrency, else its rate (None: neither)."""
    if stage.concurrency is not None:
        return float(stage.concurrency)
    return stage.rate


def below(stage: StageObservation, history: Sequence[StageObservation]) -> List[StageObservation]:
    """The stages of `history` at a lower level than `stage`, in level
    order: for a sweep stage, the sweep's stages before it; for a
    capacity-search stage (`stage.refines`), the stages it lies above. The
    last one is the nearest level below, whenever it ran."""
    own = level(stage)
    if own is None:
        return list(history)
    lower = [s for s in history if level(s) is not None and level(s) < own]
    lower.sort(key=level)  # stable, like Rust's sort_by
    return lower


def error_rate(client: ClientStats) -> float:
    """Failed requests over all requests of the stage (0 when none were sent)."""
    total = client.requests_ok + client.requests_failed
    return 0.0 if total == 0 else client.requests_failed / total


def accuracy(counts: Optional[EvalCounts]) -> Optional[float]:
    """The share of right answers of an eval stage (None before any was scored)."""
    if counts is None or counts.answered == 0:
        return None
    return counts.correct / counts.answered


def interval95(counts: Optional[EvalCounts]):
    """The accuracy's 95% Wilson score interval, `(low, high)`; `(0, 1)`
    before any answer was scored."""
    if counts is None or counts.answered == 0:
        return (0.0, 1.0)
    z = 1.959963984540054
    n = float(counts.answered)
    p = counts.correct / n
    z2 = z * z
    centre = (p + z2 / (2.0 * n)) / (1.0 + z2 / n)
    half = z * math.sqrt(p * (1.0 - p) / n + z2 / (4.0 * n * n)) / (1.0 + z2 / n)
    return (max(centre - half, 0.0), min(centre + half, 1.0))


def extra(role: RoleSignals, name: str) -> Optional[float]:
    """The value of a named extra figure of a role, if the source gave it."""
    for n, v in role.extra:
        if n == name:
            return v
    return None


# --- logging ----------------------------------------------------------------


class log:
    """Lines in nyann-bench's log, attributed to the policy (bounded per
    call; `policy check` shows them). Outside the component (native tests)
    they go to stderr. `print` works too: stdout is kept like stderr and
    shown by `policy check` (and at debug level, `-v`, in a run)."""

    @staticmethod
    def _write(level, word: str, msg: str) -> None:
        try:
            host.log(level, str(msg))
        except NotImplementedError:  # natively: no host
            print(f"[{word}] {msg}", file=sys.stderr)

    @staticmethod
    def debug(msg: str) -> None:
        """Debug-level line (shown with `-v`)."""
        log._write(host.Level.DEBUG, "debug", msg)

    @staticmethod
    def info(msg: str) -> None:
        """Info-level line."""
        log._write(host.Level.INFO, "info", msg)

    @staticmethod
    def warn(msg: str) -> None:
        """Warning line."""
        log._write(host.Level.WARN, "warn", msg)


# --- the export ---------------------------------------------------------------


def export(policy_class):
    """The component's `policy` export for a class with `describe()`,
    `validate(params)` (optional) and `judge(params, stage, history)`:
    bind it to the name `Policy` in the app module (`Policy =
    nyann.export(MyPolicy)`), where componentize-py looks for it.
    `describe` may return an `Info`; `validate` and `judge` get `Params`;
    a `PolicyError` becomes the answer `err(message)`."""
    impl = policy_class()

    def answer(call):
        try:
            return call()
        except PolicyError as e:
            raise Err(str(e))

    class Policy(exports.Policy):
        def describe(self) -> PolicyInfo:
            described = impl.describe()
            return described.to_wit() if isinstance(described, Info) else described

        def validate(self, params: List[Param]) -> None:
            if hasattr(impl, "validate"):
                answer(lambda: impl.validate(Params(params)))

        def judge(self, params: List[Param], stage: StageObservation,
                  history: List[StageObservation]) -> Verdict:
            return answer(lambda: impl.judge(Params(params), stage, list(history)))

    Policy.__name__ = Policy.__qualname__ = policy_class.__name__
    return Policy


# --- observations for tests ---------------------------------------------------


def client_stats(**fields) -> ClientStats:
    """Client statistics, all zero but `fields`: for tests."""
    values = dict(requests_ok=0, requests_failed=0, requests_per_second=0.0,
                  output_tokens_per_second=0.0, ttft_p50_seconds=0.0, ttft_p99_seconds=0.0,
                  itl_p50_seconds=0.0, itl_p99_seconds=0.0, e2e_p50_seconds=0.0,
                  e2e_p99_seconds=0.0, dropped=0, requests_rejected=0, requests_late=0,
                  eval=None, slo=None)
    values.update(fields)
    return ClientStats(**values)


def role_signals(role: str, **fields) -> RoleSignals:
    """A role with every signal at zero but `fields`: for tests."""
    values = dict(role=role, waiting_requests_p50=0.0, ttft_p99_seconds=0.0,
                  kv_cache_usage_max=0.0, preemptions=0.0, extra=[])
    values.update(fields)
    return RoleSignals(**values)


def observation(**fields) -> StageObservation:
    """Stage 0 of sweep 0, unnamed, no roles, zero client statistics, but
    `fields` (`client` may be a dict of client fields): for tests."""
    client = fields.pop("client", None)
    if isinstance(client, dict):
        client = client_stats(**client)
    values = dict(index=0, name="", sweep=Sweep(index=0, name=""), concurrency=None,
                  rate=None, start_unix_seconds=0.0, end_unix_seconds=0.0, roles=[],
                  client=client if client is not None else client_stats(),
                  signal_errors=[], refines=None)
    values.update(fields)
    return StageObservation(**values)
