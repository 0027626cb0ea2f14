//! Where a store key lives on a Kubernetes API server, and how objects cross between
//! Rigger's shapes and the API server's. Pure: no client, tested without a server.
//!
//! - A kind with a CRD (ImagePullJob, ContainerRecreateRequest, …) is that custom
//!   resource, at the version the CRD stores; `<Kind>.status` is its status
//!   subresource, so `kubectl get` shows the status the engines write, in Kruise's fields.
//! - A Secret is the cluster's Secret (jobs' `pullSecrets` name the cluster's).
//! - Every other record (per-node job shards, node labels, SidecarSet histories, …) is a
//!   `ControllerRecord` in the controller's namespace: the controller's own bookkeeping,
//!   which users never apply.

use rigger_api::crd::{RECORD_KIND, plural};
use rigger_api::kind::RIGGER_GROUP;
use rigger_api::kinds::Kind;
use serde_json::{Map, Value, json};
use sha2::{Digest as _, Sha256};

use crate::ObjectKey;

/// The label a record carries with its store kind: records are listed by it.
pub const RECORD_KIND_LABEL: &str = "rigger.dev/record-kind";
/// The suffix of a store kind that is another kind's status.
const STATUS_SUFFIX: &str = ".status";

/// A resource on the API server: what a client needs to address it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resource {
    pub group: &'static str,
    pub version: &'static str,
    pub kind: &'static str,
    pub plural: String,
    pub namespaced: bool,
}

impl Resource {
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_owned()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }
}

/// Where a key lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// The object itself (a custom resource, or the cluster's Secret).
    Object(Resource),
    /// The status subresource of the object of the same namespace and name.
    Status(Resource),
    /// A `ControllerRecord`.
    Record,
}

/// Where objects of store kind `kind` live.
pub fn route(kind: &str) -> Route {
    if let Some(owner) = kind.strip_suffix(STATUS_SUFFIX) {
        if let Some(resource) = custom_resource(owner) {
            return Route::Status(resource);
        }
        return Route::Record;
    }
    if kind == rigger_api::secret::KIND {
        return Route::Object(Resource {
            group: "",
            version: "v1",
            kind: rigger_api::secret::KIND,
            plural: "secrets".into(),
            namespaced: true,
        });
    }
    custom_resource(kind).map_or(Route::Record, Route::Object)
}

/// The custom resource of a Rigger kind that has a CRD.
fn custom_resource(kind: &str) -> Option<Resource> {
    let info = Kind::from_name(kind)?.info();
    let crd = info.crd?;
    Some(Resource {
        group: crd.group,
        version: crd.storage_version(),
        kind: info.name,
        plural: plural(info),
        namespaced: info.namespaced,
    })
}

/// The `ControllerRecord` resource.
pub fn record_resource() -> Resource {
    Resource {
        group: RIGGER_GROUP,
        version: "v1alpha1",
        kind: RECORD_KIND,
        plural: "controllerrecords".into(),
        namespaced: true,
    }
}

/// A record's object name: a digest of its key (keys hold characters names may not,
/// and may be longer), so any key has exactly one name.
pub fn record_name(key: &ObjectKey) -> String {
    let digest = Sha256::digest(key.encode().as_bytes());
    format!("r-{}", &hex::encode(digest)[..40])
}

/// A record as the API server keeps it.
pub fn record_object(key: &ObjectKey, namespace: &str, object: &Value) -> Value {
    json!({
        "apiVersion": record_resource().api_version(),
        "kind": RECORD_KIND,
        "metadata": {
            "name": record_name(key),
            "namespace": namespace,
            "labels": {RECORD_KIND_LABEL: label_value(&key.kind)},
        },
        "spec": {
            "kind": key.kind,
            "namespace": key.namespace,
            "name": key.name,
            "object": object,
        },
    })
}

/// A store kind as a label value (at most 63 characters of `[A-Za-z0-9._-]`).
pub fn label_value(kind: &str) -> String {
    let cleaned: String = kind
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    if cleaned.len() <= 63 && cleaned == kind {
        return cleaned;
    }
    // Never a store kind today; kept unique rather than truncated into another's.
    let digest = hex::encode(Sha256::digest(kind.as_bytes()));
    format!("k-{}", &digest[..40])
}

/// The key and the object a record holds, checked against the key it was read for.
pub fn record_contents(record: &Value) -> Option<(ObjectKey, Value)> {
    let spec = record.get("spec")?;
    let text = |field: &str| spec.get(field).and_then(Value::as_str).map(str::to_owned);
    let key = ObjectKey {
        kind: text("kind")?,
        namespace: text("namespace")?,
        name: text("name")?,
    };
    Some((key, spec.get("object")?.clone()))
}

/// The metadata fields Rigger's objects carry (its `ObjectMeta`; owners and finalizers
/// too, so that a write of an object keeps them); the API server's own
/// (resourceVersion, managedFields, …) stay on the server.
const RIGGER_METADATA: [&str; 11] = [
    "name",
    "namespace",
    "labels",
    "annotations",
    "uid",
    "creationTimestamp",
    "generation",
    "generateName",
    "finalizers",
    "ownerReferences",
    "deletionTimestamp",
];

/// An object read from the API server in the shape Rigger's types decode: metadata
/// reduced to Rigger's fields, status left out (a kind's status is its own store key).
pub fn from_server(mut object: Value) -> Value {
    if let Some(map) = object.as_object_mut() {
        map.remove("status");
        if let Some(Value::Object(metadata)) = map.get_mut("metadata") {
            metadata.retain(|field, _| RIGGER_METADATA.contains(&field.as_str()));
        }
    }
    object
}

/// An object Rigger writes, as the API server takes it at `resource`'s version: the
/// server owns uid, creation time, generation and status (written through its
/// subresource); `resource_version` makes the write conditional.
pub fn to_server(
    mut object: Value,
    resource: &Resource,
    key: &ObjectKey,
    resource_version: Option<u64>,
) -> Value {
    if !object.is_object() {
        object = Value::Object(Map::new());
    }
    if let Some(map) = object.as_object_mut() {
        map.remove("status");
        map.insert("apiVersion".into(), resource.api_version().into());
        map.insert("kind".into(), resource.kind.into());
        let metadata = map
            .entry("metadata")
            .or_insert_with(|| Value::Object(Map::new()));
        if let Some(metadata) = metadata.as_object_mut() {
            for owned in [
                "uid",
                "creationTimestamp",
                "generation",
                "deletionTimestamp",
            ] {
                metadata.remove(owned);
            }
            metadata.insert("name".into(), key.name.clone().into());
            if resource.namespaced {
                metadata.insert("namespace".into(), key.namespace.clone().into());
            } else {
                metadata.remove("namespace");
            }
            if let Some(version) = resource_version {
                metadata.insert("resourceVersion".into(), version.to_string().into());
            }
        }
    }
    object
}

/// A resourceVersion as a store revision. The API server calls it opaque; every server
/// on etcd gives etcd's revision, a number that grows, and Rigger's conditional writes
/// need exactly that. Anything else is refused where it is read.
pub fn revision_of(resource_version: Option<&str>) -> Option<u64> {
    resource_version?.parse().ok()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn kinds_statuses_secrets_and_records_each_have_their_place() {
        let Route::Object(job) = route("ImagePullJob") else {
            panic!("ImagePullJob is a custom resource")
        };
        assert_eq!(
            (job.api_version(), job.plural.as_str(), job.namespaced),
            ("apps.kruise.io/v1beta1".to_owned(), "imagepulljobs", true)
        );
        assert!(
            matches!(route("ContainerRecreateRequest.status"), Route::Status(r) if r.kind == "ContainerRecreateRequest")
        );
        assert!(matches!(route("Secret"), Route::Object(r) if r.api_version() == "v1"));
        for record in [
            "ImagePullJob.nodes",
            "Node.labels",
            "SidecarSetHistory",
            "Pod.status",
            "Pod",
        ] {
            assert_eq!(route(record), Route::Record, "{record}");
        }
    }

    #[test]
    fn record_names_are_valid_distinct_and_keep_their_key() {
        let a = ObjectKey::new("ImagePullJob.nodes", "default", "warm#00001");
        let b = ObjectKey::new("ImagePullJob.nodes", "default", "warm#00002");
        assert_ne!(record_name(&a), record_name(&b));
        assert!(record_name(&a).len() <= 63);
        assert!(
            record_name(&a)
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        );
        let record = record_object(&a, "rigger-system", &json!({"nodes": []}));
        assert_eq!(
            record["metadata"]["labels"][RECORD_KIND_LABEL],
            "ImagePullJob.nodes"
        );
        assert_eq!(record_contents(&record), Some((a, json!({"nodes": []}))));
    }

    #[test]
    fn the_servers_metadata_stays_on_the_server_and_rigger_does_not_write_its_fields() {
        let read = from_server(json!({
            "apiVersion": "apps.kruise.io/v1beta1", "kind": "ImagePullJob",
            "metadata": {"name": "a", "namespace": "d", "uid": "u", "resourceVersion": "7",
                         "managedFields": [], "labels": {"x": "y"}},
            "spec": {"image": "i"}, "status": {"desired": 1},
        }));
        assert_eq!(
            read,
            json!({"apiVersion": "apps.kruise.io/v1beta1", "kind": "ImagePullJob",
                   "metadata": {"name": "a", "namespace": "d", "uid": "u", "labels": {"x": "y"}},
                   "spec": {"image": "i"}})
        );
        let Route::Object(job) = route("ImagePullJob") else {
            panic!()
        };
        let key = ObjectKey::new("ImagePullJob", "d", "a");
        let written = to_server(
            json!({"apiVersion": "rigger.dev/v1alpha1", "kind": "ImagePullJob",
                   "metadata": {"name": "a", "uid": "u", "generation": 3},
                   "spec": {}, "status": {"desired": 1}}),
            &job,
            &key,
            Some(12),
        );
        assert_eq!(
            written,
            json!({"apiVersion": "apps.kruise.io/v1beta1", "kind": "ImagePullJob",
                   "metadata": {"name": "a", "namespace": "d", "resourceVersion": "12"},
                   "spec": {}})
        );
    }

    #[test]
    fn a_resource_version_that_is_no_number_is_no_revision() {
        assert_eq!(revision_of(Some("12345")), Some(12345));
        assert_eq!(revision_of(Some("abc")), None);
        assert_eq!(revision_of(None), None);
    }
}
