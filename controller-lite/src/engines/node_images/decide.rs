//! The NodeImage engine's decisions, pure: which tags each node is asked for, what to
//! start now, how a report moves a tag on, and each node's status in Kruise's daemon's
//! shape. No I/O, no clock of its own (`now` is given).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::time::{Duration, SystemTime};

use rigger_api::image_pull_job::NodePullPhase;
use rigger_api::node_image::{
    ImageStatus, ImageTagStatus, NodeImageSpec, NodeImageStatus, ReferenceObject, TagPullPolicy,
};
use rigger_proto::v1::{TaskPhase, TaskStatus};
use sha2::{Digest as _, Sha256};

/// Kruise's daemon's defaults for what a tag's pull policy leaves out.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);
pub const DEFAULT_BACKOFF_LIMIT: u32 = 3;
/// Retries wait 1 s, doubling, at most this long (as Kruise's daemon).
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Task ids of NodeImage pulls start with this.
pub const TASK_PREFIX: &str = "nodeimage/";

/// One tag of one node: `(node, image name, tag)`.
pub type PullKey = (String, String, String);

/// A tag a node is asked for, and where its pull is.
#[derive(Debug, Clone, PartialEq)]
pub struct TagPull {
    pub version: i64,
    pub policy: TagPullPolicy,
    pub secrets: Vec<ReferenceObject>,
    /// What the NodeImage's status says of it (Kruise's fields).
    pub status: ImageTagStatus,
    /// Attempts started.
    pub attempts: u32,
    /// The attempt in flight.
    pub task: Option<String>,
    /// Its task reached the node's agent in this session of the node.
    pub sent: bool,
    /// A failed attempt is retried no sooner.
    pub retry_at: Option<SystemTime>,
}

impl TagPull {
    fn new(version: i64, policy: TagPullPolicy, secrets: Vec<ReferenceObject>, tag: &str) -> Self {
        Self {
            version,
            policy,
            secrets,
            status: ImageTagStatus {
                tag: tag.to_owned(),
                version,
                ..ImageTagStatus::default()
            },
            attempts: 0,
            task: None,
            sent: false,
            retry_at: None,
        }
    }

    pub fn finished(&self) -> bool {
        matches!(
            self.status.phase,
            NodePullPhase::Succeeded | NodePullPhase::Failed
        )
    }

    pub fn timeout(&self) -> Duration {
        self.policy
            .timeout_seconds
            .filter(|s| *s > 0)
            .map_or(DEFAULT_TIMEOUT, Duration::from_secs)
    }
}

/// The reference a tag names: `name:tag`, or `name@digest`.
pub fn reference(image: &str, tag: &str) -> String {
    if tag.contains(':') {
        format!("{image}@{tag}")
    } else {
        format!("{image}:{tag}")
    }
}

/// The task id of attempt `attempt` of a tag at `version` on `node`: short (agents cap
/// ids), and new for every attempt and version.
pub fn task_id(key: &PullKey, version: i64, attempt: u32) -> String {
    let (node, image, tag) = key;
    let digest = Sha256::digest(format!("{node}\n{image}\n{tag}\n{version}").as_bytes());
    format!("{TASK_PREFIX}{}/{attempt}", &hex::encode(digest)[..24])
}

/// What syncing the specs changed.
#[derive(Debug, Default, PartialEq)]
pub struct Synced {
    /// Tasks of tags no longer asked for (or asked for at a new version): `(node, task)`.
    pub cancel: Vec<(String, String)>,
    /// Nodes whose status must be written again.
    pub dirty: BTreeSet<String>,
}

/// Take in the specs of the nodes whose NodeImage changed (`changed`) and of those whose
/// NodeImage is gone (`gone`): new tags wait, a new version starts the tag again (its old
/// status kept until the new one has one: `previous` statuses from the store after a
/// restart), tags no longer asked for are dropped. Other nodes' pulls are not looked at:
/// a node whose NodeImage does not decode is in neither list, and its pulls stay.
pub fn sync(
    pulls: &mut BTreeMap<PullKey, TagPull>,
    changed: &[(String, NodeImageSpec)],
    gone: &[String],
    previous: &BTreeMap<String, NodeImageStatus>,
) -> Synced {
    let mut synced = Synced::default();
    for (node, spec) in changed {
        let mut wanted = HashSet::new();
        for (image, image_spec) in &spec.images {
            for tag in &image_spec.tags {
                let key = (node.clone(), image.clone(), tag.tag.clone());
                wanted.insert(key.clone());
                match pulls.get_mut(&key) {
                    Some(pull) if pull.version == tag.version => {
                        // A new time limit reaches the attempt under way: its task is sent
                        // again under the same id, which the agent takes as the edit
                        // (Kruise's daemon keeps the old limit until the next attempt).
                        if pull.task.is_some()
                            && pull.policy.timeout_seconds != tag.pull_policy.timeout_seconds
                        {
                            pull.sent = false;
                        }
                        pull.policy = tag.pull_policy.clone();
                        pull.secrets.clone_from(&image_spec.pull_secrets);
                    }
                    existing => {
                        if let Some(old) = existing.and_then(|p| p.task.take()) {
                            synced.cancel.push((node.clone(), old));
                        }
                        let mut pull = TagPull::new(
                            tag.version,
                            tag.pull_policy.clone(),
                            image_spec.pull_secrets.clone(),
                            &tag.tag,
                        );
                        // After a restart: a tag that ended at this version stays as it
                        // ended. Pulled, it is not pulled again; failed past its retries,
                        // it is not tried again (as Kruise's daemon: a new version asks).
                        if let Some(done) = previous
                            .get(node)
                            .and_then(|s| s.image_statuses.get(image))
                            .and_then(|s| s.tags.iter().find(|t| t.tag == tag.tag))
                            .filter(|t| t.version == tag.version)
                            .filter(|t| {
                                matches!(t.phase, NodePullPhase::Succeeded | NodePullPhase::Failed)
                            })
                        {
                            pull.status = done.clone();
                        }
                        pulls.insert(key, pull);
                        synced.dirty.insert(node.clone());
                    }
                }
            }
        }
        drop_pulls(pulls, node, |key| !wanted.contains(key), &mut synced);
    }
    for node in gone {
        drop_pulls(pulls, node, |_| true, &mut synced);
    }
    synced
}

/// Drop `node`'s pulls that `unwanted` names, their tasks cancelled.
fn drop_pulls(
    pulls: &mut BTreeMap<PullKey, TagPull>,
    node: &str,
    unwanted: impl Fn(&PullKey) -> bool,
    synced: &mut Synced,
) {
    let first = (node.to_owned(), String::new(), String::new());
    let dropped: Vec<PullKey> = pulls
        .range(first..)
        .take_while(|(key, _)| key.0 == node)
        .map(|(key, _)| key)
        .filter(|key| unwanted(key))
        .cloned()
        .collect();
    for key in dropped {
        if let Some(pull) = pulls.remove(&key) {
            if let Some(task) = pull.task {
                synced.cancel.push((key.0.clone(), task));
            }
            synced.dirty.insert(key.0);
        }
    }
}

/// The tags to start now: waiting (past any retry time) on a ready node, at most
/// `per_node` pulling on a node at once.
pub fn to_start(
    pulls: &BTreeMap<PullKey, TagPull>,
    ready: &HashSet<String>,
    now: SystemTime,
    per_node: usize,
) -> Vec<PullKey> {
    let mut pulling: BTreeMap<&str, usize> = BTreeMap::new();
    for ((node, ..), pull) in pulls {
        if pull.task.is_some() {
            *pulling.entry(node).or_default() += 1;
        }
    }
    let mut start = Vec::new();
    for (key, pull) in pulls {
        let waiting = !pull.finished() && pull.task.is_none();
        let due = pull.retry_at.is_none_or(|at| at <= now);
        if !(waiting && due && ready.contains(&key.0)) {
            continue;
        }
        let count = pulling.entry(&key.0).or_default();
        if *count < per_node {
            *count += 1;
            start.push(key.clone());
        }
    }
    start
}

/// Mark `pull`'s next attempt started as task `task`.
pub fn started(pull: &mut TagPull, task: String, now: SystemTime) {
    pull.attempts += 1;
    pull.task = Some(task);
    pull.sent = true;
    pull.retry_at = None;
    pull.status.phase = NodePullPhase::Pulling;
    pull.status.progress = 0;
    pull.status.message.clear();
    if pull.status.start_time.is_none() {
        pull.status.start_time = Some(rigger_proto::time::rfc3339(now));
    }
}

/// Fold a report on `pull`'s task in; `true` when its status changed.
pub fn fold(pull: &mut TagPull, image: &str, report: &TaskStatus, now: SystemTime) -> bool {
    if pull.task.as_deref() != Some(report.id.as_str()) {
        return false; // An old attempt's.
    }
    let before = pull.status.clone();
    match TaskPhase::try_from(report.phase).unwrap_or(TaskPhase::Unspecified) {
        TaskPhase::Unspecified | TaskPhase::Accepted => {}
        TaskPhase::Running => {
            if report.bytes_total > 0 {
                let done = report.bytes_done.min(report.bytes_total);
                pull.status.progress = u32::try_from(done * 100 / report.bytes_total).unwrap_or(0);
            }
        }
        TaskPhase::Succeeded => {
            pull.task = None;
            pull.status.phase = NodePullPhase::Succeeded;
            pull.status.progress = 100;
            pull.status.message.clear();
            if !report.image_digest.is_empty() {
                pull.status.image_id = format!("{image}@{}", report.image_digest);
            }
            pull.status.completion_time = Some(rigger_proto::time::rfc3339(now));
        }
        TaskPhase::Failed => {
            pull.task = None;
            pull.status.message.clone_from(&report.message);
            let limit = pull.policy.backoff_limit.unwrap_or(DEFAULT_BACKOFF_LIMIT);
            if pull.attempts > limit {
                pull.status.phase = NodePullPhase::Failed;
                pull.status.completion_time = Some(rigger_proto::time::rfc3339(now));
            } else {
                pull.status.phase = NodePullPhase::Waiting;
                let exponent = pull.attempts.saturating_sub(1).min(5);
                let wait = Duration::from_secs(1u64 << exponent).min(MAX_BACKOFF);
                pull.retry_at = now.checked_add(wait);
            }
        }
    }
    pull.status != before
}

/// `node`'s status as Kruise's daemon writes it: every tag asked for, by image, with
/// the counts.
pub fn node_status(pulls: &BTreeMap<PullKey, TagPull>, node: &str) -> NodeImageStatus {
    let mut status = NodeImageStatus::default();
    for ((owner, image, _), pull) in pulls {
        if owner != node {
            continue;
        }
        status.desired += 1;
        match pull.status.phase {
            NodePullPhase::Waiting => status.waiting += 1,
            NodePullPhase::Pulling => status.pulling += 1,
            NodePullPhase::Succeeded => status.succeeded += 1,
            NodePullPhase::Failed => status.failed += 1,
        }
        status
            .image_statuses
            .entry(image.clone())
            .or_insert_with(ImageStatus::default)
            .tags
            .push(pull.status.clone());
    }
    status
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn spec(tags: &[(&str, i64)], backoff: Option<u32>) -> NodeImageSpec {
        serde_json::from_value(serde_json::json!({"images": {"r.example/app": {"tags":
            tags.iter().map(|(t, v)| serde_json::json!({
                "tag": t, "version": v, "pullPolicy": {"backoffLimit": backoff},
            })).collect::<Vec<_>>()}}}))
        .unwrap()
    }

    fn report(id: &str, phase: TaskPhase) -> TaskStatus {
        TaskStatus {
            id: id.to_owned(),
            phase: phase.into(),
            image_digest: "sha256:ab".into(),
            message: "registry said no".into(),
            ..TaskStatus::default()
        }
    }

    #[test]
    fn a_tag_is_pulled_once_per_version_with_kruises_status() {
        let mut pulls = BTreeMap::new();
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let specs = vec![("n1".to_owned(), spec(&[("1", 0)], None))];
        let synced = sync(&mut pulls, &specs, &[], &BTreeMap::new());
        assert_eq!(synced.dirty.len(), 1);
        let ready: HashSet<String> = ["n1".to_owned()].into();
        let start = to_start(&pulls, &ready, now, 4);
        assert_eq!(start.len(), 1);
        let key = start[0].clone();
        let id = task_id(&key, 0, 1);
        started(pulls.get_mut(&key).unwrap(), id.clone(), now);
        assert!(to_start(&pulls, &ready, now, 4).is_empty(), "in flight");
        assert!(fold(
            pulls.get_mut(&key).unwrap(),
            "r.example/app",
            &report(&id, TaskPhase::Succeeded),
            now
        ));
        let status = node_status(&pulls, "n1");
        assert_eq!((status.desired, status.succeeded), (1, 1));
        let tag = &status.image_statuses["r.example/app"].tags[0];
        assert_eq!(
            (tag.phase, tag.progress, tag.image_id.as_str()),
            (NodePullPhase::Succeeded, 100, "r.example/app@sha256:ab")
        );
        // The same spec again: nothing to do. A new version: pulled again.
        assert!(
            sync(&mut pulls, &specs, &[], &BTreeMap::new())
                .dirty
                .is_empty()
        );
        assert!(to_start(&pulls, &ready, now, 4).is_empty());
        sync(
            &mut pulls,
            &[("n1".to_owned(), spec(&[("1", 2)], None))],
            &[],
            &BTreeMap::new(),
        );
        assert_eq!(to_start(&pulls, &ready, now, 4), vec![key]);
    }

    #[test]
    fn a_new_time_limit_reaches_the_attempt_under_way() {
        let mut pulls = BTreeMap::new();
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let with_timeout = |seconds: u64| {
            let mut spec = spec(&[("1", 0)], None);
            for image in spec.images.values_mut() {
                image.tags[0].pull_policy.timeout_seconds = Some(seconds);
            }
            vec![("n1".to_owned(), spec)]
        };
        sync(&mut pulls, &with_timeout(60), &[], &BTreeMap::new());
        let key = ("n1".to_owned(), "r.example/app".to_owned(), "1".to_owned());
        let pull = pulls.get_mut(&key).unwrap();
        started(pull, task_id(&key, 0, 1), now);
        sync(&mut pulls, &with_timeout(60), &[], &BTreeMap::new());
        assert!(pulls[&key].sent, "the same limit: nothing to send");
        sync(&mut pulls, &with_timeout(900), &[], &BTreeMap::new());
        let pull = &pulls[&key];
        assert!(!pull.sent, "sent again, under the same id");
        assert_eq!(pull.task.as_deref(), Some(task_id(&key, 0, 1).as_str()));
        assert_eq!(pull.timeout(), Duration::from_secs(900));
        assert_eq!(pull.attempts, 1, "not another attempt");
    }

    #[test]
    fn failures_retry_with_backoff_up_to_the_limit_then_fail() {
        let mut pulls = BTreeMap::new();
        let mut now = SystemTime::UNIX_EPOCH;
        sync(
            &mut pulls,
            &[("n1".to_owned(), spec(&[("1", 0)], Some(1)))],
            &[],
            &BTreeMap::new(),
        );
        let ready: HashSet<String> = ["n1".to_owned()].into();
        let key = to_start(&pulls, &ready, now, 4).remove(0);
        for attempt in 1..=2 {
            let id = task_id(&key, 0, attempt);
            started(pulls.get_mut(&key).unwrap(), id.clone(), now);
            fold(
                pulls.get_mut(&key).unwrap(),
                "r.example/app",
                &report(&id, TaskPhase::Failed),
                now,
            );
            if attempt == 1 {
                assert!(to_start(&pulls, &ready, now, 4).is_empty(), "backing off");
                now += Duration::from_secs(1);
                assert_eq!(to_start(&pulls, &ready, now, 4).len(), 1);
            }
        }
        let pull = &pulls[&key];
        assert_eq!(
            (pull.status.phase, pull.status.message.as_str()),
            (NodePullPhase::Failed, "registry said no")
        );
        assert!(to_start(&pulls, &ready, now + MAX_BACKOFF, 4).is_empty());
    }

    #[test]
    fn per_node_concurrency_unready_nodes_and_removed_tags() {
        let mut pulls = BTreeMap::new();
        let specs = vec![
            ("n1".to_owned(), spec(&[("1", 0), ("2", 0), ("3", 0)], None)),
            ("n2".to_owned(), spec(&[("1", 0)], None)),
        ];
        sync(&mut pulls, &specs, &[], &BTreeMap::new());
        let ready: HashSet<String> = ["n1".to_owned()].into();
        let start = to_start(&pulls, &ready, SystemTime::UNIX_EPOCH, 2);
        assert_eq!(start.len(), 2);
        assert!(start.iter().all(|k| k.0 == "n1"));
        let key = start[0].clone();
        started(
            pulls.get_mut(&key).unwrap(),
            "t".into(),
            SystemTime::UNIX_EPOCH,
        );
        // n2's NodeImage changed, n1's is not looked at (it did not change, or no longer
        // decodes): n1's pulls are left as they are.
        let synced = sync(&mut pulls, &specs[1..], &[], &BTreeMap::new());
        assert!(synced.cancel.is_empty() && synced.dirty.is_empty());
        assert_eq!(pulls.len(), 4);
        // n1 asks for one tag less: that tag's pull is cancelled, the others stay.
        let fewer = ("n1".to_owned(), spec(&[("2", 0), ("3", 0)], None));
        let synced = sync(&mut pulls, &[fewer], &[], &BTreeMap::new());
        assert_eq!(synced.cancel, vec![("n1".to_owned(), "t".to_owned())]);
        assert_eq!(pulls.len(), 3);
        // n1's NodeImage is gone: all of its pulls with it, n2's kept.
        let synced = sync(&mut pulls, &[], &["n1".to_owned()], &BTreeMap::new());
        assert_eq!(synced.dirty, BTreeSet::from(["n1".to_owned()]));
        assert_eq!(pulls.len(), 1);
        assert!(pulls.keys().all(|k| k.0 == "n2"));
    }

    #[test]
    fn after_a_restart_a_tag_pulled_at_its_version_is_not_pulled_again() {
        let mut previous = BTreeMap::new();
        let mut status = NodeImageStatus::default();
        let ended = |tag: &str, phase| ImageTagStatus {
            tag: tag.into(),
            phase,
            version: 3,
            ..ImageTagStatus::default()
        };
        status.image_statuses.insert(
            "r.example/app".into(),
            ImageStatus {
                // Pulled; and failed past its retries (a helper's read found a restart
                // sent it through all of them again).
                tags: vec![
                    ended("1", NodePullPhase::Succeeded),
                    ended("2", NodePullPhase::Failed),
                ],
            },
        );
        previous.insert("n1".to_owned(), status);
        let mut pulls = BTreeMap::new();
        sync(
            &mut pulls,
            &[("n1".to_owned(), spec(&[("1", 3), ("2", 3)], None))],
            &[],
            &previous,
        );
        assert_eq!(node_status(&pulls, "n1").failed, 1, "still said failed");
        let ready: HashSet<String> = ["n1".to_owned()].into();
        assert!(to_start(&pulls, &ready, SystemTime::UNIX_EPOCH, 4).is_empty());
        assert_eq!(
            reference("r.example/app", "sha256:ab"),
            "r.example/app@sha256:ab"
        );
        assert_eq!(reference("r.example/app", "1"), "r.example/app:1");
    }
}
