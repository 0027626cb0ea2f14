//! NodeImage objects, built when read: each node (as `get nodes` shows it, inventory
//! included) with the ImagePullJobs that include it (`rigger_api::node_image`).

use std::collections::{HashMap, HashSet};
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

/// The cluster's NodeImages and their statuses as last read, by name, with their
/// revisions: a pass decodes only those that changed since (with 5,000 nodes, decoding
/// every one of both every ten seconds was the largest share of the leader's CPU beside
/// the pods, `perf` found).
#[derive(Debug, Default)]
pub struct ClusterCopies {
    images: HashMap<String, (u64, serde_json::Value)>,
    statuses: HashMap<String, (u64, serde_json::Value)>,
}

/// Bring `held` up to the store's objects of `kind`: the changed ones decoded again,
/// the gone ones dropped.
async fn refresh(
    store: &rigger_store::Store,
    kind: &str,
    held: &mut HashMap<String, (u64, serde_json::Value)>,
) -> Result<(), Status> {
    let listing = {
        let known = |key: &rigger_store::ObjectKey, revision: u64| {
            held.get(&key.name).is_some_and(|(at, _)| *at == revision)
        };
        store
            .list_changed(kind, &known)
            .await
            .map_err(store_status)?
    };
    let present: HashSet<&str> = listing
        .present
        .iter()
        .map(|(key, _)| key.name.as_str())
        .collect();
    held.retain(|name, _| present.contains(name.as_str()));
    for stored in listing.changed {
        let key = stored.key.clone();
        match rigger_store::typed::decode::<serde_json::Value>(stored) {
            Ok(read) => {
                held.insert(key.name, (read.revision, read.value));
            }
            Err(error) => {
                tracing::warn!(%key, %error, "a stored object does not decode; left out");
                held.remove(&key.name);
            }
        }
    }
    Ok(())
}

/// In a cluster where Rigger runs alone, each node's NodeImage is written where Kruise's
/// users look for it (`kubectl get nodeimages`), in Kruise's shape: spec from the jobs
/// that include the node, status from its pulls. Compared with the cluster's copy (read
/// from the watch, `copies` kept between passes) and written only when it differs.
pub async fn write_in_cluster(
    control: &ControlService,
    copies: &mut ClusterCopies,
) -> Result<(), Status> {
    let store = &control.store;
    refresh(store, rigger_api::node_image::KIND, &mut copies.images).await?;
    refresh(
        store,
        crate::engines::node_images::STATUS_KIND,
        &mut copies.statuses,
    )
    .await?;
    let (current, statuses) = (&copies.images, &copies.statuses);
    for ((_, name), object) in control.node_images(None).await? {
        let mut image: serde_json::Value =
            serde_json::from_str(&object.json).map_err(|e| Status::internal(e.to_string()))?;
        let status = image
            .as_object_mut()
            .and_then(|o| o.remove("status"))
            .unwrap_or_default();
        let key = rigger_store::ObjectKey::new(rigger_api::node_image::KIND, "", &name);
        let held = current.get(&name);
        let same_spec = held.is_some_and(|(_, held)| {
            held["spec"] == image["spec"]
                && held["metadata"]["labels"] == image["metadata"]["labels"]
        });
        if !same_spec {
            let (object, at) = node_image_update(held, image);
            let bytes = serde_json::to_vec(&object).map_err(|e| Status::internal(e.to_string()))?;
            match store.put(key.clone(), bytes, at).await {
                Ok(_) => {}
                // Changed meanwhile (a user's annotation, say): written over it next pass.
                Err(rigger_store::StoreError::Conflict { .. }) => continue,
                Err(error) => return Err(store_status(error)),
            }
        }
        if statuses.get(&name).map(|(_, held)| held) != Some(&status) {
            let key =
                rigger_store::ObjectKey::new(crate::engines::node_images::STATUS_KIND, "", &name);
            let bytes = serde_json::to_vec(&status).map_err(|e| Status::internal(e.to_string()))?;
            store
                .put(key, bytes, rigger_store::Precondition::Any)
                .await
                .map_err(store_status)?;
        }
    }
    Ok(())
}

/// The NodeImage to write for `rendered` (its spec, and its Node's labels as Kruise's
/// manager copies them) over the one stored, if any, and at which revision: everything
/// else of the stored one (annotations, finalizers, owner references a user or another
/// controller wrote) is kept, and a write over a version changed meanwhile is refused.
fn node_image_update(
    stored: Option<&(u64, serde_json::Value)>,
    rendered: serde_json::Value,
) -> (serde_json::Value, rigger_store::Precondition) {
    let Some((revision, stored)) = stored else {
        return (rendered, rigger_store::Precondition::Absent);
    };
    let at = rigger_store::Precondition::Revision(*revision);
    if !stored["metadata"].is_object() {
        // Not an object Rigger can keep parts of (indexing would panic): written whole.
        return (rendered, at);
    }
    let mut object = stored.clone();
    object["spec"] = rendered["spec"].clone();
    match rendered["metadata"].get("labels") {
        Some(labels) => object["metadata"]["labels"] = labels.clone(),
        None => {
            if let Some(metadata) = object["metadata"].as_object_mut() {
                metadata.remove("labels");
            }
        }
    }
    (object, at)
}

/// Run [`write_in_cluster`] every ten seconds until `token` is cancelled: NodeImages are
/// for people and Kruise's tools to read, and each pass may write one per node.
pub async fn keep_written(control: ControlService, token: tokio_util::sync::CancellationToken) {
    let mut copies = ClusterCopies::default();
    loop {
        if let Err(error) = write_in_cluster(&control, &mut copies).await {
            tracing::warn!(%error, "NodeImages: pass skipped");
        }
        tokio::select! {
            () = token.cancelled() => return,
            () = tokio::time::sleep(std::time::Duration::from_secs(10)) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use rigger_store::Precondition;

    #[tokio::test]
    async fn copies_are_read_again_only_where_the_store_changed() {
        let dir = tempfile::tempdir().unwrap();
        let store =
            rigger_store::Store::new(rigger_store::EmbeddedStore::open(dir.path()).unwrap());
        let kind = rigger_api::node_image::KIND;
        let key = |name: &str| rigger_store::ObjectKey::new(kind, "", name);
        for name in ["n1", "n2"] {
            let body = serde_json::json!({"metadata": {"name": name}});
            store
                .put(key(name), body.to_string().into_bytes(), Precondition::Any)
                .await
                .unwrap();
        }
        let mut held = HashMap::new();
        refresh(&store, kind, &mut held).await.unwrap();
        assert_eq!(held.len(), 2);
        // What this copy holds is what a pass compares with: a change in the store (and
        // nothing else) replaces it.
        held.get_mut("n1").unwrap().1 = serde_json::json!("kept");
        let changed = serde_json::json!({"metadata": {"name": "n2", "labels": {"a": "b"}}});
        store
            .put(
                key("n2"),
                changed.to_string().into_bytes(),
                Precondition::Any,
            )
            .await
            .unwrap();
        refresh(&store, kind, &mut held).await.unwrap();
        assert_eq!(held["n1"].1, serde_json::json!("kept"), "not read again");
        assert_eq!(held["n2"].1, changed);
        store.delete(key("n1"), Precondition::Any).await.unwrap();
        refresh(&store, kind, &mut held).await.unwrap();
        assert_eq!(held.keys().collect::<Vec<_>>(), ["n2"]);
    }

    #[test]
    fn a_node_image_update_keeps_what_others_wrote_and_is_conditional() {
        let rendered = serde_json::json!({
            "apiVersion": "apps.kruise.io/v1alpha1", "kind": "NodeImage",
            "metadata": {"name": "n1", "labels": {"zone": "b"}},
            "spec": {"images": {"web": {"tags": [{"tag": "2"}]}}},
        });
        let stored = serde_json::json!({
            "apiVersion": "apps.kruise.io/v1alpha1", "kind": "NodeImage",
            "metadata": {
                "name": "n1", "labels": {"zone": "a"},
                "annotations": {"team": "platform"}, "finalizers": ["example.com/audit"],
            },
            "spec": {"images": {"web": {"tags": [{"tag": "1"}]}}},
        });
        let (object, at) = node_image_update(Some(&(7, stored)), rendered.clone());
        assert_eq!(at, Precondition::Revision(7));
        assert_eq!(object["spec"], rendered["spec"]);
        assert_eq!(
            object["metadata"]["labels"],
            serde_json::json!({"zone": "b"})
        );
        assert_eq!(object["metadata"]["annotations"]["team"], "platform");
        assert_eq!(object["metadata"]["finalizers"][0], "example.com/audit");

        // None yet: created, only if still none.
        let (object, at) = node_image_update(None, rendered.clone());
        assert_eq!((object, at), (rendered.clone(), Precondition::Absent));
        // A stored one Rigger cannot read parts of is written whole, still conditionally.
        let (object, at) =
            node_image_update(Some(&(3, serde_json::json!("garbage"))), rendered.clone());
        assert_eq!((object, at), (rendered, Precondition::Revision(3)));
    }
}
