//! What happened to an object, told where its users look: in a cluster, Kubernetes
//! Events (`kubectl describe`, `kubectl get events`) with Kruise's reasons
//! (`PullImageSucceed`, `PullImageFailed`). Engines record through [`EventSink`]; the
//! standalone stores have none yet ([`NoEvents`]).

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

/// Where engines record events. Recording never blocks an engine: a sink that cannot
/// keep up drops events (and counts them).
pub trait EventSink: std::fmt::Debug + Send + Sync + 'static {
    fn record(&self, event: Event);
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
