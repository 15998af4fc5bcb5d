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
mod tests;
