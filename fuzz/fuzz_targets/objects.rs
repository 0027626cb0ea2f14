//! Objects users apply (riggerctl apply -f): YAML documents decoded into each kind and
//! validated, as the controller does before storing anything.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rigger_api::container_recreate_request::ContainerRecreateRequest;
use rigger_api::image_pull_job::ImagePullJob;
use rigger_api::lifecycle_cooperator::LifecycleCooperator;
use rigger_api::pod::{self, Pod};
use rigger_api::secret::Secret;
use rigger_api::image_list_pull_job::ImageListPullJob;
use rigger_api::sidecar_set::{self, SidecarSet};
use serde_json::Value;

fuzz_target!(|text: &str| {
    for document in serde_yaml_ng::Deserializer::from_str(text).take(8) {
        let Ok(value) = <Value as serde::Deserialize>::deserialize(document) else {
            return;
        };
        check(value);
    }
});

fn check(value: Value) {
    if let Ok(job) = serde_json::from_value::<ImagePullJob>(value.clone()) {
        let _ = job.validate();
    }
    if let Ok(request) = serde_json::from_value::<ContainerRecreateRequest>(value.clone()) {
        let _ = request.validate();
    }
    if let Ok(cooperator) = serde_json::from_value::<LifecycleCooperator>(value.clone()) {
        let _ = cooperator.validate();
    }
    if let Ok(set) = serde_json::from_value::<SidecarSet>(value.clone())
        && set.validate().is_ok()
    {
        // What a valid set does: its revision, the version a new pod gets, injection.
        let mut history = sidecar_set::History::default();
        history.record(&set);
        let mut pod = serde_json::from_value::<Pod>(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "default", "labels": set.spec.selector.match_labels},
            "spec": {"hostNetwork": true, "containers": [{"name": "app", "image": "r.example/app:1",
                "env": [{"name": "TZ", "value": "UTC"}], "volumeMounts": [{"name": "d", "mountPath": "/d"}]}],
                "volumes": [{"name": "d", "emptyDir": {}}]},
        }))
        .ok();
        if let (Ok((chosen, revision)), Some(pod)) = (
            sidecar_set::injected_revision(&set, &history, &Default::default(), 0.5),
            pod.as_mut(),
        ) {
            let stored = pod.clone();
            let sets = [sidecar_set::Versioned { set: chosen, revision }];
            // The webhook's path: any pod a user may create, in Kubernetes' shape.
            if let Ok(mut kube) = serde_json::from_value::<rigger_api::kube_types::KubePod>(value.clone()) {
                let _ = sidecar_set::inject_kube(&mut kube, &sets, &Default::default(), "2026-01-01T00:00:00Z");
            }
            if sidecar_set::inject(pod, &sets, "2026-01-01T00:00:00Z").is_ok() {
                let _ = pod::validate(pod);
                let mut again = stored;
                sidecar_set::keep_injected(&mut again, pod);
            }
        }
    }
    if let Ok(list) = serde_json::from_value::<ImageListPullJob>(value.clone())
        && list.validate().is_ok()
    {
        for image in &list.spec.images {
            let _ = list.job_for(image).validate();
        }
    }
    if let Ok(mut secret) = serde_json::from_value::<Secret>(value.clone()) {
        let _ = secret.validate_and_normalize();
    }
    if let Ok(new) = serde_json::from_value::<Pod>(value) {
        let _ = pod::validate(&new);
        let _ = pod::check_in_place_change(&new.spec, &new.spec);
    }
}
