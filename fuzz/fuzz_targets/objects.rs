//! Objects users apply (riggerctl apply -f): YAML documents decoded into each kind and
//! validated, as the controller does before storing anything.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rigger_api::container_recreate_request::ContainerRecreateRequest;
use rigger_api::image_pull_job::ImagePullJob;
use rigger_api::lifecycle_cooperator::LifecycleCooperator;
use rigger_api::pod::{self, Pod};
use rigger_api::secret::Secret;
use rigger_api::sidecar_set::SidecarSet;
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
    if let Ok(set) = serde_json::from_value::<SidecarSet>(value.clone()) {
        let _ = set.validate();
    }
    if let Ok(mut secret) = serde_json::from_value::<Secret>(value.clone()) {
        let _ = secret.validate_and_normalize();
    }
    if let Ok(new) = serde_json::from_value::<Pod>(value) {
        let _ = pod::validate(&new);
        let _ = pod::check_in_place_change(&new.spec, &new.spec);
    }
}
