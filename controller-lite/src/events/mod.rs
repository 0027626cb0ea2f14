//! What happened to an object, told where its users look: in a cluster, Kubernetes
//! Events (`kubectl describe`, `kubectl get events`) with Kruise's reasons
//! (`PullImageSucceed`, `PullImageFailed`); on Rigger's own stores, Events of the same
//! shape in the store ([`store::StoreEvents`]), which `riggerctl get events` and
//! `riggerctl describe` show. Engines record through [`EventSink`].

pub mod api_server;
pub mod store;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// The object an event is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Regarding {
    pub api_version: String,
    pub kind: String,
    /// Empty for a cluster-wide object.
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// One event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub regarding: Regarding,
    /// Kubernetes' `Warning` (else `Normal`).
    pub warning: bool,
    pub reason: &'static str,
    pub message: String,
}

/// Kruise's reason for an image a node pulled.
pub const PULL_IMAGE_SUCCEED: &str = "PullImageSucceed";
/// Kruise's reason for an image a node failed to pull.
pub const PULL_IMAGE_FAILED: &str = "PullImageFailed";

/// A node found that a peer sent bytes that did not match their digest.
pub const PEER_SUSPECTED: &str = "PeerSuspected";
/// Kubernetes' node controller's reasons for a node's readiness.
pub const NODE_READY: &str = "NodeReady";
pub const NODE_NOT_READY: &str = "NodeNotReady";
/// A node first registered (Kubernetes' `RegisteredNode`).
pub const REGISTERED_NODE: &str = "RegisteredNode";

/// A pod's sidecars moved to a SidecarSet's version in place (a rollout's step).
pub const SIDECAR_UPGRADED: &str = "SidecarUpgraded";

/// Where engines record events. Recording never blocks an engine: a sink that cannot
/// keep up drops events (and counts them).
pub trait EventSink: std::fmt::Debug + Send + Sync + 'static {
    fn record(&self, event: Event);
}

/// The bounded queue between the engines and one event writer: recording never waits; a
/// full queue drops the event and counts it, and the writer says the count now and then.
#[derive(Debug, Clone)]
pub struct EventQueue {
    sender: tokio::sync::mpsc::Sender<Event>,
    dropped: Arc<AtomicU64>,
}

/// The writer's end of an [`EventQueue`].
#[derive(Debug)]
pub struct QueuedEvents {
    pub events: tokio::sync::mpsc::Receiver<Event>,
    dropped: Arc<AtomicU64>,
}

impl EventQueue {
    pub fn new(capacity: usize) -> (Self, QueuedEvents) {
        let (sender, events) = tokio::sync::mpsc::channel(capacity);
        let dropped = Arc::new(AtomicU64::new(0));
        let writer = QueuedEvents {
            events,
            dropped: dropped.clone(),
        };
        (Self { sender, dropped }, writer)
    }
}

impl EventSink for EventQueue {
    fn record(&self, event: Event) {
        if self.sender.try_send(event).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl QueuedEvents {
    /// Say (once, as a warning) how many events a full queue dropped since last said.
    pub fn say_dropped(&self) {
        let lost = self.dropped.swap(0, Ordering::Relaxed);
        if lost > 0 {
            tracing::warn!(
                events = lost,
                "the event queue was full; events were dropped"
            );
        }
    }
}

/// Events go nowhere.
#[derive(Debug, Default)]
pub struct NoEvents;

impl EventSink for NoEvents {
    fn record(&self, _event: Event) {}
}

/// The event for a node's pull that just ended.
pub fn pull_ended(regarding: Regarding, node: &str, image: &str, failed: Option<&str>) -> Event {
    match failed {
        None => Event {
            regarding,
            warning: false,
            reason: PULL_IMAGE_SUCCEED,
            message: format!("Image {image} pulled on node {node}"),
        },
        Some(why) => Event {
            regarding,
            warning: true,
            reason: PULL_IMAGE_FAILED,
            message: format!("Image {image} failed on node {node}: {why}"),
        },
    }
}

/// The event for `node` suspecting `peer` during a job's pull.
pub fn peer_suspected(regarding: Regarding, node: &str, peer: &str) -> Event {
    Event {
        regarding,
        warning: true,
        reason: PEER_SUSPECTED,
        message: format!(
            "Node {node}: peer {peer} sent bytes that did not match their digest; it is no longer a source for this node"
        ),
    }
}

/// The SidecarSet `set` as an event's object.
pub fn sidecar_set(set: &rigger_api::sidecar_set::SidecarSet) -> Regarding {
    Regarding {
        api_version: set.api_version.clone(),
        kind: set.kind.clone(),
        namespace: String::new(),
        name: set.metadata.name.clone(),
        uid: set.metadata.uid.clone().unwrap_or_default(),
    }
}

/// The event for a pod whose sidecars a SidecarSet's rollout moved to `version`.
pub fn sidecar_upgraded(
    set: &rigger_api::sidecar_set::SidecarSet,
    pod_namespace: &str,
    pod_name: &str,
    version: &str,
) -> Event {
    Event {
        regarding: sidecar_set(set),
        warning: false,
        reason: SIDECAR_UPGRADED,
        message: format!(
            "Pod {pod_namespace}/{pod_name}: sidecars moved to version {version} in place"
        ),
    }
}

/// The Node `name` as an event's object.
pub fn node(name: &str) -> Regarding {
    Regarding {
        api_version: "v1".to_owned(),
        kind: "Node".to_owned(),
        namespace: String::new(),
        name: name.to_owned(),
        uid: String::new(),
    }
}
