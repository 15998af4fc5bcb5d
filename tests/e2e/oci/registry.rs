//! The harness of the registry tests: a `docker-registry` process on an
//! ephemeral loopback port (plain HTTP or TLS, htpasswd auth or none), the
//! `oras` SDK as the independent client, and a home of the test's own
//! (policy store, code cache, no credentials of the machine's user).

use std::ffi::OsStr;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nyann_testkit::PrivateCa;
use tempfile::TempDir;

use crate::support::nyann_bench;

const REGISTRY_BIN: &str = "/usr/bin/docker-registry";
const ORAS: &str = "0.2.43";
pub(crate) const USER: &str = "team";
pub(crate) const PASSWORD: &str = "s3cret-pass";
/// The built-in's thresholds, none reached: every run is judged, none stops.
pub(crate) const NEVER: &str = r#"waiting_requests_p50=100000, ttft_p99="1h""#;

pub(crate) fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A missing tool: a failure with `CI` set, else a skip said once per test.
pub(crate) fn missing(what: &str, install: &str) -> bool {
    assert!(
        std::env::var_os("CI").is_none(),
        "{what} is not installed (CI must install it: {install}; .ci/run does)"
    );
    eprintln!("{what} is not installed: the test is skipped ({install})");
    false
}

pub(crate) fn have_tools() -> bool {
    if !Path::new(REGISTRY_BIN).exists() {
        return missing("docker-registry", "apt-get install docker-registry");
    }
    let version = Command::new("python3")
        .args([
            "-c",
            "import oras.version, bcrypt; print(oras.version.__version__)",
        ])
        .current_dir(env!("CARGO_TARGET_TMPDIR"))
        .output();
    match version {
        Ok(out) if text(&out.stdout).trim() == ORAS => true,
        _ => missing(
            "PyPI's oras 0.2.43 and bcrypt",
            "python3 -m pip install oras==0.2.43 bcrypt==5.0.0",
        ),
    }
}

/// The built-in policy's committed component, and an older build of it
/// (another digest, the same parameters).
pub(crate) fn builtin_wasm() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies/builtin/builtin.wasm")
}

pub(crate) fn older_builtin_wasm() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../crates/policy-host/tests/fixtures/builtin-0.3.wasm")
}

pub(crate) fn sha256_of(path: &Path) -> String {
    let out = Command::new("sha256sum").arg(path).output().unwrap();
    format!("sha256:{}", text(&out.stdout).split(' ').next().unwrap())
}

/// A running `docker-registry`, stopped (by its PID) when dropped.
pub(crate) struct Registry {
    pub(crate) child: Child,
    pub(crate) addr: SocketAddr,
    pub(crate) dir: TempDir,
    pub(crate) tls: Option<PrivateCa>,
}

impl Registry {
    /// Started on 127.0.0.1, port chosen by the kernel (read back from
    /// the process' own listening socket), storage in a temporary directory.
    pub(crate) fn start(tls: bool, auth: bool) -> Registry {
        let dir = tempfile::tempdir().unwrap();
        let tls = tls.then(|| PrivateCa::new().unwrap());
        let mut config = format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n\
             http:\n  addr: 127.0.0.1:0\n",
            dir.path().join("data").display()
        );
        if let Some(ca) = &tls {
            config += &format!(
                "  tls:\n    certificate: {}\n    key: {}\n",
                ca.server_cert.display(),
                ca.server_key.display()
            );
        }
        if auth {
            let htpasswd = dir.path().join("htpasswd");
            let line = Command::new("python3")
                .args([
                    "-c",
                    "import bcrypt, sys; print(sys.argv[1] + ':' + \
                     bcrypt.hashpw(sys.argv[2].encode(), bcrypt.gensalt(rounds=5)).decode())",
                    USER,
                    PASSWORD,
                ])
                .current_dir(dir.path())
                .output()
                .unwrap();
            assert!(line.status.success(), "{}", text(&line.stderr));
            std::fs::write(&htpasswd, &line.stdout).unwrap();
            config += &format!(
                "auth:\n  htpasswd:\n    realm: nyann\n    path: {}\n",
                htpasswd.display()
            );
        }
        let config_file = dir.path().join("config.yml");
        std::fs::write(&config_file, config).unwrap();
        let child = Command::new(REGISTRY_BIN)
            .arg("serve")
            .arg(&config_file)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("registry.log")).unwrap())
            .spawn()
            .unwrap();
        let mut registry = Registry {
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            child,
            dir,
            tls,
        };
        registry.addr = registry.listening();
        registry
    }

    /// The address the process listens on: its socket inodes in
    /// /proc/PID/fd matched against the LISTEN lines of /proc/PID/net/tcp.
    fn listening(&mut self) -> SocketAddr {
        let pid = self.child.id();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("docker-registry exited ({status}): {}", self.log());
            }
            let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
                .into_iter()
                .flatten()
                .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
                .filter_map(|link| {
                    let link = link.to_string_lossy().into_owned();
                    Some(
                        link.strip_prefix("socket:[")?
                            .strip_suffix(']')?
                            .to_string(),
                    )
                })
                .collect();
            let table = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")).unwrap_or_default();
            for line in table.lines().skip(1) {
                let fields: Vec<&str> = line.split_whitespace().collect();
                if fields.len() > 9 && fields[3] == "0A" && inodes.iter().any(|i| i == fields[9]) {
                    let port = fields[1].split(':').nth(1).unwrap();
                    let port = u16::from_str_radix(port, 16).unwrap();
                    return SocketAddr::from(([127, 0, 0, 1], port));
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("docker-registry did not listen within 20 s: {}", self.log());
    }

    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }

    pub(crate) fn host(&self) -> String {
        self.addr.to_string()
    }

    pub(crate) fn reference(&self, repo_tag: &str) -> String {
        format!("oci://{}/{repo_tag}", self.host())
    }

    /// The file of a blob in the registry's storage.
    pub(crate) fn blob_file(&self, digest: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").unwrap();
        self.dir
            .path()
            .join("data/docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }

    /// Runs an `oras` SDK script against this registry (`client` set up:
    /// TLS trusting the CA, logged in when `auth`); its stdout.
    pub(crate) fn oras(&self, auth: bool, script: &str, args: &[&OsStr]) -> String {
        let setup = format!(
            "import sys, oras.client\nclient = oras.client.OrasClient(hostname={host:?}, \
             insecure={insecure}, tls_verify={verify}, auth_backend={backend:?})\n{login}",
            // htpasswd: basic auth on every request (oras' default asks for a token).
            backend = if auth { "basic" } else { "token" },
            host = self.host(),
            insecure = if self.tls.is_some() { "False" } else { "True" },
            verify = match &self.tls {
                Some(ca) => format!("{:?}", ca.ca_pem.display().to_string()),
                None => "False".into(),
            },
            login = if auth {
                format!(
                    "client.login(username={USER:?}, password={PASSWORD:?}, hostname={:?})\n",
                    self.host()
                )
            } else {
                String::new()
            },
        );
        let out = Command::new("python3")
            .arg("-c")
            .arg(setup + script)
            .args(args)
            .current_dir(self.dir.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "oras failed:\n{}{}\nregistry log:\n{}",
            text(&out.stdout),
            text(&out.stderr),
            self.log()
        );
        text(&out.stdout)
    }

    /// Pushes `wasm` with oras as a Wasm component artifact, as a team's
    /// CI would (config `application/vnd.wasm.config.v0+json`, one
    /// `application/wasm` layer).
    pub(crate) fn oras_push(&self, wasm: &Path, repo_tag: &str, config_type: &str) {
        std::fs::copy(wasm, self.dir.path().join("policy.wasm")).unwrap();
        std::fs::write(self.dir.path().join("config.json"), "{}").unwrap();
        self.oras(
            false,
            "client.push(target=sys.argv[1], files=['policy.wasm:application/wasm'], \
             manifest_config='config.json:' + sys.argv[2])",
            &[
                format!("{}/{repo_tag}", self.host()).as_ref(),
                config_type.as_ref(),
            ],
        );
    }

    /// Stops the registry (its PID) and waits for it.
    pub(crate) fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A policy store and code cache of the test's own: `NYANN_BENCH_CACHE_DIR`.
pub(crate) struct Home {
    pub(crate) dir: TempDir,
    /// `XDG_STATE_HOME`: the key the code cache's entries are checked with.
    state: PathBuf,
}

impl Home {
    pub(crate) fn new() -> Home {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().to_path_buf();
        Home { dir, state }
    }

    /// A home with an empty policy store whose code cache is the one of
    /// `cache` and `state` (a link to it): a component compiled there is
    /// not compiled again, but it is pulled again.
    pub(crate) fn sharing_code_of(cache: &Path, state: &Path) -> Home {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(cache.join("policies")).unwrap();
        std::os::unix::fs::symlink(cache.join("policies"), dir.path().join("policies")).unwrap();
        Home {
            dir,
            state: state.to_path_buf(),
        }
    }

    pub(crate) fn env(&self) -> Vec<(&'static str, &OsStr)> {
        vec![
            ("NYANN_BENCH_CACHE_DIR", self.dir.path().as_os_str()),
            ("XDG_STATE_HOME", self.state.as_os_str()),
            // No credentials of the machine's user.
            ("DOCKER_CONFIG", self.dir.path().as_os_str()),
        ]
    }

    /// `nyann-bench ARGS` with this home: exit code, stdout, stderr.
    pub(crate) async fn nyann(
        &self,
        args: &[&OsStr],
        env: &[(&str, &OsStr)],
    ) -> (Option<i32>, String, String) {
        let out = nyann_bench()
            .args(args)
            .envs(self.env())
            .envs(env.iter().copied())
            .output()
            .await
            .unwrap();
        (out.status.code(), text(&out.stdout), text(&out.stderr))
    }
}
