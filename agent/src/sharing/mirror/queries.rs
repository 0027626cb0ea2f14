//! What the registry mirror asks the controller over the link — which nodes may this
//! node fetch an image from — and the answers. The link sends the questions of its
//! session and hands back the answers; a question nobody answers in time is answered
//! "nobody" (the mirror then sends containerd to the registry).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use rigger_proto::v1::{PeerAnswer, PeerQuery, PeerSource};
use tokio::sync::{mpsc, oneshot};

/// Questions waiting to be sent, at most (more are answered "nobody" at once).
const QUEUED: usize = 64;

/// The mirror's side and the link's side of the questions. Shared (`Arc`).
#[derive(Debug)]
pub struct PeerQueries {
    next_id: AtomicU64,
    pending: Mutex<HashMap<u64, oneshot::Sender<Vec<PeerSource>>>>,
    outbox: mpsc::Sender<PeerQuery>,
    /// Held by the link's session while it lasts.
    inbox: tokio::sync::Mutex<mpsc::Receiver<PeerQuery>>,
    /// A session holds the inbox: questions are sent (else they are not asked at all).
    linked: AtomicBool,
}

/// The link session's hold on the questions: while it lives, questions are asked.
#[derive(Debug)]
pub struct Questions<'a> {
    inbox: tokio::sync::MutexGuard<'a, mpsc::Receiver<PeerQuery>>,
    linked: &'a AtomicBool,
}

impl Questions<'_> {
    /// The next question to send.
    pub async fn next(&mut self) -> Option<PeerQuery> {
        self.inbox.recv().await
    }
}

impl Drop for Questions<'_> {
    fn drop(&mut self) {
        self.linked.store(false, Ordering::Relaxed);
    }
}

impl Default for PeerQueries {
    fn default() -> Self {
        let (outbox, inbox) = mpsc::channel(QUEUED);
        Self {
            next_id: AtomicU64::new(1),
            pending: Mutex::default(),
            outbox,
            inbox: tokio::sync::Mutex::new(inbox),
            linked: AtomicBool::new(false),
        }
    }
}

impl PeerQueries {
    fn pending(&self) -> std::sync::MutexGuard<'_, HashMap<u64, oneshot::Sender<Vec<PeerSource>>>> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The nodes this node may fetch `image` (of `repository` at `registry`) from, with
    /// their grants; none when the controller says none, says nothing within
    /// `patience`, or is not linked now (then at once: containerd goes to the registry
    /// without waiting).
    pub async fn ask(
        &self,
        image: &str,
        repository: &str,
        registry: &str,
        patience: Duration,
    ) -> Vec<PeerSource> {
        if !self.linked.load(Ordering::Relaxed) {
            return Vec::new();
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (answer, answered) = oneshot::channel();
        self.pending().insert(id, answer);
        let question = PeerQuery {
            id,
            image_digest: image.to_owned(),
            repository: repository.to_owned(),
            registry: registry.to_owned(),
        };
        let peers = match self.outbox.try_send(question) {
            Ok(()) => tokio::time::timeout(patience, answered)
                .await
                .ok()
                .and_then(Result::ok)
                .unwrap_or_default(),
            Err(_) => Vec::new(),
        };
        self.pending().remove(&id);
        peers
    }

    /// The link's end: questions to send, for as long as the session holds them (one
    /// session at a time).
    pub async fn questions(&self) -> Questions<'_> {
        let inbox = self.inbox.lock().await;
        self.linked.store(true, Ordering::Relaxed);
        Questions {
            inbox,
            linked: &self.linked,
        }
    }

    /// An answer from the controller; one to no question waiting is dropped.
    pub fn answer(&self, answer: PeerAnswer) {
        if let Some(waiting) = self.pending().remove(&answer.id) {
            let _ = waiting.send(answer.peers);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::Arc;

    use super::*;

    #[tokio::test]
    async fn a_question_gets_its_own_answer_or_nobody_in_time() {
        let queries = Arc::new(PeerQueries::default());
        // Not linked: nothing is asked, and the answer is at once.
        assert!(
            queries
                .ask("sha256:a", "r", "h", Duration::from_secs(60))
                .await
                .is_empty()
        );
        let link = queries.clone();
        let controller = tokio::spawn(async move {
            let mut questions = link.questions().await;
            let first = questions.next().await.unwrap();
            // An answer to nothing asked, then the real one.
            link.answer(PeerAnswer {
                id: first.id + 100,
                peers: vec![PeerSource::default()],
            });
            link.answer(PeerAnswer {
                id: first.id,
                peers: vec![
                    PeerSource {
                        node: first.image_digest.clone(),
                        ..PeerSource::default()
                    };
                    2
                ],
            });
            // The second question is never answered.
            questions.next().await.unwrap()
        });
        while !queries.linked.load(Ordering::Relaxed) {
            tokio::task::yield_now().await;
        }
        let peers = queries
            .ask("sha256:a", "r", "h", Duration::from_secs(5))
            .await;
        assert_eq!(peers.len(), 2);
        assert_eq!(peers[0].node, "sha256:a");
        let unanswered = queries
            .ask("sha256:b", "r", "h", Duration::from_millis(50))
            .await;
        assert!(unanswered.is_empty());
        assert_eq!(controller.await.unwrap().image_digest, "sha256:b");
        assert!(queries.pending().is_empty());
    }
}
