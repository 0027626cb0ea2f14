//! `kind: NodeImage` — OpenKruise's per-node view of image pulls, read-only here: never
//! applied, built when read from what the controller knows. `spec.images` are the pulls
//! ImagePullJobs ask of the node (with the jobs as owners), `status.imageStatuses` their
//! state on the node, plus every image the node's inventory holds (Succeeded, with its
//! digest), so one object answers "what does this node have, and what is it pulling".

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::image_pull_job::{CompletionPolicyType, ImagePullJob, NodePullPhase, NodePullStatus};
use super::node::Node;
use crate::fields::ObjectMeta;

use std::time::SystemTime;

use crate::kind::KindInfo;
use crate::table::Columns;

pub const KIND: &str = "NodeImage";

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeImage {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: NodeImageSpec,
    /// Empty until the node's pulls are reported (a NodeImage is created spec first).
    #[serde(default)]
    pub status: NodeImageStatus,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeImageSpec {
    /// By image name (the reference without its tag or digest).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub images: BTreeMap<String, ImageSpec>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImageSpec {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pull_secrets: Vec<ReferenceObject>,
    pub tags: Vec<ImageTagSpec>,
    /// Kruise passes it to CRI's PullImage; Rigger pulls through containerd's API, where
    /// a pull has no sandbox: kept, sent nowhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_config: Option<serde_json::Value>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReferenceObject {
    pub namespace: String,
    pub name: String,
    /// v1beta1: how the secret is used (Kruise's `mode`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImageTagSpec {
    /// The tag, or the digest of a reference by digest.
    pub tag: String,
    /// When the tag was asked for (Kruise's manager writes it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<String>,
    #[serde(default)]
    pub pull_policy: TagPullPolicy,
    /// Kruise's manager always writes these; its Go type lets them be left out.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub owner_references: Vec<ObjectReference>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image_pull_policy: String,
    /// Bumped by the writer to ask for the tag again; the status echoes the version pulled.
    #[serde(default, skip_serializing_if = "is_zero_i64")]
    pub version: i64,
}

fn is_zero_i64(n: &i64) -> bool {
    *n == 0
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TagPullPolicy {
    /// Per attempt [default: 600, as Kruise's daemon].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<u64>,
    /// Retries after the first attempt [default: 3].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff_limit: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds_after_finished: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_deadline_seconds: Option<u64>,
}

/// Kubernetes' ObjectReference, as Kruise's owners of a tag.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObjectReference {
    pub api_version: String,
    pub kind: String,
    pub namespace: String,
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeImageStatus {
    /// Tags in the spec, and how many of them are in each phase.
    pub desired: u32,
    pub succeeded: u32,
    pub failed: u32,
    pub pulling: u32,
    pub waiting: u32,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub image_statuses: BTreeMap<String, ImageStatus>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImageStatus {
    pub tags: Vec<ImageTagStatus>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImageTagStatus {
    pub tag: String,
    pub phase: NodePullPhase,
    /// Percent of the bytes fetched, while pulling.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub progress: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<String>,
    /// `name@digest` once the node has it.
    #[serde(rename = "imageID", default, skip_serializing_if = "String::is_empty")]
    pub image_id: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// The spec version this status is for.
    #[serde(default, skip_serializing_if = "is_zero_i64")]
    pub version: i64,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// An image reference split as Kruise keys it: the name in Docker's familiar form
/// (`nginx`, not `docker.io/library/nginx`: one image, one key, whichever way a job
/// spells it), and the tag (`latest` when none) or the digest.
pub fn split_reference(reference: &str) -> (&str, &str) {
    // The name and its tag, if any; a digest, when there is one, is what is kept.
    let (named, digest) = match reference.split_once('@') {
        Some((named, digest)) => (named, Some(digest)),
        None => (reference, None),
    };
    let slash = named.rfind('/').map_or(0, |i| i + 1);
    let (name, tag) = match named[slash..].rfind(':') {
        Some(i) => (&named[..slash + i], &named[slash + i + 1..]),
        None => (named, "latest"),
    };
    (familiar(name), digest.unwrap_or(tag))
}

/// Docker Hub's names without its domain, and its official images without `library/`
/// (a name whose first part is no host, `library/nginx`, is Docker Hub's too).
fn familiar(name: &str) -> &str {
    let hub = name
        .strip_prefix("docker.io/")
        .or_else(|| name.strip_prefix("index.docker.io/"));
    let has_host = name
        .split_once('/')
        .is_some_and(|(first, _)| first.contains(['.', ':']) || first == "localhost");
    let path = match hub {
        Some(path) => path,
        None if !has_host => name,
        None => return name,
    };
    match path.strip_prefix("library/") {
        Some(official) if !official.contains('/') => official,
        _ => path,
    }
}

/// A tag's pull policy as Kruise's manager writes it for `job` (its NodeImage webhook
/// refuses a tag without `ttlSecondsAfterFinished`, so a NodeImage Rigger wrote must have
/// one for Kruise's manager to take it over): the job's ttl, else its deadline, else its
/// attempts' whole time, plus Kruise's default grace of 300 s for Always; a day for
/// Never, with a deadline of every attempt's time, at least half an hour. Kruise adds up to 300 s (Always) or
/// ±600 s (Never) at random to spread its daemons' cleanups; Rigger's are exact.
fn tag_pull_policy(job: &ImagePullJob) -> TagPullPolicy {
    const ALWAYS_GRACE: u64 = 300;
    const NEVER_TTL: u64 = 24 * 3600;
    const NEVER_DEADLINE: u64 = 1800;
    let pull = &job.spec.pull_policy;
    let completion = &job.spec.completion_policy;
    let (ttl, deadline) = match completion.kind {
        // Every attempt with its whole timeout (kruise#2071: Kruise's manager gives the
        // node max(1800 s, one timeout) in all).
        CompletionPolicyType::Never => (
            NEVER_TTL,
            Some(
                pull.timeout_seconds
                    .saturating_mul(u64::from(pull.backoff_limit) + 1)
                    .max(NEVER_DEADLINE),
            ),
        ),
        CompletionPolicyType::Always => {
            let lifetime = completion
                .ttl_seconds_after_finished
                .or(completion.active_deadline_seconds)
                .unwrap_or_else(|| {
                    pull.timeout_seconds
                        .saturating_mul(u64::from(pull.backoff_limit))
                });
            (
                lifetime.saturating_add(ALWAYS_GRACE),
                completion.active_deadline_seconds,
            )
        }
    };
    // Kruise's fields are int32 (its manager could not read a NodeImage past that back).
    let int32 = |n: u64| n.min(u64::from(i32::MAX.unsigned_abs()));
    TagPullPolicy {
        timeout_seconds: Some(int32(pull.timeout_seconds)),
        backoff_limit: Some(pull.backoff_limit),
        ttl_seconds_after_finished: Some(int32(ttl)),
        active_deadline_seconds: deadline.map(int32),
    }
}

/// `node`'s NodeImage: `pulls` are the jobs (with their status) that include the node,
/// each with the node's entry.
pub fn node_image(node: &Node, pulls: &[(&ImagePullJob, &NodePullStatus)]) -> NodeImage {
    let mut out = NodeImage {
        api_version: crate::fields::KRUISE_API_VERSION_V1BETA1.to_owned(),
        kind: KIND.to_owned(),
        metadata: ObjectMeta {
            name: node.metadata.name.clone(),
            labels: node.metadata.labels.clone(),
            ..ObjectMeta::default()
        },
        ..NodeImage::default()
    };
    let mut pulled_digests = Vec::new();
    for (job, entry) in pulls {
        let (name, tag) = split_reference(&job.spec.image);
        let namespace = job.metadata.namespace.clone().unwrap_or_default();
        let image = out.spec.images.entry(name.to_owned()).or_default();
        for secret in &job.spec.pull_secrets {
            let reference = ReferenceObject {
                namespace: namespace.clone(),
                name: secret.clone(),
                mode: None,
            };
            if !image.pull_secrets.contains(&reference) {
                image.pull_secrets.push(reference);
            }
        }
        let owner = ObjectReference {
            api_version: job.api_version.clone(),
            kind: job.kind.clone(),
            namespace: namespace.clone(),
            name: job.metadata.name.clone(),
            uid: job.metadata.uid.clone().unwrap_or_default(),
        };
        match image.tags.iter_mut().find(|t| t.tag == tag) {
            Some(existing) => existing.owner_references.push(owner),
            None => image.tags.push(ImageTagSpec {
                tag: tag.to_owned(),
                pull_policy: tag_pull_policy(job),
                owner_references: vec![owner],
                image_pull_policy: format!("{:?}", job.spec.image_pull_policy),
                created_at: job.metadata.creation_timestamp.clone(),
                version: 0,
            }),
        }
        let progress = match entry.phase {
            NodePullPhase::Pulling if entry.bytes_total > 0 => {
                u32::try_from(entry.bytes_done.min(entry.bytes_total) * 100 / entry.bytes_total)
                    .unwrap_or(0)
            }
            _ => 0,
        };
        let status = ImageTagStatus {
            tag: tag.to_owned(),
            phase: entry.phase,
            progress,
            start_time: entry.start_time.clone(),
            completion_time: entry.completion_time.clone(),
            image_id: if entry.image_digest.is_empty() {
                String::new()
            } else {
                pulled_digests.push(entry.image_digest.clone());
                format!("{name}@{}", entry.image_digest)
            },
            message: entry.message.clone(),
            version: 0,
        };
        let tags = &mut out
            .status
            .image_statuses
            .entry(name.to_owned())
            .or_default()
            .tags;
        match tags.iter_mut().find(|t| t.tag == tag) {
            // Two jobs of one tag: the one further along is the node's state.
            Some(existing) if rank(status.phase) > rank(existing.phase) => *existing = status,
            Some(_) => {}
            None => tags.push(status),
        }
    }
    for tags in out.status.image_statuses.values() {
        for tag in &tags.tags {
            out.status.desired += 1;
            match tag.phase {
                NodePullPhase::Succeeded => out.status.succeeded += 1,
                NodePullPhase::Failed => out.status.failed += 1,
                NodePullPhase::Pulling => out.status.pulling += 1,
                NodePullPhase::Waiting => out.status.waiting += 1,
            }
        }
    }
    // What the node holds that no job asked for (or under another name).
    for held in &node.status.images {
        if pulled_digests.contains(&held.digest) {
            continue;
        }
        for reference in &held.names {
            let (name, tag) = split_reference(reference);
            let tags = &mut out
                .status
                .image_statuses
                .entry(name.to_owned())
                .or_default()
                .tags;
            if !tags.iter().any(|t| t.tag == tag) {
                tags.push(ImageTagStatus {
                    tag: tag.to_owned(),
                    phase: NodePullPhase::Succeeded,
                    image_id: format!("{name}@{}", held.digest),
                    ..ImageTagStatus::default()
                });
            }
        }
    }
    out
}

/// How far along a pull is, for two jobs of one tag.
fn rank(phase: NodePullPhase) -> u8 {
    match phase {
        NodePullPhase::Succeeded => 3,
        NodePullPhase::Pulling => 2,
        NodePullPhase::Failed => 1,
        NodePullPhase::Waiting => 0,
    }
}

/// NodeImage, as the registry (`kinds/mod.rs`) lists it.
pub const INFO: KindInfo = KindInfo {
    name: KIND,
    spellings: &["nodeimages"],
    namespaced: false,
    read_only: Some(
        "NodeImage objects are read-only: each node's is read from its inventory and the ImagePullJobs that include it; pre-download with an ImagePullJob",
    ),
    notes: Some(
        "Read-only, one per node: the pulls the ImagePullJobs that include the node ask \
             of it, their state, and the images the node holds. Never applied or deleted \
             (Kruise's daemon writes these; here each is built when read).",
    ),
    schema: Some(crate::kind::schema_of::<NodeImage>),
    crd: Some(&crate::kind::CrdInfo {
        group: crate::kind::KRUISE_GROUP,
        versions: &["v1alpha1", "v1beta1"],
        short_names: &[],
        columns: &[
            crate::kind::PrinterColumn {
                name: "DESIRED",
                kind: "integer",
                json_path: ".status.desired",
                description: "Image tags asked of the node.",
                only_in: None,
            },
            crate::kind::PrinterColumn {
                name: "PULLING",
                kind: "integer",
                json_path: ".status.pulling",
                description: "Tags pulling now.",
                only_in: None,
            },
            crate::kind::PrinterColumn {
                name: "SUCCEED",
                kind: "integer",
                json_path: ".status.succeeded",
                description: "Tags pulled.",
                only_in: None,
            },
            crate::kind::PrinterColumn {
                name: "FAILED",
                kind: "integer",
                json_path: ".status.failed",
                description: "Tags whose pull failed.",
                only_in: None,
            },
            crate::kind::AGE,
        ],
    }),
    table: crate::table::table_of::<NodeImage>,
};

/// Kruise's columns: DESIRED, PULLING, SUCCEED, FAILED.
impl Columns for NodeImage {
    fn header(_wide: bool) -> Vec<&'static str> {
        vec!["NAME", "DESIRED", "PULLING", "SUCCEED", "FAILED", "HELD"]
    }

    fn row(&self, _wide: bool, _now: SystemTime) -> Vec<String> {
        let status = &self.status;
        let held: usize = status.image_statuses.values().map(|i| i.tags.len()).sum();
        vec![
            self.metadata.name.clone(),
            status.desired.to_string(),
            status.pulling.to_string(),
            status.succeeded.to_string(),
            status.failed.to_string(),
            held.to_string(),
        ]
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn references_split_as_kruise_keys_them() {
        assert_eq!(split_reference("nginx:1.27"), ("nginx", "1.27"));
        assert_eq!(split_reference("nginx"), ("nginx", "latest"));
        assert_eq!(
            split_reference("docker.io/library/nginx:1.27"),
            ("nginx", "1.27")
        );
        assert_eq!(
            split_reference("index.docker.io/grafana/agent:v1"),
            ("grafana/agent", "v1")
        );
        assert_eq!(
            split_reference("docker.io/library/a/b"),
            ("library/a/b", "latest")
        );
        assert_eq!(split_reference("library/nginx:1"), ("nginx", "1"));
        assert_eq!(
            split_reference("nginx:1.27@sha256:abc"),
            ("nginx", "sha256:abc")
        );
        assert_eq!(
            split_reference("localhost/library/x"),
            ("localhost/library/x", "latest")
        );
        assert_eq!(
            split_reference("localhost:5000/app:v2"),
            ("localhost:5000/app", "v2")
        );
        assert_eq!(
            split_reference("localhost:5000/app"),
            ("localhost:5000/app", "latest")
        );
        assert_eq!(
            split_reference("r.example/app@sha256:abc"),
            ("r.example/app", "sha256:abc")
        );
    }

    #[test]
    fn a_node_shows_its_jobs_pulls_and_what_it_holds() {
        let node: Node = serde_json::from_value(serde_json::json!({
            "apiVersion": "rigger.dev/v1alpha1", "kind": "Node",
            "metadata": {"name": "n1", "labels": {"pool": "web"}},
            "status": {"conditions": [], "nodeInfo": {}, "images": [
                {"names": ["r.example/app:1"], "namespace": "k8s.io", "digest": "sha256:aaa", "sizeBytes": 1},
                {"names": ["r.example/other:2"], "namespace": "k8s.io", "digest": "sha256:bbb", "sizeBytes": 1},
            ]},
        }))
        .unwrap();
        let job = |name: &str, image: &str| -> ImagePullJob {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "apps.kruise.io/v1alpha1", "kind": "ImagePullJob",
                "metadata": {"name": name, "namespace": "default", "uid": "u-1"},
                "spec": {"image": image, "pullSecrets": ["regcred"]},
            }))
            .unwrap()
        };
        let entry = |phase: NodePullPhase, done: u64, digest: &str| NodePullStatus {
            name: "n1".to_owned(),
            phase,
            bytes_done: done,
            bytes_total: 200,
            image_digest: digest.to_owned(),
            ..NodePullStatus::default()
        };
        let (a, b) = (
            job("warm-a", "r.example/app:1"),
            job("warm-b", "r.example/new:3"),
        );
        let (done, pulling) = (
            entry(NodePullPhase::Succeeded, 200, "sha256:aaa"),
            entry(NodePullPhase::Pulling, 50, ""),
        );
        let image = node_image(&node, &[(&a, &done), (&b, &pulling)]);
        assert_eq!(image.metadata.name, "n1");
        let spec = &image.spec.images["r.example/app"];
        assert_eq!(spec.tags[0].tag, "1");
        // What Kruise's NodeImage webhook requires, as its manager computes it (600 s
        // a try, 3 tries, 300 s of grace).
        assert_eq!(
            spec.tags[0].pull_policy.ttl_seconds_after_finished,
            Some(600 * 3 + 300)
        );
        assert_eq!(spec.tags[0].owner_references[0].name, "warm-a");
        assert_eq!(spec.pull_secrets[0].name, "regcred");
        let status = &image.status;
        assert_eq!(
            (status.desired, status.succeeded, status.pulling),
            (2, 1, 1)
        );
        let new = &status.image_statuses["r.example/new"].tags[0];
        assert_eq!((new.phase, new.progress), (NodePullPhase::Pulling, 25));
        assert_eq!(
            status.image_statuses["r.example/app"].tags[0].image_id,
            "r.example/app@sha256:aaa"
        );
        // Held without a job: shown as the node has it, not counted as desired.
        let other = &status.image_statuses["r.example/other"].tags[0];
        assert_eq!(
            (other.tag.as_str(), other.phase),
            ("2", NodePullPhase::Succeeded)
        );
        assert_eq!(
            status.image_statuses["r.example/app"].tags.len(),
            1,
            "not twice"
        );
    }
}
