//! What one pass does with the requests (pure): which start, which wait for another
//! request of the same pod, which fail (deadline, pod gone or replaced, node not ready),
//! which are deleted after their TTL.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, SystemTime};

use rigger_api::container_recreate_request::CrrPhase;
use rigger_api::pod;
use rigger_proto::v1::ControllerMessage;

use super::tasks::{cancel, recreate_task};
use super::{NODE_NAME_LABEL, POD_UID_LABEL, Tracked};
use rigger_store::ObjectKey;

/// What one pass decided for the requests.
#[derive(Debug, Default)]
pub(super) struct Decisions {
    /// Cancellations for nodes (a deadline passed, the pod went away).
    pub(super) messages: Vec<(String, ControllerMessage)>,
    /// Requests whose task goes to their node now: marked sent once the node took it.
    pub(super) dispatch: Vec<(ObjectKey, String, ControllerMessage)>,
    /// Finished requests past their TTL: to delete.
    pub(super) expired: Vec<ObjectKey>,
}

/// Decide what each request needs now, from what was observed: the agent-managed pods
/// as stored (their uid; `None` deleted), each node's readiness (`None` ready, else why
/// not; absent: never connected) and the time. Changes the requests' statuses; does no
/// I/O.
pub(super) fn decide(
    requests: &mut BTreeMap<ObjectKey, Tracked>,
    pods: &HashMap<ObjectKey, Option<String>>,
    readiness: &HashMap<String, Option<String>>,
    now: SystemTime,
) -> Decisions {
    let mut decided = Decisions::default();
    // Oldest first, so the first open request of a pod is the one that runs.
    let mut order: Vec<(SystemTime, ObjectKey)> = requests
        .iter()
        .map(|(k, t)| (t.created(), k.clone()))
        .collect();
    order.sort();
    let mut busy: HashMap<String, String> = HashMap::new();
    for (created, key) in order {
        let Some(tracked) = requests.get_mut(&key) else {
            continue;
        };
        if tracked.finished() {
            let done_at = tracked
                .status
                .completion_time
                .as_deref()
                .and_then(|t| humantime::parse_rfc3339(t).ok());
            if let (Some(ttl), Some(done_at)) =
                (tracked.request.spec.ttl_seconds_after_finished, done_at)
                && now.duration_since(done_at).unwrap_or_default() >= Duration::from_secs(ttl)
            {
                decided.expired.push(key);
            }
            continue;
        }
        let node = tracked.label(NODE_NAME_LABEL).to_owned();
        let uid = tracked.label(POD_UID_LABEL).to_owned();
        if let Some(deadline) = tracked.request.spec.active_deadline_seconds
            && now.duration_since(created).unwrap_or_default() >= Duration::from_secs(deadline)
        {
            let reason = format!("activeDeadlineSeconds ({deadline}s) passed");
            tracing::info!(request = %key, %reason, "recreate request failed");
            if tracked.sent || tracked.status.phase == CrrPhase::Recreating {
                decided
                    .messages
                    .push((node.clone(), cancel(&tracked.task_id(), &reason)));
            }
            tracked.complete(&reason);
            continue;
        }
        let pod_key = ObjectKey::new(pod::KIND, &key.namespace, &tracked.request.spec.pod_name);
        // Agent-managed pods only (kubelet's are not in the store; their agent
        // notices a deleted pod).
        let gone = match pods.get(&pod_key) {
            Some(None) => Some("was deleted"),
            Some(Some(stored)) if *stored != uid => Some("was replaced (its uid changed)"),
            _ => None,
        };
        if let Some(what) = gone {
            let reason = format!("pod {} {what}", tracked.request.spec.pod_name);
            tracing::info!(request = %key, %reason, "recreate request failed");
            decided
                .messages
                .push((node.clone(), cancel(&tracked.task_id(), &reason)));
            tracked.complete(&reason);
            continue;
        }
        if let Some(earlier) = busy.get(&uid) {
            let message = format!("waiting for {earlier}, created earlier, on the same pod");
            if tracked.status.message != message {
                tracked.status.message = message;
                tracked.dirty = true;
            }
            continue;
        }
        busy.insert(uid.clone(), key.name.clone());
        if tracked.sent {
            continue;
        }
        match readiness.get(&node).cloned().flatten() {
            None if readiness.contains_key(&node) => {
                let task = recreate_task(tracked, &uid, &node);
                decided.dispatch.push((key, node, task));
            }
            reason => {
                let message = format!(
                    "node {node} is not ready: {}",
                    reason.unwrap_or_else(|| "its agent never connected".to_owned())
                );
                if tracked.status.message != message {
                    tracked.status.message = message;
                    tracked.dirty = true;
                }
            }
        }
    }
    decided
}

#[cfg(test)]
mod tests {
    use super::super::*;
    use super::*;

    /// A request `name` on pod `web` (uid `pod`) of node `n1`, created `age` ago.
    fn tracked(name: &str, pod: &str, age: Duration) -> (ObjectKey, Tracked) {
        let created = rigger_proto::time::rfc3339(SystemTime::now() - age);
        let request: ContainerRecreateRequest = serde_json::from_value(serde_json::json!({
            "apiVersion": "apps.kruise.io/v1alpha1",
            "kind": "ContainerRecreateRequest",
            "metadata": {
                "name": name, "namespace": "default", "uid": format!("uid-{name}"),
                "creationTimestamp": created,
                "labels": {NODE_NAME_LABEL: "n1", POD_UID_LABEL: pod, POD_OWNER_LABEL: "rigger"}
            },
            "spec": {"podName": "web", "containers": [{"name": "app"}], "activeDeadlineSeconds": 600}
        }))
        .unwrap();
        let key = ObjectKey::new(crr::KIND, "default", name);
        let tracked = Tracked {
            request,
            status: CrrStatus::default(),
            sent: false,
            dirty: false,
            announce: false,
        };
        (key, tracked)
    }

    #[test]
    fn one_request_per_pod_runs_oldest_first_and_only_on_a_ready_node() {
        let mut requests: BTreeMap<ObjectKey, Tracked> = [
            tracked("older", "p1", Duration::from_secs(20)),
            tracked("newer", "p1", Duration::from_secs(10)),
        ]
        .into();
        let pods = HashMap::from([(
            ObjectKey::new(pod::KIND, "default", "web"),
            Some("p1".to_owned()),
        )]);
        let now = SystemTime::now();

        let not_ready = HashMap::from([("n1".to_owned(), Some("heartbeats late".to_owned()))]);
        let decided = decide(&mut requests, &pods, &not_ready, now);
        assert!(decided.dispatch.is_empty());
        let older = &requests[&ObjectKey::new(crr::KIND, "default", "older")];
        assert_eq!(
            older.status.message,
            "node n1 is not ready: heartbeats late"
        );

        let ready = HashMap::from([("n1".to_owned(), None)]);
        let decided = decide(&mut requests, &pods, &ready, now);
        let sent: Vec<&str> = decided
            .dispatch
            .iter()
            .map(|(k, _, _)| k.name.as_str())
            .collect();
        assert_eq!(sent, ["older"]);
        let newer = &requests[&ObjectKey::new(crr::KIND, "default", "newer")];
        assert_eq!(
            newer.status.message,
            "waiting for older, created earlier, on the same pod"
        );

        let never = decide(&mut requests, &pods, &HashMap::new(), now);
        assert!(never.dispatch.is_empty());
        assert!(
            requests[&ObjectKey::new(crr::KIND, "default", "older")]
                .status
                .message
                .ends_with("its agent never connected")
        );
    }

    #[test]
    fn a_replaced_pod_or_a_passed_deadline_fails_the_request_and_cancels_it() {
        let (key, mut sent) = tracked("r", "p1", Duration::from_secs(10));
        sent.sent = true;
        let mut requests = BTreeMap::from([(key.clone(), sent)]);
        let replaced = HashMap::from([(
            ObjectKey::new(pod::KIND, "default", "web"),
            Some("p2".to_owned()),
        )]);
        let ready = HashMap::from([("n1".to_owned(), None)]);
        let decided = decide(&mut requests, &replaced, &ready, SystemTime::now());
        assert_eq!(decided.messages.len(), 1, "the node's task is cancelled");
        assert!(requests[&key].finished());
        assert_eq!(
            requests[&key].status.message,
            "pod web was replaced (its uid changed)"
        );

        let (key, late) = tracked("late", "p1", Duration::from_secs(601));
        let mut requests = BTreeMap::from([(key.clone(), late)]);
        let decided = decide(&mut requests, &HashMap::new(), &ready, SystemTime::now());
        assert!(decided.messages.is_empty(), "never sent: nothing to cancel");
        assert!(decided.dispatch.is_empty());
        assert_eq!(
            requests[&key].status.message,
            "activeDeadlineSeconds (600s) passed"
        );
    }
}
