//! Server profiles: what a simulated server can hold (its limits) and how
//! fast it steps (its [`TimeModel`]), built in or read from a TOML file
//! (`sim --profile-file`, written by `sim fit`).
//!
//! A profile file looks like this (times in microseconds):
//!
//! ```toml
//! name = "my-deployment"
//! description = "fitted from results/sweep-1"
//! chat_template_tokens = 16
//! default_max_tokens = 256
//! # disaggregated = true   # serve as --disaggregated does (prefill and decode engines)
//!
//! [limits]
//! max_num_seqs = 16
//! max_num_batched_tokens = 2048
//! kv_blocks = 63
//! block_size = 32
//! max_model_len = 1024
//! # enable_prefix_caching = false   # on when absent, as in vLLM V1
//!
//! [time]
//! step_overhead_us = 2300.0
//! prefill_per_token_us = 30.0
//! decode_per_seq_us = 230.0
//! decode_per_context_token_us = 0.0
//! request_overhead_us = 6000.0
//! jitter = 0.1
//! drift = 0.35
//! drift_time_ms = 500.0
//! # Disaggregated mode (the decode engine's): the KV transfer of a prompt.
//! kv_transfer_us = 1000.0          # the default when absent
//! kv_transfer_per_token_us = 2.0   # the default when absent
//!
//! # Disaggregated mode only: what differs for one engine.
//! [prefill.limits]
//! max_num_batched_tokens = 512
//! ```

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::engine::{DEFAULT_KV_TRANSFER, DEFAULT_KV_TRANSFER_PER_TOKEN, EngineConfig, TimeModel};

/// Microseconds per second, for the file's `_us` fields.
const MICROS: f64 = 1e6;

/// One engine's limits (vLLM's flags of the same names).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Most sequences running at once (`--max-num-seqs`).
    pub max_num_seqs: u32,
    /// Token budget of one step, the chunked-prefill budget (`--max-num-batched-tokens`).
    pub max_num_batched_tokens: u32,
    /// Usable KV-cache blocks (vLLM's `num_gpu_blocks` minus its null block).
    pub kv_blocks: u32,
    /// Tokens per KV block (`--block-size`).
    pub block_size: u32,
    /// Longest prompt + output (`--max-model-len`); the KV capacity when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_model_len: Option<u32>,
    /// Keep the KV blocks of finished requests for later prompts that start
    /// the same way (`--enable-prefix-caching`); on unless set to false, as
    /// in vLLM V1.
    #[serde(default = "on", skip_serializing_if = "is_on")]
    pub enable_prefix_caching: bool,
}

fn on() -> bool {
    true
}

fn is_on(v: &bool) -> bool {
    *v
}

/// The time model as written in a profile file: microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct TimeMicros {
    step_overhead_us: f64,
    prefill_per_token_us: f64,
    decode_per_seq_us: f64,
    #[serde(default)]
    decode_per_context_token_us: f64,
    #[serde(default)]
    request_overhead_us: f64,
    #[serde(default)]
    jitter: f64,
    #[serde(default)]
    drift: f64,
    #[serde(default)]
    drift_time_ms: f64,
    /// Absent from files written before disaggregated mode had a transfer
    /// cost: those read with the defaults.
    #[serde(default = "default_kv_transfer_us")]
    kv_transfer_us: f64,
    #[serde(default = "default_kv_transfer_per_token_us")]
    kv_transfer_per_token_us: f64,
}

fn default_kv_transfer_us() -> f64 {
    DEFAULT_KV_TRANSFER * MICROS
}

fn default_kv_transfer_per_token_us() -> f64 {
    DEFAULT_KV_TRANSFER_PER_TOKEN * MICROS
}

impl From<TimeModel> for TimeMicros {
    fn from(t: TimeModel) -> TimeMicros {
        TimeMicros {
            step_overhead_us: readable(t.step_overhead * MICROS),
            prefill_per_token_us: readable(t.prefill_per_token * MICROS),
            decode_per_seq_us: readable(t.decode_per_seq * MICROS),
            decode_per_context_token_us: readable(t.decode_per_context_token * MICROS),
            request_overhead_us: readable(t.request_overhead * MICROS),
            jitter: t.jitter,
            drift: t.drift,
            drift_time_ms: readable(t.drift_time * 1e3),
            kv_transfer_us: readable(t.kv_transfer * MICROS),
            kv_transfer_per_token_us: readable(t.kv_transfer_per_token * MICROS),
        }
    }
}

/// `v` rounded to 4 significant digits: what a fit can tell, and readable.
fn readable(v: f64) -> f64 {
    if v == 0.0 || !v.is_finite() {
        return v;
    }
    let scale = 10f64.powi(3 - v.abs().log10().floor() as i32);
    (v * scale).round() / scale
}

impl From<TimeMicros> for TimeModel {
    fn from(t: TimeMicros) -> TimeModel {
        TimeModel {
            step_overhead: t.step_overhead_us / MICROS,
            prefill_per_token: t.prefill_per_token_us / MICROS,
            decode_per_seq: t.decode_per_seq_us / MICROS,
            decode_per_context_token: t.decode_per_context_token_us / MICROS,
            request_overhead: t.request_overhead_us / MICROS,
            jitter: t.jitter,
            drift: t.drift,
            drift_time: t.drift_time_ms / 1e3,
            kv_transfer: t.kv_transfer_us / MICROS,
            kv_transfer_per_token: t.kv_transfer_per_token_us / MICROS,
        }
    }
}

/// Limits and time model of one engine.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EngineSpec {
    pub limits: Limits,
    pub time: TimeModel,
}

impl EngineSpec {
    /// The engine's settings, with `seed` for its jitter.
    pub fn config(&self, seed: u64) -> EngineConfig {
        let l = self.limits;
        EngineConfig {
            max_num_seqs: l.max_num_seqs as usize,
            max_num_batched_tokens: l.max_num_batched_tokens,
            kv_blocks: l.kv_blocks,
            block_size: l.block_size,
            max_model_len: l.max_model_len.unwrap_or(u32::MAX),
            prefix_caching: l.enable_prefix_caching,
            time: self.time,
            seed,
        }
    }

    /// Check ranges; the message names the field.
    fn validate(&self, section: &str) -> Result<(), String> {
        let l = &self.limits;
        for (name, v) in [
            ("max_num_seqs", l.max_num_seqs),
            ("max_num_batched_tokens", l.max_num_batched_tokens),
            ("kv_blocks", l.kv_blocks),
            ("block_size", l.block_size),
            ("max_model_len", l.max_model_len.unwrap_or(1)),
        ] {
            if v == 0 {
                return Err(format!("{section}limits.{name} must be at least 1"));
            }
        }
        let t = TimeMicros::from(self.time);
        for (name, v) in [
            ("step_overhead_us", t.step_overhead_us),
            ("prefill_per_token_us", t.prefill_per_token_us),
            ("decode_per_seq_us", t.decode_per_seq_us),
            ("decode_per_context_token_us", t.decode_per_context_token_us),
            ("request_overhead_us", t.request_overhead_us),
            ("kv_transfer_us", t.kv_transfer_us),
            ("kv_transfer_per_token_us", t.kv_transfer_per_token_us),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(format!(
                    "{section}time.{name} must be a number >= 0 (microseconds), got {v}"
                ));
            }
        }
        if t.step_overhead_us + t.prefill_per_token_us + t.decode_per_seq_us <= 0.0 {
            return Err(format!(
                "{section}time: a step must take some time (step_overhead_us, prefill_per_token_us \
                 and decode_per_seq_us are all 0)"
            ));
        }
        if !(0.0..1.0).contains(&t.jitter) {
            return Err(format!(
                "{section}time.jitter must be in [0, 1), got {}",
                t.jitter
            ));
        }
        if !(0.0..=2.0).contains(&t.drift) {
            return Err(format!(
                "{section}time.drift must be in [0, 2], got {}",
                t.drift
            ));
        }
        if t.drift > 0.0 && !(t.drift_time_ms.is_finite() && t.drift_time_ms > 0.0) {
            return Err(format!(
                "{section}time.drift_time_ms must be a positive number of milliseconds when \
                 drift is set, got {}",
                t.drift_time_ms
            ));
        }
        Ok(())
    }
}

/// Which engine of a server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Aggregate,
    Prefill,
    Decode,
}

/// A simulated server.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerProfile {
    pub name: String,
    pub description: String,
    /// Tokens the chat template adds to every chat prompt (counted in
    /// `usage.prompt_tokens` and in the KV cache, as on a real server).
    pub chat_template_tokens: u32,
    /// Output tokens of a request that gives no `max_tokens`.
    pub default_max_tokens: u32,
    /// The engine of the aggregate mode, and the base of both roles.
    pub engine: EngineSpec,
    /// Disaggregated mode: the prefill engine, when it differs.
    pub prefill: Option<EngineSpec>,
    /// Disaggregated mode: the decode engine, when it differs.
    pub decode: Option<EngineSpec>,
    /// Serve in disaggregated mode without `--disaggregated` (a profile
    /// `sim fit` fitted to a prefill/decode deployment).
    pub disaggregated: bool,
}

/// Why a profile file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    // The OS error is the source, printed after the message by whoever
    // prints the chain (`{:#}`): naming it here too printed it twice.
    #[error("cannot read profile file {path}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("profile file {path}: {message}")]
    Invalid { path: String, message: String },
}

/// Keys of the file's top level.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileTop {
    name: String,
    #[serde(default)]
    description: String,
    #[serde(default)]
    chat_template_tokens: u32,
    #[serde(default = "default_max_tokens")]
    default_max_tokens: u32,
    #[serde(default)]
    disaggregated: bool,
    limits: toml::Table,
    time: toml::Table,
    #[serde(default)]
    prefill: Option<RoleTables>,
    #[serde(default)]
    decode: Option<RoleTables>,
}

/// A role section: the keys that differ from the top-level engine.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RoleTables {
    #[serde(default)]
    limits: toml::Table,
    #[serde(default)]
    time: toml::Table,
}

fn default_max_tokens() -> u32 {
    256
}

/// `base` with the keys of `over` replaced.
fn merged(base: &toml::Table, over: &toml::Table) -> toml::Table {
    let mut out = base.clone();
    for (k, v) in over {
        out.insert(k.clone(), v.clone());
    }
    out
}

/// The keys of `full` whose values differ from `base`.
fn difference(full: toml::Table, base: &toml::Table) -> toml::Table {
    full.into_iter()
        .filter(|(k, v)| base.get(k) != Some(v))
        .collect()
}

/// One engine from its `[limits]` and `[time]` tables; `section` is the
/// role's prefix in error messages (`"prefill."`, or `""`).
fn engine_from(
    limits: toml::Table,
    time: toml::Table,
    section: &str,
) -> Result<EngineSpec, String> {
    let limits: Limits = toml::Value::Table(limits)
        .try_into()
        .map_err(|e: toml::de::Error| format!("[{section}limits]: {}", e.message()))?;
    let time: TimeMicros = toml::Value::Table(time)
        .try_into()
        .map_err(|e: toml::de::Error| format!("[{section}time]: {}", e.message()))?;
    Ok(EngineSpec {
        limits,
        time: time.into(),
    })
}

fn tables_of(spec: &EngineSpec) -> (toml::Table, toml::Table) {
    let table = |v: Result<toml::Value, toml::ser::Error>| match v {
        Ok(toml::Value::Table(t)) => t,
        _ => toml::Table::new(),
    };
    (
        table(toml::Value::try_from(spec.limits)),
        table(toml::Value::try_from(TimeMicros::from(spec.time))),
    )
}

impl ServerProfile {
    /// The engine of `role` (a role without its own section uses the main one).
    pub fn engine(&self, role: Role) -> EngineSpec {
        match role {
            Role::Aggregate => self.engine,
            Role::Prefill => self.prefill.unwrap_or(self.engine),
            Role::Decode => self.decode.unwrap_or(self.engine),
        }
    }

    /// Check every engine's ranges.
    pub fn validate(&self) -> Result<(), String> {
        self.engine.validate("")?;
        if let Some(p) = &self.prefill {
            p.validate("prefill.")?;
        }
        if let Some(d) = &self.decode {
            d.validate("decode.")?;
        }
        if self.default_max_tokens == 0 {
            return Err("default_max_tokens must be at least 1".into());
        }
        Ok(())
    }

    /// Parse a profile file's text; `path` names it in errors.
    pub fn from_toml(text: &str, path: &str) -> Result<ServerProfile, ProfileError> {
        let invalid = |message: String| ProfileError::Invalid {
            path: path.to_string(),
            message,
        };
        let top: FileTop = toml::from_str(text).map_err(|e| invalid(e.to_string()))?;
        let role = |tables: Option<RoleTables>, section: &str| {
            tables
                .map(|r| {
                    let limits = merged(&top.limits, &r.limits);
                    engine_from(limits, merged(&top.time, &r.time), section).map_err(invalid)
                })
                .transpose()
        };
        let profile = ServerProfile {
            engine: engine_from(top.limits.clone(), top.time.clone(), "").map_err(invalid)?,
            prefill: role(top.prefill, "prefill.")?,
            decode: role(top.decode, "decode.")?,
            name: top.name,
            description: top.description,
            chat_template_tokens: top.chat_template_tokens,
            default_max_tokens: top.default_max_tokens,
            disaggregated: top.disaggregated,
        };
        profile.validate().map_err(invalid)?;
        Ok(profile)
    }

    /// Read and check a profile file.
    pub fn read(path: &Path) -> Result<ServerProfile, ProfileError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ProfileError::Read {
            path: shown.clone(),
            source,
        })?;
        ServerProfile::from_toml(&text, &shown)
    }

    /// The profile as a file (`# comment` lines first, if any).
    pub fn to_toml(&self, comment: &str) -> String {
        let mut doc = toml::Table::new();
        doc.insert("name".into(), self.name.clone().into());
        if !self.description.is_empty() {
            doc.insert("description".into(), self.description.clone().into());
        }
        doc.insert(
            "chat_template_tokens".into(),
            i64::from(self.chat_template_tokens).into(),
        );
        doc.insert(
            "default_max_tokens".into(),
            i64::from(self.default_max_tokens).into(),
        );
        if self.disaggregated {
            doc.insert("disaggregated".into(), true.into());
        }
        let (limits, time) = tables_of(&self.engine);
        doc.insert("limits".into(), limits.clone().into());
        doc.insert("time".into(), time.clone().into());
        for (key, role) in [("prefill", &self.prefill), ("decode", &self.decode)] {
            if let Some(spec) = role {
                let (l, t) = tables_of(spec);
                let mut section = toml::Table::new();
                for (name, table) in [
                    ("limits", difference(l, &limits)),
                    ("time", difference(t, &time)),
                ] {
                    if !table.is_empty() {
                        section.insert(name.into(), table.into());
                    }
                }
                doc.insert(key.into(), section.into());
            }
        }
        let mut out = String::new();
        for line in comment.lines() {
            out.push_str("# ");
            out.push_str(line);
            out.push('\n');
        }
        out.push_str(&toml::to_string(&doc).unwrap_or_default());
        out
    }
}

/// Time model constants of the built-in profiles, in microseconds.
fn micros(step_overhead: f64, prefill_per_token: f64, decode_per_seq: f64) -> TimeModel {
    TimeModel {
        step_overhead: step_overhead / MICROS,
        prefill_per_token: prefill_per_token / MICROS,
        decode_per_seq: decode_per_seq / MICROS,
        decode_per_context_token: 0.0,
        request_overhead: 0.0,
        jitter: 0.1,
        drift: 0.0,
        drift_time: 0.0,
        kv_transfer: DEFAULT_KV_TRANSFER,
        kv_transfer_per_token: DEFAULT_KV_TRANSFER_PER_TOKEN,
    }
}

impl ServerProfile {
    /// `--profile default`: a small GPU deployment scaled to run fast. In
    /// disaggregated mode each engine's KV cache is sized for its job, as
    /// in P/D deployments: the prefill engine's holds the prompts in flight
    /// (512 blocks), the decode engine's many running sequences (4096), so
    /// under long prompts the prefill engine's token budget is what queues.
    pub fn default_profile() -> ServerProfile {
        let engine = EngineSpec {
            limits: Limits {
                max_num_seqs: 16,
                max_num_batched_tokens: 2048,
                kv_blocks: 224,
                block_size: 16,
                max_model_len: None,
                enable_prefix_caching: true,
            },
            time: micros(1200.0, 20.0, 120.0),
        };
        ServerProfile {
            name: "default".into(),
            description: "a small GPU deployment scaled to run fast".into(),
            chat_template_tokens: 0,
            default_max_tokens: 256,
            engine,
            prefill: Some(EngineSpec {
                limits: Limits {
                    kv_blocks: 512,
                    ..engine.limits
                },
                ..engine
            }),
            decode: Some(EngineSpec {
                limits: Limits {
                    kv_blocks: 4096,
                    ..engine.limits
                },
                ..engine
            }),
            disaggregated: false,
        }
    }

    /// `--profile vllm-cpu-ref`: the twin of a recorded vLLM 0.32 (CPU build,
    /// tiny random Llama, 2 shared cores).
    pub fn vllm_cpu_ref() -> ServerProfile {
        ServerProfile {
            name: "vllm-cpu-ref".into(),
            description: "vLLM 0.32 CPU build, tiny model, 2 cores: --max-num-seqs 16 \
                          --block-size 32 --num-gpu-blocks-override 64 --max-model-len 1024"
                .into(),
            chat_template_tokens: 16,
            default_max_tokens: 256,
            engine: EngineSpec {
                limits: Limits {
                    max_num_seqs: 16,
                    max_num_batched_tokens: 2048,
                    kv_blocks: 63,
                    block_size: 32,
                    max_model_len: Some(1024),
                    enable_prefix_caching: true,
                },
                // Fitted to `crate::reference` (examples/fit-reference.rs).
                time: TimeModel {
                    request_overhead: 2690.0 / MICROS,
                    drift: 0.35,
                    drift_time: 0.5,
                    ..micros(2544.0, 39.9, 208.9)
                },
            },
            prefill: None,
            decode: None,
            disaggregated: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The error chain as the binary prints it (`{:#}`).
    fn chain(err: &dyn std::error::Error) -> String {
        let mut text = err.to_string();
        let mut source = err.source();
        while let Some(cause) = source {
            text = format!("{text}: {cause}");
            source = cause.source();
        }
        text
    }

    #[test]
    fn an_unreadable_file_names_the_os_error_once() {
        let err = ServerProfile::read(Path::new("/nonexistent/profile.toml")).unwrap_err();
        let text = chain(&err);
        assert_eq!(text.matches("os error").count(), 1, "{text}");
        assert!(text.starts_with("cannot read profile file /nonexistent/profile.toml: "));
    }

    #[test]
    fn built_in_profiles_survive_their_file() {
        for profile in [
            ServerProfile::default_profile(),
            ServerProfile::vllm_cpu_ref(),
        ] {
            let text = profile.to_toml("a comment\nof two lines");
            assert!(
                text.starts_with("# a comment\n# of two lines\nname = "),
                "{text}"
            );
            let back = ServerProfile::from_toml(&text, "f.toml").unwrap();
            assert_eq!(back, profile, "{text}");
        }
    }

    #[test]
    fn a_role_section_is_written_and_read_as_its_differences() {
        let text = ServerProfile::default_profile().to_toml("");
        assert!(
            text.ends_with(
                "[prefill.limits]\nkv_blocks = 512\n\n[decode.limits]\nkv_blocks = 4096\n"
            ),
            "{text}"
        );
        let profile = ServerProfile::from_toml(&text, "f.toml").unwrap();
        assert_eq!(profile.engine(Role::Prefill).limits.kv_blocks, 512);
        assert_eq!(profile.engine(Role::Decode).limits.kv_blocks, 4096);
        assert_eq!(profile.engine(Role::Decode).limits.block_size, 16);
    }

    #[test]
    fn a_disaggregated_profile_says_so_in_its_file() {
        let profile = ServerProfile {
            disaggregated: true,
            ..ServerProfile::default_profile()
        };
        let text = profile.to_toml("");
        assert!(text.contains("\ndisaggregated = true\n"), "{text}");
        assert_eq!(ServerProfile::from_toml(&text, "f.toml").unwrap(), profile);
        let aggregate = ServerProfile::default_profile().to_toml("");
        assert!(!aggregate.contains("disaggregated"), "{aggregate}");
    }

    #[test]
    fn mistakes_name_the_file_and_the_field() {
        let base = ServerProfile::vllm_cpu_ref().to_toml("");
        let err = |text: &str| {
            ServerProfile::from_toml(text, "p.toml")
                .unwrap_err()
                .to_string()
        };
        let e = err(&base.replace("jitter = 0.1", "jitter = 1.5"));
        assert!(
            e.starts_with("profile file p.toml: time.jitter must be in [0, 1)"),
            "{e}"
        );
        let e = err(&base.replace("kv_blocks = 63", "kv_blocks = \"many\""));
        assert!(e.contains("p.toml") && e.contains("[limits]"), "{e}");
        let e = err(&base.replace("drift_time_ms = 500.0", "drift_time_ms = 0.0"));
        assert!(
            e.contains("time.drift_time_ms must be a positive number"),
            "{e}"
        );
        let e = err("name = \"x\"\n[limits]\n");
        assert!(e.contains("missing field `time`"), "{e}");
    }

    #[test]
    fn a_file_without_the_kv_transfer_reads_with_its_defaults() {
        let base = ServerProfile::default_profile().to_toml("");
        assert!(base.contains("kv_transfer_us = 1000.0\n"), "{base}");
        assert!(base.contains("kv_transfer_per_token_us = 2.0\n"), "{base}");
        let old: String = base
            .lines()
            .filter(|l| !l.starts_with("kv_transfer"))
            .map(|l| format!("{l}\n"))
            .collect();
        let profile = ServerProfile::from_toml(&old, "old.toml").unwrap();
        assert_eq!(profile, ServerProfile::default_profile());
        let decode = profile.engine(Role::Decode).time;
        assert!((decode.kv_transfer_seconds(1000) - 0.003).abs() < 1e-12);

        // A role section may set its own; out of range is refused by name.
        let own = format!("{old}[decode.time]\nkv_transfer_per_token_us = 5.0\n");
        let profile = ServerProfile::from_toml(&own, "own.toml").unwrap();
        assert!((profile.engine(Role::Decode).time.kv_transfer_per_token - 5e-6).abs() < 1e-15);
        assert_eq!(
            profile.engine(Role::Prefill).time.kv_transfer_per_token,
            DEFAULT_KV_TRANSFER_PER_TOKEN
        );
        let e = ServerProfile::from_toml(
            &base.replace("kv_transfer_us = 1000.0", "kv_transfer_us = -1.0"),
            "p.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("p.toml") && e.contains("time.kv_transfer_us must be a number >= 0"),
            "{e}"
        );
    }

    #[test]
    fn values_are_written_with_four_significant_digits() {
        assert_eq!(readable(2529.5295950027657), 2530.0);
        assert_eq!(readable(0.49943), 0.4994);
        assert_eq!(readable(0.0), 0.0);
    }
}
