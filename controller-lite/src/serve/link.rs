//! The controller's side of the agent link: one bidirectional stream per agent.
//!
//! The agent opens the stream (so agents behind NAT work), sends `Register` (with the
//! status of the tasks it holds), then heartbeats and task reports; the controller
//! answers `RegisterAck`, then sends tasks as the job engine hands them out.

use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::channel::mpsc;
use rigger_proto::v1::agent_link_server::AgentLink;
use rigger_proto::v1::{
    AgentMessage, ControllerMessage, InventoryReport, InventoryReportAck, PeerAnswer, RegisterAck,
    agent_message, controller_message,
};
use tokio_stream::Stream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};

use rigger_proto::peer_grant::is_sha256_digest;

use crate::serve::peer_queries::{Admission, PeerQueryGate, Question};

use crate::engines::jobs::JobEngine;
use crate::engines::node_images::{NodeImageEngine, is_node_image_task};
use crate::engines::pods::PodSync;
use crate::engines::recreate_requests::{RecreateEngine, is_recreate_task};
use crate::fleet::nodes::{NodeRegistry, SessionId};
use rigger_store::Leadership;

/// Messages queued for one agent before the engine holds back (and offers them again).
const AGENT_QUEUE: usize = 64;

/// One per controller, shared by every session's task (a clone is one pointer: each of
/// ten thousand waiting sessions holds one).
#[derive(Debug, Clone)]
pub struct AgentLinkService(Arc<Link>);

#[derive(Debug, Clone)]
pub struct Link {
    nodes: NodeRegistry,
    jobs: JobEngine,
    recreates: RecreateEngine,
    /// In a cluster: NodeImages' pulls (Kruise's daemon's part).
    node_images: Option<NodeImageEngine>,
    pods: PodSync,
    leadership: Leadership,
    /// Agents must present a client certificate valid for the node they register.
    mtls: bool,
    heartbeat_interval: Duration,
    node_timeout: Duration,
    /// What agents check peer grants with (SPKI PEM, the signing key first); empty: no
    /// grants are signed.
    peer_grant_public_keys: Arc<[String]>,
    /// The mirrors' questions, gated per node.
    peer_queries: Arc<PeerQueryGate>,
    shutdown: CancellationToken,
}

impl std::ops::Deref for AgentLinkService {
    type Target = Link;

    fn deref(&self) -> &Link {
        &self.0
    }
}

/// Refuses an agent-link call without a client certificate before its body is read: a
/// unary call's message is decoded whole before the handler runs (up to the link's
/// message limit), so checking in the handler would let anyone who reaches the port make
/// the controller hold that much per call. Certificates are optional at the TLS layer
/// only because riggerctl's users bring tokens instead.
pub fn require_client_certificate(
    mtls: bool,
) -> impl FnMut(Request<()>) -> Result<Request<()>, Status> + Clone {
    move |request: Request<()>| {
        if mtls && request.peer_certs().is_none() {
            return Err(crate::serve::auth::no_client_certificate());
        }
        Ok(request)
    }
}

/// The longest agent version kept (a semantic version is far shorter).
const MAX_AGENT_VERSION: usize = 64;

impl AgentLinkService {
    /// Route NodeImage tasks' reports to `engine` (in a cluster).
    #[must_use]
    pub fn with_node_images(mut self, engine: NodeImageEngine) -> Self {
        Arc::make_mut(&mut self.0).node_images = Some(engine);
        self
    }

    #[allow(clippy::too_many_arguments)] // the link's collaborators, each used once
    pub fn new(
        nodes: NodeRegistry,
        jobs: JobEngine,
        recreates: RecreateEngine,
        pods: PodSync,
        leadership: Leadership,
        mtls: bool,
        heartbeat_interval: Duration,
        node_timeout: Duration,
        peer_grant_public_keys: Vec<String>,
        shutdown: CancellationToken,
    ) -> Self {
        Self(Arc::new(Link {
            nodes,
            jobs,
            recreates,
            node_images: None,
            pods,
            leadership,
            mtls,
            heartbeat_interval,
            node_timeout,
            peer_grant_public_keys: peer_grant_public_keys.into(),
            peer_queries: Arc::default(),
            shutdown,
        }))
    }
}

impl AgentLinkService {
    /// The answer to a mirror's question, within the node's allowance; any digest an
    /// agent names is only looked up, never echoed.
    fn mirror_peers(
        &self,
        node: &str,
        image: String,
        repository: String,
        registry: String,
    ) -> Vec<rigger_proto::v1::PeerSource> {
        if !is_sha256_digest(&image) || repository.len() > 255 || registry.len() > 255 {
            return Vec::new();
        }
        let question = Question {
            node: node.to_owned(),
            image,
            repository,
            registry,
        };
        let now = std::time::Instant::now();
        match self.peer_queries.admit(&question, now) {
            Admission::Look => {}
            Admission::Limited => {
                tracing::debug!(%node, "mirror questions past the node's allowance: answered nobody");
                return Vec::new();
            }
            Admission::KnownNobody => return Vec::new(),
        }
        let peers = self.jobs.mirror_peers(
            node,
            &question.image,
            &question.repository,
            &question.registry,
        );
        self.peer_queries.answered(question, !peers.is_empty(), now);
        peers
    }
}

/// A session's id: not guessable from others (it is all that binds an inventory report
/// to its session where no certificate names the node, with `insecure_plaintext`), so
/// without the system's randomness there is no session. Never 0, which tells an agent
/// the controller has none.
fn new_session_id() -> Result<SessionId, Status> {
    getrandom::u64()
        .map(|random| random | 1)
        .map_err(|e| Status::unavailable(format!("no random session id: {e}")))
}

impl AgentLinkService {
    /// The certificates an agent's call came with: required with mTLS (the interceptor
    /// refused calls without one already; this holds wherever the service is served),
    /// checked against the node's name once the call names it.
    fn identity<T>(&self, request: &Request<T>) -> Result<Option<Identity>, Status> {
        if !self.mtls {
            return Ok(None);
        }
        request
            .peer_certs()
            .map(Some)
            .ok_or_else(crate::serve::auth::no_client_certificate)
    }
}

/// An agent's client certificates, leaf first, verified against the CA by the handshake.
type Identity = Arc<Vec<rustls_pki_types::CertificateDer<'static>>>;

/// Whether `identity` (none without mTLS) is node `name`'s.
fn check_identity(identity: Option<&Identity>, name: &str) -> Result<(), Status> {
    identity.map_or(Ok(()), |certs| {
        crate::serve::auth::check_certificates(certs, name)
    })
}

type MessageStream = Pin<Box<dyn Stream<Item = Result<ControllerMessage, Status>> + Send>>;

#[tonic::async_trait]
impl AgentLink for AgentLinkService {
    type SessionStream = MessageStream;

    async fn report_inventory(
        &self,
        request: Request<InventoryReport>,
    ) -> Result<Response<InventoryReportAck>, Status> {
        self.leadership.require()?;
        let identity = self.identity(&request)?;
        let report = request.into_inner();
        rigger_proto::check_node_name(&report.node_name).map_err(Status::invalid_argument)?;
        check_identity(identity.as_ref(), &report.node_name)?;
        let inventory = report
            .inventory
            .ok_or_else(|| Status::invalid_argument("InventoryReport.inventory is missing"))?;
        let node = &report.node_name;
        match self
            .nodes
            .inventory_report(node, report.session, &inventory, SystemTime::now())
        {
            None => Err(Status::failed_precondition(format!(
                "session {} is not node {node}'s current session",
                report.session
            ))),
            Some(was_waiting) => {
                // Not woken: the engines' next tick (500 ms) finds the node ready; a
                // registering fleet would otherwise wake them once more per node.
                if was_waiting {
                    tracing::debug!(%node, session = report.session, "inventory received; node ready");
                }
                Ok(Response::new(InventoryReportAck {}))
            }
        }
    }

    async fn session(
        &self,
        request: Request<Streaming<AgentMessage>>,
    ) -> Result<Response<Self::SessionStream>, Status> {
        self.leadership.require()?;
        let peer = request
            .remote_addr()
            .map_or_else(|| "unknown".to_owned(), |a| a.to_string());
        // Checked with the name once Register arrives.
        let identity = self.identity(&request).inspect_err(|_| {
            tracing::warn!(%peer, "agent session refused: no client certificate");
        })?;
        let mut inbound = request.into_inner();
        let first = self
            .next_message(&mut inbound, "no Register message in time")
            .await?;
        let mut register = match first.and_then(|m| m.message) {
            Some(agent_message::Message::Register(register)) => register,
            _ => {
                return Err(Status::invalid_argument(
                    "the first message must be Register",
                ));
            }
        };
        rigger_proto::check_node_name(&register.node_name).map_err(Status::invalid_argument)?;
        check_identity(identity.as_ref(), &register.node_name).inspect_err(|status| {
            tracing::warn!(%peer, node = %register.node_name, reason = %status.message(), "agent session refused");
        })?;
        // Kept, logged and shown: a version is a short line of text, whatever was sent.
        crate::fleet::report_limits::cut(&mut register.agent_version, MAX_AGENT_VERSION);
        register.agent_version = register.agent_version.replace(['\n', '\t'], " ");
        if let Err(refusal) = rigger_version::check_agent(crate::VERSION, &register.agent_version) {
            tracing::warn!(%peer, node = %register.node_name, reason = %refusal, "agent session refused: outside the version skew policy");
            self.nodes.refuse(&register, &refusal, SystemTime::now());
            return Err(Status::failed_precondition(format!(
                "node {}: {refusal}",
                register.node_name
            )));
        }

        let session = new_session_id()?;
        let node = register.node_name.clone();
        let (mut tx, rx) = mpsc::channel(AGENT_QUEUE);
        let ack = ControllerMessage {
            message: Some(controller_message::Message::RegisterAck(RegisterAck {
                heartbeat_interval_seconds: u32::try_from(self.heartbeat_interval.as_secs())
                    .unwrap_or(u32::MAX)
                    .max(1),
                peer_grant_public_keys: self.peer_grant_public_keys.to_vec(),
                session,
                controller_version: crate::VERSION.to_owned(),
            })),
        };
        tx.try_send(Ok(ack))
            .map_err(|_| Status::cancelled("agent went away"))?;
        // Registered only now: the ack is queued first, so no task can overtake it.
        self.nodes
            .register(&register, session, tx.clone(), SystemTime::now());
        tracing::info!(%node, %peer, session, agent_version = %register.agent_version, tasks = register.tasks.len(), "agent registered");
        let (recreates, pulls): (Vec<_>, Vec<_>) = register
            .tasks
            .into_iter()
            .partition(|t| is_recreate_task(&t.id));
        let (node_image_pulls, pulls): (Vec<_>, Vec<_>) =
            pulls.into_iter().partition(|t| is_node_image_task(&t.id));
        self.jobs.node_connected(&node, pulls);
        self.recreates.node_connected(&node, &recreates);
        if let Some(engine) = &self.node_images {
            engine.node_connected(&node, &node_image_pulls);
        }
        self.pods.send_at_registration(&node);

        let this = self.clone();
        let task = async move {
            let outcome = this.serve_session(&node, session, &mut inbound).await;
            this.nodes.disconnect(&node, session);
            this.jobs.wake();
            match outcome {
                Ok(()) => tracing::info!(%node, session, "agent disconnected"),
                Err(status) => {
                    tracing::warn!(%node, session, reason = %status.message(), "agent session ended");
                    // Never waits: an agent that stopped reading must not keep this
                    // task. The session's own sender always has a slot of its own.
                    let _ = tx.try_send(Err(status));
                }
            }
        };
        tokio::spawn(task);
        Ok(Response::new(Box::pin(rx)))
    }
}

/// Whether a heartbeat deadline that fired `late` past its time proves the agent silent
/// (pure): a deadline that fires later found the controller itself not running when it
/// passed ([`crate::fleet::stall`]); on a loaded machine, an agent's heartbeats were seen to wait
/// unread while the session's timer, woken in the same turn, ended it.
fn silence_proven(late: Duration) -> bool {
    !crate::fleet::stall::is_stall(late)
}

impl AgentLinkService {
    /// Read the agent's messages until the session ends. Kept small: ten thousand of these
    /// wait at once, so the wait holds no message and the rare asynchronous step (a pod's
    /// status, written to the store) is boxed.
    async fn serve_session(
        &self,
        node: &str,
        session: SessionId,
        inbound: &mut Streaming<AgentMessage>,
    ) -> Result<(), Status> {
        loop {
            let Some(message) = self.next_message(inbound, "heartbeats stopped").await? else {
                return Ok(());
            };
            if let Some(status) = self.take(node, session, message)? {
                Box::pin(self.pods.report(node, status)).await;
            }
        }
    }

    /// The agent's next message; `None` when it ended the stream. Silence past
    /// `node_timeout` ends the session with `silence`, unless the deadline fired late: then this
    /// controller was the one not running (a stalled machine or runtime), the agent's
    /// heartbeats may be waiting unread behind the wakeup, and the wait starts again.
    async fn next_message(
        &self,
        inbound: &mut Streaming<AgentMessage>,
        silence: &'static str,
    ) -> Result<Option<AgentMessage>, Status> {
        let mut deadline = tokio::time::Instant::now() + self.node_timeout;
        loop {
            tokio::select! {
                // Another replica leads next (or this one, restarted): the agent tries
                // again soon rather than backing off as from a fault.
                _ = self.shutdown.cancelled() => {
                    return Err(rigger_proto::not_leader("controller shutting down"));
                }
                // Cancel-safe: a message read meanwhile stays in the stream.
                next = inbound.message() => return next,
                () = tokio::time::sleep_until(deadline) => {
                    let late = tokio::time::Instant::now().saturating_duration_since(deadline);
                    if silence_proven(late) {
                        return Err(Status::deadline_exceeded(silence));
                    }
                    tracing::debug!(?late, "an agent's heartbeat deadline fired late: this controller stalled, so it waits again");
                    deadline = tokio::time::Instant::now() + self.node_timeout;
                }
            }
        }
    }

    /// Act on one message of the agent; a pod status it reports is returned, for the
    /// caller to write.
    fn take(
        &self,
        node: &str,
        session: SessionId,
        message: AgentMessage,
    ) -> Result<Option<rigger_proto::v1::PodStatus>, Status> {
        match message.message {
            Some(agent_message::Message::Heartbeat(heartbeat)) => {
                if !self
                    .nodes
                    .heartbeat(node, session, heartbeat.inventory, SystemTime::now())
                {
                    return Err(Status::aborted("replaced by a newer session of this node"));
                }
            }
            Some(agent_message::Message::TaskStatus(status)) => {
                let status = crate::fleet::report_limits::bound_task_status(status);
                if is_recreate_task(&status.id) {
                    self.recreates.report(node, &status);
                } else if is_node_image_task(&status.id) {
                    if let Some(engine) = &self.node_images {
                        engine.report(node, &status);
                    }
                } else {
                    self.jobs.report(node, status);
                }
            }
            Some(agent_message::Message::PodStatus(status)) => {
                match crate::fleet::report_limits::check_pod_status(&status) {
                    Ok(()) => return Ok(Some(status)),
                    Err(reason) => {
                        tracing::warn!(%node, pod = %status.uid.chars().take(64).collect::<String>(), %reason, "pod status refused");
                    }
                }
            }
            Some(agent_message::Message::Response(response)) => {
                self.pods.relay().complete(node, response);
            }
            Some(agent_message::Message::PeerQuery(query)) => {
                let peers =
                    self.mirror_peers(node, query.image_digest, query.repository, query.registry);
                let answer = ControllerMessage {
                    message: Some(controller_message::Message::PeerAnswer(PeerAnswer {
                        id: query.id,
                        peers,
                    })),
                };
                if !self.nodes.send(node, answer) {
                    tracing::debug!(%node, "peer answer not queued; the node's agent is away or busy");
                }
            }
            Some(agent_message::Message::Register(_)) => {
                return Err(Status::invalid_argument("Register sent twice"));
            }
            None => return Err(Status::invalid_argument("empty message")),
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deadline_that_fired_late_proves_no_silence() {
        assert!(silence_proven(Duration::ZERO));
        assert!(
            silence_proven(Duration::from_millis(120)),
            "a busy machine's timer"
        );
        assert!(!silence_proven(crate::fleet::stall::STALLED_PAST));
        assert!(
            !silence_proven(Duration::from_secs(3)),
            "the controller was stalled"
        );
    }
}
