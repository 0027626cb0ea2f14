//! `kind: Pod` — the subset of Kubernetes' Pod that Rigger's agent runs on nodes without
//! kubelet (issue 5), with Kubernetes' field names. What is not supported is refused at
//! apply time with the field named, never silently ignored: host networking only (no CNI
//! on plain hosts), `hostPath` and `emptyDir` volumes only.

use std::collections::HashSet;

pub use rigger_proto::pod::*;

use crate::fields::{
    FieldError, MAX_INT32, ValidateMeta as _, ValidatePort as _, check_dns_subdomain, check_range,
};

use std::time::SystemTime;

use crate::kind::KindInfo;
use crate::object::{Object, metadata_field};
use crate::table::{Columns, age, or_dash};

/// The label `get pod` shows an agent-managed pod's lifecycle state in (the agent's;
/// never stored from an apply).
pub const LIFECYCLE_STATE_LABEL: &str = "lifecycle.rigger.dev/state";

/// `fieldRef` paths the agent can resolve (Kubernetes' downward API, metadata part).
const FIELD_PATHS: [&str; 4] = [
    "metadata.name",
    "metadata.namespace",
    "metadata.uid",
    "spec.nodeName",
];

/// Refuse what the agent cannot run, naming the field.
pub fn validate(pod: &Pod) -> Result<(), FieldError> {
    if pod.api_version != API_VERSION {
        return Err(FieldError::new(
            "apiVersion",
            format!("{:?}: expected {API_VERSION}", pod.api_version),
        ));
    }
    pod.metadata.validate()?;
    if let Some(grace) = pod
        .metadata
        .annotations
        .get(IN_PLACE_UPDATE_GRACE_ANNOTATION)
    {
        let at = format!("metadata.annotations[{IN_PLACE_UPDATE_GRACE_ANNOTATION:?}]");
        let seconds = grace
            .parse::<u64>()
            .map_err(|_| FieldError::new(&at, format!("{grace:?} is not a number of seconds")))?;
        check_range(&at, seconds, 0, MAX_INT32)?;
    }
    let spec = &pod.spec;
    check_range(
        "spec.terminationGracePeriodSeconds",
        spec.termination_grace_period_seconds,
        0,
        MAX_INT32,
    )?;
    if !spec.host_network {
        return Err(FieldError::new(
            "spec.hostNetwork",
            "must be true: the agent runs pods in the host's network (no pod network on plain hosts)",
        ));
    }
    if let Some(node) = &spec.node_name {
        rigger_proto::check_node_name(node).map_err(|_| {
            FieldError::new("spec.nodeName", format!("{node:?} is not a node name"))
        })?;
    }
    if spec.containers.is_empty() {
        return Err(FieldError::new(
            "spec.containers",
            "at least one container is required",
        ));
    }
    let mut secrets = HashSet::new();
    for (i, secret) in spec.image_pull_secrets.iter().enumerate() {
        let at = format!("spec.imagePullSecrets[{i}].name");
        check_dns_subdomain(&secret.name).map_err(|r| FieldError::new(at.clone(), r))?;
        if !secrets.insert(secret.name.as_str()) {
            return Err(FieldError::new(
                at,
                format!("{:?} is named twice", secret.name),
            ));
        }
    }
    let mut volumes = HashSet::new();
    for (i, volume) in spec.volumes.iter().enumerate() {
        let at = format!("spec.volumes[{i}]");
        check_dns_label(&volume.name).map_err(|r| FieldError::new(format!("{at}.name"), r))?;
        if !volumes.insert(volume.name.as_str()) {
            return Err(FieldError::new(
                format!("{at}.name"),
                format!("{:?} is used twice", volume.name),
            ));
        }
        match (&volume.host_path, &volume.empty_dir) {
            (Some(host), None) => {
                if !host.path.starts_with('/') {
                    return Err(FieldError::new(
                        format!("{at}.hostPath.path"),
                        "must be an absolute path",
                    ));
                }
                let kinds = ["", "Directory", "DirectoryOrCreate", "File", "FileOrCreate"];
                if let Some(kind) = &host.kind
                    && !kinds.contains(&kind.as_str())
                {
                    return Err(FieldError::new(
                        format!("{at}.hostPath.type"),
                        format!(
                            "{kind:?}: supported are Directory, DirectoryOrCreate, File, FileOrCreate"
                        ),
                    ));
                }
            }
            (None, Some(empty)) => {
                if let Some(limit) = &empty.size_limit
                    && parse_memory(limit).is_none()
                {
                    return Err(FieldError::new(
                        format!("{at}.emptyDir.sizeLimit"),
                        format!("{limit:?} is not a quantity like 1Gi"),
                    ));
                }
            }
            _ => {
                return Err(FieldError::new(
                    at,
                    "exactly one of hostPath and emptyDir (the volume types the agent supports)",
                ));
            }
        }
    }
    let mut names = HashSet::new();
    let all = spec
        .init_containers
        .iter()
        .enumerate()
        .map(|(i, c)| (format!("spec.initContainers[{i}]"), c, true))
        .chain(
            spec.containers
                .iter()
                .enumerate()
                .map(|(i, c)| (format!("spec.containers[{i}]"), c, false)),
        );
    for (at, container, init) in all {
        check_dns_label(&container.name).map_err(|r| FieldError::new(format!("{at}.name"), r))?;
        if !names.insert(container.name.as_str()) {
            return Err(FieldError::new(
                format!("{at}.name"),
                format!("{:?} is used twice", container.name),
            ));
        }
        validate_container(
            container,
            &at,
            init,
            &volumes,
            spec.termination_grace_period_seconds,
        )?;
    }
    Ok(())
}

fn validate_container(
    container: &Container,
    at: &str,
    init: bool,
    volumes: &HashSet<&str>,
    grace_seconds: u64,
) -> Result<(), FieldError> {
    if container.image.trim().is_empty() {
        return Err(FieldError::new(format!("{at}.image"), "is required"));
    }
    <oci_spec::distribution::Reference as std::str::FromStr>::from_str(&container.image).map_err(
        |e| {
            FieldError::new(
                format!("{at}.image"),
                format!("{:?} is not an image reference: {e}", container.image),
            )
        },
    )?;
    for (i, port) in container.ports.iter().enumerate() {
        if port.container_port == 0 {
            return Err(FieldError::new(
                format!("{at}.ports[{i}].containerPort"),
                "must be between 1 and 65535, inclusive (got 0)",
            ));
        }
    }
    if let Some(dir) = &container.working_dir
        && !dir.starts_with('/')
    {
        return Err(FieldError::new(
            format!("{at}.workingDir"),
            "must be an absolute path",
        ));
    }
    for (i, env) in container.env.iter().enumerate() {
        let here = format!("{at}.env[{i}]");
        if env.name.is_empty() || env.name.contains('=') {
            return Err(FieldError::new(
                format!("{here}.name"),
                format!("{:?} is not a variable name", env.name),
            ));
        }
        match (&env.value, &env.value_from) {
            (Some(_), Some(_)) => {
                return Err(FieldError::new(
                    here,
                    "value and valueFrom are mutually exclusive",
                ));
            }
            (None, Some(from)) => {
                let path = &from.field_ref.field_path;
                let labelled = (path.starts_with("metadata.labels['")
                    || path.starts_with("metadata.annotations['"))
                    && path.ends_with("']");
                if !(FIELD_PATHS.contains(&path.as_str()) || labelled) {
                    return Err(FieldError::new(
                        format!("{here}.valueFrom.fieldRef.fieldPath"),
                        format!(
                            "{path:?}: supported are {}, metadata.labels['KEY'] and metadata.annotations['KEY']",
                            FIELD_PATHS.join(", ")
                        ),
                    ));
                }
            }
            _ => {}
        }
    }
    for (i, mount) in container.volume_mounts.iter().enumerate() {
        let here = format!("{at}.volumeMounts[{i}]");
        if !volumes.contains(mount.name.as_str()) {
            return Err(FieldError::new(
                format!("{here}.name"),
                format!("no volume named {:?}", mount.name),
            ));
        }
        if !mount.mount_path.starts_with('/') {
            return Err(FieldError::new(
                format!("{here}.mountPath"),
                "must be an absolute path",
            ));
        }
    }
    if let Some(resources) = &container.resources {
        for (section, values) in [
            ("limits", &resources.limits),
            ("requests", &resources.requests),
        ] {
            for (name, value) in values {
                let here = format!("{at}.resources.{section}.{name}");
                let ok = match name.as_str() {
                    "cpu" => parse_cpu(value).is_some(),
                    "memory" => parse_memory(value).is_some(),
                    _ => {
                        return Err(FieldError::new(
                            here,
                            "supported resources are cpu and memory",
                        ));
                    }
                };
                if !ok {
                    return Err(FieldError::new(
                        here,
                        format!("{value:?} is not a quantity"),
                    ));
                }
            }
        }
    }
    if let Some(lifecycle) = &container.lifecycle {
        if init {
            return Err(FieldError::new(
                format!("{at}.lifecycle"),
                "init containers have no lifecycle hooks",
            ));
        }
        for (name, handler) in [
            ("postStart", &lifecycle.post_start),
            ("preStop", &lifecycle.pre_stop),
        ] {
            if let Some(handler) = handler {
                let here = format!("{at}.lifecycle.{name}");
                check_handler(
                    &here,
                    handler.exec.as_ref(),
                    handler.http_get.as_ref(),
                    handler.tcp_socket.as_ref(),
                    Some(handler.sleep.as_ref()),
                )?;
                if let Some(sleep) = &handler.sleep {
                    check_sleep(&format!("{here}.sleep.seconds"), sleep, grace_seconds)?;
                }
            }
        }
    }
    for (name, probe) in [
        ("readinessProbe", &container.readiness_probe),
        ("livenessProbe", &container.liveness_probe),
        ("startupProbe", &container.startup_probe),
    ] {
        let Some(probe) = probe else { continue };
        let here = format!("{at}.{name}");
        if init {
            return Err(FieldError::new(here, "init containers have no probes"));
        }
        check_handler(
            &here,
            probe.exec.as_ref(),
            probe.http_get.as_ref(),
            probe.tcp_socket.as_ref(),
            None,
        )?;
        check_range(
            &format!("{here}.initialDelaySeconds"),
            u64::from(probe.initial_delay_seconds),
            0,
            MAX_INT32,
        )?;
        for (field, value) in [
            ("periodSeconds", probe.period_seconds),
            ("timeoutSeconds", probe.timeout_seconds),
            ("successThreshold", probe.success_threshold),
            ("failureThreshold", probe.failure_threshold),
        ] {
            if let Some(value) = value {
                check_range(&format!("{here}.{field}"), u64::from(value), 1, MAX_INT32)?;
            }
        }
        if name != "readinessProbe" && probe.success_threshold.is_some_and(|t| t != 1) {
            return Err(FieldError::new(
                format!("{here}.successThreshold"),
                "must be 1 for liveness and startup probes",
            ));
        }
    }
    Ok(())
}

/// A hook's or a probe's action. `sleep` is `Some` for lifecycle hooks, which may sleep
/// (probes may not): `Some(None)` is a hook without one.
fn check_handler(
    at: &str,
    exec: Option<&ExecAction>,
    http: Option<&HttpGetAction>,
    tcp: Option<&TcpSocketAction>,
    sleep: Option<Option<&SleepAction>>,
) -> Result<(), FieldError> {
    let one_of = if sleep.is_some() {
        "exactly one of exec, httpGet, sleep and tcpSocket"
    } else {
        "exactly one of exec, httpGet and tcpSocket"
    };
    match (exec, http, tcp, sleep.flatten()) {
        (None, None, None, Some(_)) => {}
        (_, _, _, Some(_)) => return Err(FieldError::new(at, one_of)),
        (Some(exec), None, None, None) => {
            if exec.command.is_empty() {
                return Err(FieldError::new(
                    format!("{at}.exec.command"),
                    "must not be empty",
                ));
            }
        }
        (None, Some(http), None, None) => {
            if let Some(scheme) = &http.scheme
                && scheme != "HTTP"
                && scheme != "HTTPS"
            {
                return Err(FieldError::new(
                    format!("{at}.httpGet.scheme"),
                    format!("{scheme:?}: HTTP or HTTPS"),
                ));
            }
            http.port.validate(&format!("{at}.httpGet.port"))?;
        }
        (None, None, Some(tcp), None) => tcp.port.validate(&format!("{at}.tcpSocket.port"))?,
        _ => return Err(FieldError::new(at, one_of)),
    }
    Ok(())
}

/// Kubernetes' rule for a `sleep` hook: 0 up to the pod's termination grace period.
pub fn check_sleep(at: &str, sleep: &SleepAction, grace_seconds: u64) -> Result<(), FieldError> {
    match u64::try_from(sleep.seconds) {
        Ok(seconds) if seconds <= grace_seconds => Ok(()),
        _ => Err(FieldError::new(
            at,
            format!(
                "{}: must be 0 to terminationGracePeriodSeconds ({grace_seconds})",
                sleep.seconds
            ),
        )),
    }
}

/// A DNS-1123 label: container and volume names.
fn check_dns_label(name: &str) -> Result<(), String> {
    if name.len() <= 63 && !name.contains('.') {
        check_dns_subdomain(name)
    } else {
        Err(format!(
            "{name:?} is not a valid name (a DNS label: lowercase letters, digits and '-', at most 63)"
        ))
    }
}

/// Whether `new` may replace `old` in place: only container images may differ (labels
/// and annotations live in metadata and always may). Anything else is refused with the
/// first differing field named — a pod is never silently recreated.
pub fn check_in_place_change(old: &PodSpec, new: &PodSpec) -> Result<(), FieldError> {
    let mut expected = old.clone();
    if expected.containers.len() == new.containers.len() {
        for (container, changed) in expected.containers.iter_mut().zip(&new.containers) {
            if container.name == changed.name {
                container.image.clone_from(&changed.image);
            }
        }
    }
    if expected == *new {
        return Ok(());
    }
    let (before, after) = (
        serde_json::to_value(&expected).unwrap_or_default(),
        serde_json::to_value(new).unwrap_or_default(),
    );
    let field = first_difference("spec", &before, &after).unwrap_or_else(|| "spec".to_owned());
    Err(FieldError::new(
        field,
        "cannot change on a running pod: only container images (and metadata labels and annotations) are updated in place; delete the pod and apply it again",
    ))
}

/// The path of the first place two JSON values differ (`spec.containers[0].command`).
fn first_difference(
    path: &str,
    before: &serde_json::Value,
    after: &serde_json::Value,
) -> Option<String> {
    use serde_json::Value;
    if before == after {
        return None;
    }
    match (before, after) {
        (Value::Object(a), Value::Object(b)) => {
            let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
            keys.sort();
            keys.dedup();
            keys.into_iter().find_map(|key| {
                let (x, y) = (
                    a.get(key).unwrap_or(&Value::Null),
                    b.get(key).unwrap_or(&Value::Null),
                );
                first_difference(&format!("{path}.{key}"), x, y)
            })
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => a
            .iter()
            .zip(b)
            .enumerate()
            .find_map(|(i, (x, y))| first_difference(&format!("{path}[{i}]"), x, y)),
        _ => Some(path.to_owned()),
    }
}

/// Kruise's annotation naming, per hot-upgrade sidecar, the slot that serves.
const HOT_UPGRADE_WORKING: &str = "kruise.io/sidecarset-working-hotupgrade-container";

/// Pod, as the registry (`kinds/mod.rs`) lists it.
pub const INFO: KindInfo = KindInfo {
    name: KIND,
    spellings: &["pods", "po"],
    namespaced: true,
    read_only: None,
    notes: Some(
        "Kubernetes' Pod, the subset the agent runs on hosts without kubelet \
             (`apiVersion: v1`). What is not listed here is refused, naming the field: host \
             networking is required, volumes are `hostPath` and `emptyDir`. Not a Kruise \
             kind; SidecarSets inject into these.",
    ),
    schema: Some(crate::kind::schema_of::<Pod>),
    crd: None,
    table: crate::table::table_of::<Pod>,
};

impl Object for Pod {
    const INFO: &'static KindInfo = &INFO;
    metadata_field!();

    fn strip_owned(&mut self) {
        self.status = None;
        // Shown on reads, owned by the agent: a re-applied copy must not store it.
        self.metadata.labels.remove(LIFECYCLE_STATE_LABEL);
    }

    fn validate(&mut self) -> Result<(), FieldError> {
        validate(self)
    }

    fn spec_differs(&self, old: &Self) -> bool {
        self.spec != old.spec
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
            let working: std::collections::BTreeMap<String, String> = self
                .metadata
                .annotations
                .get(HOT_UPGRADE_WORKING)
                .and_then(|w| serde_json::from_str(w).ok())
                .unwrap_or_default();
            row.push(or_dash(
                &working.into_values().collect::<Vec<_>>().join(","),
            ));
        }
        row
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn pod(spec: &serde_json::Value) -> Result<Pod, String> {
        let value = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": spec,
        });
        let pod: Pod = crate::strict::decode_strict(value).map_err(|e| e.to_string())?;
        validate(&pod).map_err(|e| e.to_string())?;
        Ok(pod)
    }

    #[test]
    fn a_full_pod_applies() {
        let p = pod(&serde_json::json!({
            "hostNetwork": true,
            "nodeSelector": {"zone": "a"},
            "initContainers": [{"name": "init", "image": "r.example/init:1", "command": ["sh", "-c", "true"]}],
            "containers": [{
                "name": "app", "image": "r.example/app:1",
                "env": [
                    {"name": "A", "value": "1"},
                    {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "TEAM", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['team']"}}}
                ],
                "ports": [{"containerPort": 8080}],
                "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                "resources": {"limits": {"cpu": "500m", "memory": "128Mi"}},
                "lifecycle": {"preStop": {"httpGet": {"path": "/quit", "port": 8080}}},
                "readinessProbe": {"httpGet": {"path": "/ready", "port": "http"}, "periodSeconds": 2},
                "livenessProbe": {"tcpSocket": {"port": 8080}}
            }],
            "volumes": [{"name": "data", "emptyDir": {}}],
            "restartPolicy": "OnFailure",
            "terminationGracePeriodSeconds": 5
        }))
        .unwrap();
        assert_eq!(p.spec.restart_policy, RestartPolicy::OnFailure);
        assert_eq!(parse_cpu("500m"), Some(500));
        assert_eq!(parse_cpu("1.5"), Some(1500));
        assert_eq!(parse_memory("128Mi"), Some(128 << 20));
        assert_eq!(parse_memory("1G"), Some(1_000_000_000));
    }

    #[test]
    fn a_sleep_hook_is_kubernetes_own_within_the_grace_period() {
        for (seconds, grace) in [(0, 30), (5, 30), (30, 30), (0, 0)] {
            let p = pod(&serde_json::json!({
                "hostNetwork": true,
                "terminationGracePeriodSeconds": grace,
                "containers": [{"name": "app", "image": "r.example/app:1",
                    "lifecycle": {"preStop": {"sleep": {"seconds": seconds}},
                                  "postStart": {"sleep": {"seconds": seconds}}}}]
            }))
            .unwrap_or_else(|e| panic!("sleep {seconds} within {grace}: {e}"));
            let hook = p.spec.containers[0].lifecycle.as_ref().unwrap();
            assert_eq!(
                hook.pre_stop.as_ref().unwrap().sleep,
                Some(SleepAction { seconds })
            );
        }
    }

    #[test]
    fn what_the_agent_cannot_run_is_refused_with_the_field() {
        let base = |container: serde_json::Value, extra: serde_json::Value| {
            let mut spec = serde_json::json!({"hostNetwork": true, "containers": [container]});
            spec.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            pod(&spec).unwrap_err()
        };
        let app = serde_json::json!({"name": "app", "image": "r.example/app:1"});
        let cases = [
            (
                pod(&serde_json::json!({"containers": [&app]})).unwrap_err(),
                "spec.hostNetwork: must be true",
            ),
            (
                base(
                    app.clone(),
                    serde_json::json!({"volumes": [{"name": "v", "configMap": {"name": "x"}}]}),
                ),
                "unknown field `configMap`",
            ),
            (
                base(
                    serde_json::json!({"name": "app", "image": "r.example/app:1", "resources": {"limits": {"nvidia.com/gpu": "1"}}}),
                    serde_json::json!({}),
                ),
                "spec.containers[0].resources.limits.nvidia.com/gpu: supported resources are cpu and memory",
            ),
            (
                base(
                    serde_json::json!({"name": "app", "image": "r.example/app:1", "volumeMounts": [{"name": "nope", "mountPath": "/x"}]}),
                    serde_json::json!({}),
                ),
                "spec.containers[0].volumeMounts[0].name: no volume named \"nope\"",
            ),
            (
                base(
                    serde_json::json!({"name": "app", "image": "r.example/app:1", "livenessProbe": {"exec": {"command": ["true"]}, "tcpSocket": {"port": 1}}}),
                    serde_json::json!({}),
                ),
                "spec.containers[0].livenessProbe: exactly one of exec, httpGet and tcpSocket",
            ),
            (
                base(
                    serde_json::json!({"name": "app", "image": "r.example/app:1", "lifecycle": {"preStop": {"sleep": {"seconds": 45}}}}),
                    serde_json::json!({}),
                ),
                "spec.containers[0].lifecycle.preStop.sleep.seconds: 45: must be 0 to terminationGracePeriodSeconds (30)",
            ),
            (
                base(
                    serde_json::json!({"name": "app", "image": "r.example/app:1", "lifecycle": {"postStart": {"sleep": {"seconds": -1}}}}),
                    serde_json::json!({}),
                ),
                "spec.containers[0].lifecycle.postStart.sleep.seconds: -1: must be 0",
            ),
            (
                base(
                    serde_json::json!({"name": "app", "image": "r.example/app:1", "lifecycle": {"preStop": {"sleep": {"seconds": 1}, "exec": {"command": ["true"]}}}}),
                    serde_json::json!({}),
                ),
                "spec.containers[0].lifecycle.preStop: exactly one of exec, httpGet, sleep and tcpSocket",
            ),
            (
                base(
                    serde_json::json!({"name": "app", "image": "r.example/app:1", "readinessProbe": {"sleep": {"seconds": 1}}}),
                    serde_json::json!({}),
                ),
                "unknown field `sleep`",
            ),
            (
                base(
                    serde_json::json!({"name": "app", "image": "r.example/app:1", "env": [{"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]}),
                    serde_json::json!({}),
                ),
                "spec.containers[0].env[0].valueFrom.fieldRef.fieldPath: \"status.podIP\"",
            ),
            (
                base(
                    app,
                    serde_json::json!({"initContainers": [{"name": "app", "image": "r.example/x:1"}]}),
                ),
                "spec.containers[0].name: \"app\" is used twice",
            ),
        ];
        for (err, expected) in cases {
            assert!(err.contains(expected), "{err}\n  expected: {expected}");
        }
    }

    #[test]
    fn only_images_change_in_place_and_anything_else_is_named() {
        let old: Pod = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web"},
            "spec": {"hostNetwork": true, "containers": [
                {"name": "app", "image": "r.example/app:1", "command": ["run"]},
                {"name": "side", "image": "r.example/side:1"}
            ]}
        }))
        .unwrap();
        let mut new = old.spec.clone();
        new.containers[1].image = "r.example/side:2".to_owned();
        assert!(check_in_place_change(&old.spec, &new).is_ok());
        new.containers[0].command = vec!["other".to_owned()];
        let err = check_in_place_change(&old.spec, &new)
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("spec.containers[0].command[0]: cannot change"),
            "{err}"
        );
        let mut grace = old.spec.clone();
        grace.termination_grace_period_seconds = 5;
        let err = check_in_place_change(&old.spec, &grace)
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("spec.terminationGracePeriodSeconds:"),
            "{err}"
        );
    }
}
