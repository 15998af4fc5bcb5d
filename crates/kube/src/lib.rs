//! `nyann-bench kube render`: the manifests of a scale-out run, built from
//! typed Kubernetes objects.
//!
//! - a ConfigMap carrying the compiled scenario (`scenario.json`) and, when
//!   given as a file, the policy component (`policy.wasm`); a policy in a
//!   registry is an image volume instead, or pulled by the leader
//!   ([`PolicyDelivery`]);
//! - a headless Service, so that every worker finds pod 0 (the leader) at
//!   `NAME-0.NAME:PORT`;
//! - an Indexed Job of N pods (parallelism = completions = N) running the
//!   same `generate --workers N` command; Kubernetes sets each pod's
//!   `JOB_COMPLETION_INDEX`, which is its worker index.
//!
//! Failures are counted per index (`backoffLimitPerIndex: 0`), never for
//! the whole Job at once: a failed pod is not restarted (a sweep cannot be
//! rejoined half-way), and one worker's failure does not make Kubernetes
//! kill the others, the leader above all, which goes on without it or
//! aborts the run, as its loss policy says, and writes its results either
//! way. The Job ends `Failed` (naming the failed indexes) once every pod
//! has ended, `Complete` when all exited 0.
//!
//! Pods run as the image's user (65532) with that group owning the results
//! volume (`fsGroup`), so that a claimed volume is writable.
//!
//! The objects print as a JSON `List` or as multi-document YAML
//! ([`to_yaml`]), whose strings are always quoted (no YAML 1.1 surprises
//! such as `no` or `1.0` read as something else).
//!
//! [`render_service`] renders the run service itself (`serve`, which
//! starts such runs): its Deployment, access, files and network boundary.

mod policy;
mod serve;

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    ConfigMap, ConfigMapVolumeSource, Container, ContainerPort, PersistentVolumeClaimVolumeSource,
    PodSecurityContext, PodSpec, PodTemplateSpec, ResourceRequirements, Service, ServicePort,
    ServiceSpec, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use nyann_model::Scenario;

pub use policy::{POLICY_DIR, POLICY_FILE, PolicyDelivery};
pub use serve::{
    ConfigFile, DATA_DIR, DEFAULT_RESULTS_SIZE, Field, ROLE_RULES, ResultsClaim, SERVICE_PORT,
    ServiceConfig, ServiceManifests, TARGETS_DIR, TOKENS_DIR, render_service,
};

/// Where the ConfigMap is mounted in every pod.
pub const CONFIG_DIR: &str = "/etc/nyann-bench";
/// Where results are written in every pod.
pub const RESULTS_DIR: &str = "/results";
/// ConfigMaps hold at most 1 MiB.
const CONFIG_MAP_LIMIT: usize = 1 << 20;
/// The user and group the image runs as (the Containerfile's).
pub const IMAGE_USER: i64 = 65532;

/// The `generate` options the rendered command sets itself (long names
/// without dashes): given again after `--`, they would contradict it.
pub const RENDERED_OPTIONS: &[&str] = &[
    "config",
    "workers",
    "worker-index",
    "coordinator",
    "coordinator-listen",
    "output-dir",
];

/// What to render.
#[derive(Debug, Clone)]
pub struct RenderConfig {
    /// Name of the Job, Service and ConfigMap.
    pub name: String,
    pub namespace: Option<String>,
    pub image: String,
    pub workers: usize,
    pub port: u16,
    pub scenario: Scenario,
    /// The policy, if not the built-in, and how the pods get it.
    pub policy: Option<PolicyDelivery>,
    /// More `generate` flags for every worker (target, signals, ...).
    pub generate_args: Vec<String>,
    /// CPU and memory, as requests and limits (`"2"`, `"4Gi"`).
    pub cpu: Option<String>,
    pub memory: Option<String>,
    /// A PersistentVolumeClaim for the results (else an emptyDir: the
    /// results leave with the pod).
    pub results_claim: Option<String>,
    /// The run's directory under the results volume (a run service keeps
    /// each run in one); else the volume's top.
    pub results_subdir: Option<String>,
    /// Seconds a deleted pod gets to drain and write its records (its
    /// termination grace period); else Kubernetes' default (30).
    pub drain_grace_s: Option<i64>,
}

#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error("a run needs at least 1 worker, not {0}")]
    TooFewWorkers(usize),
    #[error(
        "the scenario and policy take {0} bytes, more than a ConfigMap's 1 MiB: ship the policy \
         through a registry instead (`nyann-bench policy push`, then --policy \
         oci://REGISTRY/REPO@sha256:...)"
    )]
    TooLarge(usize),
    #[error(
        "the name {0:?} is not a valid Kubernetes name: use lowercase letters, digits and '-', starting with a letter, at most 50 characters"
    )]
    Name(String),
    #[error(
        "the option --{0} is set by the rendered command itself; leave it out of the flags for every worker"
    )]
    Rendered(String),
    /// A value of a [`ServiceConfig`] the API server would refuse.
    #[error("{field} {value:?} is not valid: {rule}")]
    Invalid {
        field: Field,
        value: String,
        rule: &'static str,
    },
    /// A file too large for its ConfigMap or Secret.
    #[error(
        "{field} takes {bytes} bytes, more than a ConfigMap's or Secret's 1 MiB: keep fewer entries in it"
    )]
    FileTooLarge { field: Field, bytes: usize },
}

/// The three objects, in the order they are applied.
#[derive(Debug, Clone, PartialEq)]
pub struct Manifests {
    pub config_map: ConfigMap,
    pub service: Service,
    pub job: Job,
}

impl Manifests {
    /// The objects as JSON, in the order they are applied.
    pub fn objects(&self) -> Vec<serde_json::Value> {
        vec![
            serde_json::to_value(&self.config_map).unwrap_or_default(),
            serde_json::to_value(&self.service).unwrap_or_default(),
            serde_json::to_value(&self.job).unwrap_or_default(),
        ]
    }

    /// A `v1` `List` of the objects, for `kubectl apply -f -`.
    pub fn to_list(&self) -> serde_json::Value {
        serde_json::json!({
            "apiVersion": "v1",
            "kind": "List",
            "items": self.objects(),
        })
    }

    /// The objects as multi-document YAML.
    pub fn to_yaml(&self) -> String {
        to_yaml(&self.objects())
    }
}

fn valid_name(name: &str) -> bool {
    // Pod hostnames are NAME-INDEX: leave room within the 63-character label limit.
    !name.is_empty()
        && name.len() <= 50
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && !name.ends_with('-')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

pub fn render(config: &RenderConfig) -> Result<Manifests, RenderError> {
    let scenario_json = checked_scenario(config)?;
    let labels = BTreeMap::from([
        (
            "app.kubernetes.io/name".to_string(),
            "nyann-bench".to_string(),
        ),
        (
            "app.kubernetes.io/instance".to_string(),
            config.name.clone(),
        ),
    ]);
    let meta = ObjectMeta {
        name: Some(config.name.clone()),
        namespace: config.namespace.clone(),
        labels: Some(labels.clone()),
        ..ObjectMeta::default()
    };
    Ok(Manifests {
        config_map: config_map(config, meta.clone(), scenario_json),
        service: service(config, meta.clone(), labels.clone()),
        job: job(config, meta, labels),
    })
}

/// Refuses what cannot run as an Indexed Job; returns the scenario as the
/// ConfigMap holds it.
fn checked_scenario(config: &RenderConfig) -> Result<String, RenderError> {
    if config.workers == 0 {
        return Err(RenderError::TooFewWorkers(config.workers));
    }
    if !valid_name(&config.name) {
        return Err(RenderError::Name(config.name.clone()));
    }
    if let Some(option) = config.generate_args.iter().find_map(|arg| {
        let name = arg.strip_prefix("--")?;
        let name = name.split_once('=').map_or(name, |(n, _)| n);
        RENDERED_OPTIONS.contains(&name).then(|| name.to_string())
    }) {
        return Err(RenderError::Rendered(option));
    }
    let scenario_json =
        serde_json::to_string_pretty(&portable(&config.scenario)).unwrap_or_default();
    let size = scenario_json.len()
        + config
            .policy
            .as_ref()
            .map_or(0, PolicyDelivery::config_map_bytes);
    if size > CONFIG_MAP_LIMIT {
        return Err(RenderError::TooLarge(size));
    }
    Ok(scenario_json)
}

/// The scenario and the policy, mounted in every pod.
fn config_map(config: &RenderConfig, metadata: ObjectMeta, scenario_json: String) -> ConfigMap {
    ConfigMap {
        metadata,
        data: Some(BTreeMap::from([(
            "scenario.json".to_string(),
            scenario_json,
        )])),
        binary_data: config.policy.as_ref().and_then(PolicyDelivery::binary_data),
        ..ConfigMap::default()
    }
}

/// The headless Service under which the workers find the leader (pod 0).
fn service(
    config: &RenderConfig,
    metadata: ObjectMeta,
    labels: BTreeMap<String, String>,
) -> Service {
    Service {
        metadata,
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".into()),
            // Workers must find the leader before any readiness.
            publish_not_ready_addresses: Some(true),
            selector: Some(labels),
            ports: Some(vec![ServicePort {
                name: Some("coordinator".into()),
                port: i32::from(config.port),
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}

/// The Indexed Job: one pod per worker, each running [`container`].
fn job(config: &RenderConfig, metadata: ObjectMeta, labels: BTreeMap<String, String>) -> Job {
    let policy_volume = config.policy.as_ref().and_then(PolicyDelivery::volume);
    let results_volume = match &config.results_claim {
        Some(claim) => Volume {
            name: "results".into(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: claim.clone(),
                ..PersistentVolumeClaimVolumeSource::default()
            }),
            ..Volume::default()
        },
        None => Volume {
            name: "results".into(),
            empty_dir: Some(Default::default()),
            ..Volume::default()
        },
    };
    let workers = i32::try_from(config.workers).unwrap_or(i32::MAX);
    Job {
        metadata,
        spec: Some(JobSpec {
            completion_mode: Some("Indexed".into()),
            completions: Some(workers),
            parallelism: Some(workers),
            // Per index, never the whole Job: see the module's doc.
            backoff_limit_per_index: Some(0),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    subdomain: Some(config.name.clone()),
                    security_context: Some(PodSecurityContext {
                        run_as_user: Some(IMAGE_USER),
                        run_as_group: Some(IMAGE_USER),
                        run_as_non_root: Some(true),
                        // The results volume (a claim too) is writable by the image's group.
                        fs_group: Some(IMAGE_USER),
                        ..PodSecurityContext::default()
                    }),
                    restart_policy: Some("Never".into()),
                    termination_grace_period_seconds: config.drain_grace_s,
                    containers: vec![container(config)],
                    volumes: Some(
                        [
                            Volume {
                                name: "scenario".into(),
                                config_map: Some(ConfigMapVolumeSource {
                                    name: config.name.clone(),
                                    ..ConfigMapVolumeSource::default()
                                }),
                                ..Volume::default()
                            },
                            results_volume,
                        ]
                        .into_iter()
                        .chain(policy_volume.map(|(volume, _)| volume))
                        .collect(),
                    ),
                    ..PodSpec::default()
                }),
            },
            ..JobSpec::default()
        }),
        ..Job::default()
    }
}

/// The nyann-bench container: `generate` with the fleet's flags (none for
/// one worker), then the user's; the scenario and results volumes; the
/// resources asked for.
fn container(config: &RenderConfig) -> Container {
    let output_dir = match &config.results_subdir {
        Some(subdir) => format!("{RESULTS_DIR}/{subdir}"),
        None => RESULTS_DIR.into(),
    };
    let mut args: Vec<String> = vec![
        "generate".into(),
        "--config".into(),
        format!("{CONFIG_DIR}/scenario.json"),
        "--output-dir".into(),
        output_dir,
    ];
    if config.workers > 1 {
        args.extend([
            "--workers".into(),
            config.workers.to_string(),
            "--coordinator".into(),
            // Pod 0's hostname under the headless Service (the Job's pods
            // get hostname NAME-INDEX and the Service as subdomain).
            format!("{}-0.{}:{}", config.name, config.name, config.port),
            "--coordinator-listen".into(),
            format!("0.0.0.0:{}", config.port),
        ]);
    }
    if let Some(policy) = &config.policy {
        args.extend(["--policy".into(), policy.policy_arg()]);
    }
    args.extend(config.generate_args.iter().cloned());

    let resources = resources(config.cpu.as_deref(), config.memory.as_deref());
    Container {
        name: "nyann-bench".into(),
        image: Some(config.image.clone()),
        args: Some(args),
        ports: Some(vec![ContainerPort {
            name: Some("coordinator".into()),
            container_port: i32::from(config.port),
            ..ContainerPort::default()
        }]),
        volume_mounts: Some(
            [
                VolumeMount {
                    name: "scenario".into(),
                    mount_path: CONFIG_DIR.into(),
                    read_only: Some(true),
                    ..VolumeMount::default()
                },
                VolumeMount {
                    name: "results".into(),
                    mount_path: RESULTS_DIR.into(),
                    ..VolumeMount::default()
                },
            ]
            .into_iter()
            .chain(
                config
                    .policy
                    .as_ref()
                    .and_then(PolicyDelivery::volume)
                    .map(|(_, mount)| mount),
            )
            .collect(),
        ),
        resources,
        ..Container::default()
    }
}

/// CPU and memory as requests equal to limits (a pod gets what it asks for,
/// and no more), or none when neither is given.
pub(crate) fn resources(cpu: Option<&str>, memory: Option<&str>) -> Option<ResourceRequirements> {
    let quantities = [("cpu", cpu), ("memory", memory)]
        .into_iter()
        .filter_map(|(k, v)| Some((k.to_string(), Quantity(v?.to_string()))))
        .collect::<BTreeMap<_, _>>();
    (!quantities.is_empty()).then(|| ResourceRequirements {
        requests: Some(quantities.clone()),
        limits: Some(quantities),
        ..ResourceRequirements::default()
    })
}

/// The scenario with the render machine's directories left out of its
/// source locations (`sweep.star:3:5`, not `/home/me/sweep.star:3:5`): they
/// mean nothing in a pod and say more than needed about that machine.
fn portable(scenario: &Scenario) -> Scenario {
    let base = |location: &mut Option<nyann_model::SourceLocation>| {
        if let Some(location) = location {
            let name = std::path::Path::new(&location.file)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned());
            if let Some(name) = name {
                location.file = name;
            }
        }
    };
    let mut scenario = scenario.clone();
    for step in &mut scenario.steps {
        if let nyann_model::Step::Stage(stage) = step {
            base(&mut stage.location);
            if let Some(stop) = &mut stage.stop {
                base(&mut stop.location);
                stop.param_locations.iter_mut().for_each(base);
            }
        }
    }
    scenario
}

/// Multi-document YAML of `objects`, one document each.
pub fn to_yaml(objects: &[serde_json::Value]) -> String {
    let mut out = String::new();
    for object in objects {
        out.push_str("---\n");
        yaml::block(&mut out, object, 0);
    }
    out
}

mod yaml {
    //! A YAML emitter for JSON values: block mappings and sequences, every
    //! string double-quoted with JSON's escapes (a subset of YAML's), or as
    //! a literal block when it spans lines, so that nothing is read back as
    //! another type.

    use serde_json::Value;

    fn indent(out: &mut String, n: usize) {
        out.extend(std::iter::repeat_n(' ', n));
    }

    fn scalar(value: &Value) -> String {
        // Strings, numbers, booleans and null as JSON writes them, with the
        // characters YAML reads as line breaks or a byte-order mark escaped
        // (JSON leaves them raw).
        serde_json::to_string(value)
            .unwrap_or_default()
            .replace('\u{85}', "\\N")
            .replace('\u{2028}', "\\L")
            .replace('\u{2029}', "\\P")
            .replace('\u{feff}', "\\ufeff")
    }

    fn key(k: &str) -> String {
        let plain = k.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
            && k.chars()
                .all(|c| c.is_ascii_alphanumeric() || "._/-".contains(c));
        const RESERVED: &[&str] = &["y", "n", "yes", "no", "on", "off", "true", "false", "null"];
        if plain && !RESERVED.contains(&k.to_ascii_lowercase().as_str()) {
            k.to_string()
        } else {
            scalar(&Value::String(k.to_string()))
        }
    }

    /// A string that reads back exactly from a literal block: several
    /// lines, no control character but newlines and tabs, no trailing
    /// spaces that a block would keep but a reviewer would not see.
    fn literal(s: &str) -> bool {
        s.contains('\n')
            && !s.chars().any(|c| c.is_control() && c != '\n' && c != '\t')
            && !s.starts_with([' ', '\t', '\n'])
            && !s.contains("\r")
            && !s.lines().any(|l| l.ends_with([' ', '\t']))
    }

    /// `value` after a key or dash (the cursor is after `key:` or `-`).
    fn after(out: &mut String, value: &Value, level: usize) {
        match value {
            Value::Object(map) if !map.is_empty() => {
                out.push('\n');
                block(out, value, level);
            }
            Value::Array(items) if !items.is_empty() => {
                out.push('\n');
                block(out, value, level);
            }
            Value::String(s) if literal(s) => {
                let chomp = if s.ends_with("\n\n") {
                    "+"
                } else if s.ends_with('\n') {
                    ""
                } else {
                    "-"
                };
                out.push_str(&format!(" |{chomp}\n"));
                for line in s.strip_suffix('\n').unwrap_or(s).split('\n') {
                    if !line.is_empty() {
                        indent(out, level);
                        out.push_str(line);
                    }
                    out.push('\n');
                }
            }
            _ => {
                out.push(' ');
                out.push_str(&scalar(value));
                out.push('\n');
            }
        }
    }

    /// A mapping or sequence at `level` (other values as one line).
    pub(super) fn block(out: &mut String, value: &Value, level: usize) {
        match value {
            Value::Object(map) if !map.is_empty() => {
                for (k, v) in map {
                    indent(out, level);
                    out.push_str(&key(k));
                    out.push(':');
                    after(out, v, level + 2);
                }
            }
            Value::Array(items) if !items.is_empty() => {
                for item in items {
                    indent(out, level);
                    out.push('-');
                    after(out, item, level + 2);
                }
            }
            Value::Object(_) => out.push_str("{}\n"),
            Value::Array(_) => out.push_str("[]\n"),
            other => {
                out.push_str(&scalar(other));
                out.push('\n');
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use nyann_model::{Mode, Stage, Step, Workload};

    fn config() -> RenderConfig {
        RenderConfig {
            name: "sweep".into(),
            namespace: Some("bench".into()),
            image: "registry.example/nyann-bench:1".into(),
            workers: 4,
            port: 7300,
            scenario: Scenario {
                target: None,
                model: None,
                workload: Workload::default(),
                steps: vec![Step::Stage(Stage {
                    concurrency: Some(64),
                    ..Stage::new(60.0, Mode::Concurrent)
                })],
            },
            policy: Some(PolicyDelivery::Inline(b"\0asm fake".to_vec())),
            generate_args: vec!["--target".into(), "http://vllm:8000/v1".into()],
            cpu: Some("2".into()),
            memory: Some("2Gi".into()),
            results_claim: None,
            results_subdir: None,
            drain_grace_s: None,
        }
    }

    /// The rendered list parses back into the typed objects, which carry
    /// the scenario, the policy and the worker count.
    #[test]
    fn manifests_parse_back_into_the_typed_objects() {
        let c = config();
        let rendered = serde_json::to_string(&render(&c).unwrap().to_list()).unwrap();
        let list: serde_json::Value = serde_json::from_str(&rendered).unwrap();
        let items = list["items"].as_array().unwrap();
        assert_eq!(items.len(), 3);
        let cm: ConfigMap = serde_json::from_value(items[0].clone()).unwrap();
        let svc: Service = serde_json::from_value(items[1].clone()).unwrap();
        let job: Job = serde_json::from_value(items[2].clone()).unwrap();
        assert_eq!(
            render(&c).unwrap(),
            Manifests {
                config_map: cm.clone(),
                service: svc.clone(),
                job: job.clone()
            }
        );
        assert_eq!(items[2]["kind"], "Job");
        assert_eq!(items[2]["apiVersion"], "batch/v1");

        let ir: Scenario = serde_json::from_str(&cm.data.unwrap()["scenario.json"]).unwrap();
        assert_eq!(ir, c.scenario);
        assert_eq!(cm.binary_data.unwrap()["policy.wasm"].0, b"\0asm fake");

        let spec = svc.spec.unwrap();
        assert_eq!(spec.cluster_ip.as_deref(), Some("None"));

        let spec = job.spec.unwrap();
        assert_eq!(spec.completion_mode.as_deref(), Some("Indexed"));
        assert_eq!(
            (
                spec.completions,
                spec.parallelism,
                spec.backoff_limit,
                spec.backoff_limit_per_index
            ),
            (Some(4), Some(4), None, Some(0))
        );
        let pod = spec.template.spec.unwrap();
        assert_eq!(pod.subdomain.as_deref(), Some("sweep"));
        let args = pod.containers[0].args.clone().unwrap().join(" ");
        assert!(args.contains("--workers 4"), "{args}");
        assert!(args.contains("--coordinator sweep-0.sweep:7300"), "{args}");
        assert!(
            args.contains("--policy /etc/nyann-bench/policy.wasm"),
            "{args}"
        );
        assert!(args.ends_with("--target http://vllm:8000/v1"), "{args}");
    }

    #[test]
    fn yaml_quotes_every_string_and_keeps_multi_line_text() {
        let value = serde_json::json!({
            "kind": "ConfigMap",
            "no": "yes",
            "data": {"scenario.json": "{\n  \"a\": 1\n}\n", "odd": "x\u{2028}y", "n": 1.0},
            "items": [{"a": []}, "1.0", true, null],
            "empty": {},
        });
        let text = to_yaml(&[value]);
        // serde_json's maps are sorted.
        assert!(text.starts_with("---\ndata:\n"), "{text}");
        assert!(text.contains("\nkind: \"ConfigMap\"\n"), "{text}");
        assert!(
            text.contains("\"no\": \"yes\""),
            "a YAML 1.1 boolean key is quoted: {text}"
        );
        assert!(
            text.contains("  scenario.json: |\n    {\n      \"a\": 1\n    }\n"),
            "{text}"
        );
        assert!(text.contains("odd: \"x\\Ly\""), "{text}");
        assert!(text.contains("- \"1.0\""), "{text}");
        assert!(text.contains("  a: []\n"), "{text}");
        assert!(text.contains("empty: {}\n"), "{text}");
    }

    #[test]
    fn flags_the_command_sets_are_refused_and_paths_left_out() {
        for flag in ["--output-dir", "--workers=3", "--coordinator"] {
            let c = RenderConfig {
                generate_args: vec![flag.into(), "x".into()],
                ..config()
            };
            let err = render(&c).unwrap_err().to_string();
            let name = flag.trim_start_matches("--").split('=').next().unwrap();
            assert!(
                err.contains(&format!("--{name} is set by the rendered")),
                "{err}"
            );
        }
        let mut c = config();
        let Step::Stage(stage) = &mut c.scenario.steps[0] else {
            unreachable!()
        };
        stage.location = Some(nyann_model::SourceLocation {
            file: "/home/me/bench/sweep.star".into(),
            line: 3,
            column: 5,
        });
        let cm = render(&c).unwrap().config_map;
        let json = &cm.data.unwrap()["scenario.json"];
        assert!(json.contains("\"sweep.star\""), "{json}");
        assert!(!json.contains("/home/me"), "{json}");
    }

    #[test]
    fn bad_names_and_no_workers_are_refused() {
        let bad = RenderConfig {
            name: "Sweep_1".into(),
            ..config()
        };
        assert!(
            render(&bad)
                .unwrap_err()
                .to_string()
                .contains("not a valid Kubernetes name")
        );
        let none = RenderConfig {
            workers: 0,
            ..config()
        };
        let err = render(&none).unwrap_err();
        assert!(matches!(err, RenderError::TooFewWorkers(0)));
        // The library speaks of values; the command line adds its flags.
        assert!(!err.to_string().contains("nyann-bench"), "{err}");
    }

    /// One worker (a run service's run): one pod running plain `generate`
    /// into the run's own directory, drained for as long as asked.
    #[test]
    fn one_worker_runs_plain_generate_in_its_directory() {
        let one = RenderConfig {
            workers: 1,
            results_subdir: Some("runs/r-1".into()),
            drain_grace_s: Some(120),
            ..config()
        };
        let job = render(&one).unwrap().job;
        let spec = job.spec.unwrap();
        assert_eq!(spec.completions, Some(1));
        let pod = spec.template.spec.unwrap();
        assert_eq!(pod.termination_grace_period_seconds, Some(120));
        let args = pod.containers[0].args.clone().unwrap();
        assert_eq!(
            args[..5],
            [
                "generate",
                "--config",
                "/etc/nyann-bench/scenario.json",
                "--output-dir",
                "/results/runs/r-1"
            ]
        );
        assert!(
            !args
                .iter()
                .any(|a| a.starts_with("--worker") || a.starts_with("--coordinator")),
            "{args:?}"
        );
    }
}
