//! What a request's node is sent: the recreate task, with what the request says of each
//! container beyond its name, and its cancellation.

use rigger_api::container_recreate_request::{self as crr, FailurePolicy};
use rigger_proto::v1::{
    CancelTask, ControllerMessage, RecreateContainerDetail, RecreateContainers, Task,
    controller_message, task,
};

use super::Tracked;

pub(super) fn cancel(id: &str, reason: &str) -> ControllerMessage {
    ControllerMessage {
        message: Some(controller_message::Message::CancelTask(CancelTask {
            id: id.to_owned(),
            reason: reason.to_owned(),
        })),
    }
}

pub(super) fn recreate_task(tracked: &Tracked, uid: &str, node: &str) -> ControllerMessage {
    let spec = &tracked.request.spec;
    let strategy = &spec.strategy;
    let seconds = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
    ControllerMessage {
        message: Some(controller_message::Message::Task(Task {
            id: tracked.task_id(),
            node_name: node.to_owned(),
            work: Some(task::Work::RecreateContainers(RecreateContainers {
                pod_uid: uid.to_owned(),
                pod_namespace: tracked
                    .request
                    .metadata
                    .namespace
                    .clone()
                    .unwrap_or_default(),
                pod_name: spec.pod_name.clone(),
                containers: spec.containers.iter().map(|c| c.name.clone()).collect(),
                ordered: strategy.ordered_recreate,
                ignore_failures: strategy.failure_policy == FailurePolicy::Ignore,
                termination_grace_period_seconds: strategy
                    .termination_grace_period_seconds
                    .map(seconds),
                unready_grace_period_seconds: strategy
                    .unready_grace_period_seconds
                    .map_or(0, seconds),
                min_started_seconds: seconds(strategy.min_started_seconds),
                force_recreate: strategy.force_recreate,
                details: spec.containers.iter().map(detail).collect(),
            })),
        })),
    }
}

/// What the request says of one container beyond its name, for the agent.
fn detail(container: &crr::CrrContainer) -> RecreateContainerDetail {
    let json = |value: Option<String>| value.unwrap_or_default();
    RecreateContainerDetail {
        name: container.name.clone(),
        pre_stop_json: json(
            container
                .pre_stop
                .as_ref()
                .and_then(|h| serde_json::to_string(h).ok()),
        ),
        ports_json: json(
            (!container.ports.is_empty())
                .then(|| serde_json::to_string(&container.ports).ok())
                .flatten(),
        ),
        container_id: container
            .status_context
            .as_ref()
            .map(|c| c.id().to_owned())
            .unwrap_or_default(),
    }
}
