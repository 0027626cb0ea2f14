//! How `get` shows each kind as a table, as kubectl's printers do: every kind names its
//! columns and fills a row ([`Columns`]); `-o wide` adds some. The namespace column of
//! `-A` is the printer's, not the kind's.

use std::collections::BTreeMap;
use std::time::SystemTime;

use crate::container_recreate_request::{ContainerRecreateRequest, CrrPhase, CrrStatus};
use crate::image_list_pull_job::{ImageListPullJob, ImageListPullJobStatus};
use crate::image_pull_job::{ImagePullJob, ImagePullJobStatus};
use crate::lifecycle_cooperator::LifecycleCooperator;
use crate::node::Node;
use crate::node_image::NodeImage;
use crate::pod::{LIFECYCLE_STATE_LABEL, Pod};
use crate::secret::Secret;
use crate::sidecar_set::{SidecarSet, SidecarSetStatus};

/// Kruise's annotation naming, per hot-upgrade sidecar, the slot that serves.
const WORKING_HOT_UPGRADE: &str = "kruise.io/sidecarset-working-hotupgrade-container";

/// A kind's table columns.
pub trait Columns {
    /// The column names; `wide` adds those `-o wide` shows.
    fn header(wide: bool) -> Vec<&'static str>;

    /// This object's cells, in the header's order; ages are counted to `now`.
    fn row(&self, wide: bool, now: SystemTime) -> Vec<String>;
}

/// kubectl's age of an RFC 3339 time: `5s`, `3m`, `2h`, `4d`; `-` when unknown.
pub fn age(rfc3339: Option<&str>, now: SystemTime) -> String {
    let Some(then) = rfc3339.and_then(|t| humantime::parse_rfc3339(t).ok()) else {
        return "-".to_owned();
    };
    let secs = now.duration_since(then).unwrap_or_default().as_secs();
    match secs {
        0..120 => format!("{secs}s"),
        120..7200 => format!("{}m", secs / 60),
        7200..172_800 => format!("{}h", secs / 3600),
        _ => format!("{}d", secs / 86_400),
    }
}

/// A size in kubectl-like short IEC units.
pub fn bytes(n: u64) -> String {
    bytesize::ByteSize::b(n).display().iec_short().to_string()
}

/// `-` for an empty cell, as kubectl prints `<none>`-like values.
fn or_dash(s: &str) -> String {
    match s {
        "" => "-".to_owned(),
        s => s.to_owned(),
    }
}

impl Columns for ImagePullJob {
    fn header(wide: bool) -> Vec<&'static str> {
        let mut header = vec![
            "NAME",
            "TOTAL",
            "ACTIVE",
            "SUCCEEDED",
            "FAILED",
            "PROGRESS",
            "AGE",
            "MESSAGE",
        ];
        if wide {
            header.push("IMAGE");
        }
        header
    }

    fn row(&self, wide: bool, now: SystemTime) -> Vec<String> {
        // Borrowed, not cloned: a job's status holds an entry per node.
        let none = ImagePullJobStatus::default();
        let status = self.status.as_ref().unwrap_or(&none);
        let (done, total) = status
            .nodes
            .iter()
            .fold((0, 0), |(d, t), n| (d + n.bytes_done, t + n.bytes_total));
        let progress = match total {
            0 => "-".to_owned(),
            _ => format!("{}/{}", bytes(done), bytes(total)),
        };
        let mut row = vec![
            self.metadata.name.clone(),
            status.desired.to_string(),
            status.active.to_string(),
            status.succeeded.to_string(),
            status.failed.to_string(),
            progress,
            age(self.metadata.creation_timestamp.as_deref(), now),
            status.message.clone(),
        ];
        if wide {
            row.push(self.spec.image.clone());
        }
        row
    }
}

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

fn join_labels(labels: &BTreeMap<String, String>) -> String {
    labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

impl Columns for SidecarSet {
    fn header(_wide: bool) -> Vec<&'static str> {
        vec!["NAME", "MATCHED", "UPDATED", "READY", "AGE"]
    }

    fn row(&self, _wide: bool, now: SystemTime) -> Vec<String> {
        let none = SidecarSetStatus::default();
        let status = self.status.as_ref().unwrap_or(&none);
        vec![
            self.metadata.name.clone(),
            status.matched_pods.to_string(),
            status.updated_pods.to_string(),
            status.ready_pods.to_string(),
            age(self.metadata.creation_timestamp.as_deref(), now),
        ]
    }
}

/// Kruise's columns: DESIRED, PULLING, SUCCEED, FAILED.
impl Columns for NodeImage {
    fn header(_wide: bool) -> Vec<&'static str> {
        vec!["NAME", "DESIRED", "PULLING", "SUCCEED", "FAILED", "HELD"]
    }

    fn row(&self, _wide: bool, _now: SystemTime) -> Vec<String> {
        let status = &self.status;
        let held: usize = status.image_statuses.values().map(|i| i.tags.len()).sum();
        vec![
            self.metadata.name.clone(),
            status.desired.to_string(),
            status.pulling.to_string(),
            status.succeeded.to_string(),
            status.failed.to_string(),
            held.to_string(),
        ]
    }
}

/// Kruise's columns: TOTAL, ACTIVE, SUCCEEDED, COMPLETED.
impl Columns for ImageListPullJob {
    fn header(wide: bool) -> Vec<&'static str> {
        let mut header = vec!["NAME", "TOTAL", "ACTIVE", "SUCCEEDED", "COMPLETED", "AGE"];
        if wide {
            header.push("IMAGES");
        }
        header
    }

    fn row(&self, wide: bool, now: SystemTime) -> Vec<String> {
        let none = ImageListPullJobStatus::default();
        let status = self.status.as_ref().unwrap_or(&none);
        let mut row = vec![
            self.metadata.name.clone(),
            status.desired.to_string(),
            status.active.to_string(),
            status.succeeded.to_string(),
            status.completed.to_string(),
            age(self.metadata.creation_timestamp.as_deref(), now),
        ];
        if wide {
            row.push(self.spec.images.join(","));
        }
        row
    }
}

impl Columns for ContainerRecreateRequest {
    fn header(wide: bool) -> Vec<&'static str> {
        let mut header = vec!["NAME", "POD", "PHASE", "CONTAINERS", "AGE"];
        if wide {
            header.extend(["NODE", "MESSAGE"]);
        }
        header
    }

    fn row(&self, wide: bool, now: SystemTime) -> Vec<String> {
        let none = CrrStatus::default();
        let status = self.status.as_ref().unwrap_or(&none);
        let phase = match status.phase {
            CrrPhase::Pending => "Pending",
            CrrPhase::Recreating => "Recreating",
            CrrPhase::Completed => "Completed",
        };
        let containers: Vec<String> = status
            .container_recreate_states
            .iter()
            .map(|s| format!("{}={:?}", s.name, s.phase))
            .collect();
        let mut row = vec![
            self.metadata.name.clone(),
            self.spec.pod_name.clone(),
            phase.to_owned(),
            containers.join(","),
            age(self.metadata.creation_timestamp.as_deref(), now),
        ];
        if wide {
            let node = self
                .metadata
                .labels
                .get(crate::container_recreate_request::NODE_NAME_LABEL);
            row.push(node.cloned().unwrap_or_default());
            row.push(status.message.clone());
        }
        row
    }
}

impl Columns for Pod {
    fn header(wide: bool) -> Vec<&'static str> {
        let mut header = vec!["NAME", "READY", "STATUS", "RESTARTS", "LIFECYCLE", "AGE"];
        if wide {
            header.extend(["NODE", "IMAGES", "WORKING SIDECARS"]);
        }
        header
    }

    fn row(&self, wide: bool, now: SystemTime) -> Vec<String> {
        // The status is the agent's report, kept as it came: read leniently.
        let status = self.status.as_ref().unwrap_or(&serde_json::Value::Null);
        let statuses = status["containerStatuses"]
            .as_array()
            .map_or(&[][..], Vec::as_slice);
        let ready = statuses.iter().filter(|c| c["ready"] == true).count();
        let restarts: u64 = statuses
            .iter()
            .filter_map(|c| c["restartCount"].as_u64())
            .sum();
        let phase = match status["phase"].as_str().unwrap_or_default() {
            "" => "Pending",
            phase => phase,
        };
        let lifecycle = self.metadata.labels.get(LIFECYCLE_STATE_LABEL);
        let mut row = vec![
            self.metadata.name.clone(),
            format!("{ready}/{}", self.spec.containers.len()),
            phase.to_owned(),
            restarts.to_string(),
            or_dash(lifecycle.map_or("", String::as_str)),
            age(self.metadata.creation_timestamp.as_deref(), now),
        ];
        if wide {
            row.push(self.spec.node_name.clone().unwrap_or_default());
            let images: Vec<&str> = self
                .spec
                .containers
                .iter()
                .map(|c| c.image.as_str())
                .collect();
            row.push(images.join(","));
            // Hot-upgrade sidecars: which slot serves.
            let working: BTreeMap<String, String> = self
                .metadata
                .annotations
                .get(WORKING_HOT_UPGRADE)
                .and_then(|w| serde_json::from_str(w).ok())
                .unwrap_or_default();
            row.push(or_dash(
                &working.into_values().collect::<Vec<_>>().join(","),
            ));
        }
        row
    }
}

impl Columns for Secret {
    fn header(_wide: bool) -> Vec<&'static str> {
        vec!["NAME", "TYPE", "DATA", "AGE"]
    }

    fn row(&self, _wide: bool, now: SystemTime) -> Vec<String> {
        vec![
            self.metadata.name.clone(),
            self.secret_type.clone(),
            self.data.len().to_string(),
            age(self.metadata.creation_timestamp.as_deref(), now),
        ]
    }
}

impl Columns for LifecycleCooperator {
    fn header(_wide: bool) -> Vec<&'static str> {
        vec!["NAME", "OPERATIONS", "CALLS", "AGE"]
    }

    fn row(&self, _wide: bool, now: SystemTime) -> Vec<String> {
        let operations: Vec<String> = self
            .spec
            .operations
            .iter()
            .filter_map(|o| serde_json::to_value(o).ok())
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect();
        let calls = match (&self.spec.webhook, &self.spec.exec) {
            (Some(_), Some(_)) => "webhook,exec",
            (Some(_), None) => "webhook",
            (None, Some(_)) => "exec",
            (None, None) => "-",
        };
        vec![
            self.metadata.name.clone(),
            or_dash(&operations.join(",")),
            calls.to_owned(),
            age(self.metadata.creation_timestamp.as_deref(), now),
        ]
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::time::Duration;

    use super::*;

    fn at(rfc3339: &str) -> SystemTime {
        humantime::parse_rfc3339(rfc3339).unwrap()
    }

    #[test]
    fn ages_read_as_kubectl_prints_them() {
        let now = at("2026-01-02T00:00:00Z");
        assert_eq!(age(Some("2026-01-01T23:59:30Z"), now), "30s");
        assert_eq!(age(Some("2026-01-01T23:50:00Z"), now), "10m");
        assert_eq!(age(Some("2026-01-01T21:00:00Z"), now), "3h");
        assert_eq!(age(Some("2025-12-28T00:00:00Z"), now), "5d");
        assert_eq!(age(Some("not a time"), now), "-");
        assert_eq!(age(None, now), "-");
        assert_eq!(
            age(Some("2026-01-02T00:00:00Z"), now - Duration::from_secs(5)),
            "0s"
        );
    }

    #[test]
    fn every_row_has_as_many_cells_as_its_header() {
        let now = at("2026-01-02T00:00:00Z");
        let job: ImagePullJob = serde_json::from_value(serde_json::json!({
            "apiVersion": "apps.kruise.io/v1alpha1", "kind": "ImagePullJob",
            "metadata": {"name": "warm", "creationTimestamp": "2026-01-01T23:59:00Z"},
            "spec": {"image": "busybox:1.36"},
            "status": {"desired": 2, "active": 1, "succeeded": 1, "failed": 0, "nodes": [
                {"name": "a", "phase": "Pulling", "bytesDone": 1024, "bytesTotal": 4096}
            ]}
        }))
        .unwrap();
        for wide in [false, true] {
            assert_eq!(job.row(wide, now).len(), ImagePullJob::header(wide).len());
        }
        assert_eq!(job.row(true, now)[5], "1.0K/4.0K");
        assert_eq!(job.row(true, now)[6], "60s");
        assert_eq!(job.row(true, now)[8], "busybox:1.36");
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web", "labels": {LIFECYCLE_STATE_LABEL: "Updating"}},
            "spec": {"containers": [{"name": "app", "image": "busybox"}]},
            "status": {"phase": "Running", "containerStatuses": [{"ready": true, "restartCount": 2}]}
        }))
        .unwrap();
        for wide in [false, true] {
            assert_eq!(pod.row(wide, now).len(), Pod::header(wide).len());
        }
        assert_eq!(
            pod.row(false, now)[1..5],
            ["1/1", "Running", "2", "Updating"]
        );
    }
}
