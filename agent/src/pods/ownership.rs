//! Which sandboxes are the agent's own. Labels are not proof: on a node that also runs
//! kubelet, a tenant can put `rigger.dev/*` labels on a pod and kubelet copies them onto
//! its sandbox. A sandbox is the agent's only when all of this holds, and anything else
//! is left alone:
//!
//! - it is labelled as managed by Rigger for this node;
//! - it carries none of kubelet's labels (kubelet puts them on every sandbox it makes);
//! - its pod uid label is a uid (so it can name a directory) and equals the uid in the
//!   sandbox's own metadata;
//! - that uid is one this agent recorded before it created a sandbox for it.

use std::collections::{BTreeSet, HashMap};

use crate::labels;

/// Labels kubelet sets on the sandboxes it creates.
const KUBELET_LABELS: [&str; 3] = [
    labels::KUBELET_POD_UID,
    "io.kubernetes.pod.name",
    "io.kubernetes.pod.namespace",
];

/// Label keys a pod may not carry onto its sandbox: kubelet's and Rigger's own.
pub fn is_reserved_label(key: &str) -> bool {
    key.starts_with("io.kubernetes.") || key.starts_with("rigger.dev/")
}

/// What a sandbox is to this agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ownership {
    /// The agent's own, for this pod uid.
    Ours(String),
    /// Someone else's, and why it is not ours (for the warning).
    NotOurs(&'static str),
}

/// A pod uid as the controller makes them (and Kubernetes does): letters, digits and
/// `-`, at most 64. It can be joined into a path as one component and nothing else.
pub fn is_valid_uid(uid: &str) -> bool {
    !uid.is_empty()
        && uid.len() <= 64
        && uid.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

/// Judge a sandbox by its labels and metadata uid, for the agent of `node` that has
/// created sandboxes for the uids in `created`.
pub fn ownership(
    sandbox_labels: &HashMap<String, String>,
    metadata_uid: &str,
    node: &str,
    created: &BTreeSet<String>,
) -> Ownership {
    let label = |key: &str| sandbox_labels.get(key).map(String::as_str);
    if label(labels::MANAGED) != Some("true") || label(labels::NODE) != Some(node) {
        return Ownership::NotOurs("not labelled as this node's");
    }
    if KUBELET_LABELS
        .iter()
        .any(|k| sandbox_labels.contains_key(*k))
    {
        return Ownership::NotOurs("it carries kubelet's labels");
    }
    let Some(uid) = label(labels::POD_UID) else {
        return Ownership::NotOurs("it has no pod uid label");
    };
    if !is_valid_uid(uid) {
        return Ownership::NotOurs("its pod uid label is not a uid");
    }
    if uid != metadata_uid {
        return Ownership::NotOurs("its pod uid label differs from the sandbox's own uid");
    }
    if !created.contains(uid) {
        return Ownership::NotOurs("this agent never created a sandbox for its pod uid");
    }
    Ownership::Ours(uid.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "6f1c2e0a-1b2c-4d3e-8f40-0123456789ab";

    fn ours() -> HashMap<String, String> {
        [
            (labels::MANAGED, "true"),
            (labels::NODE, "n1"),
            (labels::POD_UID, UID),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
    }

    fn created() -> BTreeSet<String> {
        [UID.to_owned()].into()
    }

    #[test]
    fn the_agents_own_sandbox_is_ours() {
        assert_eq!(
            ownership(&ours(), UID, "n1", &created()),
            Ownership::Ours(UID.to_owned())
        );
    }

    #[test]
    fn labels_alone_prove_nothing() {
        let not_ours = |labels: HashMap<String, String>, metadata_uid: &str, node: &str| {
            matches!(
                ownership(&labels, metadata_uid, node, &created()),
                Ownership::NotOurs(_)
            )
        };
        // A kubelet pod a tenant labelled as Rigger's.
        let mut kubelet = ours();
        kubelet.insert(labels::KUBELET_POD_UID.to_owned(), UID.to_owned());
        assert!(not_ours(kubelet, UID, "n1"));
        // Another node's, or not managed.
        assert!(not_ours(ours(), UID, "n2"));
        let mut unmanaged = ours();
        unmanaged.insert(labels::MANAGED.to_owned(), "yes".to_owned());
        assert!(not_ours(unmanaged, UID, "n1"));
        // No uid, an empty one, one that is a path, one that differs from the metadata.
        for bad in ["", "..", "../pods", "a/b", &"x".repeat(65)] {
            let mut labels = ours();
            labels.insert(labels::POD_UID.to_owned(), bad.to_owned());
            assert!(not_ours(labels, bad, "n1"), "{bad:?}");
        }
        let mut missing = ours();
        missing.remove(labels::POD_UID);
        assert!(not_ours(missing, UID, "n1"));
        assert!(not_ours(ours(), "another-uid", "n1"));
        // A uid the agent never created a sandbox for.
        assert!(matches!(
            ownership(&ours(), UID, "n1", &BTreeSet::new()),
            Ownership::NotOurs(_)
        ));
    }

    #[test]
    fn pods_cannot_carry_reserved_labels_onto_their_sandbox() {
        assert!(is_reserved_label("io.kubernetes.pod.uid"));
        assert!(is_reserved_label("rigger.dev/pod-uid"));
        assert!(!is_reserved_label("app"));
    }
}
