// my-policy: a nyann-bench congestion policy, in JavaScript.
//
// Build: ./build.sh                      (-> policy.wasm)
// Check: nyann-bench policy check policy.wasm --param ttft_p99=1s
// Use:   nyann-bench generate --policy policy.wasm ...
//
// `console.log` lines show in `nyann-bench policy check`; throw
// `new PolicyError('...')` to answer an error.

import {
  errorRate, exportPolicy, fixed, fmt, fromReasons, info, spec,
} from './nyann_policy.js';

/** The rule, plain JavaScript over plain objects. */
export function rule(ttftLimit, maxErrorRate, stage) {
  const reasons = [];
  if (stage.client.ttftP99Seconds > ttftLimit) {
    reasons.push(`client TTFT p99 ${fixed(stage.client.ttftP99Seconds, 3)}s > ${fmt(ttftLimit)}s`);
  }
  const rate = errorRate(stage.client);
  if (rate > maxErrorRate) {
    reasons.push(`error rate ${fixed(rate * 100, 1)}% > ${fixed(maxErrorRate * 100, 1)}%`);
  }
  return fromReasons(reasons);
}

export const policy = exportPolicy({
  describe() {
    return info('my-policy', '0.1.0', 'Congested when client TTFT p99 or the error rate is too high.')
      // It judges the client's figures only, so it runs without --scrape or
      // --prometheus-url; drop this line to read stage.roles.
      .clientOnly()
      .param(spec.duration('ttft_p99', 'client TTFT p99 limit').required())
      .param(spec.fraction('max_error_rate', 'largest share of failed requests').default(0.01));
  },

  validate(params) {
    params.requirePositive('ttft_p99');
  },

  judge(params, stage, history) {
    return rule(params.seconds('ttft_p99'), params.fraction('max_error_rate'), stage);
  },
});
