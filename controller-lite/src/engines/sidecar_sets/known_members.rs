//! The cluster rollout's members as last worked out ([`KnownMembers`]): a pod's
//! membership of a set is worked out again only when the pod changed (the Pods watch
//! shares each pod as an `Arc` and replaces it on a change) or the set's spec did.
//! Working out every member anew made each pass cost ~120 ms of CPU and ~76 MB of
//! allocations at 10,000 injected pods, and while pods changed passes ran back to back
//! (the cluster-scale section of BENCHMARKS.md).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use rigger_api::sidecar_set::{SidecarSet, SidecarSetSpec};

use super::Member;
use super::injected_pods::{InjectedPod, member_of};

/// Each set's members as last worked out, by set name.
#[derive(Debug, Default)]
pub(crate) struct KnownMembers {
    sets: HashMap<String, KnownOfSet>,
}

#[derive(Debug, Default)]
struct KnownOfSet {
    /// The set's spec these were worked out for.
    spec: Option<SidecarSetSpec>,
    /// By pod uid: the pod as it was, and whether (and how) it is the set's member.
    by_uid: HashMap<String, (Arc<InjectedPod>, Option<Arc<Member>>)>,
}

/// A member with the pod it was worked out from.
pub(crate) type Known = (Arc<Member>, Arc<InjectedPod>);

impl KnownMembers {
    /// The members of `set` (at version `hash`) among `pods`, each with its pod, and how
    /// many of the pods were worked out anew; pods gone since the last call are
    /// forgotten.
    pub(crate) fn of<'p>(
        &mut self,
        set: &SidecarSet,
        hash: &str,
        pods: impl Iterator<Item = &'p Arc<InjectedPod>>,
    ) -> (Vec<Known>, usize) {
        let mut before = self.sets.remove(&set.metadata.name).unwrap_or_default();
        let reusable = before.spec.as_ref() == Some(&set.spec);
        let mut now = KnownOfSet {
            spec: Some(set.spec.clone()),
            by_uid: HashMap::with_capacity(before.by_uid.len()),
        };
        let (mut members, mut worked_out) = (Vec::new(), 0);
        for pod in pods {
            let known = before
                .by_uid
                .remove(&pod.uid)
                .filter(|(was, _)| reusable && Arc::ptr_eq(was, pod))
                .map(|(_, member)| member);
            let member = known.unwrap_or_else(|| {
                worked_out += 1;
                member_of(set, hash, pod).map(Arc::new)
            });
            if let Some(member) = &member {
                members.push((member.clone(), pod.clone()));
            }
            now.by_uid.insert(pod.uid.clone(), (pod.clone(), member));
        }
        self.sets.insert(set.metadata.name.clone(), now);
        (members, worked_out)
    }

    /// Forget the sets not in `names`.
    pub(crate) fn keep_only(&mut self, names: &HashSet<String>) {
        self.sets.retain(|name, _| names.contains(name));
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn set(image: &str) -> SidecarSet {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "apps.kruise.io/v1alpha1", "kind": "SidecarSet",
            "metadata": {"name": "mesh"},
            "spec": {"selector": {"matchLabels": {"app": "web"}},
                     "containers": [{"name": "proxy", "image": image}]},
        }))
        .unwrap()
    }

    fn pod(set: &SidecarSet, name: &str, ready: bool) -> Arc<InjectedPod> {
        let hash = set.hash();
        let annotation = serde_json::json!({"mesh": {
            "hash": hash, "sidecarSetName": "mesh", "sidecarList": ["proxy"],
            "controllerRevision": "mesh-1",
        }});
        Arc::new(InjectedPod {
            namespace: "shop".to_owned(),
            name: name.to_owned(),
            uid: format!("uid-{name}"),
            resource_version: "1".to_owned(),
            labels: [("app".to_owned(), "web".to_owned())].into(),
            annotations: [(
                rigger_api::sidecar_set::HASH_ANNOTATION.to_owned(),
                annotation.to_string(),
            )]
            .into(),
            containers: vec![
                ("proxy".to_owned(), "proxy:1".to_owned()),
                ("app".to_owned(), "app:1".to_owned()),
            ],
            init_containers: Vec::new(),
            native: Default::default(),
            marked: ["proxy".to_owned()].into(),
            node: Some("n1".to_owned()),
            status: serde_json::json!({
                "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
                "containerStatuses": [], "initContainerStatuses": [],
            }),
        })
    }

    #[test]
    fn only_pods_that_changed_and_every_pod_after_the_spec_changed_are_worked_out_again() {
        let mesh = set("proxy:1");
        let hash = mesh.hash();
        let mut known = KnownMembers::default();
        let (a, b) = (pod(&mesh, "a", true), pod(&mesh, "b", false));
        let (members, worked_out) = known.of(&mesh, &hash, [&a, &b].into_iter());
        assert_eq!((members.len(), worked_out), (2, 2));
        assert!(members[0].0.ready && !members[1].0.ready);

        let (members, worked_out) = known.of(&mesh, &hash, [&a, &b].into_iter());
        assert_eq!((members.len(), worked_out), (2, 0), "nothing changed");

        // b turned ready: the watch replaced it; a went away.
        let b = pod(&mesh, "b", true);
        let (members, worked_out) = known.of(&mesh, &hash, [&b].into_iter());
        assert_eq!((members.len(), worked_out), (1, 1));
        assert!(members[0].0.ready, "b as it is now");
        assert!(Arc::ptr_eq(&members[0].1, &b));

        let (_, worked_out) = known.of(&mesh, &hash, [&a, &b].into_iter());
        assert_eq!(worked_out, 1, "a came back: forgotten meanwhile");

        let upgraded = set("proxy:2");
        let (members, worked_out) = known.of(&upgraded, &upgraded.hash(), [&a, &b].into_iter());
        assert_eq!((members.len(), worked_out), (2, 2), "a new spec: all again");
        assert!(members.iter().all(|(m, _)| !m.updated(&upgraded.hash())));

        // The same pod again from the watch (a new version the rollout reads nothing
        // of): another Arc, worked out again, and the member goes with that copy.
        let a_again = Arc::new((*a).clone());
        let (members, worked_out) =
            known.of(&upgraded, &upgraded.hash(), [&a_again, &b].into_iter());
        assert_eq!(worked_out, 1);
        assert!(Arc::ptr_eq(&members[0].1, &a_again));
    }

    #[test]
    fn a_pod_that_is_not_the_sets_member_is_remembered_as_none_and_sets_are_forgotten() {
        let mesh = set("proxy:1");
        let hash = mesh.hash();
        let mut forged = (*pod(&mesh, "forged", true)).clone();
        // Its annotation names a sidecar the webhook did not inject.
        forged.marked.clear();
        let forged = Arc::new(forged);
        let mut known = KnownMembers::default();
        let (members, worked_out) = known.of(&mesh, &hash, [&forged].into_iter());
        assert_eq!((members.len(), worked_out), (0, 1));
        let (members, worked_out) = known.of(&mesh, &hash, [&forged].into_iter());
        assert_eq!((members.len(), worked_out), (0, 0));

        known.keep_only(&HashSet::new());
        let (_, worked_out) = known.of(&mesh, &hash, [&forged].into_iter());
        assert_eq!(worked_out, 1, "the set was forgotten");
    }
}
