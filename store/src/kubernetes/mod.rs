//! The Kubernetes API as the controller's store: in a cluster, what users apply with
//! kubectl is what the engines act on, and what they report is the objects' status.
//! Where each key lives is [`route`]'s decision; this module is the client side of it.
//!
//! Revisions are resourceVersions (etcd's revisions under every API server), so the
//! engines' conditional writes become the API server's optimistic concurrency: a stale
//! write is its 409, a [`StoreError::Conflict`].

pub mod cache;
pub mod client;
mod definitions;
pub mod lease;
pub mod route;

use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams, Preconditions,
};
use kube::{Client, Config};
use serde_json::Value;

use cache::{ListCache, Written};
use route::{Resource, Route};

use super::{Backend, ObjectKey, Precondition, StoreError, Stored};

/// How the controller reaches its API server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubernetesSettings {
    /// A kubeconfig file (`None`: in-cluster, from the ServiceAccount the pod runs as,
    /// or `$KUBECONFIG`/`~/.kube/config` as kubectl finds them).
    pub kubeconfig: Option<std::path::PathBuf>,
    /// Where the controller keeps its records (its own namespace).
    pub namespace: String,
    /// Kruise's manager runs beside (see the `kruise_manager` setting).
    pub kruise_manager: bool,
    /// Alone, write each node's NodeImage (see the `write_node_images` setting).
    pub write_node_images: bool,
}

/// The controller's store on a Kubernetes API server.
#[derive(Clone)]
pub struct KubernetesStore {
    /// Every request of the store's, and of the leader's work beside it, goes through
    /// `fence` as it is sent.
    client: Client,
    replica_client: Client,
    fence: client::WriteFence,
    /// What the client was made from, for clients made elsewhere (the leader's, on a
    /// runtime of its own).
    config: Config,
    records_namespace: String,
    location: String,
    /// Lists come from watches (one per resource), with this store's own writes.
    cache: std::sync::Arc<ListCache>,
}

impl std::fmt::Debug for KubernetesStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubernetesStore")
            .field("location", &self.location)
            .field("records_namespace", &self.records_namespace)
            .finish()
    }
}

impl KubernetesStore {
    /// Connect as `settings` say, and check the API server serves Rigger's kinds (the
    /// CRDs from `deploy/kubernetes/crds.yaml`): a missing CRD is named now, not at the
    /// first write. The replicas' `leader_lease` bounds how long a write may wait
    /// unacknowledged ([`client::unacknowledged_limit`]).
    pub async fn connect(
        settings: &KubernetesSettings,
        leader_lease: std::time::Duration,
    ) -> Result<Self, StoreError> {
        let config = match &settings.kubeconfig {
            Some(path) => {
                let kubeconfig =
                    kube::config::Kubeconfig::read_from(path).map_err(|e| StoreError::Backend {
                        location: path.display().to_string(),
                        detail: format!("cannot read the kubeconfig: {e}"),
                    })?;
                Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                    .await
                    .map_err(|e| StoreError::Backend {
                        location: path.display().to_string(),
                        detail: format!("kubeconfig: {e}"),
                    })?
            }
            None => Config::infer().await.map_err(|e| StoreError::Backend {
                location: "in-cluster".into(),
                detail: format!("no Kubernetes API to use: {e}"),
            })?,
        };
        let location = config.cluster_url.to_string();
        let fence = client::WriteFence::default();
        let unacknowledged = client::unacknowledged_limit(leader_lease);
        let made = |fence| {
            client::term_bounded(&config, unacknowledged, fence).map_err(|e| StoreError::Backend {
                location: location.clone(),
                detail: format!("cannot make a client: {e}"),
            })
        };
        let client = made(Some(&fence))?;
        let replica_client = made(None)?;
        let store = Self {
            client,
            replica_client,
            fence,
            config,
            records_namespace: settings.namespace.clone(),
            location,
            cache: std::sync::Arc::default(),
        };
        store.check_definitions(settings.kruise_manager).await?;
        Ok(store)
    }

    /// The client, for what runs beside the store on the same API server (the cluster's
    /// Nodes and Pods, Events, the SidecarSet rollout): its writes fenced as the store's
    /// are ([`Backend::fence_writes`]).
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// A client whose writes no fence holds, for what every replica writes whether it
    /// leads or not (the webhook's serving certificate).
    pub fn replica_client(&self) -> Client {
        self.replica_client.clone()
    }

    /// What the client was made from (the leader election makes its own from it).
    pub fn config(&self) -> Config {
        self.config.clone()
    }

    /// The controller's own namespace (records, Lease).
    pub fn namespace(&self) -> &str {
        &self.records_namespace
    }

    fn api(&self, resource: &Resource, namespace: &str) -> Api<DynamicObject> {
        let api_resource = api_resource(resource);
        if resource.namespaced {
            Api::namespaced_with(self.client.clone(), namespace, &api_resource)
        } else {
            Api::all_with(self.client.clone(), &api_resource)
        }
    }

    fn records(&self) -> Api<DynamicObject> {
        self.api(&route::record_resource(), &self.records_namespace)
    }

    fn error(&self, what: &str, error: &kube::Error) -> StoreError {
        if client::refused_by_fence(error) {
            return StoreError::NotLeading {
                key: what.to_owned(),
            };
        }
        StoreError::Backend {
            location: self.location.clone(),
            detail: format!("{what}: {error}"),
        }
    }

    /// `object`'s resourceVersion as a revision.
    fn revision(&self, key: &ObjectKey, object: &DynamicObject) -> Result<u64, StoreError> {
        route::revision_of(object.metadata.resource_version.as_deref()).ok_or_else(|| {
            StoreError::Undecodable {
                key: key.to_string(),
                detail: format!(
                    "resourceVersion {:?} is not a number: this API server is not one Rigger \
                     can keep revisions on",
                    object.metadata.resource_version
                ),
            }
        })
    }

    /// Every object of `resource` (all namespaces) from the watch cache; `kind` names it
    /// in errors.
    async fn cached(
        &self,
        kind: &str,
        resource: &Resource,
    ) -> Result<Vec<std::sync::Arc<DynamicObject>>, StoreError> {
        self.cache
            .list(&self.client, &api_resource(resource), None)
            .await
            .map_err(|detail| StoreError::Backend {
                location: self.location.clone(),
                detail: format!("list {kind}: {detail}"),
            })
    }

    async fn get_object(
        &self,
        api: &Api<DynamicObject>,
        key: &ObjectKey,
        name: &str,
    ) -> Result<Option<DynamicObject>, StoreError> {
        api.get_opt(name)
            .await
            .map_err(|e| self.error(&key.to_string(), &e))
    }

    /// A write refused as stale (409) or aimed at an object that is gone (404, for a
    /// conditional write) is a conflict; anything else is the backend's.
    async fn write_error(
        &self,
        api: &Api<DynamicObject>,
        key: &ObjectKey,
        name: &str,
        expected: u64,
        error: kube::Error,
    ) -> StoreError {
        match status_code(&error) {
            Some(409 | 404) => {
                let actual = match api.get_opt(name).await {
                    Ok(Some(object)) => self.revision(key, &object).unwrap_or(0),
                    _ => 0,
                };
                StoreError::Conflict {
                    key: key.to_string(),
                    expected,
                    actual,
                }
            }
            _ => self.error(&key.to_string(), &error),
        }
    }

    /// Write `body` (a whole object) under `name`: create, or replace at a revision.
    async fn write(
        &self,
        api: &Api<DynamicObject>,
        scope: Scope<'_>,
        key: &ObjectKey,
        name: &str,
        body: Value,
        precondition: Precondition,
    ) -> Result<u64, StoreError> {
        let at = match precondition {
            Precondition::Absent => None,
            Precondition::Revision(revision) => Some(revision),
            Precondition::Any => {
                // The version the watch or the last write knows saves reading it: a stale
                // one is refused as a conflict, and the object is read afresh.
                // (A record lives in the records' namespace, an object in its own.)
                let namespace = scope
                    .namespace
                    .map_or_else(|| key.namespace.clone(), str::to_owned);
                if let Some(known) = self.cache.known_revision(
                    &api_resource(scope.resource),
                    scope.namespace,
                    &(namespace, name.to_owned()),
                ) {
                    match self
                        .replace_or_create(api, scope, key, name, body.clone(), Some(known))
                        .await
                    {
                        // The conflict read the version there is (0: none): at that one.
                        Err(StoreError::Conflict { actual, .. }) => (actual > 0).then_some(actual),
                        written => return written,
                    }
                } else {
                    match self.get_object(api, key, name).await? {
                        Some(current) => Some(self.revision(key, &current)?),
                        None => None,
                    }
                }
            }
        };
        self.replace_or_create(api, scope, key, name, body, at)
            .await
    }

    /// Create `body` (`at` is `None`) or replace it at revision `at`.
    async fn replace_or_create(
        &self,
        api: &Api<DynamicObject>,
        scope: Scope<'_>,
        key: &ObjectKey,
        name: &str,
        body: Value,
        at: Option<u64>,
    ) -> Result<u64, StoreError> {
        let mut object: DynamicObject = decode_dynamic(key, body)?;
        object.metadata.resource_version = at.map(|revision| revision.to_string());
        let written = match at {
            None => api.create(&PostParams::default(), &object).await,
            Some(_) => api.replace(name, &PostParams::default(), &object).await,
        };
        match written {
            Ok(written) => {
                let revision = self.revision(key, &written)?;
                self.remember(scope, written);
                Ok(revision)
            }
            Err(error) => Err(self
                .write_error(api, key, name, at.unwrap_or(0), error)
                .await),
        }
    }

    /// A write of this store's, for its lists until their watch shows it.
    fn remember(&self, scope: Scope<'_>, written: DynamicObject) {
        let name = (
            written.metadata.namespace.clone().unwrap_or_default(),
            written.metadata.name.clone().unwrap_or_default(),
        );
        self.cache.wrote(
            &api_resource(scope.resource),
            scope.namespace,
            name,
            Written::Present(std::sync::Arc::new(written)),
        );
    }

    async fn put_object(
        &self,
        resource: &Resource,
        key: ObjectKey,
        object: Vec<u8>,
        precondition: Precondition,
    ) -> Result<u64, StoreError> {
        let value = parse(&key, &object)?;
        let api = self.api(resource, &key.namespace);
        let body = route::to_server(value, resource, &key, None);
        let scope = Scope {
            resource,
            namespace: None,
        };
        self.write(&api, scope, &key, &key.name, body, precondition)
            .await
    }

    async fn put_status(
        &self,
        resource: &Resource,
        key: ObjectKey,
        status: Vec<u8>,
        precondition: Precondition,
    ) -> Result<u64, StoreError> {
        let status = parse(&key, &status)?;
        let api = self.api(resource, &key.namespace);
        if precondition == Precondition::Any {
            return self.patch_status(resource, &api, &key, status).await;
        }
        let Some(mut current) = self.get_object(&api, &key, &key.name).await? else {
            return Err(StoreError::NotFound {
                key: key.to_string(),
            });
        };
        let revision = self.revision(&key, &current)?;
        match precondition {
            Precondition::Revision(expected) if expected != revision => {
                return Err(StoreError::Conflict {
                    key: key.to_string(),
                    expected,
                    actual: revision,
                });
            }
            Precondition::Absent if current.data.get("status").is_some() => {
                return Err(StoreError::Conflict {
                    key: key.to_string(),
                    expected: 0,
                    actual: revision,
                });
            }
            _ => {}
        }
        if let Value::Object(data) = &mut current.data {
            data.insert("status".into(), status);
        }
        // The resourceVersion read above makes the write conditional on it.
        match api
            .replace_status(&key.name, &PostParams::default(), &current)
            .await
        {
            Ok(written) => {
                let revision = self.revision(&key, &written)?;
                let scope = Scope {
                    resource,
                    namespace: None,
                };
                self.remember(scope, written);
                Ok(revision)
            }
            Err(error) => Err(self
                .write_error(&api, &key, &key.name, revision, error)
                .await),
        }
    }

    /// Replace an object's whole status, whatever is there, in one request (a JSON patch
    /// adding `/status` replaces it: no read first).
    async fn patch_status(
        &self,
        resource: &Resource,
        api: &Api<DynamicObject>,
        key: &ObjectKey,
        status: Value,
    ) -> Result<u64, StoreError> {
        let written = self
            .patch_status_with(
                api,
                key,
                vec![json_patch::PatchOperation::Add(json_patch::AddOperation {
                    path: status_pointer(),
                    value: status,
                })],
            )
            .await?;
        let revision = self.revision(key, &written)?;
        let scope = Scope {
            resource,
            namespace: None,
        };
        self.remember(scope, written);
        Ok(revision)
    }

    /// The object after `operations` (a JSON patch) on its status subresource, in one
    /// request; a missing object is `NotFound`.
    async fn patch_status_with(
        &self,
        api: &Api<DynamicObject>,
        key: &ObjectKey,
        operations: Vec<json_patch::PatchOperation>,
    ) -> Result<DynamicObject, StoreError> {
        let patch = Patch::Json::<()>(json_patch::Patch(operations));
        match api
            .patch_status(&key.name, &PatchParams::default(), &patch)
            .await
        {
            Ok(written) => Ok(written),
            Err(error) if status_code(&error) == Some(404) => Err(StoreError::NotFound {
                key: key.to_string(),
            }),
            Err(error) => Err(self.error(&key.to_string(), &error)),
        }
    }

    async fn put_record(
        &self,
        key: ObjectKey,
        object: Vec<u8>,
        precondition: Precondition,
    ) -> Result<u64, StoreError> {
        let value = parse(&key, &object)?;
        let body = route::record_object(&key, &self.records_namespace, &value);
        let name = route::record_name(&key);
        let resource = route::record_resource();
        let scope = Scope {
            resource: &resource,
            namespace: Some(&self.records_namespace),
        };
        self.write(&self.records(), scope, &key, &name, body, precondition)
            .await
    }
}

/// `/status`, where a JSON patch of the status subresource writes.
fn status_pointer() -> json_patch::jsonptr::PointerBuf {
    json_patch::jsonptr::PointerBuf::from_tokens(["status"])
}

fn api_resource(resource: &Resource) -> ApiResource {
    ApiResource {
        group: resource.group.into(),
        version: resource.version.into(),
        api_version: resource.api_version(),
        kind: resource.kind.into(),
        plural: resource.plural.clone(),
    }
}

/// Where a resource's list is cached: records in the controller's namespace, every other
/// resource across all namespaces.
#[derive(Clone, Copy)]
struct Scope<'a> {
    resource: &'a Resource,
    namespace: Option<&'a str>,
}

fn parse(key: &ObjectKey, bytes: &[u8]) -> Result<Value, StoreError> {
    serde_json::from_slice(bytes).map_err(|e| StoreError::Undecodable {
        key: key.to_string(),
        detail: format!("not JSON: {e}"),
    })
}

fn decode_dynamic(key: &ObjectKey, value: Value) -> Result<DynamicObject, StoreError> {
    serde_json::from_value(value).map_err(|e| StoreError::Undecodable {
        key: key.to_string(),
        detail: format!("not an object the API server takes: {e}"),
    })
}

fn encode(key: &ObjectKey, value: &Value) -> Result<Vec<u8>, StoreError> {
    serde_json::to_vec(value).map_err(|e| StoreError::Undecodable {
        key: key.to_string(),
        detail: e.to_string(),
    })
}

fn status_code(error: &kube::Error) -> Option<u16> {
    match error {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

/// A read object as a stored one: revision from its resourceVersion, JSON in Rigger's shape.
fn stored_object(
    store: &KubernetesStore,
    key: ObjectKey,
    object: &DynamicObject,
) -> Result<Stored, StoreError> {
    let revision = store.revision(&key, object)?;
    let value = serde_json::to_value(object).map_err(|e| StoreError::Undecodable {
        key: key.to_string(),
        detail: e.to_string(),
    })?;
    let object = encode(&key, &route::from_server(value))?;
    Ok(Stored {
        key,
        revision,
        object,
    })
}

/// A cached object's key as kind `kind`.
fn cached_key(kind: &str, object: &DynamicObject) -> ObjectKey {
    ObjectKey::new(
        kind,
        object.metadata.namespace.as_deref().unwrap_or_default(),
        object.metadata.name.as_deref().unwrap_or_default(),
    )
}

/// A cached object as `route` stores it: the object itself, or its status (`None`: it
/// has none yet).
fn stored_cached(
    store: &KubernetesStore,
    route: &Route,
    key: ObjectKey,
    object: &DynamicObject,
) -> Result<Option<Stored>, StoreError> {
    match route {
        Route::Status(_) => stored_status(store, key, object),
        _ => stored_object(store, key, object).map(Some),
    }
}

/// Whether `object` has a status (a null one is none).
fn has_status(object: &DynamicObject) -> bool {
    object
        .data
        .get("status")
        .is_some_and(|status| !status.is_null())
}

/// An object's status as a stored record (`None`: it has none yet).
fn stored_status(
    store: &KubernetesStore,
    key: ObjectKey,
    object: &DynamicObject,
) -> Result<Option<Stored>, StoreError> {
    if !has_status(object) {
        return Ok(None);
    }
    let status = &object.data["status"];
    let revision = store.revision(&key, object)?;
    let object = encode(&key, status)?;
    Ok(Some(Stored {
        key,
        revision,
        object,
    }))
}

#[async_trait::async_trait]
impl Backend for KubernetesStore {
    fn fence_writes(&self, leading: tokio::sync::watch::Receiver<bool>) {
        self.fence.bind(leading);
    }

    async fn put(
        &self,
        key: ObjectKey,
        object: Vec<u8>,
        precondition: Precondition,
    ) -> Result<u64, StoreError> {
        match route::route(&key.kind) {
            Route::Object(resource) => self.put_object(&resource, key, object, precondition).await,
            Route::Status(resource) => self.put_status(&resource, key, object, precondition).await,
            Route::Record => self.put_record(key, object, precondition).await,
        }
    }

    /// One request per object: the API server has no multi-object transaction. The
    /// engines write a job's shards before its summary, so a crash midway leaves the
    /// summary behind the shards, which the next write corrects.
    async fn put_all(&self, objects: Vec<(ObjectKey, Vec<u8>)>) -> Result<(), StoreError> {
        for (key, object) in objects {
            self.put(key, object, Precondition::Any).await?;
        }
        Ok(())
    }

    async fn get(&self, key: ObjectKey) -> Result<Option<Stored>, StoreError> {
        match route::route(&key.kind) {
            Route::Object(resource) => {
                let api = self.api(&resource, &key.namespace);
                match self.get_object(&api, &key, &key.name).await? {
                    Some(object) => Ok(Some(stored_object(self, key, &object)?)),
                    None => Ok(None),
                }
            }
            Route::Status(resource) => {
                let api = self.api(&resource, &key.namespace);
                match self.get_object(&api, &key, &key.name).await? {
                    Some(object) => stored_status(self, key, &object),
                    None => Ok(None),
                }
            }
            Route::Record => {
                let name = route::record_name(&key);
                let Some(record) = self.get_object(&self.records(), &key, &name).await? else {
                    return Ok(None);
                };
                let revision = self.revision(&key, &record)?;
                let value = serde_json::to_value(&record).unwrap_or(Value::Null);
                let Some((held, object)) = route::record_contents(&value) else {
                    return Err(StoreError::Undecodable {
                        key: key.to_string(),
                        detail: format!("record {name} has no key and object"),
                    });
                };
                if held != key {
                    return Err(StoreError::Undecodable {
                        key: key.to_string(),
                        detail: format!("record {name} holds {held}"),
                    });
                }
                Ok(Some(Stored {
                    object: encode(&key, &object)?,
                    key,
                    revision,
                }))
            }
        }
    }

    async fn list_changed(
        &self,
        kind: &str,
        known: &crate::KnownRevision<'_>,
    ) -> Result<crate::Listing, StoreError> {
        let route = route::route(kind);
        let (Route::Object(resource) | Route::Status(resource)) = &route else {
            return Ok(crate::Listing::of(self.list(kind).await?, known));
        };
        let mut listing = crate::Listing::default();
        for object in self.cached(kind, resource).await? {
            let key = cached_key(kind, &object);
            if matches!(route, Route::Status(_)) && !has_status(&object) {
                continue; // No status yet: not a stored status (as `list` has it).
            }
            let revision = self.revision(&key, &object)?;
            if !known(&key, revision) {
                listing
                    .changed
                    .extend(stored_cached(self, &route, key.clone(), &object)?);
            }
            listing.present.push((key, revision));
        }
        listing.present.sort();
        listing.changed.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(listing)
    }

    async fn list(&self, kind: &str) -> Result<Vec<Stored>, StoreError> {
        let mut listed = Vec::new();
        match route::route(kind) {
            route @ (Route::Object(_) | Route::Status(_)) => {
                let (Route::Object(resource) | Route::Status(resource)) = &route else {
                    return Ok(listed);
                };
                for object in &self.cached(kind, resource).await? {
                    let key = cached_key(kind, object);
                    listed.extend(stored_cached(self, &route, key, object)?);
                }
            }
            Route::Record => {
                let label = route::label_value(kind);
                let records = self
                    .cache
                    .list(
                        &self.client,
                        &api_resource(&route::record_resource()),
                        Some(&self.records_namespace),
                    )
                    .await
                    .map_err(|detail| StoreError::Backend {
                        location: self.location.clone(),
                        detail: format!("list {kind} records: {detail}"),
                    })?;
                for record in &records {
                    let labelled = record
                        .metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get(route::RECORD_KIND_LABEL))
                        .is_some_and(|l| *l == label);
                    if !labelled {
                        continue;
                    }
                    let value = serde_json::to_value(record.as_ref()).unwrap_or(Value::Null);
                    let Some((key, object)) = route::record_contents(&value) else {
                        tracing::warn!(record = ?record.metadata.name, "a record without its key; left out");
                        continue;
                    };
                    if key.kind != kind {
                        continue;
                    }
                    let revision = self.revision(&key, record)?;
                    listed.push(Stored {
                        object: encode(&key, &object)?,
                        key,
                        revision,
                    });
                }
            }
        }
        listed.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(listed)
    }

    fn changes(&self, kind: &str) -> Option<tokio::sync::watch::Receiver<u64>> {
        // Records are this controller's own state; only objects others write are told.
        match route::route(kind) {
            Route::Object(resource) | Route::Status(resource) => {
                Some(self.cache.changes(&api_resource(&resource), None))
            }
            Route::Record => None,
        }
    }

    async fn delete(&self, key: ObjectKey, precondition: Precondition) -> Result<(), StoreError> {
        let records = route::record_resource();
        let (api, name, scope_resource, scope_namespace) = match route::route(&key.kind) {
            Route::Object(resource) => (
                self.api(&resource, &key.namespace),
                key.name.clone(),
                resource,
                None,
            ),
            Route::Status(resource) => {
                // A status goes with its object; clearing it is writing none: one JSON
                // patch, whether there was one or not (added empty, then removed).
                let api = self.api(&resource, &key.namespace);
                let cleared = vec![
                    json_patch::PatchOperation::Add(json_patch::AddOperation {
                        path: status_pointer(),
                        value: Value::Object(serde_json::Map::new()),
                    }),
                    json_patch::PatchOperation::Remove(json_patch::RemoveOperation {
                        path: status_pointer(),
                    }),
                ];
                let written = self.patch_status_with(&api, &key, cleared).await?;
                let scope = Scope {
                    resource: &resource,
                    namespace: None,
                };
                self.remember(scope, written);
                return Ok(());
            }
            Route::Record => (
                self.records(),
                route::record_name(&key),
                records,
                Some(self.records_namespace.as_str()),
            ),
        };
        let mut params = DeleteParams::default();
        if let Precondition::Revision(revision) = precondition {
            params.preconditions = Some(Preconditions {
                resource_version: Some(revision.to_string()),
                uid: None,
            });
        }
        match api.delete(&name, &params).await {
            Ok(deleted) => {
                // Gone at the revision of its deletion (known when the API server
                // returns the object; a deletion still pending returns a Status).
                if let Some(object) = deleted.left()
                    && let Some(revision) =
                        route::revision_of(object.metadata.resource_version.as_deref())
                {
                    let namespace = object.metadata.namespace.unwrap_or_default();
                    self.cache.wrote(
                        &api_resource(&scope_resource),
                        scope_namespace,
                        (namespace, name.clone()),
                        Written::Deleted(revision),
                    );
                }
                Ok(())
            }
            Err(error) if status_code(&error) == Some(404) => Err(StoreError::NotFound {
                key: key.to_string(),
            }),
            Err(error) => {
                let expected = match precondition {
                    Precondition::Revision(revision) => revision,
                    _ => 0,
                };
                Err(self.write_error(&api, &key, &name, expected, error).await)
            }
        }
    }
}

#[cfg(test)]
mod tests;
