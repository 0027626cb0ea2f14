//! Node labels, and whom selectors believe. An agent reports labels about its own node
//! (`--node-labels`), but a node is outside input: a compromised one could claim labels
//! that draw other workloads' pods and pull secrets to it. So, as Kubernetes'
//! NodeRestriction does:
//!
//! - labels an admin sets (`riggerctl label node NAME k=v`) are stored in the controller
//!   and win over what the agent says;
//! - an agent may not report a label under a reserved prefix ([`reserved`]): those are
//!   the admin's alone, for fencing workloads onto nodes;
//! - anything that carries credentials (a job with pull secrets, a pod with image pull
//!   secrets) chooses nodes by name or by admin-set labels only. In a cluster the Nodes'
//!   labels are the admin's, but a kubelet may set most labels of its own Node: there,
//!   only labels under `node-restriction.kubernetes.io/` ([`kept_from_kubelets`]), which
//!   the API server's NodeRestriction keeps from kubelets, choose nodes for credentials.
//!
//! The decisions here are pure; [`load`], [`save`] and [`keep_loaded`] are the store edge.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use rigger_store::{ObjectKey, Precondition, Store, StoreError};

/// The store kind of the labels an admin set on a node.
pub const KIND: &str = "Node.labels";
/// How often a controller reads admin labels again (another replica may have led when
/// they were set); the leader also takes its own changes at once.
const RELOAD: Duration = Duration::from_secs(5);

/// Whether a Node label `key` is one the API server's NodeRestriction admission keeps a
/// node's own kubelet from setting or changing: under `node-restriction.kubernetes.io/`
/// (or a subdomain of it), as Kubernetes documents for isolating workloads.
pub fn kept_from_kubelets(key: &str) -> bool {
    key.rsplit_once('/').is_some_and(|(prefix, _)| {
        prefix == "node-restriction.kubernetes.io"
            || prefix.ends_with(".node-restriction.kubernetes.io")
    })
}

/// Label prefixes only an admin may set. `node-restriction.kubernetes.io/` is
/// Kubernetes' own; `rigger.dev` (and its subdomains, such as
/// `node-restriction.rigger.dev`) is Rigger's.
pub fn reserved(key: &str) -> bool {
    let Some((prefix, _)) = key.rsplit_once('/') else {
        return false;
    };
    prefix == "rigger.dev"
        || prefix.ends_with(".rigger.dev")
        || prefix == "node-restriction.kubernetes.io"
}

/// An agent's labels as the controller takes them: the reserved ones dropped (their
/// keys returned, for the node's status and a warning).
pub fn take_reported(
    reported: impl IntoIterator<Item = (String, String)>,
) -> (BTreeMap<String, String>, Vec<String>) {
    let mut taken = BTreeMap::new();
    let mut refused = Vec::new();
    for (key, value) in reported {
        if reserved(&key) {
            refused.push(key);
        } else {
            taken.insert(key, value);
        }
    }
    (taken, refused)
}

/// The labels selectors see on a node: the agent's, overlaid by the admin's.
pub fn merged<'a>(
    reported: impl IntoIterator<Item = (&'a str, &'a str)>,
    admin: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut labels: BTreeMap<String, String> = reported
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    labels.extend(admin.iter().map(|(k, v)| (k.clone(), v.clone())));
    labels
}

/// A `riggerctl label` request: labels to set and keys to remove.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelChange {
    pub set: BTreeMap<String, String>,
    pub remove: Vec<String>,
    /// Replace a value that is already there (kubectl's `--overwrite`).
    pub overwrite: bool,
}

/// The admin labels after `change`, or why it is refused (kubectl's rules: a key with a
/// value keeps it unless `overwrite`; keys and values as Kubernetes allows them).
pub fn edit(
    node: &str,
    current: &BTreeMap<String, String>,
    change: &LabelChange,
) -> Result<BTreeMap<String, String>, String> {
    let mut labels = current.clone();
    for (key, value) in &change.set {
        rigger_api::check_label_key(key).map_err(|reason| format!("node {node}: {reason}"))?;
        if !rigger_api::check_label_value(value) {
            return Err(format!(
                "node {node}: label {key:?}: {value:?} is not a valid label value (at most 63 of letters, digits, '-', '_' and '.', alphanumeric at both ends)"
            ));
        }
        if let Some(old) = labels.get(key)
            && old != value
            && !change.overwrite
        {
            return Err(format!(
                "node {node}: label {key:?} already has a value ({old}), and --overwrite is false"
            ));
        }
        labels.insert(key.clone(), value.clone());
    }
    for key in &change.remove {
        if change.set.contains_key(key) {
            return Err(format!(
                "node {node}: label {key:?} is both set and removed"
            ));
        }
        labels.remove(key);
    }
    Ok(labels)
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Stored {
    labels: BTreeMap<String, String>,
}

fn key(node: &str) -> ObjectKey {
    ObjectKey::new(KIND, "", node)
}

/// Every node's admin labels.
pub async fn load(store: &Store) -> Result<HashMap<String, BTreeMap<String, String>>, StoreError> {
    let mut all = HashMap::new();
    for stored in store.list(KIND).await? {
        let node = stored.key.name.clone();
        match rigger_store::typed::decode::<Stored>(stored) {
            Ok(labels) => {
                all.insert(node, labels.value.labels);
            }
            // Not dropped silently: until fixed, selectors that need the admin's labels
            // do not choose this node, which is the safe side.
            Err(error) => {
                tracing::warn!(%node, %error, "stored node labels unreadable; the node has no admin labels until they are set again")
            }
        }
    }
    Ok(all)
}

/// Store `node`'s admin labels, conditional on the revision they were read at (two
/// admins labelling at once do not undo each other). Returns the new labels.
pub async fn save(
    store: &Store,
    node: &str,
    change: &LabelChange,
) -> Result<Result<BTreeMap<String, String>, String>, StoreError> {
    let stored = store.get(key(node)).await?;
    let precondition = stored
        .as_ref()
        .map_or(Precondition::Absent, |s| Precondition::Revision(s.revision));
    // Unreadable labels are replaced (conditionally on their revision all the same).
    let current = stored
        .and_then(|s| rigger_store::typed::decode::<Stored>(s).ok())
        .map(|s| s.value.labels)
        .unwrap_or_default();
    let labels = match edit(node, &current, change) {
        Ok(labels) => labels,
        Err(reason) => return Ok(Err(reason)),
    };
    if labels.is_empty() {
        match store.delete(key(node), precondition).await {
            Ok(()) | Err(StoreError::NotFound { .. }) => {}
            Err(e) => return Err(e),
        }
    } else {
        let document = serde_json::to_vec(&Stored {
            labels: labels.clone(),
        })
        .map_err(|e| StoreError::Backend {
            location: key(node).to_string(),
            detail: format!("cannot encode: {e}"),
        })?;
        store.put(key(node), document, precondition).await?;
    }
    Ok(Ok(labels))
}

/// Hand every node's admin labels, as the store has them, to `take` now and then, until
/// `token` is cancelled.
pub async fn keep_loaded(
    store: Store,
    take: impl Fn(HashMap<String, BTreeMap<String, String>>),
    token: CancellationToken,
) {
    loop {
        match load(&store).await {
            Ok(all) => take(all),
            Err(error) => {
                tracing::warn!(%error, "cannot read node labels; keeping the last ones read")
            }
        }
        tokio::select! {
            () = token.cancelled() => return,
            () = tokio::time::sleep(RELOAD) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_node_restriction_labels_are_kept_from_kubelets() {
        assert!(kept_from_kubelets("node-restriction.kubernetes.io/pool"));
        assert!(kept_from_kubelets(
            "team.node-restriction.kubernetes.io/pool"
        ));
        for key in [
            "pool",
            "rigger.dev/pool",
            "kubernetes.io/hostname",
            "x-node-restriction.kubernetes.io/a",
        ] {
            assert!(!kept_from_kubelets(key), "{key}");
        }
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn agents_cannot_report_reserved_labels() {
        let (taken, refused) = take_reported(labels(&[
            ("zone", "a"),
            ("rigger.dev/team", "payments"),
            ("node-restriction.rigger.dev/team", "payments"),
            ("node-restriction.kubernetes.io/pool", "gpu"),
            ("notrigger.dev/x", "y"),
            ("example.com/rigger.dev", "y"),
        ]));
        assert_eq!(
            taken,
            labels(&[
                ("zone", "a"),
                ("notrigger.dev/x", "y"),
                ("example.com/rigger.dev", "y")
            ])
        );
        assert_eq!(refused.len(), 3, "{refused:?}");
    }

    #[test]
    fn admin_labels_win_over_reported_ones() {
        let seen = merged([("zone", "a"), ("disk", "ssd")], &labels(&[("zone", "b")]));
        assert_eq!(seen, labels(&[("disk", "ssd"), ("zone", "b")]));
    }

    #[test]
    fn labels_are_edited_as_kubectl_does() {
        let current = labels(&[("team", "a")]);
        let set = |k: &str, v: &str, overwrite| LabelChange {
            set: labels(&[(k, v)]),
            remove: Vec::new(),
            overwrite,
        };
        let refused = edit("n1", &current, &set("team", "b", false)).unwrap_err();
        assert!(refused.contains("already has a value (a)"), "{refused}");
        assert_eq!(
            edit("n1", &current, &set("team", "b", true)).unwrap(),
            labels(&[("team", "b")])
        );
        assert_eq!(
            edit("n1", &current, &set("team", "a", false)).unwrap(),
            current
        );
        let removed = LabelChange {
            remove: vec!["team".to_owned()],
            ..LabelChange::default()
        };
        assert!(edit("n1", &current, &removed).unwrap().is_empty());
        let bad_key = edit("n1", &current, &set("-x", "1", false)).unwrap_err();
        assert!(bad_key.contains("not a valid label key"), "{bad_key}");
        let bad_value = edit("n1", &current, &set("x", "a b", false)).unwrap_err();
        assert!(bad_value.contains("not a valid label value"), "{bad_value}");
    }

    #[tokio::test]
    async fn saved_labels_load_and_an_emptied_set_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(rigger_store::EmbeddedStore::open(dir.path()).unwrap());
        let change = LabelChange {
            set: labels(&[("node-restriction.rigger.dev/team", "payments")]),
            ..LabelChange::default()
        };
        save(&store, "n1", &change).await.unwrap().unwrap();
        let all = load(&store).await.unwrap();
        assert_eq!(all["n1"], change.set);
        let remove = LabelChange {
            remove: vec!["node-restriction.rigger.dev/team".to_owned()],
            ..LabelChange::default()
        };
        save(&store, "n1", &remove).await.unwrap().unwrap();
        assert!(load(&store).await.unwrap().is_empty());
    }
}
