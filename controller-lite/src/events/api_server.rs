//! [`EventSink`] on the API server: core/v1 Events (what `kubectl describe` and `kubectl
//! get events` show), written by one task from a bounded queue so that no engine waits
//! on the API server. A full queue drops the event; the drops are counted and said once
//! a minute (a wide rollout must not turn into a warning per pod).

use k8s_openapi::api::core::v1::{Event as KubeEvent, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use std::time::Duration;

use crate::events::{Event, EventQueue, EventSink};

/// Events waiting to be written.
const QUEUE: usize = 1024;
/// Who reports.
const COMPONENT: &str = "rigger-controller";
/// How often events dropped with the queue full are said.
const SAY_DROPPED_EVERY: Duration = Duration::from_secs(60);

/// Events written to the API server.
#[derive(Debug, Clone)]
pub struct KubeEvents {
    /// Its drops are said once a minute.
    queue: EventQueue,
}

impl KubeEvents {
    /// Start the writer; it ends when every sender is gone.
    pub fn start(client: kube::Client) -> Self {
        let (queue, mut queued) = EventQueue::new(QUEUE);
        tokio::spawn(async move {
            let mut say = tokio::time::interval(SAY_DROPPED_EVERY);
            loop {
                let event = tokio::select! {
                    event = queued.events.recv() => match event {
                        Some(event) => event,
                        None => return,
                    },
                    _ = say.tick() => {
                        queued.say_dropped();
                        continue;
                    }
                };
                let namespace = if event.regarding.namespace.is_empty() {
                    "default".to_owned()
                } else {
                    event.regarding.namespace.clone()
                };
                let api: Api<KubeEvent> = Api::namespaced(client.clone(), &namespace);
                if let Err(error) = api
                    .create(&PostParams::default(), &to_kube(&event, &namespace))
                    .await
                {
                    tracing::warn!(%error, reason = event.reason, object = %event.regarding.name, "cannot record an event");
                }
            }
        });
        Self { queue }
    }
}

impl EventSink for KubeEvents {
    fn record(&self, event: Event) {
        self.queue.record(event);
    }
}

/// The core/v1 Event of `event`, in `namespace` (a cluster-wide object's go to
/// `default`, as Kubernetes puts Node events).
pub fn to_kube(event: &Event, namespace: &str) -> KubeEvent {
    let now = Time(Timestamp::now());
    let regarding = &event.regarding;
    KubeEvent {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}.", regarding.name)),
            namespace: Some(namespace.to_owned()),
            ..ObjectMeta::default()
        },
        involved_object: ObjectReference {
            api_version: Some(regarding.api_version.clone()),
            kind: Some(regarding.kind.clone()),
            name: Some(regarding.name.clone()),
            namespace: (!regarding.namespace.is_empty()).then(|| regarding.namespace.clone()),
            uid: (!regarding.uid.is_empty()).then(|| regarding.uid.clone()),
            ..ObjectReference::default()
        },
        reason: Some(event.reason.to_owned()),
        message: Some(event.message.clone()),
        type_: Some(if event.warning { "Warning" } else { "Normal" }.to_owned()),
        first_timestamp: Some(now.clone()),
        last_timestamp: Some(now),
        count: Some(1),
        source: Some(EventSource {
            component: Some(COMPONENT.to_owned()),
            host: None,
        }),
        reporting_component: Some(COMPONENT.to_owned()),
        ..KubeEvent::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{Regarding, pull_ended};

    #[test]
    fn a_failed_pull_is_a_warning_about_its_job_with_kruises_reason() {
        let regarding = Regarding {
            api_version: "apps.kruise.io/v1beta1".into(),
            kind: "ImagePullJob".into(),
            namespace: "shop".into(),
            name: "warm".into(),
            uid: "u1".into(),
        };
        let event = to_kube(
            &pull_ended(regarding, "n1", "r/app:1", Some("denied")),
            "shop",
        );
        assert_eq!(event.reason.as_deref(), Some("PullImageFailed"));
        assert_eq!(event.type_.as_deref(), Some("Warning"));
        assert_eq!(event.involved_object.name.as_deref(), Some("warm"));
        assert_eq!(event.metadata.generate_name.as_deref(), Some("warm."));
        assert!(event.message.unwrap().contains("n1"));
    }
}
