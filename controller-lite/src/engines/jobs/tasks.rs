//! The task a node of a job is sent (a pull), with what it carries besides the job: the
//! job's pull secrets and, with sharing on, its peers and a grant for each.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use rigger_api::image_pull_job::{ImagePullJob, ImagePullPolicy};
use rigger_api::secret;
use rigger_proto::peer_grant::GrantFor;
use rigger_proto::v1::{ControllerMessage, PullImage, Task, controller_message, task};

use super::sources::Source;
use rigger_store::ObjectKey;

/// What tasks carry besides the job itself: the pull secrets (by key), and the peer
/// grants when the controller signs them (`None`: sharing is off).
pub(super) struct TaskCredentials<'a> {
    pub(super) secrets: &'a HashMap<ObjectKey, Result<String, String>>,
    pub(super) grants: Option<&'a rigger_proto::peer_grant::GrantSigner>,
}

/// How long a peer grant lasts past the pull's own time limit.
const GRANT_MARGIN: Duration = Duration::from_secs(300);

/// When the grants a pass signs for a job are valid.
#[derive(Debug, Clone, Copy)]
pub(super) struct GrantWindow {
    /// Now: when they are issued.
    pub(super) from: SystemTime,
    pub(super) until: SystemTime,
}

/// The job's grants from `now`: the pull's time limit and a margin, never past the
/// job's deadline (and never past the grants' own maximum, which `sign` keeps).
pub(super) fn grant_window(
    job: &ImagePullJob,
    now: SystemTime,
    deadline: Option<SystemTime>,
) -> GrantWindow {
    let lifetime = Duration::from_secs(job.spec.pull_policy.timeout_seconds)
        .saturating_add(GRANT_MARGIN)
        .min(rigger_proto::peer_grant::MAX_GRANT_LIFETIME);
    let until = now.checked_add(lifetime).unwrap_or(now);
    GrantWindow {
        from: now,
        until: deadline.map_or(until, |deadline| until.min(deadline)),
    }
}

pub(super) fn pull_task(
    job: &ImagePullJob,
    key: &ObjectKey,
    node: &str,
    task_id: &str,
    credentials: &TaskCredentials<'_>,
    sources: &[Source],
    window: GrantWindow,
) -> Result<ControllerMessage, String> {
    let mut docker_configs = Vec::new();
    for name in &job.spec.pull_secrets {
        match credentials
            .secrets
            .get(&ObjectKey::new(secret::KIND, &key.namespace, name))
        {
            Some(Ok(document)) => docker_configs.push(document.clone()),
            Some(Err(reason)) => return Err(format!("pull secret {name:?} {reason}")),
            None => return Err(format!("pull secret {name:?} is not loaded yet")),
        }
    }
    Ok(ControllerMessage {
        message: Some(controller_message::Message::Task(Task {
            id: task_id.to_owned(),
            node_name: node.to_owned(),
            work: Some(task::Work::PullImage(PullImage {
                image: job.spec.image.clone(),
                always: job.spec.image_pull_policy == ImagePullPolicy::Always,
                timeout_seconds: u32::try_from(job.spec.pull_policy.timeout_seconds)
                    .unwrap_or(u32::MAX),
                docker_configs,
                peers: peer_sources(job, node, credentials, sources, window),
            })),
        })),
    })
}

/// The task's peers, each with a grant for `node` to fetch from it the image the job
/// names (as that peer resolved it itself), for `window`. A grant that cannot be signed
/// leaves its peer out (the registry remains).
pub(super) fn peer_sources(
    job: &ImagePullJob,
    node: &str,
    credentials: &TaskCredentials<'_>,
    sources: &[Source],
    window: GrantWindow,
) -> Vec<rigger_proto::v1::PeerSource> {
    let Some(signer) = credentials.grants else {
        return Vec::new();
    };
    if window.until <= window.from {
        return Vec::new();
    }
    sources
        .iter()
        .filter_map(|source| {
            let what = GrantFor {
                node,
                server: &source.node,
                image: &job.spec.image,
            };
            match signer.sign(what, window.from, window.until) {
                Ok(grant) => Some(rigger_proto::v1::PeerSource {
                    node: source.node.clone(),
                    address: source.address.clone(),
                    grant,
                }),
                Err(error) => {
                    tracing::warn!(%error, peer = %source.node, "cannot sign a peer grant");
                    None
                }
            }
        })
        .collect()
}
