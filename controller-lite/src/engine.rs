//! The loop every controller engine runs, written once: a pass (read the kind from the
//! store, reconcile, act, write), then wait for a wake-up (an apply, a report, a node
//! coming or going), the next tick, or cancellation; after the last pass, a final
//! flush. Each engine's decisions are its own pure reconcile functions (e.g.
//! `jobs::reconcile_job`); this module only schedules them.

use std::future::Future;
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// One engine, as the runner drives it.
pub trait Engine: Send + Sync {
    /// Passes run at least this often, woken or not (deadlines, retries, timeouts).
    const TICK: Duration;

    /// Notified when something the engine reads changed.
    fn wake_signal(&self) -> &Notify;

    /// One pass: read, decide, act. Errors are the engine's to log; the next pass
    /// tries again.
    fn pass(&self) -> impl Future<Output = ()> + Send;

    /// After the last pass: what must reach the store before the controller exits.
    fn finish(&self) -> impl Future<Output = ()> + Send {
        async {}
    }
}

/// Run `engine` until `token` is cancelled.
pub async fn run<E: Engine>(engine: &E, token: CancellationToken) {
    loop {
        engine.pass().await;
        tokio::select! {
            () = token.cancelled() => break,
            () = engine.wake_signal().notified() => {}
            () = tokio::time::sleep(E::TICK) => {}
        }
    }
    engine.finish().await;
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[derive(Default)]
    struct Counting {
        wake: Notify,
        passes: AtomicUsize,
        finished: AtomicUsize,
    }

    impl Engine for Counting {
        const TICK: Duration = Duration::from_secs(3600);

        fn wake_signal(&self) -> &Notify {
            &self.wake
        }

        async fn pass(&self) {
            self.passes.fetch_add(1, Ordering::SeqCst);
        }

        async fn finish(&self) {
            self.finished.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_wake_runs_a_pass_and_cancel_flushes_once() {
        let engine = std::sync::Arc::new(Counting::default());
        let token = CancellationToken::new();
        let task = tokio::spawn({
            let (engine, token) = (engine.clone(), token.clone());
            async move { run(&*engine, token).await }
        });
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
    }
}
