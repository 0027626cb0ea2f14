//! Every number a user can apply, set to whatever the fuzzer picks, through the apply's
//! admission (`rigger_api::object::admit`) and then through what runs on an accepted
//! object — for ImagePullJobs (and an ImageListPullJob's jobs), the controller's own
//! job engine, two passes and a node's reports. What must hold:
//! - a refusal names one of the fields that were set;
//! - an accepted number is within 0 and Kubernetes' int32 (every field is bounded);
//! - nothing panics, in admission or in the engine.
//!
//! The fields come from each kind's schema (`rigger_api::reference::numeric_fields`), so
//! a new field is fuzzed without touching this file; the seeds below must reach it (a
//! field none of them reaches stops the run at once, naming it).
#![no_main]

use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use arbitrary::{Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;
use rigger_api::Kind;
use rigger_api::container_recreate_request::ContainerRecreateRequest;
use rigger_api::image_list_pull_job::ImageListPullJob;
use rigger_api::image_pull_job::ImagePullJob;
use rigger_api::lifecycle_cooperator::LifecycleCooperator;
use rigger_api::object::{Object, admit};
use rigger_api::pod::Pod;
use rigger_api::sidecar_set::SidecarSet;
use rigger_controller::engines::Engine as _;
use rigger_controller::engines::jobs::JobEngine;
use rigger_controller::fleet::nodes::NodeRegistry;
use rigger_store::{EmbeddedStore, ObjectKey, Precondition, Store};
use rigger_proto::v1::{Register, TaskPhase, TaskStatus};
use serde_json::{Value, json};

/// Kinds with numbers, each with seeds that together reach every one of them.
const KINDS: [Kind; 6] = [
    Kind::ImagePullJob,
    Kind::ImageListPullJob,
    Kind::ContainerRecreateRequest,
    Kind::Pod,
    Kind::SidecarSet,
    Kind::LifecycleCooperator,
];

/// A container with every structure a number lives in; `hooks` picks which action each
/// hook and probe uses (a handler has one).
fn container(name: &str, http_hooks: bool) -> Value {
    let (first, second) = if http_hooks {
        (json!({"httpGet": {"port": 8080}}), json!({"tcpSocket": {"port": 8080}}))
    } else {
        (json!({"tcpSocket": {"port": 8080}}), json!({"httpGet": {"port": 8080}}))
    };
    let probe = |action: &Value| {
        let mut probe = json!({"initialDelaySeconds": 1, "periodSeconds": 10, "timeoutSeconds": 1,
            "successThreshold": 1, "failureThreshold": 3});
        for (k, v) in action.as_object().into_iter().flatten() {
            probe[k] = v.clone();
        }
        probe
    };
    json!({
        "name": name, "image": "r.example/app:1",
        "ports": [{"name": "http", "containerPort": 8080}],
        "resources": {"limits": {"cpu": "500m", "memory": "64Mi"}},
        "lifecycle": {"postStart": first, "preStop": second},
        "readinessProbe": probe(&first), "livenessProbe": probe(&second), "startupProbe": probe(&first),
    })
}

fn seeds(kind: Kind) -> Vec<Value> {
    let job_spec = json!({"image": "r.example/app:1", "parallelism": 2,
        "completionPolicy": {"type": "Always", "activeDeadlineSeconds": 600, "ttlSecondsAfterFinished": 60},
        "pullPolicy": {"timeoutSeconds": 600, "backoffLimit": 3}});
    match kind {
        Kind::ImagePullJob => vec![json!({"apiVersion": "apps.kruise.io/v1alpha1", "kind": "ImagePullJob",
            "metadata": {"name": "j", "uid": "u1"}, "spec": job_spec})],
        Kind::ImageListPullJob => {
            let mut spec = job_spec;
            spec.as_object_mut().map(|s| s.remove("image"));
            spec["images"] = json!(["r.example/app:1", "r.example/web:2"]);
            vec![json!({"apiVersion": "apps.kruise.io/v1alpha1", "kind": "ImageListPullJob",
                "metadata": {"name": "l"}, "spec": spec})]
        }
        Kind::ContainerRecreateRequest => [("httpGet", 8080), ("tcpSocket", 8080)]
            .iter()
            .map(|(action, port)| json!({"apiVersion": "apps.kruise.io/v1alpha1", "kind": "ContainerRecreateRequest",
                "metadata": {"name": "r"},
                "spec": {"podName": "p", "activeDeadlineSeconds": 300, "ttlSecondsAfterFinished": 60,
                    "strategy": {"terminationGracePeriodSeconds": 30, "unreadyGracePeriodSeconds": 5, "minStartedSeconds": 2},
                    "containers": [{"name": "app", "ports": [{"name": "http", "containerPort": 8080}],
                        "preStop": {*action: {"port": port}},
                        "statusContext": {"containerID": format!("containerd://{}", "a".repeat(64)), "restartCount": 1}}]}}))
            .collect(),
        Kind::Pod => [true, false]
            .iter()
            .map(|http| json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                "spec": {"hostNetwork": true, "terminationGracePeriodSeconds": 30,
                    "initContainers": [{"name": "init", "image": "r.example/app:1",
                        "ports": [{"containerPort": 9000}]}],
                    "containers": [container("app", *http)]}}))
            .collect(),
        Kind::SidecarSet => [true, false]
            .iter()
            .map(|http| json!({"apiVersion": "apps.kruise.io/v1alpha1", "kind": "SidecarSet",
                "metadata": {"name": "s"},
                "spec": {"selector": {"matchLabels": {"app": "web"}}, "revisionHistoryLimit": 10,
                    "initContainers": [{"name": "init", "image": "r.example/init:1",
                        "ports": [{"containerPort": 9000}]}],
                    "containers": [container("sidecar", *http)],
                    "updateStrategy": {"maxUnavailable": 1, "partition": 0,
                        "priorityStrategy": {"weightPriority": [{"weight": 50,
                            "matchSelector": {"matchLabels": {"tier": "a"}}}]}}}}))
            .collect(),
        Kind::LifecycleCooperator => vec![json!({"apiVersion": "rigger.dev/v1alpha1", "kind": "LifecycleCooperator",
            "metadata": {"name": "c"},
            "spec": {"selector": {"matchLabels": {"app": "web"}}, "operations": ["InPlaceUpdate"],
                "timeoutSeconds": 30, "webhook": {"url": "http://127.0.0.1:9/ready"}}})],
        _ => Vec::new(),
    }
}

/// The seeds of each kind, and each field as (pointer, the seeds whose object holds
/// the field's parent; none: the parents are made as the field is set — fields whose
/// structure a kind refuses as a whole, like an init container's probes).
struct Fields {
    kinds: Vec<(Kind, Vec<Value>, Vec<(String, Vec<usize>)>)>,
}

fn fields() -> &'static Fields {
    static FIELDS: OnceLock<Fields> = OnceLock::new();
    FIELDS.get_or_init(|| {
        let mut kinds = Vec::new();
        for kind in KINDS {
            let seeds = seeds(kind);
            for (i, seed) in seeds.iter().enumerate() {
                if let Err((what, error)) = admit_as(kind, seed.clone()) {
                    panic!("seed {i} of {kind:?} is refused: {what}: {error}");
                }
            }
            let mut fields = Vec::new();
            for pointer in rigger_api::reference::numeric_fields(kind) {
                let parent = &pointer[..pointer.rfind('/').unwrap_or(0)];
                let reaching: Vec<usize> = (0..seeds.len())
                    .filter(|i| seeds[*i].pointer(parent).is_some_and(Value::is_object))
                    .collect();
                fields.push((pointer, reaching));
            }
            kinds.push((kind, seeds, fields));
        }
        Fields { kinds }
    })
}

/// A value for a number field: the edges a bound has, or anything.
#[derive(Debug, Arbitrary)]
enum Number {
    Edge(u8),
    Unsigned(u64),
    Signed(i64),
    Float(f64),
    Percent(u32),
    Text(String),
}

const EDGES: [u64; 18] = [
    0, 1, 2, 3, 29, 30, 31, 100, 101, 299, 300, 65535, 65536, 86_400, 86_401,
    i32::MAX as u64, i32::MAX as u64 + 1, u64::MAX,
];

impl Number {
    fn value(&self) -> Value {
        match self {
            Self::Edge(i) => json!(EDGES[usize::from(*i) % EDGES.len()]),
            Self::Unsigned(n) => json!(n),
            Self::Signed(n) => json!(n),
            Self::Float(f) => serde_json::Number::from_f64(*f).map_or(Value::Null, Value::Number),
            Self::Percent(p) => json!(format!("{}%", p % 300)),
            Self::Text(t) => json!(t),
        }
    }
}

#[derive(Debug, Arbitrary)]
struct Input {
    kind: u8,
    seed: u8,
    assignments: Vec<(u16, Number)>,
}

fuzz_target!(|data: &[u8]| {
    let Ok(input) = Input::arbitrary(&mut Unstructured::new(data)) else {
        return;
    };
    let all = fields();
    let (kind, seeds, fields) = &all.kinds[usize::from(input.kind) % all.kinds.len()];
    if fields.is_empty() || input.assignments.is_empty() {
        return;
    }
    let mut object = seeds[usize::from(input.seed) % seeds.len()].clone();
    let mut set = Vec::new();
    for (field, number) in input.assignments.iter().take(4) {
        let (pointer, reaching) = &fields[usize::from(*field) % fields.len()];
        if !reaching.is_empty() && !reaching.contains(&(usize::from(input.seed) % seeds.len())) {
            continue;
        }
        let value = number.value();
        if set_at(&mut object, pointer, value.clone()) {
            set.push((pointer.clone(), value));
        }
    }
    if set.is_empty() {
        return;
    }
    match admit_as(*kind, object) {
        Err((what, error)) => {
            // The field itself, or an object holding it refused as a whole.
            let named = set.iter().any(|(pointer, _)| names(&error.path, &dotted(pointer)));
            assert!(named, "{what}: {error}: the refusal names none of {set:?}");
        }
        Ok(accepted) => {
            for (pointer, value) in &set {
                let within = value
                    .as_u64()
                    .is_none_or(|n| n <= i32::MAX as u64);
                assert!(within, "{kind:?} accepted {pointer} = {value}: past int32");
            }
            if let Some(jobs) = accepted {
                for job in jobs {
                    run_job_engine(job);
                }
            }
        }
    }
});

/// Whether a refusal at `path` names the field at `field`: the field, or an object on
/// its way (below `spec`).
fn names(path: &str, field: &str) -> bool {
    path == field
        || (path.len() > "spec.".len()
            && field.starts_with(path)
            && matches!(field.as_bytes().get(path.len()), Some(b'.' | b'[')))
}

/// Set `value` at `pointer` in `object`, making the objects on the way (an array's
/// first item included) where they are missing; false where the way is not an object.
fn set_at(object: &mut Value, pointer: &str, value: Value) -> bool {
    let mut here = object;
    let parts: Vec<&str> = pointer.trim_start_matches('/').split('/').collect();
    let Some((last, way)) = parts.split_last() else {
        return false;
    };
    for (at, part) in way.iter().enumerate() {
        here = if let Ok(index) = part.parse::<usize>() {
            let Some(items) = here.as_array_mut() else {
                return false;
            };
            if items.len() <= index {
                items.resize(index + 1, json!({}));
            }
            &mut items[index]
        } else {
            let Some(fields) = here.as_object_mut() else {
                return false;
            };
            let next = fields.get(*part).map(|v| v.is_array());
            let wants_array = parts
                .get(at + 1)
                .is_some_and(|n| n.parse::<usize>().is_ok());
            if next.is_none() {
                fields.insert(
                    (*part).to_owned(),
                    if wants_array { json!([]) } else { json!({}) },
                );
            }
            match fields.get_mut(*part) {
                Some(next) => next,
                None => return false,
            }
        };
    }
    match here.as_object_mut() {
        Some(fields) => {
            fields.insert((*last).to_owned(), value);
            true
        }
        None => false,
    }
}

/// `/spec/containers/0/ports/0/containerPort` as a refusal names it:
/// `spec.containers[0].ports[0].containerPort`.
fn dotted(pointer: &str) -> String {
    let mut out = String::new();
    for part in pointer.trim_start_matches('/').split('/') {
        if part.bytes().all(|b| b.is_ascii_digit()) {
            out.push_str(&format!("[{part}]"));
        } else {
            if !out.is_empty() {
                out.push('.');
            }
            out.push_str(part);
        }
    }
    out
}

/// Admission of `value` as `kind`; the ImagePullJobs an accepted object makes.
fn admit_as(
    kind: Kind,
    value: Value,
) -> Result<Option<Vec<ImagePullJob>>, (String, rigger_api::FieldError)> {
    fn check<T: Object>(value: Value) -> Result<T, (String, rigger_api::FieldError)> {
        admit::<T>(value).map(|(object, _)| object)
    }
    Ok(match kind {
        Kind::ImagePullJob => Some(vec![check::<ImagePullJob>(value)?]),
        Kind::ImageListPullJob => {
            let list = check::<ImageListPullJob>(value)?;
            Some(
                list.spec
                    .images
                    .iter()
                    .map(|image| list.job_for(image))
                    .collect(),
            )
        }
        Kind::ContainerRecreateRequest => {
            check::<ContainerRecreateRequest>(value)?;
            None
        }
        Kind::Pod => {
            check::<Pod>(value)?;
            None
        }
        Kind::SidecarSet => {
            check::<SidecarSet>(value)?;
            None
        }
        Kind::LifecycleCooperator => {
            let cooperator = check::<LifecycleCooperator>(value)?;
            let _ = cooperator.cooperator();
            None
        }
        _ => None,
    })
}

/// The controller's job engine, on an embedded store of its own, with one ready node
/// and a grant signer (so the grants' lifetimes are computed too).
struct Controller {
    runtime: tokio::runtime::Runtime,
    store: Store,
    engine: JobEngine,
    _dir: tempfile::TempDir,
    _agent: futures::channel::mpsc::Receiver<Result<rigger_proto::v1::ControllerMessage, tonic::Status>>,
}

fn controller() -> &'static Controller {
    static CONTROLLER: OnceLock<Controller> = OnceLock::new();
    CONTROLLER.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let dir = tempfile::tempdir().expect("a directory");
        let store = Store::new(EmbeddedStore::open(dir.path()).expect("a store"));
        let nodes = NodeRegistry::default();
        let (tx, agent) = futures::channel::mpsc::channel(1024);
        let register = Register {
            node_name: "n1".to_owned(),
            ..Register::default()
        };
        nodes.register(&register, 1, tx, SystemTime::now());
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).expect("a key");
        let signer = rigger_proto::peer_grant::GrantSigner::from_pem(
            key.serialize_pem().as_bytes(),
            key.public_key_pem().as_bytes(),
        )
        .expect("a signer");
        let engine = JobEngine::new(
            store.clone(),
            nodes,
            Duration::from_secs(3600),
            Some(Arc::new(signer)),
        );
        Controller {
            runtime,
            store,
            engine,
            _dir: dir,
            _agent: agent,
        }
    })
}

/// `job` through the engine: a pass sends its task, the node reports it running and a
/// pass follows (timeouts, deadlines, grants), then it fails and a pass retries it;
/// then the job goes.
fn run_job_engine(mut job: ImagePullJob) {
    let controller = controller();
    job.metadata.uid = Some("u1".to_owned());
    job.metadata.namespace = Some("default".to_owned());
    let key = ObjectKey::new("ImagePullJob", "default", &job.metadata.name);
    let Ok(bytes) = serde_json::to_vec(&job) else {
        return;
    };
    let engine = &controller.engine;
    controller.runtime.block_on(async {
        let pass = || async {
            if let Ok(snapshot) = engine.observe().await {
                engine.pass(snapshot).await;
            }
        };
        let _ = controller.store.put(key.clone(), bytes, Precondition::Any).await;
        pass().await;
        let task = "u1/n1/1".to_owned();
        for phase in [TaskPhase::Running, TaskPhase::Failed] {
            engine.report(
                "n1",
                TaskStatus {
                    id: task.clone(),
                    phase: phase.into(),
                    image_digest: format!("sha256:{}", "a".repeat(64)),
                    ..TaskStatus::default()
                },
            );
            pass().await;
        }
        let _ = controller.store.delete(key, Precondition::Any).await;
        pass().await;
    });
}
