//! Agent-managed pods on the controller's side: each node's agent is sent the full set of
//! pods placed on its node (when it registers and whenever one of them changes), and the
//! statuses it reports are stored beside the pods (`Pod.status/<ns>/<name>`). The agent
//! owns the running; the controller only says what should run where.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};

use rigger_proto::v1::{AssignedPod, ControllerMessage, PodSet, PodStatus, controller_message};

use crate::fleet::nodes::NodeRegistry;
use crate::fleet::relay::Relay;
use rigger_api::lifecycle_cooperator::LifecycleCooperator;
use rigger_api::pod::{self, Pod};
use rigger_api::secret;
use rigger_store::{ObjectKey, Precondition, Store, StoreError};

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
    /// Nodes that registered and wait for their set, read for all of them at once.
    registered: Arc<Mutex<Registered>>,
    /// Held from a read of the pods to the sends made from it: sets reach a node in the
    /// order they were read, so an older one never overwrites a newer one.
    sending: Arc<tokio::sync::Mutex<()>>,
}

/// Registrations waiting for their pod sets: a burst of them (a fleet reconnecting after
/// a restart) costs a few reads of the pods, not one each.
#[derive(Debug, Default)]
struct Registered {
    waiting: Vec<String>,
    /// A task is sending sets; it reads again for those that came during its read.
    sending: bool,
}

/// The pods and cooperators of the store, as one read gave them.
struct Placed {
    /// By the node they are placed on: each decoded, and as stored (sent as stored, so a
    /// field a newer release wrote reaches the agent, which may know it, unchanged).
    pods: HashMap<String, Vec<(Pod, String)>>,
    cooperators: Vec<LifecycleCooperator>,
    /// Nodes a pod that does not decode is placed on (`None`: every node — a pod whose
    /// node cannot be read either, or a LifecycleCooperator that does not decode): their
    /// sets are not sent, since a set without the pod would stop it. Their agents keep
    /// running what they have.
    held: Option<HashSet<String>>,
}

impl PodSync {
    pub fn new(store: Store, nodes: NodeRegistry) -> Self {
        Self {
            store,
            nodes,
            relay: Relay::default(),
            registered: Arc::default(),
            sending: Arc::default(),
        }
    }

    /// Send `node`'s agent, which just registered, its pod set: from a read of the pods
    /// that starts after the registration (a set read before could miss a pod whose own
    /// send found the node away), shared with the registrations waiting at that moment.
    pub fn send_at_registration(&self, node: &str) {
        {
            let mut registered = self
                .registered
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            registered.waiting.push(node.to_owned());
            if registered.sending {
                return;
            }
            registered.sending = true;
        }
        let this = self.clone();
        tokio::spawn(async move {
            loop {
                let nodes = {
                    let mut registered = this
                        .registered
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner);
                    if registered.waiting.is_empty() {
                        registered.sending = false;
                        return;
                    }
                    std::mem::take(&mut registered.waiting)
                };
                let _turn = this.sending.lock().await;
                match this.placed().await {
                    Ok(placed) => {
                        for node in nodes {
                            this.send_from(&placed, &node).await;
                        }
                    }
                    Err(error) => {
                        tracing::warn!(%error, nodes = nodes.len(), "cannot read the pods for registered nodes")
                    }
                }
            }
        });
    }

    /// One read of the pods and cooperators.
    async fn placed(&self) -> Result<Placed, StoreError> {
        let listed = self.store.list_all_objects::<LifecycleCooperator>().await?;
        // A cooperator this release cannot read may gate any pod: no set is sent (a set
        // without its gate would let a pod be stopped or changed unasked) until it reads.
        let mut held = match listed.undecodable.first() {
            Some((key, detail)) => {
                tracing::warn!(cooperator = %key, %detail, "a stored LifecycleCooperator does not decode; no node's pod set is sent");
                None
            }
            None => Some(HashSet::new()),
        };
        let cooperators = listed.decoded.into_iter().map(|c| c.value).collect();
        let mut pods: HashMap<String, Vec<(Pod, String)>> = HashMap::new();
        for stored in self.store.list(pod::KIND).await? {
            let text = String::from_utf8_lossy(&stored.object).into_owned();
            match rigger_store::typed::decode_object::<Pod>(stored) {
                Ok(pod) => {
                    if let Some(node) = pod.value.spec.node_name.clone() {
                        pods.entry(node).or_default().push((pod.value, text));
                    }
                }
                Err(error) => {
                    // Placed where `spec.nodeName` says, if that much reads; an
                    // unplaced pod holds no node, an unreadable one every node.
                    let node = serde_json::from_str::<serde_json::Value>(&text).map(|v| {
                        v.pointer("/spec/nodeName")
                            .and_then(serde_json::Value::as_str)
                            .map(str::to_owned)
                    });
                    tracing::warn!(%error, node = ?node.as_ref().ok(), "a stored pod does not decode; the pods of its node are left as they are");
                    match (node, held.as_mut()) {
                        (Ok(Some(node)), Some(held)) => {
                            held.insert(node);
                        }
                        (Ok(_), _) => {}
                        (Err(_), _) => held = None,
                    }
                }
            }
        }
        Ok(Placed {
            pods,
            cooperators,
            held,
        })
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

    /// The pods of `placed` on `node`.
    async fn pods_of(&self, placed: &Placed, node: &str) -> Result<Vec<AssignedPod>, StoreError> {
        let mut assigned = Vec::new();
        for (pod, stored) in placed.pods.get(node).into_iter().flatten() {
            let matching: Vec<_> = placed
                .cooperators
                .iter()
                .filter(|c| {
                    c.metadata.namespace == pod.metadata.namespace
                        && c.spec.selector.matches(&pod.metadata.labels)
                })
                .map(LifecycleCooperator::cooperator)
                .collect();
            let docker_configs = self.pull_secrets_of(pod).await?;
            assigned.push(AssignedPod {
                uid: pod.metadata.uid.clone().unwrap_or_default(),
                json: stored.clone(),
                cooperators: serde_json::to_string(&matching).unwrap_or_default(),
                docker_configs,
            });
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
            let found = self
                .store
                .get_object::<secret::Secret>(namespace, &reference.name)
                .await;
            let secret = match found {
                Ok(Some(secret)) => secret.value,
                Ok(None) => {
                    tracing::warn!(pod = %pod.metadata.name, secret = %reference.name, "an imagePullSecret of the pod does not exist");
                    continue;
                }
                Err(StoreError::Undecodable { .. }) => {
                    tracing::warn!(pod = %pod.metadata.name, secret = %reference.name, "an imagePullSecret of the pod is unreadable");
                    continue;
                }
                Err(error) => return Err(error),
            };
            let config = secret.docker_config();
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
        let _turn = self.sending.lock().await;
        let placed = match self.placed().await {
            Ok(placed) => placed,
            Err(error) => {
                tracing::warn!(%error, "cannot read pods");
                return;
            }
        };
        let mut nodes: Vec<&String> = placed.pods.keys().collect();
        nodes.sort();
        for node in nodes {
            self.send_from(&placed, node).await;
        }
    }

    /// Send `node`'s agent its full set of pods (a no-op when it is not connected: it
    /// gets the set when it registers).
    pub async fn send_to(&self, node: &str) {
        let _turn = self.sending.lock().await;
        match self.placed().await {
            Ok(placed) => self.send_from(&placed, node).await,
            Err(error) => tracing::warn!(%node, %error, "cannot read the node's pods"),
        }
    }

    /// Send `node`'s agent its set as `placed` has it.
    async fn send_from(&self, placed: &Placed, node: &str) {
        if placed.held.as_ref().is_none_or(|held| held.contains(node)) {
            tracing::debug!(%node, "something the node's pods need does not decode; its pod set is not sent");
            return;
        }
        match self.pods_of(placed, node).await {
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
        let placed = match self.store.get_as::<Pod>(key.clone()).await {
            Ok(Some(pod)) => {
                pod.value.metadata.uid.as_deref() == Some(status.uid.as_str())
                    && pod.value.spec.node_name.as_deref() == Some(node)
            }
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
