//! The nodes the controller knows, as their agents describe them.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use rigger_proto::v1::{Node, NodeInventory, Register};

/// One agent connection; a reconnect gets a new id, so a stale stream cannot touch the
/// record of its successor.
pub type SessionId = u64;

#[derive(Debug, Clone)]
struct NodeRecord {
    labels: BTreeMap<String, String>,
    agent_version: String,
    session: Option<SessionId>,
    last_heartbeat: SystemTime,
    inventory: Option<NodeInventory>,
}

#[derive(Debug, Clone, Default)]
pub struct NodeRegistry {
    nodes: Arc<RwLock<HashMap<String, NodeRecord>>>,
}

impl NodeRegistry {
    /// Record a registration; a newer session for the same node replaces the older one.
    pub fn register(&self, register: &Register, session: SessionId, now: SystemTime) {
        let record = NodeRecord {
            labels: register.labels.clone().into_iter().collect(),
            agent_version: register.agent_version.clone(),
            session: Some(session),
            last_heartbeat: now,
            inventory: register.inventory.clone(),
        };
        if let Ok(mut nodes) = self.nodes.write() {
            nodes.insert(register.node_name.clone(), record);
        }
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
                record.last_heartbeat = now;
                if inventory.is_some() {
                    record.inventory = inventory;
                }
                true
            }
            _ => false,
        }
    }

    /// The session ended; the node stays known, but not ready.
    pub fn disconnect(&self, node: &str, session: SessionId) {
        if let Ok(mut nodes) = self.nodes.write()
            && let Some(record) = nodes.get_mut(node)
            && record.session == Some(session)
        {
            record.session = None;
        }
    }

    /// All nodes, sorted by name; ready means connected with a heartbeat within `timeout`.
    pub fn list(&self, now: SystemTime, timeout: Duration) -> Vec<Node> {
        let Ok(nodes) = self.nodes.read() else {
            return Vec::new();
        };
        let mut list: Vec<Node> = nodes
            .iter()
            .map(|(name, r)| {
                let silent = now.duration_since(r.last_heartbeat).unwrap_or_default();
                let reason = if r.session.is_none() {
                    "agent disconnected".to_owned()
                } else if silent > timeout {
                    format!(
                        "no heartbeat for {}",
                        humantime::format_duration(Duration::from_secs(silent.as_secs()))
                    )
                } else {
                    String::new()
                };
                let inventory = r.inventory.as_ref();
                Node {
                    name: name.clone(),
                    labels: r.labels.clone().into_iter().collect(),
                    agent_version: r.agent_version.clone(),
                    ready: reason.is_empty(),
                    reason,
                    last_heartbeat: Some(r.last_heartbeat.into()),
                    containerd_version: inventory
                        .and_then(|i| i.runtime.as_ref())
                        .map(|rt| rt.containerd_version.clone())
                        .unwrap_or_default(),
                    images: count(inventory.map(|i| i.images.len())),
                    pods: count(inventory.map(|i| i.pods.len())),
                    containers: count(inventory.map(|i| i.containers.len())),
                }
            })
            .collect();
        list.sort_by(|a, b| a.name.cmp(&b.name));
        list
    }
}

fn count(n: Option<usize>) -> u32 {
    n.map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn register(name: &str) -> Register {
        Register {
            node_name: name.to_owned(),
            labels: [("zone".to_owned(), "a".to_owned())].into(),
            agent_version: "0.1.0".to_owned(),
            inventory: None,
        }
    }

    #[test]
    fn readiness_follows_session_and_heartbeats() {
        let registry = NodeRegistry::default();
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let timeout = Duration::from_secs(30);
        registry.register(&register("n1"), 1, t0);
        assert!(registry.list(t0, timeout)[0].ready);

        let late = t0 + Duration::from_secs(31);
        let node = &registry.list(late, timeout)[0];
        assert!(!node.ready);
        assert!(
            node.reason.starts_with("no heartbeat for 31s"),
            "{}",
            node.reason
        );

        assert!(registry.heartbeat("n1", 1, None, late));
        assert!(registry.list(late, timeout)[0].ready);

        registry.disconnect("n1", 1);
        assert_eq!(registry.list(late, timeout)[0].reason, "agent disconnected");
    }

    #[test]
    fn a_replaced_session_cannot_touch_its_successor() {
        let registry = NodeRegistry::default();
        let now = SystemTime::now();
        registry.register(&register("n1"), 1, now);
        registry.register(&register("n1"), 2, now);
        assert!(!registry.heartbeat("n1", 1, None, now));
        registry.disconnect("n1", 1);
        assert!(registry.list(now, Duration::from_secs(30))[0].ready);
    }
}
