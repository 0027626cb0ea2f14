//! A SidecarSet's recorded versions (Kruise's ControllerRevisions of it): what
//! `injectionStrategy.revision` picks from and `status.latestRevision` names. The
//! controller keeps one history per SidecarSet; choosing from it is pure.

use serde::{Deserialize, Serialize};

use super::{InjectRevisionPolicy, PatchPodMetadata, SidecarContainer, SidecarSet};
use crate::fields::IntOrPercent;

/// The store kind a SidecarSet's history is kept under (one record per SidecarSet,
/// named as it; internal, never applied).
pub const HISTORY_KIND: &str = "SidecarSetHistory";

/// What a revision holds: the parts of the spec that make a pod's sidecars (Kruise's
/// revision patch: containers, initContainers, volumes, patchPodMetadata).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RevisionData {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub init_containers: Vec<SidecarContainer>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub containers: Vec<SidecarContainer>,
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        with = "super::volumes"
    )]
    pub volumes: Vec<k8s_openapi::api::core::v1::Volume>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub patch_pod_metadata: Vec<PatchPodMetadata>,
}

impl RevisionData {
    fn of(set: &SidecarSet) -> Self {
        Self {
            init_containers: set.spec.init_containers.clone(),
            containers: set.spec.containers.clone(),
            volumes: set.spec.volumes.clone(),
            patch_pod_metadata: set.spec.patch_pod_metadata.clone(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Revision {
    /// `<sidecarset>-<hash of the data>`.
    pub name: String,
    /// 1, 2, …: the order versions were recorded in (a version applied again moves up).
    pub revision: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub custom_version: Option<String>,
    pub data: RevisionData,
}

/// A SidecarSet's revisions, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct History {
    #[serde(default)]
    pub revisions: Vec<Revision>,
    /// Times two different versions hashed to one name (Kruise's collisionCount).
    #[serde(default)]
    pub collision_count: u32,
}

/// `injectionStrategy.revision` names a revision the history does not hold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "SidecarSet {set}: injectionStrategy.revision: {wanted} is not among its revisions ({known})"
)]
pub struct RevisionNotFound {
    pub set: String,
    pub wanted: String,
    pub known: String,
}

impl History {
    /// Record `set`'s current version as the newest revision, keeping the newest of
    /// `revisionHistoryLimit` (and never the current one less); whether anything changed.
    pub fn record(&mut self, set: &SidecarSet) -> bool {
        let data = RevisionData::of(set);
        let custom_version = set.custom_version().map(str::to_owned);
        let next = self.revisions.last().map_or(1, |r| r.revision + 1);
        if let Some(newest) = self.revisions.last()
            && newest.data == data
            && newest.custom_version == custom_version
        {
            return false;
        }
        let name = loop {
            let name = revision_name(&set.metadata.name, &data, self.collision_count);
            match self.revisions.iter().position(|r| r.name == name) {
                Some(i) if self.revisions[i].data != data => self.collision_count += 1,
                Some(i) => {
                    // The same version applied again: it becomes the newest.
                    self.revisions.remove(i);
                    break name;
                }
                None => break name,
            }
        };
        self.revisions.push(Revision {
            name,
            revision: next,
            custom_version,
            data,
        });
        let excess = self
            .revisions
            .len()
            .saturating_sub(set.revision_history_limit().max(1));
        self.revisions.drain(..excess);
        true
    }

    /// What differs, beyond images, between revision `name` and `set`'s containers
    /// (`["proxy: env, resources"]`, a sidecar added or gone named alone); `None` when
    /// the revision is not (or no longer) recorded.
    pub fn changes_beyond_images(&self, name: &str, set: &SidecarSet) -> Option<Vec<String>> {
        let old = &self
            .revisions
            .iter()
            .find(|r| r.name == name)?
            .data
            .containers;
        let fields = |sidecar: &SidecarContainer| -> serde_json::Map<String, serde_json::Value> {
            let mut value = serde_json::to_value(sidecar).unwrap_or_default();
            if let Some(fields) = value.as_object_mut() {
                fields.remove("image");
                return fields.clone();
            }
            serde_json::Map::new()
        };
        let mut changes = Vec::new();
        for new in &set.spec.containers {
            match old.iter().find(|o| o.name() == new.name()) {
                None => changes.push(format!("{}: added", new.name())),
                Some(old) => {
                    let (before, after) = (fields(old), fields(new));
                    let mut keys: Vec<&String> = before.keys().chain(after.keys()).collect();
                    keys.sort();
                    keys.dedup();
                    let changed: Vec<&str> = keys
                        .into_iter()
                        .filter(|k| before.get(*k) != after.get(*k))
                        .map(String::as_str)
                        .collect();
                    if !changed.is_empty() {
                        changes.push(format!("{}: {}", new.name(), changed.join(", ")));
                    }
                }
            }
        }
        for gone in old
            .iter()
            .filter(|o| !set.spec.containers.iter().any(|n| n.name() == o.name()))
        {
            changes.push(format!("{}: removed", gone.name()));
        }
        Some(changes)
    }

    /// The name `set`'s current version has (or will have once recorded).
    pub fn current_name(&self, set: &SidecarSet) -> String {
        let mut history = self.clone();
        history.record(set);
        history
            .revisions
            .last()
            .map(|r| r.name.clone())
            .unwrap_or_default()
    }

    fn find(&self, set: &SidecarSet) -> Result<Option<&Revision>, RevisionNotFound> {
        let Some(wanted) = &set.spec.injection_strategy.revision else {
            return Ok(None);
        };
        let found = match (&wanted.revision_name, &wanted.custom_version) {
            (Some(name), _) => self.revisions.iter().find(|r| &r.name == name),
            (None, Some(custom)) => self
                .revisions
                .iter()
                .rev()
                .find(|r| r.custom_version.as_ref() == Some(custom)),
            (None, None) => return Ok(None),
        };
        found.map(Some).ok_or_else(|| RevisionNotFound {
            set: set.metadata.name.clone(),
            wanted: match (&wanted.revision_name, &wanted.custom_version) {
                (Some(name), _) => format!("revisionName {name:?}"),
                (None, custom) => format!("customVersion {:?}", custom.as_deref().unwrap_or("")),
            },
            known: self
                .revisions
                .iter()
                .map(|r| match &r.custom_version {
                    Some(custom) => format!("{} ({custom})", r.name),
                    None => r.name.clone(),
                })
                .collect::<Vec<_>>()
                .join(", "),
        })
    }
}

fn revision_name(set: &str, data: &RevisionData, collision_count: u32) -> String {
    let mut bytes = serde_json::to_vec(data).unwrap_or_default();
    if collision_count > 0 {
        bytes.extend_from_slice(&collision_count.to_be_bytes());
    }
    format!("{set}-{}", super::short_hash(&bytes))
}

/// The SidecarSet a new pod is injected with, and the name of its revision: the current
/// version, or the recorded one `injectionStrategy.revision` picks (Kruise's rules:
/// always while `updateStrategy.paused`; under `Partial`, pods outside
/// `updateStrategy.selector` get it and the others get it with the probability of
/// `partition`'s percentage, `roll` being uniform in [0, 1)).
pub fn injected_revision(
    set: &SidecarSet,
    history: &History,
    pod_labels: &std::collections::BTreeMap<String, String>,
    roll: f64,
) -> Result<(SidecarSet, String), RevisionNotFound> {
    let current = || (set.clone(), history.current_name(set));
    let Some(revision) = history.find(set)? else {
        return Ok(current());
    };
    let strategy = &set.spec.update_strategy;
    let policy = set
        .spec
        .injection_strategy
        .revision
        .as_ref()
        .and_then(|r| r.policy)
        .unwrap_or(InjectRevisionPolicy::Always);
    let recorded = !strategy.paused
        && policy == InjectRevisionPolicy::Partial
        && strategy
            .selector
            .as_ref()
            .is_none_or(|selector| selector.matches(pod_labels));
    if recorded {
        // Selected for the update: the recorded version only by the partition's odds.
        let odds = match strategy.partition {
            Some(IntOrPercent::Percent(p)) => f64::from(p) / 100.0,
            _ => 0.0,
        };
        if roll >= odds {
            return Ok(current());
        }
    }
    let mut old = set.clone();
    old.spec.init_containers = revision.data.init_containers.clone();
    old.spec.containers = revision.data.containers.clone();
    old.spec.volumes = revision.data.volumes.clone();
    old.spec.patch_pod_metadata = revision.data.patch_pod_metadata.clone();
    Ok((old, revision.name.clone()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::collections::BTreeMap;

    use super::*;

    fn set(image: &str, extra: serde_json::Value) -> SidecarSet {
        let mut value = serde_json::json!({
            "apiVersion": crate::fields::KRUISE_API_VERSION_V1BETA1, "kind": "SidecarSet",
            "metadata": {"name": "mesh"},
            "spec": {"selector": {"matchLabels": {"app": "web"}},
                "containers": [{"name": "proxy", "image": image}]},
        });
        if let serde_json::Value::Object(fields) = extra {
            for (key, field) in fields {
                value["spec"][key] = field;
            }
        }
        let set: SidecarSet = serde_json::from_value(value).unwrap();
        set.validate().unwrap();
        set
    }

    #[test]
    fn versions_are_recorded_once_named_by_their_content_and_pruned_to_the_limit() {
        let mut history = History::default();
        let v1 = set(
            "r.example/p:1",
            serde_json::json!({"revisionHistoryLimit": 2}),
        );
        assert!(history.record(&v1));
        assert!(
            !history.record(&v1),
            "the same version twice is one revision"
        );
        let first = history.revisions[0].name.clone();
        assert!(first.starts_with("mesh-"), "{first}");
        assert_eq!(history.current_name(&v1), first);
        // Fields outside the revision do not make a new one.
        let mut paused = v1.clone();
        paused.spec.update_strategy.paused = true;
        assert!(!history.record(&paused));
        let v2 = set(
            "r.example/p:2",
            serde_json::json!({"revisionHistoryLimit": 2}),
        );
        assert!(history.record(&v2));
        // Back to v1: the old revision moves up, keeping its name.
        assert!(history.record(&v1));
        let names: Vec<(&str, u64)> = history
            .revisions
            .iter()
            .map(|r| (r.name.as_str(), r.revision))
            .collect();
        assert_eq!(names.len(), 2);
        assert_eq!(names[1], (first.as_str(), 3));
        let v3 = set(
            "r.example/p:3",
            serde_json::json!({"revisionHistoryLimit": 2}),
        );
        history.record(&v3);
        assert_eq!(history.revisions.len(), 2, "pruned to revisionHistoryLimit");
        assert!(
            history
                .revisions
                .iter()
                .all(|r| r.data.containers[0].image() != "r.example/p:2")
        );
    }

    #[test]
    fn a_colliding_name_is_rehashed_and_counted() {
        let v1 = set("r.example/p:1", serde_json::json!({}));
        let v2 = set("r.example/p:2", serde_json::json!({}));
        let mut history = History::default();
        history.record(&v1);
        // Forge a collision: v2's name already taken by other content.
        let mut forged = history.revisions[0].clone();
        forged.name = revision_name("mesh", &RevisionData::of(&v2), 0);
        history.revisions.push(forged);
        history.record(&v2);
        assert_eq!(history.collision_count, 1);
        let newest = history.revisions.last().unwrap();
        assert_eq!(newest.data, RevisionData::of(&v2));
        assert_ne!(
            newest.name,
            revision_name("mesh", &RevisionData::of(&v2), 0)
        );
    }

    #[test]
    fn injection_picks_the_revision_kruise_would() {
        let mut history = History::default();
        let v1 = set(
            "r.example/p:1",
            serde_json::json!({"customVersion": "stable"}),
        );
        history.record(&v1);
        let stable = history.revisions[0].name.clone();
        let labels = |app: &str| BTreeMap::from([("app".to_owned(), app.to_owned())]);
        let image = |(set, _): &(SidecarSet, String)| set.spec.containers[0].image().to_owned();

        // No revision asked: the current version.
        let v2 = set("r.example/p:2", serde_json::json!({}));
        let chosen = injected_revision(&v2, &history, &labels("web"), 0.0).unwrap();
        assert_eq!(image(&chosen), "r.example/p:2");
        assert_ne!(chosen.1, stable);

        // Always, by custom version or by name.
        for revision in [
            serde_json::json!({"customVersion": "stable"}),
            serde_json::json!({"revisionName": stable}),
        ] {
            let pinned = set(
                "r.example/p:2",
                serde_json::json!({"injectionStrategy": {"revision": revision}}),
            );
            let chosen = injected_revision(&pinned, &history, &labels("web"), 0.99).unwrap();
            assert_eq!(image(&chosen), "r.example/p:1");
            assert_eq!(chosen.1, stable);
        }

        // Partial: outside the update selector, the recorded one; inside, by the odds.
        let partial = set(
            "r.example/p:2",
            serde_json::json!({
                "injectionStrategy": {"revision": {"customVersion": "stable", "policy": "Partial"}},
                "updateStrategy": {"selector": {"matchLabels": {"canary": "true"}}, "partition": "30%"},
            }),
        );
        let outside = injected_revision(&partial, &history, &labels("web"), 0.99).unwrap();
        assert_eq!(image(&outside), "r.example/p:1");
        let mut canary = labels("web");
        canary.insert("canary".to_owned(), "true".to_owned());
        assert_eq!(
            image(&injected_revision(&partial, &history, &canary, 0.1).unwrap()),
            "r.example/p:1"
        );
        assert_eq!(
            image(&injected_revision(&partial, &history, &canary, 0.5).unwrap()),
            "r.example/p:2"
        );

        // A revision the history does not hold: refused, naming what there is.
        let missing = set(
            "r.example/p:2",
            serde_json::json!({"injectionStrategy": {"revision": {"customVersion": "gone"}}}),
        );
        let err = injected_revision(&missing, &history, &labels("web"), 0.0).unwrap_err();
        assert!(err.to_string().contains("customVersion \"gone\""), "{err}");
        assert!(
            err.to_string().contains(&format!("{stable} (stable)")),
            "{err}"
        );
    }
}
