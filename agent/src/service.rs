//! `rigger-agent run`: the long-running agent.
//!
//! It keeps a fresh node inventory, serves it with its health endpoints, and (with a
//! controller configured) keeps the link to the controller; node operations plug in here.
//!
//! Start-up order matters: the config is already validated (see [`crate::config`]), then
//! the HTTP listener is bound, then containerd is contacted once, then systemd is told
//! READY. `/readyz` follows containerd's reachability from then on.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use rigger_daemon::health::{self, Readiness};
use rigger_daemon::shutdown::{Drain, drain};
use rigger_daemon::systemd;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::config::AgentConfig;
use crate::inventory::{self, InventoryOptions, SharedInventory};
use rigger_daemon::backoff::Backoff;
use rigger_pull::Puller;
use rigger_pull::containerd::{Containerd, grpc::Grpc};
use rigger_runtime::{Connection, DEFAULT_CONNECT_TIMEOUT};

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("cannot listen on {address} (health_listen): {source}")]
    Bind {
        address: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("health endpoint failed: {0}")]
    Serve(std::io::Error),
    #[error("state directory {}: {source}", path.display())]
    StateDir {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Tasks(#[from] crate::tasks::TaskError),
    #[error(transparent)]
    Pods(#[from] crate::pods::PodError),
    #[error(transparent)]
    Peers(#[from] crate::sharing::peers::serve::ServeError),
    #[error(transparent)]
    Mirror(#[from] crate::sharing::mirror::BindError),
}

#[derive(Debug, Clone)]
struct AppState {
    inventory: SharedInventory,
}

/// The state directory holds pod specs (their env values) and task records: root only,
/// whatever the umask or a previous owner left.
fn private_state_dir(path: &std::path::Path) -> Result<(), DaemonError> {
    use std::os::unix::fs::PermissionsExt as _;
    let error = |source| DaemonError::StateDir {
        path: path.to_owned(),
        source,
    };
    std::fs::create_dir_all(path).map_err(error)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700)).map_err(error)
}

/// How often the image filesystem gauges are measured (more often until containerd
/// first says where its filesystems are).
const IMAGE_FS_MEASURE: std::time::Duration = std::time::Duration::from_secs(30);
const IMAGE_FS_FIRST_MEASURE: std::time::Duration = std::time::Duration::from_secs(2);

async fn measure_image_filesystems(
    puller: Puller,
    metrics: Arc<crate::metrics::AgentMetrics>,
    token: CancellationToken,
) {
    loop {
        let every = if metrics.measure_image_filesystems(&puller).await == 0 {
            IMAGE_FS_FIRST_MEASURE
        } else {
            IMAGE_FS_MEASURE
        };
        tokio::select! {
            () = token.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
    }
}

/// Run until `stop` resolves, then drain within the configured timeout.
pub async fn run(config: AgentConfig, stop: impl Future<Output = ()>) -> Result<(), DaemonError> {
    private_state_dir(&config.state_dir)?;
    let token = CancellationToken::new();
    let metrics = Arc::new(crate::metrics::AgentMetrics::new());
    let registry = Arc::new(metrics.registry());
    // One connection to containerd and one pull engine for everything on the node: the
    // pull limits (connections, rate) hold for jobs, pods and updates together.
    let connection = Arc::new(Connection::new(
        config.containerd_address(),
        DEFAULT_CONNECT_TIMEOUT,
    ));
    let containerd: Arc<dyn Containerd> = Arc::new(Grpc::new(connection.clone()));
    let puller = Puller::on(
        containerd.clone(),
        config.pull.pull_options(&config.state_dir),
    );
    // Pods come from a controller: without one, there are none to run.
    let pods = crate::pods::PodRunner::start(
        config.link.as_ref().map_or("", |l| l.node_name.as_str()),
        &config.state_dir,
        connection.clone(),
        &puller,
        metrics.clone(),
        token.child_token(),
    )?;
    // How full containerd's filesystems are, for the operator's alerts (and the disk
    // guard's threshold beside it).
    tokio::spawn(measure_image_filesystems(
        puller.clone(),
        metrics.clone(),
        token.child_token(),
    ));
    // Blobs the node's pulls are writing, which its peer endpoint serves as they arrive.
    let arriving = config
        .peer
        .is_some()
        .then(rigger_pull::arriving::Arriving::default);
    // Only the tasks' pulls are announced: the peer endpoint serves the tasks' namespace.
    let task_puller = match &arriving {
        Some(arriving) => puller.announcing(arriving.clone()),
        None => puller,
    };
    // Tasks accepted before a restart are loaded (and resumed) before anything binds.
    let tasks = crate::tasks::TaskRunner::start(
        &config.state_dir,
        connection.clone(),
        task_puller,
        crate::tasks::PeerSide {
            identity: config.node_identity.clone(),
            pace: config.peer_pace,
        },
        pods.clone(),
        metrics.clone(),
        token.child_token(),
    )?;
    let listener = tokio::net::TcpListener::bind(config.health_listen)
        .await
        .map_err(|source| DaemonError::Bind {
            address: config.health_listen,
            source,
        })?;
    let local = listener.local_addr().map_err(DaemonError::Serve)?;
    tracing::info!(address = %local, "serving /healthz, /readyz and /inventory");

    // The controller's grant key comes with each registration; until then peers get
    // nothing.
    let (grants, grants_seen) = watch::channel(None);
    let peers = match (&config.peer, arriving) {
        (Some(peer), Some(arriving)) => Some(
            crate::sharing::peers::start(
                peer,
                containerd,
                &config.pull.namespace,
                arriving,
                grants_seen,
                metrics.clone(),
                token.clone(),
            )
            .await?,
        ),
        _ => None,
    };

    // The registry mirror for the node's containerd, with the questions it asks the
    // controller over the link.
    let queries = config
        .mirror_listen
        .map(|_| Arc::new(crate::sharing::mirror::queries::PeerQueries::default()));
    let mirror = match (config.mirror_listen, &config.node_identity, &queries) {
        (Some(listen), Some(identity), Some(queries)) => Some(
            crate::sharing::mirror::start(
                listen,
                &config.state_dir.join("mirror"),
                identity.clone(),
                config.peer_pace,
                queries.clone(),
                metrics.clone(),
                token.clone(),
            )
            .await?,
        ),
        _ => None,
    };

    let readiness = Readiness::new("containerd not contacted yet");
    let shared: SharedInventory = Arc::default();

    let app: Router = health::router(readiness.clone())
        .merge(rigger_daemon::metrics::router(registry))
        .merge(
            Router::new()
                .route("/inventory", get(get_inventory))
                .with_state(AppState {
                    inventory: shared.clone(),
                }),
        );
    let server_token = token.clone();
    let server = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move { server_token.cancelled().await })
            .await
    });

    let (first_round_tx, mut first_round) = watch::channel(false);
    let refresher = tokio::spawn(refresh_inventory(
        config.clone(),
        connection.clone(),
        readiness.clone(),
        shared.clone(),
        token.clone(),
        first_round_tx,
    ));
    let link = config.link.clone().map(|link| {
        if link.plaintext {
            tracing::warn!(
                controllers = link.controllers.len(),
                node = %link.node_name,
                "insecure_plaintext: the controller link is unencrypted and unauthenticated; use on trusted networks only"
            );
        }
        let peer = crate::link::PeerLink {
            address: config.peer.as_ref().map(|p| p.address.clone()),
            grants,
            queries,
        };
        tokio::spawn(crate::link::maintain(
            link,
            shared.clone(),
            tasks.clone(),
            pods.clone(),
            peer,
            token.clone(),
        ))
    });
    // READY once we have tried containerd, so `systemctl start` returns with a real
    // status line; the agent stays up (not ready) if containerd is down.
    let _ = first_round.wait_for(|done| *done).await;
    let status = match readiness.check() {
        Ok(()) => "ready: connected to containerd".to_owned(),
        Err(reason) => format!("running, not ready: {reason}"),
    };
    systemd::ready(&status);
    tokio::spawn(systemd::watchdog(token.clone()));
    tracing::info!(%status, "agent started");

    stop.await;
    tracing::info!(timeout = ?config.drain_timeout, "shutting down");
    systemd::stopping("draining");
    let outcome = drain(&token, config.drain_timeout, async {
        let _ = refresher.await;
        if let Some(link) = link {
            let _ = link.await;
        }
        if let Some(peers) = peers {
            let _ = peers.await;
        }
        if let Some(mirror) = mirror {
            let _ = mirror.await;
        }
        server.await
    })
    .await;
    match outcome {
        Drain::Completed => tracing::info!("stopped cleanly"),
        Drain::TimedOut => tracing::warn!("drain timeout passed; stopping with work in flight"),
    }
    Ok(())
}

async fn get_inventory(State(state): State<AppState>) -> Response {
    match &*state.inventory.read().await {
        Some(inventory) => Json(inventory.clone()).into_response(),
        None => (
            StatusCode::SERVICE_UNAVAILABLE,
            "inventory not collected yet\n",
        )
            .into_response(),
    }
}

/// Keep the inventory fresh; reconnect to containerd with backoff when it goes away.
async fn refresh_inventory(
    config: AgentConfig,
    connection: Arc<Connection>,
    readiness: Readiness,
    shared: SharedInventory,
    token: CancellationToken,
    first_round: watch::Sender<bool>,
) {
    let mut backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(30));
    let mut connected = false;
    loop {
        let wait = match refresh_once(&connection, &mut connected, &shared).await {
            Ok(()) => {
                readiness.set_ready();
                backoff.reset();
                config.inventory_interval
            }
            Err(reason) => {
                tracing::warn!(%reason, "containerd unavailable");
                readiness.set_not_ready(reason);
                connected = false;
                backoff.next_delay().min(config.inventory_interval)
            }
        };
        first_round.send_replace(true);
        tokio::select! {
            _ = token.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

#[tracing::instrument(level = "debug", skip_all)]
async fn refresh_once(
    connection: &Connection,
    connected: &mut bool,
    shared: &SharedInventory,
) -> Result<(), String> {
    let runtime = connection.runtime().await.map_err(|e| e.to_string())?;
    if !*connected {
        tracing::info!(version = %runtime.version().version, "connected to containerd");
        *connected = true;
    }
    let collected = match inventory::collect(&runtime, &InventoryOptions::default()).await {
        Ok(collected) => collected,
        Err(error) => {
            if let inventory::InventoryError::Call(call) = &error {
                connection.failed(&call.status).await;
            }
            return Err(error.to_string());
        }
    };
    tracing::debug!(
        images = collected.images.len(),
        pods = collected.pods.len(),
        containers = collected.containers.len(),
        "inventory refreshed"
    );
    *shared.write().await = Some(collected);
    Ok(())
}
