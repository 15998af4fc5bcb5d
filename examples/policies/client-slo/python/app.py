"""Example policy in Python: stop when the client-side SLO is broken.

The same policy as the Rust `client-slo` (../src/lib.rs), verdict for
verdict and reason for reason. A stage violates the SLO when the client's
TTFT p99 exceeds `ttft_p99` or its error rate exceeds `max_error_rate`. The
sweep stops when the last `consecutive` measured stages (this one and those
of the levels just below it, from `history`) all violate it.

Build (the kit of `nyann-bench policy new NAME --lang python`: copy this
file next to its nyann_policy.py and wit/, or run ./build.sh here, which
takes them from policies/sdk-python):

    ./build.sh        # -> client_slo.wasm
"""

from dataclasses import dataclass
from typing import List, Optional

import nyann_policy as nyann
from nyann_policy import Params, PolicyError, StageObservation, Verdict, fixed, fmt, spec


@dataclass(frozen=True)
class Slo:
    """The SLO limits of one `until_congested(...)` call."""

    ttft_p99_seconds: float
    max_error_rate: float
    consecutive: int

    @staticmethod
    def from_params(params: Params) -> "Slo":
        consecutive = params.integer("consecutive")
        if not 1 <= consecutive <= 100:
            raise PolicyError(f"consecutive must be from 1 to 100 (got {consecutive})")
        return Slo(
            ttft_p99_seconds=params.require_positive("ttft_p99"),
            max_error_rate=params.fraction("max_error_rate"),
            consecutive=consecutive,
        )

    def violation(self, stage: StageObservation) -> Optional[str]:
        """Why `stage` violates the SLO, if it does."""
        c = stage.client
        why = []
        if c.ttft_p99_seconds > self.ttft_p99_seconds:
            why.append(f"client TTFT p99 {fixed(c.ttft_p99_seconds, 3)}s > {fmt(self.ttft_p99_seconds)}s")
        rate = nyann.error_rate(c)
        if rate > self.max_error_rate:
            why.append(
                f"error rate {fixed(rate * 100.0, 1)}% ({c.requests_failed} of "
                f"{c.requests_ok + c.requests_failed}) > {fixed(self.max_error_rate * 100.0, 1)}%"
            )
        return ", ".join(why) if why else None

    def judge(self, stage: StageObservation, history: List[StageObservation]) -> Verdict:
        now = self.violation(stage)
        if now is None:
            return nyann.ok()
        # The stages of the levels below, nearest first.
        earlier = list(reversed(nyann.below(stage, history)))[: self.consecutive - 1]
        streak = 1
        for s in earlier:
            if self.violation(s) is None:
                break
            streak += 1
        if self.consecutive == 1:
            reason = f"client SLO: {now}"
        else:
            reason = f"client SLO broken {streak} stages in a row: {now}"
        return nyann.when(streak >= self.consecutive, reason)


class ClientSlo:
    def describe(self):
        return (
            nyann.info(
                "client-slo",
                "0.1.0",
                "Congested when the client's TTFT p99 or error rate break the SLO for "
                "`consecutive` stages in a row.",
            )
            # Client figures only: runs without a signal source.
            .client_only()
            .param(spec.duration("ttft_p99", "client TTFT p99 limit").required())
            .param(spec.fraction("max_error_rate", "largest acceptable share of failed requests").default(0.01))
            .param(spec.integer("consecutive", "stages in a row that must break the SLO").default(1))
        )

    def validate(self, params: Params) -> None:
        Slo.from_params(params)

    def judge(self, params: Params, stage: StageObservation, history) -> Verdict:
        slo = Slo.from_params(params)
        nyann.log.debug(f"judging {stage.name} against {slo}")
        return slo.judge(stage, history)


Policy = nyann.export(ClientSlo)
