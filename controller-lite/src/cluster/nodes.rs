//! In a cluster, the cluster's Nodes decide which labels a node has: an ImagePullJob's
//! `selector` matches what `kubectl label node` set, never what an agent says about
//! itself. One metadata-only watch on every Node (not one per node): the API server's
//! load does not grow with what the controller does.
//!
//! [`apply_event`] is the bookkeeping, pure; [`keep_loaded`] the watch around it.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::watcher::{self, Event};
use tokio_util::sync::CancellationToken;

use super::watched::{Relisted, follow};

/// Labels by node name.
pub type Labels = HashMap<String, BTreeMap<String, String>>;

/// What a watch is building: each node's labels.
pub type Tracked = Relisted<BTreeMap<String, String>>;

fn labels_of(node: &PartialObjectMeta<Node>) -> Option<(String, BTreeMap<String, String>)> {
    let name = node.metadata.name.clone()?;
    Some((name, node.metadata.labels.clone().unwrap_or_default()))
}

/// Take in one watch event; `true` when the labels changed and should be published.
pub fn apply_event(tracked: &mut Tracked, event: Event<PartialObjectMeta<Node>>) -> bool {
    tracked.apply(event, labels_of, |node| node.metadata.name.clone())
}

/// Watch the cluster's Nodes until `token` is cancelled, calling `publish` with every
/// node's labels whenever they change.
pub async fn keep_loaded(
    client: kube::Client,
    publish: impl Fn(Labels) + Send,
    token: CancellationToken,
) {
    // Metadata only: labels are all that is needed, not the Nodes' status.
    let api: Api<PartialObjectMeta<Node>> = Api::all(client);
    let mut tracked = Tracked::default();
    let take = |event| {
        if apply_event(&mut tracked, event) {
            publish(tracked.current.clone());
        }
    };
    follow(
        watcher::watcher(api, watcher::Config::default()),
        "Nodes",
        take,
        token,
    )
    .await;
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn node(name: &str, labels: &[(&str, &str)]) -> PartialObjectMeta<Node> {
        PartialObjectMeta {
            types: None,
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                        .collect(),
                ),
                ..ObjectMeta::default()
            },
            _phantom: std::marker::PhantomData,
        }
    }

    #[test]
    fn a_relisting_replaces_what_was_known_and_changes_are_published_once() {
        let mut tracked = Tracked::default();
        assert!(!apply_event(&mut tracked, Event::Init));
        assert!(!apply_event(
            &mut tracked,
            Event::InitApply(node("a", &[("zone", "1")]))
        ));
        assert!(!apply_event(&mut tracked, Event::InitApply(node("b", &[]))));
        assert!(apply_event(&mut tracked, Event::InitDone));
        assert_eq!(tracked.current.len(), 2);
        assert!(
            !apply_event(&mut tracked, Event::Apply(node("a", &[("zone", "1")]))),
            "unchanged"
        );
        assert!(apply_event(
            &mut tracked,
            Event::Apply(node("a", &[("zone", "2")]))
        ));
        assert_eq!(tracked.current["a"]["zone"], "2");
        assert!(apply_event(&mut tracked, Event::Delete(node("b", &[]))));
        // The watch restarts; "a" is gone meanwhile.
        apply_event(&mut tracked, Event::Init);
        apply_event(&mut tracked, Event::InitApply(node("c", &[])));
        assert!(apply_event(&mut tracked, Event::InitDone));
        assert_eq!(tracked.current.keys().collect::<Vec<_>>(), ["c"]);
    }
}
