//! The nodes the controller knows, as their agents describe them, and the way to reach
//! each one's agent (the sending half of its link session).

use rigger_proto::time::rfc3339;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use futures::channel::mpsc;

use rigger_api::ObjectMeta;
use rigger_api::node::{self, ContainerImage, Node, NodeCondition, NodeInfo, NodeStatus};
use rigger_proto::v1::{ControllerMessage, NodeInventory, Register};
use tonic::Status;

use crate::fleet::stall::{StallClock, net_silence};

mod inventory;

use inventory::{Interner, InventorySummary};
pub use inventory::{KubeletPod, KubeletPodPlace, NodeImages, PodLabels, PodsByNode};

/// Where messages to one agent go. A queue that allocates per queued message, not in
/// blocks up front: thousands of idle agents each hold one, nearly always empty.
pub type AgentSender = mpsc::Sender<Result<ControllerMessage, Status>>;

/// Labels as a node's record keeps them: sorted pairs of shared strings. A node has a
/// handful, most of them the same across a fleet; a map per node cost a B-tree node.
type SharedLabels = Box<[(Arc<str>, Arc<str>)]>;

/// Why a node whose agent registered is not ready yet: its inventory follows the
/// registration (`ReportInventory`), milliseconds later.
pub const AWAITING_INVENTORY: &str = "registered; waiting for the agent's inventory";

/// One agent connection; a reconnect gets a new id, so a stale stream cannot touch the
/// record of its successor.
pub type SessionId = u64;

/// When a node was last heard from (its registration, heartbeat or inventory), with this
/// controller's stalls up to then ([`crate::fleet::stall`]): the node's silence is counted
/// without the stalls after it.
#[derive(Debug, Clone, Copy)]
struct Heard {
    at: SystemTime,
    stalled: Duration,
}

#[derive(Debug)]
struct NodeRecord {
    /// The labels the agent reports, reserved ones dropped (see [`crate::fleet::node_labels`]).
    reported_labels: SharedLabels,
    /// Reserved keys the agent tried to report.
    refused_labels: Vec<String>,
    agent_version: Arc<str>,
    session: Option<SessionId>,
    /// Locked to send: a sender is `&mut` to send, and the registry is read-locked then.
    sender: Option<Mutex<AgentSender>>,
    last_heard: Heard,
    inventory: Option<InventorySummary>,
    /// The agent said its inventory follows by `ReportInventory`; not ready until it has.
    awaiting_inventory: bool,
    /// Where the node serves blobs to peers (`host:port`), when it does.
    peer_address: Option<Arc<str>>,
    /// The agent's last registration was refused (the version skew policy): the
    /// condition's reason and message.
    refusal: Option<(&'static str, Arc<str>)>,
}

/// What job selection and dispatch need to know about a node.
#[derive(Debug, Clone)]
pub struct NodeView {
    /// The agent's labels overlaid by the admin's: for choosing nodes for work that
    /// carries no credentials.
    pub labels: BTreeMap<String, String>,
    /// The labels that may choose a node for credentials: those an admin set
    /// (`riggerctl label node`); in a cluster, the Node's labels the node's own kubelet
    /// cannot set ([`crate::fleet::node_labels::kept_from_kubelets`]).
    pub credential_labels: BTreeMap<String, String>,
    /// Connected with heartbeats on time; otherwise why not.
    pub not_ready: Option<String>,
    /// Namespace and labels of each pod the agent reported (for podSelector).
    pub pod_labels: Vec<PodLabels>,
    /// The images the node holds, and when the agent reported them.
    pub images: Option<(SystemTime, NodeImages)>,
    /// Where it serves blobs to peers, when it does.
    pub peer_address: Option<Arc<str>>,
}

/// An agent's peer address when it is `host:port` (a DNS name or an IP address, a
/// port): what other nodes are told to dial.
fn peer_address(reported: &str) -> Option<&str> {
    let (host, port) = reported.rsplit_once(':')?;
    let host_ok = !host.is_empty()
        && host.len() <= 253
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b".-[]:".contains(&b));
    (host_ok && port.parse::<u16>().is_ok_and(|p| p > 0)).then_some(reported)
}

#[derive(Debug, Clone, Default)]
pub struct NodeRegistry {
    nodes: Arc<RwLock<HashMap<String, NodeRecord>>>,
    /// Labels admins set, by node (kept in the store; see [`crate::fleet::node_labels`]).
    admin_labels: Arc<RwLock<HashMap<String, BTreeMap<String, String>>>>,
    strings: Arc<Mutex<Interner>>,
    /// In a cluster the Nodes' labels are the only ones (`admin_labels` holds them):
    /// what agents report about themselves is not taken.
    cluster_labels_only: Arc<std::sync::atomic::AtomicBool>,
    /// In a cluster, the Pods each node runs (`None`: as agents report them).
    cluster_pods: Arc<RwLock<Option<PodsByNode>>>,
    /// Admin (in a cluster: the Nodes') labels were set at least once.
    admin_labels_loaded: Arc<std::sync::atomic::AtomicBool>,
    /// This controller's stalls, which no node's silence is blamed for.
    stalls: StallClock,
}

impl NodeRegistry {
    /// This controller's stalls, as the registry discounts them from nodes' silences
    /// (its watch task is the server's to run).
    pub fn stall_clock(&self) -> StallClock {
        self.stalls.clone()
    }

    /// Heard from at `now`, as this controller's stall clock stands.
    fn heard(&self, now: SystemTime) -> Heard {
        Heard {
            at: now,
            stalled: self.stalls.stalled(),
        }
    }

    /// Record a registration; a newer session for the same node replaces the older one.
    pub fn register(
        &self,
        register: &Register,
        session: SessionId,
        sender: AgentSender,
        now: SystemTime,
    ) {
        let (mut reported_labels, refused_labels) =
            crate::fleet::node_labels::take_reported(register.labels.clone());
        if self
            .cluster_labels_only
            .load(std::sync::atomic::Ordering::Relaxed)
            && !reported_labels.is_empty()
        {
            tracing::info!(node = %register.node_name, "the agent reports labels; in a cluster the Node's labels are used instead (kubectl label node)");
            reported_labels.clear();
        }
        if !refused_labels.is_empty() {
            tracing::warn!(node = %register.node_name, labels = ?refused_labels, "the agent reports labels under a reserved prefix; ignored (only an admin sets those: riggerctl label node)");
        }
        let (reported_labels, agent_version, inventory) = {
            let mut strings = self.strings();
            (
                strings.labels(&reported_labels),
                strings.intern(&register.agent_version),
                register.inventory.as_ref().map(|i| strings.summarize(i)),
            )
        };
        let record = NodeRecord {
            reported_labels,
            refused_labels,
            agent_version,
            session: Some(session),
            sender: Some(Mutex::new(sender)),
            last_heard: self.heard(now),
            inventory,
            awaiting_inventory: register.inventory_follows && register.inventory.is_none(),
            peer_address: peer_address(&register.peer_address).map(Arc::from),
            refusal: None,
        };
        if !register.peer_address.is_empty() && record.peer_address.is_none() {
            tracing::warn!(node = %register.node_name, "the agent's peer address is not host:port; it serves no peers");
        }
        if let Ok(mut nodes) = self.nodes.write() {
            nodes.insert(register.node_name.clone(), record);
        }
    }

    /// Record a registration refused by the version skew policy: the node is known, not
    /// ready, and says why until its agent registers again within the policy. Whatever
    /// session the node had is over (its agent is the one refused now).
    pub fn refuse(
        &self,
        register: &Register,
        refusal: &rigger_version::SkewRefusal,
        now: SystemTime,
    ) {
        let agent_version = self.strings().intern(&register.agent_version);
        let refusal = Some((refusal.reason(), Arc::from(refusal.to_string())));
        let Ok(mut nodes) = self.nodes.write() else {
            return;
        };
        match nodes.get_mut(&register.node_name) {
            Some(record) => {
                record.agent_version = agent_version;
                record.session = None;
                record.sender = None;
                record.last_heard = self.heard(now);
                record.refusal = refusal;
            }
            None => {
                nodes.insert(
                    register.node_name.clone(),
                    NodeRecord {
                        reported_labels: Box::default(),
                        refused_labels: Vec::new(),
                        agent_version,
                        session: None,
                        sender: None,
                        last_heard: self.heard(now),
                        inventory: None,
                        awaiting_inventory: false,
                        peer_address: None,
                        refusal,
                    },
                );
            }
        }
    }

    /// From now on, only the labels set through [`Self::set_admin_labels`] count (the
    /// cluster's Nodes'), not what agents report.
    pub fn use_cluster_labels_only(&self) {
        self.cluster_labels_only
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// The cluster's Pods by node: from now on what `podSelector` sees, instead of what
    /// agents report.
    pub fn set_cluster_pods(&self, pods: PodsByNode) {
        if let Ok(mut held) = self.cluster_pods.write() {
            *held = Some(pods);
        }
    }

    /// Every node's admin labels, as the store has them.
    pub fn set_admin_labels(&self, all: HashMap<String, BTreeMap<String, String>>) {
        if let Ok(mut admin) = self.admin_labels.write() {
            *admin = all;
        }
        self.admin_labels_loaded
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// In a cluster: the Nodes' labels and the Pods' places have been listed once. Until
    /// then no job may choose nodes (a selector matching what is absent would match every
    /// node, and a podSelector would see no pod).
    pub fn cluster_loaded(&self) -> bool {
        self.admin_labels_loaded
            .load(std::sync::atomic::Ordering::Acquire)
            && self.cluster_pods.read().is_ok_and(|pods| pods.is_some())
    }

    /// In a cluster (its Nodes listed): whether every Node's agent is connected, with a
    /// heartbeat within `timeout`; `None` elsewhere.
    pub fn cluster_nodes_connected(&self, now: SystemTime, timeout: Duration) -> Option<bool> {
        if !self.cluster_nodes_listed() {
            return None;
        }
        let (Ok(admin), Ok(nodes)) = (self.admin_labels.read(), self.nodes.read()) else {
            return Some(false);
        };
        let stalled = self.stalls.stalled();
        Some(admin.keys().all(|name| {
            nodes
                .get(name)
                .is_some_and(|r| not_ready_reason(r, now, timeout, stalled).is_empty())
        }))
    }

    /// In a cluster, with its Nodes listed: they say which nodes exist.
    fn cluster_nodes_listed(&self) -> bool {
        self.cluster_labels_only
            .load(std::sync::atomic::Ordering::Relaxed)
            && self
                .admin_labels_loaded
                .load(std::sync::atomic::Ordering::Acquire)
    }

    /// One node's admin labels changed.
    pub fn set_node_admin_labels(&self, node: &str, labels: BTreeMap<String, String>) {
        if let Ok(mut admin) = self.admin_labels.write() {
            if labels.is_empty() {
                admin.remove(node);
            } else {
                admin.insert(node.to_owned(), labels);
            }
        }
    }

    /// Whether an agent of this name ever registered.
    pub fn knows(&self, node: &str) -> bool {
        self.nodes
            .read()
            .is_ok_and(|nodes| nodes.contains_key(node))
    }

    fn strings(&self) -> std::sync::MutexGuard<'_, Interner> {
        self.strings
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Record a heartbeat. `false` if `session` is no longer the node's current one.
    pub fn heartbeat(
        &self,
        node: &str,
        session: SessionId,
        inventory: Option<NodeInventory>,
        now: SystemTime,
    ) -> bool {
        let Ok(mut nodes) = self.nodes.write() else {
            return false;
        };
        match nodes.get_mut(node) {
            Some(record) if record.session == Some(session) => {
                record.last_heard = self.heard(now);
                if let Some(inventory) = inventory {
                    record.inventory = Some(self.strings().summarize(&inventory));
                    record.awaiting_inventory = false;
                }
                true
            }
            _ => false,
        }
    }

    /// Record the inventory reported beside session `session` (`ReportInventory`).
    /// `None` if that session is not the node's current one; else whether the node was
    /// waiting for it (and is ready only now).
    pub fn inventory_report(
        &self,
        node: &str,
        session: SessionId,
        inventory: &NodeInventory,
        now: SystemTime,
    ) -> Option<bool> {
        let current = |nodes: &HashMap<String, NodeRecord>| {
            nodes
                .get(node)
                .is_some_and(|record| record.session == Some(session))
        };
        // Nothing of a stale session's report is kept, not even its strings.
        if !self.nodes.read().is_ok_and(|nodes| current(&nodes)) {
            return None;
        }
        let summary = self.strings().summarize(inventory);
        let mut nodes = self.nodes.write().ok()?;
        let record = nodes
            .get_mut(node)
            .filter(|record| record.session == Some(session))?;
        record.last_heard = self.heard(now);
        record.inventory = Some(summary);
        Some(std::mem::take(&mut record.awaiting_inventory))
    }

    /// The session ended; the node stays known, but not ready.
    pub fn disconnect(&self, node: &str, session: SessionId) {
        if let Ok(mut nodes) = self.nodes.write()
            && let Some(record) = nodes.get_mut(node)
            && record.session == Some(session)
        {
            record.session = None;
            record.sender = None;
        }
    }

    /// Queue `message` for `node`'s agent; `false` when it is not connected or its queue
    /// is full (the work is then offered again later).
    pub fn send(&self, node: &str, message: ControllerMessage) -> bool {
        let Ok(nodes) = self.nodes.read() else {
            return false;
        };
        nodes
            .get(node)
            .and_then(|r| r.sender.as_ref())
            .is_some_and(|sender| {
                sender
                    .lock()
                    .is_ok_and(|mut sender| sender.try_send(Ok(message)).is_ok())
            })
    }

    /// Where kubelet pod `namespace/name` runs, as nodes' inventories say. A node's report
    /// alone must not decide where another node's work goes: when more than one node
    /// claims the pod, none is chosen.
    pub fn kubelet_pod(&self, namespace: &str, name: &str) -> KubeletPodPlace {
        let Ok(nodes) = self.nodes.read() else {
            return KubeletPodPlace::Nowhere;
        };
        let mut claims: Vec<(String, KubeletPod)> = nodes
            .iter()
            .filter_map(|(node, record)| {
                let pod = record
                    .inventory
                    .as_ref()?
                    .kubelet_pods
                    .iter()
                    .find(|p| p.namespace == namespace && p.name == name)?;
                Some((node.clone(), pod.clone()))
            })
            .collect();
        match claims.len() {
            0 => KubeletPodPlace::Nowhere,
            1 => {
                let (node, pod) = claims.remove(0);
                KubeletPodPlace::On(node, pod)
            }
            _ => {
                let mut nodes: Vec<String> = claims.into_iter().map(|(node, _)| node).collect();
                nodes.sort();
                KubeletPodPlace::ClaimedBy(nodes)
            }
        }
    }

    /// Every node's readiness: `None` when ready, else why not (cheaper than
    /// [`Self::views`]: nothing of a node is copied but that).
    pub fn readiness(&self, now: SystemTime, timeout: Duration) -> HashMap<String, Option<String>> {
        let Ok(nodes) = self.nodes.read() else {
            return HashMap::new();
        };
        let stalled = self.stalls.stalled();
        nodes
            .iter()
            .map(|(name, r)| {
                let reason = not_ready_reason(r, now, timeout, stalled);
                (name.clone(), (!reason.is_empty()).then_some(reason))
            })
            .collect()
    }

    /// Every node as jobs see it.
    pub fn views(&self, now: SystemTime, timeout: Duration) -> HashMap<String, NodeView> {
        // Read, not copied: this runs on every engine tick. No writer holds both locks.
        let (Ok(admin), Ok(nodes), Ok(cluster_pods)) = (
            self.admin_labels.read(),
            self.nodes.read(),
            self.cluster_pods.read(),
        ) else {
            return HashMap::new();
        };
        // In a cluster the Nodes say which nodes exist: an agent whose Node is gone (or
        // never was) is chosen by no job.
        let cluster_labels = self
            .cluster_labels_only
            .load(std::sync::atomic::Ordering::Relaxed);
        let cluster = self.cluster_nodes_listed();
        let stalled = self.stalls.stalled();
        nodes
            .iter()
            .filter(|(name, _)| !cluster || admin.contains_key(*name))
            .map(|(name, r)| {
                let reason = not_ready_reason(r, now, timeout, stalled);
                let pod_labels = match &*cluster_pods {
                    Some(by_node) => by_node.get(name).cloned().unwrap_or_default(),
                    None => r
                        .inventory
                        .as_ref()
                        .map(|i| i.pod_labels.to_vec())
                        .unwrap_or_default(),
                };
                let admin_labels = admin.get(name).cloned().unwrap_or_default();
                let credential_labels = if cluster_labels {
                    admin_labels
                        .iter()
                        .filter(|(key, _)| crate::fleet::node_labels::kept_from_kubelets(key))
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect()
                } else {
                    admin_labels.clone()
                };
                (
                    name.clone(),
                    NodeView {
                        labels: crate::fleet::node_labels::merged(
                            label_pairs(&r.reported_labels),
                            &admin_labels,
                        ),
                        credential_labels,
                        not_ready: (!reason.is_empty()).then_some(reason),
                        pod_labels,
                        images: r
                            .inventory
                            .as_ref()
                            .map(|i| (i.received_at, i.images.clone())),
                        peer_address: r.peer_address.clone(),
                    },
                )
            })
            .collect()
    }

    /// All nodes as API objects (Kubernetes' Node shape), sorted by name; ready means
    /// connected with a heartbeat within `timeout`.
    pub fn objects(&self, now: SystemTime, timeout: Duration) -> Vec<serde_json::Value> {
        let (Ok(admin), Ok(nodes)) = (self.admin_labels.read(), self.nodes.read()) else {
            return Vec::new();
        };
        let mut names: Vec<&String> = nodes.keys().collect();
        names.sort();
        let none = BTreeMap::new();
        let stalled = self.stalls.stalled();
        names
            .into_iter()
            .filter_map(|name| {
                let admin = admin.get(name).unwrap_or(&none);
                let record = nodes.get(name)?;
                Some(node_object(name, record, admin, now, (timeout, stalled)))
            })
            .collect()
    }
}

/// Why a node is not ready (empty when it is), `stalled` this controller's stalls so far:
/// those since the node's last heartbeat are no silence of the node's.
fn not_ready_reason(
    r: &NodeRecord,
    now: SystemTime,
    timeout: Duration,
    stalled: Duration,
) -> String {
    let silent = net_silence(
        now.duration_since(r.last_heard.at).unwrap_or_default(),
        stalled.saturating_sub(r.last_heard.stalled),
    );
    if let Some((_, message)) = &r.refusal {
        message.to_string()
    } else if r.session.is_none() {
        "agent disconnected".to_owned()
    } else if r.awaiting_inventory {
        AWAITING_INVENTORY.to_owned()
    } else if silent > timeout {
        format!(
            "no heartbeat for {}",
            humantime::format_duration(Duration::from_secs(silent.as_secs()))
        )
    } else {
        String::new()
    }
}

/// A node as `get` shows it (`rigger_api::node`).
fn node_object(
    name: &str,
    r: &NodeRecord,
    admin_labels: &BTreeMap<String, String>,
    now: SystemTime,
    (timeout, stalled): (Duration, Duration),
) -> serde_json::Value {
    let reason = not_ready_reason(r, now, timeout, stalled);
    let inventory = r.inventory.as_ref();
    let mut images = Vec::new();
    let mut seen = HashSet::new();
    for image in inventory.map(|i| &*i.images.0).unwrap_or_default() {
        if seen.insert((&image.namespace, &image.name)) {
            images.push(ContainerImage {
                names: vec![image.name.to_string()],
                namespace: image.namespace.to_string(),
                digest: image.digest.to_string(),
                size_bytes: image.size,
            });
        }
    }
    let ready = reason.is_empty();
    let node = Node {
        api_version: rigger_api::API_VERSION.to_owned(),
        kind: node::KIND.to_owned(),
        metadata: ObjectMeta {
            name: name.to_owned(),
            labels: crate::fleet::node_labels::merged(
                label_pairs(&r.reported_labels),
                admin_labels,
            ),
            ..ObjectMeta::default()
        },
        status: NodeStatus {
            agent_labels: label_pairs(&r.reported_labels)
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
            refused_agent_labels: r.refused_labels.clone(),
            conditions: vec![NodeCondition {
                condition_type: "Ready".to_owned(),
                status: if ready { "True" } else { "False" }.to_owned(),
                reason: match (&r.refusal, ready) {
                    (Some((reason, _)), _) => reason,
                    (None, true) => "AgentReady",
                    (None, false) => "AgentNotReady",
                }
                .to_owned(),
                message: reason,
                last_heartbeat_time: rfc3339(r.last_heard.at),
            }],
            node_info: NodeInfo {
                agent_version: r.agent_version.to_string(),
                container_runtime_version: inventory
                    .filter(|i| !i.containerd_version.is_empty())
                    .map(|i| format!("containerd://{}", i.containerd_version))
                    .unwrap_or_default(),
                cri_runtime: inventory
                    .map(|i| i.cri_runtime.to_string())
                    .unwrap_or_default(),
            },
            pods: inventory.map_or(0, |i| i.pods),
            containers: inventory.map_or(0, |i| i.containers),
            images,
        },
    };
    serde_json::to_value(node).unwrap_or_default()
}

fn label_pairs(labels: &SharedLabels) -> impl Iterator<Item = (&str, &str)> {
    labels.iter().map(|(k, v)| (&**k, &**v))
}

fn count(n: Option<usize>) -> u32 {
    n.map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX))
}

#[cfg(test)]
mod tests;
