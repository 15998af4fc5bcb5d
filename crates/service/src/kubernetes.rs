//! The Kubernetes backend: each run a Job in the service's namespace, with
//! the ConfigMap and headless Service that `kube render` builds (the same
//! renderer, nyann-kube), created through the API server with the
//! service's own account. The runs' pods mount the results claim that
//! holds the service's data directory, and write each run's ordinary
//! directory on it (`runs/ID`), which the service reads as it reads a local
//! run's.
//!
//! - a plan is checked by a server-side dry run of the run's objects
//!   (admission, quotas, names), so that what the cluster would refuse is
//!   refused before anything is queued;
//! - a started run is watched (its Job read every [`WATCH_EVERY`]) until the
//!   Job completes, fails or is gone; the pods' logs become the run's log,
//!   then the objects are deleted;
//! - a cancel deletes the Job with foreground propagation: its pods get
//!   SIGTERM, on which `generate` drains and writes every completed record
//!   within the grace period ([`DRAIN_GRACE_S`]), and the Job is gone once
//!   they have ended;
//! - the runs keep running while the service restarts: it watches them
//!   again when it comes back.

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service};
use kube::api::{Api, DeleteParams, ListParams, LogParams, PostParams, PropagationPolicy};
use nyann_kube::{Manifests, PolicyDelivery, RenderConfig};
use nyann_model::Scenario;

use crate::targets::Target;

/// How often a running run's Job is read.
pub const WATCH_EVERY: Duration = Duration::from_secs(2);
/// Seconds a canceled run's pods get to drain and write their records.
pub const DRAIN_GRACE_S: i64 = 120;
/// The field manager the service's objects are created under.
const FIELD_MANAGER: &str = "nyann-bench-serve";

/// Where and with what the runs' Jobs are created.
#[derive(Debug, Clone)]
pub struct ClusterSettings {
    /// The namespace of the runs' objects; else the one the client's
    /// configuration names (in a pod: its own).
    pub namespace: Option<String>,
    /// The image of the runs' pods (with the nyann-bench binary).
    pub image: String,
    /// The PersistentVolumeClaim the service's data directory is on: the
    /// runs' pods mount it and write `runs/ID` under it.
    pub results_claim: String,
}

/// The API server, through the service's credentials.
#[derive(Clone)]
pub struct Cluster {
    client: kube::Client,
    namespace: String,
    settings: ClusterSettings,
}

/// How a run's Job ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobEnd {
    Complete,
    /// Its `Failed` condition's reason and message.
    Failed(String),
    /// Deleted (by a cancel, or by someone else).
    Gone,
}

/// One run's objects, as the service renders them.
pub struct RunObjects<'a> {
    pub run_id: &'a str,
    pub target: &'a Target,
    pub scenario: &'a Scenario,
    /// `builtin`, or a component file on the service's machine (its bytes
    /// go in the ConfigMap).
    pub policy: &'a str,
    /// The target's `generate` flags (URL, model, signals).
    pub target_flags: Vec<String>,
}

impl Cluster {
    /// Connects as the environment says (in a pod: its service account;
    /// elsewhere: `KUBECONFIG` or `~/.kube/config`). Contacts nothing yet.
    pub async fn connect(settings: ClusterSettings) -> Result<Cluster, String> {
        let config = kube::Config::infer()
            .await
            .map_err(|e| format!("cannot find the cluster's configuration: {e}"))?;
        let namespace = settings
            .namespace
            .clone()
            .unwrap_or_else(|| config.default_namespace.clone());
        let client = kube::Client::try_from(config)
            .map_err(|e| format!("cannot make a client of the cluster's configuration: {e}"))?;
        Ok(Cluster {
            client,
            namespace,
            settings,
        })
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The name of a run's objects.
    pub fn object_name(run_id: &str) -> String {
        format!("nyann-{run_id}")
    }

    /// The run's ConfigMap, headless Service and Job.
    pub fn render(&self, run: &RunObjects<'_>) -> Result<Manifests, String> {
        let policy = match run.policy {
            "builtin" => None,
            // Pulled by the leader itself: works on any cluster whose pods
            // reach the registry (image volumes need Kubernetes 1.33+).
            reference if nyann_oci::OciReference::is_reference(reference) => {
                Some(PolicyDelivery::Pull {
                    reference: reference.to_string(),
                })
            }
            file => Some(PolicyDelivery::Inline(
                std::fs::read(file).map_err(|e| format!("cannot read policy {file}: {e}"))?,
            )),
        };
        nyann_kube::render(&RenderConfig {
            name: Cluster::object_name(run.run_id),
            namespace: Some(self.namespace.clone()),
            image: self.settings.image.clone(),
            workers: run.target.workers,
            port: nyann_run::fleet::COORDINATOR_PORT,
            scenario: run.scenario.clone(),
            policy,
            generate_args: run.target_flags.clone(),
            cpu: None,
            memory: None,
            results_claim: Some(self.settings.results_claim.clone()),
            results_subdir: Some(format!("runs/{}", run.run_id)),
            drain_grace_s: Some(DRAIN_GRACE_S),
        })
        .map_err(|e| e.to_string())
    }

    /// Whether the API server would create `objects` (a server-side dry
    /// run: admission, quotas, names). Objects that exist already (the run
    /// was submitted before) are not a refusal.
    pub async fn dry_run(&self, objects: &Manifests) -> Result<(), String> {
        self.create_all(objects, true).await
    }

    /// Creates the run's objects.
    pub async fn create(&self, objects: &Manifests) -> Result<(), String> {
        self.create_all(objects, false).await
    }

    async fn create_all(&self, objects: &Manifests, dry_run: bool) -> Result<(), String> {
        let params = PostParams {
            dry_run,
            field_manager: Some(FIELD_MANAGER.into()),
        };
        let refused = |kind: &str, e: kube::Error| -> Option<String> {
            match &e {
                kube::Error::Api(status) if dry_run && status.code == 409 => None,
                kube::Error::Api(status) => Some(format!("the {kind}: {}", status.message)),
                e => Some(format!("the {kind}: {e}")),
            }
        };
        let ns = self.namespace.as_str();
        if let Err(e) = Api::<ConfigMap>::namespaced(self.client.clone(), ns)
            .create(&params, &objects.config_map)
            .await
            && let Some(refusal) = refused("ConfigMap", e)
        {
            return Err(refusal);
        }
        if let Err(e) = Api::<Service>::namespaced(self.client.clone(), ns)
            .create(&params, &objects.service)
            .await
            && let Some(refusal) = refused("Service", e)
        {
            return Err(refusal);
        }
        if let Err(e) = Api::<Job>::namespaced(self.client.clone(), ns)
            .create(&params, &objects.job)
            .await
            && let Some(refusal) = refused("Job", e)
        {
            return Err(refusal);
        }
        Ok(())
    }

    /// Reads the run's Job until it ends. An API error is retried at the
    /// next reading (the API server may be restarting), never taken for
    /// the run's end.
    pub async fn wait(&self, run_id: &str) -> JobEnd {
        let name = Cluster::object_name(run_id);
        let jobs = Api::<Job>::namespaced(self.client.clone(), &self.namespace);
        loop {
            match jobs.get_opt(&name).await {
                Ok(None) => return JobEnd::Gone,
                Ok(Some(job)) => {
                    if let Some(end) = ended(&job) {
                        return end;
                    }
                }
                Err(e) => tracing::warn!("run {run_id}: cannot read its Job {name}: {e}"),
            }
            tokio::time::sleep(WATCH_EVERY).await;
        }
    }

    /// Deletes the run's Job, its pods first (foreground): each gets
    /// SIGTERM and its grace period to drain. Returns at once; the Job is
    /// gone once its pods have ended.
    pub async fn interrupt(&self, run_id: &str) -> Result<(), String> {
        let name = Cluster::object_name(run_id);
        let params = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Foreground),
            ..DeleteParams::default()
        };
        match Api::<Job>::namespaced(self.client.clone(), &self.namespace)
            .delete(&name, &params)
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(e) => Err(format!("cannot delete the run's Job {name}: {e}")),
        }
    }

    /// After the run's end: its pods' logs appended to `log`, then its
    /// objects deleted (the Job's pods with it). Failures are logged: the
    /// run's records are on the claim already.
    pub async fn clean_up(&self, run_id: &str, log: &Path) {
        let name = Cluster::object_name(run_id);
        let ns = self.namespace.as_str();
        let pods = Api::<Pod>::namespaced(self.client.clone(), ns);
        let selector = format!("app.kubernetes.io/instance={name}");
        let mut text = String::new();
        match pods.list(&ListParams::default().labels(&selector)).await {
            Ok(list) => {
                for pod in list.items {
                    let Some(pod_name) = pod.metadata.name else {
                        continue;
                    };
                    let said = pods
                        .logs(&pod_name, &LogParams::default())
                        .await
                        .unwrap_or_else(|e| format!("(its log cannot be read: {e})\n"));
                    text.push_str(&format!("== pod {pod_name} ==\n{said}"));
                }
            }
            Err(e) => tracing::warn!("run {run_id}: cannot list its pods: {e}"),
        }
        if !text.is_empty()
            && let Err(e) = append(log, &text)
        {
            tracing::warn!("run {run_id}: cannot write its log {}: {e}", log.display());
        }
        let params = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Background),
            ..DeleteParams::default()
        };
        let deleted = [
            Api::<Job>::namespaced(self.client.clone(), ns)
                .delete(&name, &params)
                .await
                .map(|_| ()),
            Api::<Service>::namespaced(self.client.clone(), ns)
                .delete(&name, &params)
                .await
                .map(|_| ()),
            Api::<ConfigMap>::namespaced(self.client.clone(), ns)
                .delete(&name, &params)
                .await
                .map(|_| ()),
        ];
        for result in deleted {
            match result {
                Ok(()) => {}
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(e) => tracing::warn!("run {run_id}: cannot delete its object {name}: {e}"),
            }
        }
    }
}

/// The Job's end, from its conditions.
fn ended(job: &Job) -> Option<JobEnd> {
    let conditions = job.status.as_ref()?.conditions.as_ref()?;
    for condition in conditions.iter().filter(|c| c.status == "True") {
        match condition.type_.as_str() {
            "Complete" => return Some(JobEnd::Complete),
            "Failed" => {
                let said = [condition.reason.as_deref(), condition.message.as_deref()]
                    .into_iter()
                    .flatten()
                    .collect::<Vec<_>>()
                    .join(": ");
                return Some(JobEnd::Failed(said));
            }
            _ => {}
        }
    }
    None
}

fn append(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?
        .write_all(text.as_bytes())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use k8s_openapi::api::batch::v1::{JobCondition, JobStatus};

    fn job_with(conditions: &[(&str, &str)]) -> Job {
        Job {
            status: Some(JobStatus {
                conditions: Some(
                    conditions
                        .iter()
                        .map(|(type_, status)| JobCondition {
                            type_: (*type_).into(),
                            status: (*status).into(),
                            reason: Some("BackoffLimitExceeded".into()),
                            message: Some("Job has reached the specified backoff limit".into()),
                            ..JobCondition::default()
                        })
                        .collect(),
                ),
                ..JobStatus::default()
            }),
            ..Job::default()
        }
    }

    #[test]
    fn a_jobs_end_is_read_from_its_true_conditions() {
        assert_eq!(ended(&Job::default()), None);
        assert_eq!(ended(&job_with(&[("Complete", "False")])), None);
        assert_eq!(
            ended(&job_with(&[
                ("SuccessCriteriaMet", "True"),
                ("Complete", "True")
            ])),
            Some(JobEnd::Complete)
        );
        assert_eq!(
            ended(&job_with(&[("FailureTarget", "True"), ("Failed", "True")])),
            Some(JobEnd::Failed(
                "BackoffLimitExceeded: Job has reached the specified backoff limit".into()
            ))
        );
    }
}
