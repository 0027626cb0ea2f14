//! The embedded store: a redb file in the data directory, one writer, fsync'd commits.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use redb::{ReadableDatabase, ReadableTable, TableDefinition};

use super::{Backend, ObjectKey, Precondition, StoreError, Stored, check};

/// `kind/namespace/name` → `revision (8 bytes, big endian) ++ object JSON`.
const OBJECTS: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("objects");
/// `"revision"` → the last revision handed out; `"format"` → the store's format
/// ([`super::STORE_FORMAT`]; absent in stores written before 0.2.0).
const META: TableDefinition<'_, &str, u64> = TableDefinition::new("meta");

/// The embedded store. Cheap to clone; calls run on the blocking pool.
#[derive(Debug, Clone)]
pub struct EmbeddedStore {
    db: Arc<redb::Database>,
    path: PathBuf,
}

impl EmbeddedStore {
    /// Open (or create) `<data_dir>/rigger.redb`.
    pub fn open(data_dir: &Path) -> Result<Self, StoreError> {
        let path = data_dir.join("rigger.redb");
        let backend = |detail: String| StoreError::Backend {
            location: path.display().to_string(),
            detail,
        };
        std::fs::create_dir_all(data_dir).map_err(|e| StoreError::Backend {
            location: data_dir.display().to_string(),
            detail: format!("cannot be used as the data directory: {e}"),
        })?;
        let db =
            redb::Database::create(&path).map_err(|e| backend(format!("cannot be opened: {e}")))?;
        // Tables exist from the start, so readers never meet a missing one; the format is
        // checked first, and a store of a newer one is left uncommitted, as it was.
        let txn = db.begin_write().map_err(|e| backend(e.to_string()))?;
        {
            let mut meta = txn.open_table(META).map_err(|e| backend(e.to_string()))?;
            let format = meta
                .get("format")
                .map_err(|e| backend(e.to_string()))?
                .map(|v| v.value());
            super::check_format(&path.display().to_string(), format)?;
            if format.is_none() {
                meta.insert("format", super::STORE_FORMAT)
                    .map_err(|e| backend(e.to_string()))?;
            }
        }
        txn.open_table(OBJECTS)
            .map_err(|e| backend(e.to_string()))?;
        txn.commit().map_err(|e| backend(e.to_string()))?;
        Ok(Self {
            db: Arc::new(db),
            path,
        })
    }

    fn backend(&self, e: impl std::fmt::Display) -> StoreError {
        StoreError::Backend {
            location: self.path.display().to_string(),
            detail: e.to_string(),
        }
    }

    async fn blocking<T: Send + 'static>(
        &self,
        work: impl FnOnce(&Self) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let store = self.clone();
        tokio::task::spawn_blocking(move || work(&store))
            .await
            .map_err(|e| self.backend(e))?
    }

    fn put_all_now(&self, objects: &[(ObjectKey, Vec<u8>)]) -> Result<(), StoreError> {
        let txn = self.db.begin_write().map_err(|e| self.backend(e))?;
        {
            let mut objects_table = txn.open_table(OBJECTS).map_err(|e| self.backend(e))?;
            let mut meta = txn.open_table(META).map_err(|e| self.backend(e))?;
            let mut revision = meta
                .get("revision")
                .map_err(|e| self.backend(e))?
                .map_or(0, |v| v.value());
            for (key, object) in objects {
                revision += 1;
                let mut value = revision.to_be_bytes().to_vec();
                value.extend_from_slice(object);
                objects_table
                    .insert(key.encode().as_str(), value.as_slice())
                    .map_err(|e| self.backend(e))?;
            }
            meta.insert("revision", revision)
                .map_err(|e| self.backend(e))?;
        }
        txn.commit().map_err(|e| self.backend(e))
    }

    fn put_now(
        &self,
        key: &ObjectKey,
        object: &[u8],
        precondition: Precondition,
    ) -> Result<u64, StoreError> {
        let encoded = key.encode();
        let txn = self.db.begin_write().map_err(|e| self.backend(e))?;
        let revision = {
            let mut objects = txn.open_table(OBJECTS).map_err(|e| self.backend(e))?;
            let current = objects
                .get(encoded.as_str())
                .map_err(|e| self.backend(e))?
                .map(|v| split(v.value()).0);
            check(&key.to_string(), precondition, current)?;
            let mut meta = txn.open_table(META).map_err(|e| self.backend(e))?;
            let revision = meta
                .get("revision")
                .map_err(|e| self.backend(e))?
                .map_or(0, |v| v.value())
                + 1;
            meta.insert("revision", revision)
                .map_err(|e| self.backend(e))?;
            let mut value = revision.to_be_bytes().to_vec();
            value.extend_from_slice(object);
            objects
                .insert(encoded.as_str(), value.as_slice())
                .map_err(|e| self.backend(e))?;
            revision
        };
        txn.commit().map_err(|e| self.backend(e))?;
        Ok(revision)
    }
}

#[async_trait::async_trait]
impl Backend for EmbeddedStore {
    /// Write `object` under `key` if `precondition` holds; returns the new revision.
    async fn put(
        &self,
        key: ObjectKey,
        object: Vec<u8>,
        precondition: Precondition,
    ) -> Result<u64, StoreError> {
        self.blocking(move |s| s.put_now(&key, &object, precondition))
            .await
    }

    /// Write every object, unconditionally, in one transaction (one fsync).
    async fn put_all(&self, objects: Vec<(ObjectKey, Vec<u8>)>) -> Result<(), StoreError> {
        self.blocking(move |s| s.put_all_now(&objects)).await
    }

    async fn get(&self, key: ObjectKey) -> Result<Option<Stored>, StoreError> {
        self.blocking(move |s| {
            let txn = s.db.begin_read().map_err(|e| s.backend(e))?;
            let objects = txn.open_table(OBJECTS).map_err(|e| s.backend(e))?;
            let found = objects
                .get(key.encode().as_str())
                .map_err(|e| s.backend(e))?;
            Ok(found.map(|v| {
                let (revision, object) = split(v.value());
                Stored {
                    key,
                    revision,
                    object: object.to_vec(),
                }
            }))
        })
        .await
    }

    /// Every object of `kind`, ordered by namespace and name.
    async fn list(&self, kind: &str) -> Result<Vec<Stored>, StoreError> {
        let prefix = format!("{kind}/");
        self.blocking(move |s| {
            let txn = s.db.begin_read().map_err(|e| s.backend(e))?;
            let objects = txn.open_table(OBJECTS).map_err(|e| s.backend(e))?;
            let mut found = Vec::new();
            for entry in objects.range(prefix.as_str()..).map_err(|e| s.backend(e))? {
                let (key, value) = entry.map_err(|e| s.backend(e))?;
                if !key.value().starts_with(&prefix) {
                    break;
                }
                let Some(key) = ObjectKey::decode(key.value()) else {
                    continue;
                };
                let (revision, object) = split(value.value());
                found.push(Stored {
                    key,
                    revision,
                    object: object.to_vec(),
                });
            }
            Ok(found)
        })
        .await
    }

    /// Delete `key` if `precondition` holds (`Absent` makes no sense here and is refused
    /// as a conflict). Deleting what is not there is `NotFound`.
    async fn delete(&self, key: ObjectKey, precondition: Precondition) -> Result<(), StoreError> {
        self.blocking(move |s| {
            let encoded = key.encode();
            let txn = s.db.begin_write().map_err(|e| s.backend(e))?;
            {
                let mut objects = txn.open_table(OBJECTS).map_err(|e| s.backend(e))?;
                let current = objects
                    .get(encoded.as_str())
                    .map_err(|e| s.backend(e))?
                    .map(|v| split(v.value()).0);
                if current.is_none() {
                    return Err(StoreError::NotFound {
                        key: key.to_string(),
                    });
                }
                check(&key.to_string(), precondition, current)?;
                objects.remove(encoded.as_str()).map_err(|e| s.backend(e))?;
            }
            txn.commit().map_err(|e| s.backend(e))
        })
        .await
    }
}

fn split(value: &[u8]) -> (u64, &[u8]) {
    let (head, object) = value.split_at(value.len().min(8));
    let mut revision = [0u8; 8];
    revision[..head.len()].copy_from_slice(head);
    (u64::from_be_bytes(revision), object)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn key(name: &str) -> ObjectKey {
        ObjectKey::new("ImagePullJob", "default", name)
    }

    #[tokio::test]
    async fn a_store_of_a_newer_format_is_refused_as_it_is_and_an_older_one_opens() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(dir.path()).unwrap();
        store
            .put(key("a"), b"{}".to_vec(), Precondition::Absent)
            .await
            .unwrap();
        // As a release before formats were recorded left it: opens, and records it.
        let set_format = |store: &EmbeddedStore, format: Option<u64>| {
            let txn = store.db.begin_write().unwrap();
            {
                let mut meta = txn.open_table(META).unwrap();
                match format {
                    Some(format) => meta.insert("format", format).unwrap(),
                    None => meta.remove("format").unwrap(),
                };
            }
            txn.commit().unwrap();
        };
        set_format(&store, None);
        drop(store);
        let store = EmbeddedStore::open(dir.path()).unwrap();
        let format = |store: &EmbeddedStore| {
            let txn = store.db.begin_read().unwrap();
            let meta = txn.open_table(META).unwrap();
            meta.get("format").unwrap().map(|v| v.value())
        };
        assert_eq!(format(&store), Some(crate::STORE_FORMAT));

        set_format(&store, Some(crate::STORE_FORMAT + 1));
        drop(store);
        let refused = EmbeddedStore::open(dir.path()).unwrap_err().to_string();
        assert!(refused.contains("newer release"), "{refused}");
        assert!(refused.contains("nothing was changed"), "{refused}");
        // As it was: the newer release opens it with its object.
        let db = redb::Database::create(dir.path().join("rigger.redb")).unwrap();
        let txn = db.begin_read().unwrap();
        assert_eq!(
            txn.open_table(META)
                .unwrap()
                .get("format")
                .unwrap()
                .map(|v| v.value()),
            Some(crate::STORE_FORMAT + 1)
        );
        assert!(
            txn.open_table(OBJECTS)
                .unwrap()
                .get("ImagePullJob/default/a")
                .unwrap()
                .is_some()
        );
    }

    #[tokio::test]
    async fn objects_survive_a_reopen_with_their_revisions() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(dir.path()).unwrap();
        let r1 = store
            .put(key("a"), b"{\"n\":1}".to_vec(), Precondition::Absent)
            .await
            .unwrap();
        let r2 = store
            .put(key("b"), b"{\"n\":2}".to_vec(), Precondition::Any)
            .await
            .unwrap();
        assert!(r2 > r1);
        drop(store);

        let store = EmbeddedStore::open(dir.path()).unwrap();
        let a = store.get(key("a")).await.unwrap().unwrap();
        assert_eq!((a.revision, a.object.as_slice()), (r1, &b"{\"n\":1}"[..]));
        let r3 = store
            .put(key("c"), b"{}".to_vec(), Precondition::Any)
            .await
            .unwrap();
        assert!(r3 > r2, "revisions keep growing after a restart");
    }

    #[tokio::test]
    async fn meets_the_store_contract() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::Store::new(EmbeddedStore::open(dir.path()).unwrap());
        crate::conformance(&store).await.unwrap();
    }

    #[tokio::test]
    async fn list_returns_one_kind_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(dir.path()).unwrap();
        for name in ["b", "a"] {
            store
                .put(key(name), b"{}".to_vec(), Precondition::Any)
                .await
                .unwrap();
        }
        store
            .put(
                ObjectKey::new("Node", "", "n1"),
                b"{}".to_vec(),
                Precondition::Any,
            )
            .await
            .unwrap();
        store
            .put(
                ObjectKey::new("ImagePullJobX", "default", "z"),
                b"{}".to_vec(),
                Precondition::Any,
            )
            .await
            .unwrap();
        let names: Vec<String> = store
            .list("ImagePullJob")
            .await
            .unwrap()
            .into_iter()
            .map(|s| s.key.name)
            .collect();
        assert_eq!(names, ["a", "b"]);
        let nodes = store.list("Node").await.unwrap();
        assert_eq!(nodes[0].key.to_string(), "Node/n1");
    }
}
