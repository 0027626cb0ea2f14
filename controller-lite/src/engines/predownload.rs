//! Pre-download for rollouts over many pods: before pods are updated in place, the new
//! images are pulled on the nodes of the pods still on the old version, as ImagePullJobs
//! (the issue 3 engine through the job engine), with Kruise's two knobs:
//! `image-predownload-parallelism` (nodes pulling at once, default 1) and
//! `image-predownload-min-updated-ready-pods` (wait until that many updated pods are
//! ready, so a broken new version does not fill every node's disk; default 0). On by
//! default; a rollout (SidecarSet, issue 8) calls [`plan`] each time it reconciles and
//! applies what it returns. A single pod's update pre-downloads on its own node anyway
//! (the agent pulls before it stops anything).

use std::collections::BTreeSet;

use rigger_api::image_pull_job::{
    self, CompletionPolicy, CompletionPolicyType, ImagePullJob, ImagePullJobSpec, NodeSelector,
};
use rigger_api::{API_VERSION, IntOrPercent, ObjectMeta};

/// Kruise's knobs, with its defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PreDownload {
    pub enabled: bool,
    pub parallelism: u32,
    pub min_updated_ready_pods: u32,
}

impl Default for PreDownload {
    fn default() -> Self {
        Self {
            enabled: true,
            parallelism: 1,
            min_updated_ready_pods: 0,
        }
    }
}

/// One pod of a rollout as the planner needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RolloutPod {
    pub node: String,
    pub updated: bool,
    pub ready: bool,
}

/// Finished pre-download jobs are deleted this long after (Kruise keeps them a while
/// for inspection too).
const TTL_SECONDS: u64 = 600;
/// A pre-download that runs longer than this gives up (the update pulls on its own then).
const DEADLINE_SECONDS: u64 = 1800;

/// The ImagePullJobs that pre-download `images` for rollout `owner` at `revision`: one
/// per image, over the nodes of pods not updated yet. Empty while gated (too few updated
/// pods ready), when disabled, or when every pod is updated already.
pub fn plan(
    owner: &str,
    namespace: &str,
    revision: &str,
    images: &[String],
    pods: &[RolloutPod],
    settings: PreDownload,
) -> Vec<ImagePullJob> {
    if !settings.enabled {
        return Vec::new();
    }
    let updated_ready = pods.iter().filter(|p| p.updated && p.ready).count();
    if updated_ready < settings.min_updated_ready_pods as usize {
        return Vec::new();
    }
    let nodes: BTreeSet<&str> = pods
        .iter()
        .filter(|p| !p.updated)
        .map(|p| p.node.as_str())
        .collect();
    if nodes.is_empty() {
        return Vec::new();
    }
    images
        .iter()
        .map(|image| ImagePullJob {
            api_version: API_VERSION.to_owned(),
            kind: image_pull_job::KIND.to_owned(),
            metadata: ObjectMeta {
                name: job_name(owner, revision, image),
                namespace: Some(namespace.to_owned()),
                ..ObjectMeta::default()
            },
            spec: ImagePullJobSpec {
                image: image.clone(),
                selector: Some(NodeSelector {
                    names: nodes.iter().map(|n| (*n).to_owned()).collect(),
                    ..NodeSelector::default()
                }),
                pod_selector: None,
                parallelism: Some(IntOrPercent::Int(settings.parallelism.max(1))),
                completion_policy: CompletionPolicy {
                    kind: CompletionPolicyType::Always,
                    active_deadline_seconds: Some(DEADLINE_SECONDS),
                    ttl_seconds_after_finished: Some(TTL_SECONDS),
                },
                pull_policy: image_pull_job::PullPolicy::default(),
                pull_secrets: Vec::new(),
                sandbox_config: None,
                image_pull_policy: image_pull_job::ImagePullPolicy::IfNotPresent,
            },
            status: None,
        })
        .collect()
}

/// `<owner>-<revision>-<8 hex of the image>`: stable, so applying the plan again is a
/// no-op, and a DNS label like every object name.
fn job_name(owner: &str, revision: &str, image: &str) -> String {
    use sha2::Digest as _;
    let hash: String = hex::encode(&sha2::Sha256::digest(image.as_bytes())[..4]);
    let prefix: String = format!("{owner}-{revision}")
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .take(52)
        .collect();
    format!("{}-{hash}", prefix.trim_matches('-'))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn pod(node: &str, updated: bool, ready: bool) -> RolloutPod {
        RolloutPod {
            node: node.to_owned(),
            updated,
            ready,
        }
    }

    #[test]
    fn old_version_nodes_pull_with_the_parallelism_once_enough_updated_pods_are_ready() {
        let images = vec!["r.example/proxy:2".to_owned()];
        let pods = [
            pod("n1", true, true),
            pod("n2", false, true),
            pod("n3", false, true),
            pod("n2", false, false),
        ];
        let gated = PreDownload {
            min_updated_ready_pods: 2,
            parallelism: 2,
            ..PreDownload::default()
        };
        assert!(plan("sidecarset-mesh", "default", "v2", &images, &pods, gated).is_empty());
        let open = PreDownload {
            min_updated_ready_pods: 1,
            ..gated
        };
        let jobs = plan("sidecarset-mesh", "default", "v2", &images, &pods, open);
        assert_eq!(jobs.len(), 1);
        let job = &jobs[0];
        assert_eq!(job.spec.selector.as_ref().unwrap().names, ["n2", "n3"]);
        assert_eq!(job.spec.parallelism, Some(IntOrPercent::Int(2)));
        job.validate().unwrap();
        // The same plan again names the same job: applying it is a no-op.
        let again = plan("sidecarset-mesh", "default", "v2", &images, &pods, open);
        assert_eq!(again[0].metadata.name, job.metadata.name);
    }

    #[test]
    fn nothing_when_disabled_or_everything_is_updated() {
        let images = vec!["r.example/proxy:2".to_owned()];
        let off = PreDownload {
            enabled: false,
            ..PreDownload::default()
        };
        assert!(
            plan(
                "o",
                "default",
                "v2",
                &images,
                &[pod("n1", false, true)],
                off
            )
            .is_empty()
        );
        let done = [pod("n1", true, true)];
        assert!(plan("o", "default", "v2", &images, &done, PreDownload::default()).is_empty());
    }
}
