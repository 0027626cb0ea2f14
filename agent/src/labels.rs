//! Label keys on CRI objects: kubelet's, and the ones Rigger's agent puts on what it
//! creates, so the agent can always tell its own pods and containers from kubelet's and
//! never touches kubelet's by mistake.

/// kubelet's pod uid label on sandboxes and containers.
pub const KUBELET_POD_UID: &str = "io.kubernetes.pod.uid";

/// On sandboxes and containers the agent creates: the Pod object's uid.
pub const POD_UID: &str = "rigger.dev/pod-uid";
/// The Pod object's name and namespace.
pub const POD_NAME: &str = "rigger.dev/pod-name";
pub const POD_NAMESPACE: &str = "rigger.dev/pod-namespace";
/// On containers: the container's name in the pod spec.
pub const CONTAINER_NAME: &str = "rigger.dev/container-name";
/// On containers: a hash of the container's spec, to tell a changed spec from a restart.
pub const SPEC_HASH: &str = "rigger.dev/spec-hash";
/// On everything the agent creates, for CRI's label filters.
pub const MANAGED: &str = "rigger.dev/managed";
/// On sandboxes: the pod's grace period, so a pod removed while the agent was away is
/// still stopped with its own grace.
pub const GRACE_SECONDS: &str = "rigger.dev/termination-grace-seconds";
/// On sandboxes: the node (agent) that runs the pod. An agent manages only its own, so
/// agents sharing a containerd (a lab) never remove each other's pods.
pub const NODE: &str = "rigger.dev/node";
/// On containers (an annotation): the image reference the container was created from,
/// as the pod spec wrote it. containerd 1.6's CRI reports the first of the image's tags
/// instead, which may be any other name the same image was pulled under.
pub const IMAGE: &str = "rigger.dev/image";
