//! What Kruise's webhook does to a new ContainerRecreateRequest, for requests created
//! on a Kubernetes API server (kubectl, GitOps): find the pod, name its node and uid in
//! the request's labels, and record which instance of each container is to be
//! recreated (`statusContext`, from the Pod's status). Rigger's own `apply` does the same
//! when a request reaches it directly.
//!
//! [`admit`] is the decision, pure; [`ClusterPods`] is the one question it needs asked of
//! the cluster.

use rigger_api::container_recreate_request::{
    CONTAINERD_ID_PREFIX, ContainerRecreateRequest, NODE_NAME_LABEL, POD_UID_LABEL, StatusContext,
};

use super::POD_OWNER_LABEL;

/// Kruise's label that marks a request not yet finished.
pub const ACTIVE_LABEL: &str = "crr.apps.kruise.io/active";

pub use crate::cluster::pods::{ClusterPods, PodFacts};

/// Admit `request` for `pod`: the labels and status contexts set, or why it cannot run.
pub fn admit(request: &mut ContainerRecreateRequest, pod: Option<&PodFacts>) -> Result<(), String> {
    let name = &request.spec.pod_name;
    let Some(pod) = pod else {
        return Err(format!("pod {name} not found"));
    };
    let Some(node) = pod.node.as_deref().filter(|n| !n.is_empty()) else {
        return Err(format!("pod {name} is not scheduled to a node yet"));
    };
    for container in &request.spec.containers {
        if !pod
            .containers
            .iter()
            .any(|(known, ..)| *known == container.name)
        {
            return Err(format!(
                "pod {name} has no running container {:?} in its status",
                container.name
            ));
        }
    }
    // Whatever a user wrote: the Pod says where it is and which it is. (Only open
    // requests are admitted, so an open one is active.)
    let labels = &mut request.metadata.labels;
    labels.insert(NODE_NAME_LABEL.to_owned(), node.to_owned());
    labels.insert(POD_UID_LABEL.to_owned(), pod.uid.clone());
    labels.insert(POD_OWNER_LABEL.to_owned(), "kubelet".to_owned());
    labels.insert(ACTIVE_LABEL.to_owned(), "true".to_owned());
    for container in &mut request.spec.containers {
        // As Kruise's webhook: the hook run before the stop is the container's own
        // (kubelet's, from the Pod), never one the request brings — whoever may create
        // a request must not gain exec in the pod's containers or a request the node
        // sends into the network.
        container.pre_stop = None;
        container.ports.clear();
        if container.status_context.is_some() {
            continue;
        }
        let found = pod
            .containers
            .iter()
            .find(|(known, ..)| *known == container.name);
        if let Some((_, id, restarts)) = found
            && id.starts_with(CONTAINERD_ID_PREFIX)
        {
            container.status_context = Some(StatusContext {
                container_id: id.clone(),
                restart_count: *restarts,
            });
        }
    }
    Ok(())
}

/// Beside Kruise's manager: its webhook labelled `written` with the pod's uid and node
/// when the request was made (labels it keeps immutable). The pod Rigger found now
/// (`admitted`, from [`admit`]) must be that one: a pod of the same name made since is
/// not the request's.
pub fn matches_kruise_labels(
    written: &ContainerRecreateRequest,
    admitted: &ContainerRecreateRequest,
) -> Result<(), String> {
    for label in [POD_UID_LABEL, NODE_NAME_LABEL] {
        let (was, is) = (
            written.metadata.labels.get(label),
            admitted.metadata.labels.get(label),
        );
        match was {
            None => {
                return Err(format!(
                    "Kruise's webhook did not label it ({label} is missing)"
                ));
            }
            Some(was) if Some(was) != is => {
                return Err(format!(
                    "pod {} is not the one it was made for ({label} {was}, the pod's {})",
                    written.spec.pod_name,
                    is.map_or("none", String::as_str)
                ));
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// A request already started (`started`, as stored) and admitted again after a restart
/// (`admitted`, labelled from the pod found now) acts on the same pod: a pod of the same
/// name made meanwhile (a StatefulSet's replacement) is refused, never recreated in.
pub fn same_pod(
    started: &ContainerRecreateRequest,
    admitted: &ContainerRecreateRequest,
) -> Result<(), String> {
    let uid =
        |request: &ContainerRecreateRequest| request.metadata.labels.get(POD_UID_LABEL).cloned();
    match (uid(started), uid(admitted)) {
        (Some(was), Some(is)) if was != is => Err(format!(
            "pod {} was replaced since the request started (uid {was}, now {is})",
            started.spec.pod_name
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn request() -> ContainerRecreateRequest {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "apps.kruise.io/v1alpha1", "kind": "ContainerRecreateRequest",
            "metadata": {"name": "r", "namespace": "shop"},
            "spec": {"podName": "web", "containers": [{"name": "app"}]},
        }))
        .unwrap()
    }

    fn pod(node: Option<&str>) -> PodFacts {
        PodFacts {
            uid: "u1".into(),
            node: node.map(str::to_owned),
            containers: vec![("app".into(), "containerd://abc".into(), 2)],
        }
    }

    #[test]
    fn a_request_is_labelled_with_the_pods_node_and_uid_and_its_running_instance() {
        let mut r = request();
        admit(&mut r, Some(&pod(Some("n1")))).unwrap();
        assert_eq!(r.metadata.labels[NODE_NAME_LABEL], "n1");
        assert_eq!(r.metadata.labels[POD_UID_LABEL], "u1");
        assert_eq!(r.metadata.labels[ACTIVE_LABEL], "true");
        let context = r.spec.containers[0].status_context.as_ref().unwrap();
        assert_eq!(
            (context.container_id.as_str(), context.restart_count),
            ("containerd://abc", 2)
        );
    }

    #[test]
    fn a_missing_unscheduled_or_mismatched_pod_is_refused_by_name() {
        assert_eq!(admit(&mut request(), None), Err("pod web not found".into()));
        assert!(
            admit(&mut request(), Some(&pod(None)))
                .unwrap_err()
                .contains("not scheduled")
        );
        let mut other = request();
        other.spec.containers[0].name = "db".into();
        assert!(
            admit(&mut other, Some(&pod(Some("n1"))))
                .unwrap_err()
                .contains("\"db\"")
        );
    }

    #[test]
    fn a_pre_stop_or_ports_a_user_wrote_are_not_run() {
        let mut r: ContainerRecreateRequest = serde_json::from_value(serde_json::json!({
            "apiVersion": "apps.kruise.io/v1alpha1", "kind": "ContainerRecreateRequest",
            "metadata": {"name": "r", "namespace": "shop"},
            "spec": {"podName": "web", "containers": [{"name": "app",
                "preStop": {"httpGet": {"host": "169.254.169.254", "port": 80, "path": "/"}},
                "ports": [{"name": "admin", "containerPort": 10250}]}]},
        }))
        .unwrap();
        admit(&mut r, Some(&pod(Some("n1")))).unwrap();
        assert!(r.spec.containers[0].pre_stop.is_none());
        assert!(r.spec.containers[0].ports.is_empty());
    }

    #[test]
    fn labels_a_user_wrote_are_replaced_by_the_pods_truth() {
        let mut r = request();
        r.metadata
            .labels
            .insert(NODE_NAME_LABEL.into(), "victim-node".into());
        r.metadata
            .labels
            .insert(POD_UID_LABEL.into(), "victim-uid".into());
        admit(&mut r, Some(&pod(Some("n1")))).unwrap();
        assert_eq!(r.metadata.labels[NODE_NAME_LABEL], "n1");
        assert_eq!(r.metadata.labels[POD_UID_LABEL], "u1");
    }

    #[test]
    fn a_context_given_is_kept_and_a_foreign_runtime_is_not_taken() {
        let mut r = request();
        let mut facts = pod(Some("n1"));
        facts.containers[0].1 = "cri-o://abc".into();
        admit(&mut r, Some(&facts)).unwrap();
        assert!(r.spec.containers[0].status_context.is_none());
    }

    #[test]
    fn beside_kruise_the_pod_must_be_the_one_kruise_s_webhook_labelled() {
        let pod = pod(Some("n1"));
        let mut written = request();
        written
            .metadata
            .labels
            .insert(POD_UID_LABEL.into(), "u1".into());
        written
            .metadata
            .labels
            .insert(NODE_NAME_LABEL.into(), "n1".into());
        let mut admitted = written.clone();
        admit(&mut admitted, Some(&pod)).unwrap();
        assert_eq!(matches_kruise_labels(&written, &admitted), Ok(()));
        // A pod of the same name made since: another uid.
        written
            .metadata
            .labels
            .insert(POD_UID_LABEL.into(), "earlier-uid".into());
        let error = matches_kruise_labels(&written, &admitted).unwrap_err();
        assert!(error.contains("earlier-uid"), "{error}");
        // Not labelled by Kruise's webhook at all.
        written.metadata.labels.clear();
        let error = matches_kruise_labels(&written, &admitted).unwrap_err();
        assert!(error.contains("missing"), "{error}");
    }

    /// Found reading the restart path: a controller that restarts admits every open
    /// request again from the pod found now; a request it had started whose pod was
    /// replaced meanwhile (a StatefulSet's pod, same name) was relabelled for the new
    /// pod and recreated its containers. It is refused instead, naming both uids.
    #[test]
    fn a_started_request_whose_pod_was_replaced_is_refused() {
        let mut started = request();
        admit(&mut started, Some(&pod(Some("n1")))).unwrap();
        let mut again = started.clone();
        admit(&mut again, Some(&pod(Some("n1")))).unwrap();
        assert_eq!(same_pod(&started, &again), Ok(()));
        let replacement = PodFacts {
            uid: "u2".into(),
            ..pod(Some("n2"))
        };
        let mut again = started.clone();
        admit(&mut again, Some(&replacement)).unwrap();
        let error = same_pod(&started, &again).unwrap_err();
        assert!(
            error.contains("web was replaced") && error.contains("u1") && error.contains("u2"),
            "{error}"
        );
    }
}
