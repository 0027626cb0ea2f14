//! Where a pod runs, and which pod a ContainerRecreateRequest is about.

use std::collections::HashMap;
use std::time::SystemTime;

use rigger_api::FieldError;
use rigger_api::pod::Pod;
use tonic::Status;

use super::{ControlService, namespace_or_default, store_status};
use crate::fleet::nodes::KubeletPodPlace;
use rigger_store::ObjectKey;

impl ControlService {
    /// The request's pod: an agent-managed Pod object, else a kubelet pod some node's
    /// inventory shows. Kruise's labels naming its uid and node (and who runs it).
    pub(super) async fn resolve_recreate_pod(
        &self,
        namespace: &str,
        request: &rigger_api::container_recreate_request::ContainerRecreateRequest,
    ) -> Result<std::collections::BTreeMap<String, String>, FieldError> {
        use crate::engines::recreate_requests::{NODE_NAME_LABEL, POD_OWNER_LABEL, POD_UID_LABEL};
        let pod_name = &request.spec.pod_name;
        let stored = self
            .store
            .get_object::<Pod>(namespace, pod_name)
            .await
            .map_err(|e| FieldError::new("spec.podName", format!("cannot read pods: {e}")))?
            .map(|pod| pod.value);
        let (owner, node, uid, containers) = match stored {
            Some(pod) => {
                let (Some(node), Some(uid)) =
                    (pod.spec.node_name.clone(), pod.metadata.uid.clone())
                else {
                    return Err(FieldError::new(
                        "spec.podName",
                        format!("pod {namespace}/{pod_name} is not placed on a node yet"),
                    ));
                };
                let names = pod.spec.containers.iter().map(|c| c.name.clone()).collect();
                ("rigger", node, uid, names)
            }
            None => match self.nodes.kubelet_pod(namespace, pod_name) {
                KubeletPodPlace::On(node, pod) => ("kubelet", node, pod.uid, pod.containers),
                KubeletPodPlace::ClaimedBy(nodes) => {
                    return Err(FieldError::new(
                        "spec.podName",
                        format!(
                            "kubelet pod {namespace}/{pod_name} is reported by more than one node ({}); no node's report alone decides where a request goes",
                            nodes.join(", ")
                        ),
                    ));
                }
                KubeletPodPlace::Nowhere => {
                    return Err(FieldError::new(
                        "spec.podName",
                        format!(
                            "pod {namespace}/{pod_name} not found (neither a Rigger pod nor a running kubelet pod on any node)"
                        ),
                    ));
                }
            },
        };
        for (i, container) in request.spec.containers.iter().enumerate() {
            if !containers.contains(&container.name) {
                return Err(FieldError::new(
                    format!("spec.containers[{i}].name"),
                    format!("pod {pod_name:?} has no container {:?}", container.name),
                ));
            }
        }
        Ok([
            (POD_UID_LABEL.to_owned(), uid),
            (NODE_NAME_LABEL.to_owned(), node),
            (POD_OWNER_LABEL.to_owned(), owner.to_owned()),
        ]
        .into())
    }

    /// The node and uid of a stored pod.
    pub(super) async fn placement(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<(String, String), Status> {
        let key = ObjectKey::new(rigger_api::pod::KIND, namespace_or_default(namespace), name);
        let pod = self
            .store
            .get_as::<Pod>(key.clone())
            .await
            .map_err(store_status)?
            .ok_or_else(|| Status::not_found(format!("{key}: not found")))?
            .value;
        match (pod.spec.node_name, pod.metadata.uid) {
            (Some(node), Some(uid)) => Ok((node, uid)),
            _ => Err(Status::failed_precondition(format!(
                "{key}: not placed on a node"
            ))),
        }
    }

    /// The ready node matching the pod's nodeSelector that runs the fewest pods.
    pub(super) async fn place(&self, pod: &Pod) -> Result<String, FieldError> {
        let counts = self.pods_per_node().await?;
        self.choose_node(pod, &counts)
    }

    /// How many pods each node runs (pods placed on it), as the store has them.
    pub(super) async fn pods_per_node(&self) -> Result<HashMap<String, usize>, FieldError> {
        let mut pods_per_node: HashMap<String, usize> = HashMap::new();
        let others =
            self.store.list_objects::<Pod>().await.map_err(|e| {
                FieldError::new("spec.nodeName", format!("cannot place the pod: {e}"))
            })?;
        for node in others.into_iter().filter_map(|p| p.value.spec.node_name) {
            *pods_per_node.entry(node).or_default() += 1;
        }
        Ok(pods_per_node)
    }

    /// Of the nodes ready now, the one matching `pod`'s nodeSelector that runs the fewest
    /// pods by `pods_per_node`.
    pub(super) fn choose_node(
        &self,
        pod: &Pod,
        pods_per_node: &HashMap<String, usize>,
    ) -> Result<String, FieldError> {
        let selector = rigger_api::LabelSelector {
            match_labels: pod.spec.node_selector.clone(),
            match_expressions: Vec::new(),
        };
        self.nodes
            .views(SystemTime::now(), self.node_timeout)
            .into_iter()
            .filter(|(_, view)| view.not_ready.is_none() && selector.matches(&view.labels))
            .map(|(name, _)| (pods_per_node.get(&name).copied().unwrap_or(0), name))
            .min()
            .map(|(_, name)| name)
            .ok_or_else(|| {
                FieldError::new(
                    "spec.nodeSelector",
                    "no ready node matches (set spec.nodeName, or start an agent with matching --node-labels)",
                )
            })
    }
}
