//! The pods directory's own state files, read at start: the node's pod set as last
//! received (`desired.json`) and the pod uids this agent created sandboxes for
//! (`created.json`). Unreadable ones are kept aside for a human, never taken as "none".

use std::collections::BTreeSet;
use std::path::Path;

use rigger_proto::pod::Pod;

use super::ownership;

/// What reading a state file found.
enum Found<T> {
    Absent,
    /// It could not be read or parsed (logged; a file that would not parse is kept aside).
    Unreadable,
    Read(T),
}

/// Read the JSON state file `path` (`what` it holds, and the `consequence` of losing it,
/// for the error logged when it is unreadable).
fn read_state<T: serde::de::DeserializeOwned>(
    path: &Path,
    what: &str,
    consequence: &str,
) -> Found<T> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Found::Absent,
        Err(error) => {
            tracing::error!(path = %path.display(), %error, "cannot read {what}; {consequence}");
            return Found::Unreadable;
        }
    };
    match serde_json::from_slice(&bytes) {
        Ok(value) => Found::Read(value),
        Err(error) => {
            let aside = path.with_extension(format!("json.unreadable-{}", unix_now()));
            let moved = std::fs::rename(path, &aside);
            tracing::error!(path = %path.display(), aside = %aside.display(), moved = moved.is_ok(), %error, "{what} unreadable, kept aside; {consequence}");
            Found::Unreadable
        }
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The node's pod set as last received, and whether removals must wait for the
/// controller: an absent file is no pods; an unreadable one (a torn write, another
/// version's format) is kept aside for a human and says nothing about what to remove.
pub(super) fn load_desired(dir: &Path) -> (Vec<Pod>, bool) {
    match read_state(
        &dir.join("desired.json"),
        "the node's pods are",
        "nothing is removed until the controller sends them",
    ) {
        Found::Absent => (Vec::new(), false),
        Found::Unreadable => (Vec::new(), true),
        Found::Read(pods) => (pods, false),
    }
}

/// The pod uids this agent created sandboxes for, under the pods directory.
pub(super) const CREATED_FILE: &str = "created.json";

/// The recorded uids. Where there is no record yet (an agent from before it was kept)
/// or it cannot be read (kept aside for a human), the pods this node runs are taken as
/// the agent's: they are the ones it would have created.
pub(super) fn load_created(dir: &Path, desired: &[Pod]) -> BTreeSet<String> {
    let path = dir.join(CREATED_FILE);
    let created = match read_state(
        &path,
        "the record of this agent's sandboxes is",
        "the node's pods taken as the agent's",
    ) {
        Found::Read(created) => return created,
        Found::Absent | Found::Unreadable => desired
            .iter()
            .filter_map(|p| p.metadata.uid.clone())
            .filter(|uid| ownership::is_valid_uid(uid))
            .collect::<BTreeSet<String>>(),
    };
    if let Err(error) = rigger_daemon::durable::write_json_atomically(&path, &created) {
        tracing::warn!(path = %path.display(), %error, "cannot persist the pods' sandboxes");
    }
    created
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "6f1c2e0a-1b2c-4d3e-8f40-0123456789ab";

    fn pod() -> Pod {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "web", "uid": UID},
            "spec": {"containers": [{"name": "main", "image": "busybox"}]}
        }))
        .unwrap()
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn an_absent_pod_set_is_none_and_an_unreadable_one_holds_removals() {
        let dir = tempfile::tempdir().unwrap();
        let (pods, hold) = load_desired(dir.path());
        assert!(pods.is_empty() && !hold);

        std::fs::write(dir.path().join("desired.json"), b"[{\"metadata\": {\"na").unwrap();
        let (pods, hold) = load_desired(dir.path());
        assert!(pods.is_empty() && hold, "unreadable is not 'no pods'");
        let kept = names(dir.path());
        assert_eq!(kept.len(), 1);
        assert!(kept[0].starts_with("desired.json.unreadable-"), "{kept:?}");

        rigger_daemon::durable::write_json_atomically(&dir.path().join("desired.json"), &[pod()])
            .unwrap();
        let (pods, hold) = load_desired(dir.path());
        assert_eq!(pods.len(), 1);
        assert!(!hold);
    }

    #[test]
    fn the_created_record_starts_from_the_nodes_pods_and_survives() {
        let dir = tempfile::tempdir().unwrap();
        // An agent from before the record existed: its running pods are its own.
        let created = load_created(dir.path(), &[pod()]);
        assert_eq!(created, BTreeSet::from([UID.to_owned()]));
        assert!(dir.path().join(CREATED_FILE).is_file(), "persisted at once");
        // Read back as written, whatever the pod set says now.
        assert_eq!(load_created(dir.path(), &[]), created);
        // Unreadable: kept aside, and the node's pods taken as the agent's.
        std::fs::write(dir.path().join(CREATED_FILE), b"[\"6f1c").unwrap();
        assert_eq!(load_created(dir.path(), &[pod()]), created);
        assert!(
            names(dir.path())
                .iter()
                .any(|n| n.starts_with("created.json.unreadable-"))
        );
    }
}
