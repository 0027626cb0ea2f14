//! Calling lifecycle cooperators (`rigger_proto::lifecycle`) around operations on
//! agent-managed pods: each one whose operations include this one is asked, in the order
//! the controller sent them, and the operation goes on only once it acknowledged (a 2xx
//! answer, or exit 0). Unacknowledged calls are repeated each second until the
//! cooperator's timeout; then its failure policy decides.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rigger_proto::lifecycle::{Cooperator, FailurePolicy, Operation, Stage};

/// Where an agent-managed pod is in an operation (Kruise's `lifecycle.apps.kruise.io/state`),
/// reported with the pod's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum LifecycleState {
    Normal,
    PreparingUpdate,
    Updating,
    Updated,
    /// Containers are about to be stopped for good or recreated (ContainerRecreateRequest).
    PreparingDelete,
}

/// How often an unacknowledged cooperator is asked again.
const RETRY: Duration = Duration::from_secs(1);

/// The pod an operation is about.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub node: String,
}

/// The pod's labels as they are now (labelsHandler cooperators watch them).
pub type CurrentLabels<'a> = &'a (dyn Fn() -> BTreeMap<String, String> + Send + Sync);

/// Whether any cooperator of `operation` wants the pod reported not ready.
pub fn marks_not_ready(cooperators: &[Cooperator], operation: Operation) -> bool {
    cooperators
        .iter()
        .any(|c| c.mark_pod_not_ready && c.operations.contains(&operation))
}

/// Ask every cooperator taking part in `operation`; `Err` names the one that did not
/// acknowledge in time under failurePolicy Fail.
pub async fn call_all(
    cooperators: &[Cooperator],
    operation: Operation,
    stage: Stage,
    pod: &PodRef,
    labels: CurrentLabels<'_>,
) -> Result<(), String> {
    for cooperator in cooperators
        .iter()
        .filter(|c| c.operations.contains(&operation))
    {
        let started = Instant::now();
        let timeout = Duration::from_secs(u64::from(cooperator.timeout_seconds));
        let mut last = String::new();
        let acknowledged = loop {
            let left = timeout.saturating_sub(started.elapsed());
            match call(cooperator, operation, stage, pod, labels, left).await {
                Ok(()) => break true,
                Err(reason) => last = reason,
            }
            if started.elapsed() + RETRY > timeout {
                break false;
            }
            tokio::time::sleep(RETRY).await;
        };
        if acknowledged {
            tracing::info!(cooperator = %cooperator.name, ?operation, ?stage, pod = %pod.name, "cooperator acknowledged");
            continue;
        }
        let reason = format!(
            "cooperator {} did not acknowledge {stage:?} of {operation:?} within {}s ({last})",
            cooperator.name, cooperator.timeout_seconds
        );
        match cooperator.failure_policy {
            FailurePolicy::Fail => return Err(reason),
            FailurePolicy::Ignore => {
                tracing::warn!(%reason, "going on (failurePolicy Ignore)");
            }
        }
    }
    Ok(())
}

async fn call(
    cooperator: &Cooperator,
    operation: Operation,
    stage: Stage,
    pod: &PodRef,
    labels: CurrentLabels<'_>,
    left: Duration,
) -> Result<(), String> {
    let left = left.max(Duration::from_millis(100));
    if !cooperator.labels_handler.is_empty() {
        let current = labels();
        let present = cooperator
            .labels_handler
            .iter()
            .all(|(k, v)| current.get(k) == Some(v));
        return match (stage, present) {
            (Stage::Preparing, false) | (Stage::Completing, true) => Ok(()),
            (Stage::Preparing, true) => {
                Err("the pod still has the labelsHandler labels".to_owned())
            }
            (Stage::Completing, false) => {
                Err("the pod does not have the labelsHandler labels back yet".to_owned())
            }
        };
    }
    if let Some(webhook) = &cooperator.webhook {
        rigger_daemon::tls::install_crypto_provider();
        let client = reqwest::Client::builder()
            .timeout(left)
            .build()
            .map_err(|e| e.to_string())?;
        let body = serde_json::json!({"stage": stage, "operation": operation, "pod": pod});
        let response = client
            .post(&webhook.url)
            .json(&body)
            .send()
            .await
            .map_err(|e| rigger_daemon::error_chain(&e))?;
        let status = response.status();
        return if status.is_success() {
            Ok(())
        } else {
            Err(format!("HTTP {status}"))
        };
    }
    if let Some(exec) = &cooperator.exec {
        let Some((program, args)) = exec.command.split_first() else {
            return Err("empty command".to_owned());
        };
        let run = tokio::process::Command::new(program)
            .args(args)
            .env("RIGGER_STAGE", format!("{stage:?}"))
            .env("RIGGER_OPERATION", format!("{operation:?}"))
            .env("RIGGER_POD_NAMESPACE", &pod.namespace)
            .env("RIGGER_POD_NAME", &pod.name)
            .env("RIGGER_POD_UID", &pod.uid)
            .kill_on_drop(true)
            .status();
        let status = tokio::time::timeout(left, run)
            .await
            .map_err(|_| "the command did not finish in time".to_owned())?
            .map_err(|e| format!("{program}: {e}"))?;
        return if status.success() {
            Ok(())
        } else {
            Err(format!("{program} exited with {status}"))
        };
    }
    Err("neither a webhook nor a command".to_owned())
}
