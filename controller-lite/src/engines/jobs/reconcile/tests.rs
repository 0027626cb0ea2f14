#![allow(clippy::unwrap_used)]
use super::*;
use rigger_api::image_pull_job::ImagePullJob;
use rigger_api::secret;
use std::collections::BTreeMap;

use crate::engines::jobs::status;
use rigger_proto::time::rfc3339;
use std::time::{Duration, SystemTime};

pub(crate) fn job(spec: &serde_json::Value) -> JobState {
    let job: ImagePullJob = serde_json::from_value(serde_json::json!({
        "apiVersion": "rigger.dev/v1alpha1",
        "kind": "ImagePullJob",
        "metadata": {"name": "j", "namespace": "default", "uid": "u1"},
        "spec": spec,
    }))
    .unwrap();
    job.validate().unwrap();
    JobState::new(
        1,
        job,
        ImagePullJobStatus::default(),
        status::Written::default(),
    )
}

fn nodes(names: &[&str]) -> HashMap<String, NodeView> {
    names
        .iter()
        .map(|n| {
            (
                (*n).to_owned(),
                NodeView {
                    labels: [("zone".to_owned(), "a".to_owned())].into(),
                    credential_labels: BTreeMap::new(),
                    not_ready: None,
                    pod_labels: Vec::new(),
                    images: None,
                    peer_address: None,
                },
            )
        })
        .collect()
}

fn no_credentials() -> TaskCredentials<'static> {
    static NONE: std::sync::LazyLock<HashMap<ObjectKey, Result<String, String>>> =
        std::sync::LazyLock::new(HashMap::new);
    TaskCredentials {
        secrets: &NONE,
        grants: None,
    }
}

pub(crate) fn key() -> ObjectKey {
    ObjectKey::new("ImagePullJob", "default", "j")
}

/// `seconds` into a test: a wall time and a monotonic instant that move together (the
/// instant from one origin the tests share; only its offsets matter).
pub(crate) fn at(seconds: u64) -> Now {
    static ORIGIN: std::sync::LazyLock<std::time::Instant> =
        std::sync::LazyLock::new(std::time::Instant::now);
    Now {
        wall: SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + seconds),
        mono: *ORIGIN + Duration::from_secs(seconds),
    }
}

/// One pass at `now` with `credentials`; its effects.
fn pass_with(
    job: &mut JobState,
    views: &HashMap<String, NodeView>,
    credentials: &TaskCredentials<'_>,
    now: Now,
) -> Effects {
    pass_starting(job, views, credentials, now, false)
}

/// One pass at `now`, right after a controller start (`starting`) or not; its effects.
fn pass_starting(
    job: &mut JobState,
    views: &HashMap<String, NodeView>,
    credentials: &TaskCredentials<'_>,
    now: Now,
    starting: bool,
) -> Effects {
    pass_admitting(job, views, credentials, now, starting, starting)
}

/// One pass at `now`, `starting` or not, that lets nodes join (`admitting`) or not.
fn pass_admitting(
    job: &mut JobState,
    views: &HashMap<String, NodeView>,
    credentials: &TaskCredentials<'_>,
    now: Now,
    starting: bool,
    admitting: bool,
) -> Effects {
    let mut effects = Effects::default();
    let mut tasks = HashMap::new();
    let key = key();
    let pass = Pass {
        key: &key,
        views,
        credentials,
        starting,
        admitting,
        now,
    };
    reconcile_job(
        &pass,
        job,
        &mut Out {
            tasks: &mut tasks,
            effects: &mut effects,
        },
    );
    effects
}

/// One pass at `now`; its effects.
fn pass_at(job: &mut JobState, views: &HashMap<String, NodeView>, now: Now) -> Effects {
    pass_with(job, views, &no_credentials(), now)
}

/// The nodes `effects` send a task (or, with `cancels`, a cancellation).
fn sent_to(effects: &Effects, cancels: bool) -> Vec<String> {
    effects
        .messages
        .iter()
        .filter(|(_, m)| match m.message {
            Some(controller_message::Message::Task(_)) => !cancels,
            Some(controller_message::Message::CancelTask(_)) => cancels,
            _ => false,
        })
        .map(|(node, _)| node.clone())
        .collect()
}

/// The ids of the tasks `effects` send.
fn task_ids(effects: &Effects) -> Vec<&str> {
    effects
        .messages
        .iter()
        .filter_map(|(_, m)| match &m.message {
            Some(controller_message::Message::Task(task)) => Some(task.id.as_str()),
            _ => None,
        })
        .collect()
}

/// One pass at the start of the test's time; the nodes that were sent a task.
fn step(job: &mut JobState, views: &HashMap<String, NodeView>) -> Vec<String> {
    sent_to(&pass_at(job, views, at(0)), false)
}

/// The nodes a job of `spec` takes, after one reconcile over `views`.
fn selected(spec: &serde_json::Value, views: &HashMap<String, NodeView>) -> Vec<String> {
    let mut j = job(spec);
    step(&mut j, views);
    j.status.nodes.iter().map(|n| n.name.clone()).collect()
}

fn finish(job: &mut JobState, node: &str, phase: NodePullPhase) {
    let entry = job.entry(node).unwrap();
    entry.phase = phase;
}

#[test]
fn parallelism_counts_only_nodes_pulling() {
    let views = nodes(&["n1", "n2", "n3", "n4", "n5"]);
    let mut j = job(&serde_json::json!({"image": "r.example/a:1", "parallelism": "40%"}));
    assert_eq!(
        step(&mut j, &views),
        ["n1", "n2"],
        "40% of 5 rounds up to 2"
    );
    assert_eq!(
        step(&mut j, &views),
        Vec::<String>::new(),
        "both slots are taken"
    );
    finish(&mut j, "n1", NodePullPhase::Succeeded);
    finish(&mut j, "n2", NodePullPhase::Failed);
    // Finished nodes, failed or not, hold no slot (kruise #1271).
    assert_eq!(step(&mut j, &views), ["n3", "n4"]);
    assert_eq!(j.status.active, 2);
    assert_eq!((j.status.succeeded, j.status.failed), (1, 1));
    assert_eq!(j.status.failed_nodes, ["n2"]);
    assert!(j.status.completion_time.is_none());
}

#[test]
fn parallelism_zero_pauses_until_raised() {
    let views = nodes(&["n1", "n2"]);
    let mut j = job(&serde_json::json!({"image": "r.example/a:1", "parallelism": 0}));
    assert_eq!(step(&mut j, &views), Vec::<String>::new());
    assert_eq!(step(&mut j, &views), Vec::<String>::new());
    assert_eq!(j.status.desired, 2, "the nodes are chosen, none started");
    assert!(
        j.status.message.starts_with("paused"),
        "{}",
        j.status.message
    );
    assert!(j.status.completion_time.is_none());
    j.job.spec.parallelism = Some(rigger_api::IntOrPercent::Int(1));
    assert_eq!(step(&mut j, &views), ["n1"]);
    assert!(!j.status.message.starts_with("paused"));
}

#[test]
fn always_fixes_the_nodes_at_the_start_and_never_takes_newcomers() {
    let mut always = job(&serde_json::json!({"image": "r.example/a:1", "parallelism": 10}));
    step(&mut always, &nodes(&["n1"]));
    step(&mut always, &nodes(&["n1", "n2"]));
    assert_eq!(always.status.desired, 1);
    finish(&mut always, "n1", NodePullPhase::Succeeded);
    step(&mut always, &nodes(&["n1", "n2"]));
    assert!(always.status.completion_time.is_some());
    assert_eq!(always.status.conditions[0].kind, "Complete");

    let mut never = job(&serde_json::json!({
        "image": "r.example/a:1", "parallelism": 10, "completionPolicy": {"type": "Never"}
    }));
    step(&mut never, &nodes(&["n1"]));
    finish(&mut never, "n1", NodePullPhase::Succeeded);
    assert_eq!(
        step(&mut never, &nodes(&["n1", "n2"])),
        ["n2"],
        "a node that joins later pulls"
    );
    finish(&mut never, "n2", NodePullPhase::Succeeded);
    step(&mut never, &nodes(&["n1", "n2"]));
    assert!(
        never.status.completion_time.is_none(),
        "Never jobs never complete"
    );
}

#[test]
fn never_pulls_again_when_the_image_left_the_node() {
    let mut never = job(&serde_json::json!({
        "image": "r.example/a:1", "parallelism": 10, "completionPolicy": {"type": "Never"}
    }));
    let mut views = nodes(&["n1"]);
    step(&mut never, &views);
    let done = at(0).wall;
    let entry = never.entry("n1").unwrap();
    entry.phase = NodePullPhase::Succeeded;
    entry.completion_time = Some(rfc3339(done));
    let names = crate::fleet::nodes::NodeImages::named;
    // An inventory from before the pull proves nothing; one after it with the image is fine.
    views.get_mut("n1").unwrap().images = Some((done - Duration::from_secs(5), names(&[])));
    assert!(step(&mut never, &views).is_empty());
    views.get_mut("n1").unwrap().images = Some((at(60).wall, names(&["r.example/a:1"])));
    assert!(step(&mut never, &views).is_empty());
    // The image is gone: pulled again.
    views.get_mut("n1").unwrap().images = Some((at(70).wall, names(&["r.example/b:1"])));
    assert_eq!(step(&mut never, &views), ["n1"]);
}

#[test]
fn selectors_pick_nodes_by_label_name_or_pods() {
    let mut views = nodes(&["n1", "n2", "n3"]);
    views
        .get_mut("n2")
        .unwrap()
        .labels
        .insert("disk".to_owned(), "ssd".to_owned());
    let web = || std::sync::Arc::new([("app".to_owned(), "web".to_owned())].into());
    views
        .get_mut("n3")
        .unwrap()
        .pod_labels
        .push(("default".into(), web()));
    // The same labels in another namespace choose nothing (Kruise's podSelector
    // looks in the job's namespace only).
    views
        .get_mut("n1")
        .unwrap()
        .pod_labels
        .push(("other".into(), web()));
    let by_label = |spec| selected(&spec, &views);
    assert_eq!(
        by_label(
            serde_json::json!({"image": "r.example/a:1", "selector": {"matchLabels": {"disk": "ssd"}}})
        ),
        ["n2"]
    );
    assert_eq!(
        by_label(
            serde_json::json!({"image": "r.example/a:1", "selector": {"names": ["n1", "gone"]}})
        ),
        ["gone", "n1"],
        "named nodes are part of the job even when unknown"
    );
    assert_eq!(
        by_label(
            serde_json::json!({"image": "r.example/a:1", "podSelector": {"matchLabels": {"app": "web"}}})
        ),
        ["n3"]
    );
}

#[test]
fn a_job_with_pull_secrets_believes_only_the_labels_an_admin_set() {
    let mut views = nodes(&["claims", "chosen"]);
    let team = || [("team".to_owned(), "payments".to_owned())].into();
    // "claims" reports the label itself; "chosen" was labelled by an admin.
    views.get_mut("claims").unwrap().labels = team();
    let chosen = views.get_mut("chosen").unwrap();
    chosen.labels = team();
    chosen.credential_labels = team();
    let selected = |spec| selected(&spec, &views);
    let selector = serde_json::json!({"matchLabels": {"team": "payments"}});
    assert_eq!(
        selected(serde_json::json!({"image": "r.example/a:1", "selector": selector})),
        ["chosen", "claims"]
    );
    assert_eq!(
        selected(
            serde_json::json!({"image": "r.example/a:1", "selector": selector, "pullSecrets": ["creds"]})
        ),
        ["chosen"]
    );
}

#[test]
fn an_unknown_node_fails_as_lost_and_the_job_waits_for_it() {
    let mut j =
        job(&serde_json::json!({"image": "r.example/a:1", "selector": {"names": ["gone"]}}));
    step(&mut j, &HashMap::new());
    let entry = &j.status.nodes[0];
    assert_eq!(entry.phase, NodePullPhase::Failed);
    assert!(entry.node_lost);
    assert_eq!(entry.message, "node not ready: node is not registered");
    assert!(
        j.status.completion_time.is_none(),
        "a lost node may come back"
    );
    // It registers: the work resumes at once.
    assert_eq!(step(&mut j, &nodes(&["gone"])), ["gone"]);
    assert_eq!(j.status.nodes[0].phase, NodePullPhase::Pulling);
    assert!(!j.status.nodes[0].node_lost);
}

#[test]
fn the_deadline_fails_what_is_open_and_the_ttl_deletes_the_job() {
    let mut j = job(&serde_json::json!({
        "image": "r.example/a:1", "parallelism": 1,
        "completionPolicy": {"type": "Always", "activeDeadlineSeconds": 60, "ttlSecondsAfterFinished": 30}
    }));
    let views = nodes(&["n1", "n2"]);
    assert_eq!(step(&mut j, &views), ["n1"]);
    // A minute and a second later (the job started at 0).
    let effects = pass_at(&mut j, &views, at(61));
    assert_eq!(
        sent_to(&effects, true),
        ["n1"],
        "the pull in flight is cancelled"
    );
    assert_eq!(j.status.failed, 2);
    assert_eq!(j.status.conditions[0].reason, "DeadlineExceeded");
    assert!(
        j.status
            .message
            .starts_with("activeDeadlineSeconds exceeded"),
        "{}",
        j.status.message
    );

    // Finished at 61 with a TTL of 30 s: kept at 90, gone at 91.
    assert!(pass_at(&mut j, &views, at(90)).expired.is_empty());
    let effects = pass_at(&mut j, &views, at(91));
    assert_eq!(effects.expired, [key()]);
}

#[test]
fn a_missing_pull_secret_fails_the_node_with_the_reason() {
    let mut j = job(&serde_json::json!({"image": "r.example/a:1", "pullSecrets": ["creds"]}));
    let secrets: HashMap<ObjectKey, Result<String, String>> = [(
        ObjectKey::new(secret::KIND, "default", "creds"),
        Err("does not exist".to_owned()),
    )]
    .into();
    let credentials = TaskCredentials {
        secrets: &secrets,
        grants: None,
    };
    let effects = pass_with(&mut j, &nodes(&["n1"]), &credentials, at(0));
    assert!(effects.messages.is_empty());
    assert_eq!(
        j.status.nodes[0].message,
        "pull secret \"creds\" does not exist"
    );
    assert!(j.status.completion_time.is_some());
}

fn failed(id: &str) -> rigger_proto::v1::TaskStatus {
    rigger_proto::v1::TaskStatus {
        id: id.to_owned(),
        phase: rigger_proto::v1::TaskPhase::Failed.into(),
        message: "registry said no".to_owned(),
        ..rigger_proto::v1::TaskStatus::default()
    }
}

#[test]
fn a_failed_attempt_waits_out_its_back_off_on_the_clock() {
    let mut j =
        job(&serde_json::json!({"image": "r.example/a:1", "pullPolicy": {"backoffLimit": 2}}));
    let views = nodes(&["n1"]);
    assert_eq!(sent_to(&pass_at(&mut j, &views, at(0)), false), ["n1"]);
    assert!(super::super::report::fold(
        &key(),
        &mut j,
        "n1",
        failed("u1/n1/1"),
        at(10)
    ));
    // After the first failure, 2 s.
    assert!(sent_to(&pass_at(&mut j, &views, at(11)), false).is_empty());
    assert_eq!(sent_to(&pass_at(&mut j, &views, at(12)), false), ["n1"]);
    assert_eq!(j.status.nodes[0].task_id, "u1/n1/2");
    // After the second, 4 s.
    super::super::report::fold(&key(), &mut j, "n1", failed("u1/n1/2"), at(20));
    assert!(sent_to(&pass_at(&mut j, &views, at(23)), false).is_empty());
    assert_eq!(sent_to(&pass_at(&mut j, &views, at(24)), false), ["n1"]);
    // The third failure is past backoffLimit 2: the node fails, the job completes.
    super::super::report::fold(&key(), &mut j, "n1", failed("u1/n1/3"), at(30));
    pass_at(&mut j, &views, at(30));
    assert_eq!(j.status.nodes[0].phase, NodePullPhase::Failed);
    assert!(j.status.completion_time.is_some());
}

#[test]
fn a_node_lost_while_pulling_has_its_timeout_to_come_back() {
    let mut j = job(&serde_json::json!({
        "image": "r.example/a:1", "parallelism": 2, "pullPolicy": {"timeoutSeconds": 60}
    }));
    let mut views = nodes(&["n1", "n2"]);
    assert_eq!(step(&mut j, &views), ["n1", "n2"]);
    views.get_mut("n1").unwrap().not_ready = Some("its link is down".to_owned());
    pass_at(&mut j, &views, at(5));
    let lost = j.status.nodes[0].clone();
    assert_eq!(lost.phase, NodePullPhase::Failed);
    assert!(lost.node_lost);
    assert_eq!(lost.message, "node lost while pulling: its link is down");
    let done = rigger_proto::v1::TaskStatus {
        id: "u1/n2/1".to_owned(),
        phase: rigger_proto::v1::TaskPhase::Succeeded.into(),
        ..rigger_proto::v1::TaskStatus::default()
    };
    super::super::report::fold(&key(), &mut j, "n2", done, at(6));
    // Lost 60 s at 65: it may still come back, the job waits.
    pass_at(&mut j, &views, at(65));
    assert!(j.status.nodes[0].node_lost);
    assert!(j.status.completion_time.is_none());
    // Past its timeout, the loss is final and the job completes.
    pass_at(&mut j, &views, at(66));
    let final_entry = &j.status.nodes[0];
    assert!(!final_entry.node_lost);
    assert!(
        final_entry
            .message
            .ends_with("not back within pullPolicy.timeoutSeconds (60s)"),
        "{}",
        final_entry.message
    );
    pass_at(&mut j, &views, at(66));
    assert_eq!(j.status.conditions[0].reason, "CompletedWithFailures");
}

#[test]
fn a_node_back_from_a_loss_goes_on_with_the_attempt_it_held() {
    let mut j = job(&serde_json::json!({"image": "r.example/a:1", "parallelism": 2}));
    let mut views = nodes(&["n1", "n2"]);
    assert_eq!(step(&mut j, &views), ["n1", "n2"]);
    views.get_mut("n1").unwrap().not_ready = Some("its link is down".to_owned());
    pass_at(&mut j, &views, at(5));
    assert!(j.status.nodes[0].node_lost);
    // Back: its attempt goes on, and the same task is sent again (the agent answers for
    // it, running or done); no second attempt races the report of the first.
    views.get_mut("n1").unwrap().not_ready = None;
    pass_at(&mut j, &views, at(8));
    let back = &j.status.nodes[0];
    assert_eq!(back.phase, NodePullPhase::Pulling);
    assert_eq!((back.attempts, back.task_id.as_str()), (1, "u1/n1/1"));
    let effects = pass_at(&mut j, &views, at(9));
    assert_eq!(task_ids(&effects), ["u1/n1/1"]);
    let running = rigger_proto::v1::TaskStatus {
        id: "u1/n1/1".to_owned(),
        phase: rigger_proto::v1::TaskPhase::Succeeded.into(),
        ..rigger_proto::v1::TaskStatus::default()
    };
    super::super::report::fold(&key(), &mut j, "n1", running, at(10));
    assert_eq!(j.status.nodes[0].phase, NodePullPhase::Succeeded);
    assert_eq!(j.status.nodes[0].attempts, 1);
}

/// Found in `make test` (a controller killed mid-job): the new controller loaded the job
/// 175 ms after the agent registered, before its inventory made the node ready; the pass
/// then dropped the resend the load asked for, the agent's answer for the attempt never
/// came, and the node pulled a second time once the attempt's time ran out. The resend
/// waits for the node instead.
#[test]
fn a_resend_asked_while_the_node_is_not_ready_yet_is_sent_once_it_is() {
    let mut j = job(&serde_json::json!({"image": "r.example/a:1"}));
    let mut views = nodes(&["n1"]);
    assert_eq!(step(&mut j, &views), ["n1"]);
    // A new controller's load: the attempt in flight is to be sent again.
    j.run("n1").resend = true;
    views.get_mut("n1").unwrap().not_ready = Some("no inventory yet".to_owned());
    let early = pass_starting(&mut j, &views, &no_credentials(), at(1), true);
    assert!(sent_to(&early, false).is_empty());
    assert_eq!(j.status.nodes[0].phase, NodePullPhase::Pulling);
    views.get_mut("n1").unwrap().not_ready = None;
    let ready = pass_starting(&mut j, &views, &no_credentials(), at(2), true);
    assert_eq!(
        task_ids(&ready),
        ["u1/n1/1"],
        "the same attempt, not a new one"
    );
    assert!(
        sent_to(&pass_at(&mut j, &views, at(3)), false).is_empty(),
        "once"
    );
}

#[test]
fn a_silent_node_is_given_up_after_its_timeout_and_a_margin() {
    let mut j = job(&serde_json::json!({
        "image": "r.example/a:1", "pullPolicy": {"timeoutSeconds": 60, "backoffLimit": 1}
    }));
    let views = nodes(&["n1"]);
    assert_eq!(step(&mut j, &views), ["n1"]);
    // The agent enforces the timeout; the controller waits 30 s more for its word.
    assert!(sent_to(&pass_at(&mut j, &views, at(90)), true).is_empty());
    // Then its attempt is cancelled and the next one goes out in the same pass.
    let effects = pass_at(&mut j, &views, at(91));
    assert_eq!(sent_to(&effects, true), ["n1"]);
    assert_eq!(sent_to(&effects, false), ["n1"]);
    assert_eq!(j.status.nodes[0].task_id, "u1/n1/2");
    // Silent again, past backoffLimit 1: the node fails with the reason.
    pass_at(&mut j, &views, at(182));
    assert_eq!(j.status.nodes[0].phase, NodePullPhase::Failed);
    assert_eq!(
        j.status.nodes[0].message,
        "no result within pullPolicy.timeoutSeconds (60s)"
    );
}

/// Found looking into a CI hang on the real cluster: the last agent to come back to a new leader ends its
/// start, so the first pass that sees that agent is already past the start — it never
/// joined the job, which completed over the others. The pass the start ends on still
/// takes members; the passes after it do not.
#[test]
fn the_agent_whose_return_ends_the_start_still_joins_the_job() {
    let mut always = job(&serde_json::json!({"image": "r.example/app:1",
        "completionPolicy": {"type": "Always"}}));
    pass_starting(
        &mut always,
        &nodes(&["a", "b"]),
        &no_credentials(),
        at(0),
        true,
    );
    assert_eq!(always.status.desired, 2);

    let all = nodes(&["a", "b", "c"]);
    pass_admitting(&mut always, &all, &no_credentials(), at(1), false, true);
    assert_eq!(always.status.desired, 3, "{:?}", always.status);

    // Once started, a node that registers later does not join an Always job.
    let more = nodes(&["a", "b", "c", "d"]);
    pass_admitting(&mut always, &more, &no_credentials(), at(2), false, false);
    assert_eq!(always.status.desired, 3, "{:?}", always.status);
}

/// Found in the real cluster: a job made right after a leader took over, before any agent
/// reconnected, completed at once over no node (and one started under a leader that was
/// itself starting, over the one node back by then). While the controller starts, a job
/// takes the nodes whose agents come back and does not complete; once started, one that
/// selects no node completes.
#[test]
fn a_job_made_while_agents_reconnect_waits_for_them_rather_than_completing_over_none() {
    let mut always = job(&serde_json::json!({"image": "r.example/app:1",
        "completionPolicy": {"type": "Always"}}));
    let none = HashMap::new();
    pass_starting(&mut always, &none, &no_credentials(), at(0), true);
    assert!(!always.finished(), "{:?}", always.status);
    assert_eq!(always.status.desired, 0);

    // The agents are back: the job takes them, and is not done until they pulled.
    let back = nodes(&["a", "b"]);
    pass_starting(&mut always, &back, &no_credentials(), at(1), true);
    assert_eq!(always.status.desired, 2);
    assert!(!always.finished());

    // After the start, a job that selects no node completes, saying so.
    let mut empty = job(&serde_json::json!({"image": "r.example/app:1",
        "selector": {"matchLabels": {"pool": "none"}},
        "completionPolicy": {"type": "Always"}}));
    pass_at(&mut empty, &back, at(2));
    assert!(empty.finished());
    assert_eq!(empty.status.message, "no node matches the job's selector");
}

/// kruise#2221: a job's `pullPolicy.timeoutSeconds` edited while its pulls go on reaches
/// them — each node still pulling gets its task again, same id, with the new limit; a
/// node done gets nothing.
#[test]
fn an_edited_timeout_is_sent_to_the_pulls_still_going() {
    let mut j = job(&serde_json::json!({
        "image": "r.example/a:1", "parallelism": 2, "pullPolicy": {"timeoutSeconds": 600}
    }));
    let views = nodes(&["n1", "n2"]);
    assert_eq!(step(&mut j, &views), ["n1", "n2"]);
    finish(&mut j, "n2", NodePullPhase::Succeeded);
    j.job.spec.pull_policy.timeout_seconds = 60;
    j.resend_pulling();
    let effects = pass_at(&mut j, &views, at(5));
    let sent: Vec<(String, String, u32)> = effects
        .messages
        .iter()
        .filter_map(|(node, m)| match &m.message {
            Some(controller_message::Message::Task(task)) => match &task.work {
                Some(rigger_proto::v1::task::Work::PullImage(pull)) => {
                    Some((node.clone(), task.id.clone(), pull.timeout_seconds))
                }
                _ => None,
            },
            _ => None,
        })
        .collect();
    assert_eq!(sent, [("n1".to_owned(), "u1/n1/1".to_owned(), 60)]);
}

#[test]
fn a_job_another_controller_started_takes_its_nodes_rather_than_completing_over_none() {
    // Kruise's manager's status: counts and a start time, no node of Rigger's.
    let mut j = job(&serde_json::json!({"image": "r.example/a:1", "parallelism": 1}));
    j.status.start_time = Some(rfc3339(at(0).wall));
    j.status.desired = 3;
    j.status.succeeded = 2;
    let views = nodes(&["n1", "n2", "n3"]);
    // No start window (every agent already connected): the job still takes its nodes.
    let sent = sent_to(
        &pass_admitting(&mut j, &views, &no_credentials(), at(5), false, false),
        false,
    );
    assert_eq!(sent, ["n1"], "one at a time, as its parallelism says");
    assert_eq!(j.status.desired, 3);
    assert!(j.status.completion_time.is_none(), "{:?}", j.status);
    assert_eq!(
        j.status.start_time.as_deref(),
        Some(rfc3339(at(0).wall).as_str()),
        "its deadline still counts from the start the other controller made"
    );
    // Once it has nodes, it takes no newcomer (Always).
    let more = nodes(&["n1", "n2", "n3", "n4"]);
    pass_admitting(&mut j, &more, &no_credentials(), at(6), false, false);
    assert_eq!(j.status.desired, 3);
}

/// kruise#2071: with `completionPolicy: Never`, Kruise's manager gives a node at most
/// max(1800 s, timeoutSeconds) in all, so slow pulls never reach their retries. Here each
/// attempt has its `timeoutSeconds` and a node has all of its `backoffLimit` retries.
#[test]
fn a_never_job_gives_each_node_every_retry_each_with_its_whole_timeout() {
    let mut j = job(&serde_json::json!({
        "image": "r.example/big:1",
        "completionPolicy": {"type": "Never"},
        "pullPolicy": {"timeoutSeconds": 3600, "backoffLimit": 3},
    }));
    let views = nodes(&["n1"]);
    let mut sent = 0;
    let mut now = 0;
    for attempt in 1..=4 {
        // Sent after its back-off (2, 4, 8 s), never cut short in between.
        while sent_to(&pass_at(&mut j, &views, at(now)), false).is_empty() {
            assert_eq!(
                j.status.nodes[0].phase,
                NodePullPhase::Waiting,
                "at {now} s"
            );
            now += 1;
        }
        sent += 1;
        for check in [1800, 3599] {
            pass_at(&mut j, &views, at(now + check));
            assert_eq!(
                j.status.nodes[0].phase,
                NodePullPhase::Pulling,
                "attempt {attempt}, {check} s in"
            );
        }
        now += 3600;
        super::super::report::fold(
            &key(),
            &mut j,
            "n1",
            failed(&format!("u1/n1/{attempt}")),
            at(now),
        );
    }
    pass_at(&mut j, &views, at(now));
    assert_eq!(sent, 4, "the first attempt and three retries");
    assert!(now > 4 * 3600, "{now} s in all");
    assert_eq!(j.status.nodes[0].phase, NodePullPhase::Failed);
    assert!(j.status.completion_time.is_none(), "Never");
}
