//! The engines: what the controller does with the work users apply, each turning what
//! the store holds and what agents report into tasks for nodes and status for users —
//! ImagePullJobs ([`jobs`]), ContainerRecreateRequests ([`recreate_requests`]),
//! NodeImages ([`node_images`]), agent-managed pods ([`pods`]), SidecarSets on Rigger's
//! own pods and on a cluster's ([`sidecar_sets`]), pre-download for rollouts
//! ([`predownload`]); stored objects none of them can decode are set aside
//! ([`undecodable`]).
//!
//! This module is the loop every engine runs, written once: a pass (one snapshot of what
//! the engine reads from the store, then reconcile, act, write), then wait for a wake-up
//! (an apply, a report, a node coming or going), the next tick, or cancellation; after
//! the last pass, a final flush. Each engine's decisions are its own pure reconcile
//! functions (`jobs::reconcile_job`, `recreate_requests::decide`,
//! `sidecar_sets::to_upgrade`); this module only schedules them.

pub mod jobs;
pub mod node_images;
pub mod pods;
pub mod predownload;
pub mod recreate_requests;
pub mod sidecar_sets;
pub mod undecodable;

use std::future::Future;
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use rigger_store::{Store, StoreError};

/// One engine, as the runner drives it.
pub trait Engine: Send + Sync {
    /// For logs: which engine.
    const NAME: &'static str;
    /// Passes run at least this often, woken or not (deadlines, retries, timeouts).
    const TICK: Duration;
    /// Passes start at most this often, however often they are woken: an engine whose
    /// pass reads every pod of a busy cluster takes in the changes of this long at once
    /// instead of passing again for each.
    const SPACING: Duration = Duration::ZERO;
    /// The kinds whose changes by another writer wake a pass, where the store tells
    /// them ([`supervise_watching`]).
    const WATCHES: &'static [&'static str] = &[];
    /// What one pass decides on, read from the store once, at the pass's start.
    type Snapshot: Send;

    /// Notified when something the engine reads changed.
    fn wake_signal(&self) -> &Notify;

    /// Read this pass's snapshot. A store error skips the pass; the next one tries
    /// again.
    fn observe(&self) -> impl Future<Output = Result<Self::Snapshot, StoreError>> + Send;

    /// One pass over a snapshot: decide, act, write. Write errors are the engine's to
    /// log; the next pass tries again.
    fn pass(&self, snapshot: Self::Snapshot) -> impl Future<Output = ()> + Send;

    /// After the last pass: what must reach the store before the controller exits.
    fn finish(&self) -> impl Future<Output = ()> + Send {
        async {}
    }
}

/// Run `engine` until `token` is cancelled.
pub async fn run<E: Engine>(engine: &E, token: CancellationToken) {
    loop {
        let started = tokio::time::Instant::now();
        let observed = engine.observe().await;
        if started.elapsed() > Duration::from_secs(5) {
            tracing::warn!(engine = E::NAME, took = ?started.elapsed(), "reading the store for a pass was slow");
        }
        match observed {
            Ok(snapshot) => engine.pass(snapshot).await,
            Err(error) => {
                tracing::warn!(engine = E::NAME, %error, "cannot read the store; pass skipped");
            }
        }
        tokio::select! {
            () = token.cancelled() => break,
            () = engine.wake_signal().notified() => {}
            () = tokio::time::sleep(E::TICK) => {}
        }
        let spacing = E::SPACING.saturating_sub(started.elapsed());
        if !spacing.is_zero() {
            tokio::select! {
                () = token.cancelled() => break,
                () = tokio::time::sleep(spacing) => {}
            }
        }
    }
    engine.finish().await;
}

/// How long a supervised engine waits after a panic before it runs again.
const RESTART_DELAY: Duration = Duration::from_secs(1);

/// Run `engine` in a task of its own until `token` is cancelled, running it again after
/// a panic: a bug one object reaches stops that engine's pass, not the other engines,
/// and not this one for good.
pub async fn supervise<E: Engine + Clone + 'static>(engine: E, token: CancellationToken) {
    loop {
        let task = tokio::spawn({
            let (engine, token) = (engine.clone(), token.clone());
            async move { run(&engine, token).await }
        });
        match task.await {
            Ok(()) => break,
            Err(error) if error.is_panic() => {
                tracing::error!(
                    engine = E::NAME,
                    "the engine panicked; running it again in 1 s"
                );
                tokio::select! {
                    () = token.cancelled() => break,
                    () = tokio::time::sleep(RESTART_DELAY) => {}
                }
            }
            Err(_) => break,
        }
    }
}

/// [`supervise`], with a pass also woken by each change another writer makes to an
/// object of the kinds the engine [watches](Engine::WATCHES), where the store sees them
/// ([`Store::changes`]): in a cluster, a `kubectl apply` is acted on at once rather
/// than at the next tick.
pub async fn supervise_watching<E: Engine + Clone + 'static>(
    engine: E,
    store: &Store,
    token: CancellationToken,
) {
    let woken = engine.clone();
    let forwarders = E::WATCHES
        .iter()
        .filter_map(|kind| store.changes(kind))
        .map(|mut changes| {
            let wake = woken.wake_signal();
            async move {
                while changes.changed().await.is_ok() {
                    wake.notify_one();
                }
            }
        });
    // No changes to forward (none told, or their watches gone) is no reason to stop.
    let forwarding = async {
        futures::future::join_all(forwarders).await;
        std::future::pending::<()>().await;
    };
    tokio::select! {
        () = supervise(engine, token) => {}
        () = forwarding => {}
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[derive(Default)]
    struct Counting {
        wake: Notify,
        observed: AtomicUsize,
        passes: AtomicUsize,
        finished: AtomicUsize,
        /// The store fails every other read.
        flaky_store: bool,
        /// Each pass wakes the engine again once (a change while it runs).
        wake_during_pass: std::sync::atomic::AtomicBool,
    }

    impl Engine for Counting {
        const NAME: &'static str = "counting";
        const TICK: Duration = Duration::from_secs(3600);
        type Snapshot = usize;

        fn wake_signal(&self) -> &Notify {
            &self.wake
        }

        async fn observe(&self) -> Result<usize, StoreError> {
            let n = self.observed.fetch_add(1, Ordering::SeqCst);
            match self.flaky_store && n % 2 == 1 {
                true => Err(StoreError::Backend {
                    location: "test".to_owned(),
                    detail: "flaky".to_owned(),
                }),
                false => Ok(n),
            }
        }

        async fn pass(&self, snapshot: usize) {
            assert_eq!(
                snapshot + 1,
                self.observed.load(Ordering::SeqCst),
                "each pass gets the snapshot read just before it"
            );
            self.passes.fetch_add(1, Ordering::SeqCst);
            if self.wake_during_pass.swap(false, Ordering::SeqCst) {
                self.wake.notify_one();
            }
        }

        async fn finish(&self) {
            self.finished.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_wake_runs_a_pass_and_cancel_flushes_once() {
        let engine = std::sync::Arc::new(Counting::default());
        let token = CancellationToken::new();
        let task = spawn_run(&engine, &token);
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(engine.passes.load(Ordering::SeqCst), 1, "one pass at start");
        engine.wake.notify_one();
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(
            engine.passes.load(Ordering::SeqCst),
            2,
            "woken: another pass"
        );
        tokio::time::sleep(Duration::from_secs(3600)).await;
        assert_eq!(
            engine.passes.load(Ordering::SeqCst),
            3,
            "a tick: another pass"
        );
        token.cancel();
        task.await.unwrap();
        assert_eq!(engine.finished.load(Ordering::SeqCst), 1);
        assert_eq!(
            engine.observed.load(Ordering::SeqCst),
            3,
            "one read per pass"
        );
    }

    /// `engine` run in a task of its own until `token` is cancelled.
    fn spawn_run<E: Engine + 'static>(
        engine: &std::sync::Arc<E>,
        token: &CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        let (engine, token) = (engine.clone(), token.clone());
        tokio::spawn(async move { run(&*engine, token).await })
    }

    /// [`Counting`] whose passes start at most every second.
    #[derive(Default)]
    struct Spaced(Counting);

    impl Engine for Spaced {
        const NAME: &'static str = "spaced";
        const TICK: Duration = Duration::from_secs(3600);
        const SPACING: Duration = Duration::from_secs(1);
        type Snapshot = usize;

        fn wake_signal(&self) -> &Notify {
            &self.0.wake
        }

        async fn observe(&self) -> Result<usize, StoreError> {
            self.0.observe().await
        }

        async fn pass(&self, snapshot: usize) {
            self.0.pass(snapshot).await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn wakes_closer_than_the_spacing_are_taken_in_by_one_pass_and_none_is_lost() {
        let engine = std::sync::Arc::new(Spaced::default());
        let token = CancellationToken::new();
        let task = spawn_run(&engine, &token);
        tokio::time::sleep(Duration::from_millis(10)).await;
        // A hundred changes over the next two seconds, one every 20 ms.
        for _ in 0..100 {
            engine.0.wake.notify_one();
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let passes = engine.0.passes.load(Ordering::SeqCst);
        assert!(
            (2..=4).contains(&passes),
            "one pass at start, then one a second: {passes}"
        );
        tokio::time::sleep(Duration::from_secs(10)).await;
        let settled = engine.0.passes.load(Ordering::SeqCst);
        assert!(settled <= passes + 1, "then at most the last wake's pass");
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(
            engine.0.passes.load(Ordering::SeqCst),
            settled,
            "and nothing more until a wake or a tick"
        );
        // A wake that comes while a pass runs, after its snapshot was read, gets a
        // pass of its own once the spacing is over.
        engine.0.wake_during_pass.store(true, Ordering::SeqCst);
        engine.0.wake.notify_one();
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(engine.0.passes.load(Ordering::SeqCst), settled + 1);
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(
            engine.0.passes.load(Ordering::SeqCst),
            settled + 1,
            "not before the spacing"
        );
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert_eq!(
            engine.0.passes.load(Ordering::SeqCst),
            settled + 2,
            "the wake during the pass was not lost"
        );
        // Cancelled while spacing: it stops at once, not when the spacing ends.
        engine.0.wake.notify_one();
        tokio::time::sleep(Duration::from_millis(10)).await;
        let cancelled = tokio::time::Instant::now();
        token.cancel();
        task.await.unwrap();
        assert!(cancelled.elapsed() < Duration::from_millis(100));
    }

    /// Panics in its first two passes.
    #[derive(Clone, Default)]
    struct Fragile {
        wake: std::sync::Arc<Notify>,
        passes: std::sync::Arc<AtomicUsize>,
    }

    impl Engine for Fragile {
        const NAME: &'static str = "fragile";
        const TICK: Duration = Duration::from_secs(3600);
        type Snapshot = ();

        fn wake_signal(&self) -> &Notify {
            &self.wake
        }

        async fn observe(&self) -> Result<(), StoreError> {
            Ok(())
        }

        async fn pass(&self, (): ()) {
            if self.passes.fetch_add(1, Ordering::SeqCst) < 2 {
                panic!("a bad object");
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_panicking_engine_runs_again_and_stops_when_cancelled() {
        let engine = Fragile::default();
        let token = CancellationToken::new();
        let task = tokio::spawn(supervise(engine.clone(), token.clone()));
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(
            engine.passes.load(Ordering::SeqCst),
            3,
            "two panics, then it runs"
        );
        token.cancel();
        task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_store_error_skips_the_pass_and_the_next_tick_tries_again() {
        let engine = std::sync::Arc::new(Counting {
            flaky_store: true,
            ..Counting::default()
        });
        let token = CancellationToken::new();
        let task = spawn_run(&engine, &token);
        tokio::time::sleep(Duration::from_millis(10)).await;
        engine.wake.notify_one();
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(engine.observed.load(Ordering::SeqCst), 2);
        assert_eq!(
            engine.passes.load(Ordering::SeqCst),
            1,
            "the failed read ran no pass"
        );
        tokio::time::sleep(Duration::from_secs(3600)).await;
        assert_eq!(
            engine.passes.load(Ordering::SeqCst),
            2,
            "the tick's read worked"
        );
        token.cancel();
        task.await.unwrap();
        assert_eq!(engine.finished.load(Ordering::SeqCst), 1);
    }
}
