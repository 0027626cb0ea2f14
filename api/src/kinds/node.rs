//! `kind: Node` — a node as the controller shows it, in Kubernetes' shape: a Ready
//! condition, node info, the images it holds. Nodes are never applied: one exists while
//! its agent is registered. `metadata.labels` are the labels selectors see;
//! `status.agentLabels` what the agent reported of them and `status.refusedAgentLabels`
//! the reserved keys it tried.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::fields::ObjectMeta;

use std::time::SystemTime;

use crate::kind::KindInfo;
use crate::table::{Columns, age, join_labels};

pub const KIND: &str = "Node";

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Node {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub status: NodeStatus,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeStatus {
    #[serde(default)]
    pub agent_labels: BTreeMap<String, String>,
    #[serde(default)]
    pub refused_agent_labels: Vec<String>,
    /// One: `Ready`.
    #[serde(default)]
    pub conditions: Vec<NodeCondition>,
    #[serde(default)]
    pub node_info: NodeInfo,
    #[serde(default)]
    pub pods: u32,
    #[serde(default)]
    pub containers: u32,
    #[serde(default)]
    pub images: Vec<ContainerImage>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeCondition {
    #[serde(rename = "type")]
    pub condition_type: String,
    /// `True` or `False`.
    pub status: String,
    pub reason: String,
    #[serde(default)]
    pub message: String,
    #[serde(default)]
    pub last_heartbeat_time: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeInfo {
    #[serde(default)]
    pub agent_version: String,
    /// `containerd://<version>`, as kubelet reports it.
    #[serde(default)]
    pub container_runtime_version: String,
    #[serde(default)]
    pub cri_runtime: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerImage {
    pub names: Vec<String>,
    /// The containerd namespace that holds it.
    pub namespace: String,
    pub digest: String,
    pub size_bytes: u64,
}

/// Node, as the registry (`kinds/mod.rs`) lists it.
pub const INFO: KindInfo = KindInfo {
    name: KIND,
    spellings: &["nodes", "no"],
    namespaced: false,
    read_only: Some(
        "Node objects are read-only: a node exists while its agent is registered and leaves when it stops",
    ),
    notes: None,
    schema: None,
    crd: None,
    table: crate::table::table_of::<Node>,
};

impl Columns for Node {
    fn header(wide: bool) -> Vec<&'static str> {
        let mut header = vec![
            "NAME",
            "STATUS",
            "AGENT",
            "CONTAINERD",
            "IMAGES",
            "PODS",
            "LAST HEARTBEAT",
        ];
        if wide {
            header.extend(["LABELS", "REASON"]);
        }
        header
    }

    fn row(&self, wide: bool, now: SystemTime) -> Vec<String> {
        let ready = self.status.conditions.first();
        let info = &self.status.node_info;
        let mut row = vec![
            self.metadata.name.clone(),
            match ready.is_some_and(|c| c.status == "True") {
                true => "Ready",
                false => "NotReady",
            }
            .to_owned(),
            info.agent_version.clone(),
            info.container_runtime_version
                .trim_start_matches("containerd://")
                .to_owned(),
            self.status.images.len().to_string(),
            self.status.pods.to_string(),
            format!(
                "{} ago",
                age(ready.map(|c| c.last_heartbeat_time.as_str()), now)
            ),
        ];
        if wide {
            row.push(join_labels(&self.metadata.labels));
            row.push(ready.map(|c| c.message.clone()).unwrap_or_default());
        }
        row
    }
}
