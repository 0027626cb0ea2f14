//! Wiring of `rigger-controller`: bind, serve the agent link and the user API, report
//! health, stop gracefully.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use rigger_daemon::health::{self, Readiness};
use rigger_daemon::shutdown::{Drain, drain};
use rigger_daemon::systemd;
use rigger_proto::v1::agent_link_server::AgentLinkServer;
use rigger_proto::v1::control_server::{ControlServer, SERVICE_NAME as CONTROL_SERVICE};
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_util::sync::CancellationToken;

use std::path::PathBuf;

use tonic::transport::{Certificate, Identity, ServerTlsConfig};

use crate::config::{ControllerConfig, StoreConfig, TlsFiles};
use crate::engines::jobs::JobEngine;
use crate::fleet::nodes::NodeRegistry;
use crate::serve::auth::{UserAuth, Users};
use crate::serve::control::ControlService;
use crate::serve::link::AgentLinkService;
use rigger_store::Leadership;
use rigger_store::{EmbeddedStore, EtcdStore, KubernetesStore, Store};

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot listen on {address} ({setting}): {source}")]
    Bind {
        setting: &'static str,
        address: SocketAddr,
        source: std::io::Error,
    },
    #[error("gRPC server failed: {0}")]
    Grpc(#[from] tonic::transport::Error),
    #[error(transparent)]
    Store(#[from] rigger_store::StoreError),
    #[error("{}: {detail}", path.display())]
    Security { path: PathBuf, detail: String },
    #[error(transparent)]
    Leader(#[from] rigger_store::LeaderError),
    #[error("peer_grant_key: {0}")]
    PeerGrantKey(#[from] rigger_proto::peer_grant::GrantError),
}

/// The server side of mTLS: our certificate, and the CA agents' certificates must chain
/// to. Client certificates are optional at the TLS layer (riggerctl users bring tokens);
/// the agent link refuses sessions without one.
fn server_tls(files: &TlsFiles) -> Result<ServerTlsConfig, ServerError> {
    let read = |path: &PathBuf| {
        rigger_daemon::config::read_small_file(path).map_err(|e| ServerError::Security {
            path: path.clone(),
            detail: e.to_string(),
        })
    };
    Ok(ServerTlsConfig::new()
        .identity(Identity::from_pem(read(&files.cert)?, read(&files.key)?))
        .client_ca_root(Certificate::from_pem(read(&files.client_ca)?))
        .client_auth_optional(true))
}

async fn bind(setting: &'static str, address: SocketAddr) -> Result<TcpListener, ServerError> {
    TcpListener::bind(address)
        .await
        .map_err(|source| ServerError::Bind {
            setting,
            address,
            source,
        })
}

/// Where replicas elect their leader: beside the store.
enum Elector {
    /// The election's key, and where the elector's own client connects.
    Etcd {
        election: String,
        endpoints: Vec<String>,
        tls: Option<crate::config::EtcdTls>,
    },
    Kubernetes(Box<KubernetesStore>),
}

/// Largest message from an agent (a Register with a big inventory).
const MAX_AGENT_MESSAGE: usize = 64 << 20;
/// Largest request from a user (one object, well below this).
const MAX_OBJECT_MESSAGE: usize = 4 << 20;

/// How long a replica in a cluster waits for its SidecarSet webhook to serve before it is
/// Ready anyway (the webhook's reads wait up to 30 s for their first list).
const WEBHOOK_PRIMING_PATIENCE: std::time::Duration = std::time::Duration::from_secs(60);

/// Serve until `stop` resolves, then drain within the configured timeout.
pub async fn run(
    config: ControllerConfig,
    stop: impl Future<Output = ()>,
) -> Result<(), ServerError> {
    // The store opens first: a data directory that cannot be used stops the controller
    // before it accepts anyone.
    let (store, elector) = match &config.store {
        StoreConfig::Embedded => (Store::new(EmbeddedStore::open(&config.data_dir)?), None),
        StoreConfig::Etcd { endpoints, tls } => {
            let etcd =
                EtcdStore::connect(endpoints, rigger_store::etcd::DEFAULT_PREFIX, tls.as_ref())
                    .await?;
            // Leader election runs on the same etcd, beside the store.
            (
                Store::new(etcd.clone()),
                Some(Elector::Etcd {
                    election: format!("{}leader", etcd.prefix()),
                    endpoints: endpoints.clone(),
                    tls: tls.clone(),
                }),
            )
        }
        StoreConfig::Kubernetes(settings) => {
            let kubernetes = KubernetesStore::connect(settings, config.leader_lease).await?;
            // ... and on a Lease of the same API server.
            (
                Store::new(kubernetes.clone()),
                Some(Elector::Kubernetes(Box::new(kubernetes))),
            )
        }
    };
    let tls = config.tls.as_ref().map(server_tls).transpose()?;
    let users = match &config.tokens_file {
        Some(path) => {
            UserAuth::Tokens(Users::load(path).map_err(|detail| ServerError::Security {
                path: path.clone(),
                detail,
            })?)
        }
        None => UserAuth::Open,
    };
    let grpc_listener = bind("listen", config.listen).await?;
    let health_listener = bind("health_listen", config.health_listen).await?;
    let webhook_listener = match &config.sidecar_webhook {
        Some(webhook) => Some(bind("sidecar_webhook_listen", webhook.listen).await?),
        None => None,
    };
    let grpc_address = grpc_listener.local_addr().ok();
    let health_address = health_listener.local_addr().ok();

    let token = CancellationToken::new();
    let identity = format!(
        "{}/{}",
        nix::unistd::gethostname()
            .ok()
            .and_then(|h| h.into_string().ok())
            .unwrap_or_default(),
        grpc_address.map_or_else(|| config.listen.to_string(), |a| a.to_string())
    );
    let (leadership, mut campaign) = match &elector {
        None => (Leadership::sole(), None),
        Some(Elector::Etcd {
            election,
            endpoints,
            tls,
        }) => {
            let (leadership, task) = rigger_store::etcd::election::campaign(
                endpoints.clone(),
                tls.clone(),
                election.clone(),
                identity,
                config.leader_lease,
                token.clone(),
            );
            (leadership, Some(task))
        }
        Some(Elector::Kubernetes(kubernetes)) => {
            let (leadership, task) = rigger_store::kubernetes::lease::campaign(
                kubernetes.config(),
                kubernetes.namespace(),
                identity,
                config.leader_lease,
                token.clone(),
            );
            (leadership, Some(task))
        }
    };
    // Where replicas elect a leader, only the leader writes, and not an instant longer.
    let store = match &elector {
        Some(_) => store.fenced(leadership.changes()),
        None => store,
    };
    // In a cluster, Rigger alone: the SidecarSet webhook (every replica serves; the
    // leader keeps its configuration). `webhook_serving`: whether it answers reviews yet
    // (true at once without a webhook).
    let (webhook_serving_sender, webhook_serving) = tokio::sync::watch::channel(false);
    let metrics = Arc::new(crate::serve::metrics::ControllerMetrics::default());
    let webhook = match (&elector, webhook_listener, &config.sidecar_webhook) {
        (Some(Elector::Kubernetes(kubernetes)), Some(listener), Some(settings)) => {
            let webhook = crate::serve::webhook::SidecarWebhook {
                listener,
                settings: settings.clone(),
                replica_client: kubernetes.replica_client(),
                leader_client: kubernetes.client(),
                store: store.clone(),
                namespace: kubernetes.namespace().to_owned(),
                metrics: metrics.webhook.clone(),
            };
            Some(tokio::spawn(webhook.run(
                leadership.clone(),
                webhook_serving_sender,
                token.clone(),
            )))
        }
        _ => {
            webhook_serving_sender.send_replace(true);
            None
        }
    };
    let nodes = NodeRegistry::default();
    tokio::spawn(nodes.stall_clock().watch(token.child_token()));
    let grants = match &config.peer_grant_key {
        Some(key) => Some(Arc::new(rigger_proto::peer_grant::GrantSigner::from_pem(
            &key.private_pem,
            key.public_pem.as_bytes(),
        )?)),
        None => None,
    };
    // What happens is told as Events: the cluster's in a cluster, else in the store.
    let events: Arc<dyn crate::events::EventSink> = match &elector {
        Some(Elector::Kubernetes(kubernetes)) => Arc::new(
            crate::events::api_server::KubeEvents::start(kubernetes.client()),
        ),
        _ => Arc::new(crate::events::store::StoreEvents::start(
            store.clone(),
            leadership.clone(),
            token.child_token(),
        )),
    };
    let jobs = JobEngine::new(store.clone(), nodes.clone(), config.node_timeout, grants)
        .with_events(events.clone());
    let kruise_manager =
        matches!(&config.store, StoreConfig::Kubernetes(settings) if settings.kruise_manager);
    let recreates = match &elector {
        Some(Elector::Kubernetes(kubernetes)) => {
            let engine = crate::engines::recreate_requests::RecreateEngine::in_cluster(
                store.clone(),
                nodes.clone(),
                config.node_timeout,
                crate::cluster::pods::KubePods::new(kubernetes.client()),
            );
            if kruise_manager {
                engine.beside_kruise_manager()
            } else {
                engine
            }
        }
        _ => crate::engines::recreate_requests::RecreateEngine::new(
            store.clone(),
            nodes.clone(),
            config.node_timeout,
        ),
    }
    .with_events(events.clone());
    let pods = crate::engines::pods::PodSync::new(store.clone(), nodes.clone());
    let metrics_sources = crate::serve::metrics::Sources {
        nodes: nodes.clone(),
        jobs: jobs.clone(),
        recreates: recreates.clone(),
        leadership: leadership.clone(),
        node_timeout: config.node_timeout,
    };
    // Nodes registering, lost and back, told as events while this replica leads. In a
    // cluster a Node's readiness is kubelet's to tell, not its agent's.
    if !matches!(&elector, Some(Elector::Kubernetes(_))) {
        tokio::spawn(crate::fleet::node_events::run(
            nodes.clone(),
            config.node_timeout,
            leadership.clone(),
            events.clone(),
            token.clone(),
        ));
    }
    let sidecars = crate::engines::sidecar_sets::SidecarRollout::new(store.clone(), pods.clone())
        .with_events(events.clone());
    // Beside Kruise's manager, the NodeImages it writes are pulled (Kruise's daemon's part);
    // alone, Rigger writes each node's NodeImage itself (Kruise's manager's part).
    let node_images = kruise_manager.then(|| {
        crate::engines::node_images::NodeImageEngine::new(
            store.clone(),
            nodes.clone(),
            config.node_timeout,
            events.clone(),
        )
    });
    // In a cluster, what agents say of their own labels is never taken, from the first
    // registration on.
    if matches!(elector, Some(Elector::Kubernetes(_))) {
        nodes.use_cluster_labels_only();
    }
    let mut link = AgentLinkService::new(
        nodes.clone(),
        jobs.clone(),
        recreates.clone(),
        pods.clone(),
        leadership.clone(),
        tls.is_some(),
        config.heartbeat_interval,
        config.node_timeout,
        config
            .peer_grant_key
            .as_ref()
            .map(crate::config::PeerGrantKey::public_pems)
            .unwrap_or_default(),
        token.clone(),
    );
    if let Some(engine) = &node_images {
        link = link.with_node_images(engine.clone());
    }
    let control = ControlService::new(
        store.clone(),
        nodes.clone(),
        jobs.clone(),
        recreates.clone(),
        pods,
        users.clone(),
        leadership.clone(),
        config.node_timeout,
        config.api_rate,
    );
    let control = if matches!(elector, Some(Elector::Kubernetes(_))) {
        control.in_cluster()
    } else {
        control
    };
    control.spawn_limiter_cleanup(token.clone());
    let cluster = match &elector {
        Some(Elector::Kubernetes(kubernetes)) => Some(kubernetes.client()),
        _ => None,
    };
    if kruise_manager {
        tracing::info!("beside Kruise's manager: NodeImages and recreate requests only");
    }
    let write_node_images =
        matches!(&config.store, StoreConfig::Kubernetes(settings) if settings.write_node_images);
    // In a cluster, image lists made with kubectl are carried out by a pass of their own.
    let lists = (cluster.is_some() && !kruise_manager).then(|| control.clone());
    // Rigger's own pods (a cluster's are its scheduler's): those applied while no node
    // took them are placed as nodes come.
    let pending_pods = cluster
        .is_none()
        .then(|| crate::serve::control::pending::PendingPods::new(control.clone(), events.clone()));
    let in_cluster = cluster.is_some();
    // In a cluster, Rigger alone: SidecarSets act on the cluster's pods, read from the
    // Pods' one watch.
    let (cluster_rollout, injected_pods) = match (&cluster, kruise_manager) {
        (Some(client), false) => {
            let pods =
                Arc::new(crate::engines::sidecar_sets::injected_pods::InjectedPods::default());
            let rollout = crate::engines::sidecar_sets::cluster_rollout::ClusterRollout::new(
                store.clone(),
                client.clone(),
                pods.clone(),
                events.clone(),
            );
            (Some(rollout), Some(pods))
        }
        _ => (None, None),
    };
    let gate = nodes.clone();
    // Others' changes (in a cluster, what users apply) wake the engines that read them.
    let watched = store.clone();
    // The engines run on the leader only (at once with the embedded store).
    let engine = {
        let (mut leadership, token) = (leadership.clone(), token.clone());
        tokio::spawn(async move {
            if leadership.elected().await {
                // Admin labels first: until they are read, a job would see only what
                // agents say about themselves. In a cluster, the Nodes' labels.
                let labels = match cluster {
                    Some(client) => {
                        let placed = nodes.clone();
                        futures::future::Either::Left(async {
                            tokio::join!(
                                crate::cluster::nodes::keep_loaded(
                                    client.clone(),
                                    move |all| nodes.set_admin_labels(all),
                                    token.clone(),
                                ),
                                crate::cluster::pods::keep_placed(
                                    client,
                                    move |pods| placed.set_cluster_pods(pods),
                                    move |event: &kube::runtime::watcher::Event<_>| {
                                        if let Some(injected) = &injected_pods {
                                            injected.apply(event.clone());
                                        }
                                    },
                                    token.clone(),
                                )
                            );
                        })
                    }
                    None => {
                        match crate::fleet::node_labels::load(&store).await {
                            Ok(all) => nodes.set_admin_labels(all),
                            Err(error) => tracing::warn!(%error, "cannot read node labels yet"),
                        }
                        futures::future::Either::Right(crate::fleet::node_labels::keep_loaded(
                            store,
                            move |all| nodes.set_admin_labels(all),
                            token.clone(),
                        ))
                    }
                };
                // In a cluster only: NodeImages' pulls, and image lists made with kubectl.
                let cluster_only = async {
                    let node_images = async {
                        if let Some(engine) = node_images {
                            crate::engines::supervise_watching(engine, &watched, token.clone())
                                .await;
                        }
                    };
                    let lists = async {
                        if let Some(control) = lists {
                            let node_images = async {
                                if write_node_images {
                                    crate::serve::control::node_images::keep_written(
                                        control.clone(),
                                        token.clone(),
                                    )
                                    .await;
                                }
                            };
                            tokio::join!(
                                crate::serve::control::lists::keep_in_cluster(
                                    control.clone(),
                                    token.clone()
                                ),
                                node_images,
                            );
                        }
                    };
                    tokio::join!(node_images, lists);
                };
                // Beside Kruise's manager, its jobs and SidecarSets are its own. In a
                // cluster, jobs choose nodes only once the Nodes and Pods are listed.
                let loaded = gate.clone();
                let managers = async {
                    while in_cluster && !loaded.cluster_loaded() {
                        tokio::select! {
                            () = token.cancelled() => return,
                            () = tokio::time::sleep(std::time::Duration::from_millis(50)) => {}
                        }
                    }
                    if !kruise_manager {
                        // SidecarSets act on Rigger's own pods, or in a cluster on the
                        // cluster's (one watch of the pods they were injected into).
                        let sidecar_sets = async {
                            match cluster_rollout {
                                Some(rollout) => {
                                    crate::engines::supervise_watching(
                                        rollout,
                                        &watched,
                                        token.clone(),
                                    )
                                    .await;
                                }
                                None => crate::engines::supervise(sidecars, token.clone()).await,
                            }
                        };
                        tokio::join!(
                            crate::engines::supervise_watching(jobs, &watched, token.clone()),
                            sidecar_sets
                        );
                    }
                };
                let pending = async {
                    if let Some(pending) = pending_pods {
                        crate::engines::supervise_watching(pending, &watched, token.clone()).await;
                    }
                };
                tokio::join!(
                    labels,
                    managers,
                    crate::engines::supervise_watching(recreates, &watched, token.clone()),
                    cluster_only,
                    pending
                );
            }
        })
    };
    // grpc.health.v1: SERVING on the leader only for the API (and, outside a cluster, the
    // whole server ""), so that riggerctl finds the leader and Kubernetes' gRPC probes ask the
    // standard question (on the health listener too, which has no TLS, as they need).
    let (health_reporter, grpc_health) = tonic_health::server::health_reporter();
    for service in ["", CONTROL_SERVICE] {
        health_reporter
            .set_service_status(service, tonic_health::ServingStatus::NotServing)
            .await;
    }
    // In a cluster the whole server ("") is SERVING as soon as it is ready (below), so that
    // a `grpc:` readiness probe means what `/readyz` does.
    let in_cluster = matches!(elector, Some(Elector::Kubernetes(_)));
    {
        let (mut leadership, reporter) = (leadership.clone(), health_reporter.clone());
        tokio::spawn(async move {
            if leadership.elected().await {
                let services: &[&str] = if in_cluster {
                    &[CONTROL_SERVICE]
                } else {
                    &["", CONTROL_SERVICE]
                };
                for service in services {
                    reporter
                        .set_service_status(*service, tonic_health::ServingStatus::Serving)
                        .await;
                }
            }
        });
    }
    let mut builder = tonic::transport::Server::builder();
    match &tls {
        Some(tls) => {
            builder = builder.tls_config(tls.clone())?;
        }
        None => tracing::warn!(
            users = if matches!(users, UserAuth::Open) {
                "unauthenticated"
            } else {
                "bearer tokens"
            },
            "insecure_plaintext: no TLS, agents are not authenticated; use on trusted networks only"
        ),
    }
    let grpc_token = token.clone();
    let grpc = tokio::spawn(
        builder
            // An inventory of a node with many images, or a fleet's worth of objects,
            // outgrows gRPC's default 4 MiB per message.
            .add_service(tonic::service::interceptor::InterceptedService::new(
                AgentLinkServer::new(link).max_decoding_message_size(MAX_AGENT_MESSAGE),
                crate::serve::link::require_client_certificate(tls.is_some()),
            ))
            .add_service(ControlServer::new(control).max_decoding_message_size(MAX_OBJECT_MESSAGE))
            .add_service(grpc_health.clone())
            .serve_with_incoming_shutdown(TcpListenerStream::new(grpc_listener), async move {
                grpc_token.cancelled().await;
            }),
    );
    tokio::spawn(metrics.clone().run(metrics_sources, token.clone()));
    let readiness = Readiness::new("starting");
    let health_token = token.clone();
    let app = health::router(readiness.clone())
        .merge(rigger_daemon::metrics::router(Arc::new(metrics.registry())))
        .merge(tonic::service::Routes::new(grpc_health).into_axum_router());
    let health_server = tokio::spawn(
        axum::serve(health_listener, app)
            .with_graceful_shutdown(async move { health_token.cancelled().await })
            .into_future(),
    );
    // Ready: in a cluster, once this replica serves (every replica answers the webhook
    // and tells agents and users that another leads, as Kruise's manager is ready on its
    // webhook, not its leadership: with readiness on leadership a Deployment's rolling
    // update never finishes). Elsewhere (etcd behind a load balancer, which has no other
    // way to find the leader) a follower is alive but not ready.
    {
        let (mut leadership, readiness) = (leadership.clone(), readiness.clone());
        let reporter = health_reporter.clone();
        let mut webhook_serving = webhook_serving.clone();
        let shutdown = token.clone();
        if in_cluster {
            readiness.set_not_ready("starting: the SidecarSet webhook does not serve yet");
        } else if !leadership.is_leader() {
            readiness.set_not_ready("follower: another replica leads");
        }
        tokio::spawn(async move {
            let ready = if in_cluster {
                // A webhook that cannot read SidecarSets (their CRD or its rights missing)
                // denies the pods they match; it must not also keep the leader from
                // agents and users: Ready after a while, whatever the webhook says.
                // A webhook task that ended without serving leaves the replica not
                // Ready: its listener is gone, and the API server's calls routed to it
                // would fail pods (`failurePolicy: Fail`).
                tokio::select! {
                    () = shutdown.cancelled() => false,
                    serving = webhook_serving.wait_for(|serving| *serving) => serving.is_ok(),
                    () = tokio::time::sleep(WEBHOOK_PRIMING_PATIENCE) => {
                        tracing::warn!(patience = ?WEBHOOK_PRIMING_PATIENCE, "the SidecarSet webhook does not serve yet; ready anyway");
                        true
                    }
                }
            } else {
                leadership.elected().await
            };
            if ready && !shutdown.is_cancelled() {
                readiness.set_ready();
                if in_cluster {
                    reporter
                        .set_service_status("", tonic_health::ServingStatus::Serving)
                        .await;
                }
            }
        });
    }
    let status = format!(
        "serving agents and API on {}",
        grpc_address.map_or_else(|| config.listen.to_string(), |a| a.to_string())
    );
    systemd::ready(&status);
    tokio::spawn(systemd::watchdog(token.clone()));
    tracing::info!(
        listen = ?grpc_address,
        health_listen = ?health_address,
        "controller started"
    );

    // Stop on a signal, or when leadership (the etcd lease) is lost.
    let lost = async {
        match campaign.as_mut() {
            Some(task) => match task.await {
                Ok(Err(e)) => Some(e),
                Ok(Ok(())) | Err(_) => std::future::pending().await,
            },
            None => std::future::pending().await,
        }
    };
    let lost = tokio::select! {
        () = stop => None,
        lost = lost => lost,
    };
    if let Some(error) = &lost {
        tracing::error!(%error, "leadership lost");
    }
    tracing::info!(timeout = ?config.drain_timeout, "shutting down");
    systemd::stopping("draining");
    readiness.set_not_ready("shutting down");
    if in_cluster {
        health_reporter
            .set_service_status("", tonic_health::ServingStatus::NotServing)
            .await;
    }
    let outcome = drain(&token, config.drain_timeout, async {
        let grpc_result = grpc.await;
        let _ = health_server.await;
        let _ = engine.await;
        if let Some(webhook) = webhook {
            let _ = webhook.await;
        }
        if lost.is_none()
            && let Some(task) = campaign
        {
            // Resigning (the lease revoked) lets a follower take over at once.
            let _ = task.await;
        }
        grpc_result
    })
    .await;
    match outcome {
        Drain::Completed => tracing::info!("stopped cleanly"),
        Drain::TimedOut => tracing::warn!("drain timeout passed; stopping with work in flight"),
    }
    match lost {
        Some(error) => Err(ServerError::Leader(error)),
        None => Ok(()),
    }
}
