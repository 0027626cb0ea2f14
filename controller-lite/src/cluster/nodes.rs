//! In a cluster, the cluster's Nodes decide which labels a node has: an ImagePullJob's
//! `selector` matches what `kubectl label node` set, never what an agent says about
//! itself. One metadata-only watch on every Node (not one per node): the API server's
//! load does not grow with what the controller does.
//!
//! [`apply_event`] is the bookkeeping, pure; [`keep_loaded`] the watch around it.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::watcher::{self, Event};
use tokio_util::sync::CancellationToken;

/// Labels by node name.
pub type Labels = HashMap<String, BTreeMap<String, String>>;

/// What a watch is building: the labels known, and those being listed after a restart.
#[derive(Debug, Default)]
pub struct Tracked {
    pub labels: Labels,
    listing: Option<Labels>,
}

fn labels_of(node: &PartialObjectMeta<Node>) -> Option<(String, BTreeMap<String, String>)> {
    let name = node.metadata.name.clone()?;
    Some((name, node.metadata.labels.clone().unwrap_or_default()))
}

/// Take in one watch event; `true` when the labels changed and should be published.
pub fn apply_event(tracked: &mut Tracked, event: Event<PartialObjectMeta<Node>>) -> bool {
    match event {
        Event::Init => {
            tracked.listing = Some(Labels::new());
            false
        }
        Event::InitApply(node) => {
            if let (Some(listing), Some((name, labels))) = (&mut tracked.listing, labels_of(&node))
            {
                listing.insert(name, labels);
            }
            false
        }
        Event::InitDone => {
            // A restarted watch lists everything again: nodes not listed are gone.
            tracked.labels = tracked.listing.take().unwrap_or_default();
            true
        }
        Event::Apply(node) => match labels_of(&node) {
            Some((name, labels)) => tracked.labels.insert(name, labels.clone()) != Some(labels),
            None => false,
        },
        Event::Delete(node) => match node.metadata.name {
            Some(name) => tracked.labels.remove(&name).is_some(),
            None => false,
        },
    }
}

/// Watch the cluster's Nodes until `token` is cancelled, calling `publish` with every
/// node's labels whenever they change. A broken watch is retried (watcher's backoff).
pub async fn keep_loaded(
    client: kube::Client,
    publish: impl Fn(Labels) + Send,
    token: CancellationToken,
) {
    // Metadata only: labels are all that is needed, not the Nodes' status.
    let api: Api<PartialObjectMeta<Node>> = Api::all(client);
    let stream = watcher::watcher(api, watcher::Config::default());
    futures::pin_mut!(stream);
    let mut tracked = Tracked::default();
    loop {
        let event = tokio::select! {
            () = token.cancelled() => return,
            event = stream.next() => event,
        };
        match event {
            Some(Ok(event)) => {
                if apply_event(&mut tracked, event) {
                    publish(tracked.labels.clone());
                }
            }
            Some(Err(error)) => {
                tracing::warn!(%error, "watching the cluster's Nodes; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            None => return,
        }
    }
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
        assert_eq!(tracked.labels.len(), 2);
        assert!(
            !apply_event(&mut tracked, Event::Apply(node("a", &[("zone", "1")]))),
            "unchanged"
        );
        assert!(apply_event(
            &mut tracked,
            Event::Apply(node("a", &[("zone", "2")]))
        ));
        assert_eq!(tracked.labels["a"]["zone"], "2");
        assert!(apply_event(&mut tracked, Event::Delete(node("b", &[]))));
        // The watch restarts; "a" is gone meanwhile.
        apply_event(&mut tracked, Event::Init);
        apply_event(&mut tracked, Event::InitApply(node("c", &[])));
        assert!(apply_event(&mut tracked, Event::InitDone));
        assert_eq!(tracked.labels.keys().collect::<Vec<_>>(), ["c"]);
    }
}
