//! The etcd election: every replica campaigns under a lease it keeps alive; the elected
//! one leads until its lease is lost or it resigns (revoking the lease, so a successor is
//! elected at once).

use std::time::Duration;

use etcd_client::Client;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::leadership::{LeaderError, Leadership, on_own_thread};

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
    tls: Option<super::EtcdTls>,
    election: String,
    identity: String,
    ttl: Duration,
    token: CancellationToken,
) -> (Leadership, tokio::task::JoinHandle<Result<(), LeaderError>>) {
    let (tx, rx) = watch::channel(false);
    let task = on_own_thread(move || async move {
        let client = super::connect_client(&endpoints, tls.as_ref(), None)
            .await
            .map_err(|e| LeaderError::Start(e.to_string()))?;
        run(client, election, identity, ttl, tx, token).await
    });
    (Leadership::following(rx), task)
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
