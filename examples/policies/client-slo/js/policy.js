// Example policy in JavaScript: stop when the client-side SLO is broken.
//
// The same policy as the Rust `client-slo` (../src/lib.rs), verdict for
// verdict and reason for reason. A stage violates the SLO when the client's
// TTFT p99 exceeds `ttft_p99` or its error rate exceeds `max_error_rate`.
// The sweep stops when the last `consecutive` measured stages (this one and
// those of the levels just below it, from `history`) all violate it.
//
// Build: ./build.sh (the kit of `nyann-bench policy new NAME --lang js`, from
// policies/sdk-js) -> client_slo.wasm

import {
  PolicyError, below, errorRate, exportPolicy, fixed, fmt, info, log, ok, spec, when,
} from './nyann_policy.js';

/** The SLO limits of one `until_congested(...)` call. */
function slo(params) {
  const consecutive = params.integer('consecutive');
  if (!(consecutive >= 1 && consecutive <= 100)) {
    throw new PolicyError(`consecutive must be from 1 to 100 (got ${consecutive})`);
  }
  return {
    ttftP99Seconds: params.requirePositive('ttft_p99'),
    maxErrorRate: params.fraction('max_error_rate'),
    consecutive,
  };
}

/** Why `stage` violates the SLO, if it does. */
function violation(limits, stage) {
  const c = stage.client;
  const why = [];
  if (c.ttftP99Seconds > limits.ttftP99Seconds) {
    why.push(`client TTFT p99 ${fixed(c.ttftP99Seconds, 3)}s > ${fmt(limits.ttftP99Seconds)}s`);
  }
  const rate = errorRate(c);
  if (rate > limits.maxErrorRate) {
    why.push(
      `error rate ${fixed(rate * 100, 1)}% (${c.requestsFailed} of ` +
        `${c.requestsOk + c.requestsFailed}) > ${fixed(limits.maxErrorRate * 100, 1)}%`,
    );
  }
  return why.length > 0 ? why.join(', ') : undefined;
}

function judge(limits, stage, history) {
  const now = violation(limits, stage);
  if (now === undefined) return ok();
  // The stages of the levels below, nearest first.
  const earlier = below(stage, history).reverse().slice(0, limits.consecutive - 1);
  let streak = 1;
  for (const s of earlier) {
    if (violation(limits, s) === undefined) break;
    streak += 1;
  }
  const reason = limits.consecutive === 1
    ? `client SLO: ${now}`
    : `client SLO broken ${streak} stages in a row: ${now}`;
  return when(streak >= limits.consecutive, reason);
}

export const policy = exportPolicy({
  describe() {
    return info(
      'client-slo',
      '0.1.0',
      "Congested when the client's TTFT p99 or error rate break the SLO for `consecutive` stages in a row.",
    )
      // Client figures only: runs without a signal source.
      .clientOnly()
      .param(spec.duration('ttft_p99', 'client TTFT p99 limit').required())
      .param(spec.fraction('max_error_rate', 'largest acceptable share of failed requests').default(0.01))
      .param(spec.integer('consecutive', 'stages in a row that must break the SLO').default(1));
  },

  validate(params) {
    slo(params);
  },

  judge(params, stage, history) {
    const limits = slo(params);
    log.debug(`judging ${stage.name} against ${JSON.stringify(limits)}`);
    return judge(limits, stage, history);
  },
});
