// SDK for nyann-bench congestion policies written in JavaScript.
//
// A policy is a WebAssembly component implementing the WIT contract
// `nyann:policy@0.5.0` (wit/policy.wit, printed by `nyann-bench policy wit`),
// built with componentize-qjs (QuickJS, the default of build.sh) or
// componentize-js (StarlingMonkey). This module mirrors the Rust SDK
// (nyann-policy) and hides what differs between the two engines:
//
// - 64-bit integers (the `integer` parameter kind, the client's request
//   counts, eval counts) arrive as BigInt under StarlingMonkey and as Number
//   under QuickJS: `exportPolicy` hands the policy Numbers under both, and
//   sends Numbers back (QuickJS traps on a BigInt).
// - An absent option arrives as `undefined` (StarlingMonkey) or `null`
//   (QuickJS): the policy sees `undefined` under both.
// - Errors: StarlingMonkey crashes the call on a thrown `Error` (only a thrown
//   string becomes the answer `err`). Here a `PolicyError` becomes
//   `err(message)`, and any other exception `err("TypeError: ... (at ...)")`
//   under both engines.
// - QuickJS has no `console`: `console.log` and friends write to the host's
//   log here (`nyann-bench policy check` shows those lines).
//
//   import { exportPolicy, info, spec, when, fmt } from './nyann_policy.js';
//
//   export const policy = exportPolicy({
//     describe() {
//       return info('error-rate', '0.1.0', 'Congested when more than `max_failed` requests failed.')
//         .clientOnly()
//         .param(spec.number('max_failed', 'failed requests per stage').default(10));
//     },
//     judge(params, stage, history) {
//       const limit = params.number('max_failed');
//       const failed = stage.client.requestsFailed;
//       return when(failed >= limit, () => `${failed} requests failed (limit ${fmt(limit)})`);
//     },
//   });

import { log as hostLog } from 'nyann:policy/host@0.5.0';

/** The interface version this SDK builds components for. */
export const INTERFACE_VERSION = '0.5.0';

/** The policy's answer `err(message)`: throw it from `validate` or `judge`
 * (the `Params` readers throw it for a missing or mistyped parameter). */
export class PolicyError extends Error {
  constructor(message) {
    super(message);
    this.name = 'PolicyError';
  }
}

// --- numbers as the Rust SDK's policies print them -------------------------

/** Digits and decimal point of a non-negative finite number, from its
 * shortest round-trip text, without an exponent. */
function plainDigits(text) {
  const [mantissa, exponent] = text.split('e');
  const [whole, fraction = ''] = mantissa.split('.');
  const digits = whole + fraction;
  const point = whole.length + (exponent ? Number(exponent) : 0);
  let w, f;
  if (point <= 0) {
    w = '0';
    f = '0'.repeat(-point) + digits;
  } else if (point >= digits.length) {
    w = digits + '0'.repeat(point - digits.length);
    f = '';
  } else {
    w = digits.slice(0, point);
    f = digits.slice(point);
  }
  w = w.replace(/^0+/, '') || '0';
  f = f.replace(/0+$/, '');
  return f ? `${w}.${f}` : w;
}

/** `x` as Rust's `{}` prints an f64: the shortest text that reads back as
 * `x`, without an exponent (`1`, `1.5`, `0.0000001`). A reason written with
 * it reads as a Rust policy's. */
export function fmt(x) {
  x = Number(x);
  if (Number.isNaN(x)) return 'NaN';
  if (x === Infinity) return 'inf';
  if (x === -Infinity) return '-inf';
  const negative = x < 0 || Object.is(x, -0);
  return (negative ? '-' : '') + plainDigits(String(Math.abs(x)));
}

/** The exact value of a finite double: `mantissa * 2^exponent` (BigInt). */
function exactParts(x) {
  const view = new DataView(new ArrayBuffer(8));
  view.setFloat64(0, Math.abs(x));
  const bits = view.getBigUint64(0);
  const biased = Number((bits >> 52n) & 0x7ffn);
  const fraction = bits & ((1n << 52n) - 1n);
  return biased === 0
    ? [fraction, -1074]
    : [fraction | (1n << 52n), biased - 1075];
}

/** `x` with `places` decimals, as Rust's `{:.N}` prints it: from the exact
 * value, ties to even (`toFixed` rounds ties up). */
export function fixed(x, places) {
  x = Number(x);
  if (!Number.isFinite(x)) return fmt(x);
  const [mantissa, exponent] = exactParts(x);
  const scale = 10n ** BigInt(places);
  let units;
  if (exponent >= 0) {
    units = (mantissa << BigInt(exponent)) * scale;
  } else {
    const denominator = 1n << BigInt(-exponent);
    const numerator = mantissa * scale;
    units = numerator / denominator;
    const twice = 2n * (numerator % denominator);
    if (twice > denominator || (twice === denominator && units % 2n === 1n)) units += 1n;
  }
  const digits = units.toString().padStart(places + 1, '0');
  const whole = digits.slice(0, digits.length - places);
  const fraction = digits.slice(digits.length - places);
  const negative = x < 0 || Object.is(x, -0);
  return (negative ? '-' : '') + whole + (places > 0 ? `.${fraction}` : '');
}

// --- what the host passes, the same under both engines -----------------------

/** Numbers for BigInts, `undefined` for `null`, recursively. */
function plain(value) {
  if (typeof value === 'bigint') return Number(value);
  if (value === null) return undefined;
  if (Array.isArray(value)) return value.map(plain);
  if (typeof value === 'object') {
    const out = {};
    for (const key of Object.keys(value)) out[key] = plain(value[key]);
    return out;
  }
  return value;
}

function showValue(value) {
  switch (value && value.tag) {
    case 'number': return `Number(${fmt(value.val)})`;
    case 'integer': return `Integer(${value.val})`;
    case 'text': return `Text(${JSON.stringify(value.val)})`;
    case 'flag': return `Flag(${value.val})`;
    default: return String(value);
  }
}

/** The parameters of one `until_congested(...)` call, as the host passes
 * them: every described parameter present (defaults filled), durations in
 * seconds. The readers throw `PolicyError` with the Rust SDK's messages. */
export class Params {
  /** `list`: `[{name, value: {tag, val}}]`, as the host passes it. */
  constructor(list = []) {
    this.list = plain(list);
  }

  /** For tests: `Params.of({ ttft_p99: 1.0 }, { consecutive: 2 })`: the
   * first object's values are numbers, texts or flags by their type, the
   * second's integers. */
  static of(values = {}, integers = {}) {
    const tag = (v) => (typeof v === 'boolean' ? 'flag' : typeof v === 'string' ? 'text' : 'number');
    return new Params([
      ...Object.entries(values).map(([name, val]) => ({ name, value: { tag: tag(val), val } })),
      ...Object.entries(integers).map(([name, val]) => ({ name, value: { tag: 'integer', val } })),
    ]);
  }

  /** The raw value of a parameter (`{tag, val}`), or undefined. */
  get(name) {
    const found = this.list.find((p) => p.name === name);
    return found && found.value;
  }

  typed(name, tags, what) {
    const value = this.get(name);
    if (value === undefined) throw new PolicyError(`parameter ${name} is missing`);
    if (!tags.includes(value.tag)) {
      throw new PolicyError(`parameter ${name} must be ${what}, got ${showValue(value)}`);
    }
    return value.val;
  }

  /** A `number`, `fraction` or `duration` parameter (durations in
   * seconds). An `integer` parameter reads as a number too. */
  number(name) { return Number(this.typed(name, ['number', 'integer'], 'a number')); }

  /** An `integer` parameter (a Number: exact up to 2^53). */
  integer(name) { return Number(this.typed(name, ['integer'], 'an integer')); }

  /** A `duration` parameter, in seconds. */
  seconds(name) { return this.number(name); }

  /** A `fraction` parameter (0..1). */
  fraction(name) { return this.number(name); }

  /** A number parameter, or `fallback` when absent. */
  numberOr(name, fallback) { return this.get(name) === undefined ? fallback : this.number(name); }

  /** A `text` parameter. */
  text(name) { return this.typed(name, ['text'], 'text'); }

  /** A `flag` parameter. */
  flag(name) { return Boolean(this.typed(name, ['flag'], 'a flag')); }

  /** A number parameter that must be > 0 (and finite). */
  requirePositive(name) {
    const v = this.number(name);
    if (Number.isFinite(v) && v > 0) return v;
    throw new PolicyError(`${name} must be > 0 (got ${fmt(v)})`);
  }

  /** A number parameter that must be in (0, 1]. */
  requireFractionAboveZero(name) {
    const v = this.number(name);
    if (v > 0 && v <= 1) return v;
    throw new PolicyError(`${name} must be in (0, 1] (got ${fmt(v)})`);
  }

  [Symbol.iterator]() { return this.list[Symbol.iterator](); }
}

// --- the description ---------------------------------------------------------

/** A parameter description under construction (see `spec`). Optional
 * without a default unless told otherwise. */
export class Spec {
  constructor(name, kind, doc) {
    this.name = name;
    this.kind = kind;
    this.doc = doc;
    this.isRequired = false;
    this.defaultValue = undefined;
  }

  /** The scenario must give this parameter. */
  required() {
    this.isRequired = true;
    this.defaultValue = undefined;
    return this;
  }

  /** Its default: a number (seconds for a duration), a whole number for an
   * integer, a string or a boolean, as the kind takes it. */
  default(value) {
    switch (this.kind) {
      case 'integer':
        if (!Number.isInteger(Number(value))) {
          throw new TypeError(`the default of integer parameter ${this.name} must be whole`);
        }
        this.defaultValue = { tag: 'integer', val: Number(value) };
        break;
      case 'text': this.defaultValue = { tag: 'text', val: String(value) }; break;
      case 'flag': this.defaultValue = { tag: 'flag', val: Boolean(value) }; break;
      default: this.defaultValue = { tag: 'number', val: Number(value) };
    }
    this.isRequired = false;
    return this;
  }

  toWit() {
    return {
      name: this.name,
      kind: this.kind,
      required: this.isRequired,
      default: this.defaultValue,
      doc: this.doc,
    };
  }
}

/** Builders of parameter descriptions, e.g.
 * `spec.duration('ttft_p99', 'client TTFT p99 limit').required()`. */
export const spec = {
  /** Any finite number. */
  number: (name, doc) => new Spec(name, 'number', doc),
  /** A whole number; read it with `params.integer`. */
  integer: (name, doc) => new Spec(name, 'integer', doc),
  /** A number in 0..1. */
  fraction: (name, doc) => new Spec(name, 'fraction', doc),
  /** A duration (`"750ms"`, `"2s"`, or seconds); arrives in seconds. */
  duration: (name, doc) => new Spec(name, 'duration', doc),
  /** Free text. */
  text: (name, doc) => new Spec(name, 'text', doc),
  /** A boolean (`True` / `False` in the scenario). */
  flag: (name, doc) => new Spec(name, 'flag', doc),
};

/** A policy's description under construction (see `info`). */
export class Info {
  constructor(name, version, summary) {
    this.name = name;
    this.version = version;
    this.summary = summary;
    this.params = [];
    this.serverSignals = true;
  }

  /** The policy judges the client's figures only: nyann-bench runs it
   * without a signal source (no `--scrape` or `--prometheus-url`). */
  clientOnly() {
    this.serverSignals = false;
    return this;
  }

  /** Add a parameter (see `spec`). */
  param(spec) {
    this.params.push(spec);
    return this;
  }

  toWit() {
    return {
      name: this.name,
      version: this.version,
      summary: this.summary,
      params: this.params.map((p) => (p instanceof Spec ? p.toWit() : p)),
      serverSignals: this.serverSignals,
    };
  }
}

/** Start a description: name, version, one-sentence summary. The policy
 * reads server signals unless `.clientOnly()` says not. */
export function info(name, version, summary) {
  return new Info(name, version, summary);
}

// --- verdicts ---------------------------------------------------------------

/** Not congested. */
export function ok() {
  return { congested: false, reasons: [], fired: [] };
}

/** Congested for the given reasons; not congested when there are none. */
export function fromReasons(reasons) {
  const list = Array.from(reasons, String);
  return { congested: list.length > 0, reasons: list, fired: [] };
}

/** Congested, for these reasons. */
export function congested(...reasons) {
  return { congested: true, reasons: reasons.map(String), fired: [] };
}

/** Congested with one reason when `condition` holds (`reason` may be a
 * function, called only then). */
export function when(condition, reason) {
  if (!condition) return ok();
  return fromReasons([typeof reason === 'function' ? reason() : reason]);
}

/** Say which rule fired, on which role (undefined: client figures) and
 * which figures it compared, named as in the results files
 * (`waiting_requests_p50`, `ttft_p99_seconds`...). Returns the verdict. */
export function fired(verdict, rule, role = undefined, signals = []) {
  verdict.fired.push({ rule, role: role ?? undefined, signals: Array.from(signals, String) });
  return verdict;
}

// --- reading observations -----------------------------------------------------

/** The stage's level: its concurrency, else its rate (undefined: neither). */
export function level(stage) {
  return stage.concurrency ?? stage.rate ?? undefined;
}

/** The stages of `history` at a lower level than `stage`, in level order:
 * for a sweep stage, the sweep's stages before it; for a capacity-search
 * stage (`stage.refines`), the stages it lies above. The last one is the
 * nearest level below, whenever it ran. */
export function below(stage, history) {
  const own = level(stage);
  if (own === undefined) return history.slice();
  return history
    .filter((s) => level(s) !== undefined && level(s) < own)
    .sort((a, b) => level(a) - level(b)); // stable
}

/** Failed requests over all requests of the stage (0 when none were sent). */
export function errorRate(client) {
  const total = client.requestsOk + client.requestsFailed;
  return total === 0 ? 0 : client.requestsFailed / total;
}

/** The share of right answers of an eval stage (undefined before any was
 * scored). */
export function accuracy(counts) {
  if (!counts || counts.answered === 0) return undefined;
  return counts.correct / counts.answered;
}

/** The accuracy's 95% Wilson score interval, `[low, high]`; `[0, 1]` before
 * any answer was scored. */
export function interval95(counts) {
  if (!counts || counts.answered === 0) return [0, 1];
  const z = 1.959963984540054;
  const n = counts.answered;
  const p = counts.correct / n;
  const z2 = z * z;
  const centre = (p + z2 / (2 * n)) / (1 + z2 / n);
  const half = (z * Math.sqrt((p * (1 - p)) / n + z2 / (4 * n * n))) / (1 + z2 / n);
  return [Math.max(centre - half, 0), Math.min(centre + half, 1)];
}

/** The value of a named extra figure of a role, if the source gave it. */
export function extra(role, name) {
  const found = role.extra.find(([n]) => n === name);
  return found ? found[1] : undefined;
}

// --- logging ----------------------------------------------------------------

/** Lines in nyann-bench's log, attributed to the policy (bounded per call;
 * `policy check` shows them). */
export const log = {
  /** Debug-level line (shown with `-v`). */
  debug: (msg) => hostLog('debug', String(msg)),
  /** Info-level line. */
  info: (msg) => hostLog('info', String(msg)),
  /** Warning line. */
  warn: (msg) => hostLog('warn', String(msg)),
};

function show(args) {
  return args
    .map((a) => {
      if (typeof a === 'string') return a;
      try {
        return JSON.stringify(a, (_, v) => (typeof v === 'bigint' ? Number(v) : v));
      } catch (_) {
        return String(a);
      }
    })
    .join(' ');
}

// QuickJS has none; StarlingMonkey's writes to stdout. The same under both:
// the host's log (debug: `console.log`, `console.debug`; info; warn:
// `console.warn`, `console.error`).
try {
  globalThis.console = {
    log: (...args) => log.debug(show(args)),
    debug: (...args) => log.debug(show(args)),
    info: (...args) => log.info(show(args)),
    warn: (...args) => log.warn(show(args)),
    error: (...args) => log.warn(show(args)),
  };
} catch (_) {
  // An engine whose console cannot be replaced keeps its own.
}

// --- the export ---------------------------------------------------------------

/** The message of anything thrown, as the answer `err(message)`: a
 * `PolicyError`'s (or a thrown string) as it is; any other exception with
 * its kind and where it was thrown. */
function errorMessage(e) {
  if (e instanceof PolicyError) return e.message;
  if (typeof e === 'string') return e;
  if (e instanceof Error) {
    const frame = String(e.stack || '')
      .split('\n')
      .map((l) => l.trim())
      .find((l) => l.length > 0);
    return `${e.name}: ${e.message}${frame ? ` (at ${frame.replace(/^at /, '')})` : ''}`;
  }
  return `threw ${show([e])}`;
}

function answer(call) {
  try {
    return call();
  } catch (e) {
    // Both engines make a thrown string the answer `err(string)`.
    throw errorMessage(e);
  }
}

/** What the host may be sent: Numbers, no BigInt; `undefined` for none. */
function outgoing(verdict) {
  return {
    congested: Boolean(verdict.congested),
    reasons: Array.from(verdict.reasons || [], String),
    fired: Array.from(verdict.fired || [], (f) => ({
      rule: String(f.rule),
      role: f.role ?? undefined,
      signals: Array.from(f.signals || [], String),
    })),
  };
}

/** The component's `policy` export for an object (or class instance) with
 * `describe()`, `validate(params)` (optional) and `judge(params, stage,
 * history)`: `export const policy = exportPolicy({...})`. `describe` may
 * return an `Info`; `validate` and `judge` get `Params` and plain stages
 * (Numbers, `undefined` for none); anything thrown is the answer `err`. */
export function exportPolicy(impl) {
  return {
    describe() {
      return answer(() => {
        const described = impl.describe();
        return described instanceof Info ? described.toWit() : described;
      });
    },
    validate(params) {
      answer(() => {
        if (impl.validate) impl.validate(new Params(params));
      });
    },
    judge(params, stage, history) {
      return answer(() =>
        outgoing(impl.judge(new Params(params), plain(stage), plain(history))),
      );
    },
  };
}

// --- observations for tests ---------------------------------------------------

/** Client statistics, all zero but `fields`: for tests. */
export function clientStats(fields = {}) {
  return {
    requestsOk: 0, requestsFailed: 0, requestsPerSecond: 0, outputTokensPerSecond: 0,
    ttftP50Seconds: 0, ttftP99Seconds: 0, itlP50Seconds: 0, itlP99Seconds: 0,
    e2eP50Seconds: 0, e2eP99Seconds: 0, dropped: 0, requestsRejected: 0, requestsLate: 0,
    eval: undefined, slo: undefined, ...fields,
  };
}

/** Stage 0 of sweep 0, unnamed, no roles, zero client statistics, but
 * `fields` (`client` may give some client fields): for tests. */
export function observation(fields = {}) {
  const { client, ...rest } = fields;
  return {
    index: 0, name: '', sweep: { index: 0, name: '' }, concurrency: undefined, rate: undefined,
    startUnixSeconds: 0, endUnixSeconds: 0, roles: [], client: clientStats(client),
    signalErrors: [], refines: undefined, ...rest,
  };
}
