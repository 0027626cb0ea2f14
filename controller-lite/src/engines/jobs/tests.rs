#![allow(clippy::unwrap_used)]
use super::reconcile::tests::{job, key};
use super::*;

#[test]
fn agents_are_waited_for_only_when_some_may_still_come_back() {
    // Past the node timeout: never.
    assert!(!agents_may_be_reconnecting(false, Some(false), true));
    // A cluster: until every Node's agent is back.
    assert!(agents_may_be_reconnecting(true, Some(false), false));
    assert!(!agents_may_be_reconnecting(true, Some(true), true));
    // Elsewhere: only after a restart that found jobs begun before it.
    assert!(agents_may_be_reconnecting(true, None, true));
    assert!(!agents_may_be_reconnecting(true, None, false));
}

#[test]
fn a_failed_jobs_event_says_why_its_first_nodes_failed() {
    use rigger_api::image_pull_job::NodePullStatus;
    let node = |name: &str, phase, message: &str| NodePullStatus {
        name: name.to_owned(),
        phase,
        message: message.to_owned(),
        ..NodePullStatus::default()
    };
    let mut j = job(&serde_json::json!({"image": "r.example/a:1"}));
    j.status.nodes = vec![
        node(
            "a",
            NodePullPhase::Failed,
            "pull secret \"cred\" does not exist",
        ),
        node("b", NodePullPhase::Succeeded, ""),
        node("c", NodePullPhase::Failed, "x"),
        node("d", NodePullPhase::Failed, "y"),
        node("e", NodePullPhase::Failed, "z"),
    ];
    j.status.succeeded = 1;
    j.status.failed = 4;
    let event = completion_event(&key(), &j);
    assert_eq!(
        event.message,
        "Image r.example/a:1 pulled on 1 nodes, failed on 4: a: pull secret \"cred\" does not exist; c: x; d: y; and 1 more"
    );
}
use rigger_proto::v1::TaskPhase;

/// A job stored past today's bounds (written around the API, or by an older
/// version) never reaches the engine; the valid one beside it does.
#[tokio::test]
async fn a_stored_job_past_its_bounds_is_skipped_when_loaded() {
    use crate::engines::Engine as _;
    let dir = tempfile::tempdir().unwrap();
    let store = Store::new(rigger_store::EmbeddedStore::open(dir.path()).unwrap());
    let engine = JobEngine::new(
        store.clone(),
        NodeRegistry::default(),
        Duration::from_secs(30),
        None,
    );
    for (name, timeout) in [("huge", u64::MAX), ("fine", 60)] {
        let job = serde_json::json!({
            "apiVersion": "apps.kruise.io/v1alpha1", "kind": "ImagePullJob",
            "metadata": {"name": name, "namespace": "default", "uid": name},
            "spec": {"image": "r.example/a:1", "pullPolicy": {"timeoutSeconds": timeout}},
        });
        store
            .put(
                ObjectKey::new(rigger_api::image_pull_job::KIND, "default", name),
                serde_json::to_vec(&job).unwrap(),
                Precondition::Any,
            )
            .await
            .unwrap();
    }
    let snapshot = engine.observe().await.unwrap();
    let loaded: Vec<&str> = snapshot
        .changed
        .iter()
        .map(|c| c.job.metadata.name.as_str())
        .collect();
    assert_eq!(loaded, ["fine"]);
}

/// Only running jobs with a deadline that passed count (the metric an alert reads).
#[test]
fn past_deadline_counts_running_jobs_whose_deadline_passed() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::new(rigger_store::EmbeddedStore::open(dir.path()).unwrap());
    let engine = JobEngine::new(
        store,
        NodeRegistry::default(),
        Duration::from_secs(30),
        None,
    );
    let started = "2026-01-01T00:00:00Z";
    let always = serde_json::json!({"image": "r.example/a:1",
        "completionPolicy": {"type": "Always", "activeDeadlineSeconds": 60}});
    let mut with_deadline = job(&always);
    with_deadline.status.start_time = Some(started.to_owned());
    let mut without = job(&serde_json::json!({"image": "r.example/a:1"}));
    without.status.start_time = Some(started.to_owned());
    let mut finished = job(&always);
    finished.status.start_time = Some(started.to_owned());
    finished.status.completion_time = Some("2026-01-01T00:00:30Z".to_owned());
    {
        let mut state = engine.lock();
        for (name, job) in [
            ("late", with_deadline),
            ("free", without),
            ("done", finished),
        ] {
            state.jobs.insert(
                ObjectKey::new(rigger_api::image_pull_job::KIND, "default", name),
                job,
            );
        }
    }
    let at = |seconds: u64| parse_time(Some(started)).unwrap() + Duration::from_secs(seconds);
    assert_eq!(engine.past_deadline(at(59)), 0);
    assert_eq!(engine.past_deadline(at(61)), 1);
}

#[tokio::test]
async fn failed_attempts_retry_up_to_the_backoff_limit_and_reports_need_the_right_node() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::new(rigger_store::EmbeddedStore::open(dir.path()).unwrap());
    let registry = NodeRegistry::default();
    let (tx, _rx) = futures::channel::mpsc::channel(8);
    let register = rigger_proto::v1::Register {
        node_name: "n1".to_owned(),
        ..rigger_proto::v1::Register::default()
    };
    registry.register(&register, 1, tx, SystemTime::now());
    // Past its start: agents that will come are back.
    let engine = JobEngine::new(store, registry, Duration::from_secs(30), None)
        .started_at(Instant::now().checked_sub(Duration::from_secs(60)).unwrap());
    let j = job(&serde_json::json!({"image": "r.example/a:1", "pullPolicy": {"backoffLimit": 1}}));
    engine.lock().jobs.insert(key(), j);
    let failed = |id: &str| TaskStatus {
        id: id.to_owned(),
        phase: TaskPhase::Failed.into(),
        message: "registry said no".to_owned(),
        ..TaskStatus::default()
    };
    let entry = |engine: &JobEngine| engine.lock().jobs[&key()].status.nodes[0].clone();

    engine.reconcile(&HashMap::new());
    assert_eq!(entry(&engine).task_id, "u1/n1/1");
    // Another node cannot report for n1.
    engine.report("n2", failed("u1/n1/1"));
    assert_eq!(entry(&engine).phase, NodePullPhase::Pulling);

    engine.report("n1", failed("u1/n1/1"));
    let first = entry(&engine);
    assert_eq!(first.phase, NodePullPhase::Waiting);
    assert_eq!(first.message, "attempt 1 failed: registry said no");
    assert!(
        engine.lock().jobs[&key()].runs["n1"].retry_at.is_some(),
        "retried after a delay"
    );
    engine
        .lock()
        .jobs
        .get_mut(&key())
        .unwrap()
        .run("n1")
        .retry_at = None;

    engine.reconcile(&HashMap::new());
    assert_eq!(entry(&engine).task_id, "u1/n1/2", "a retry is a new task");
    // A late report of the first attempt changes nothing.
    engine.report("n1", failed("u1/n1/1"));
    assert_eq!(entry(&engine).phase, NodePullPhase::Pulling);

    engine.report("n1", failed("u1/n1/2"));
    assert_eq!(
        entry(&engine).phase,
        NodePullPhase::Failed,
        "backoffLimit 1: two attempts"
    );
    engine.reconcile(&HashMap::new());
    assert!(engine.lock().jobs[&key()].status.completion_time.is_some());
}

/// A job a newer release rewrote (a field this one does not know) is left as it is:
/// its pulls are not cancelled and its status not deleted, and it is said once.
#[tokio::test]
async fn a_job_a_newer_release_rewrote_is_left_alone_and_said_once() {
    use crate::engines::Engine as _;
    #[derive(Debug, Default)]
    struct Recorded(std::sync::Mutex<Vec<crate::events::Event>>);
    impl crate::events::EventSink for Recorded {
        fn record(&self, event: crate::events::Event) {
            self.0.lock().unwrap().push(event);
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let store = Store::new(rigger_store::EmbeddedStore::open(dir.path()).unwrap());
    let events = Arc::new(Recorded::default());
    let engine = JobEngine::new(
        store.clone(),
        NodeRegistry::default(),
        Duration::from_secs(30),
        None,
    )
    .with_events(events.clone());
    let job_key = ObjectKey::new(rigger_api::image_pull_job::KIND, "default", "warm");
    let mut written = serde_json::json!({
        "apiVersion": "apps.kruise.io/v1alpha1", "kind": "ImagePullJob",
        "metadata": {"name": "warm", "namespace": "default", "uid": "u1"},
        "spec": {"image": "r.example/a:1"},
    });
    let put = |value: &serde_json::Value| {
        let (store, key, bytes) = (
            store.clone(),
            job_key.clone(),
            serde_json::to_vec(value).unwrap(),
        );
        async move { store.put(key, bytes, Precondition::Any).await.unwrap() }
    };
    put(&written).await;
    let snapshot = engine.observe().await.unwrap();
    engine.pass(snapshot).await;
    assert!(engine.lock().jobs.contains_key(&job_key));

    written["spec"]["pullPolicy"] = serde_json::json!({"newerField": true});
    put(&written).await;
    for _ in 0..2 {
        let snapshot = engine.observe().await.unwrap();
        engine.pass(snapshot).await;
    }
    assert!(
        engine.lock().jobs.contains_key(&job_key),
        "never taken for deleted"
    );
    let said = events.0.lock().unwrap().clone();
    let undecodable: Vec<_> = said
        .iter()
        .filter(|e| e.reason == crate::engines::undecodable::OBJECT_UNDECODABLE)
        .collect();
    assert_eq!(undecodable.len(), 1, "{said:?}");
    assert!(
        undecodable[0]
            .message
            .contains("spec.pullPolicy.newerField: unknown field `newerField`"),
        "{}",
        undecodable[0].message
    );
}
