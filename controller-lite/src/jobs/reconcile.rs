//! The decisions for one job, without I/O: which nodes it selects, which pull now
//! (parallelism counts nodes in `Pulling` only), retries with back-off, deadline and
//! TTL, lost nodes and images gone from a node; the effects (tasks, cancellations,
//! deletions) go back to the engine to carry out.

use rigger_proto::time::now_rfc3339;
use std::collections::HashMap;
use std::str::FromStr as _;
use std::time::{Duration, Instant, SystemTime};

use rigger_proto::v1::{CancelTask, ControllerMessage, controller_message};

use crate::nodes::NodeView;
use crate::store::ObjectKey;
use rigger_api::Condition;
use rigger_api::image_pull_job::{
    CompletionPolicyType, ImagePullJobStatus, NodePullPhase, NodePullStatus,
};

use super::sources::{self, Fanout};
use super::tasks::{self, TaskCredentials, pull_task};
use super::{Effects, JobState, parse_time};

/// When the job's `activeDeadlineSeconds` ends it (completionPolicy Always only).
pub(super) fn deadline(job: &JobState) -> Option<SystemTime> {
    let policy = &job.job.spec.completion_policy;
    if policy.kind != CompletionPolicyType::Always {
        return None;
    }
    let limit = Duration::from_secs(policy.active_deadline_seconds?);
    parse_time(job.status.start_time.as_deref())?.checked_add(limit)
}

pub(super) fn cancel(id: &str, reason: &str) -> ControllerMessage {
    ControllerMessage {
        message: Some(controller_message::Message::CancelTask(CancelTask {
            id: id.to_owned(),
            reason: reason.to_owned(),
        })),
    }
}

#[allow(clippy::too_many_lines)] // one pass over a job, in the order a reader checks it
pub(super) fn reconcile_job(
    key: &ObjectKey,
    job: &mut JobState,
    views: &HashMap<String, NodeView>,
    credentials: &TaskCredentials<'_>,
    starting: bool,
    tasks: &mut HashMap<String, (ObjectKey, String)>,
    effects: &mut Effects,
) {
    let policy = job.job.spec.completion_policy.clone();
    if job.finished() {
        if policy.kind == CompletionPolicyType::Always
            && let Some(ttl) = policy.ttl_seconds_after_finished
            && let Some(done) = parse_time(job.status.completion_time.as_deref())
            && SystemTime::now()
                .duration_since(done)
                .is_ok_and(|d| d >= Duration::from_secs(ttl))
        {
            effects.expired.push(key.clone());
        }
        return;
    }
    let now = SystemTime::now();
    let first = job.status.start_time.is_none();
    if first {
        job.status.start_time = Some(now_rfc3339());
        job.dirty = true;
    }

    // Membership: fixed at the start for Always; Never takes nodes that join later.
    if first || policy.kind == CompletionPolicyType::Never {
        let mut names: Vec<&String> = views
            .iter()
            .filter(|(name, view)| job.selects(name, view))
            .map(|(name, _)| name)
            .collect();
        if let Some(selector) = &job.job.spec.selector {
            // Named nodes that never registered are part of the job (and fail as such).
            names.extend(selector.names.iter());
        }
        names.sort();
        names.dedup();
        for name in names {
            if !job.index.contains_key(name.as_str()) {
                job.status.nodes.push(NodePullStatus {
                    name: name.clone(),
                    ..NodePullStatus::default()
                });
                job.dirty = true;
            }
        }
        job.status.nodes.sort_by(|a, b| a.name.cmp(&b.name));
        job.reindex();
    }

    // The deadline ends everything still open.
    let deadline = deadline(job);
    let deadline_passed = deadline.is_some_and(|deadline| now >= deadline);
    let grants_until = tasks::grants_until(&job.job, now, deadline);

    let timeout = Duration::from_secs(job.job.spec.pull_policy.timeout_seconds);
    let backoff_limit = job.job.spec.pull_policy.backoff_limit;
    // Who holds the image to share, before this pass changes anything.
    let mut holders = if credentials.grants.is_some() {
        sources::holders(&job.status.nodes, views)
    } else {
        Vec::new()
    };
    let resend: Vec<String> = std::mem::take(&mut job.resend);
    for entry in &mut job.status.nodes {
        let view = views.get(&entry.name);
        let not_ready = why_not_ready(view);
        if deadline_passed {
            if entry.phase == NodePullPhase::Pulling {
                effects.messages.push((
                    entry.name.clone(),
                    cancel(&entry.task_id, "job deadline exceeded"),
                ));
            }
            if matches!(entry.phase, NodePullPhase::Pulling | NodePullPhase::Waiting)
                || entry.node_lost
            {
                entry.phase = NodePullPhase::Failed;
                entry.node_lost = false;
                entry.message = "activeDeadlineSeconds exceeded".to_owned();
                job.dirty = true;
            }
            continue;
        }
        match entry.phase {
            NodePullPhase::Pulling => {
                if let Some(reason) = not_ready {
                    // Right after a controller start, agents are still reconnecting.
                    if starting && view.is_none_or(|v| v.not_ready.is_some()) {
                        continue;
                    }
                    entry.phase = NodePullPhase::Failed;
                    entry.node_lost = true;
                    entry.message = format!("node lost while pulling: {reason}");
                    job.lost_at.insert(entry.name.clone(), Instant::now());
                    job.dirty = true;
                } else if job.sent_at.get(&entry.name).is_some_and(|at| {
                    at.elapsed() > timeout.saturating_add(Duration::from_secs(30))
                }) {
                    // The agent enforces the timeout; this catches an agent that stopped
                    // reporting without losing its link.
                    effects.messages.push((
                        entry.name.clone(),
                        cancel(&entry.task_id, "no result in time"),
                    ));
                    entry.phase = if entry.attempts <= backoff_limit {
                        NodePullPhase::Waiting
                    } else {
                        NodePullPhase::Failed
                    };
                    entry.message = format!(
                        "no result within pullPolicy.timeoutSeconds ({}s)",
                        timeout.as_secs()
                    );
                    job.dirty = true;
                } else if resend.contains(&entry.name) {
                    let sources = sources::sources_for(
                        &holders,
                        &entry.name,
                        entry.attempts as usize,
                        &job.planned,
                        job.suspects.get(&entry.name),
                    );
                    job.planned.insert(
                        entry.name.clone(),
                        sources.iter().map(|s| s.node.clone()).collect(),
                    );
                    match pull_task(
                        &job.job,
                        key,
                        &entry.name,
                        &entry.task_id,
                        credentials,
                        &sources,
                        grants_until,
                    ) {
                        Ok(message) => effects.messages.push((entry.name.clone(), message)),
                        Err(reason) => fail(entry, &reason),
                    }
                }
            }
            // completionPolicy Never keeps the image on the node: an inventory taken
            // after the pull that lacks it sends the node back to pulling.
            NodePullPhase::Succeeded
                if policy.kind == CompletionPolicyType::Never
                    && image_gone(view, &job.job.spec.image, entry.completion_time.as_deref()) =>
            {
                entry.phase = NodePullPhase::Waiting;
                entry.message = "the image left the node; pulling it again".to_owned();
                job.dirty = true;
            }
            NodePullPhase::Failed if entry.node_lost && not_ready.is_none() => {
                // Back before the job finished: the work resumes.
                entry.phase = NodePullPhase::Waiting;
                entry.node_lost = false;
                entry.message = "node is back".to_owned();
                job.lost_at.remove(&entry.name);
                job.dirty = true;
            }
            NodePullPhase::Failed
                if entry.node_lost
                    && job
                        .lost_at
                        .get(&entry.name)
                        .is_none_or(|at| at.elapsed() > timeout) =>
            {
                // A node gets as long as one pull may take to come back.
                entry.node_lost = false;
                entry.message = format!(
                    "{}; not back within pullPolicy.timeoutSeconds ({}s)",
                    entry.message,
                    timeout.as_secs()
                );
                job.lost_at.remove(&entry.name);
                job.dirty = true;
            }
            _ => {}
        }
    }

    // Dispatch within parallelism.
    let desired = job.status.nodes.len();
    let limit = job.job.spec.parallelism_for(desired);
    let mut active = job
        .status
        .nodes
        .iter()
        .filter(|n| n.phase == NodePullPhase::Pulling)
        .count();
    let uid = job.uid().to_owned();
    let instant = Instant::now();
    let seed_overdue = job.status.nodes.iter().any(|e| {
        e.phase == NodePullPhase::Pulling
            && e.image_digest.is_empty()
            && job
                .sent_at
                .get(&e.name)
                .is_some_and(|at| instant.saturating_duration_since(*at) > sources::SEED_PATIENCE)
    });
    let mut fanout = sources::fanout(
        credentials.grants.is_some(),
        &job.status.nodes,
        &holders,
        views,
        seed_overdue,
    );
    let mut turn = 0;
    for entry in &mut job.status.nodes {
        if active >= limit || deadline_passed {
            break;
        }
        if entry.phase == NodePullPhase::Waiting && !sources::may_start(fanout, views, &entry.name)
        {
            // No node holds the image yet: this one waits for the seed's copy.
            continue;
        }
        if entry.phase != NodePullPhase::Waiting
            || job
                .retry_at
                .get(&entry.name)
                .is_some_and(|at| *at > instant)
        {
            continue;
        }
        let not_ready = why_not_ready(views.get(&entry.name));
        if let Some(reason) = not_ready {
            if starting {
                continue;
            }
            entry.phase = NodePullPhase::Failed;
            entry.node_lost = true;
            entry.message = format!("node not ready: {reason}");
            job.lost_at.insert(entry.name.clone(), instant);
            job.dirty = true;
            continue;
        }
        let attempt = entry.attempts + 1;
        let task_id = format!("{uid}/{}/{attempt}", entry.name);
        let sources = sources::sources_for(
            &holders,
            &entry.name,
            turn,
            &job.planned,
            job.suspects.get(&entry.name),
        );
        turn += 1;
        job.planned.insert(
            entry.name.clone(),
            sources.iter().map(|s| s.node.clone()).collect(),
        );
        match pull_task(
            &job.job,
            key,
            &entry.name,
            &task_id,
            credentials,
            &sources,
            grants_until,
        ) {
            Ok(message) => {
                if let Fanout::Seed { .. } = fanout {
                    fanout = Fanout::Seed { seed_pulling: true };
                    tracing::info!(job = %key, seed = %entry.name, "no node holds the image yet: one pulls it from the registry, the rest will fetch from it");
                }
                effects.messages.push((entry.name.clone(), message));
                // Nodes sent later in this pass may fall back on this one.
                if let Some(sent) = sources::just_sent(&holders, views, &entry.name) {
                    holders.push(sent);
                }
                tasks.insert(task_id.clone(), (key.clone(), entry.name.clone()));
                entry.attempts = attempt;
                entry.task_id = task_id;
                entry.phase = NodePullPhase::Pulling;
                entry.bytes_done = 0;
                entry.message.clear();
                // This attempt reports the digest it resolves (it serves peers from then).
                entry.image_digest.clear();
                entry.start_time = Some(now_rfc3339());
                entry.completion_time = None;
                job.sent_at.insert(entry.name.clone(), instant);
                active += 1;
            }
            Err(reason) => fail(entry, &reason),
        }
        job.dirty = true;
    }

    // Counts, and completion for Always.
    let paused = job.job.spec.paused();
    let status = &mut job.status;
    status.desired = u32::try_from(desired).unwrap_or(u32::MAX);
    let (succeeded, failed) = count_nodes(status);
    // Lost nodes count as failed but may still come back: the job waits for them.
    let lost = status.nodes.iter().filter(|n| n.node_lost).count();
    if policy.kind == CompletionPolicyType::Always && succeeded + failed == desired && lost == 0 {
        status.completion_time = Some(now_rfc3339());
        status.conditions = vec![Condition {
            kind: "Complete".to_owned(),
            status: "True".to_owned(),
            reason: if deadline_passed {
                "DeadlineExceeded"
            } else if failed > 0 {
                "CompletedWithFailures"
            } else {
                "Completed"
            }
            .to_owned(),
            message: String::new(),
            last_transition_time: status.completion_time.clone(),
        }];
        status.message = if deadline_passed {
            format!(
                "activeDeadlineSeconds exceeded: {succeeded} of {desired} nodes pulled the image"
            )
        } else if desired == 0 {
            "no node matches the job's selector".to_owned()
        } else {
            format!("{succeeded} of {desired} nodes pulled the image, {failed} failed")
        };
        job.dirty = true;
        tracing::info!(job = %key, succeeded, failed, "job complete");
    } else if paused {
        status.message = format!(
            "paused until spec.parallelism is raised from 0: {}",
            progress_message(status)
        );
    } else {
        status.message = progress_message(status);
    }
}

/// The summary counts from the nodes' entries (`desired` is the engine's): active,
/// succeeded, failed and the failed nodes. Returns (succeeded, failed).
pub(super) fn count_nodes(status: &mut ImagePullJobStatus) -> (usize, usize) {
    let count = |phase| status.nodes.iter().filter(|n| n.phase == phase).count();
    let as_u32 = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
    let (active, succeeded, failed) = (
        count(NodePullPhase::Pulling),
        count(NodePullPhase::Succeeded),
        count(NodePullPhase::Failed),
    );
    status.active = as_u32(active);
    status.succeeded = as_u32(succeeded);
    status.failed = as_u32(failed);
    status.failed_nodes = status
        .nodes
        .iter()
        .filter(|n| n.phase == NodePullPhase::Failed)
        .map(|n| n.name.clone())
        .collect();
    (succeeded, failed)
}

/// The message of a job under way.
pub(super) fn progress_message(status: &ImagePullJobStatus) -> String {
    format!(
        "{} of {} nodes pulled the image, {} pulling",
        status.succeeded, status.desired, status.active
    )
}

/// Why a node cannot take work now (`None`: it can).
pub(super) fn why_not_ready(view: Option<&NodeView>) -> Option<String> {
    match view {
        None => Some("node is not registered".to_owned()),
        Some(v) => v.not_ready.clone(),
    }
}

/// Whether `view`'s inventory, reported after `pulled_at`, lacks `image`.
pub(super) fn image_gone(view: Option<&NodeView>, image: &str, pulled_at: Option<&str>) -> bool {
    let Some((reported_at, names)) = view.and_then(|v| v.images.as_ref()) else {
        return false;
    };
    // Seconds resolution on both sides: wait a second past the pull to be sure the
    // inventory was taken after it.
    let fresh = parse_time(pulled_at).is_some_and(|done| {
        reported_at
            .duration_since(done)
            .is_ok_and(|d| d > Duration::from_secs(1))
    });
    let name = oci_spec::distribution::Reference::from_str(image)
        .map(|r| r.whole())
        .unwrap_or_else(|_| image.to_owned());
    fresh && !names.contains(name.as_str())
}

/// A node's attempt that cannot even start (its pull secret is missing, say).
pub(super) fn fail(entry: &mut NodePullStatus, reason: &str) {
    entry.phase = NodePullPhase::Failed;
    entry.node_lost = false;
    entry.message = reason.to_owned();
}

#[cfg(test)]
pub(super) mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use rigger_api::image_pull_job::ImagePullJob;
    use rigger_api::secret;
    use std::collections::BTreeMap;

    use crate::job_status;
    use rigger_proto::time::rfc3339;
    use std::sync::Arc;

    pub(crate) fn job(spec: &serde_json::Value) -> JobState {
        let job: ImagePullJob = serde_json::from_value(serde_json::json!({
            "apiVersion": "rigger.dev/v1alpha1",
            "kind": "ImagePullJob",
            "metadata": {"name": "j", "namespace": "default", "uid": "u1"},
            "spec": spec,
        }))
        .unwrap();
        job.validate().unwrap();
        JobState::new(
            1,
            job,
            ImagePullJobStatus::default(),
            job_status::Written::default(),
        )
    }

    fn nodes(names: &[&str]) -> HashMap<String, NodeView> {
        names
            .iter()
            .map(|n| {
                (
                    (*n).to_owned(),
                    NodeView {
                        labels: [("zone".to_owned(), "a".to_owned())].into(),
                        admin_labels: BTreeMap::new(),
                        not_ready: None,
                        pod_labels: Vec::new(),
                        images: None,
                        peer_address: None,
                    },
                )
            })
            .collect()
    }

    fn no_credentials() -> TaskCredentials<'static> {
        static NONE: std::sync::LazyLock<HashMap<ObjectKey, Result<String, String>>> =
            std::sync::LazyLock::new(HashMap::new);
        TaskCredentials {
            secrets: &NONE,
            grants: None,
        }
    }

    pub(crate) fn key() -> ObjectKey {
        ObjectKey::new("ImagePullJob", "default", "j")
    }

    /// One reconcile; the nodes that were sent a task.
    fn step(job: &mut JobState, views: &HashMap<String, NodeView>) -> Vec<String> {
        let mut effects = Effects::default();
        let mut tasks = HashMap::new();
        reconcile_job(
            &key(),
            job,
            views,
            &no_credentials(),
            false,
            &mut tasks,
            &mut effects,
        );
        effects
            .messages
            .into_iter()
            .filter(|(_, m)| matches!(m.message, Some(controller_message::Message::Task(_))))
            .map(|(node, _)| node)
            .collect()
    }

    /// The nodes a job of `spec` takes, after one reconcile over `views`.
    fn selected(spec: &serde_json::Value, views: &HashMap<String, NodeView>) -> Vec<String> {
        let mut j = job(spec);
        step(&mut j, views);
        j.status.nodes.iter().map(|n| n.name.clone()).collect()
    }

    fn finish(job: &mut JobState, node: &str, phase: NodePullPhase) {
        let entry = job.entry(node).unwrap();
        entry.phase = phase;
    }

    #[test]
    fn parallelism_counts_only_nodes_pulling() {
        let views = nodes(&["n1", "n2", "n3", "n4", "n5"]);
        let mut j = job(&serde_json::json!({"image": "r.example/a:1", "parallelism": "40%"}));
        assert_eq!(
            step(&mut j, &views),
            ["n1", "n2"],
            "40% of 5 rounds up to 2"
        );
        assert_eq!(
            step(&mut j, &views),
            Vec::<String>::new(),
            "both slots are taken"
        );
        finish(&mut j, "n1", NodePullPhase::Succeeded);
        finish(&mut j, "n2", NodePullPhase::Failed);
        // Finished nodes, failed or not, hold no slot (kruise #1271).
        assert_eq!(step(&mut j, &views), ["n3", "n4"]);
        assert_eq!(j.status.active, 2);
        assert_eq!((j.status.succeeded, j.status.failed), (1, 1));
        assert_eq!(j.status.failed_nodes, ["n2"]);
        assert!(j.status.completion_time.is_none());
    }

    #[test]
    fn parallelism_zero_pauses_until_raised() {
        let views = nodes(&["n1", "n2"]);
        let mut j = job(&serde_json::json!({"image": "r.example/a:1", "parallelism": 0}));
        assert_eq!(step(&mut j, &views), Vec::<String>::new());
        assert_eq!(step(&mut j, &views), Vec::<String>::new());
        assert_eq!(j.status.desired, 2, "the nodes are chosen, none started");
        assert!(
            j.status.message.starts_with("paused"),
            "{}",
            j.status.message
        );
        assert!(j.status.completion_time.is_none());
        j.job.spec.parallelism = Some(rigger_api::IntOrPercent::Int(1));
        assert_eq!(step(&mut j, &views), ["n1"]);
        assert!(!j.status.message.starts_with("paused"));
    }

    #[test]
    fn always_fixes_the_nodes_at_the_start_and_never_takes_newcomers() {
        let mut always = job(&serde_json::json!({"image": "r.example/a:1", "parallelism": 10}));
        step(&mut always, &nodes(&["n1"]));
        step(&mut always, &nodes(&["n1", "n2"]));
        assert_eq!(always.status.desired, 1);
        finish(&mut always, "n1", NodePullPhase::Succeeded);
        step(&mut always, &nodes(&["n1", "n2"]));
        assert!(always.status.completion_time.is_some());
        assert_eq!(always.status.conditions[0].kind, "Complete");

        let mut never = job(&serde_json::json!({
            "image": "r.example/a:1", "parallelism": 10, "completionPolicy": {"type": "Never"}
        }));
        step(&mut never, &nodes(&["n1"]));
        finish(&mut never, "n1", NodePullPhase::Succeeded);
        assert_eq!(
            step(&mut never, &nodes(&["n1", "n2"])),
            ["n2"],
            "a node that joins later pulls"
        );
        finish(&mut never, "n2", NodePullPhase::Succeeded);
        step(&mut never, &nodes(&["n1", "n2"]));
        assert!(
            never.status.completion_time.is_none(),
            "Never jobs never complete"
        );
    }

    #[test]
    fn never_pulls_again_when_the_image_left_the_node() {
        let mut never = job(&serde_json::json!({
            "image": "r.example/a:1", "parallelism": 10, "completionPolicy": {"type": "Never"}
        }));
        let mut views = nodes(&["n1"]);
        step(&mut never, &views);
        let done = SystemTime::now() - Duration::from_secs(60);
        let entry = never.entry("n1").unwrap();
        entry.phase = NodePullPhase::Succeeded;
        entry.completion_time = Some(rfc3339(done));
        let names = |list: &[&str]| Arc::new(list.iter().map(|n| Arc::<str>::from(*n)).collect());
        // An inventory from before the pull proves nothing; one after it with the image is fine.
        views.get_mut("n1").unwrap().images = Some((done - Duration::from_secs(5), names(&[])));
        assert!(step(&mut never, &views).is_empty());
        views.get_mut("n1").unwrap().images = Some((SystemTime::now(), names(&["r.example/a:1"])));
        assert!(step(&mut never, &views).is_empty());
        // The image is gone: pulled again.
        views.get_mut("n1").unwrap().images = Some((SystemTime::now(), names(&["r.example/b:1"])));
        assert_eq!(step(&mut never, &views), ["n1"]);
    }

    #[test]
    fn selectors_pick_nodes_by_label_name_or_pods() {
        let mut views = nodes(&["n1", "n2", "n3"]);
        views
            .get_mut("n2")
            .unwrap()
            .labels
            .insert("disk".to_owned(), "ssd".to_owned());
        let web = || [("app".to_owned(), "web".to_owned())].into();
        views
            .get_mut("n3")
            .unwrap()
            .pod_labels
            .push(("default".into(), web()));
        // The same labels in another namespace choose nothing (Kruise's podSelector
        // looks in the job's namespace only).
        views
            .get_mut("n1")
            .unwrap()
            .pod_labels
            .push(("other".into(), web()));
        let by_label = |spec| selected(&spec, &views);
        assert_eq!(
            by_label(
                serde_json::json!({"image": "r.example/a:1", "selector": {"matchLabels": {"disk": "ssd"}}})
            ),
            ["n2"]
        );
        assert_eq!(
            by_label(
                serde_json::json!({"image": "r.example/a:1", "selector": {"names": ["n1", "gone"]}})
            ),
            ["gone", "n1"],
            "named nodes are part of the job even when unknown"
        );
        assert_eq!(
            by_label(
                serde_json::json!({"image": "r.example/a:1", "podSelector": {"matchLabels": {"app": "web"}}})
            ),
            ["n3"]
        );
    }

    #[test]
    fn a_job_with_pull_secrets_believes_only_the_labels_an_admin_set() {
        let mut views = nodes(&["claims", "chosen"]);
        let team = || [("team".to_owned(), "payments".to_owned())].into();
        // "claims" reports the label itself; "chosen" was labelled by an admin.
        views.get_mut("claims").unwrap().labels = team();
        let chosen = views.get_mut("chosen").unwrap();
        chosen.labels = team();
        chosen.admin_labels = team();
        let selected = |spec| selected(&spec, &views);
        let selector = serde_json::json!({"matchLabels": {"team": "payments"}});
        assert_eq!(
            selected(serde_json::json!({"image": "r.example/a:1", "selector": selector})),
            ["chosen", "claims"]
        );
        assert_eq!(
            selected(
                serde_json::json!({"image": "r.example/a:1", "selector": selector, "pullSecrets": ["creds"]})
            ),
            ["chosen"]
        );
    }

    #[test]
    fn an_unknown_node_fails_as_lost_and_the_job_waits_for_it() {
        let mut j =
            job(&serde_json::json!({"image": "r.example/a:1", "selector": {"names": ["gone"]}}));
        step(&mut j, &HashMap::new());
        let entry = &j.status.nodes[0];
        assert_eq!(entry.phase, NodePullPhase::Failed);
        assert!(entry.node_lost);
        assert_eq!(entry.message, "node not ready: node is not registered");
        assert!(
            j.status.completion_time.is_none(),
            "a lost node may come back"
        );
        // It registers: the work resumes at once.
        assert_eq!(step(&mut j, &nodes(&["gone"])), ["gone"]);
        assert_eq!(j.status.nodes[0].phase, NodePullPhase::Pulling);
        assert!(!j.status.nodes[0].node_lost);
    }

    #[test]
    fn the_deadline_fails_what_is_open_and_the_ttl_deletes_the_job() {
        let mut j = job(&serde_json::json!({
            "image": "r.example/a:1", "parallelism": 1,
            "completionPolicy": {"type": "Always", "activeDeadlineSeconds": 60, "ttlSecondsAfterFinished": 30}
        }));
        let views = nodes(&["n1", "n2"]);
        assert_eq!(step(&mut j, &views), ["n1"]);
        let long_ago = SystemTime::now() - Duration::from_secs(61);
        j.status.start_time = Some(rfc3339(long_ago));
        let mut effects = Effects::default();
        reconcile_job(
            &key(),
            &mut j,
            &views,
            &no_credentials(),
            false,
            &mut HashMap::new(),
            &mut effects,
        );
        let cancelled: Vec<&String> = effects
            .messages
            .iter()
            .filter(|(_, m)| matches!(m.message, Some(controller_message::Message::CancelTask(_))))
            .map(|(n, _)| n)
            .collect();
        assert_eq!(cancelled, ["n1"], "the pull in flight is cancelled");
        assert_eq!(j.status.failed, 2);
        assert_eq!(j.status.conditions[0].reason, "DeadlineExceeded");
        assert!(
            j.status
                .message
                .starts_with("activeDeadlineSeconds exceeded"),
            "{}",
            j.status.message
        );

        // Finished 31 s ago with a TTL of 30 s: the job goes.
        let done = SystemTime::now() - Duration::from_secs(31);
        j.status.completion_time = Some(rfc3339(done));
        let mut effects = Effects::default();
        reconcile_job(
            &key(),
            &mut j,
            &views,
            &no_credentials(),
            false,
            &mut HashMap::new(),
            &mut effects,
        );
        assert_eq!(effects.expired, [key()]);
    }

    #[test]
    fn a_missing_pull_secret_fails_the_node_with_the_reason() {
        let mut j = job(&serde_json::json!({"image": "r.example/a:1", "pullSecrets": ["creds"]}));
        let mut effects = Effects::default();
        let secrets: HashMap<ObjectKey, Result<String, String>> = [(
            ObjectKey::new(secret::KIND, "default", "creds"),
            Err("does not exist".to_owned()),
        )]
        .into();
        reconcile_job(
            &key(),
            &mut j,
            &nodes(&["n1"]),
            &TaskCredentials {
                secrets: &secrets,
                grants: None,
            },
            false,
            &mut HashMap::new(),
            &mut effects,
        );
        assert!(effects.messages.is_empty());
        assert_eq!(
            j.status.nodes[0].message,
            "pull secret \"creds\" does not exist"
        );
        assert!(j.status.completion_time.is_some());
    }
}
