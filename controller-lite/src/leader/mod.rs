//! Which controller replica leads. With the embedded store there is one replica and it
//! always leads. With etcd, every replica campaigns in an etcd election under a lease it
//! keeps alive; the elected one runs the job engine and serves agents and users, the
//! others wait (and say so: `unavailable`, not ready) until the leader's lease lapses.
//!
//! A leader that cannot renew its lease stops the process: another replica takes over
//! within the lease's TTL, and an old leader never keeps acting on stale beliefs.
//!
//! On a Kubernetes store the election is a `coordination.k8s.io` Lease ([`lease`]), as
//! Kubernetes' own controllers elect theirs.

pub mod lease;

use std::time::Duration;

use etcd_client::Client;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
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

    /// Leadership as it changes (what [`crate::store::Store::fenced`] takes).
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

/// How long granting (or revoking) the election's lease may take: its client has no
/// request timeout, as Campaign waits while another replica leads.
const GRANT_TIMEOUT: Duration = Duration::from_secs(10);

/// Campaign for leadership; the returned [`Leadership`] turns true once elected. The
/// task ends `Ok` on shutdown (lease revoked, so a successor is elected at once) and with
/// an error when the lease is lost.
/// The campaign runs on a thread of its own ([`on_own_thread`]), with its own client to
/// `endpoints`.
pub fn campaign(
    endpoints: Vec<String>,
    tls: Option<crate::config::EtcdTls>,
    election: String,
    identity: String,
    ttl: Duration,
    token: CancellationToken,
) -> (Leadership, tokio::task::JoinHandle<Result<(), LeaderError>>) {
    let (tx, rx) = watch::channel(false);
    let task = on_own_thread(move || async move {
        let client = crate::store::etcd::connect_client(&endpoints, tls.as_ref(), None)
            .await
            .map_err(|e| LeaderError::Start(e.to_string()))?;
        run(client, election, identity, ttl, tx, token).await
    });
    (Leadership { leading: rx }, task)
}

/// Keep the lease alive every third of its TTL until it is lost: an error, the lease
/// expired, or the stream closed. A slow answer is waited for: etcd stalled (a WAL
/// fsync on a busy disk was seen to hold every answer for 6 s) expires no lease either,
/// and the writes of a leader that cannot reach etcd cannot land.
async fn keep_alive(
    mut keeper: etcd_client::LeaseKeeper,
    mut responses: etcd_client::LeaseKeepAliveStream,
    ttl: Duration,
) -> LeaderError {
    loop {
        tokio::time::sleep(ttl / 3).await;
        if let Err(e) = keeper.keep_alive().await {
            return LeaderError::LeaseLost(e.to_string());
        }
        match responses.message().await {
            Ok(Some(response)) if response.ttl() > 0 => {}
            Ok(Some(_)) => return LeaderError::LeaseLost("the lease expired".to_owned()),
            Ok(None) => return LeaderError::LeaseLost("keep-alive stream closed".to_owned()),
            Err(e) => return LeaderError::LeaseLost(e.to_string()),
        }
    }
}

async fn run(
    mut client: Client,
    election: String,
    identity: String,
    ttl: Duration,
    leading: watch::Sender<bool>,
    token: CancellationToken,
) -> Result<(), LeaderError> {
    let seconds = i64::try_from(ttl.as_secs().max(1)).unwrap_or(i64::MAX);
    let lease = tokio::time::timeout(GRANT_TIMEOUT, client.lease_grant(seconds, None))
        .await
        .map_err(|_| {
            LeaderError::Start(format!("etcd granted no lease within {GRANT_TIMEOUT:?}"))
        })??
        .id();
    let (keeper, responses) = client.lease_keep_alive(lease).await?;
    let renewing = keep_alive(keeper, responses, ttl);
    tokio::pin!(renewing);
    tracing::info!(%identity, lease, ?ttl, "campaigning for leadership");
    let mut campaigner = client.clone();
    tokio::select! {
        lost = &mut renewing => return Err(lost),
        elected = campaigner.campaign(election.clone(), identity.clone(), lease) => {
            elected?;
        }
        _ = token.cancelled() => {
            let _ = tokio::time::timeout(GRANT_TIMEOUT, client.lease_revoke(lease)).await;
            return Ok(());
        }
    }
    tracing::info!(%identity, "elected leader");
    leading.send_replace(true);
    tokio::select! {
        lost = &mut renewing => {
            // Writes stop now (the store is fenced on this), not when the process ends.
            leading.send_replace(false);
            Err(lost)
        }
        _ = token.cancelled() => {
            // Revoking hands leadership over now instead of after the TTL.
            let _ = tokio::time::timeout(GRANT_TIMEOUT, client.lease_revoke(lease)).await;
            tracing::info!("resigned leadership");
            Ok(())
        }
    }
}
