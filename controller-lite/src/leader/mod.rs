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

/// Campaign for leadership; the returned [`Leadership`] turns true once elected. The
/// task ends `Ok` on shutdown (lease revoked, so a successor is elected at once) and with
/// an error when the lease is lost.
pub fn campaign(
    client: Client,
    election: String,
    identity: String,
    ttl: Duration,
    token: CancellationToken,
) -> (Leadership, tokio::task::JoinHandle<Result<(), LeaderError>>) {
    let (tx, rx) = watch::channel(false);
    let task = tokio::spawn(run(client, election, identity, ttl, tx, token));
    (Leadership { leading: rx }, task)
}

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
    let lease = client.lease_grant(seconds, None).await?.id();
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
            let _ = client.lease_revoke(lease).await;
            return Ok(());
        }
    }
    tracing::info!(%identity, "elected leader");
    leading.send_replace(true);
    tokio::select! {
        lost = &mut renewing => Err(lost),
        _ = token.cancelled() => {
            // Revoking hands leadership over now instead of after the TTL.
            let _ = client.lease_revoke(lease).await;
            tracing::info!("resigned leadership");
            Ok(())
        }
    }
}
