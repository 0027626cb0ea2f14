//! `kind: ContainerRecreateRequest` (CRR) — OpenKruise's object and field names: restart
//! some containers of one pod in place (same pod, same IP, volumes kept, the other
//! containers untouched). Issue 6 executes it; this is its shape and validation.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

use rigger_proto::pod::{ContainerPort, Handler, IntOrName};

use crate::fields::{Condition, FieldError, MAX_INT32, ObjectMeta, ValidateMeta as _, check_range};

use std::time::SystemTime;

use crate::kind::KindInfo;
use crate::object::{Object, metadata_field};
use crate::table::{Columns, age};

pub const KIND: &str = "ContainerRecreateRequest";
/// Kruise's labels naming the request's pod and node (set when the request is applied).
pub const POD_UID_LABEL: &str = "crr.apps.kruise.io/pod-uid";
pub const NODE_NAME_LABEL: &str = "crr.apps.kruise.io/node-name";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ContainerRecreateRequest {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: CrrSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<CrrStatus>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CrrSpec {
    /// The pod, in the request's namespace.
    pub pod_name: String,
    pub containers: Vec<CrrContainer>,
    #[serde(default)]
    pub strategy: CrrStrategy,
    /// The request fails when it runs longer (at least 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_deadline_seconds: Option<u64>,
    /// Deleted this long after it finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds_after_finished: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CrrContainer {
    pub name: String,
    /// The hook run before the stop, instead of the container's own preStop (Kruise
    /// copies the pod's here; a CRR read back from Kruise carries it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pre_stop: Option<Handler>,
    /// The ports a named `preStop.httpGet.port` resolves against [default: the
    /// container's].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<ContainerPort>,
    /// The container instance to recreate: if the pod's container is another one by the
    /// time the request runs (it restarted, or was recreated), it counts as recreated
    /// and is not stopped again. Filled in from the pod's status when absent and known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_context: Option<StatusContext>,
}

/// Kruise's `statusContext`: a container instance as the pod's status named it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StatusContext {
    /// `containerd://<id>`.
    #[serde(rename = "containerID")]
    pub container_id: String,
    #[serde(default)]
    pub restart_count: u32,
}

/// The runtime prefix of Kubernetes' container IDs on containerd nodes.
pub const CONTAINERD_ID_PREFIX: &str = "containerd://";

impl StatusContext {
    /// The bare CRI container ID.
    pub fn id(&self) -> &str {
        self.container_id
            .strip_prefix(CONTAINERD_ID_PREFIX)
            .unwrap_or(&self.container_id)
    }

    /// `containerd://` and 64 hex digits, as kubelet and the agent report IDs.
    pub fn is_containerd(&self) -> bool {
        let id = self.id();
        self.container_id.starts_with(CONTAINERD_ID_PREFIX)
            && id.len() == 64
            && id.bytes().all(|b| b.is_ascii_hexdigit())
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CrrStrategy {
    #[serde(default)]
    pub failure_policy: FailurePolicy,
    /// Recreate the next container only once the previous one succeeded.
    #[serde(default)]
    pub ordered_recreate: bool,
    /// [default: the pod's terminationGracePeriodSeconds]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub termination_grace_period_seconds: Option<u64>,
    /// Mark the pod not ready, then wait this long before stopping anything.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unready_grace_period_seconds: Option<u64>,
    /// A recreated container succeeds once it has run this long (and is ready).
    #[serde(default)]
    pub min_started_seconds: u64,
    /// Also recreate a container that is still starting.
    #[serde(default)]
    pub force_recreate: bool,
}

#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub enum FailurePolicy {
    /// The request fails at the first container that fails.
    #[default]
    Fail,
    /// Go on with the other containers.
    Ignore,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CrrStatus {
    pub phase: CrrPhase,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub container_recreate_states: Vec<ContainerRecreateState>,
    /// v1beta1's: `PreRecreateGrace` once the pod is held not ready for
    /// `unreadyGracePeriodSeconds` (shown for v1beta1 and Rigger's version, not v1alpha1,
    /// whose status has no conditions).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// Kruise's condition type for the unready grace before the containers stop.
pub const PRE_RECREATE_GRACE: &str = "PreRecreateGrace";

#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub enum CrrPhase {
    #[default]
    Pending,
    Recreating,
    Completed,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContainerRecreateState {
    pub name: String,
    pub phase: ContainerRecreatePhase,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// The old container was stopped.
    #[serde(default)]
    pub is_killed: bool,
}

#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub enum ContainerRecreatePhase {
    #[default]
    Pending,
    Recreating,
    Succeeded,
    Failed,
}

impl ContainerRecreateRequest {
    /// Refuse what cannot run, naming the field; Kruise's API group is accepted too.
    pub fn validate(&self) -> Result<(), FieldError> {
        // v1beta1's spec is v1alpha1's (its status adds conditions and a snapshot).
        crate::fields::check_kruise_v1beta1_api_version(&self.api_version)?;
        self.metadata.validate()?;
        let spec = &self.spec;
        if spec.pod_name.is_empty() {
            return Err(FieldError::new("spec.podName", "is required"));
        }
        crate::fields::check_dns_subdomain(&spec.pod_name)
            .map_err(|r| FieldError::new("spec.podName", r))?;
        if spec.containers.is_empty() {
            return Err(FieldError::new(
                "spec.containers",
                "at least one container is required",
            ));
        }
        let mut seen = HashSet::new();
        for (i, container) in spec.containers.iter().enumerate() {
            if container.name.is_empty() {
                return Err(FieldError::new(
                    format!("spec.containers[{i}].name"),
                    "is required",
                ));
            }
            if !seen.insert(container.name.as_str()) {
                return Err(FieldError::new(
                    format!("spec.containers[{i}].name"),
                    format!("{:?} is listed twice", container.name),
                ));
            }
            container.validate(&format!("spec.containers[{i}]"))?;
        }
        if let Some(deadline) = spec.active_deadline_seconds {
            check_range("spec.activeDeadlineSeconds", deadline, 3, MAX_INT32)?;
        }
        let strategy = &spec.strategy;
        for (field, value) in [
            (
                "spec.ttlSecondsAfterFinished",
                spec.ttl_seconds_after_finished,
            ),
            (
                "spec.strategy.terminationGracePeriodSeconds",
                strategy.termination_grace_period_seconds,
            ),
            (
                "spec.strategy.unreadyGracePeriodSeconds",
                strategy.unready_grace_period_seconds,
            ),
            (
                "spec.strategy.minStartedSeconds",
                Some(strategy.min_started_seconds),
            ),
        ] {
            if let Some(value) = value {
                check_range(field, value, 0, MAX_INT32)?;
            }
        }
        Ok(())
    }
}

impl CrrContainer {
    fn validate(&self, at: &str) -> Result<(), FieldError> {
        for (i, port) in self.ports.iter().enumerate() {
            if port.container_port == 0 {
                return Err(FieldError::new(
                    format!("{at}.ports[{i}].containerPort"),
                    "must be 1 to 65535",
                ));
            }
        }
        if let Some(hook) = &self.pre_stop {
            // None at all is what Kruise's webhook writes for a hook it cannot copy
            // (`sleep`): no hook of the request's, the container's own runs.
            if hook.action_count() > 1 {
                return Err(FieldError::new(
                    format!("{at}.preStop"),
                    "at most one of exec, httpGet, sleep and tcpSocket",
                ));
            }
            if let Some(sleep) = &hook.sleep
                && sleep.seconds < 0
            {
                return Err(FieldError::new(
                    format!("{at}.preStop.sleep.seconds"),
                    format!("{}: must not be negative", sleep.seconds),
                ));
            }
            if let Some(exec) = &hook.exec
                && exec.command.is_empty()
            {
                return Err(FieldError::new(
                    format!("{at}.preStop.exec.command"),
                    "is required",
                ));
            }
            let named = hook
                .http_get
                .as_ref()
                .map(|h| &h.port)
                .or(hook.tcp_socket.as_ref().map(|t| &t.port));
            for (action, port) in [
                ("httpGet", hook.http_get.as_ref().map(|h| &h.port)),
                ("tcpSocket", hook.tcp_socket.as_ref().map(|t| &t.port)),
            ] {
                if let Some(IntOrName::Int(0)) = port {
                    return Err(FieldError::new(
                        format!("{at}.preStop.{action}.port"),
                        "must be between 1 and 65535, inclusive (got 0)",
                    ));
                }
            }
            if let Some(IntOrName::Name(name)) = named
                && !self.ports.is_empty()
                && !self.ports.iter().any(|p| p.name.as_deref() == Some(name))
            {
                return Err(FieldError::new(
                    format!("{at}.preStop"),
                    format!("port {name:?} is not among {at}.ports"),
                ));
            }
        }
        if let Some(context) = &self.status_context {
            check_range(
                &format!("{at}.statusContext.restartCount"),
                u64::from(context.restart_count),
                0,
                MAX_INT32,
            )?;
        }
        if let Some(context) = &self.status_context
            && !context.is_containerd()
        {
            return Err(FieldError::new(
                format!("{at}.statusContext.containerID"),
                format!(
                    "{:?} is not a containerd container ID ({CONTAINERD_ID_PREFIX}<64 hex digits>; Rigger's nodes run containerd)",
                    context.container_id
                ),
            ));
        }
        Ok(())
    }
}

/// ContainerRecreateRequest, as the registry (`kinds/mod.rs`) lists it.
pub const INFO: KindInfo = KindInfo {
    name: KIND,
    spellings: &["containerrecreaterequests", "crr"],
    namespaced: true,
    read_only: None,
    notes: Some(
        "Restart some containers of one pod in place. Both Kruise versions; \
             v1beta1's status has the `PreRecreateGrace` condition.\n\n\
             Differs from Kruise: `containers[].preStop` and `ports` may be given (Kruise \
             makes them read-only) for Rigger's pods; in a cluster they are the Pod's own, as \
             Kruise's webhook makes them; `statusContext` is filled in from the pod's status for \
             Rigger's pods; preStop may also be `tcpSocket`; kubelet's pods are found in the \
             nodes' inventories. At `activeDeadlineSeconds`, a container not yet done is \
             `Failed` with the deadline as its message (Kruise leaves it `Pending`, \
             kruise#2353). v1beta1's `status.containerStatusSnapshot` (Kruise 1.9) is not \
             written by Rigger; beside Kruise's manager, that manager writes it only while it \
             sees the request `Recreating` (every 3 s), which Rigger's agents usually finish \
             sooner, so it is often empty there.",
    ),
    schema: Some(crate::kind::schema_of::<ContainerRecreateRequest>),
    crd: Some(&crate::kind::CrdInfo {
        group: crate::kind::KRUISE_GROUP,
        versions: &["v1alpha1", "v1beta1"],
        short_names: &["crr"],
        columns: &[
            crate::kind::PrinterColumn {
                name: "PHASE",
                kind: "string",
                json_path: ".status.phase",
                description: "Where the request is.",
                only_in: None,
            },
            crate::kind::PrinterColumn {
                name: "POD",
                kind: "string",
                json_path: ".spec.podName",
                description: "The pod whose containers are recreated.",
                only_in: None,
            },
            crate::kind::PrinterColumn {
                name: "NODE",
                kind: "string",
                json_path: ".metadata.labels.crr\\.apps\\.kruise\\.io/node-name",
                description: "The pod's node.",
                only_in: None,
            },
            crate::kind::AGE,
        ],
    }),
    table: crate::table::table_of::<ContainerRecreateRequest>,
};

impl Object for ContainerRecreateRequest {
    const INFO: &'static KindInfo = &INFO;
    metadata_field!();

    fn strip_owned(&mut self) {
        self.status = None;
    }

    fn validate(&mut self) -> Result<(), FieldError> {
        ContainerRecreateRequest::validate(self)
    }

    fn spec_differs(&self, old: &Self) -> bool {
        self.spec != old.spec
    }

    /// The statusContext filled in from the pod's status at creation.
    fn keep_filled(&mut self, old: &Self) {
        for container in &mut self.spec.containers {
            if container.status_context.is_none()
                && let Some(stored) = old
                    .spec
                    .containers
                    .iter()
                    .find(|c| c.name == container.name)
            {
                container.status_context.clone_from(&stored.status_context);
            }
        }
    }

    /// Like Kruise's, a request cannot change once created.
    fn check_update(&self, old: &Self) -> Result<(), FieldError> {
        if self.spec == old.spec {
            Ok(())
        } else {
            Err(FieldError::new(
                "spec",
                "cannot change once created; delete the request and apply a new one",
            ))
        }
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
            let node = self.metadata.labels.get(NODE_NAME_LABEL);
            row.push(node.cloned().unwrap_or_default());
            row.push(status.message.clone());
        }
        row
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::fields::KRUISE_API_VERSION;

    #[test]
    fn kruise_v1beta1_applies_and_keeps_its_version() {
        let value = serde_json::json!({
            "apiVersion": crate::fields::KRUISE_API_VERSION_V1BETA1,
            "kind": KIND,
            "metadata": {"name": "restart-app", "namespace": "default"},
            "spec": {
                "podName": "web-0",
                "containers": [{"name": "app"}],
                "strategy": {"failurePolicy": "Fail", "orderedRecreate": true},
            },
        });
        let crr: ContainerRecreateRequest = serde_json::from_value(value).unwrap();
        crr.validate().unwrap();
        let round = serde_json::to_value(&crr).unwrap();
        assert_eq!(
            round["apiVersion"],
            crate::fields::KRUISE_API_VERSION_V1BETA1
        );
    }

    fn crr(spec: &serde_json::Value) -> Result<ContainerRecreateRequest, String> {
        let value = serde_json::json!({
            "apiVersion": KRUISE_API_VERSION,
            "kind": KIND,
            "metadata": {"name": "restart-app", "namespace": "default"},
            "spec": spec,
        });
        let crr: ContainerRecreateRequest =
            serde_json::from_value(value).map_err(|e| e.to_string())?;
        crr.validate().map_err(|e| e.to_string())?;
        Ok(crr)
    }

    #[test]
    fn a_sleep_pre_stop_is_accepted_and_kruises_empty_one_means_the_containers_own() {
        for hook in [
            serde_json::json!({"sleep": {"seconds": 3}}),
            serde_json::json!({"sleep": {"seconds": 0}}),
            serde_json::json!({}),
        ] {
            let request = crr(&serde_json::json!({"podName": "web-0",
                "containers": [{"name": "a", "preStop": hook}]}))
            .unwrap_or_else(|e| panic!("{hook}: {e}"));
            let hook = request.spec.containers[0].pre_stop.as_ref().unwrap();
            assert!(hook.action_count() <= 1);
        }
    }

    #[test]
    fn kruise_example_applies_with_kruise_defaults() {
        let c = crr(&serde_json::json!({
            "podName": "web-0",
            "containers": [{"name": "app"}, {"name": "sidecar"}],
            "strategy": {"orderedRecreate": true, "unreadyGracePeriodSeconds": 3, "minStartedSeconds": 5},
            "activeDeadlineSeconds": 300,
            "ttlSecondsAfterFinished": 1800
        }))
        .unwrap();
        assert_eq!(c.spec.strategy.failure_policy, FailurePolicy::Fail);
        assert!(!c.spec.strategy.force_recreate);
    }

    #[test]
    fn a_request_read_back_from_kruise_applies() {
        let c = crr(&serde_json::json!({
            "podName": "web-0",
            "containers": [{
                "name": "app",
                "preStop": {"httpGet": {"path": "/drain", "port": "admin"}},
                "ports": [{"name": "admin", "containerPort": 9901, "protocol": "TCP"}],
                "statusContext": {"containerID": format!("containerd://{}", "ab".repeat(32)), "restartCount": 2},
            }, {
                "name": "sidecar",
                "preStop": {"exec": {"command": ["/bin/sh", "-c", "sleep 1"]}},
            }],
        }))
        .unwrap();
        let context = c.spec.containers[0].status_context.as_ref().unwrap();
        assert_eq!(context.id(), "ab".repeat(32));
        assert_eq!(context.restart_count, 2);
        let round = serde_json::to_value(&c).unwrap();
        assert_eq!(
            round["spec"]["containers"][0]["statusContext"]["containerID"],
            context.container_id
        );
        assert_eq!(round["spec"]["containers"][0]["ports"][0]["name"], "admin");
    }

    #[test]
    fn refusals_name_the_field() {
        let cases = [
            (
                serde_json::json!({"podName": "web-0", "containers": []}),
                "spec.containers: at least one",
            ),
            (
                serde_json::json!({"podName": "web-0", "containers": [{"name": "a"}, {"name": "a"}]}),
                "spec.containers[1].name: \"a\" is listed twice",
            ),
            (
                serde_json::json!({"podName": "web-0", "containers": [{"name": "a"}], "activeDeadlineSeconds": 1}),
                "spec.activeDeadlineSeconds: must be between 3 and 2147483647",
            ),
            (
                serde_json::json!({"podName": "web-0", "containers": [{"name": "a"}],
                    "strategy": {"terminationGracePeriodSeconds": 18446744073709551615u64}}),
                "spec.strategy.terminationGracePeriodSeconds: must be between 0 and 2147483647",
            ),
            (
                serde_json::json!({"podName": "web-0", "containers": [{"name": "a"}],
                    "strategy": {"minStartedSeconds": 2147483648u64}}),
                "spec.strategy.minStartedSeconds",
            ),
            (
                serde_json::json!({"podName": "web-0", "containers": [{"name": "a"}],
                    "ttlSecondsAfterFinished": 9999999999u64}),
                "spec.ttlSecondsAfterFinished",
            ),
            (
                serde_json::json!({"podName": "web-0", "containers": [{"name": "a",
                    "preStop": {"tcpSocket": {"port": 0}}}]}),
                "spec.containers[0].preStop.tcpSocket.port: must be between 1 and 65535",
            ),
            (
                serde_json::json!({"podName": "Web_0", "containers": [{"name": "a"}]}),
                "spec.podName:",
            ),
            (
                serde_json::json!({"podName": "web-0", "containers": [{"name": "a",
                    "preStop": {"exec": {"command": ["true"]}, "sleep": {"seconds": 1}}}]}),
                "spec.containers[0].preStop: at most one of exec, httpGet, sleep and tcpSocket",
            ),
            (
                serde_json::json!({"podName": "web-0", "containers": [{"name": "a",
                    "preStop": {"sleep": {"seconds": -5}}}]}),
                "spec.containers[0].preStop.sleep.seconds: -5: must not be negative",
            ),
            (
                serde_json::json!({"podName": "web-0", "containers": [{"name": "a",
                    "preStop": {"httpGet": {"port": "admin"}}, "ports": [{"name": "http", "containerPort": 80}]}]}),
                "spec.containers[0].preStop: port \"admin\" is not among spec.containers[0].ports",
            ),
            (
                serde_json::json!({"podName": "web-0", "containers": [{"name": "a",
                    "statusContext": {"containerID": "docker://abc", "restartCount": 0}}]}),
                "spec.containers[0].statusContext.containerID: \"docker://abc\" is not a containerd container ID",
            ),
        ];
        for (spec, expected) in cases {
            let err = crr(&spec).unwrap_err();
            assert!(err.starts_with(expected), "{err}\n  expected: {expected}");
        }
    }
}
