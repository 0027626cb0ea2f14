//! The user API riggerctl speaks: apply, get, list and delete objects as JSON.
//!
//! Applied objects are validated whole before anything is written; a refusal names the
//! object and the field (`ImagePullJob default/warm: spec.parallelism: ...`). Writes are
//! conditional on the revision that was read, so two concurrent applies cannot silently
//! overwrite each other.

mod apply;
pub mod lists;
mod logs;
pub mod node_images;
pub mod pending;
mod placement;
mod show;
mod watch;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rigger_proto::v1::control_server::Control;
use rigger_proto::v1::{
    ApplyRequest, ApplyResponse, ContainerExec, ContainerLogs, DeleteRequest, DeleteResponse,
    GetRequest, LabelRequest, ListRequest, ListResponse, Object, PodExecRequest, PodLogsRequest,
    PodOutput, VersionInfo, VersionRequest, WatchRequest, agent_request,
};
use serde::Serialize;
use tonic::{Request, Response, Status};

use self::apply::object_name;
use crate::engines::jobs::JobEngine;
use crate::engines::pods::PodSync;
use crate::engines::recreate_requests::RecreateEngine;
use crate::fleet::nodes::NodeRegistry;
use crate::serve::auth::{Role, UserAuth};
use crate::serve::rate_limit::{ApiRate, ClientLimiter};
use rigger_api::pod::Pod;
use rigger_api::{DEFAULT_NAMESPACE, Kind};
use rigger_store::Leadership;
use rigger_store::{ObjectKey, Precondition, Store, StoreError};

/// Largest object accepted (a job or secret is a few kilobytes).
pub const MAX_OBJECT_BYTES: usize = 1 << 20;

#[derive(Debug, Clone)]
pub struct ControlService {
    store: Store,
    nodes: NodeRegistry,
    jobs: JobEngine,
    recreates: RecreateEngine,
    pods: PodSync,
    users: UserAuth,
    limiter: Arc<ClientLimiter>,
    leadership: Leadership,
    node_timeout: Duration,
    watches: Arc<watch::WatchHub>,
    /// On a Kubernetes store, writes go through the API server (kubectl), where its RBAC
    /// and admission decide: riggerctl's writes would act with the controller's rights.
    writes_through_kubernetes: bool,
}

impl ControlService {
    #[allow(clippy::too_many_arguments)] // the API's collaborators, each kept once
    pub fn new(
        store: Store,
        nodes: NodeRegistry,
        jobs: JobEngine,
        recreates: RecreateEngine,
        pods: PodSync,
        users: UserAuth,
        leadership: Leadership,
        node_timeout: Duration,
        api_rate: ApiRate,
    ) -> Self {
        Self {
            store,
            nodes,
            jobs,
            recreates,
            pods,
            users,
            limiter: Arc::new(ClientLimiter::new(api_rate)),
            leadership,
            node_timeout,
            watches: Arc::new(watch::WatchHub::default()),
            writes_through_kubernetes: false,
        }
    }

    /// On a Kubernetes store: refuse writes (apply, delete, label, recreate), naming
    /// kubectl; reads are served as ever.
    #[must_use]
    pub fn in_cluster(mut self) -> Self {
        self.writes_through_kubernetes = true;
        self
    }

    /// On a Kubernetes store, Secrets are read with kubectl, under the cluster's RBAC:
    /// through riggerctl they would be read with the controller's rights, in every
    /// namespace (and their annotations can hold the values).
    fn readable(&self, kind: Kind) -> Result<(), Status> {
        if self.writes_through_kubernetes && kind == Kind::Secret {
            return Err(Status::permission_denied(
                "this controller keeps its objects in Kubernetes: read Secrets with kubectl (the API server's RBAC decides who may)",
            ));
        }
        // There, events are the cluster's own (`kubectl get events`), not in the store.
        if self.writes_through_kubernetes && kind == Kind::Event {
            return Err(Status::failed_precondition(
                "this controller keeps its objects in Kubernetes: its events are the cluster's, read them with kubectl get events",
            ));
        }
        Ok(())
    }

    /// Who sent `request`, and its message, if this replica leads, the sender may act
    /// with `needed` and is within their request rate (per user; per address when there
    /// are no tokens).
    fn admit<T>(&self, request: Request<T>, needed: Role) -> Result<(String, T), Status> {
        self.leadership.require()?;
        if self.writes_through_kubernetes && needed == Role::Admin {
            return Err(Status::failed_precondition(
                "this controller keeps its objects in Kubernetes: write them with kubectl (the API server's RBAC decides who may); riggerctl reads",
            ));
        }
        let user = self.users.authorize(&request, needed)?;
        let client = match (&self.users, request.remote_addr()) {
            (UserAuth::Open, Some(address)) => address.ip().to_string(),
            _ => user.clone(),
        };
        self.limiter.admit(&client)?;
        Ok((user, request.into_inner()))
    }

    /// Forget idle clients now and then: the limiter keeps one entry per client seen.
    pub fn spawn_limiter_cleanup(&self, stop: tokio_util::sync::CancellationToken) {
        let limiter = self.limiter.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_secs(60));
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    _ = every.tick() => limiter.forget_idle(),
                }
            }
        });
    }
}

impl ControlService {
    /// Every object of `kind` as `get` shows it (in `namespace` only, when one is given),
    /// each with the namespace and name it is kept under (so a caller that keys them
    /// need not read each object's JSON again).
    pub(crate) async fn list_shown(
        &self,
        kind: Kind,
        namespace: &str,
    ) -> Result<Vec<(ObjectName, Object)>, Status> {
        if kind == Kind::NodeImage {
            return self.node_images(None).await;
        }
        if kind == Kind::Node {
            return Ok(self
                .nodes
                .objects(SystemTime::now(), self.node_timeout)
                .into_iter()
                .map(|n| {
                    let name = n["metadata"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned();
                    let object = Object {
                        json: n.to_string(),
                        revision: 0,
                    };
                    ((String::new(), name), object)
                })
                .collect());
        }
        let mut items = Vec::new();
        for stored in self.store.list(kind.name()).await.map_err(store_status)? {
            if namespace.is_empty() || !kind.namespaced() || stored.key.namespace == namespace {
                let name = (stored.key.namespace.clone(), stored.key.name.clone());
                items.push((name, self.show(kind, stored).await?));
            }
        }
        Ok(items)
    }
}

/// An object's namespace (empty for cluster-wide kinds) and name.
pub(crate) type ObjectName = (String, String);

/// Which objects a List or Watch wants: a namespace (empty: all) and kubectl's label and
/// field selectors, matched on the object as shown (what `get -o yaml` says is what
/// selects).
#[derive(Debug, Clone)]
pub(crate) struct Selection {
    namespace: String,
    labels: rigger_api::LabelSelector,
    fields: rigger_api::selectors::FieldSelector,
}

impl Selection {
    fn parse(kind: Kind, namespace: &str, labels: &str, fields: &str) -> Result<Self, Status> {
        Ok(Self {
            namespace: if kind.namespaced() {
                namespace.to_owned()
            } else {
                String::new()
            },
            labels: rigger_api::selectors::parse_label_selector_or_all(labels)
                .map_err(|e| Status::invalid_argument(format!("label selector: {e}")))?,
            fields: rigger_api::selectors::FieldSelector::parse(fields)
                .map_err(|e| Status::invalid_argument(format!("field selector: {e}")))?,
        })
    }

    /// The namespace wanted (empty: all).
    fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Whether an object of `namespace` is in the selection's namespace.
    pub(crate) fn in_namespace(&self, namespace: &str) -> bool {
        self.namespace.is_empty() || self.namespace == namespace
    }

    /// The label and field selectors (the namespace is the caller's to check); without
    /// a selector nothing is read again.
    pub(crate) fn selects(&self, object: &Object) -> bool {
        if self.labels.is_empty() && self.fields.is_empty() {
            return true;
        }
        let Ok(value) = serde_json::from_str::<serde_json::Value>(&object.json) else {
            return false;
        };
        let meta = &value["metadata"];
        let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
        let object_labels = meta["labels"]
            .as_object()
            .map(|m| m.iter().map(|(k, v)| (k.clone(), text(v))).collect())
            .unwrap_or_default();
        self.labels.matches(&object_labels)
            && self
                .fields
                .matches(&text(&meta["name"]), &text(&meta["namespace"]))
    }
}

#[allow(clippy::needless_pass_by_value)] // shaped for `map_err`
fn store_status(e: StoreError) -> Status {
    match e {
        StoreError::NotFound { .. } => Status::not_found(e.to_string()),
        StoreError::Conflict { .. } => Status::aborted(e.to_string()),
        StoreError::Backend { .. } => Status::unavailable(e.to_string()),
        StoreError::Undecodable { .. } => Status::data_loss(e.to_string()),
        StoreError::NotLeading { .. } => rigger_proto::not_leader(&e.to_string()),
    }
}

/// `stored`, decoded as `T`; one that does not decode is the store's loss, named.
fn decoded<T: serde::de::DeserializeOwned>(
    stored: rigger_store::Stored,
) -> Result<rigger_store::Versioned<T>, Status> {
    rigger_store::typed::decode(stored).map_err(store_status)
}

fn kind_of(text: &str) -> Result<Kind, Status> {
    Kind::parse(text).map_err(|e| Status::invalid_argument(e.to_string()))
}

fn namespace_or_default(namespace: &str) -> &str {
    if namespace.is_empty() {
        DEFAULT_NAMESPACE
    } else {
        namespace
    }
}

fn to_json<T: Serialize>(object: &T) -> Result<String, Status> {
    serde_json::to_string(object).map_err(|e| Status::internal(format!("cannot encode: {e}")))
}

#[tonic::async_trait]
impl Control for ControlService {
    async fn apply(
        &self,
        request: Request<ApplyRequest>,
    ) -> Result<Response<ApplyResponse>, Status> {
        let (user, request) = self.admit(request, Role::Admin)?;
        if request.json.len() > MAX_OBJECT_BYTES {
            return Err(Status::invalid_argument(format!(
                "object is {} bytes; at most {MAX_OBJECT_BYTES} are accepted",
                request.json.len()
            )));
        }
        let value: serde_json::Value = serde_json::from_str(&request.json)
            .map_err(|e| Status::invalid_argument(format!("the object is not JSON: {e}")))?;
        let kind_text = value["kind"].as_str().ok_or_else(|| {
            Status::invalid_argument(format!("{}: kind: is required", object_name(&value)))
        })?;
        let kind = kind_of(kind_text)?;
        if kind.name() != kind_text {
            return Err(Status::invalid_argument(format!(
                "{}: kind: {kind_text:?}: expected {}",
                object_name(&value),
                kind.name()
            )));
        }
        tracing::debug!(%user, kind = %kind, dry_run = request.dry_run, "apply");
        let response = self.apply_document(kind, value, request.dry_run).await?;
        Ok(Response::new(response))
    }

    async fn get(&self, request: Request<GetRequest>) -> Result<Response<Object>, Status> {
        let (_, request) = self.admit(request, Role::Viewer)?;
        let kind = kind_of(&request.kind)?;
        self.readable(kind)?;
        let namespace = if kind.namespaced() {
            namespace_or_default(&request.namespace)
        } else {
            ""
        };
        Ok(Response::new(
            self.get_object(kind, namespace, &request.name).await?,
        ))
    }

    async fn list(&self, request: Request<ListRequest>) -> Result<Response<ListResponse>, Status> {
        let (_, request) = self.admit(request, Role::Viewer)?;
        let kind = kind_of(&request.kind)?;
        self.readable(kind)?;
        let selection = Selection::parse(
            kind,
            &request.namespace,
            &request.label_selector,
            &request.field_selector,
        )?;
        let items = self
            .list_shown(kind, selection.namespace())
            .await?
            .into_iter()
            .map(|(_, object)| object)
            .filter(|o| selection.selects(o))
            .collect();
        Ok(Response::new(ListResponse { items }))
    }

    type WatchStream = watch::EventStream;

    async fn watch(
        &self,
        request: Request<WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let (_, request) = self.admit(request, Role::Viewer)?;
        let kind = kind_of(&request.kind)?;
        self.readable(kind)?;
        let selection = Selection::parse(
            kind,
            &request.namespace,
            &request.label_selector,
            &request.field_selector,
        )?;
        let stream = self
            .watches
            .watch(self, kind, selection, request.resource_version)
            .await?;
        Ok(Response::new(stream))
    }

    async fn logs(&self, request: Request<PodLogsRequest>) -> Result<Response<PodOutput>, Status> {
        let (_, request) = self.admit(request, Role::Viewer)?;
        let (node, uid) = self.placement(&request.namespace, &request.name).await?;
        let answer = self
            .pods
            .ask(
                &node,
                agent_request::Kind::Logs(ContainerLogs {
                    pod_uid: uid,
                    container: request.container,
                    tail_lines: request.tail_lines,
                    ..ContainerLogs::default()
                }),
                Duration::from_secs(30),
            )
            .await?;
        Ok(Response::new(PodOutput {
            stdout: answer.stdout,
            stderr: answer.stderr,
            exit_code: answer.exit_code,
            ..PodOutput::default()
        }))
    }

    type FollowLogsStream = logs::OutputStream;

    async fn follow_logs(
        &self,
        request: Request<PodLogsRequest>,
    ) -> Result<Response<Self::FollowLogsStream>, Status> {
        let (_, request) = self.admit(request, Role::Viewer)?;
        let (node, uid) = self.placement(&request.namespace, &request.name).await?;
        Ok(Response::new(self.follow(node, uid, request)))
    }

    async fn version(
        &self,
        request: Request<VersionRequest>,
    ) -> Result<Response<VersionInfo>, Status> {
        self.admit(request, Role::Viewer)?;
        Ok(Response::new(VersionInfo {
            version: rigger_version::VERSION.to_owned(),
            commit: rigger_version::COMMIT.to_owned(),
        }))
    }

    async fn label(&self, request: Request<LabelRequest>) -> Result<Response<Object>, Status> {
        let (user, request) = self.admit(request, Role::Admin)?;
        if kind_of(&request.kind)? != Kind::Node {
            return Err(Status::invalid_argument(format!(
                "{}: riggerctl label sets labels on nodes; other objects take theirs from apply",
                request.kind
            )));
        }
        if !self.nodes.knows(&request.name) {
            return Err(Status::not_found(format!(
                "node {:?} not found (no agent of that name registered)",
                request.name
            )));
        }
        let change = crate::fleet::node_labels::LabelChange {
            set: request.set.into_iter().collect(),
            remove: request.remove,
            overwrite: request.overwrite,
        };
        let labels = crate::fleet::node_labels::save(&self.store, &request.name, &change)
            .await
            .map_err(store_status)?
            .map_err(Status::invalid_argument)?;
        tracing::info!(%user, node = %request.name, ?labels, "node labelled");
        self.nodes.set_node_admin_labels(&request.name, labels);
        self.jobs.wake();
        Ok(Response::new(
            self.get_object(Kind::Node, "", &request.name).await?,
        ))
    }

    async fn exec(&self, request: Request<PodExecRequest>) -> Result<Response<PodOutput>, Status> {
        let (user, request) = self.admit(request, Role::Admin)?;
        if request.command.is_empty() {
            return Err(Status::invalid_argument("command: is required"));
        }
        let (node, uid) = self.placement(&request.namespace, &request.name).await?;
        tracing::info!(%user, pod = %request.name, %node, "exec");
        let timeout = u64::from(request.timeout_seconds.clamp(1, 3600));
        let answer = self
            .pods
            .ask(
                &node,
                agent_request::Kind::Exec(ContainerExec {
                    pod_uid: uid,
                    container: request.container,
                    command: request.command,
                    timeout_seconds: u32::try_from(timeout).unwrap_or(u32::MAX),
                }),
                Duration::from_secs(timeout + 10),
            )
            .await?;
        Ok(Response::new(PodOutput {
            stdout: answer.stdout,
            stderr: answer.stderr,
            exit_code: answer.exit_code,
            ..PodOutput::default()
        }))
    }

    async fn delete(
        &self,
        request: Request<DeleteRequest>,
    ) -> Result<Response<DeleteResponse>, Status> {
        let (user, request) = self.admit(request, Role::Admin)?;
        let kind = kind_of(&request.kind)?;
        if kind.info().read_only.is_some() {
            return Err(apply::read_only(kind.info()));
        }
        let namespace = if kind.namespaced() {
            namespace_or_default(&request.namespace)
        } else {
            ""
        };
        self.remove(kind, namespace, &request.name, &user, None)
            .await?;
        Ok(Response::new(DeleteResponse {}))
    }
}

impl ControlService {
    /// Delete object `name` of `kind` and what goes with it. Asked by a user (`at`
    /// `None`), one that still has finalizers is only marked
    /// (`metadata.deletionTimestamp`), as Kubernetes does; it goes once an apply leaves
    /// it none, which calls this `at` the version that apply read.
    pub(super) async fn remove(
        &self,
        kind: Kind,
        namespace: &str,
        name: &str,
        user: &str,
        at: Option<Precondition>,
    ) -> Result<(), Status> {
        let key = ObjectKey::new(kind.name(), namespace, name);
        if at.is_none()
            && let Some(stored) = self.store.get(key.clone()).await.map_err(store_status)?
            && let Ok(mut value) = serde_json::from_slice::<serde_json::Value>(&stored.object)
            && value["metadata"]["finalizers"]
                .as_array()
                .is_some_and(|f| !f.is_empty())
        {
            if value["metadata"]["deletionTimestamp"].is_null() {
                value["metadata"]["deletionTimestamp"] =
                    serde_json::Value::String(rigger_proto::time::now_rfc3339());
                let bytes =
                    serde_json::to_vec(&value).map_err(|e| Status::internal(e.to_string()))?;
                self.store
                    .put(key.clone(), bytes, Precondition::Revision(stored.revision))
                    .await
                    .map_err(store_status)?;
                tracing::info!(object = %key, %user, "marked for deletion: it has finalizers");
            }
            return Ok(());
        }
        // A pod's node is told once it is gone, so its agent stops it.
        let pod_node = match kind {
            // One that does not decode is deleted all the same.
            Kind::Pod => match self.store.get_as::<Pod>(key.clone()).await {
                Ok(pod) => pod.and_then(|p| p.value.spec.node_name),
                Err(StoreError::Undecodable { .. }) => None,
                Err(error) => return Err(store_status(error)),
            },
            _ => None,
        };
        self.store
            .delete(key.clone(), at.unwrap_or(Precondition::Any))
            .await
            .map_err(store_status)?;
        tracing::info!(object = %key, %user, "deleted");
        if let Some(node) = pod_node {
            let _ = self
                .store
                .delete(crate::engines::pods::status_key(&key), Precondition::Any)
                .await;
            self.pods.send_to(&node).await;
        }
        if kind == Kind::ImageListPullJob {
            self.delete_list_jobs(namespace, name).await?;
        }
        if kind == Kind::SidecarSet {
            let _ = self
                .store
                .delete(apply::history_key(name), Precondition::Any)
                .await;
        }
        match kind {
            Kind::ImagePullJob => self.jobs.wake(),
            Kind::ContainerRecreateRequest => self.recreates.wake(),
            Kind::LifecycleCooperator => self.pods.send_to_all().await,
            _ => {}
        }
        Ok(())
    }
}
