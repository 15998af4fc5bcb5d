//! `kube render service`: the run service's own manifests, from a real
//! targets file and tokens file. No API server can run on the test
//! machines: every object is validated offline against the Kubernetes
//! schemas (`kubernetes-validate --strict`), the Deployment's command is
//! parsed by the binary's own parser, and the pod is played on this machine
//! (its volumes as directories, its command started with its Kubernetes
//! backend) to show that the service starts on what the objects carry.

use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::support::{kubernetes_validate, nyann_bench};

const TOKEN: &str = "token-admin";
const TARGETS: &str = "[targets.prod]\n\
    url = \"http://vllm.llm.svc:8000/v1\"\n\
    signals = { prometheus_url = \"http://prometheus.monitoring:9090\", deploy_name = \"vllm\" }\n\
    [targets.prod.bounds]\nmax_concurrency = 64\n";

struct Files {
    dir: tempfile::TempDir,
}

impl Files {
    fn new() -> Files {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("targets.toml"), TARGETS).unwrap();
        let tokens = format!(
            "[[tokens]]\nname = \"ops\"\nsha256 = \"{}\"\nscope = \"admin\"\n",
            nyann_service::auth::hash_token(TOKEN)
        );
        std::fs::write(dir.path().join("tokens.toml"), tokens).unwrap();
        Files { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `kube render service` with the files and `extra` flags.
    async fn render(&self, extra: &[&str]) -> std::process::Output {
        nyann_bench()
            .args(["kube", "render", "service", "--targets"])
            .arg(self.path("targets.toml"))
            .arg("--tokens")
            .arg(self.path("tokens.toml"))
            .args(extra)
            .output()
            .await
            .unwrap()
    }

    /// The objects of a successful render (JSON).
    async fn objects(&self, extra: &[&str]) -> Vec<Value> {
        let out = self.render(extra).await;
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let list: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(
            (&list["apiVersion"], &list["kind"]),
            (&json!("v1"), &json!("List"))
        );
        list["items"].as_array().unwrap().clone()
    }
}

fn kind<'a>(items: &'a [Value], kind: &str) -> &'a Value {
    items
        .iter()
        .find(|i| i["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind}"))
}

fn container(items: &[Value]) -> &Value {
    &kind(items, "Deployment")["spec"]["template"]["spec"]["containers"][0]
}

fn args_of(items: &[Value]) -> Vec<String> {
    serde_json::from_value(container(items)["args"].clone()).unwrap()
}

/// The rendered objects pass `kubernetes-validate --strict` as JSON and as
/// YAML; the Role grants exactly what the backend does; the Deployment's
/// command parses with the binary's own parser, and the pod played here
/// (its ConfigMap and Secret as files where they are mounted) starts a
/// service that answers with the token and lists the target; an existing
/// claim is used, not rendered.
#[tokio::test]
async fn kube_render_service_validates_and_starts_the_service() {
    let files = Files::new();
    let common = [
        "--namespace",
        "llm",
        "--image",
        "example.org/nyann-bench:1",
        "--name",
        "bench",
        "--cpu",
        "1",
        "--memory",
        "1Gi",
        "--storage-class",
        "nfs-client",
        "--allow-from-namespace",
        "ci",
        "--allow-from-namespace",
        "agents",
    ];
    let items = files.objects(&common).await;
    let kinds: Vec<&str> = items.iter().map(|i| i["kind"].as_str().unwrap()).collect();
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
    assert_eq!(
        kind(&items, "Role")["rules"],
        json!([
            {"apiGroups": ["batch"], "resources": ["jobs"],
             "verbs": ["create", "get", "delete"]},
            {"apiGroups": [""], "resources": ["configmaps", "services"],
             "verbs": ["create", "delete"]},
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
            {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
        ])
    );
    let claim = kind(&items, "PersistentVolumeClaim");
    assert_eq!(claim["metadata"]["name"], "bench-results");
    assert_eq!(claim["spec"]["accessModes"], json!(["ReadWriteMany"]));
    assert_eq!(claim["spec"]["resources"]["requests"]["storage"], "10Gi");
    assert_eq!(claim["spec"]["storageClassName"], "nfs-client");
    assert_eq!(
        kind(&items, "ConfigMap")["data"]["targets.toml"],
        json!(TARGETS)
    );
    let tokens = base64::engine::general_purpose::STANDARD
        .decode(
            kind(&items, "Secret")["data"]["tokens.toml"]
                .as_str()
                .unwrap(),
        )
        .unwrap();
    assert_eq!(tokens, std::fs::read(files.path("tokens.toml")).unwrap());
    let policy = &kind(&items, "NetworkPolicy")["spec"];
    assert_eq!(
        policy["ingress"],
        json!([{
            "from": [
                {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ci"}}},
                {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "agents"}}},
            ],
            "ports": [{"port": 8089, "protocol": "TCP"}],
        }])
    );

    // The backend's flags, as text (this build may not parse them yet).
    let args = args_of(&items);
    let text = args.join(" ");
    assert!(
        text.contains(
            " --backend kubernetes --kube-namespace llm --kube-image example.org/nyann-bench:1 \
             --kube-results-claim bench-results "
        ),
        "{text}"
    );
    assert!(
        text.ends_with(
            "--allow-host bench --allow-host bench.llm --allow-host bench.llm.svc \
             --allow-host bench.llm.svc.cluster.local"
        ),
        "{text}"
    );
    // The rest, as the binary parses it: `--help` last stops the parse
    // after every value before it was read (an unknown flag or a bad
    // value fails first).
    let out = nyann_bench()
        .args(&args)
        .arg("--help")
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("nyann-bench serve"),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    play_the_pod(&items, files.dir.path()).await;

    let yaml = files
        .render(&[&common[..], &["--format", "yaml"]].concat())
        .await;
    assert!(yaml.status.success());
    let yaml = String::from_utf8(yaml.stdout).unwrap();
    assert_eq!(yaml.matches("---\n").count(), items.len(), "{yaml}");
    kubernetes_validate(files.dir.path(), &items, &yaml);

    // A claim that exists: none rendered, the pod and the backend use it.
    let existing = [
        "--namespace",
        "llm",
        "--image",
        "example.org/nyann-bench:1",
        "--existing-claim",
        "shared-results",
    ];
    let items = files.objects(&existing).await;
    assert!(items.iter().all(|i| i["kind"] != "PersistentVolumeClaim"));
    assert_eq!(items.len(), 8);
    let pod = &kind(&items, "Deployment")["spec"]["template"]["spec"];
    assert_eq!(
        pod["volumes"][0]["persistentVolumeClaim"]["claimName"],
        "shared-results"
    );
    assert!(
        args_of(&items)
            .join(" ")
            .contains("--kube-results-claim shared-results "),
    );
    assert_eq!(
        kind(&items, "ConfigMap")["metadata"]["name"],
        "nyann-bench-targets"
    );
    assert_eq!(
        kind(&items, "NetworkPolicy")["spec"]["ingress"][0].get("from"),
        None
    );
    let yaml = files
        .render(&[&existing[..], &["--format", "yaml"]].concat())
        .await;
    kubernetes_validate(
        files.dir.path(),
        &items,
        &String::from_utf8(yaml.stdout).unwrap(),
    );
}

/// The Deployment's pod on this machine: each volume a directory under
/// `root` with what Kubernetes puts there (the ConfigMap's and the
/// Secret's keys as files, the claim and the emptyDir empty), its command
/// with the mount paths under `root`, on loopback, without the backend's
/// flags (a run would need a cluster). The service must start, answer
/// `/healthz` and, with the token whose digest the Secret holds, list the
/// target the ConfigMap holds.
async fn play_the_pod(items: &[Value], root: &Path) {
    let root = root.join("pod");
    let pod = &kind(items, "Deployment")["spec"]["template"]["spec"];
    let container = container(items);
    let mut mounts: Vec<(String, PathBuf)> = Vec::new();
    for mount in container["volumeMounts"].as_array().unwrap() {
        let path = mount["mountPath"].as_str().unwrap();
        let here = root.join(path.trim_start_matches('/'));
        std::fs::create_dir_all(&here).unwrap();
        let volume = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == mount["name"])
            .unwrap();
        let named = |kind_: &str, name: &Value| {
            items
                .iter()
                .find(|i| i["kind"] == kind_ && &i["metadata"]["name"] == name)
                .unwrap_or_else(|| panic!("the pod mounts a {kind_} {name} not rendered"))
                .clone()
        };
        if let Some(source) = volume.get("configMap") {
            let map = named("ConfigMap", &source["name"]);
            for (key, text) in map["data"].as_object().unwrap() {
                std::fs::write(here.join(key), text.as_str().unwrap()).unwrap();
            }
        } else if let Some(source) = volume.get("secret") {
            let secret = named("Secret", &source["secretName"]);
            for (key, data) in secret["data"].as_object().unwrap() {
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(data.as_str().unwrap())
                    .unwrap();
                std::fs::write(here.join(key), bytes).unwrap();
            }
        }
        mounts.push((path.to_string(), here));
    }
    let args: Vec<String> = args_of(items)
        .into_iter()
        .map(|arg| {
            if arg == "0.0.0.0:8089" {
                return "127.0.0.1:0".to_string();
            }
            mounts
                .iter()
                .filter(|(path, _)| arg == *path || arg.starts_with(&format!("{path}/")))
                .max_by_key(|(path, _)| path.len())
                .map_or(arg.clone(), |(path, here)| {
                    format!("{}{}", here.display(), &arg[path.len()..])
                })
        })
        .collect();
    assert!(
        args.iter().all(|a| !a.starts_with("/etc") && a != "/data"),
        "every path is mounted: {args:?}"
    );
    // In a pod the client finds the API server by its service account;
    // here a kubeconfig stands in (nothing is asked of it at start).
    let kubeconfig = root.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://127.0.0.1:1\n\
         contexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\n\
         users:\n- name: u\n  user: {}\n",
    )
    .unwrap();
    let mut child = nyann_bench()
        .args(&args)
        .env("KUBECONFIG", &kubeconfig)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
        .await
        .expect("the service says where it listens within a minute")
        .unwrap()
        .unwrap_or_else(|| panic!("the service did not start with {args:?}"));
    let url = line.strip_prefix("listening on ").unwrap().to_string();
    let client = nyann_testkit::http_client().build().unwrap();
    let health = client.get(format!("{url}/healthz")).send().await.unwrap();
    assert_eq!(health.status().as_u16(), 200);
    let targets = client
        .get(format!("{url}/api/v1/targets"))
        .header("authorization", format!("Bearer {TOKEN}"))
        .send()
        .await
        .unwrap();
    assert_eq!(targets.status().as_u16(), 200);
    let body: Value = serde_json::from_str(&targets.text().await.unwrap()).unwrap();
    assert!(body.to_string().contains("\"prod\""), "{body}");
    child.kill().await.unwrap();
}

/// Bad input fails before anything is printed, naming what to fix: a
/// missing namespace, a bad name or claim, a targets or tokens file the
/// service would refuse, a policy file the pod would not have, flags of a
/// run mixed in.
#[tokio::test]
async fn kube_render_service_refuses_bad_input_naming_it() {
    let files = Files::new();
    let ok = ["--namespace", "llm", "--image", "example.org/nyann-bench:1"];
    let refused = async |extra: &[&str], code: i32| {
        let out = files.render(extra).await;
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(code), "{extra:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{extra:?}");
        stderr
    };

    let stderr = refused(&["--image", "x"], 2).await;
    assert!(stderr.contains("--namespace <NS>"), "{stderr}");

    for (extra, says) in [
        (
            &["--name", "Bench_1"][..],
            "--name Bench_1: the name \"Bench_1\" is not a valid Kubernetes name: use lowercase",
        ),
        (
            &["--existing-claim", "Shared"][..],
            "--existing-claim Shared: the results claim \"Shared\" is not valid: use lowercase",
        ),
        (
            &["--results-size", "10GB"][..],
            "--results-size 10GB: the results claim's size \"10GB\" is not valid: give a positive Kubernetes quantity",
        ),
        (
            &["--allow-from-namespace", "CI"][..],
            "--allow-from-namespace CI: the namespace allowed in \"CI\" is not valid",
        ),
    ] {
        let stderr = refused(&[&ok[..], extra].concat(), 1).await;
        assert!(stderr.contains(says), "{extra:?}: {stderr}");
    }
    let stderr = refused(&["--namespace", "LLM", "--image", "x"], 1).await;
    assert!(
        stderr.contains("--namespace LLM: the namespace \"LLM\" is not valid"),
        "{stderr}"
    );

    let stderr = refused(
        &[&ok[..], &["--results-claim", "a", "--existing-claim", "b"]].concat(),
        2,
    )
    .await;
    assert!(stderr.contains("cannot be used with"), "{stderr}");
    let out = nyann_bench()
        .args(["kube", "render", "--workers", "2", "service"])
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(2));

    // The service's own loaders judge the files, every error named.
    std::fs::write(
        files.path("targets.toml"),
        "[targets.prod]\nurl = \"ftp://vllm\"\nbounds = { max_stages = 500 }\n",
    )
    .unwrap();
    let stderr = refused(&ok, 1).await;
    assert!(
        stderr.contains("the targets file (--targets")
            && stderr.contains("target \"prod\": url:")
            && stderr.contains("target \"prod\": bounds.max_stages:"),
        "{stderr}"
    );
    let policy = files.path("mine.wasm");
    std::fs::write(&policy, b"\0asm").unwrap();
    std::fs::write(
        files.path("targets.toml"),
        format!(
            "[targets.prod]\nurl = \"http://vllm:8000/v1\"\npolicies = [\"builtin\", {:?}]\n",
            policy.display().to_string()
        ),
    )
    .unwrap();
    let stderr = refused(&ok, 1).await;
    assert!(
        stderr.contains("allows the policy component") && stderr.contains("pinned by digest"),
        "{stderr}"
    );
    std::fs::write(files.path("targets.toml"), TARGETS).unwrap();
    std::fs::write(
        files.path("tokens.toml"),
        "[[tokens]]\nname = \"ci\"\nsha256 = \"plain-token\"\nscope = \"submit\"\n",
    )
    .unwrap();
    let stderr = refused(&ok, 1).await;
    assert!(
        stderr.contains("the tokens file (--tokens")
            && stderr.contains("token \"ci\": sha256 must be 64 hexadecimal digits"),
        "{stderr}"
    );
    std::fs::remove_file(files.path("tokens.toml")).unwrap();
    let stderr = refused(&ok, 1).await;
    assert!(
        stderr.contains("--tokens") && stderr.contains("cannot read the tokens file"),
        "{stderr}"
    );

    // A run's render is as it was: its flags are still required.
    let out = nyann_bench()
        .args(["kube", "render", "--workers", "2", "--image", "x"])
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--config <FILE>"));
}
