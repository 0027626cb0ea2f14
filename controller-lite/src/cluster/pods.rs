//! The cluster's Pods, asked one at a time (a request's pod, when the request is new):
//! [`ClusterPods`] on kube's client.

use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;

use crate::recreate_requests::{ClusterPods, PodFacts};

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
