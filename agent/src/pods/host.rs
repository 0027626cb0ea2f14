//! The pod runner as a recreate sees it ([`PodHost`]).

use std::collections::BTreeMap;

use rigger_proto::lifecycle::Cooperator;
use rigger_proto::pod::Pod;

use super::PodRunner;
use crate::lifecycle::LifecycleState;
use crate::recreate::PodHost;

impl PodHost for PodRunner {
    fn node(&self) -> &str {
        PodRunner::node(self)
    }

    fn pod(&self, uid: &str) -> Option<Pod> {
        PodRunner::pod(self, uid)
    }

    fn owner_of(&self, sandbox: &k8s_cri::v1::PodSandbox) -> Option<String> {
        PodRunner::owner_of(self, sandbox)
    }

    fn labels_of(&self, uid: &str) -> BTreeMap<String, String> {
        PodRunner::labels_of(self, uid)
    }

    fn cooperators_of(&self, uid: &str) -> Vec<Cooperator> {
        PodRunner::cooperators_of(self, uid)
    }

    fn set_lifecycle(&self, uid: &str, state: LifecycleState, message: &str) {
        PodRunner::set_lifecycle(self, uid, state, message);
    }

    fn mark_unready(&self, uid: &str, reason: &str) {
        PodRunner::mark_unready(self, uid, reason);
    }

    fn recreate_now(&self, container_id: &str) {
        PodRunner::recreate_now(self, container_id);
    }

    fn container_started(&self, uid: &str, name: &str, container_id: &str) -> Option<bool> {
        PodRunner::container_started(self, uid, name, container_id)
    }

    fn container_ready(&self, uid: &str, name: &str, container_id: &str) -> Option<bool> {
        PodRunner::container_ready(self, uid, name, container_id)
    }
}
