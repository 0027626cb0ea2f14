//! The cluster's Pods: asked one at a time for a recreate request's pod
//! ([`ClusterPods`] on kube's client), and watched for where they run (a job's
//! `podSelector`, [`keep_placed`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::watcher::{self, Event};
use tokio_util::sync::CancellationToken;

use super::watched::{Relisted, Step, follow_gathering};

/// What the cluster says about a pod.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodFacts {
    pub uid: String,
    /// `spec.nodeName` (`None`: not scheduled yet).
    pub node: Option<String>,
    /// `status.containerStatuses`: name, container ID (`containerd://…`), restarts.
    pub containers: Vec<(String, String, u32)>,
}

/// Where pods are, in a cluster: the one question a recreate request's admission asks
/// of it (a fake in the engine's tests).
#[async_trait::async_trait]
pub trait ClusterPods: std::fmt::Debug + Send + Sync + 'static {
    /// The pod `name` in `namespace` (`None`: there is none).
    async fn pod(&self, namespace: &str, name: &str) -> Result<Option<PodFacts>, String>;
}

/// Pods read from the API server.
#[derive(Clone)]
pub struct KubePods {
    client: kube::Client,
}

impl KubePods {
    pub fn new(client: kube::Client) -> Self {
        Self { client }
    }
}

impl std::fmt::Debug for KubePods {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KubePods")
    }
}

/// What a Pod says about itself that a request needs.
pub fn facts_of(pod: &Pod) -> PodFacts {
    let containers = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .map(|statuses| {
            statuses
                .iter()
                .map(|c| {
                    (
                        c.name.clone(),
                        c.container_id.clone().unwrap_or_default(),
                        u32::try_from(c.restart_count).unwrap_or(0),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    PodFacts {
        uid: pod.metadata.uid.clone().unwrap_or_default(),
        node: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
        containers,
    }
}

#[async_trait::async_trait]
impl ClusterPods for KubePods {
    async fn pod(&self, namespace: &str, name: &str) -> Result<Option<PodFacts>, String> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        api.get_opt(name)
            .await
            .map(|pod| pod.as_ref().map(facts_of))
            .map_err(|e| format!("pod {namespace}/{name}: {e}"))
    }
}

/// Where each scheduled Pod runs, with its namespace and labels: an ImagePullJob's
/// `podSelector` picks the nodes of the cluster's Pods (one watch on every Pod).
#[derive(Debug, Default)]
pub struct PodPlaces {
    /// By uid.
    pods: Relisted<Place>,
}

/// Where a Pod runs: its node, namespace and labels (shared with each published view:
/// a view copies no pod's labels).
type Place = (String, Arc<str>, Arc<BTreeMap<String, String>>);

pub use crate::fleet::nodes::PodsByNode;

fn place_of(pod: &Pod) -> Option<(String, Place)> {
    let uid = pod.metadata.uid.clone()?;
    let node = pod
        .spec
        .as_ref()?
        .node_name
        .clone()
        .filter(|n| !n.is_empty())?;
    let namespace: Arc<str> = pod.metadata.namespace.as_deref().unwrap_or_default().into();
    let labels = Arc::new(pod.metadata.labels.clone().unwrap_or_default());
    Some((uid, (node, namespace, labels)))
}

impl PodPlaces {
    /// Take in one watch event; `true` when what jobs see changed. A Pod no longer
    /// scheduled is forgotten.
    pub fn apply(&mut self, event: Event<Pod>) -> bool {
        self.pods
            .apply(event, place_of, |pod| pod.metadata.uid.clone())
    }

    pub fn by_node(&self) -> PodsByNode {
        let mut out = PodsByNode::new();
        for (node, namespace, labels) in self.pods.current.values() {
            out.entry(node.clone())
                .or_default()
                .push((namespace.clone(), labels.clone()));
        }
        out
    }
}

/// How often the Pods' places are published when they changed: a job's `podSelector`
/// sees a pod that half a second late, and the view (every pod's labels) is rebuilt at
/// most twice a second whatever the cluster's rate of change.
const PUBLISH_EVERY: std::time::Duration = std::time::Duration::from_millis(500);

/// Watch every Pod until `token` is cancelled, publishing the pods by node when they
/// changed, every [`PUBLISH_EVERY`]; every event is shown to `also` first (the pods
/// SidecarSets were injected into are kept from the same watch: one watch on Pods,
/// whoever reads them).
pub async fn keep_placed(
    client: kube::Client,
    publish: impl Fn(PodsByNode) + Send,
    also: impl Fn(&Event<Pod>) + Send,
    token: CancellationToken,
) {
    let api: Api<Pod> = Api::all(client);
    let mut places = PodPlaces::default();
    let mut changed = false;
    let take = |step: Step<Event<Pod>>| match step {
        Step::Event(event) => {
            also(&event);
            changed |= places.apply(event);
        }
        Step::Publish => {
            if std::mem::take(&mut changed) {
                publish(places.by_node());
            }
        }
    };
    follow_gathering(
        watcher::watcher(api, watcher::Config::default()),
        "Pods",
        Some(PUBLISH_EVERY),
        take,
        token,
    )
    .await;
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn pod(uid: &str, node: Option<&str>, app: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"uid": uid, "namespace": "shop", "name": uid, "labels": {"app": app}},
            "spec": {"nodeName": node, "containers": []},
        }))
        .unwrap()
    }

    #[test]
    fn scheduled_pods_are_placed_by_node_and_follow_moves_and_deletions() {
        let mut places = PodPlaces::default();
        places.apply(Event::Init);
        places.apply(Event::InitApply(pod("a", Some("n1"), "web")));
        places.apply(Event::InitApply(pod("b", None, "web")));
        assert!(places.apply(Event::InitDone));
        assert_eq!(places.by_node()["n1"].len(), 1);
        assert!(
            !places.apply(Event::Apply(pod("a", Some("n1"), "web"))),
            "unchanged"
        );
        assert!(
            places.apply(Event::Apply(pod("b", Some("n2"), "web"))),
            "scheduled"
        );
        assert!(places.apply(Event::Delete(pod("a", Some("n1"), "web"))));
        let by_node = places.by_node();
        assert!(!by_node.contains_key("n1"));
        assert_eq!(by_node["n2"][0].1["app"], "web");
        assert_eq!(&*by_node["n2"][0].0, "shop");
    }
}
