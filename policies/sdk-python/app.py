"""my-policy: a nyann-bench congestion policy, in Python.

Build: ./build.sh                      (-> policy.wasm)
Check: nyann-bench policy check policy.wasm --param ttft_p99=1s
Use:   nyann-bench generate --policy policy.wasm ...

Import every module you need here, at the top (a module imported for the
first time inside `judge` is not found in the component). `print` shows in
`nyann-bench policy check`; raise PolicyError("...") to answer an error.
"""

import nyann_policy as nyann
from nyann_policy import Params, StageObservation, Verdict, fixed, fmt, spec


class MyPolicy:
    def describe(self):
        return (
            nyann.info(
                "my-policy",
                "0.1.0",
                "Congested when client TTFT p99 or the error rate is too high.",
            )
            # It judges the client's figures only, so it runs without
            # --scrape or --prometheus-url; drop this line to read stage.roles.
            .client_only()
            .param(spec.duration("ttft_p99", "client TTFT p99 limit").required())
            .param(spec.fraction("max_error_rate", "largest share of failed requests").default(0.01))
        )

    def validate(self, params: Params) -> None:
        params.require_positive("ttft_p99")

    def judge(self, params: Params, stage: StageObservation, history) -> Verdict:
        return rule(params.seconds("ttft_p99"), params.fraction("max_error_rate"), stage)


def rule(ttft_limit: float, max_error_rate: float, stage: StageObservation) -> Verdict:
    """The rule, plain Python: ./build.sh test runs test_app.py natively."""
    reasons = []
    if stage.client.ttft_p99_seconds > ttft_limit:
        reasons.append(f"client TTFT p99 {fixed(stage.client.ttft_p99_seconds, 3)}s > {fmt(ttft_limit)}s")
    rate = nyann.error_rate(stage.client)
    if rate > max_error_rate:
        reasons.append(f"error rate {fixed(rate * 100.0, 1)}% > {fixed(max_error_rate * 100.0, 1)}%")
    return nyann.from_reasons(reasons)


# componentize-py exports the class bound to `Policy`.
Policy = nyann.export(MyPolicy)
