//! Leader election on a Kubernetes `coordination.k8s.io/v1` Lease, in the manner of
//! client-go's leaderelection: the holder renews the Lease every third of its duration;
//! another replica takes it once it has seen the Lease unchanged for a whole duration
//! (measured on its own clock, so clocks that disagree cannot shorten a term), and
//! every write is conditional on the resourceVersion read, so two replicas never both
//! believe they won. A holder that cannot renew within two thirds of the duration
//! (counted from the start of its last successful round, so a slow answer is allowed
//! what is left of it) stops, before any other replica may take over. A Lease that is
//! gone (deleted by someone) is the same to everyone: its holder stops at once, and no
//! replica creates it again before it has seen it absent for a whole term — by then
//! the old holder, which saw its renewals fail or the Lease gone, has stopped.
//!
//! [`decide`] is the whole decision, pure; [`campaign`] does the I/O around it.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::leadership::{LeaderError, Leadership, on_own_thread};

/// The Lease's name in the controller's namespace.
pub const LEASE_NAME: &str = "rigger-controller";

/// What this replica last saw of the Lease: which version, and when (on its own clock)
/// that version first appeared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    pub resource_version: String,
    pub since: Instant,
}

/// What to do with the Lease now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// There has been none for a whole term: create it, holding it.
    Create,
    /// There is none, and this replica held it: someone deleted it, and another replica
    /// may create it; stop acting.
    Gone,
    /// It is ours: renew it.
    Renew,
    /// Its holder let it lapse (or released it): take it over.
    TakeOver,
    /// Someone else holds it.
    Follow,
}

/// The decision for `me` (`holding`: as it believes) given the Lease as read (`None`:
/// there is none) and when its current version (or its absence) was first seen.
pub fn decide(
    lease: Option<&LeaseSpec>,
    me: &str,
    holding: bool,
    observed_since: Instant,
    now: Instant,
    duration: Duration,
) -> Step {
    let Some(spec) = lease else {
        if holding {
            return Step::Gone;
        }
        // Whoever held the deleted Lease may lead for the rest of its term.
        return if now.saturating_duration_since(observed_since) >= duration {
            Step::Create
        } else {
            Step::Follow
        };
    };
    match spec.holder_identity.as_deref() {
        Some(holder) if holder == me => Step::Renew,
        None | Some("") => Step::TakeOver,
        Some(_) => {
            let term = spec
                .lease_duration_seconds
                .and_then(|s| u64::try_from(s).ok())
                .map_or(duration, Duration::from_secs);
            if now.saturating_duration_since(observed_since) >= term {
                Step::TakeOver
            } else {
                Step::Follow
            }
        }
    }
}

/// The Lease spec `me` writes when holding it (`taking_over`: a new term begins).
fn holding(
    previous: Option<&LeaseSpec>,
    me: &str,
    duration: Duration,
    taking_over: bool,
) -> LeaseSpec {
    let now = MicroTime(Timestamp::now());
    let previous = previous.cloned().unwrap_or_default();
    let transitions = previous.lease_transitions.unwrap_or(0);
    LeaseSpec {
        holder_identity: Some(me.to_owned()),
        lease_duration_seconds: Some(i32::try_from(duration.as_secs().max(1)).unwrap_or(i32::MAX)),
        acquire_time: if taking_over {
            Some(now.clone())
        } else {
            previous.acquire_time.or_else(|| Some(now.clone()))
        },
        renew_time: Some(now),
        lease_transitions: Some(if taking_over && previous.holder_identity.is_some() {
            transitions.saturating_add(1)
        } else {
            transitions
        }),
        ..previous
    }
}

/// Campaign for the Lease `LEASE_NAME` in `namespace`; the returned [`Leadership`] turns
/// true once held. The task ends `Ok` on shutdown (the Lease released, so a successor
/// takes it at once) and with an error when a held Lease could not be renewed in time.
/// The campaign runs on a thread of its own ([`on_own_thread`]), with its own
/// client made from `config`.
pub fn campaign(
    config: kube::Config,
    namespace: &str,
    identity: String,
    duration: Duration,
    token: CancellationToken,
) -> (Leadership, tokio::task::JoinHandle<Result<(), LeaderError>>) {
    let (tx, rx) = watch::channel(false);
    let namespace = namespace.to_owned();
    let task = on_own_thread(move || async move {
        // Its renewals, too, are applied within the term they were sent in, or never.
        use super::client::{term_bounded, unacknowledged_limit};
        let client = term_bounded(&config, unacknowledged_limit(duration), None)
            .map_err(|e| LeaderError::Start(format!("a client for the Lease: {e}")))?;
        let api: Api<Lease> = Api::namespaced(client, &namespace);
        let name = format!("{namespace}/{LEASE_NAME}");
        run(api, name, identity, duration, tx, token).await
    });
    (Leadership::following(rx), task)
}

async fn run(
    api: Api<Lease>,
    name: String,
    identity: String,
    duration: Duration,
    leading: watch::Sender<bool>,
    token: CancellationToken,
) -> Result<(), LeaderError> {
    let retry = duration / 3;
    let renew_deadline = duration * 2 / 3;
    let mut observed: Option<Observed> = None;
    let mut last_renewal = Instant::now();
    tracing::info!(lease = %name, %identity, ?duration, "campaigning for leadership");
    loop {
        let held = *leading.borrow();
        let started = Instant::now();
        let round = match round_bound(held, last_renewal.elapsed(), retry, renew_deadline) {
            Some(bound) => {
                let attempted = attempt(&api, &identity, held, duration, &mut observed);
                tokio::time::timeout(bound, attempted)
                    .await
                    .unwrap_or_else(|_| Err(format!("no answer within {bound:?}")))
            }
            None => Err(format!("not renewed within {renew_deadline:?}")),
        };
        match round {
            Ok(Held::Yes) => {
                // The round's start, not its answer: the write happened after it, so
                // the renew deadline counted from here ends before any other replica,
                // counting a whole term from seeing the write, may take over.
                last_renewal = started;
                if !held {
                    tracing::info!(lease = %name, %identity, "elected leader");
                    leading.send_replace(true);
                }
            }
            Ok(outcome @ (Held::ByAnother | Held::Gone)) => {
                if held {
                    // Someone else holds it now (we must have lapsed), or it was deleted
                    // and anyone may take it: stop acting at once.
                    leading.send_replace(false);
                    let detail = match outcome {
                        Held::Gone => "it was deleted",
                        _ => "another replica holds it",
                    };
                    return Err(LeaderError::KubernetesLeaseLost {
                        lease: name,
                        detail: detail.into(),
                    });
                }
            }
            Err(detail) => {
                tracing::warn!(lease = %name, %detail, "cannot read or write the Lease");
                if held && last_renewal.elapsed() >= renew_deadline {
                    leading.send_replace(false);
                    return Err(LeaderError::KubernetesLeaseLost {
                        lease: name,
                        detail,
                    });
                }
            }
        }
        // Rounds start a retry period apart, however long one took (a slow round does
        // not eat into the next one's share of the deadline); never back to back.
        let mut pause = retry.saturating_sub(started.elapsed()).max(retry / 10);
        if *leading.borrow() {
            // Never asleep past the renew deadline: the next round finds it passed.
            pause = pause.min(renew_deadline.saturating_sub(last_renewal.elapsed()));
        }
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            () = token.cancelled() => {
                if *leading.borrow() {
                    // Writes stop before the Lease is let go: a successor may take it
                    // the moment the release is applied, before its answer is back.
                    leading.send_replace(false);
                    release(&api, &identity).await;
                    tracing::info!(lease = %name, "resigned leadership");
                }
                return Ok(());
            }
        }
    }
}

/// How long one round may take. A holder's round may take what is left of its renew
/// deadline, as client-go's: a slow API server (a busy one answers in seconds) must not
/// unseat a leader whose renewal would have succeeded, while a hung connection still
/// ends the term in time. `None`: the deadline has passed, the term is over.
fn round_bound(
    held: bool,
    since_last_renewal: Duration,
    retry: Duration,
    renew_deadline: Duration,
) -> Option<Duration> {
    if !held {
        return Some(retry);
    }
    Some(renew_deadline.saturating_sub(since_last_renewal)).filter(|left| !left.is_zero())
}

/// Who holds the Lease after a round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    Yes,
    ByAnother,
    Gone,
}

/// One round: read the Lease, decide, write.
async fn attempt(
    api: &Api<Lease>,
    identity: &str,
    leading: bool,
    duration: Duration,
    observed: &mut Option<Observed>,
) -> Result<Held, String> {
    let current = api.get_opt(LEASE_NAME).await.map_err(|e| e.to_string())?;
    let now = Instant::now();
    let version = current
        .as_ref()
        .and_then(|lease| lease.metadata.resource_version.clone())
        .unwrap_or_default();
    let since = match observed {
        Some(seen) if seen.resource_version == version => seen.since,
        _ => {
            *observed = Some(Observed {
                resource_version: version,
                since: now,
            });
            now
        }
    };
    let spec = current.as_ref().and_then(|lease| lease.spec.as_ref());
    let step = decide(spec, identity, leading, since, now, duration);
    let lease = match step {
        Step::Follow => return Ok(Held::ByAnother),
        Step::Gone => return Ok(Held::Gone),
        Step::Create => Lease {
            metadata: ObjectMeta {
                name: Some(LEASE_NAME.into()),
                ..ObjectMeta::default()
            },
            spec: Some(holding(None, identity, duration, true)),
        },
        Step::Renew | Step::TakeOver => {
            let mut lease = current.clone().unwrap_or_default();
            lease.spec = Some(holding(spec, identity, duration, step == Step::TakeOver));
            lease
        }
    };
    let written = match step {
        Step::Create => api.create(&PostParams::default(), &lease).await,
        _ => {
            api.replace(LEASE_NAME, &PostParams::default(), &lease)
                .await
        }
    };
    match written {
        Ok(_) => Ok(Held::Yes),
        // Another replica wrote first: it won this round.
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(Held::ByAnother),
        Err(error) => Err(error.to_string()),
    }
}

/// Give the Lease up (holder cleared), so a successor need not wait out the term.
async fn release(api: &Api<Lease>, identity: &str) {
    let Ok(Some(mut lease)) = api.get_opt(LEASE_NAME).await else {
        return;
    };
    let Some(spec) = lease.spec.as_mut() else {
        return;
    };
    if spec.holder_identity.as_deref() != Some(identity) {
        return;
    }
    spec.holder_identity = None;
    if let Err(error) = api
        .replace(LEASE_NAME, &PostParams::default(), &lease)
        .await
    {
        tracing::warn!(%error, "cannot release the Lease; a successor waits out its term");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(holder: Option<&str>, seconds: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: holder.map(str::to_owned),
            lease_duration_seconds: Some(seconds),
            ..LeaseSpec::default()
        }
    }

    #[test]
    fn a_holders_round_may_take_what_is_left_of_its_renew_deadline() {
        let (retry, deadline) = (Duration::from_secs(1), Duration::from_secs(2));
        let ms = Duration::from_millis;
        // A slow answer (700 ms) fits while the deadline lasts; none after it.
        assert_eq!(round_bound(true, ms(0), retry, deadline), Some(ms(2000)));
        assert_eq!(round_bound(true, ms(1300), retry, deadline), Some(ms(700)));
        assert_eq!(round_bound(true, ms(2000), retry, deadline), None);
        assert_eq!(round_bound(true, ms(2500), retry, deadline), None);
        // A follower's round is bounded by the retry period only.
        assert_eq!(round_bound(false, ms(9000), retry, deadline), Some(retry));
    }

    #[test]
    fn a_lease_is_created_renewed_followed_and_taken_only_after_a_whole_term_unchanged() {
        let start = Instant::now();
        let term = Duration::from_secs(15);
        // None: created only once seen absent for a whole term, and never by its holder.
        assert_eq!(decide(None, "a", false, start, start, term), Step::Follow);
        assert_eq!(
            decide(
                None,
                "a",
                false,
                start,
                start + Duration::from_secs(14),
                term
            ),
            Step::Follow
        );
        assert_eq!(
            decide(None, "a", false, start, start + term, term),
            Step::Create
        );
        assert_eq!(
            decide(None, "a", true, start, start + term, term),
            Step::Gone
        );
        assert_eq!(
            decide(Some(&spec(Some("a"), 15)), "a", true, start, start, term),
            Step::Renew
        );
        let theirs = spec(Some("b"), 15);
        assert_eq!(
            decide(
                Some(&theirs),
                "a",
                false,
                start,
                start + Duration::from_secs(14),
                term
            ),
            Step::Follow
        );
        assert_eq!(
            decide(
                Some(&theirs),
                "a",
                false,
                start,
                start + Duration::from_secs(15),
                term
            ),
            Step::TakeOver
        );
        // The holder's own term counts, not ours.
        assert_eq!(
            decide(
                Some(&spec(Some("b"), 60)),
                "a",
                false,
                start,
                start + Duration::from_secs(30),
                term
            ),
            Step::Follow
        );
        // Released: taken at once.
        assert_eq!(
            decide(Some(&spec(None, 15)), "a", false, start, start, term),
            Step::TakeOver
        );
        assert_eq!(
            decide(Some(&spec(Some(""), 15)), "a", false, start, start, term),
            Step::TakeOver
        );
    }

    #[test]
    fn a_takeover_counts_a_transition_and_a_renewal_does_not() {
        let before = LeaseSpec {
            lease_transitions: Some(2),
            ..spec(Some("b"), 15)
        };
        let taken = holding(Some(&before), "a", Duration::from_secs(15), true);
        assert_eq!(
            (taken.holder_identity.as_deref(), taken.lease_transitions),
            (Some("a"), Some(3))
        );
        let renewed = holding(Some(&taken), "a", Duration::from_secs(15), false);
        assert_eq!(renewed.lease_transitions, Some(3));
        assert_eq!(renewed.acquire_time, taken.acquire_time);
    }
}
