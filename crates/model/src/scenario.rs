//! The scenario IR: what `scenario.star` compiles to.
//!
//! Units: every duration is in seconds (`f64`), in fields whose names end in
//! `_s`. The JSON form is strict (unknown fields are rejected) so that a typo
//! in a hand-written IR file is an error, not a silently ignored setting.

use serde::{Deserialize, Serialize};

/// A whole run: defaults and the ordered steps (stages and barriers).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Default OpenAI base URL (e.g. `http://localhost:8000/v1`); `--target` wins.
    #[serde(default)]
    pub target: Option<String>,
    /// Default model name; `--model` wins; absent means auto-detect.
    #[serde(default)]
    pub model: Option<String>,
    /// Workload for stages that do not name their own.
    pub workload: Workload,
    pub steps: Vec<Step>,
}

impl Scenario {
    /// Whether a sweep searches its capacity after it stops (`refine=`).
    pub fn searches_capacity(&self) -> bool {
        self.steps.iter().any(|step| match step {
            Step::Stage(stage) => stage.stop.as_ref().is_some_and(|s| s.search.is_some()),
            Step::Barrier { .. } => false,
        })
    }
}

/// One entry of the run, in order.
// A scenario holds at most 10,000 steps: boxing `Stage` would save little
// memory and cost every producer and consumer a layer of indirection.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Step {
    Stage(Stage),
    /// Synchronisation point; with `drain`, wait until no request is in flight.
    Barrier {
        drain: bool,
    },
}

/// How a stage sends its requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// `concurrency` closed-loop streams.
    Concurrent,
    /// Open loop, evenly spaced arrivals at `rate` per second.
    Constant,
    /// Open loop, Poisson arrivals at `rate` per second.
    Poisson,
    /// A pool of multi-turn conversations.
    ConversationPool,
}

/// A timed period of load.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Stage {
    #[serde(default)]
    pub name: Option<String>,
    pub duration_s: f64,
    pub mode: Mode,
    /// Closed-loop streams (concurrent and conversation-pool modes); `None` in rate modes.
    #[serde(default)]
    pub concurrency: Option<u32>,
    /// Arrivals per second (constant and poisson modes).
    #[serde(default)]
    pub rate: Option<f64>,
    /// Open-loop cap on requests in flight; 0 = no cap. Arrivals over the cap are dropped.
    #[serde(default)]
    pub max_inflight: u32,
    /// End the stage early once this many requests were sent; 0 = no limit.
    #[serde(default)]
    pub max_requests: u64,
    /// Ramp from zero to the stage's level over this many seconds.
    #[serde(default)]
    pub rampup_s: Option<f64>,
    /// Overrides of the scenario-wide settings.
    #[serde(default)]
    pub workload: Option<Workload>,
    #[serde(default)]
    pub target: Option<String>,
    #[serde(default)]
    pub model: Option<String>,
    /// Sends load but is excluded from statistics and never judged.
    #[serde(default)]
    pub warmup: bool,
    #[serde(default)]
    pub conversation_pool_size: u32,
    /// Set by `until_congested(...)`: judge this stage when it ends.
    #[serde(default)]
    pub stop: Option<StopCondition>,
    /// Set by `until_congested(...)` with `stop`: which sweep the stage
    /// belongs to (one per call, numbered from 0 in the order of the
    /// calls). A sweep's policy history is its own, and its stop skips only
    /// the rest of that sweep.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub sweep: u32,
    /// The latency goals its requests are judged by (`slo=` of the stage,
    /// else of the scenario): each record says whether it met them, and the
    /// stage's statistics say its goodput.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slo: Option<crate::slo::Slo>,
    /// Where `stage(...)` was called, for error messages.
    #[serde(default)]
    pub location: Option<SourceLocation>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// The parameters of one `until_congested(...)` call, as written (in order).
/// The active congestion policy checks them (describe/validate).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StopCondition {
    pub params: Vec<Param>,
    /// Where `until_congested(...)` was called, for error messages.
    #[serde(default)]
    pub location: Option<SourceLocation>,
    /// Where each parameter's keyword is written, in the order of `params`
    /// (empty when unknown: `**kwargs`, or an IR file written without them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub param_locations: Vec<Option<SourceLocation>>,
    /// `refine=N` of `until_congested(...)` (a keyword of the call, never a
    /// policy parameter): the capacity search after the sweep stops.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub search: Option<CapacitySearch>,
}

/// The capacity search after a sweep stops: more stages between the last
/// level judged not congested and the first judged congested (halving
/// downwards when the first stage was congested), each shaped like the
/// congested stage and judged by the same policy.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CapacitySearch {
    /// Most search stages (`refine=N`).
    pub stages: u32,
    /// The search ends when the two bounds are this close (`resolution=`):
    /// in streams for a concurrency sweep (default 1: adjacent levels), in
    /// requests/s for a rate sweep (default 5% of the congested rate).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolution: Option<f64>,
    /// A level whose verdict was a close call is judged up to this many
    /// more times before the search moves on (`confirm=`; 0: never).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub confirm: u32,
}

impl StopCondition {
    /// Where parameter `name` is written, else where the call is.
    pub fn location_of(&self, name: &str) -> Option<&SourceLocation> {
        self.params
            .iter()
            .position(|p| p.name == name)
            .and_then(|i| self.param_locations.get(i))
            .and_then(Option::as_ref)
            .or(self.location.as_ref())
    }
}

/// A named parameter value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Param {
    pub name: String,
    pub value: Value,
}

/// A typed parameter value. Durations stay text (`"2s"`) in the IR; the
/// policy host converts them to seconds using the policy's parameter kinds.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
#[serde(untagged)]
pub enum Value {
    Flag(bool),
    Number(f64),
    /// Only made by the policy host, for a parameter of kind `integer`: the
    /// scenario writes numbers (and an integer reads back as a number).
    Integer(i64),
    Text(String),
}

/// By hand rather than `#[serde(untagged)]`: the `starlark` crate turns on
/// serde_json's `arbitrary_precision` feature for the whole build, and with
/// it serde_json hands a non-integer number to an untagged enum as a
/// one-entry map, which the derived impl refuses.
impl<'de> Deserialize<'de> for Value {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::{Error, MapAccess, Unexpected, Visitor};
        struct ValueVisitor;
        impl<'de> Visitor<'de> for ValueVisitor {
            type Value = Value;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a number, a string or a bool")
            }
            fn visit_bool<E: Error>(self, b: bool) -> Result<Value, E> {
                Ok(Value::Flag(b))
            }
            fn visit_i64<E: Error>(self, n: i64) -> Result<Value, E> {
                Ok(Value::Number(n as f64))
            }
            fn visit_u64<E: Error>(self, n: u64) -> Result<Value, E> {
                Ok(Value::Number(n as f64))
            }
            fn visit_f64<E: Error>(self, n: f64) -> Result<Value, E> {
                Ok(Value::Number(n))
            }
            fn visit_str<E: Error>(self, s: &str) -> Result<Value, E> {
                Ok(Value::Text(s.to_owned()))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
                // serde_json's arbitrary_precision form of a number.
                match map.next_entry::<String, String>()? {
                    Some((key, text)) if key == "$serde_json::private::Number" => text
                        .parse()
                        .map(Value::Number)
                        .map_err(|_| A::Error::invalid_value(Unexpected::Str(&text), &self)),
                    _ => Err(A::Error::invalid_type(Unexpected::Map, &self)),
                }
            }
        }
        d.deserialize_any(ValueVisitor)
    }
}

/// File, line and column (1-based) of a call in a scenario file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceLocation {
    pub file: String,
    pub line: u32,
    pub column: u32,
}

impl std::fmt::Display for SourceLocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}:{}", self.file, self.line, self.column)
    }
}

/// What the prompts look like.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Workload {
    #[serde(rename = "type")]
    pub kind: WorkloadType,
    /// Input (prompt) length in tokens.
    pub isl: u32,
    /// Output length in tokens.
    pub osl: u32,
    pub turns: u32,
    /// Prompt length of turns after the first; `None` = `isl`.
    #[serde(default)]
    pub subsequent_isl: Option<u32>,
    #[serde(default)]
    pub corpus_path: Option<String>,
    /// Characters per token when the server has no `/tokenize`; 0 = calibrate or 4.0.
    #[serde(default)]
    pub chars_per_token: f64,
    #[serde(default)]
    pub cache_salt: Option<CacheSalt>,
    #[serde(default)]
    pub name: Option<String>,
    /// A dataset's file (`gsm8k`, `gpqa`, `sharegpt`); a relative path is
    /// taken from the scenario file's folder when the scenario is loaded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// GSM8K's train file, where few-shot examples come from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub train_path: Option<String>,
    /// GSM8K: worked examples (from `train_path`) before each question.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub fewshot: u32,
    /// ShareGPT: most input tokens of a turn (its prompt, after the
    /// conversation so far); longer ones are left out. 0: no limit.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub max_isl: u32,
    /// ShareGPT: most tokens of a recorded reply; longer ones are left
    /// out. 0: no limit.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub max_osl: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkloadType {
    Synthetic,
    Faker,
    Corpus,
    /// GSM8K's questions, each answered and scored.
    Gsm8k,
    /// GPQA's four-choice questions, each answered and scored.
    Gpqa,
    /// ShareGPT's recorded conversations replayed: the human turns as
    /// prompts, each asking for a reply as long as the recorded one.
    #[serde(rename = "sharegpt")]
    ShareGpt,
}

impl WorkloadType {
    /// As scenarios write it: `workload("gsm8k", ...)`.
    pub fn name(self) -> &'static str {
        match self {
            WorkloadType::Synthetic => "synthetic",
            WorkloadType::Faker => "faker",
            WorkloadType::Corpus => "corpus",
            WorkloadType::Gsm8k => "gsm8k",
            WorkloadType::Gpqa => "gpqa",
            WorkloadType::ShareGpt => "sharegpt",
        }
    }

    /// An eval dataset: its requests are scored.
    pub fn is_eval(self) -> bool {
        matches!(self, WorkloadType::Gsm8k | WorkloadType::Gpqa)
    }

    /// Its prompts come from a dataset file (`path`).
    pub fn reads_dataset(self) -> bool {
        self.is_eval() || self == WorkloadType::ShareGpt
    }
}

/// Prefix-cache salt: a fresh random salt per conversation, or a fixed one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum CacheSalt {
    Random,
    Fixed(String),
}

impl Default for Workload {
    /// The scenario-wide default: `faker`, isl 128, osl 256, one turn.
    fn default() -> Self {
        Workload {
            kind: WorkloadType::Faker,
            isl: 128,
            osl: 256,
            turns: 1,
            subsequent_isl: None,
            corpus_path: None,
            chars_per_token: 0.0,
            cache_salt: None,
            name: None,
            path: None,
            train_path: None,
            fewshot: 0,
            max_isl: 0,
            max_osl: 0,
        }
    }
}

impl Stage {
    /// A stage with only its duration and mode: no level (set `concurrency`
    /// or `rate`), no limits, no overrides, not a warm-up, no stop condition.
    pub fn new(duration_s: f64, mode: Mode) -> Stage {
        Stage {
            name: None,
            duration_s,
            mode,
            concurrency: None,
            rate: None,
            max_inflight: 0,
            max_requests: 0,
            rampup_s: None,
            workload: None,
            target: None,
            model: None,
            warmup: false,
            conversation_pool_size: 0,
            stop: None,
            slo: None,
            sweep: 0,
            location: None,
        }
    }

    /// The sweep the stage belongs to: `None` outside `until_congested(...)`.
    pub fn sweep(&self) -> Option<u32> {
        self.stop.as_ref().map(|_| self.sweep)
    }

    /// The stage's label in tables and logs: its name, else `c=N` / `rate=R`.
    pub fn label(&self, index: usize) -> String {
        if let Some(name) = &self.name {
            return name.clone();
        }
        match (self.concurrency, self.rate) {
            (_, Some(rate)) => format!("#{index} rate={rate}"),
            (Some(c), None) => format!("#{index} c={c}"),
            (None, None) => format!("#{index}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip_as_plain_json() {
        let params = vec![
            Param {
                name: "waiting_requests_p50".into(),
                value: Value::Number(32.0),
            },
            Param {
                name: "ttft_p99".into(),
                value: Value::Text("2s".into()),
            },
            Param {
                name: "strict".into(),
                value: Value::Flag(true),
            },
        ];
        let json = serde_json::to_string(&params).unwrap();
        assert_eq!(
            json,
            r#"[{"name":"waiting_requests_p50","value":32.0},{"name":"ttft_p99","value":"2s"},{"name":"strict","value":true}]"#
        );
        let back: Vec<Param> = serde_json::from_str(&json).unwrap();
        assert_eq!(back, params);
    }

    #[test]
    fn unknown_fields_are_rejected() {
        let err = serde_json::from_str::<Workload>(
            r#"{"type":"faker","isl":1,"osl":1,"turns":1,"typo":1}"#,
        )
        .unwrap_err();
        assert!(err.to_string().contains("unknown field `typo`"), "{err}");
    }
}

/// The dev-dependency on serde_json enables `arbitrary_precision`, as
/// starlark does in every build that includes the scenario compiler.
#[cfg(test)]
mod arbitrary_precision_tests {
    use super::*;

    #[test]
    fn floats_inside_steps_and_values_parse_with_arbitrary_precision() {
        let json = r#"{"workload":{"type":"faker","isl":1,"osl":1,"turns":1},"steps":[{"stage":{"duration_s":1.5,"mode":"poisson","rate":0.950,"stop":{"params":[{"name":"a","value":0.95},{"name":"b","value":"2s"},{"name":"c","value":true},{"name":"d","value":3}]}}},{"barrier":{"drain":true}}]}"#;
        let s: Scenario = serde_json::from_str(json).unwrap();
        let back: Scenario = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(s, back);
        let Step::Stage(st) = &s.steps[0] else {
            panic!()
        };
        assert_eq!((st.duration_s, st.rate), (1.5, Some(0.95)));
        assert_eq!(
            st.stop.as_ref().unwrap().params[0].value,
            Value::Number(0.95)
        );
        assert!(serde_json::from_str::<Value>("[1]").is_err());
    }
}
