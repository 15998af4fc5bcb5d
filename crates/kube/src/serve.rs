//! The run service's own objects in a cluster (`nyann-bench serve` as a
//! Deployment), so that a team applies one list and gets the service, its
//! least-privilege access to the runs it starts, its files and its network
//! boundary:
//!
//! - a ServiceAccount, a namespaced Role and its RoleBinding: the Role
//!   grants what the service's Kubernetes backend does to its runs (Jobs,
//!   their ConfigMaps, Services, pods and logs) and nothing cluster-wide,
//!   no Secret;
//! - a ConfigMap with the targets file and a Secret with the tokens file
//!   (SHA-256 digests only, but who may do what is still kept as a Secret);
//! - the results claim, ReadWriteMany because the service and its runs'
//!   pods mount it from any node (none when the claim exists already);
//! - a Deployment of one replica replaced by Recreate (the SQLite database
//!   has one writer), non-root with a read-only root file system;
//! - a ClusterIP Service on port 8089, and a NetworkPolicy that lets in
//!   nothing but that port (from any namespace, or from those named).

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStrategy};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMap, ConfigMapVolumeSource, Container, ContainerPort, EmptyDirVolumeSource,
    HTTPGetAction, PersistentVolumeClaim, PersistentVolumeClaimSpec,
    PersistentVolumeClaimVolumeSource, PodSecurityContext, PodSpec, PodTemplateSpec, Probe,
    SeccompProfile, Secret, SecretVolumeSource, SecurityContext, Service, ServiceAccount,
    ServicePort, ServiceSpec, Volume, VolumeMount, VolumeResourceRequirements,
};
use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
    NetworkPolicySpec,
};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::{IMAGE_USER, RenderError, resources, valid_name};

/// The port the service listens on in its pod, and its Service's port.
pub const SERVICE_PORT: u16 = 8089;
/// Where the results claim is mounted: the service's data directory (the
/// SQLite database and the runs' directories).
pub const DATA_DIR: &str = "/data";
/// Where the targets ConfigMap is mounted.
pub const TARGETS_DIR: &str = "/etc/nyann-bench";
/// Where the tokens Secret is mounted.
pub const TOKENS_DIR: &str = "/etc/nyann-bench-tokens";
/// The claim's size when none is given.
pub const DEFAULT_RESULTS_SIZE: &str = "10Gi";
/// ConfigMaps and Secrets hold at most 1 MiB.
const OBJECT_LIMIT: usize = 1 << 20;

/// The run service to deploy.
#[derive(Debug, Clone, PartialEq)]
pub struct ServiceConfig {
    /// Name of every object (the ConfigMap, Secret and claim get suffixes).
    pub name: String,
    /// Required: the Role is namespaced, the backend starts its runs there,
    /// and the service's DNS names (for MCP's Host check) contain it.
    pub namespace: String,
    /// The image of the service and of the runs it starts.
    pub image: String,
    /// The targets file, as the user wrote it.
    pub targets: ConfigFile,
    /// The tokens file, as the user wrote it.
    pub tokens: ConfigFile,
    /// The claim the database and the runs' directories live on.
    pub results: ResultsClaim,
    /// CPU and memory of the service's pod, as requests and limits.
    pub cpu: Option<String>,
    /// Memory, as `cpu` is given (`"1Gi"`).
    pub memory: Option<String>,
    /// Namespaces whose pods may reach the service; empty: any.
    pub allow_from_namespaces: Vec<String>,
}

/// A file carried into the pod as the user gave it: its text and whether it
/// is JSON (else TOML), which decides its name there, as the service's
/// loaders read a file by its extension.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigFile {
    /// The file's text, carried byte for byte.
    pub text: String,
    /// JSON (its name ends in `.json`), else TOML.
    pub json: bool,
}

impl ConfigFile {
    /// `STEM.json` or `STEM.toml`.
    fn file_name(&self, stem: &str) -> String {
        format!("{stem}.{}", if self.json { "json" } else { "toml" })
    }
}

/// Where the service keeps its database and the runs their directories.
#[derive(Debug, Clone, PartialEq)]
pub enum ResultsClaim {
    /// A claim rendered with the rest (ReadWriteMany).
    New {
        name: String,
        /// A Kubernetes quantity, e.g. `10Gi`.
        size: String,
        /// The cluster's default class when `None`.
        storage_class: Option<String>,
    },
    /// A claim that exists already (it must be ReadWriteMany too).
    Existing(String),
}

impl ResultsClaim {
    /// A new claim named `NAME-results` of the default size.
    pub fn default_for(name: &str) -> ResultsClaim {
        ResultsClaim::New {
            name: format!("{name}-results"),
            size: DEFAULT_RESULTS_SIZE.to_string(),
            storage_class: None,
        }
    }

    /// The claim's name.
    pub fn name(&self) -> &str {
        match self {
            ResultsClaim::New { name, .. } | ResultsClaim::Existing(name) => name,
        }
    }
}

/// Which value of a [`ServiceConfig`] is at fault, so that the command
/// line can name its own flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    Namespace,
    Image,
    Claim,
    Size,
    StorageClass,
    Cpu,
    Memory,
    AllowedNamespace,
    Targets,
    Tokens,
}

impl std::fmt::Display for Field {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Field::Namespace => "the namespace",
            Field::Image => "the image",
            Field::Claim => "the results claim",
            Field::Size => "the results claim's size",
            Field::StorageClass => "the storage class",
            Field::Cpu => "the CPU",
            Field::Memory => "the memory",
            Field::AllowedNamespace => "the namespace allowed in",
            Field::Targets => "the targets file",
            Field::Tokens => "the tokens file",
        })
    }
}

/// The objects, in the order they are applied (each refers only to those
/// before it).
#[derive(Debug, Clone, PartialEq)]
pub struct ServiceManifests {
    pub service_account: ServiceAccount,
    pub role: Role,
    pub role_binding: RoleBinding,
    pub targets: ConfigMap,
    pub tokens: Secret,
    /// `None` when the claim exists already.
    pub claim: Option<PersistentVolumeClaim>,
    pub deployment: Deployment,
    pub service: Service,
    pub network_policy: NetworkPolicy,
}

impl ServiceManifests {
    /// The objects as JSON, in the order they are applied.
    pub fn objects(&self) -> Vec<serde_json::Value> {
        let value = |v: serde_json::Result<serde_json::Value>| v.unwrap_or_default();
        [
            Some(value(serde_json::to_value(&self.service_account))),
            Some(value(serde_json::to_value(&self.role))),
            Some(value(serde_json::to_value(&self.role_binding))),
            Some(value(serde_json::to_value(&self.targets))),
            Some(value(serde_json::to_value(&self.tokens))),
            self.claim
                .as_ref()
                .map(|claim| value(serde_json::to_value(claim))),
            Some(value(serde_json::to_value(&self.deployment))),
            Some(value(serde_json::to_value(&self.service))),
            Some(value(serde_json::to_value(&self.network_policy))),
        ]
        .into_iter()
        .flatten()
        .collect()
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
        crate::to_yaml(&self.objects())
    }
}

/// The rules of the service's Role: what its Kubernetes backend does to
/// the runs it starts, each `(API group, resources, verbs)`. Nothing else:
/// no Secret, nothing cluster-wide, no update or patch (a run's objects
/// are created once and deleted).
pub const ROLE_RULES: &[(&str, &[&str], &[&str])] = &[
    // A run is an Indexed Job, read to follow its state (exactly the
    // calls the service's Kubernetes backend makes, nothing more).
    ("batch", &["jobs"], &["create", "get", "delete"]),
    // A run's scenario and its headless Service.
    ("", &["configmaps", "services"], &["create", "delete"]),
    // Its pods, found when it ends, and their output for `run.log`.
    ("", &["pods"], &["list"]),
    ("", &["pods/log"], &["get"]),
];

/// The service's objects, or what to change in `config` first.
pub fn render_service(config: &ServiceConfig) -> Result<ServiceManifests, RenderError> {
    check(config)?;
    let name = &config.name;
    let labels = pod_labels(name);
    let meta = |object_name: String| ObjectMeta {
        name: Some(object_name),
        namespace: Some(config.namespace.clone()),
        labels: Some(labels.clone()),
        ..ObjectMeta::default()
    };
    let targets_file = config.targets.file_name("targets");
    let tokens_file = config.tokens.file_name("tokens");
    let claim = match &config.results {
        ResultsClaim::New {
            name: claim,
            size,
            storage_class,
        } => Some(PersistentVolumeClaim {
            metadata: meta(claim.clone()),
            spec: Some(PersistentVolumeClaimSpec {
                // The service and its runs' pods mount it, from any node.
                access_modes: Some(vec!["ReadWriteMany".into()]),
                resources: Some(VolumeResourceRequirements {
                    requests: Some(BTreeMap::from([(
                        "storage".to_string(),
                        Quantity(size.clone()),
                    )])),
                    ..VolumeResourceRequirements::default()
                }),
                storage_class_name: storage_class.clone(),
                ..PersistentVolumeClaimSpec::default()
            }),
            ..PersistentVolumeClaim::default()
        }),
        ResultsClaim::Existing(_) => None,
    };
    Ok(ServiceManifests {
        service_account: ServiceAccount {
            metadata: meta(name.clone()),
            ..ServiceAccount::default()
        },
        role: Role {
            metadata: meta(name.clone()),
            rules: Some(
                ROLE_RULES
                    .iter()
                    .map(|(group, resources, verbs)| PolicyRule {
                        api_groups: Some(vec![group.to_string()]),
                        resources: Some(resources.iter().map(|r| r.to_string()).collect()),
                        verbs: verbs.iter().map(|v| v.to_string()).collect(),
                        ..PolicyRule::default()
                    })
                    .collect(),
            ),
        },
        role_binding: RoleBinding {
            metadata: meta(name.clone()),
            role_ref: RoleRef {
                api_group: Some("rbac.authorization.k8s.io".into()),
                kind: "Role".into(),
                name: name.clone(),
            },
            subjects: Some(vec![Subject {
                kind: "ServiceAccount".into(),
                name: name.clone(),
                namespace: Some(config.namespace.clone()),
                ..Subject::default()
            }]),
        },
        targets: ConfigMap {
            metadata: meta(format!("{name}-targets")),
            data: Some(BTreeMap::from([(
                targets_file.clone(),
                config.targets.text.clone(),
            )])),
            ..ConfigMap::default()
        },
        tokens: Secret {
            metadata: meta(format!("{name}-tokens")),
            type_: Some("Opaque".into()),
            data: Some(BTreeMap::from([(
                tokens_file.clone(),
                ByteString(config.tokens.text.clone().into_bytes()),
            )])),
            ..Secret::default()
        },
        claim,
        deployment: deployment(config, meta(name.clone()), &targets_file, &tokens_file),
        service: Service {
            metadata: meta(name.clone()),
            spec: Some(ServiceSpec {
                type_: Some("ClusterIP".into()),
                selector: Some(labels.clone()),
                ports: Some(vec![ServicePort {
                    name: Some("http".into()),
                    port: i32::from(SERVICE_PORT),
                    target_port: Some(IntOrString::String("http".into())),
                    protocol: Some("TCP".into()),
                    ..ServicePort::default()
                }]),
                ..ServiceSpec::default()
            }),
            ..Service::default()
        },
        network_policy: network_policy(config, meta(name.clone()), labels.clone()),
    })
}

/// The labels of the service's pods (and of every object rendered here):
/// `component=service` sets them apart from its runs' pods, which share
/// the name label.
fn pod_labels(name: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".into(), "nyann-bench".into()),
        ("app.kubernetes.io/component".into(), "service".into()),
        ("app.kubernetes.io/instance".into(), name.to_string()),
    ])
}

/// Refuses what the API server would refuse, or what would leave the pod
/// unable to start, naming the value at fault.
fn check(config: &ServiceConfig) -> Result<(), RenderError> {
    let invalid = |field, value: &str, rule| RenderError::Invalid {
        field,
        value: value.to_string(),
        rule,
    };
    if !valid_name(&config.name) {
        return Err(RenderError::Name(config.name.clone()));
    }
    for (field, namespace) in std::iter::once((Field::Namespace, &config.namespace)).chain(
        config
            .allow_from_namespaces
            .iter()
            .map(|ns| (Field::AllowedNamespace, ns)),
    ) {
        if !dns_label(namespace) {
            return Err(invalid(field, namespace, LABEL_RULE));
        }
    }
    if config.image.is_empty()
        || config
            .image
            .chars()
            .any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(invalid(
            Field::Image,
            &config.image,
            "give an image reference such as registry.example/nyann-bench:TAG, without spaces",
        ));
    }
    let claim = config.results.name();
    if !dns_subdomain(claim) {
        return Err(invalid(Field::Claim, claim, SUBDOMAIN_RULE));
    }
    if let ResultsClaim::New {
        size,
        storage_class,
        ..
    } = &config.results
    {
        if !quantity(size) {
            return Err(invalid(Field::Size, size, QUANTITY_RULE));
        }
        if let Some(class) = storage_class
            && !dns_subdomain(class)
        {
            return Err(invalid(Field::StorageClass, class, SUBDOMAIN_RULE));
        }
    }
    for (field, value) in [(Field::Cpu, &config.cpu), (Field::Memory, &config.memory)] {
        if let Some(value) = value
            && !quantity(value)
        {
            return Err(invalid(field, value, QUANTITY_RULE));
        }
    }
    for (field, file) in [
        (Field::Targets, &config.targets),
        (Field::Tokens, &config.tokens),
    ] {
        if file.text.len() > OBJECT_LIMIT {
            return Err(RenderError::FileTooLarge {
                field,
                bytes: file.text.len(),
            });
        }
    }
    Ok(())
}

const LABEL_RULE: &str = "use lowercase letters, digits and '-', starting and ending with a letter or digit, at most 63 characters";
const SUBDOMAIN_RULE: &str = "use lowercase letters, digits, '-' and '.', starting and ending with a letter or digit, at most 253 characters";
const QUANTITY_RULE: &str = "give a positive Kubernetes quantity such as 10Gi, 512Mi, 2 or 500m";

/// An RFC 1123 label, as namespaces are.
fn dns_label(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

/// An RFC 1123 subdomain, as claim and storage class names are.
fn dns_subdomain(name: &str) -> bool {
    name.len() <= 253 && name.split('.').all(dns_label)
}

/// A positive quantity in Kubernetes' grammar: a decimal number, then a
/// binary (`Ki`..`Ei`) or decimal (`m`, `k`, `M`..`E`) suffix or an
/// exponent (`e3`, `E-2`).
fn quantity(value: &str) -> bool {
    let number_end = value
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(value.len());
    let (number, suffix) = value.split_at(number_end);
    let number_ok = number.matches('.').count() <= 1
        && number.chars().any(|c| c.is_ascii_digit())
        && number.chars().any(|c| ('1'..='9').contains(&c));
    let suffix_ok = match suffix {
        "" | "m" | "k" | "M" | "G" | "T" | "P" | "E" => true,
        "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei" => true,
        exponent => exponent
            .strip_prefix(['e', 'E'])
            .map(|e| e.strip_prefix(['+', '-']).unwrap_or(e))
            .is_some_and(|digits| !digits.is_empty() && digits.chars().all(|c| c.is_ascii_digit())),
    };
    number_ok && suffix_ok
}

/// The service's one pod: `serve` on the claim, with the Kubernetes backend
/// starting runs in the same namespace, image and claim.
fn deployment(
    config: &ServiceConfig,
    metadata: ObjectMeta,
    targets_file: &str,
    tokens_file: &str,
) -> Deployment {
    let labels = pod_labels(&config.name);
    let volume = |name: &str| Volume {
        name: name.into(),
        ..Volume::default()
    };
    let mount = |name: &str, path: &str, read_only: bool| VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        read_only: read_only.then_some(true),
        ..VolumeMount::default()
    };
    let probe = || Probe {
        http_get: Some(HTTPGetAction {
            path: Some("/healthz".into()),
            port: IntOrString::String("http".into()),
            ..HTTPGetAction::default()
        }),
        ..Probe::default()
    };
    Deployment {
        metadata,
        spec: Some(DeploymentSpec {
            replicas: Some(1),
            // One writer of the SQLite database: the old pod is gone
            // before the new one opens it.
            strategy: Some(DeploymentStrategy {
                type_: Some("Recreate".into()),
                ..DeploymentStrategy::default()
            }),
            selector: LabelSelector {
                match_labels: Some(labels.clone()),
                ..LabelSelector::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    service_account_name: Some(config.name.clone()),
                    security_context: Some(PodSecurityContext {
                        run_as_user: Some(IMAGE_USER),
                        run_as_group: Some(IMAGE_USER),
                        run_as_non_root: Some(true),
                        // The claim is writable by the image's group.
                        fs_group: Some(IMAGE_USER),
                        seccomp_profile: Some(SeccompProfile {
                            type_: "RuntimeDefault".into(),
                            ..SeccompProfile::default()
                        }),
                        ..PodSecurityContext::default()
                    }),
                    containers: vec![Container {
                        name: "nyann-bench".into(),
                        image: Some(config.image.clone()),
                        args: Some(serve_args(config, targets_file, tokens_file)),
                        ports: Some(vec![ContainerPort {
                            name: Some("http".into()),
                            container_port: i32::from(SERVICE_PORT),
                            protocol: Some("TCP".into()),
                            ..ContainerPort::default()
                        }]),
                        readiness_probe: Some(probe()),
                        liveness_probe: Some(Probe {
                            // Opening the database may recover runs first.
                            initial_delay_seconds: Some(10),
                            ..probe()
                        }),
                        resources: resources(config.cpu.as_deref(), config.memory.as_deref()),
                        security_context: Some(SecurityContext {
                            read_only_root_filesystem: Some(true),
                            allow_privilege_escalation: Some(false),
                            capabilities: Some(Capabilities {
                                drop: Some(vec!["ALL".into()]),
                                ..Capabilities::default()
                            }),
                            ..SecurityContext::default()
                        }),
                        volume_mounts: Some(vec![
                            mount("data", DATA_DIR, false),
                            mount("targets", TARGETS_DIR, true),
                            mount("tokens", TOKENS_DIR, true),
                            // Plans' scenario files (the root is read-only).
                            mount("tmp", "/tmp", false),
                        ]),
                        ..Container::default()
                    }],
                    volumes: Some(vec![
                        Volume {
                            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                                claim_name: config.results.name().to_string(),
                                ..PersistentVolumeClaimVolumeSource::default()
                            }),
                            ..volume("data")
                        },
                        Volume {
                            config_map: Some(ConfigMapVolumeSource {
                                name: format!("{}-targets", config.name),
                                ..ConfigMapVolumeSource::default()
                            }),
                            ..volume("targets")
                        },
                        Volume {
                            secret: Some(SecretVolumeSource {
                                secret_name: Some(format!("{}-tokens", config.name)),
                                ..SecretVolumeSource::default()
                            }),
                            ..volume("tokens")
                        },
                        Volume {
                            empty_dir: Some(EmptyDirVolumeSource::default()),
                            ..volume("tmp")
                        },
                    ]),
                    ..PodSpec::default()
                }),
            },
            ..DeploymentSpec::default()
        }),
        ..Deployment::default()
    }
}

/// The service's command: listening in the pod, its files where they are
/// mounted, runs started by the Kubernetes backend, and the names clients
/// reach it by in the cluster allowed past MCP's Host check.
fn serve_args(config: &ServiceConfig, targets_file: &str, tokens_file: &str) -> Vec<String> {
    let (name, namespace) = (&config.name, &config.namespace);
    let mut args: Vec<String> = [
        "serve".to_string(),
        "--listen".into(),
        format!("0.0.0.0:{SERVICE_PORT}"),
        "--data-dir".into(),
        DATA_DIR.into(),
        "--targets".into(),
        format!("{TARGETS_DIR}/{targets_file}"),
        "--tokens".into(),
        format!("{TOKENS_DIR}/{tokens_file}"),
        "--backend".into(),
        "kubernetes".into(),
        "--kube-namespace".into(),
        namespace.clone(),
        "--kube-image".into(),
        config.image.clone(),
        "--kube-results-claim".into(),
        config.results.name().to_string(),
    ]
    .into();
    for host in [
        name.clone(),
        format!("{name}.{namespace}"),
        format!("{name}.{namespace}.svc"),
        format!("{name}.{namespace}.svc.cluster.local"),
    ] {
        args.extend(["--allow-host".to_string(), host]);
    }
    args
}

/// Only the service's port is open, to any pod or to the namespaces
/// given; the pods of its runs and of everything else in the namespace are
/// not selected.
fn network_policy(
    config: &ServiceConfig,
    metadata: ObjectMeta,
    labels: BTreeMap<String, String>,
) -> NetworkPolicy {
    let from = (!config.allow_from_namespaces.is_empty()).then(|| {
        config
            .allow_from_namespaces
            .iter()
            .map(|namespace| NetworkPolicyPeer {
                namespace_selector: Some(LabelSelector {
                    match_labels: Some(BTreeMap::from([(
                        "kubernetes.io/metadata.name".to_string(),
                        namespace.clone(),
                    )])),
                    ..LabelSelector::default()
                }),
                ..NetworkPolicyPeer::default()
            })
            .collect()
    });
    NetworkPolicy {
        metadata,
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: Some(labels),
                ..LabelSelector::default()
            }),
            policy_types: Some(vec!["Ingress".into()]),
            ingress: Some(vec![NetworkPolicyIngressRule {
                from,
                ports: Some(vec![NetworkPolicyPort {
                    protocol: Some("TCP".into()),
                    port: Some(IntOrString::Int(i32::from(SERVICE_PORT))),
                    ..NetworkPolicyPort::default()
                }]),
            }]),
            // Egress is left as it is: the service reaches the API server
            // and the runs' pods.
            egress: None,
        }),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const TARGETS: &str = "[targets.prod]\nurl = \"http://vllm.llm.svc:8000/v1\"\n";
    const TOKENS: &str = "[[tokens]]\nname = \"ci\"\nsha256 = \"00\"\nscope = \"admin\"\n";

    fn config() -> ServiceConfig {
        ServiceConfig {
            name: "bench".into(),
            namespace: "llm".into(),
            image: "registry.example/nyann-bench:1".into(),
            targets: ConfigFile {
                text: TARGETS.into(),
                json: false,
            },
            tokens: ConfigFile {
                text: TOKENS.into(),
                json: false,
            },
            results: ResultsClaim::default_for("bench"),
            cpu: Some("1".into()),
            memory: Some("1Gi".into()),
            allow_from_namespaces: Vec::new(),
        }
    }

    fn pod(m: &ServiceManifests) -> &PodSpec {
        m.deployment
            .spec
            .as_ref()
            .unwrap()
            .template
            .spec
            .as_ref()
            .unwrap()
    }

    /// Every object, in apply order, in the namespace, with the labels;
    /// the files as given; the claim ReadWriteMany; the Service and the
    /// Deployment on the named port.
    #[test]
    fn each_object_holds_what_the_service_needs() {
        let m = render_service(&config()).unwrap();
        let objects = m.objects();
        let kinds: Vec<&str> = objects
            .iter()
            .map(|o| o["kind"].as_str().unwrap())
            .collect();
        assert_eq!(
            kinds,
            [
                "ServiceAccount",
                "Role",
                "RoleBinding",
                "ConfigMap",
                "Secret",
                "PersistentVolumeClaim",
                "Deployment",
                "Service",
                "NetworkPolicy"
            ]
        );
        for object in &objects {
            assert_eq!(object["metadata"]["namespace"], "llm", "{object}");
            assert_eq!(
                object["metadata"]["labels"]["app.kubernetes.io/component"],
                "service"
            );
        }
        let names: Vec<&str> = objects
            .iter()
            .map(|o| o["metadata"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "bench",
                "bench",
                "bench",
                "bench-targets",
                "bench-tokens",
                "bench-results",
                "bench",
                "bench",
                "bench"
            ]
        );

        let binding = &m.role_binding;
        assert_eq!(
            (
                binding.role_ref.kind.as_str(),
                binding.role_ref.name.as_str()
            ),
            ("Role", "bench")
        );
        let subject = &binding.subjects.as_ref().unwrap()[0];
        assert_eq!(
            (
                subject.kind.as_str(),
                subject.name.as_str(),
                subject.namespace.as_deref()
            ),
            ("ServiceAccount", "bench", Some("llm"))
        );

        assert_eq!(m.targets.data.as_ref().unwrap()["targets.toml"], TARGETS);
        assert_eq!(
            m.tokens.data.as_ref().unwrap()["tokens.toml"].0,
            TOKENS.as_bytes()
        );

        let claim = m.claim.as_ref().unwrap().spec.as_ref().unwrap();
        assert_eq!(
            claim.access_modes.as_deref(),
            Some(&["ReadWriteMany".to_string()][..])
        );
        assert_eq!(
            claim.resources.as_ref().unwrap().requests.as_ref().unwrap()["storage"].0,
            "10Gi"
        );
        assert_eq!(claim.storage_class_name, None);

        let spec = m.deployment.spec.as_ref().unwrap();
        assert_eq!(spec.replicas, Some(1));
        assert_eq!(
            spec.strategy.as_ref().unwrap().type_.as_deref(),
            Some("Recreate")
        );
        assert_eq!(
            spec.selector.match_labels.as_ref(),
            Some(&pod_labels("bench"))
        );
        let pod = pod(&m);
        assert_eq!(pod.service_account_name.as_deref(), Some("bench"));
        let container = &pod.containers[0];
        assert_eq!(
            container.args.as_ref().unwrap().join(" "),
            "serve --listen 0.0.0.0:8089 --data-dir /data \
             --targets /etc/nyann-bench/targets.toml \
             --tokens /etc/nyann-bench-tokens/tokens.toml \
             --backend kubernetes --kube-namespace llm \
             --kube-image registry.example/nyann-bench:1 --kube-results-claim bench-results \
             --allow-host bench --allow-host bench.llm --allow-host bench.llm.svc \
             --allow-host bench.llm.svc.cluster.local"
        );
        let mounts: Vec<(&str, &str, Option<bool>)> = container
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .map(|m| (m.name.as_str(), m.mount_path.as_str(), m.read_only))
            .collect();
        assert_eq!(
            mounts,
            [
                ("data", "/data", None),
                ("targets", "/etc/nyann-bench", Some(true)),
                ("tokens", "/etc/nyann-bench-tokens", Some(true)),
                ("tmp", "/tmp", None)
            ]
        );
        let volumes = pod.volumes.as_ref().unwrap();
        assert_eq!(
            volumes[0]
                .persistent_volume_claim
                .as_ref()
                .unwrap()
                .claim_name,
            "bench-results"
        );
        assert_eq!(
            volumes[1].config_map.as_ref().unwrap().name,
            "bench-targets"
        );
        assert_eq!(
            volumes[2].secret.as_ref().unwrap().secret_name.as_deref(),
            Some("bench-tokens")
        );
        assert!(volumes[3].empty_dir.is_some());
        let port = &container.ports.as_ref().unwrap()[0];
        assert_eq!(
            (port.name.as_deref(), port.container_port),
            (Some("http"), 8089)
        );
        for probe in [&container.readiness_probe, &container.liveness_probe] {
            let get = probe.as_ref().unwrap().http_get.as_ref().unwrap();
            assert_eq!(get.path.as_deref(), Some("/healthz"));
            assert_eq!(get.port, IntOrString::String("http".into()));
        }
        let resources = container.resources.as_ref().unwrap();
        assert_eq!(resources.requests, resources.limits);
        assert_eq!(resources.limits.as_ref().unwrap()["memory"].0, "1Gi");

        let service = m.service.spec.as_ref().unwrap();
        assert_eq!(service.type_.as_deref(), Some("ClusterIP"));
        assert_eq!(service.selector.as_ref(), Some(&pod_labels("bench")));
        let port = &service.ports.as_ref().unwrap()[0];
        assert_eq!(port.port, 8089);
        assert_eq!(port.target_port, Some(IntOrString::String("http".into())));
    }

    /// The Role grants exactly [`ROLE_RULES`]: namespaced, no Secret, no
    /// wildcard, no update or patch, no non-resource URL.
    #[test]
    fn the_role_grants_nothing_beyond_the_list() {
        let m = render_service(&config()).unwrap();
        let rules = m.role.rules.as_ref().unwrap();
        let granted: Vec<(String, Vec<String>, Vec<String>)> = rules
            .iter()
            .map(|r| {
                assert_eq!(r.resource_names, None);
                assert_eq!(r.non_resource_urls, None);
                let groups = r.api_groups.clone().unwrap();
                assert_eq!(groups.len(), 1);
                (
                    groups[0].clone(),
                    r.resources.clone().unwrap(),
                    r.verbs.clone(),
                )
            })
            .collect();
        let own = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            granted,
            vec![
                (
                    "batch".to_string(),
                    own(&["jobs"]),
                    own(&["create", "get", "delete"])
                ),
                (
                    String::new(),
                    own(&["configmaps", "services"]),
                    own(&["create", "delete"])
                ),
                (String::new(), own(&["pods"]), own(&["list"])),
                (String::new(), own(&["pods/log"]), own(&["get"])),
            ]
        );
        let text = serde_json::to_string(&m.role).unwrap();
        for word in [
            "secrets",
            "*",
            "update",
            "patch",
            "escalate",
            "bind",
            "impersonate",
        ] {
            assert!(!text.contains(&format!("\"{word}\"")), "{word}: {text}");
        }
        assert_eq!(m.role.metadata.namespace.as_deref(), Some("llm"));
        // Nothing cluster-wide is rendered.
        for object in m.objects() {
            assert!(!object["kind"].as_str().unwrap().starts_with("Cluster"));
        }
    }

    /// The pod runs as the image's user, never root, on a read-only root
    /// with no capability and no way to gain privileges.
    #[test]
    fn the_deployment_is_non_root_with_a_read_only_root() {
        let m = render_service(&config()).unwrap();
        let pod = pod(&m);
        let security = pod.security_context.as_ref().unwrap();
        assert_eq!(
            (
                security.run_as_user,
                security.run_as_group,
                security.fs_group,
                security.run_as_non_root
            ),
            (Some(65532), Some(65532), Some(65532), Some(true))
        );
        assert_eq!(
            security.seccomp_profile.as_ref().unwrap().type_,
            "RuntimeDefault"
        );
        let container = pod.containers[0].security_context.as_ref().unwrap();
        assert_eq!(container.read_only_root_filesystem, Some(true));
        assert_eq!(container.allow_privilege_escalation, Some(false));
        assert_eq!(container.privileged, None);
        assert_eq!(container.run_as_user, None, "the pod's user holds");
        assert_eq!(
            container.capabilities.as_ref().unwrap(),
            &Capabilities {
                drop: Some(vec!["ALL".into()]),
                add: None
            }
        );
        assert_eq!(pod.host_network, None);
        assert_eq!(pod.host_pid, None);
    }

    /// An existing claim is mounted and given to the backend, not rendered;
    /// a new one takes the size and class given; JSON files keep their
    /// extension, which is how the service reads them.
    #[test]
    fn claims_and_file_names_follow_what_is_given() {
        let existing = ServiceConfig {
            results: ResultsClaim::Existing("shared-nfs".into()),
            ..config()
        };
        let m = render_service(&existing).unwrap();
        assert_eq!(m.claim, None);
        assert_eq!(m.objects().len(), 8);
        let args = pod(&m).containers[0].args.clone().unwrap().join(" ");
        assert!(args.contains("--kube-results-claim shared-nfs "), "{args}");
        assert_eq!(
            pod(&m).volumes.as_ref().unwrap()[0]
                .persistent_volume_claim
                .as_ref()
                .unwrap()
                .claim_name,
            "shared-nfs"
        );

        let json = ServiceConfig {
            results: ResultsClaim::New {
                name: "runs".into(),
                size: "500Gi".into(),
                storage_class: Some("nfs-client".into()),
            },
            targets: ConfigFile {
                text: "{\"targets\": {}}".into(),
                json: true,
            },
            tokens: ConfigFile {
                text: "{\"tokens\": []}".into(),
                json: true,
            },
            ..config()
        };
        let m = render_service(&json).unwrap();
        let claim = m.claim.as_ref().unwrap();
        assert_eq!(claim.metadata.name.as_deref(), Some("runs"));
        let spec = claim.spec.as_ref().unwrap();
        assert_eq!(spec.storage_class_name.as_deref(), Some("nfs-client"));
        assert_eq!(
            spec.resources.as_ref().unwrap().requests.as_ref().unwrap()["storage"].0,
            "500Gi"
        );
        assert!(
            m.targets
                .data
                .as_ref()
                .unwrap()
                .contains_key("targets.json")
        );
        assert!(m.tokens.data.as_ref().unwrap().contains_key("tokens.json"));
        let args = pod(&m).containers[0].args.clone().unwrap().join(" ");
        assert!(
            args.contains("--targets /etc/nyann-bench/targets.json --tokens /etc/nyann-bench-tokens/tokens.json"),
            "{args}"
        );
    }

    /// Only TCP 8089 is let in: from anywhere, or from the namespaces named.
    #[test]
    fn the_network_policy_opens_the_port_only() {
        let m = render_service(&config()).unwrap();
        let spec = m.network_policy.spec.as_ref().unwrap();
        assert_eq!(
            spec.pod_selector.as_ref().unwrap().match_labels.as_ref(),
            Some(&pod_labels("bench"))
        );
        assert_eq!(
            spec.policy_types.as_deref(),
            Some(&["Ingress".to_string()][..])
        );
        assert_eq!(spec.egress, None);
        let ingress = spec.ingress.as_ref().unwrap();
        assert_eq!(ingress.len(), 1);
        assert_eq!(ingress[0].from, None);
        let port = &ingress[0].ports.as_ref().unwrap()[0];
        assert_eq!(
            (port.protocol.as_deref(), port.port.clone(), port.end_port),
            (Some("TCP"), Some(IntOrString::Int(8089)), None)
        );

        let narrowed = ServiceConfig {
            allow_from_namespaces: vec!["ci".into(), "agents".into()],
            ..config()
        };
        let m = render_service(&narrowed).unwrap();
        let rule = &m
            .network_policy
            .spec
            .as_ref()
            .unwrap()
            .ingress
            .as_ref()
            .unwrap()[0];
        let from: Vec<&str> = rule
            .from
            .as_ref()
            .unwrap()
            .iter()
            .map(|peer| {
                assert_eq!(peer.pod_selector, None);
                assert_eq!(peer.ip_block, None);
                peer.namespace_selector
                    .as_ref()
                    .unwrap()
                    .match_labels
                    .as_ref()
                    .unwrap()["kubernetes.io/metadata.name"]
                    .as_str()
            })
            .collect();
        assert_eq!(from, ["ci", "agents"]);
        assert!(rule.ports.is_some(), "still the port only");
    }

    /// Each value the API server would refuse is named, with what to use.
    #[test]
    fn bad_values_are_refused_naming_the_value() {
        let refused = |config: ServiceConfig| render_service(&config).unwrap_err();
        let err = refused(ServiceConfig {
            name: "Bench_1".into(),
            ..config()
        });
        assert!(matches!(err, RenderError::Name(_)), "{err}");
        for (config, field, value) in [
            (
                ServiceConfig {
                    namespace: "LLM".into(),
                    ..config()
                },
                Field::Namespace,
                "LLM",
            ),
            (
                ServiceConfig {
                    namespace: String::new(),
                    ..config()
                },
                Field::Namespace,
                "",
            ),
            (
                ServiceConfig {
                    allow_from_namespaces: vec!["ci".into(), "-x".into()],
                    ..config()
                },
                Field::AllowedNamespace,
                "-x",
            ),
            (
                ServiceConfig {
                    image: "a b".into(),
                    ..config()
                },
                Field::Image,
                "a b",
            ),
            (
                ServiceConfig {
                    results: ResultsClaim::Existing("Runs".into()),
                    ..config()
                },
                Field::Claim,
                "Runs",
            ),
            (
                ServiceConfig {
                    results: ResultsClaim::New {
                        name: "runs".into(),
                        size: "10GB".into(),
                        storage_class: None,
                    },
                    ..config()
                },
                Field::Size,
                "10GB",
            ),
            (
                ServiceConfig {
                    results: ResultsClaim::New {
                        name: "runs".into(),
                        size: "10Gi".into(),
                        storage_class: Some("NFS".into()),
                    },
                    ..config()
                },
                Field::StorageClass,
                "NFS",
            ),
            (
                ServiceConfig {
                    cpu: Some("two".into()),
                    ..config()
                },
                Field::Cpu,
                "two",
            ),
            (
                ServiceConfig {
                    memory: Some("0".into()),
                    ..config()
                },
                Field::Memory,
                "0",
            ),
        ] {
            let err = refused(config);
            let RenderError::Invalid {
                field: f, value: v, ..
            } = &err
            else {
                panic!("{err}")
            };
            assert_eq!((*f, v.as_str()), (field, value), "{err}");
            // The library speaks of values; the command line adds its flags.
            assert!(!err.to_string().contains("--"), "{err}");
        }
        let err = refused(ServiceConfig {
            tokens: ConfigFile {
                text: "#".repeat(OBJECT_LIMIT + 1),
                json: false,
            },
            ..config()
        });
        assert!(
            matches!(
                err,
                RenderError::FileTooLarge {
                    field: Field::Tokens,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn quantities_follow_kubernetes_grammar() {
        for good in [
            "10Gi",
            "1",
            "500m",
            "0.5",
            ".5",
            "1.5Ti",
            "2e3",
            "1E-2",
            "128974848",
            "129M",
        ] {
            assert!(quantity(good), "{good}");
        }
        for bad in [
            "", "Gi", "10GB", "10 Gi", "-1", "0", "0.0Gi", "1..2", "e3", "1e", "1.2.3",
        ] {
            assert!(!quantity(bad), "{bad}");
        }
    }
}
