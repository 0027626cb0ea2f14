//! Agent-managed pods on the controller's side: each node's agent is sent the full set of
//! pods placed on its node (when it registers and whenever one of them changes), and the
//! statuses it reports are stored beside the pods (`Pod.status/<ns>/<name>`). The agent
//! owns the running; the controller only says what should run where.

use rigger_proto::v1::{AssignedPod, ControllerMessage, PodSet, PodStatus, controller_message};

use crate::nodes::NodeRegistry;
use crate::relay::Relay;
use crate::store::{ObjectKey, Precondition, Store, StoreError};
use rigger_api::lifecycle_cooperator::{self, LifecycleCooperator};
use rigger_api::pod::{self, Pod};
use rigger_api::secret;

/// Whether a reported PodStatus has condition Ready=True.
pub fn is_ready(status: &serde_json::Value) -> bool {
    status["conditions"].as_array().is_some_and(|conditions| {
        conditions
            .iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

/// The store kind under which pod statuses live.
pub const STATUS_KIND: &str = "Pod.status";

pub fn status_key(pod: &ObjectKey) -> ObjectKey {
    ObjectKey::new(STATUS_KIND, &pod.namespace, &pod.name)
}

#[derive(Debug, Clone)]
pub struct PodSync {
    store: Store,
    nodes: NodeRegistry,
    relay: Relay,
}

impl PodSync {
    pub fn new(store: Store, nodes: NodeRegistry) -> Self {
        Self {
            store,
            nodes,
            relay: Relay::default(),
        }
    }

    /// Where questions for agents (logs, exec) wait for their answers.
    pub fn relay(&self) -> &Relay {
        &self.relay
    }

    /// Ask the agent of `node` and wait for the answer.
    pub async fn ask(
        &self,
        node: &str,
        kind: rigger_proto::v1::agent_request::Kind,
        timeout: std::time::Duration,
    ) -> Result<rigger_proto::v1::AgentResponse, tonic::Status> {
        self.relay.ask(&self.nodes, node, kind, timeout).await
    }

    /// The pods placed on `node`.
    async fn pods_of(&self, node: &str) -> Result<Vec<AssignedPod>, StoreError> {
        let cooperators: Vec<LifecycleCooperator> = self
            .store
            .list(lifecycle_cooperator::KIND)
            .await?
            .iter()
            .filter_map(|s| serde_json::from_slice(&s.object).ok())
            .collect();
        let mut assigned = Vec::new();
        for stored in self.store.list(pod::KIND).await? {
            let Ok(pod) = serde_json::from_slice::<Pod>(&stored.object) else {
                continue;
            };
            if pod.spec.node_name.as_deref() == Some(node) {
                let matching: Vec<_> = cooperators
                    .iter()
                    .filter(|c| {
                        c.metadata.namespace == pod.metadata.namespace
                            && c.spec.selector.matches(&pod.metadata.labels)
                    })
                    .map(LifecycleCooperator::cooperator)
                    .collect();
                let docker_configs = self.pull_secrets_of(&pod).await?;
                assigned.push(AssignedPod {
                    uid: pod.metadata.uid.clone().unwrap_or_default(),
                    json: String::from_utf8_lossy(&stored.object).into_owned(),
                    cooperators: serde_json::to_string(&matching).unwrap_or_default(),
                    docker_configs,
                });
            }
        }
        Ok(assigned)
    }

    /// The docker configs of `pod`'s imagePullSecrets that exist and hold one (as
    /// kubelet, a missing or unreadable one is passed over: the node's credentials and
    /// anonymous pulls remain, and a failing pull says what the registry answered).
    async fn pull_secrets_of(&self, pod: &Pod) -> Result<Vec<String>, StoreError> {
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        let mut configs = Vec::new();
        for reference in &pod.spec.image_pull_secrets {
            let key = ObjectKey::new(secret::KIND, namespace, &reference.name);
            let Some(stored) = self.store.get(key).await? else {
                tracing::warn!(pod = %pod.metadata.name, secret = %reference.name, "an imagePullSecret of the pod does not exist");
                continue;
            };
            let config = serde_json::from_slice::<secret::Secret>(&stored.object)
                .ok()
                .and_then(|s| s.docker_config());
            match config {
                Some(Ok(document)) => configs.push(document),
                _ => {
                    tracing::warn!(pod = %pod.metadata.name, secret = %reference.name, "an imagePullSecret of the pod holds no docker config")
                }
            }
        }
        Ok(configs)
    }

    /// Send every node with pods its set again (a cooperator changed).
    pub async fn send_to_all(&self) {
        let mut nodes: Vec<String> = match self.store.list(pod::KIND).await {
            Ok(pods) => pods
                .iter()
                .filter_map(|s| serde_json::from_slice::<Pod>(&s.object).ok())
                .filter_map(|p| p.spec.node_name)
                .collect(),
            Err(error) => {
                tracing::warn!(%error, "cannot read pods");
                return;
            }
        };
        nodes.sort();
        nodes.dedup();
        for node in nodes {
            self.send_to(&node).await;
        }
    }

    /// Send `node`'s agent its full set of pods (a no-op when it is not connected: it
    /// gets the set when it registers).
    pub async fn send_to(&self, node: &str) {
        match self.pods_of(node).await {
            Ok(pods) => {
                let message = ControllerMessage {
                    message: Some(controller_message::Message::Pods(PodSet { pods })),
                };
                if !self.nodes.send(node, message) {
                    tracing::debug!(%node, "pod set not delivered now; sent again at registration");
                }
            }
            Err(error) => tracing::warn!(%node, %error, "cannot read the node's pods"),
        }
    }

    /// Store a status `node` reported, if the pod is still placed there.
    pub async fn report(&self, node: &str, status: PodStatus) {
        let key = ObjectKey::new(pod::KIND, &status.namespace, &status.name);
        let placed = match self.store.get(key.clone()).await {
            Ok(Some(stored)) => serde_json::from_slice::<Pod>(&stored.object)
                .ok()
                .filter(|p| p.metadata.uid.as_deref() == Some(status.uid.as_str()))
                .is_some_and(|p| p.spec.node_name.as_deref() == Some(node)),
            _ => false,
        };
        if !placed {
            tracing::debug!(%node, pod = %key, "status of a pod not placed on this node ignored");
            return;
        }
        if let Err(error) = self
            .store
            .put(
                status_key(&key),
                status.json.into_bytes(),
                Precondition::Any,
            )
            .await
        {
            tracing::warn!(pod = %key, %error, "cannot store the pod's status");
        }
    }
}
