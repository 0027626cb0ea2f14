//! NodeImage objects, built when read: each node (as `get nodes` shows it, inventory
//! included) with the ImagePullJobs that include it (`rigger_api::node_image`).

use std::collections::HashMap;
use std::time::SystemTime;

use rigger_api::image_pull_job::ImagePullJob;
use rigger_api::node::Node;
use rigger_api::node_image::node_image;
use rigger_proto::v1::Object;
use tonic::Status;

use super::{ControlService, ObjectName, store_status};

impl ControlService {
    /// Every node's NodeImage (or only `only`'s), sorted by node name, with its name.
    pub(super) async fn node_images(
        &self,
        only: Option<&str>,
    ) -> Result<Vec<(ObjectName, Object)>, Status> {
        let nodes: Vec<Node> = self
            .nodes
            .objects(SystemTime::now(), self.node_timeout)
            .into_iter()
            .filter(|n| only.is_none_or(|name| n["metadata"]["name"] == name))
            .filter_map(|n| serde_json::from_value(n).ok())
            .collect();
        if nodes.is_empty() {
            return Ok(Vec::new());
        }
        // Each job as `get` shows it: its status holds every node's entry.
        let mut jobs = Vec::new();
        for job in self
            .store
            .list_objects::<ImagePullJob>()
            .await
            .map_err(store_status)?
        {
            jobs.push(self.job_with_status(job).await?);
        }
        let mut by_node: HashMap<&str, Vec<_>> = HashMap::new();
        for job in &jobs {
            for entry in job.status.iter().flat_map(|s| &s.nodes) {
                by_node
                    .entry(entry.name.as_str())
                    .or_default()
                    .push((job, entry));
            }
        }
        let none = Vec::new();
        nodes
            .iter()
            .map(|node| {
                let pulls = by_node.get(node.metadata.name.as_str()).unwrap_or(&none);
                let image = node_image(node, pulls);
                let object = Object {
                    json: serde_json::to_string(&image)
                        .map_err(|e| Status::internal(e.to_string()))?,
                    revision: 0,
                };
                Ok(((String::new(), node.metadata.name.clone()), object))
            })
            .collect()
    }
}

/// In a cluster where Rigger runs alone, each node's NodeImage is written where Kruise's
/// users look for it (`kubectl get nodeimages`), in Kruise's shape: spec from the jobs
/// that include the node, status from its pulls. Compared with the cluster's copy (read
/// from the watch) and written only when it differs.
pub async fn write_in_cluster(control: &ControlService) -> Result<(), Status> {
    let store = &control.store;
    let current: HashMap<String, serde_json::Value> = store
        .list_as::<serde_json::Value>(rigger_api::node_image::KIND)
        .await
        .map_err(store_status)?
        .into_iter()
        .map(|stored| (stored.key.name, stored.value))
        .collect();
    let statuses: HashMap<String, serde_json::Value> = store
        .list_as::<serde_json::Value>(crate::node_images::STATUS_KIND)
        .await
        .map_err(store_status)?
        .into_iter()
        .map(|stored| (stored.key.name, stored.value))
        .collect();
    for ((_, name), object) in control.node_images(None).await? {
        let mut image: serde_json::Value =
            serde_json::from_str(&object.json).map_err(|e| Status::internal(e.to_string()))?;
        let status = image
            .as_object_mut()
            .and_then(|o| o.remove("status"))
            .unwrap_or_default();
        let key = crate::store::ObjectKey::new(rigger_api::node_image::KIND, "", &name);
        let held = current.get(&name);
        let same_spec = held.is_some_and(|held| {
            held["spec"] == image["spec"]
                && held["metadata"]["labels"] == image["metadata"]["labels"]
        });
        if !same_spec {
            let bytes = serde_json::to_vec(&image).map_err(|e| Status::internal(e.to_string()))?;
            store
                .put(key.clone(), bytes, crate::store::Precondition::Any)
                .await
                .map_err(store_status)?;
        }
        if statuses.get(&name) != Some(&status) {
            let key = crate::store::ObjectKey::new(crate::node_images::STATUS_KIND, "", &name);
            let bytes = serde_json::to_vec(&status).map_err(|e| Status::internal(e.to_string()))?;
            store
                .put(key, bytes, crate::store::Precondition::Any)
                .await
                .map_err(store_status)?;
        }
    }
    Ok(())
}

/// Run [`write_in_cluster`] every ten seconds until `token` is cancelled: NodeImages are
/// for people and Kruise's tools to read, and each pass may write one per node.
pub async fn keep_written(control: ControlService, token: tokio_util::sync::CancellationToken) {
    loop {
        if let Err(error) = write_in_cluster(&control).await {
            tracing::warn!(%error, "NodeImages: pass skipped");
        }
        tokio::select! {
            () = token.cancelled() => return,
            () = tokio::time::sleep(std::time::Duration::from_secs(10)) => {}
        }
    }
}
