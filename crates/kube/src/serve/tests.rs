//! `render_service`'s objects, one at a time.
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
        args.contains(
            "--targets /etc/nyann-bench/targets.json --tokens /etc/nyann-bench-tokens/tokens.json"
        ),
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
