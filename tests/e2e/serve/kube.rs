//! `serve --backend kubernetes` against an API server in memory: the real
//! binary as the service, talking to it with the `kube` client through a
//! kubeconfig, as in a cluster. The fake keeps the objects it is given,
//! answers server-side dry runs, and plays the kubelet: a Job's pod is the
//! Job's own command run here (its ConfigMap's files and the results claim
//! mapped to directories), against the simulator, its end the Job's
//! condition. No real API server can be installed on the project's test
//! machines; this checks what the service asks of one and what it makes of
//! the answers.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use axum::http::{Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::{ADMIN, READ, SUBMIT, Setup, is_final, lines, sends, stages};
use crate::support::{serial, simulator, sweep};

/// What the fake API server holds and was asked.
#[derive(Default)]
struct Cluster {
    /// Objects by (resource, name): `configmaps`, `services`, `jobs`.
    objects: BTreeMap<(String, String), Value>,
    /// Every create: (resource, name, whether a dry run).
    creates: Vec<(String, String, bool)>,
    /// Every call as RBAC sees it: (verb, resource).
    calls: Vec<(String, String)>,
    /// A refusal the admission of Jobs answers (a quota, say).
    refuse_jobs: Option<String>,
    /// Created Jobs fail at once, their pod never started.
    fail_jobs: bool,
    /// The running pod of each Job: its process id.
    pods: BTreeMap<String, u32>,
    /// Jobs deleted while their pod runs: gone once it has ended.
    deleting: std::collections::BTreeSet<String>,
    /// Each pod's log file, kept after it ends.
    logs: BTreeMap<String, PathBuf>,
    /// Where the claim and the pods' ConfigMap volumes are.
    claim: PathBuf,
    volumes: PathBuf,
}

type Shared = Arc<Mutex<Cluster>>;

/// The fake API server on an ephemeral loopback port, and a kubeconfig
/// naming it.
async fn start_cluster(claim: &Path, dir: &Path) -> (Shared, PathBuf) {
    let state: Shared = Arc::new(Mutex::new(Cluster {
        claim: claim.to_path_buf(),
        volumes: dir.join("volumes"),
        ..Cluster::default()
    }));
    let app = axum::Router::new()
        .fallback(api)
        .with_state(Arc::clone(&state));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://{addr}\n\
             contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n    namespace: bench\n\
             current-context: fake\nusers:\n- name: fake\n  user: {{}}\n"
        ),
    )
    .unwrap();
    (state, kubeconfig)
}

fn status(code: StatusCode, reason: &str, message: &str) -> Response {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code.as_u16(),
    });
    (code, axum::Json(body)).into_response()
}

/// The calls the service makes: create (with `dryRun=All`), get, delete
/// of ConfigMaps, Services and Jobs; list of pods; a pod's log.
async fn api(
    State(state): State<Shared>,
    method: Method,
    uri: Uri,
    RawQuery(query): RawQuery,
    body: Bytes,
) -> Response {
    let query = query.unwrap_or_default();
    let path = uri.path();
    let rest = path
        .strip_prefix("/api/v1/namespaces/bench/")
        .or_else(|| path.strip_prefix("/apis/batch/v1/namespaces/bench/"));
    let Some(rest) = rest else {
        return status(
            StatusCode::NOT_FOUND,
            "NotFound",
            &format!("no route {path}"),
        );
    };
    let parts: Vec<&str> = rest.split('/').collect();
    let mut cluster = state.lock().unwrap();
    let verb = match (&method, parts.len()) {
        (&Method::POST, _) => "create",
        (&Method::DELETE, _) => "delete",
        (_, 1) => "list",
        _ => "get",
    };
    let resource = match parts.as_slice() {
        [_, _, sub] => format!("{}/{sub}", parts[0]),
        _ => parts[0].to_string(),
    };
    cluster.calls.push((verb.to_string(), resource));
    match (method, parts.as_slice()) {
        (Method::POST, [resource]) => {
            let mut object: Value = serde_json::from_slice(&body).unwrap();
            let name = object["metadata"]["name"].as_str().unwrap().to_string();
            let dry_run = query.contains("dryRun=All");
            cluster
                .creates
                .push((resource.to_string(), name.clone(), dry_run));
            let key = (resource.to_string(), name.clone());
            if cluster.objects.contains_key(&key) {
                return status(
                    StatusCode::CONFLICT,
                    "AlreadyExists",
                    &format!("{resource} \"{name}\" already exists"),
                );
            }
            if *resource == "jobs"
                && let Some(refusal) = &cluster.refuse_jobs
            {
                return status(StatusCode::FORBIDDEN, "Forbidden", refusal);
            }
            object["metadata"]["uid"] = json!(format!("uid-{name}"));
            if !dry_run {
                cluster.objects.insert(key, object.clone());
                if *resource == "jobs" {
                    if cluster.fail_jobs {
                        set_condition(&mut object, "Failed", "BackoffLimitExceeded");
                        cluster
                            .objects
                            .insert(("jobs".into(), name.clone()), object.clone());
                    } else {
                        start_pod(&mut cluster, &state, &name, &object);
                    }
                }
            }
            (StatusCode::CREATED, axum::Json(object)).into_response()
        }
        (Method::GET, [resource, name]) => {
            match cluster
                .objects
                .get(&(resource.to_string(), name.to_string()))
            {
                Some(object) => axum::Json(object.clone()).into_response(),
                None => status(
                    StatusCode::NOT_FOUND,
                    "NotFound",
                    &format!("{resource} \"{name}\" not found"),
                ),
            }
        }
        (Method::DELETE, [resource, name]) => {
            let key = (resource.to_string(), name.to_string());
            let Some(object) = cluster.objects.get(&key).cloned() else {
                return status(
                    StatusCode::NOT_FOUND,
                    "NotFound",
                    &format!("{resource} \"{name}\" not found"),
                );
            };
            // Foreground: the pod gets SIGTERM; the Job goes once it ended.
            match cluster.pods.get(*name) {
                Some(pid) if *resource == "jobs" => {
                    let pid = pid.to_string();
                    std::process::Command::new("kill")
                        .args(["-TERM", &pid])
                        .status()
                        .unwrap();
                    cluster.deleting.insert(name.to_string());
                }
                _ => {
                    cluster.objects.remove(&key);
                }
            }
            axum::Json(object).into_response()
        }
        (Method::GET, ["pods"]) => {
            let items: Vec<Value> = cluster
                .logs
                .keys()
                .filter(|job| query.contains(job.as_str()))
                .map(|job| json!({"metadata": {"name": format!("{job}-0-abcde")}}))
                .collect();
            axum::Json(
                json!({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items}),
            )
            .into_response()
        }
        (Method::GET, ["pods", pod, "log"]) => {
            let job = pod.trim_end_matches("-0-abcde");
            let text = cluster
                .logs
                .get(job)
                .and_then(|log| std::fs::read_to_string(log).ok())
                .unwrap_or_default();
            text.into_response()
        }
        (method, _) => status(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            &format!("{method} {path}"),
        ),
    }
}

fn set_condition(job: &mut Value, type_: &str, reason: &str) {
    job["status"] = json!({"conditions": [{
        "type": type_, "status": "True", "reason": reason,
        "message": format!("the fake kubelet says {reason}"),
    }]});
}

/// The kubelet: the Job's command, run here, its ConfigMap's files and the
/// claim mapped to directories; its exit the Job's condition.
fn start_pod(cluster: &mut Cluster, state: &Shared, name: &str, job: &Value) {
    let config = cluster.volumes.join(name);
    std::fs::create_dir_all(&config).unwrap();
    let map = &cluster.objects[&("configmaps".to_string(), name.to_string())];
    for (file, text) in map["data"].as_object().unwrap() {
        std::fs::write(config.join(file), text.as_str().unwrap()).unwrap();
    }
    let container = &job["spec"]["template"]["spec"]["containers"][0];
    let claim = cluster.claim.display().to_string();
    let args: Vec<String> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            a.as_str()
                .unwrap()
                .replace("/etc/nyann-bench", &config.display().to_string())
                .replace("/results", &claim)
        })
        .collect();
    let log = cluster.volumes.join(format!("{name}.log"));
    let out = std::fs::File::create(&log).unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_nyann-bench"))
        .args(["--color", "never"])
        .args(&args)
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .unwrap();
    cluster.pods.insert(name.to_string(), child.id());
    cluster.logs.insert(name.to_string(), log);
    let state = Arc::clone(state);
    let name = name.to_string();
    std::thread::spawn(move || {
        let exit = child.wait().unwrap();
        let mut cluster = state.lock().unwrap();
        cluster.pods.remove(&name);
        let deleted = cluster.deleting.remove(&name);
        let key = ("jobs".to_string(), name);
        if deleted {
            cluster.objects.remove(&key);
            return;
        }
        let Some(job) = cluster.objects.get_mut(&key) else {
            return;
        };
        if exit.success() {
            set_condition(job, "Complete", "CompletionsReached");
        } else {
            set_condition(job, "Failed", "BackoffLimitExceeded");
        }
    });
}

/// The Job a run created, from the fake's objects or its record of them.
fn created(state: &Shared, resource: &str, dry_run: bool) -> Vec<String> {
    state
        .lock()
        .unwrap()
        .creates
        .iter()
        .filter(|(r, _, d)| r == resource && *d == dry_run)
        .map(|(_, name, _)| name.clone())
        .collect()
}

#[tokio::test]
async fn runs_are_jobs_planned_by_dry_run_watched_across_restarts_and_canceled() {
    let _serial = serial().await;
    let sim = simulator(false).await;
    let setup = Setup::new(&sim);
    let (cluster, kubeconfig) = start_cluster(&setup.data(), setup.dir.path()).await;
    let args = [
        "--backend",
        "kubernetes",
        "--kube-image",
        "example.org/nyann-bench:1",
        "--kube-results-claim",
        "nyann-bench-results",
    ];
    let env = [("KUBECONFIG", kubeconfig.as_path())];
    let mut serve = setup.start_with(&args, &env).await;
    let within = Duration::from_secs(120);

    // Plan: the objects are checked by a server-side dry run, none kept.
    let sweep_text = sweep(&[4, 8, 16, 32], crate::sweep::STOPS_AT_16);
    let request = json!({"target": "wide", "scenario": sweep_text});
    let plan = serve
        .call("POST", "/api/v1/plan", Some(READ), Some(request.clone()))
        .await;
    assert_eq!(plan.status, 200, "{}", plan.body);
    for resource in ["configmaps", "services", "jobs"] {
        assert_eq!(created(&cluster, resource, true).len(), 1, "{resource}");
    }
    assert!(cluster.lock().unwrap().objects.is_empty());
    // What the cluster refuses is refused at plan, and nothing is queued.
    cluster.lock().unwrap().refuse_jobs = Some("exceeded quota: pods, requested: pods=1".into());
    let refused = serve
        .call("POST", "/api/v1/runs", Some(SUBMIT), Some(request.clone()))
        .await;
    assert_eq!(refused.status, 400, "{}", refused.body);
    let error = refused.body["error"].as_str().unwrap();
    assert!(
        error.contains(
            "the cluster refuses the run's objects (a server-side dry run): the Job: exceeded quota"
        ),
        "{error}"
    );
    let listed = serve.call("GET", "/api/v1/runs", Some(READ), None).await;
    assert_eq!(
        listed.body["runs"].as_array().unwrap().len(),
        0,
        "{}",
        listed.body
    );
    cluster.lock().unwrap().refuse_jobs = None;

    // A sweep: a Job whose pod writes the run directory on the claim.
    let answer = serve
        .call("POST", "/api/v1/runs", Some(SUBMIT), Some(request))
        .await;
    assert_eq!(answer.status, 201, "{}", answer.body);
    let id = answer.body["id"].as_str().unwrap().to_string();
    let name = format!("nyann-{id}");
    serve
        .wait_for(&id, within, |r| r["status"] == "running")
        .await;
    // The run reads `running` as its objects are being created.
    let key = ("jobs".to_string(), name.clone());
    let deadline = tokio::time::Instant::now() + within;
    let job = loop {
        if let Some(job) = cluster.lock().unwrap().objects.get(&key) {
            break job.clone();
        }
        assert!(tokio::time::Instant::now() < deadline, "no Job {name}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let spec = &job["spec"];
    assert_eq!(spec["completionMode"], "Indexed");
    assert_eq!(spec["completions"], 1);
    let pod = &spec["template"]["spec"];
    assert_eq!(pod["terminationGracePeriodSeconds"], 120);
    let command: Vec<&str> = pod["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    let output = format!("/results/runs/{id}");
    assert_eq!(
        command[..5],
        [
            "generate",
            "--config",
            "/etc/nyann-bench/scenario.json",
            "--output-dir",
            &output
        ]
    );
    assert!(command.contains(&sim.base_url().as_str()), "{command:?}");
    assert!(command.contains(&"--scrape"), "{command:?}");
    assert_eq!(
        pod["volumes"][1]["persistentVolumeClaim"]["claimName"],
        "nyann-bench-results"
    );

    // The service is killed while the Job runs; back, it watches it again
    // and the run ends as the Job does, not `interrupted`.
    tokio::time::sleep(Duration::from_secs(2)).await;
    serve.child.start_kill().unwrap();
    serve.child.wait().await.unwrap();
    let serve = setup.start_with(&args, &env).await;
    let run = serve.wait_for(&id, within, is_final).await;
    assert_eq!(run["status"], "stopped", "{run}");
    let report = serve
        .call(
            "GET",
            &format!("/api/v1/runs/{id}/report.html"),
            Some(READ),
            None,
        )
        .await;
    assert_eq!(report.status, 200, "{}", report.body);
    assert!(run["summary"]["conclusion"].is_object(), "{run}");
    let log = serve
        .call(
            "GET",
            &format!("/api/v1/runs/{id}/artifacts/run.log"),
            Some(READ),
            None,
        )
        .await;
    assert!(
        log.body
            .as_str()
            .unwrap()
            .contains(&format!("== pod {name}-0-abcde ==")),
        "{}",
        log.body
    );
    // A list says what it found without reading its files.
    let listed = serve.call("GET", "/api/v1/runs", Some(READ), None).await;
    let brief = &listed.body["runs"][0]["brief"];
    assert_eq!(brief["stopped_at"], "#2 c=16", "{brief}");
    assert_eq!(brief["capacity"], json!(["#1 c=8"]), "{brief}");
    assert_eq!(brief["stages_skipped"], 1, "{brief}");
    // Its objects are deleted once it ended.
    assert!(cluster.lock().unwrap().objects.is_empty());

    // A cancel: the Job is deleted, its pod drains on SIGTERM and writes
    // every completed record, the run reads `canceled`.
    let long = serve.submit(&stages(30, 2), "long").await;
    let long = long["id"].as_str().unwrap().to_string();
    let before = sim.requests().len();
    serve
        .wait_for(&long, within, |r| r["status"] == "running")
        .await;
    sends(&sim, before + 4, within).await;
    let canceled = serve
        .call(
            "POST",
            &format!("/api/v1/runs/{long}/cancel"),
            Some(ADMIN),
            None,
        )
        .await;
    assert_eq!(canceled.status, 200, "{}", canceled.body);
    let run = serve.wait_for(&long, within, is_final).await;
    assert_eq!(run["status"], "canceled", "{run}");
    assert_eq!(run["canceled_by"], "ops", "{run}");
    let records = lines(&serve.artifact(&long, "requests.jsonl").await.body);
    assert!(records >= 4, "{records} records kept");

    // A Job that fails reads `failed`, with the Job's reason.
    cluster.lock().unwrap().fail_jobs = true;
    let answer = serve
        .call(
            "POST",
            "/api/v1/runs",
            Some(SUBMIT),
            Some(json!({"target": "sim", "scenario": stages(1, 1), "label": "doomed"})),
        )
        .await;
    let doomed = answer.body["id"].as_str().unwrap().to_string();
    let run = serve.wait_for(&doomed, within, is_final).await;
    assert_eq!(run["status"], "failed", "{run}");
    assert!(
        run["message"]
            .as_str()
            .unwrap()
            .contains("its Job failed (BackoffLimitExceeded"),
        "{run}"
    );
    assert_eq!(created(&cluster, "jobs", false).len(), 3);

    // Every call the service made is one the Role of `kube render service`
    // grants.
    for (verb, resource) in &cluster.lock().unwrap().calls {
        assert!(
            nyann_kube::ROLE_RULES.iter().any(|(_, resources, verbs)| {
                resources.contains(&resource.as_str()) && verbs.contains(&verb.as_str())
            }),
            "{verb} {resource} is not granted by the service's Role"
        );
    }
}

/// Against a real cluster, when `NYANN_TEST_KUBECONFIG` names one (no API
/// server can run on the project's test machines): a plan's objects are
/// dry-run by a real API server, in `NYANN_TEST_NAMESPACE` (default
/// `default`); nothing is created.
#[tokio::test]
async fn a_real_cluster_dry_runs_a_plan() {
    let Some(kubeconfig) = std::env::var_os("NYANN_TEST_KUBECONFIG") else {
        eprintln!("NYANN_TEST_KUBECONFIG is not set: no real cluster to dry-run a plan against");
        return;
    };
    let namespace = std::env::var("NYANN_TEST_NAMESPACE").unwrap_or_else(|_| "default".into());
    let sim = simulator(false).await;
    let setup = Setup::new(&sim);
    let args = [
        "--backend",
        "kubernetes",
        "--kube-namespace",
        &namespace,
        "--kube-image",
        "example.org/nyann-bench:1",
        "--kube-results-claim",
        "nyann-bench-results",
    ];
    let env = [("KUBECONFIG", Path::new(&kubeconfig))];
    let serve = setup.start_with(&args, &env).await;
    let plan = serve
        .call(
            "POST",
            "/api/v1/plan",
            Some(READ),
            Some(json!({"target": "sim", "scenario": stages(1, 1)})),
        )
        .await;
    assert_eq!(plan.status, 200, "{}", plan.body);
}
