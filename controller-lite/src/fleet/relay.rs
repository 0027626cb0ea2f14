//! Questions users ask agents (logs, exec) and their answers: each request gets an id,
//! goes down the node's link, and the answer from that node's agent completes it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rigger_proto::v1::{
    AgentRequest, AgentResponse, ControllerMessage, agent_request, controller_message,
};
use tokio::sync::oneshot;
use tonic::Status;

use crate::fleet::nodes::NodeRegistry;

#[derive(Debug, Default)]
struct Pending {
    /// Request id → (node asked, where the answer goes).
    waiting: HashMap<u64, (String, oneshot::Sender<AgentResponse>)>,
}

#[derive(Debug, Clone, Default)]
pub struct Relay {
    next: Arc<AtomicU64>,
    pending: Arc<Mutex<Pending>>,
}

impl Relay {
    /// Ask `node`'s agent and wait up to `timeout` for its answer.
    pub async fn ask(
        &self,
        nodes: &NodeRegistry,
        node: &str,
        kind: agent_request::Kind,
        timeout: Duration,
    ) -> Result<AgentResponse, Status> {
        let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let (tx, rx) = oneshot::channel();
        self.lock().waiting.insert(id, (node.to_owned(), tx));
        let message = ControllerMessage {
            message: Some(controller_message::Message::Request(AgentRequest {
                id,
                kind: Some(kind),
            })),
        };
        if !nodes.send(node, message) {
            self.lock().waiting.remove(&id);
            return Err(Status::unavailable(format!(
                "node {node}: its agent is not connected"
            )));
        }
        let answer = tokio::time::timeout(timeout, rx).await;
        self.lock().waiting.remove(&id);
        match answer {
            Ok(Ok(response)) if response.error.is_empty() => Ok(response),
            Ok(Ok(response)) => Err(Status::failed_precondition(format!(
                "node {node}: {}",
                response.error
            ))),
            Ok(Err(_)) => Err(Status::unavailable(format!(
                "node {node}: the agent went away"
            ))),
            Err(_) => Err(Status::deadline_exceeded(format!(
                "node {node}: no answer within {}s",
                timeout.as_secs()
            ))),
        }
    }

    /// An answer from `node`; answers to another node's question are dropped.
    pub fn complete(&self, node: &str, response: AgentResponse) {
        let mut pending = self.lock();
        let asked = pending
            .waiting
            .get(&response.id)
            .is_some_and(|(n, _)| n == node);
        if !asked {
            tracing::warn!(%node, id = response.id, "answer to a question not asked of this node dropped");
            return;
        }
        if let Some((_, tx)) = pending.waiting.remove(&response.id) {
            let _ = tx.send(response);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
