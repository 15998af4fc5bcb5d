//! `nyann-bench kube render`: the manifests of a scale-out run, built from
//! typed Kubernetes objects.
//!
//! - a ConfigMap carrying the compiled scenario (`scenario.json`) and, when
//!   given, the policy component (`policy.wasm`);
//! - a headless Service, so that every worker finds pod 0 (the leader) at
//!   `NAME-0.NAME:PORT`;
//! - an Indexed Job of N pods (parallelism = completions = N) running the
//!   same `generate --workers N` command; Kubernetes sets each pod's
//!   `JOB_COMPLETION_INDEX`, which is its `--worker-index`. `backoffLimit`
//!   is 0: a failed pod is not restarted, since a sweep cannot be rejoined
//!   half-way.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    ConfigMap, ConfigMapVolumeSource, Container, ContainerPort, PersistentVolumeClaimVolumeSource,
    PodSpec, PodTemplateSpec, ResourceRequirements, Service, ServicePort, ServiceSpec, Volume,
    VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use nyann_model::Scenario;

/// Where the ConfigMap is mounted in every pod.
pub const CONFIG_DIR: &str = "/etc/nyann-bench";
/// Where results are written in every pod.
pub const RESULTS_DIR: &str = "/results";
/// ConfigMaps hold at most 1 MiB.
const CONFIG_MAP_LIMIT: usize = 1 << 20;

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
    /// The policy component's bytes (`--policy FILE.wasm`).
    pub policy: Option<Vec<u8>>,
    /// More `generate` flags for every worker (target, signals, ...).
    pub generate_args: Vec<String>,
    /// CPU and memory, as requests and limits (`"2"`, `"4Gi"`).
    pub cpu: Option<String>,
    pub memory: Option<String>,
    /// A PersistentVolumeClaim for the results (else an emptyDir: the
    /// results leave with the pod).
    pub results_claim: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error(
        "--workers must be at least 2 for a scale-out run (1 worker needs no Kubernetes Job: run `nyann-bench generate`)"
    )]
    TooFewWorkers,
    #[error(
        "the scenario and policy take {0} bytes, more than a ConfigMap's 1 MiB: use a smaller policy component"
    )]
    TooLarge(usize),
    #[error(
        "--name {0:?} is not a valid Kubernetes name: use lowercase letters, digits and '-', starting with a letter, at most 50 characters"
    )]
    Name(String),
}

/// The three objects, in the order they are applied.
#[derive(Debug, Clone, PartialEq)]
pub struct Manifests {
    pub config_map: ConfigMap,
    pub service: Service,
    pub job: Job,
}

impl Manifests {
    /// A `v1` `List` of the objects, for `kubectl apply -f -`.
    pub fn to_list(&self) -> serde_json::Value {
        serde_json::json!({
            "apiVersion": "v1",
            "kind": "List",
            "items": [self.config_map, self.service, self.job],
        })
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
    if config.workers < 2 {
        return Err(RenderError::TooFewWorkers);
    }
    if !valid_name(&config.name) {
        return Err(RenderError::Name(config.name.clone()));
    }
    let scenario_json = serde_json::to_string_pretty(&config.scenario).unwrap_or_default();
    let size = scenario_json.len() + config.policy.as_ref().map_or(0, Vec::len);
    if size > CONFIG_MAP_LIMIT {
        return Err(RenderError::TooLarge(size));
    }
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

    let config_map = ConfigMap {
        metadata: meta.clone(),
        data: Some(BTreeMap::from([(
            "scenario.json".to_string(),
            scenario_json,
        )])),
        binary_data: config
            .policy
            .as_ref()
            .map(|wasm| BTreeMap::from([("policy.wasm".to_string(), ByteString(wasm.clone()))])),
        ..ConfigMap::default()
    };

    let service = Service {
        metadata: meta.clone(),
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".into()),
            // Workers must find the leader before any readiness.
            publish_not_ready_addresses: Some(true),
            selector: Some(labels.clone()),
            ports: Some(vec![ServicePort {
                name: Some("coordinator".into()),
                port: i32::from(config.port),
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    };

    let mut args: Vec<String> = vec![
        "generate".into(),
        "--config".into(),
        format!("{CONFIG_DIR}/scenario.json"),
        "--workers".into(),
        config.workers.to_string(),
        "--coordinator".into(),
        // Pod 0's hostname under the headless Service (the Job's pods get
        // hostname NAME-INDEX and the Service as subdomain).
        format!("{}-0.{}:{}", config.name, config.name, config.port),
        "--coordinator-listen".into(),
        format!("0.0.0.0:{}", config.port),
        "--output-dir".into(),
        RESULTS_DIR.into(),
    ];
    if config.policy.is_some() {
        args.extend(["--policy".into(), format!("{CONFIG_DIR}/policy.wasm")]);
    }
    args.extend(config.generate_args.iter().cloned());

    let quantities = [("cpu", &config.cpu), ("memory", &config.memory)]
        .into_iter()
        .filter_map(|(k, v)| Some((k.to_string(), Quantity(v.clone()?))))
        .collect::<BTreeMap<_, _>>();
    let resources = (!quantities.is_empty()).then(|| ResourceRequirements {
        requests: Some(quantities.clone()),
        limits: Some(quantities),
        ..ResourceRequirements::default()
    });
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
    let container = Container {
        name: "nyann-bench".into(),
        image: Some(config.image.clone()),
        args: Some(args),
        ports: Some(vec![ContainerPort {
            name: Some("coordinator".into()),
            container_port: i32::from(config.port),
            ..ContainerPort::default()
        }]),
        volume_mounts: Some(vec![
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
        ]),
        resources,
        ..Container::default()
    };
    let workers = i32::try_from(config.workers).unwrap_or(i32::MAX);
    let job = Job {
        metadata: meta,
        spec: Some(JobSpec {
            completion_mode: Some("Indexed".into()),
            completions: Some(workers),
            parallelism: Some(workers),
            backoff_limit: Some(0),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    subdomain: Some(config.name.clone()),
                    restart_policy: Some("Never".into()),
                    containers: vec![container],
                    volumes: Some(vec![
                        Volume {
                            name: "scenario".into(),
                            config_map: Some(ConfigMapVolumeSource {
                                name: config.name.clone(),
                                ..ConfigMapVolumeSource::default()
                            }),
                            ..Volume::default()
                        },
                        results_volume,
                    ]),
                    ..PodSpec::default()
                }),
            },
            ..JobSpec::default()
        }),
        ..Job::default()
    };
    Ok(Manifests {
        config_map,
        service,
        job,
    })
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
            policy: Some(b"\0asm fake".to_vec()),
            generate_args: vec!["--target".into(), "http://vllm:8000/v1".into()],
            cpu: Some("2".into()),
            memory: Some("2Gi".into()),
            results_claim: None,
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
            (spec.completions, spec.parallelism, spec.backoff_limit),
            (Some(4), Some(4), Some(0))
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
    fn bad_names_and_single_workers_are_refused() {
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
        let one = RenderConfig {
            workers: 1,
            ..config()
        };
        assert!(render(&one).unwrap_err().to_string().contains("at least 2"));
    }
}
