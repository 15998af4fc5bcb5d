//! Policies shipped through an OCI registry: a real registry (Debian's
//! `docker-registry`, distribution 2.8) started per test on an ephemeral
//! loopback port, over plain HTTP or TLS from the testkit's private CA,
//! with or without htpasswd basic auth; the `oras` Python SDK as the
//! independent client that pushes the way a team's CI would, and pulls
//! what `policy push` wrote.
//!
//! `.ci/run` installs `docker-registry` (apt) and `oras`, `bcrypt` (pip);
//! with `CI` set the tests require them, elsewhere they skip with a message.

mod python;
pub(crate) mod registry;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

use crate::support::{generate_with_env, nyann_bench, scrape_flags, serial, simulator, sweep};
use registry::{
    Home, NEVER, PASSWORD, Registry, USER, builtin_wasm, have_tools, missing, older_builtin_wasm,
    sha256_of, text,
};

/// A one-stage sweep judged by `policy` (the built-in's parameters).
async fn judged_by(sim: &nyann_sim::RunningSim, home: &Home, policy: &str) -> crate::support::Run {
    let mut args = scrape_flags(sim);
    args.extend([
        "--policy".into(),
        policy.into(),
        "--policy-mode".into(),
        "monitor".into(),
    ]);
    generate_with_env(&sim.base_url(), &sweep(&[1], NEVER), &args, &home.env()).await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_policy_oras_pushed_judges_a_sweep_and_is_reused_offline() {
    if !have_tools() {
        return;
    }
    let mut registry = Registry::start(false, false);
    registry.oras_push(
        &builtin_wasm(),
        "team/slo:1.0",
        nyann_oci::WASM_CONFIG_MEDIA_TYPE,
    );
    let home = Home::new();
    let tagged = registry.reference("team/slo:1.0");

    let _serial = serial().await;
    let sim = simulator(false).await;
    let run = judged_by(&sim, &home, &tagged).await;
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let policy = &run.congestion(0)["policy"];
    assert_eq!(policy["name"], "builtin", "{policy}");
    assert_eq!(policy["digest"], sha256_of(&builtin_wasm()).as_str());
    // The tag resolved once, to the manifest's digest: what the run records.
    let pinned = policy["origin"].as_str().unwrap().to_string();
    assert!(pinned.starts_with(&format!("{tagged}@sha256:")), "{pinned}");
    let stages: Value =
        serde_json::from_str(&std::fs::read_to_string(run.dir().join("stages.json")).unwrap())
            .unwrap();
    assert_eq!(
        stages["stages"][0]["annotation"]["congestion"]["policy"]["origin"],
        pinned.as_str()
    );
    // The report names it too, by reference and by the component's digest.
    let report = std::fs::read_to_string(run.dir().join("report.html")).unwrap();
    assert!(
        report.contains(&pinned) && report.contains(&sha256_of(&builtin_wasm())),
        "the report names neither the reference nor the digest"
    );
    crate::support::validate_against_schema(run.dir());

    // The registry gone: the pinned reference comes from the store, the tag
    // from the digest it last resolved to (said on stderr).
    registry.stop();
    let run = judged_by(&sim, &home, &pinned).await;
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(run.congestion(0)["policy"]["origin"], pinned.as_str());
    let run = judged_by(&sim, &home, &tagged).await;
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(run.congestion(0)["policy"]["origin"], pinned.as_str());
    assert!(
        run.stderr().contains("cannot reach the registry"),
        "{}",
        run.stderr()
    );

    // Replay takes the same reference, offline.
    let (code, stdout, stderr) = home
        .nyann(
            &[
                "policy".as_ref(),
                "replay".as_ref(),
                pinned.as_ref(),
                "--run".as_ref(),
                run.dir().as_os_str(),
                "--json".as_ref(),
            ],
            &[],
        )
        .await;
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("\"replayed\""), "{stdout}");

    // Another home, the registry still gone: nothing to fall back on.
    let (code, _, stderr) = Home::new()
        .nyann(
            &["policy".as_ref(), "describe".as_ref(), tagged.as_ref()],
            &[],
        )
        .await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("cannot reach the registry of"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread")]
async fn policy_push_over_tls_with_auth_is_what_oras_pulls() {
    if !have_tools() {
        return;
    }
    let registry = Registry::start(true, true);
    let ca = registry.tls.as_ref().unwrap().ca_pem.clone();
    let home = Home::new();
    let reference = registry.reference("team/builtin:1");
    let push = |extra: Vec<&'static str>, env: Vec<(&'static str, PathBuf)>| {
        let home = &home;
        let reference = reference.clone();
        let ca = ca.clone();
        async move {
            let mut args: Vec<&OsStr> = vec![
                "policy".as_ref(),
                "push".as_ref(),
                builtin_wasm().into_os_string().leak(),
                OsStr::new(reference.clone().leak()),
            ];
            args.extend(extra.iter().map(OsStr::new));
            if !extra.contains(&"--no-ca") {
                args.extend(["--ca-cert".as_ref(), ca.into_os_string().leak() as &OsStr]);
            } else {
                args.retain(|a| *a != "--no-ca");
            }
            let env: Vec<(&str, &OsStr)> = env.iter().map(|(k, v)| (*k, v.as_os_str())).collect();
            home.nyann(&args, &env).await
        }
    };

    // No credentials: the registry's 401, said with what to do.
    let (code, _, stderr) = push(vec![], vec![]).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("refused") && stderr.contains("docker login"),
        "{stderr}"
    );
    // The CA not trusted: a TLS error that names --ca-cert.
    let (code, _, stderr) = push(vec!["--no-ca"], vec![]).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("--ca-cert"), "{stderr}");

    // Credentials as `docker login` writes them.
    let auth_file = home.dir.path().join("auth.json");
    let auth = Command::new("base64")
        .arg("-w0")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write;
            child
                .stdin
                .take()
                .unwrap()
                .write_all(format!("{USER}:{PASSWORD}").as_bytes())?;
            child.wait_with_output()
        })
        .unwrap();
    std::fs::write(
        &auth_file,
        format!(
            r#"{{"auths": {{"{}": {{"auth": "{}"}}}}}}"#,
            registry.host(),
            text(&auth.stdout)
        ),
    )
    .unwrap();
    let (code, stdout, stderr) = push(
        vec!["--source", "https://example.com/team/policy"],
        vec![("REGISTRY_AUTH_FILE", auth_file.clone())],
    )
    .await;
    assert_eq!(code, Some(0), "{stderr}");
    let pinned = stdout.trim().to_string();
    assert!(
        pinned.starts_with(&format!("{reference}@sha256:")),
        "{pinned}"
    );
    assert!(stderr.contains(&sha256_of(&builtin_wasm())), "{stderr}");

    // oras pulls the same bytes, and the manifest carries the layout and
    // the annotations.
    let out = registry.dir.path().join("pulled");
    let manifest = registry.oras(
        true,
        "import json\nclient.pull(target=sys.argv[1], outdir=sys.argv[2])\n\
         print(json.dumps(client.get_manifest(sys.argv[1])))",
        &[
            pinned.strip_prefix("oci://").unwrap().as_ref(),
            out.as_os_str(),
        ],
    );
    assert_eq!(
        std::fs::read(out.join("policy.wasm")).unwrap(),
        std::fs::read(builtin_wasm()).unwrap()
    );
    let manifest: Value = serde_json::from_str(manifest.trim()).unwrap();
    assert_eq!(
        manifest["config"]["mediaType"],
        nyann_oci::WASM_CONFIG_MEDIA_TYPE
    );
    assert_eq!(manifest["layers"][0]["mediaType"], "application/wasm");
    let annotations = &manifest["annotations"];
    assert_eq!(annotations["org.opencontainers.image.title"], "builtin");
    assert_eq!(
        annotations["org.opencontainers.image.source"],
        "https://example.com/team/policy"
    );
    assert_eq!(
        annotations["dev.nyann-bench.policy.interface"],
        "nyann:policy@0.5"
    );
    assert!(annotations["org.opencontainers.image.version"].is_string());

    // It loads back by reference over TLS with the same credentials; in
    // another home without them, the registry's 401 is said, not retried.
    let describe: [&OsStr; 5] = [
        "policy".as_ref(),
        "describe".as_ref(),
        pinned.as_ref(),
        "--ca-cert".as_ref(),
        ca.as_os_str(),
    ];
    let (code, stdout, stderr) = home
        .nyann(&describe, &[("REGISTRY_AUTH_FILE", auth_file.as_os_str())])
        .await;
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains(&pinned), "{stdout}");
    let (code, _, stderr) = Home::new().nyann(&describe, &[]).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("the registry refused") && stderr.contains("--policy-registry-token"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn moved_tags_tampered_blobs_and_images_are_told_apart() {
    if !have_tools() {
        return;
    }
    let registry = Registry::start(false, false);
    let home = Home::new();
    let moving = registry.reference("team/slo:stable");

    let _serial = serial().await;
    let sim = simulator(false).await;
    // A tag moved between two runs: each records its own digest.
    registry.oras_push(
        &builtin_wasm(),
        "team/slo:stable",
        nyann_oci::WASM_CONFIG_MEDIA_TYPE,
    );
    let first = judged_by(&sim, &home, &moving).await;
    assert_eq!(first.code(), Some(0), "{}", first.stderr());
    registry.oras_push(
        &older_builtin_wasm(),
        "team/slo:stable",
        nyann_oci::WASM_CONFIG_MEDIA_TYPE,
    );
    let second = judged_by(&sim, &home, &moving).await;
    assert_eq!(second.code(), Some(0), "{}", second.stderr());
    let (a, b) = (
        &first.congestion(0)["policy"],
        &second.congestion(0)["policy"],
    );
    assert_eq!(a["digest"], sha256_of(&builtin_wasm()).as_str());
    assert_eq!(b["digest"], sha256_of(&older_builtin_wasm()).as_str());
    assert_ne!(a["origin"], b["origin"]);

    // An allow list refuses the other one before compiling it.
    let mut args = scrape_flags(&sim);
    let allowed = sha256_of(&builtin_wasm());
    args.extend([
        "--policy".into(),
        moving.clone(),
        "--policy-allow".into(),
        allowed,
    ]);
    let (code, _, stderr) = refused_run(&sim, &home, &args).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("is not on this host's allow list")
            && stderr.contains("--policy-allow sha256:"),
        "{stderr}"
    );

    // A layer altered in the registry's storage: refused, nothing kept.
    registry.oras_push(
        &builtin_wasm(),
        "team/tampered:1",
        nyann_oci::WASM_CONFIG_MEDIA_TYPE,
    );
    let blob = registry.blob_file(&sha256_of(&builtin_wasm()));
    let mut bytes = std::fs::read(&blob).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&blob, bytes).unwrap();
    let fresh = Home::new();
    let (code, _, stderr) = fresh
        .nyann(
            &[
                "policy".as_ref(),
                "describe".as_ref(),
                registry.reference("team/tampered:1").as_ref(),
            ],
            &[],
        )
        .await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("altered") && stderr.contains("nothing of it was used"),
        "{stderr}"
    );
    assert!(
        !fresh.dir.path().join("policies").exists(),
        "something was compiled"
    );

    // A component over --policy-max-size: refused before it is downloaded.
    let (code, _, stderr) = fresh
        .nyann(
            &[
                "policy".as_ref(),
                "describe".as_ref(),
                moving.as_ref(),
                "--policy-max-size".as_ref(),
                "1KiB".as_ref(),
            ],
            &[],
        )
        .await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("over the 1024-byte limit") && stderr.contains("--policy-max-size"),
        "{stderr}"
    );

    // A container image, a tag that does not exist.
    registry.oras_push(
        &builtin_wasm(),
        "team/image:1",
        "application/vnd.oci.image.config.v1+json",
    );
    let (code, _, stderr) = fresh
        .nyann(
            &[
                "policy".as_ref(),
                "describe".as_ref(),
                registry.reference("team/image:1").as_ref(),
            ],
            &[],
        )
        .await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("is not a WebAssembly component artifact"),
        "{stderr}"
    );
    let (code, _, stderr) = fresh
        .nyann(
            &[
                "policy".as_ref(),
                "describe".as_ref(),
                registry.reference("team/slo:nope").as_ref(),
            ],
            &[],
        )
        .await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("does not exist in its registry"),
        "{stderr}"
    );
}

/// `generate` with `args`, expected to be refused before any load.
async fn refused_run(
    sim: &nyann_sim::RunningSim,
    home: &Home,
    args: &[String],
) -> (Option<i32>, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("scenario.star");
    std::fs::write(&config, sweep(&[1], NEVER)).unwrap();
    let mut all: Vec<&OsStr> = vec!["generate".as_ref(), "--config".as_ref(), config.as_os_str()];
    let target = sim.base_url();
    all.extend(["--target".as_ref(), target.as_ref() as &OsStr]);
    all.extend(args.iter().map(OsStr::new));
    home.nyann(&all, &[]).await
}

/// `kube render --policy oci://...@sha256:...`: an image volume pinned by
/// digest mounted where the command's `--policy` looks, no policy bytes in
/// the ConfigMap, valid against the Kubernetes schemas; `--policy-delivery
/// pull` names the reference on the command instead; a tag is refused.
#[tokio::test]
async fn kube_render_mounts_a_registry_policy_by_digest() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("sweep.star");
    std::fs::write(&config, sweep(&[4, 8], NEVER)).unwrap();
    let digest = sha256_of(&builtin_wasm());
    let pinned = format!("oci://registry.example.com/team/slo:1@{digest}");
    let render = |policy: String, delivery: &'static str| {
        let mut command = nyann_bench();
        command
            .args(["kube", "render", "--config"])
            .arg(&config)
            .args(["--workers", "2", "--image", "example.org/nyann-bench:1"])
            .args(["--policy", &policy, "--policy-delivery", delivery])
            .args(["--", "--target", "http://vllm:8000/v1"]);
        command.output()
    };
    let out = render(pinned.clone(), "image-volume").await.unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let list: Value = serde_json::from_slice(&out.stdout).unwrap();
    let items = list["items"].as_array().unwrap();
    assert_eq!(
        items[0]["binaryData"],
        Value::Null,
        "no policy bytes in the ConfigMap"
    );
    let pod = &items[2]["spec"]["template"]["spec"];
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "policy")
        .unwrap();
    assert_eq!(
        volume["image"]["reference"],
        format!("registry.example.com/team/slo@{digest}").as_str()
    );
    let args = pod["containers"][0]["args"].to_string();
    assert!(
        args.contains(r#""--policy","/etc/nyann-bench-policy/policy.wasm""#),
        "{args}"
    );
    let mounts = pod["containers"][0]["volumeMounts"].to_string();
    assert!(mounts.contains("/etc/nyann-bench-policy"), "{mounts}");
    validate_kube(dir.path(), items);

    let out = render(pinned.clone(), "pull").await.unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let list: Value = serde_json::from_slice(&out.stdout).unwrap();
    let pod = &list["items"][2]["spec"]["template"]["spec"];
    assert!(pod["containers"][0]["args"].to_string().contains(&pinned));
    assert!(!pod["volumes"].to_string().contains("\"policy\""));
    validate_kube(dir.path(), list["items"].as_array().unwrap());

    let out = render(
        "oci://registry.example.com/team/slo:1".into(),
        "image-volume",
    )
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("pin it by digest"),
        "{}",
        text(&out.stderr)
    );
}

/// Every object through `kubernetes-validate --strict` (PyPI, offline
/// schemas; `.ci/run` installs it, with `CI` set it is required).
fn validate_kube(dir: &Path, items: &[Value]) {
    let files: Vec<PathBuf> = items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let file = dir.join(format!("item{i}.json"));
            std::fs::write(&file, item.to_string()).unwrap();
            file
        })
        .collect();
    let checked = Command::new("python3")
        .args(["-m", "kubernetes_validate", "--strict"])
        .args(&files)
        .current_dir(dir)
        .output()
        .unwrap();
    let said = format!("{}{}", text(&checked.stdout), text(&checked.stderr));
    if said.contains("No module named kubernetes_validate") {
        missing(
            "kubernetes-validate",
            "python3 -m pip install kubernetes-validate==1.37.0",
        );
        return;
    }
    assert!(checked.status.success(), "{said}");
    assert_eq!(
        said.matches(" passed for resource ").count(),
        items.len(),
        "{said}"
    );
}
