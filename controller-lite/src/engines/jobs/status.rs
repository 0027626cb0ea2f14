//! How an ImagePullJob's status lives in the store: a summary (counters, times,
//! conditions) under one key and the per-node entries in shards of [`NODES_PER_SHARD`]
//! under keys of their own. One object per job would be megabytes at ten thousand nodes,
//! past etcd's request limit (1.5 MiB by default), and rewritten whole on every change;
//! shards keep every write small and only the shards that changed are written.
//!
//! Nodes are only ever appended to a job's status, so shard `i` holds nodes
//! `i * NODES_PER_SHARD ..`. A reader takes shards 0, 1, ... up to the first missing one;
//! stale shards past the end are deleted lowest first, so a crash midway leaves a gap
//! that ends the read rather than stale entries after it.

use serde::{Deserialize, Serialize};

use rigger_api::image_pull_job::{ImagePullJobStatus, NodePullStatus};
use rigger_store::{ObjectKey, Precondition, Store, StoreError};

/// The store kind of a job's status summary.
pub const SUMMARY_KIND: &str = "ImagePullJob.status";
/// The store kind of the shards of a job's per-node entries.
pub const NODES_KIND: &str = "ImagePullJob.nodes";
/// Node entries per shard. With agent strings capped (`report_limits`), an entry stays
/// under ~10 KiB as JSON (a 4 KiB message of newlines doubles when escaped), so a shard
/// stays under 1 MiB even at the caps.
pub const NODES_PER_SHARD: usize = 64;

/// The summary key of a job.
pub fn summary_key(job: &ObjectKey) -> ObjectKey {
    ObjectKey::new(SUMMARY_KIND, &job.namespace, &job.name)
}

/// Shard `index` of a job's node entries. `#` never occurs in an object name.
pub fn shard_key(job: &ObjectKey, index: usize) -> ObjectKey {
    ObjectKey::new(
        NODES_KIND,
        &job.namespace,
        &format!("{}#{index:05}", job.name),
    )
}

/// One shard as stored.
#[derive(Debug, Deserialize)]
struct Shard {
    nodes: Vec<NodePullStatus>,
}

/// One shard to store: the same document, borrowing its nodes.
#[derive(Serialize)]
struct ShardOf<'a> {
    nodes: &'a [NodePullStatus],
}

/// A status as the documents to store: the summary, then each shard. Taken by value:
/// the summary is the status without its nodes, and nothing is copied to get there.
pub fn split(mut status: ImagePullJobStatus) -> Result<(Vec<u8>, Vec<Vec<u8>>), serde_json::Error> {
    let nodes = std::mem::take(&mut status.nodes);
    let shards = nodes
        .chunks(NODES_PER_SHARD)
        .map(|nodes| serde_json::to_vec(&ShardOf { nodes }))
        .collect::<Result<_, _>>()?;
    Ok((serde_json::to_vec(&status)?, shards))
}

/// What shards a write must touch: `(index, document)` of each that differs from what
/// was last written (`written`: a fingerprint per shard), and the fingerprints to keep.
fn changed_shards(shards: Vec<Vec<u8>>, written: &[u64]) -> (Vec<(usize, Vec<u8>)>, Vec<u64>) {
    let prints: Vec<u64> = shards.iter().map(|s| fingerprint(s)).collect();
    let changed = shards
        .into_iter()
        .enumerate()
        .filter(|(i, _)| written.get(*i) != prints.get(*i))
        .collect();
    (changed, prints)
}

fn fingerprint(bytes: &[u8]) -> u64 {
    use std::hash::{BuildHasher, BuildHasherDefault};
    BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default().hash_one(bytes)
}

/// What a job's status writer remembers between writes: the shards it wrote.
#[derive(Debug, Default, Clone)]
pub struct Written {
    shards: Vec<u64>,
    /// Shards past the end may be left from an earlier job of the same name.
    cleaned: bool,
}

/// Write `status` of `job`: the shards that changed since `written`, then the summary.
pub async fn write(
    store: &Store,
    job: &ObjectKey,
    status: ImagePullJobStatus,
    written: &mut Written,
) -> Result<(), StoreError> {
    let (summary, shards) = split(status).map_err(|e| StoreError::Backend {
        location: job.to_string(),
        detail: format!("cannot encode the status: {e}"),
    })?;
    let count = shards.len();
    let (changed, prints) = changed_shards(shards, &written.shards);
    // Shards first, the summary last: in one transaction on the embedded store.
    let mut batch: Vec<(ObjectKey, Vec<u8>)> = changed
        .into_iter()
        .map(|(index, document)| (shard_key(job, index), document))
        .collect();
    batch.push((summary_key(job), summary));
    store.put_all(batch).await?;
    if !written.cleaned {
        delete_shards_from(store, job, count).await?;
        written.cleaned = true;
    }
    written.shards = prints;
    Ok(())
}

/// Read a job's status; `None` when none was written. A status written before shards
/// existed (nodes inline in the summary) reads as it was; a summary or shard that does
/// not decode is `Undecodable` (the job is then left as it is).
pub async fn read(
    store: &Store,
    job: &ObjectKey,
) -> Result<Option<(ImagePullJobStatus, Written)>, StoreError> {
    let mut status = match store.get_as::<ImagePullJobStatus>(summary_key(job)).await {
        Ok(Some(summary)) => summary.value,
        Ok(None) => return Ok(None),
        Err(error) => return Err(error),
    };
    let mut written = Written {
        shards: Vec::new(),
        cleaned: true,
    };
    let mut shard_nodes = Vec::new();
    for index in 0.. {
        let Some(stored) = store.get(shard_key(job, index)).await? else {
            break;
        };
        let print = fingerprint(&stored.object);
        match rigger_store::typed::decode::<Shard>(stored) {
            Ok(shard) => {
                written.shards.push(print);
                shard_nodes.extend(shard.value.nodes);
            }
            // A shard this release cannot read (a newer one wrote it): the job's status
            // is left as it is, and the job with it; started afresh, its nodes would
            // pull again and the shard be overwritten.
            Err(error) => return Err(error),
        }
    }
    if status.nodes.is_empty() {
        status.nodes = shard_nodes;
    } else {
        // Written inline by an older controller: the next write moves them to shards.
        written.cleaned = false;
    }
    Ok(Some((status, written)))
}

/// Delete a job's status: the summary first (so no reader sees a summary without its
/// nodes), then every shard.
pub async fn delete(store: &Store, job: &ObjectKey) -> Result<(), StoreError> {
    match store.delete(summary_key(job), Precondition::Any).await {
        Ok(()) | Err(StoreError::NotFound { .. }) => {}
        Err(e) => return Err(e),
    }
    delete_shards_from(store, job, 0).await
}

/// Delete shards `first`, `first + 1`, ... up to the first that is not there, lowest
/// first (see the module's comment).
async fn delete_shards_from(
    store: &Store,
    job: &ObjectKey,
    first: usize,
) -> Result<(), StoreError> {
    for index in first.. {
        match store.delete(shard_key(job, index), Precondition::Any).await {
            Ok(()) => {}
            Err(StoreError::NotFound { .. }) => return Ok(()),
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rigger_api::image_pull_job::NodePullPhase;
    use rigger_store::EmbeddedStore;

    fn status(nodes: usize) -> ImagePullJobStatus {
        ImagePullJobStatus {
            desired: u32::try_from(nodes).unwrap(),
            active: 1,
            nodes: (0..nodes)
                .map(|i| NodePullStatus {
                    name: format!("node-{i:05}"),
                    phase: NodePullPhase::Pulling,
                    bytes_total: 7,
                    ..NodePullStatus::default()
                })
                .collect(),
            ..ImagePullJobStatus::default()
        }
    }

    fn store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(EmbeddedStore::open(dir.path()).unwrap());
        (dir, store)
    }

    #[test]
    fn only_the_shards_that_changed_are_written_again() {
        let mut status = status(3 * NODES_PER_SHARD - 10);
        let (_, shards) = split(status.clone()).unwrap();
        assert_eq!(shards.len(), 3);
        let (changed, prints) = changed_shards(shards, &[]);
        assert_eq!(changed.len(), 3);

        status.nodes[NODES_PER_SHARD + 2].bytes_done = 7;
        let (_, shards) = split(status.clone()).unwrap();
        let (changed, _) = changed_shards(shards, &prints);
        let indexes: Vec<usize> = changed.iter().map(|(i, _)| *i).collect();
        assert_eq!(indexes, [1]);
    }

    #[test]
    fn a_shard_at_the_agent_string_caps_stays_under_etcds_request_limit() {
        use crate::fleet::report_limits::{MAX_DIGEST_BYTES, MAX_MESSAGE_BYTES, MAX_NAME_BYTES};
        let mut status = status(NODES_PER_SHARD);
        for node in &mut status.nodes {
            node.name = "n".repeat(MAX_NAME_BYTES);
            // The costliest message as JSON: every byte escaped.
            node.message = "\n".repeat(MAX_MESSAGE_BYTES);
            node.image_digest = "d".repeat(MAX_DIGEST_BYTES);
            node.task_id = "t".repeat(2 * MAX_NAME_BYTES + 64);
            node.start_time = Some("2026-11-23T00:00:00Z".to_owned());
            node.completion_time = node.start_time.clone();
        }
        let (_, shards) = split(status.clone()).unwrap();
        assert!(shards[0].len() < 1024 * 1024, "{}", shards[0].len());
    }

    #[tokio::test]
    async fn a_status_round_trips_and_a_deleted_one_leaves_nothing() {
        let (_dir, store) = store();
        let job = ObjectKey::new("ImagePullJob", "default", "warm");
        let status = status(1000);
        let mut written = Written::default();
        write(&store, &job, status.clone(), &mut written)
            .await
            .unwrap();
        let (read_back, _) = read(&store, &job).await.unwrap().unwrap();
        assert_eq!(read_back, status);

        delete(&store, &job).await.unwrap();
        assert!(read(&store, &job).await.unwrap().is_none());
        assert!(store.list(NODES_KIND).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn an_inline_status_of_an_older_controller_reads_and_moves_to_shards() {
        let (_dir, store) = store();
        let job = ObjectKey::new("ImagePullJob", "default", "warm");
        let status = status(NODES_PER_SHARD + 1);
        store
            .put(
                summary_key(&job),
                serde_json::to_vec(&status).unwrap(),
                Precondition::Any,
            )
            .await
            .unwrap();
        let (read_back, mut written) = read(&store, &job).await.unwrap().unwrap();
        assert_eq!(read_back, status);
        write(&store, &job, read_back.clone(), &mut written)
            .await
            .unwrap();
        assert_eq!(store.list(NODES_KIND).await.unwrap().len(), 2);
        let summary = store.get(summary_key(&job)).await.unwrap().unwrap();
        assert!(
            !String::from_utf8(summary.object)
                .unwrap()
                .contains("node-00000")
        );
        assert_eq!(read(&store, &job).await.unwrap().unwrap().0, status);
    }

    #[tokio::test]
    async fn stale_shards_of_an_earlier_job_of_the_same_name_are_not_read() {
        let (_dir, store) = store();
        let job = ObjectKey::new("ImagePullJob", "default", "warm");
        write(
            &store,
            &job,
            status(6 * NODES_PER_SHARD),
            &mut Written::default(),
        )
        .await
        .unwrap();
        // The old job's status was not deleted (say, the store was down then).
        let small = status(10);
        write(&store, &job, small.clone(), &mut Written::default())
            .await
            .unwrap();
        assert_eq!(read(&store, &job).await.unwrap().unwrap().0, small);
    }
}
