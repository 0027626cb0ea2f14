//! The agent's side of the agent link: one long-lived stream to the controller, opened
//! by the agent (so nodes behind NAT work). It registers the node (with the status of
//! every task it holds), reports the inventory beside the stream (`ReportInventory`, again
//! whenever it changed; in heartbeats to a controller without that call), sends
//! heartbeats, hands arriving tasks to the [`TaskRunner`] and reports their progress; it
//! reconnects with jittered backoff.

use std::collections::HashMap;
use std::time::Duration;

use rigger_proto::peer_grant::GrantVerifier;
use rigger_proto::v1 as proto;
use rigger_proto::v1::agent_link_client::AgentLinkClient;
use rigger_proto::v1::{AgentMessage, Heartbeat, Register, agent_message, controller_message};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::Endpoint;

use crate::inventory::Inventory;
use crate::inventory::SharedInventory;
use crate::pods::PodRunner;
use crate::tasks::TaskRunner;
use rigger_daemon::backoff::Backoff;

/// Who this agent is to the controller.
#[derive(Debug, Clone)]
pub struct LinkConfig {
    /// Controller replicas, tried in turn.
    pub controllers: Vec<Endpoint>,
    pub node_name: String,
    pub node_labels: HashMap<String, String>,
    /// `insecure_plaintext`: no TLS to the controller.
    pub plaintext: bool,
}

/// What the link carries for serving peers: this node's peer address (registered), and
/// the controller's grant key (from each registration's answer) for the peer endpoint.
#[derive(Debug)]
pub struct PeerLink {
    /// `None`: this node does not serve peers.
    pub address: Option<String>,
    pub grants: tokio::sync::watch::Sender<Option<GrantVerifier>>,
    /// The registry mirror's questions for the controller (`None`: no mirror).
    pub queries: Option<std::sync::Arc<crate::sharing::mirror::queries::PeerQueries>>,
}

impl PeerLink {
    /// Take the grant keys a registration's answer carries (none: peers get nothing).
    fn grant_keys(&self, public_pems: &[String]) {
        let verifier = if public_pems.is_empty() {
            None
        } else {
            match GrantVerifier::from_pems(public_pems.iter().map(String::as_bytes)) {
                Ok(verifier) => Some(verifier),
                Err(error) => {
                    tracing::warn!(%error, "the controller's peer grant key is unusable; serving peers nothing");
                    None
                }
            }
        };
        if self.address.is_some() && verifier.is_none() {
            tracing::warn!(
                "the controller has no peer grant key (peer_grant_key): serving peers nothing"
            );
        }
        self.grants.send_replace(verifier);
    }
}

/// Progress reports are sent at most this often (status changes are coalesced).
const REPORT_INTERVAL: Duration = Duration::from_millis(250);

/// Sets the link gauge back to 0 when a session ends.
struct LinkDown(prometheus_client::metrics::gauge::Gauge);

impl Drop for LinkDown {
    fn drop(&mut self) {
        self.0.set(0);
    }
}

/// Keep a session to the controller open until `token` is cancelled.
pub async fn maintain(
    config: LinkConfig,
    inventory: SharedInventory,
    tasks: TaskRunner,
    pods: PodRunner,
    peer: PeerLink,
    token: CancellationToken,
) {
    let mut backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(30));
    let mut followers_in_a_row: u32 = 0;
    let mut next = 0;
    loop {
        let started = std::time::Instant::now();
        let Some(controller) = config
            .controllers
            .get(next % config.controllers.len().max(1))
        else {
            return;
        };
        let mut registered = false;
        let outcome = tokio::select! {
            _ = token.cancelled() => return,
            outcome = session(controller, &config, &inventory, &tasks, &pods, &peer, &mut registered) => outcome,
        };
        // The next attempt goes to the next replica (a follower refuses agents).
        next += 1;
        // A link the controller took in and kept a while worked: what ended it is new,
        // not one more failure in a row — otherwise each leader change of a rolling
        // controller upgrade would add to the wait before the next. One that ends at
        // once (a controller crash-looping, a hostile one) keeps backing off.
        if registered && started.elapsed() >= STEADY_SESSION {
            backoff.reset();
        }
        followers_in_a_row = match &outcome {
            Err(SessionError::Follower(_)) => {
                // A replica answered: the controllers are up, whatever failed before.
                backoff.reset();
                followers_in_a_row.saturating_add(1)
            }
            _ => 0,
        };
        let delay = match retry_after_follower(followers_in_a_row, fastrand::f64()) {
            Some(soon) => soon,
            None => backoff.next_delay(),
        };
        match outcome {
            Ok(()) => tracing::info!(retry_in = ?delay, "controller closed the link"),
            Err(SessionError::Follower(reason)) => {
                tracing::info!(%reason, retry_in = ?delay, "a follower answered; trying again");
            }
            Err(SessionError::Down(reason)) => {
                tracing::warn!(%reason, retry_in = ?delay, "controller link down");
            }
        }
        tokio::select! {
            _ = token.cancelled() => return,
            _ = tokio::time::sleep(delay) => {}
        }
    }
}

/// A registered session that lasted this long starts the backoff again.
const STEADY_SESSION: Duration = Duration::from_secs(10);

/// Quick tries after a follower's refusal before the agent slows down.
const FOLLOWER_RETRIES: u32 = 5;

/// The wait after the `in_a_row`-th follower refusal in a row (`jitter` in 0..1), or `None`
/// for the usual backoff (no follower answered). Behind a Service every controller replica
/// is Ready and each new connection lands on any of them: a follower answering is the
/// normal case, not a fault, so the agent soon tries a new connection — 100–300 ms apart
/// [`FOLLOWER_RETRIES`] times, then 1–2 s apart (no replica seems to lead yet: an election,
/// or the new leader not yet behind the Service), never the failure backoff's growing
/// wait: a controller that answers is up, and an agent that waited 30 s there came back
/// to a new leader after its start had ended (found in CI: agents 20–70 s late, a job
/// completed without them).
fn retry_after_follower(in_a_row: u32, jitter: f64) -> Option<Duration> {
    let jitter = jitter.clamp(0.0, 1.0);
    match in_a_row {
        0 => None,
        n if n <= FOLLOWER_RETRIES => Some(Duration::from_millis(100).mul_f64(1.0 + 2.0 * jitter)),
        _ => Some(Duration::from_secs(1).mul_f64(1.0 + jitter)),
    }
}

/// How a session ended badly.
#[derive(Debug)]
enum SessionError {
    /// A follower refused it: another replica leads.
    Follower(String),
    /// Anything else: unreachable, refused, broken.
    Down(String),
}

impl From<String> for SessionError {
    fn from(reason: String) -> Self {
        Self::Down(reason)
    }
}

impl SessionError {
    /// A refusal by the controller, told apart by whether a follower made it.
    fn refused(what: &str, status: &tonic::Status) -> Self {
        let reason = format!("{what}: {}", status.message());
        if rigger_proto::refused_by_follower(status) {
            Self::Follower(reason)
        } else {
            Self::Down(reason)
        }
    }
}

#[tracing::instrument(level = "debug", skip_all, fields(node = %config.node_name, controller = %controller.uri()))]
async fn session(
    controller: &Endpoint,
    config: &LinkConfig,
    inventory: &SharedInventory,
    tasks: &TaskRunner,
    pods: &PodRunner,
    peer: &PeerLink,
    registered: &mut bool,
) -> Result<(), SessionError> {
    let channel = controller.connect().await.map_err(|e| {
        format!(
            "cannot connect to {}: {}",
            controller.uri(),
            rigger_daemon::error_chain(&e)
        )
    })?;
    let (tx, rx) = mpsc::channel::<AgentMessage>(4);
    let (collected_at, current) = snapshot(inventory).await;
    // When the node has an inventory it follows the Register, beside the session.
    let inventory_follows = current.is_some();
    let mut sent_at = None;
    let mut changes = tasks.subscribe();
    let mut reported = *changes.borrow_and_update();
    let mut pod_changes = pods.subscribe();
    // Every pod status goes to a new session (below): the controller may have missed some.
    let mut pods_reported;
    let register = AgentMessage {
        message: Some(agent_message::Message::Register(Register {
            node_name: config.node_name.clone(),
            labels: config.node_labels.clone(),
            agent_version: crate::VERSION.to_owned(),
            inventory: None,
            tasks: tasks.all_statuses(),
            peer_address: peer.address.clone().unwrap_or_default(),
            inventory_follows,
        })),
    };
    tx.send(register)
        .await
        .map_err(|_| "link closed before Register".to_owned())?;
    let mut client = AgentLinkClient::new(channel);
    let mut inbound = client
        .clone()
        .session(ReceiverStream::new(rx))
        .await
        .map_err(|s| SessionError::refused("session refused", &s))?
        .into_inner();

    let (interval, session, controller_version) = match inbound.message().await {
        Ok(Some(m)) => match m.message {
            Some(controller_message::Message::RegisterAck(ack)) => {
                peer.grant_keys(&ack.peer_grant_public_keys);
                let interval =
                    Duration::from_secs(u64::from(ack.heartbeat_interval_seconds.max(1)));
                (interval, ack.session, ack.controller_version)
            }
            _ => {
                return Err("controller did not answer Register with RegisterAck"
                    .to_owned()
                    .into());
            }
        },
        Ok(None) => {
            return Err("controller closed the link during registration"
                .to_owned()
                .into());
        }
        Err(s) => return Err(SessionError::refused("registration refused", &s)),
    };
    // Empty from a controller older than 0.2.0, which named no version.
    let controller_version = if controller_version.is_empty() {
        "older than 0.2.0"
    } else {
        controller_version.as_str()
    };
    tracing::info!(controller = %controller.uri(), %controller_version, agent_version = crate::VERSION, heartbeat = ?interval, "registered with the controller");
    *registered = true;
    // 0: a controller without ReportInventory; the first heartbeat (at once) carries it.
    let report_by_call = session != 0;
    if report_by_call && let Some(current) = current {
        report_inventory(&mut client, &config.node_name, session, current).await?;
        sent_at = collected_at;
    }
    // Up while this session lasts; down however it ends.
    let link_up = tasks.metrics().link_up.clone();
    link_up.set(1);
    let _down = LinkDown(link_up);

    pods_reported = *pod_changes.borrow_and_update();
    send_all(
        &tx,
        pods.statuses_since(0)
            .into_iter()
            .map(agent_message::Message::PodStatus),
    )
    .await?;

    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut sequence = 0u64;
    let mut questions = match &peer.queries {
        Some(queries) => Some(queries.questions().await),
        None => None,
    };
    loop {
        let question = async {
            match questions.as_mut() {
                Some(questions) => questions.next().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            Some(query) = question => {
                let message = AgentMessage {
                    message: Some(agent_message::Message::PeerQuery(query)),
                };
                tx.send(message).await.map_err(|_| "link closed".to_owned())?;
            }
            _ = ticker.tick() => {
                sequence += 1;
                let (collected_at, current) = snapshot(inventory).await;
                // Only send the inventory when it changed: heartbeats stay small.
                let changed = collected_at != sent_at;
                if changed {
                    sent_at = collected_at;
                }
                let mut inventory = current.filter(|_| changed);
                if report_by_call && let Some(current) = inventory.take() {
                    report_inventory(&mut client, &config.node_name, session, current).await?;
                }
                let heartbeat = AgentMessage {
                    message: Some(agent_message::Message::Heartbeat(Heartbeat {
                        sequence,
                        inventory,
                    })),
                };
                tx.send(heartbeat).await.map_err(|_| "link closed".to_owned())?;
            }
            message = inbound.message() => match message {
                Ok(Some(message)) => match message.message {
                    Some(controller_message::Message::Task(task)) => {
                        match for_this_node(task, &config.node_name) {
                            Ok(task) => tasks.accept(task),
                            Err(refusal) => tracing::warn!(%refusal, "task refused"),
                        }
                    }
                    Some(controller_message::Message::CancelTask(cancel)) => {
                        tasks.cancel(&cancel.id, &cancel.reason);
                    }
                    Some(controller_message::Message::Pods(set)) => pods.set_desired(set.pods),
                    Some(controller_message::Message::Request(request)) => {
                        // Answered on the side: an exec may take a while.
                        let (pods, tx) = (pods.clone(), tx.clone());
                        tokio::spawn(async move {
                            let response = pods.answer(request).await;
                            let _ = tx
                                .send(AgentMessage {
                                    message: Some(agent_message::Message::Response(response)),
                                })
                                .await;
                        });
                    }
                    Some(controller_message::Message::PeerAnswer(answer)) => {
                        if let Some(queries) = &peer.queries {
                            queries.answer(answer);
                        }
                    }
                    Some(controller_message::Message::RegisterAck(_)) | None => {}
                },
                Ok(None) => return Ok(()),
                Err(s) => return Err(SessionError::refused("link ended", &s)),
            },
            changed = changes.changed() => {
                if changed.is_err() {
                    return Err("the task runner stopped".to_owned().into());
                }
                let now = *changes.borrow_and_update();
                let statuses = tasks.statuses_since(reported);
                send_all(&tx, statuses.into_iter().map(agent_message::Message::TaskStatus)).await?;
                reported = now;
                // Coalesce: progress of a fast pull changes many times a second.
                tokio::time::sleep(REPORT_INTERVAL).await;
            }
            changed = pod_changes.changed() => {
                if changed.is_err() {
                    return Err("the pod runner stopped".to_owned().into());
                }
                let now = *pod_changes.borrow_and_update();
                let statuses = pods.statuses_since(pods_reported);
                send_all(&tx, statuses.into_iter().map(agent_message::Message::PodStatus)).await?;
                pods_reported = now;
            }
        }
    }
}

/// Report the node's inventory beside session `session`.
async fn report_inventory(
    client: &mut AgentLinkClient<tonic::transport::Channel>,
    node: &str,
    session: u64,
    inventory: proto::NodeInventory,
) -> Result<(), String> {
    client
        .report_inventory(proto::InventoryReport {
            node_name: node.to_owned(),
            session,
            inventory: Some(inventory),
        })
        .await
        .map(drop)
        .map_err(|s| format!("inventory report refused: {}", s.message()))
}

/// Queue `messages` on the link, in order.
async fn send_all(
    tx: &mpsc::Sender<AgentMessage>,
    messages: impl IntoIterator<Item = agent_message::Message>,
) -> Result<(), String> {
    for message in messages {
        tx.send(AgentMessage {
            message: Some(message),
        })
        .await
        .map_err(|_| "link closed".to_owned())?;
    }
    Ok(())
}

async fn snapshot(inventory: &SharedInventory) -> (Option<String>, Option<proto::NodeInventory>) {
    let guard = inventory.read().await;
    (
        guard.as_ref().map(|i| i.collected_at.clone()),
        guard.as_ref().map(to_proto),
    )
}

/// The inventory in the protocol's shape.
pub fn to_proto(inv: &Inventory) -> proto::NodeInventory {
    let fs = inv.host.filesystem.as_ref();
    proto::NodeInventory {
        runtime: Some(proto::RuntimeInfo {
            containerd_version: inv.runtime.containerd.version.clone(),
            containerd_revision: inv.runtime.containerd.revision.clone(),
            cri_runtime_name: inv
                .runtime
                .cri
                .as_ref()
                .map(|c| c.runtime_name.clone())
                .unwrap_or_default(),
            cri_runtime_version: inv
                .runtime
                .cri
                .as_ref()
                .map(|c| c.runtime_version.clone())
                .unwrap_or_default(),
            cri_api_version: inv
                .runtime
                .cri
                .as_ref()
                .map(|c| c.api_version.clone())
                .unwrap_or_default(),
            root_dir: inv.runtime.root_dir.clone().unwrap_or_default(),
            root_bytes_used: inv.runtime.root_bytes_used.unwrap_or_default(),
        }),
        images: inv
            .images
            .iter()
            .map(|i| proto::Image {
                namespace: i.namespace.clone(),
                name: i.name.clone(),
                digest: i.digest.clone(),
                media_type: i.media_type.clone(),
                size: i.size.unwrap_or_default(),
            })
            .collect(),
        pods: inv
            .pods
            .iter()
            .map(|p| proto::PodSandbox {
                id: p.id.clone(),
                namespace: p.namespace.clone(),
                name: p.name.clone(),
                uid: p.uid.clone(),
                state: p.state.clone(),
                created_at: rigger_proto::time::timestamp_from_rfc3339(p.created_at.as_deref()),
                attempt: p.attempt,
                labels: p.labels.clone().into_iter().collect(),
                owner: p.owner.as_str().to_owned(),
            })
            .collect(),
        containers: inv
            .containers
            .iter()
            .map(|c| proto::Container {
                id: c.id.clone(),
                pod_sandbox_id: c.pod_sandbox_id.clone().unwrap_or_default(),
                pod_namespace: c.pod_namespace.clone().unwrap_or_default(),
                pod_name: c.pod_name.clone().unwrap_or_default(),
                name: c.name.clone(),
                image: c.image.clone(),
                state: c.state.clone(),
                attempt: c.attempt,
                restart_count: c.restart_count,
                started_at: rigger_proto::time::timestamp_from_rfc3339(c.started_at.as_deref()),
            })
            .collect(),
        host: Some(proto::HostInfo {
            hostname: inv.host.hostname.clone().unwrap_or_default(),
            kernel_version: inv.host.kernel_version.clone().unwrap_or_default(),
            cpus: u32::try_from(inv.host.cpus).unwrap_or(u32::MAX),
            load_average_1m: inv.host.load_average[0],
            memory_total_bytes: inv.host.memory_total_bytes,
            memory_available_bytes: inv.host.memory_available_bytes,
            filesystem_mount_point: fs.map(|f| f.mount_point.clone()).unwrap_or_default(),
            filesystem_total_bytes: fs.map_or(0, |f| f.total_bytes),
            filesystem_available_bytes: fs.map_or(0, |f| f.available_bytes),
        }),
        warnings: inv.warnings.clone(),
    }
}

/// A task is only run by the node it names: a controller that mixed up its nodes (or an
/// impostor that got hold of the stream) cannot make this node pull or restart anything
/// meant for another.
fn for_this_node(task: proto::Task, node: &str) -> Result<proto::Task, String> {
    if task.node_name == node {
        Ok(task)
    } else {
        Err(format!(
            "task {:?} is for node {:?}, this is node {node:?}",
            task.id, task.node_name
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_followers_refusal_is_tried_again_soon_a_few_times_then_every_second_or_two() {
        assert_eq!(
            retry_after_follower(0, 0.5),
            None,
            "no follower: the backoff"
        );
        for jitter in [0.0, 0.5, 1.0, 7.0, -3.0] {
            for in_a_row in 1..=FOLLOWER_RETRIES {
                let soon = retry_after_follower(in_a_row, jitter).unwrap();
                assert!(
                    (Duration::from_millis(100)..=Duration::from_millis(300)).contains(&soon),
                    "{soon:?}"
                );
            }
            // However long no replica leads, never the failure backoff's 30 s.
            for in_a_row in [FOLLOWER_RETRIES + 1, 50, u32::MAX] {
                let later = retry_after_follower(in_a_row, jitter).unwrap();
                assert!(
                    (Duration::from_secs(1)..=Duration::from_secs(2)).contains(&later),
                    "{later:?}"
                );
            }
        }
    }

    #[test]
    fn a_refusal_is_a_followers_by_its_metadata_or_older_controllers_words() {
        let mut marked = tonic::Status::unavailable("busy");
        marked.metadata_mut().insert(
            rigger_proto::NOT_LEADER,
            tonic::metadata::MetadataValue::from_static("1"),
        );
        assert!(matches!(
            SessionError::refused("session refused", &marked),
            SessionError::Follower(reason) if reason == "session refused: busy"
        ));
        let older =
            tonic::Status::unavailable("not the leader: this controller replica is a follower");
        assert!(matches!(
            SessionError::refused("session refused", &older),
            SessionError::Follower(_)
        ));
        for other in [
            tonic::Status::unavailable("connection reset"),
            tonic::Status::permission_denied("not the leader"),
        ] {
            assert!(matches!(
                SessionError::refused("session refused", &other),
                SessionError::Down(_)
            ));
        }
    }

    #[test]
    fn tasks_for_another_node_are_refused() {
        let task = |node: &str| proto::Task {
            id: "job/uid/n1/1".to_owned(),
            node_name: node.to_owned(),
            work: None,
        };
        assert!(for_this_node(task("n1"), "n1").is_ok());
        let refusal = for_this_node(task("n2"), "n1").unwrap_err();
        assert_eq!(
            refusal,
            r#"task "job/uid/n1/1" is for node "n2", this is node "n1""#
        );
        assert!(
            for_this_node(task(""), "n1").is_err(),
            "a task naming no node"
        );
    }
}
