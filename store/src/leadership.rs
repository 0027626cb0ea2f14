//! Which controller replica leads. With the embedded store there is one replica and it
//! always leads. With etcd, every replica campaigns in an etcd election under a lease it
//! keeps alive ([`crate::etcd::election`]); on a Kubernetes store the election is a
//! `coordination.k8s.io` Lease ([`crate::kubernetes::lease`]), as Kubernetes' own
//! controllers elect theirs. The elected replica runs the engines and serves agents and
//! users, the others wait (and say so: `unavailable`, not ready) until the leader's lease
//! lapses.
//!
//! A leader that cannot renew its lease stops the process: another replica takes over
//! within the lease's TTL, and an old leader never keeps acting on stale beliefs.

use tokio::sync::watch;
use tonic::Status;

#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    #[error("leader election in etcd: {0}")]
    Etcd(#[from] etcd_client::Error),
    #[error("lost the etcd lease ({0}); stopping so another replica takes over")]
    LeaseLost(String),
    #[error("lost the Lease {lease} ({detail}); stopping so another replica takes over")]
    KubernetesLeaseLost { lease: String, detail: String },
    #[error("leader election cannot start: {0}")]
    Start(String),
}

/// Run a campaign (`campaign()`, and the client it makes) on a thread and a runtime of
/// its own. A lease must be renewed within its deadline whatever the rest of the
/// controller is doing: on the shared runtime a renewal waits behind whatever a worker
/// is busy with (a big list decoded, a pass over every pod), and on a loaded machine
/// that wait was seen to outlast a 2 s renew deadline (the leader stopped, its lease
/// unrenewed, 2.1 s after it was elected). Its own thread is scheduled by the kernel on
/// its own; the clients are made on its runtime, since a client's connection task runs
/// on the runtime that made it.
pub(crate) fn on_own_thread<F, Fut>(campaign: F) -> tokio::task::JoinHandle<Result<(), LeaderError>>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<(), LeaderError>>,
{
    tokio::task::spawn_blocking(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .thread_name("rigger-leader")
            .build()
            .map_err(|e| LeaderError::Start(format!("its runtime: {e}")))?;
        runtime.block_on(campaign())
    })
}

/// Whether this replica leads, as every request handler sees it.
#[derive(Debug, Clone)]
pub struct Leadership {
    leading: watch::Receiver<bool>,
}

impl Leadership {
    /// Leadership as `leading` tells it (a campaign's sender).
    pub(crate) fn following(leading: watch::Receiver<bool>) -> Self {
        Self { leading }
    }
}

impl Leadership {
    /// A single replica: always the leader.
    pub fn sole() -> Self {
        Self {
            leading: watch::channel(true).1,
        }
    }

    /// Leadership as it changes (what [`crate::Store::fenced`] takes).
    pub fn changes(&self) -> watch::Receiver<bool> {
        self.leading.clone()
    }

    pub fn is_leader(&self) -> bool {
        *self.leading.borrow()
    }

    /// Refuse work on a follower. The refusal carries [`rigger_proto::NOT_LEADER`] in its
    /// metadata, so that a client behind a Service (which picks a replica per connection)
    /// tries again at once instead of backing off as from a fault.
    pub fn require(&self) -> Result<(), Status> {
        if self.is_leader() {
            Ok(())
        } else {
            Err(rigger_proto::not_leader(
                "not the leader: this controller replica is a follower; try another",
            ))
        }
    }

    /// Wait until this replica leads; `false` if it never will (shutting down).
    pub async fn elected(&mut self) -> bool {
        self.leading.wait_for(|leading| *leading).await.is_ok()
    }
}
