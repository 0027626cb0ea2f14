//! `kind: Event` — what happened to an object, in Kubernetes' core/v1 shape (what
//! `kubectl get events` and `kubectl describe` show): a node pulled a job's image or
//! failed to, a container was recreated, a SidecarSet's sidecar rolled out on a pod, a
//! node was lost or came back, a peer sent bytes that did not match. The controller
//! records them; users read them (`riggerctl get events`, `riggerctl describe`). One
//! event repeated is one object whose `count` and `lastTimestamp` move, as Kubernetes
//! aggregates them; events go after an hour (Kubernetes' `--event-ttl`).

use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use crate::fields::ObjectMeta;
use crate::kind::KindInfo;
use crate::table::{Columns, age};

pub const KIND: &str = "Event";

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub involved_object: InvolvedObject,
    pub reason: String,
    pub message: String,
    /// `Normal` or `Warning`.
    #[serde(rename = "type")]
    pub event_type: String,
    /// How many times it happened (the same object, reason and message).
    pub count: u32,
    /// RFC 3339.
    pub first_timestamp: String,
    pub last_timestamp: String,
    pub source: EventSource,
    pub reporting_component: String,
}

/// The object an event is about (Kubernetes' ObjectReference).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InvolvedObject {
    pub api_version: String,
    pub kind: String,
    /// Absent for a cluster-wide object (a Node).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventSource {
    pub component: String,
}

/// Event, as the registry (`kinds/mod.rs`) lists it.
pub const INFO: KindInfo = KindInfo {
    name: KIND,
    spellings: &["events", "ev"],
    namespaced: true,
    read_only: Some(
        "Event objects are read-only: the controller records what happens to objects; read them with `riggerctl get events` or `riggerctl describe`",
    ),
    notes: None,
    schema: None,
    crd: None,
    table: crate::table::table_of::<Event>,
};

impl Columns for Event {
    fn header(_wide: bool) -> Vec<&'static str> {
        // kubectl's `get events`.
        vec!["LAST SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]
    }

    fn row(&self, _wide: bool, now: SystemTime) -> Vec<String> {
        let last_seen = age(Some(&self.last_timestamp), now);
        vec![
            if self.count > 1 {
                format!("{last_seen} (x{})", self.count)
            } else {
                last_seen
            },
            self.event_type.clone(),
            self.reason.clone(),
            format!(
                "{}/{}",
                self.involved_object.kind.to_ascii_lowercase(),
                self.involved_object.name
            ),
            self.message.clone(),
        ]
    }
}
