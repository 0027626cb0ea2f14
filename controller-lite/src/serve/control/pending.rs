//! Pods applied while no ready node matched them: accepted and left Pending, as
//! Kubernetes leaves an unschedulable pod (after a controller restart, agents need
//! seconds to come back, and what users apply meanwhile must not fail). Each pass places
//! the pending pods on the ready matching node with the fewest pods, as an apply does, and
//! says once per pod, as a `FailedScheduling` event, why one still waits.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rigger_api::pod::Pod;
use tokio::sync::Notify;

use super::ControlService;
use crate::events::{Event, EventSink, Regarding};
use rigger_store::typed::Versioned;
use rigger_store::{ObjectKey, Precondition, StoreError};

/// Kubernetes' scheduler's reason for a pod no node takes.
pub const FAILED_SCHEDULING: &str = "FailedScheduling";

/// The engine placing pending pods.
#[derive(Clone)]
pub struct PendingPods {
    control: ControlService,
    events: Arc<dyn EventSink>,
    wake: Arc<Notify>,
    /// Why each pod waits, as last said (said again only when it changes).
    said: Arc<Mutex<HashMap<ObjectKey, String>>>,
}

impl std::fmt::Debug for PendingPods {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingPods").finish_non_exhaustive()
    }
}

impl PendingPods {
    pub fn new(control: ControlService, events: Arc<dyn EventSink>) -> Self {
        Self {
            control,
            events,
            wake: Arc::default(),
            said: Arc::default(),
        }
    }

    /// Record why `pod` waits, once per reason.
    fn waits(&self, key: &ObjectKey, pod: &Pod, why: &str) {
        let mut said = self.said.lock().unwrap_or_else(PoisonError::into_inner);
        if said.get(key).map(String::as_str) == Some(why) {
            return;
        }
        said.insert(key.clone(), why.to_owned());
        self.events.record(failed_scheduling(pod, why));
    }
}

/// The `FailedScheduling` event of `pod`, which waits because `why`.
pub fn failed_scheduling(pod: &Pod, why: &str) -> Event {
    Event {
        regarding: Regarding {
            api_version: pod.api_version.clone(),
            kind: pod.kind.clone(),
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            name: pod.metadata.name.clone(),
            uid: pod.metadata.uid.clone().unwrap_or_default(),
        },
        warning: true,
        reason: FAILED_SCHEDULING,
        message: format!("{why}; the pod stays Pending until a node matches"),
    }
}

impl crate::engines::Engine for PendingPods {
    const NAME: &'static str = "pending pods";
    const TICK: Duration = Duration::from_secs(1);
    const WATCHES: &'static [&'static str] = &[rigger_api::pod::KIND];
    type Snapshot = Vec<Versioned<Pod>>;

    fn wake_signal(&self) -> &Notify {
        &self.wake
    }

    async fn observe(&self) -> Result<Self::Snapshot, StoreError> {
        let pods = self.control.store.list_objects::<Pod>().await?;
        let pending: Vec<_> = pods
            .into_iter()
            .filter(|p| p.value.spec.node_name.is_none())
            .filter(|p| p.value.metadata.deletion_timestamp.is_none())
            .collect();
        self.said
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|key, _| pending.iter().any(|p| &p.key == key));
        Ok(pending)
    }

    async fn pass(&self, pending: Self::Snapshot) {
        for stored in pending {
            let mut pod = stored.value;
            let node = match self.control.place(&pod).await {
                Ok(node) => node,
                Err(error) => {
                    self.waits(&stored.key, &pod, &error.reason);
                    continue;
                }
            };
            pod.spec.node_name = Some(node.clone());
            let written = self
                .control
                .store
                .put_as(
                    stored.key.clone(),
                    &pod,
                    Precondition::Revision(stored.revision),
                )
                .await;
            match written {
                Ok(_) => {
                    tracing::info!(pod = %stored.key, %node, "pending pod placed");
                    self.control.pods.send_to(&node).await;
                }
                // Changed meanwhile (applied again, deleted): the next pass reads it anew.
                Err(error) => {
                    tracing::debug!(pod = %stored.key, %error, "pending pod not placed this pass");
                }
            }
        }
    }
}
