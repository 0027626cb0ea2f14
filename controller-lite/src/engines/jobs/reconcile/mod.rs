//! The decisions for one job, without I/O and without a clock (the pass brings `now`):
//! which nodes it selects, which pull now (parallelism counts nodes in `Pulling` only),
//! retries with back-off, deadline and TTL, lost nodes and images gone from a node. The
//! effects (tasks, cancellations, deletions) go back to the engine to carry out.
//!
//! One pass, in the order a reader checks a job: a finished job only waits for its TTL;
//! otherwise it starts, takes its nodes, fails what is open at its deadline or watches
//! each node (lost, silent, to be sent again, its image gone, back), sends the waiting
//! ones within parallelism, and sums up.

use std::collections::HashMap;
use std::str::FromStr as _;
use std::time::{Duration, SystemTime};

use rigger_proto::v1::{CancelTask, ControllerMessage, controller_message};

use crate::fleet::nodes::NodeView;
use rigger_api::Condition;
use rigger_api::image_pull_job::{
    CompletionPolicyType, ImagePullJobStatus, NodePullPhase, NodePullStatus,
};
use rigger_store::ObjectKey;

use super::sources::{self, Fanout, Source};
use super::state::{JobState, Now};
use super::tasks::{self, GrantWindow, TaskCredentials, pull_task};
use super::{Effects, parse_time};

#[cfg(test)]
pub(super) mod tests;

/// A silent node's attempt is given up this long after its `timeoutSeconds` (the agent
/// enforces the timeout; this catches an agent that stopped reporting).
const SILENCE_MARGIN: Duration = Duration::from_secs(30);

/// What one pass over the jobs decides with.
pub(super) struct Pass<'a> {
    pub(super) key: &'a ObjectKey,
    pub(super) views: &'a HashMap<String, NodeView>,
    pub(super) credentials: &'a TaskCredentials<'a>,
    /// Right after a controller start agents are still reconnecting: none is lost yet.
    pub(super) starting: bool,
    /// Nodes may join an Always job that started: while `starting`, and on the pass
    /// the start ends — when the last agent to come back is what ended it, that pass is
    /// the first to see it.
    pub(super) admitting: bool,
    pub(super) now: Now,
}

/// Where a pass's decisions go: the tasks it sent (task id → job and node) and the
/// messages and deletions for the engine to carry out.
pub(super) struct Out<'a> {
    pub(super) tasks: &'a mut HashMap<String, (ObjectKey, String)>,
    pub(super) effects: &'a mut Effects,
}

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

/// One pass over `job`.
pub(super) fn reconcile_job(pass: &Pass<'_>, job: &mut JobState, out: &mut Out<'_>) {
    if job.finished() {
        let policy = &job.job.spec.completion_policy;
        if policy.ttl_passed(job.status.completion_time.as_deref(), pass.now.wall) {
            out.effects.expired.push(pass.key.clone());
        }
        return;
    }
    let first = job.status.start_time.is_none();
    if first {
        job.status.start_time = Some(pass.now.rfc3339());
        job.dirty = true;
    }
    // Membership: fixed at the start for Always — once this controller's agents have had
    // time to reconnect: the nodes whose agents come back join a job that started before
    // (under the last leader, which may itself have been starting) or meanwhile; Never
    // takes nodes that join later.
    // A job started without a node of its own is one another controller began (Kruise's
    // manager, whose status holds counts but no nodes), or whose records were lost:
    // it takes its nodes now, as a new job does; those that pulled already answer
    // "already present" and fetch nothing.
    let taken_over = !first && job.status.nodes.is_empty();
    let open = first
        || taken_over
        || pass.admitting
        || job.job.spec.completion_policy.kind == CompletionPolicyType::Never;
    if open {
        take_members(job, pass.views);
    }
    let deadline = deadline(job);
    let deadline_passed = deadline.is_some_and(|deadline| pass.now.wall >= deadline);
    if deadline_passed {
        fail_at_deadline(job, out.effects);
    } else {
        let window = tasks::grant_window(&job.job, pass.now.wall, deadline);
        // Who holds the image to share, before this pass changes anything.
        let mut holders = if pass.credentials.grants.is_some() {
            sources::holders(&job.status.nodes, pass.views)
        } else {
            Vec::new()
        };
        watch_nodes(pass, job, &holders, window, out.effects);
        dispatch(pass, job, &mut holders, window, out);
    }
    sum_up(pass, job, deadline_passed);
}

/// Whether a finished job's `ttlSecondsAfterFinished` has passed at `now`.
/// The nodes the job selects join it (named nodes that never registered too: they
/// fail as such).
fn take_members(job: &mut JobState, views: &HashMap<String, NodeView>) {
    let mut names: Vec<&String> = views
        .iter()
        .filter(|(name, view)| job.selects(name, view))
        .map(|(name, _)| name)
        .collect();
    if let Some(selector) = &job.job.spec.selector {
        names.extend(selector.names.iter());
    }
    names.sort();
    names.dedup();
    let mut joined = false;
    for name in names {
        if !job.index.contains_key(name.as_str()) {
            job.status.nodes.push(NodePullStatus {
                name: name.clone(),
                ..NodePullStatus::default()
            });
            joined = true;
        }
    }
    job.status.nodes.sort_by(|a, b| a.name.cmp(&b.name));
    job.reindex();
    job.dirty |= joined;
}

/// The deadline ends everything still open: pulls are cancelled, waiting and lost
/// nodes fail.
fn fail_at_deadline(job: &mut JobState, effects: &mut Effects) {
    for entry in &mut job.status.nodes {
        if entry.phase == NodePullPhase::Pulling {
            effects.messages.push((
                entry.name.clone(),
                cancel(&entry.task_id, "job deadline exceeded"),
            ));
        }
        if matches!(entry.phase, NodePullPhase::Pulling | NodePullPhase::Waiting) || entry.node_lost
        {
            entry.phase = NodePullPhase::Failed;
            entry.node_lost = false;
            entry.message = "activeDeadlineSeconds exceeded".to_owned();
            job.dirty = true;
        }
    }
}

/// Each node of the job as things stand: a pulling node lost or silent, a reconnected
/// one sent its task again, a Never job's image gone from its node, a lost node back or
/// out of time.
fn watch_nodes(
    pass: &Pass<'_>,
    job: &mut JobState,
    holders: &[Source],
    window: GrantWindow,
    effects: &mut Effects,
) {
    let never = job.job.spec.completion_policy.kind == CompletionPolicyType::Never;
    let timeout = Duration::from_secs(job.job.spec.pull_policy.timeout_seconds);
    for i in 0..job.status.nodes.len() {
        let name = job.status.nodes[i].name.clone();
        let view = pass.views.get(&name);
        let not_ready = why_not_ready(view);
        let phase = job.status.nodes[i].phase;
        let node_lost = job.status.nodes[i].node_lost;
        // A reconnect asks for one resend, whatever the node's phase by now.
        let resend = job
            .runs
            .get_mut(&name)
            .is_some_and(|r| std::mem::take(&mut r.resend));
        match phase {
            NodePullPhase::Pulling => {
                watch_pulling(pass, job, i, resend, holders, window, effects);
            }
            // completionPolicy Never keeps the image on the node: an inventory taken
            // after the pull that lacks it sends the node back to pulling.
            NodePullPhase::Succeeded if never => {
                let entry = &mut job.status.nodes[i];
                if image_gone(view, &job.job.spec.image, entry.completion_time.as_deref()) {
                    entry.phase = NodePullPhase::Waiting;
                    entry.message = "the image left the node; pulling it again".to_owned();
                    job.dirty = true;
                }
            }
            NodePullPhase::Failed if node_lost && not_ready.is_none() => {
                // Back before the job finished: the work resumes, the attempt it held
                // included (the agent's report of it may come after this pass).
                let run = job.run(&name);
                run.lost_at = None;
                let resume = std::mem::take(&mut run.lost_pulling);
                if resume {
                    run.resend = true;
                    run.sent_at = Some(pass.now.mono);
                }
                let entry = &mut job.status.nodes[i];
                entry.node_lost = false;
                if resume {
                    entry.phase = NodePullPhase::Pulling;
                    entry.message = "node is back; its pull goes on".to_owned();
                } else {
                    entry.phase = NodePullPhase::Waiting;
                    entry.message = "node is back".to_owned();
                }
                job.dirty = true;
            }
            NodePullPhase::Failed
                if node_lost
                    && job
                        .runs
                        .get(&name)
                        .and_then(|r| r.lost_at)
                        .is_none_or(|at| pass.now.mono.saturating_duration_since(at) > timeout) =>
            {
                // A node gets as long as one pull may take to come back.
                let entry = &mut job.status.nodes[i];
                entry.node_lost = false;
                entry.message = format!(
                    "{}; not back within pullPolicy.timeoutSeconds ({}s)",
                    entry.message,
                    timeout.as_secs()
                );
                let run = job.run(&name);
                run.lost_at = None;
                run.lost_pulling = false;
                job.dirty = true;
            }
            _ => {}
        }
    }
}

/// A pulling node: lost when its node is not ready, given up when silent past its
/// timeout, sent its task again when it reconnected.
fn watch_pulling(
    pass: &Pass<'_>,
    job: &mut JobState,
    i: usize,
    resend: bool,
    holders: &[Source],
    window: GrantWindow,
    effects: &mut Effects,
) {
    let timeout = Duration::from_secs(job.job.spec.pull_policy.timeout_seconds);
    let backoff_limit = job.job.spec.pull_policy.backoff_limit;
    let name = job.status.nodes[i].name.clone();
    let silent = job
        .runs
        .get(&name)
        .and_then(|r| r.sent_at)
        .is_some_and(|at| {
            pass.now.mono.saturating_duration_since(at) > timeout.saturating_add(SILENCE_MARGIN)
        });
    if let Some(reason) = why_not_ready(pass.views.get(&name)) {
        if pass.starting && pass.views.get(&name).is_none_or(|v| v.not_ready.is_some()) {
            // Its agent may be back without its inventory yet: the resend its return
            // asked for waits for the pass that finds it ready. Dropped, the agent's
            // answer for the attempt (its report at registration came before this
            // controller knew the job) would never come, and the node would wait out
            // the attempt and pull again.
            if resend {
                job.run(&name).resend = true;
            }
            return;
        }
        let entry = &mut job.status.nodes[i];
        entry.phase = NodePullPhase::Failed;
        entry.node_lost = true;
        entry.message = format!("node lost while pulling: {reason}");
        let run = job.run(&name);
        run.lost_at = Some(pass.now.mono);
        run.lost_pulling = true;
        job.dirty = true;
    } else if silent {
        let entry = &mut job.status.nodes[i];
        effects
            .messages
            .push((name.clone(), cancel(&entry.task_id, "no result in time")));
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
    } else if resend {
        let turn = job.status.nodes[i].attempts as usize;
        let sources = plan_sources(job, holders, &name, turn);
        let entry = &job.status.nodes[i];
        match pull_task(
            &job.job,
            pass.key,
            &name,
            &entry.task_id,
            pass.credentials,
            &sources,
            window,
        ) {
            Ok(message) => effects.messages.push((name, message)),
            Err(reason) => fail(&mut job.status.nodes[i], &reason),
        }
    }
}

/// `node`'s sources for its `turn`-th pull of this pass, planned (recorded, so the
/// others' plans and its reports are judged against them).
fn plan_sources(job: &mut JobState, holders: &[Source], node: &str, turn: usize) -> Vec<Source> {
    let suspects = job.runs.get(node).map(|r| &r.suspects);
    let sources = sources::sources_for(holders, node, turn, &job.runs, suspects);
    job.run(node).planned = sources.iter().map(|s| s.node.clone()).collect();
    sources
}

/// Send the waiting nodes their tasks within parallelism: none while the seed has not
/// resolved the image (sharing on, no holder yet), none still in back-off, and not
/// before a node is ready.
fn dispatch(
    pass: &Pass<'_>,
    job: &mut JobState,
    holders: &mut Vec<Source>,
    window: GrantWindow,
    out: &mut Out<'_>,
) {
    let limit = job.job.spec.parallelism_for(job.status.nodes.len());
    let mut active = job
        .status
        .nodes
        .iter()
        .filter(|n| n.phase == NodePullPhase::Pulling)
        .count();
    let mut fanout = sources::fanout(
        pass.credentials.grants.is_some(),
        &job.status.nodes,
        holders,
        pass.views,
        seed_overdue(job, pass.now),
    );
    let mut turn = 0;
    for i in 0..job.status.nodes.len() {
        if active >= limit {
            break;
        }
        let name = job.status.nodes[i].name.clone();
        if job.status.nodes[i].phase != NodePullPhase::Waiting
            // No node holds the image yet: this one waits for the seed's copy.
            || !sources::may_start(fanout, pass.views, &name)
            || job
                .runs
                .get(&name)
                .and_then(|r| r.retry_at)
                .is_some_and(|at| at > pass.now.mono)
        {
            continue;
        }
        if let Some(reason) = why_not_ready(pass.views.get(&name)) {
            if !pass.starting {
                let entry = &mut job.status.nodes[i];
                entry.phase = NodePullPhase::Failed;
                entry.node_lost = true;
                entry.message = format!("node not ready: {reason}");
                let run = job.run(&name);
                run.lost_at = Some(pass.now.mono);
                run.lost_pulling = false;
                job.dirty = true;
            }
            continue;
        }
        let sources = plan_sources(job, holders, &name, turn);
        turn += 1;
        if send(pass, job, i, &sources, window, out) {
            if let Fanout::Seed { .. } = fanout {
                fanout = Fanout::Seed { seed_pulling: true };
                tracing::info!(job = %pass.key, seed = %name, "no node holds the image yet: one pulls it from the registry, the rest will fetch from it");
            }
            // Nodes sent later in this pass may fall back on this one.
            if let Some(sent) = sources::just_sent(holders, pass.views, &name) {
                holders.push(sent);
            }
            active += 1;
        }
        job.dirty = true;
    }
}

/// Whether a node has been pulling for [`sources::SEED_PATIENCE`] without resolving
/// the image.
fn seed_overdue(job: &JobState, now: Now) -> bool {
    job.status.nodes.iter().any(|e| {
        e.phase == NodePullPhase::Pulling
            && e.image_digest.is_empty()
            && job
                .runs
                .get(&e.name)
                .and_then(|r| r.sent_at)
                .is_some_and(|at| now.mono.saturating_duration_since(at) > sources::SEED_PATIENCE)
    })
}

/// Send node `i` its next attempt (from `sources`); whether it went out (else the node
/// failed with the reason).
fn send(
    pass: &Pass<'_>,
    job: &mut JobState,
    i: usize,
    sources: &[Source],
    window: GrantWindow,
    out: &mut Out<'_>,
) -> bool {
    let name = job.status.nodes[i].name.clone();
    let attempt = job.status.nodes[i].attempts + 1;
    let task_id = format!("{}/{name}/{attempt}", job.uid());
    match pull_task(
        &job.job,
        pass.key,
        &name,
        &task_id,
        pass.credentials,
        sources,
        window,
    ) {
        Ok(message) => {
            out.effects.messages.push((name.clone(), message));
            out.tasks
                .insert(task_id.clone(), (pass.key.clone(), name.clone()));
            let entry = &mut job.status.nodes[i];
            entry.attempts = attempt;
            entry.task_id = task_id;
            entry.phase = NodePullPhase::Pulling;
            entry.bytes_done = 0;
            entry.message.clear();
            // This attempt reports the digest it resolves (it serves peers from then).
            entry.image_digest.clear();
            entry.start_time = Some(pass.now.rfc3339());
            entry.completion_time = None;
            job.run(&name).sent_at = Some(pass.now.mono);
            true
        }
        Err(reason) => {
            fail(&mut job.status.nodes[i], &reason);
            false
        }
    }
}

/// Counts and message; completion for Always once every node succeeded or failed (lost
/// nodes count as failed but may still come back: the job waits for them). Not while the
/// controller is starting (or has just taken over): agents are still reconnecting, so the
/// nodes a job selects may not all have joined it yet — it would complete over the first
/// to reconnect, or over none.
fn sum_up(pass: &Pass<'_>, job: &mut JobState, deadline_passed: bool) {
    let (key, now) = (pass.key, pass.now);
    let always = job.job.spec.completion_policy.kind == CompletionPolicyType::Always;
    let paused = job.job.spec.paused();
    let status = &mut job.status;
    let desired = status.nodes.len();
    status.desired = u32::try_from(desired).unwrap_or(u32::MAX);
    let (succeeded, failed) = count_nodes(status);
    let lost = status.nodes.iter().filter(|n| n.node_lost).count();
    let settling = pass.starting && !deadline_passed;
    if always && succeeded + failed == desired && lost == 0 && !settling {
        status.completion_time = Some(now.rfc3339());
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
    fresh && !names.has(&name)
}

/// A node's attempt that cannot even start (its pull secret is missing, say).
pub(super) fn fail(entry: &mut NodePullStatus, reason: &str) {
    entry.phase = NodePullPhase::Failed;
    entry.node_lost = false;
    entry.message = reason.to_owned();
}
