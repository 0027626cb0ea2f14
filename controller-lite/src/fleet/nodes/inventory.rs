//! What the registry keeps of a node's inventory: what Node objects show and what
//! selectors and recreate requests need, with the strings that repeat across a fleet
//! (image names, digests, versions) shared.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::SystemTime;

use rigger_proto::v1::NodeInventory;

use super::{SharedLabels, count};

/// One pod's namespace and labels, as its node reported them.
pub type PodLabels = (Arc<str>, Arc<BTreeMap<String, String>>);
/// Pods' namespaces and labels, by node.
pub type PodsByNode = HashMap<String, Vec<PodLabels>>;

/// What the controller keeps of a node's inventory: what Node objects show and what
/// selectors need. Strings that repeat across a fleet (image names, digests, versions)
/// are shared, so ten thousand nodes holding the same images cost one copy of each name.
#[derive(Debug, Clone)]
pub(super) struct InventorySummary {
    pub(super) containerd_version: Arc<str>,
    pub(super) cri_runtime: Arc<str>,
    pub(super) images: NodeImages,
    /// Namespace and labels of each pod (for podSelector).
    pub(super) pod_labels: Box<[PodLabels]>,
    pub(super) pods: u32,
    pub(super) containers: u32,
    /// Running pods of kubelet's (container recreate requests find them here).
    pub(super) kubelet_pods: Box<[KubeletPod]>,
    pub(super) received_at: SystemTime,
}

/// Where a kubelet pod runs, as inventories say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KubeletPodPlace {
    Nowhere,
    On(String, KubeletPod),
    /// More than one node reports it (sorted names): one of them is wrong, perhaps lying.
    ClaimedBy(Vec<String>),
}

/// A running kubelet pod as the node's inventory shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeletPod {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub containers: Vec<String>,
}

#[derive(Debug, Clone)]
pub(super) struct ImageSummary {
    pub(super) namespace: Arc<str>,
    pub(super) name: Arc<str>,
    pub(super) digest: Digest,
    pub(super) size: u64,
}

/// The images a node reported, shared with the views jobs take of it.
#[derive(Debug, Clone, Default)]
pub struct NodeImages(pub(super) Arc<[ImageSummary]>);

impl NodeImages {
    /// Whether the node holds an image of this name (in any namespace).
    pub fn has(&self, name: &str) -> bool {
        self.0.iter().any(|image| &*image.name == name)
    }

    /// Images of these names (tests of what reads a node's images).
    #[cfg(test)]
    pub fn named(names: &[&str]) -> Self {
        Self(
            names
                .iter()
                .map(|name| ImageSummary {
                    namespace: Arc::from("default"),
                    name: Arc::from(*name),
                    digest: Digest::Other(Arc::from("")),
                    size: 0,
                })
                .collect(),
        )
    }
}

/// An image digest as its node reported it. A sha256 one, nearly every digest, is kept as
/// its 32 bytes: digests differ from node to node far more than names do, so sharing
/// their text saves little and 71 characters each add up over a fleet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Digest {
    Sha256([u8; 32]),
    /// Any other text, as reported (shown back unchanged).
    Other(Arc<str>),
}

impl Digest {
    pub(super) fn read(text: &str, strings: &mut Interner) -> Self {
        let mut bytes = [0; 32];
        match text.strip_prefix("sha256:") {
            // Lowercase only, so that the digest is shown back exactly as reported.
            Some(hex)
                if !hex.bytes().any(|b| b.is_ascii_uppercase())
                    && hex::decode_to_slice(hex, &mut bytes).is_ok() =>
            {
                Self::Sha256(bytes)
            }
            _ => Self::Other(strings.intern(text)),
        }
    }
}

impl std::fmt::Display for Digest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Sha256(bytes) => write!(f, "sha256:{}", hex::encode(bytes)),
            Self::Other(text) => f.write_str(text),
        }
    }
}

/// Shared copies of repeated strings; copies no node uses any more are dropped now and then.
#[derive(Debug, Default)]
pub(super) struct Interner {
    pub(super) strings: HashSet<Arc<str>>,
    /// Size after the last sweep; the next sweep waits until it doubled.
    pub(super) swept_at: usize,
}

impl Interner {
    pub(super) fn intern(&mut self, text: &str) -> Arc<str> {
        if let Some(shared) = self.strings.get(text) {
            return shared.clone();
        }
        let shared: Arc<str> = Arc::from(text);
        self.strings.insert(shared.clone());
        if self.strings.len() > 4096 && self.strings.len() > 2 * self.swept_at {
            self.strings.retain(|s| Arc::strong_count(s) > 1);
            self.swept_at = self.strings.len();
        }
        shared
    }

    /// `labels` (sorted, as a map iterates) as shared strings.
    pub(super) fn labels(&mut self, labels: &BTreeMap<String, String>) -> SharedLabels {
        labels
            .iter()
            .map(|(key, value)| (self.intern(key), self.intern(value)))
            .collect()
    }

    pub(super) fn summarize(&mut self, inventory: &NodeInventory) -> InventorySummary {
        let runtime = inventory.runtime.clone().unwrap_or_default();
        InventorySummary {
            containerd_version: self.intern(&runtime.containerd_version),
            cri_runtime: self.intern(&runtime.cri_runtime_name),
            images: NodeImages(
                inventory
                    .images
                    .iter()
                    .map(|i| ImageSummary {
                        namespace: self.intern(&i.namespace),
                        name: self.intern(&i.name),
                        digest: Digest::read(&i.digest, self),
                        size: i.size,
                    })
                    .collect(),
            ),
            pod_labels: inventory
                .pods
                .iter()
                .map(|p| {
                    (
                        self.intern(&p.namespace),
                        Arc::new(p.labels.clone().into_iter().collect()),
                    )
                })
                .collect(),
            pods: count(Some(inventory.pods.len())),
            containers: count(Some(inventory.containers.len())),
            kubelet_pods: inventory
                .pods
                .iter()
                .filter(|p| p.owner == "kubelet" && p.state == "ready")
                .map(|p| KubeletPod {
                    namespace: p.namespace.clone(),
                    name: p.name.clone(),
                    uid: p.uid.clone(),
                    containers: inventory
                        .containers
                        .iter()
                        .filter(|c| c.pod_sandbox_id == p.id)
                        .map(|c| c.name.clone())
                        .collect::<std::collections::BTreeSet<_>>()
                        .into_iter()
                        .collect(),
                })
                .collect(),
            received_at: SystemTime::now(),
        }
    }
}
