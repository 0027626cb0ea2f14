//! The store's objects as typed values: the one place stored JSON is decoded. A user's
//! kind comes back as its `rigger_api` type (`Object::INFO` names where it lives), the
//! controller's own records (statuses, histories, node labels) as whatever type their
//! module keeps, each with its key and the revision to write against.
//!
//! An object that does not decode (written around the API, or by another version) is
//! refused where it is read: `get` says which key and why; `list` leaves it out with a
//! warning, so one bad object never stops an engine's pass.

use rigger_api::Object;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{ObjectKey, Precondition, Store, StoreError, Stored};

/// A stored value decoded, with its key and the revision of its last change.
#[derive(Debug, Clone, PartialEq)]
pub struct Versioned<T> {
    pub key: ObjectKey,
    pub revision: u64,
    pub value: T,
}

/// `stored`, decoded as `T`. What does not decode is said with the path of the field
/// (`spec.pullPolicy.backoffLimit: invalid type ...`): decoded again for that, since
/// following the path costs on every decode and the store is read on every pass.
pub fn decode<T: DeserializeOwned>(stored: Stored) -> Result<Versioned<T>, StoreError> {
    match serde_json::from_slice(&stored.object) {
        Ok(value) => Ok(Versioned {
            key: stored.key,
            revision: stored.revision,
            value,
        }),
        Err(error) => {
            let mut again = serde_json::Deserializer::from_slice(&stored.object);
            let detail = match serde_path_to_error::deserialize::<_, T>(&mut again) {
                Err(e) if e.path().to_string() != "." => format!("{}: {}", e.path(), e.inner()),
                _ => error.to_string(),
            };
            Err(StoreError::Undecodable {
                key: stored.key.to_string(),
                detail,
            })
        }
    }
}

/// `stored`, a user's object of kind `T`, decoded strictly: a field `T` does not know
/// (one a newer release wrote) makes it undecodable, naming the field, rather than
/// dropped from it, so that no write of the controller's ever loses it; the object is
/// then left alone by the engines (the controller's `undecodable`).
pub fn decode_object<T: Object>(stored: Stored) -> Result<Versioned<T>, StoreError> {
    let value: serde_json::Value =
        serde_json::from_slice(&stored.object).map_err(|error| StoreError::Undecodable {
            key: stored.key.to_string(),
            detail: error.to_string(),
        })?;
    match rigger_api::strict::decode_strict(value) {
        Ok(value) => Ok(Versioned {
            key: stored.key,
            revision: stored.revision,
            value,
        }),
        Err(error) => Err(StoreError::Undecodable {
            key: stored.key.to_string(),
            detail: if error.path.is_empty() {
                error.reason
            } else {
                format!("{}: {}", error.path, error.reason)
            },
        }),
    }
}

/// A listing that says what it left out: for a reader that must not take a missing object
/// for an absent one (the SidecarSet webhook: a set it cannot read still has pods that
/// must not start without their sidecars).
#[derive(Debug, Clone, PartialEq)]
pub struct Listed<T> {
    pub decoded: Vec<Versioned<T>>,
    /// The objects that do not decode, by key, with why.
    pub undecodable: Vec<(ObjectKey, String)>,
}

/// `value` as the store keeps it.
pub fn encode<T: Serialize>(key: &ObjectKey, value: &T) -> Result<Vec<u8>, StoreError> {
    serde_json::to_vec(value).map_err(|error| StoreError::Undecodable {
        key: key.to_string(),
        detail: format!("cannot be encoded: {error}"),
    })
}

/// The key of the user's object `name` of kind `T` in `namespace` (none for a
/// cluster-wide kind).
pub fn key_of<T: Object>(namespace: &str, name: &str) -> ObjectKey {
    let namespace = if T::INFO.namespaced { namespace } else { "" };
    ObjectKey::new(T::INFO.name, namespace, name)
}

impl Store {
    /// The record under `key`, decoded as `T`.
    pub async fn get_as<T: DeserializeOwned>(
        &self,
        key: ObjectKey,
    ) -> Result<Option<Versioned<T>>, StoreError> {
        self.get(key).await?.map(decode).transpose()
    }

    /// Every record of `kind`, decoded as `T`, in namespace and name order; those that
    /// do not decode are left out with a warning.
    pub async fn list_as<T: DeserializeOwned>(
        &self,
        kind: &str,
    ) -> Result<Vec<Versioned<T>>, StoreError> {
        let listed = self.list_all_as(kind).await?;
        for (key, detail) in &listed.undecodable {
            tracing::warn!(%key, %detail, "a stored object does not decode; left out");
        }
        Ok(listed.decoded)
    }

    /// Every record of `kind`, decoded as `T` where it can be, the others named.
    pub async fn list_all_as<T: DeserializeOwned>(
        &self,
        kind: &str,
    ) -> Result<Listed<T>, StoreError> {
        self.list_decoded(kind, decode).await
    }

    async fn list_decoded<T>(
        &self,
        kind: &str,
        decode: impl Fn(Stored) -> Result<Versioned<T>, StoreError>,
    ) -> Result<Listed<T>, StoreError> {
        let mut listed = Listed {
            decoded: Vec::new(),
            undecodable: Vec::new(),
        };
        for stored in self.list(kind).await? {
            let key = stored.key.clone();
            match decode(stored) {
                Ok(versioned) => listed.decoded.push(versioned),
                Err(error) => {
                    let detail = match error {
                        StoreError::Undecodable { detail, .. } => detail,
                        other => other.to_string(),
                    };
                    listed.undecodable.push((key, detail));
                }
            }
        }
        Ok(listed)
    }

    /// Every object of kind `T`, strictly decoded ([`decode_object`]), those that do
    /// not decode named.
    pub async fn list_all_objects<T: Object>(&self) -> Result<Listed<T>, StoreError> {
        self.list_decoded(T::INFO.name, decode_object).await
    }

    /// The user's object `name` of kind `T`.
    pub async fn get_object<T: Object>(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Versioned<T>>, StoreError> {
        self.get(key_of::<T>(namespace, name))
            .await?
            .map(decode_object)
            .transpose()
    }

    /// Every object of kind `T` (those that do not decode left out).
    pub async fn list_objects<T: Object>(&self) -> Result<Vec<Versioned<T>>, StoreError> {
        let listed = self.list_all_objects::<T>().await?;
        for (key, detail) in &listed.undecodable {
            tracing::warn!(%key, %detail, "a stored object does not decode; left out");
        }
        Ok(listed.decoded)
    }

    /// Write `value` under `key` if `precondition` holds; its new revision.
    pub async fn put_as<T: Serialize>(
        &self,
        key: ObjectKey,
        value: &T,
        precondition: Precondition,
    ) -> Result<u64, StoreError> {
        let object = encode(&key, value)?;
        self.put(key, object, precondition).await
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use rigger_api::secret::Secret;

    #[tokio::test]
    async fn objects_come_back_typed_and_a_bad_one_is_named_or_left_out() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(crate::EmbeddedStore::open(dir.path()).unwrap());
        let secret: Secret = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "good", "namespace": "default"},
            "type": "Opaque", "stringData": {"a": "b"},
        }))
        .unwrap();
        let revision = store
            .put_as(
                key_of::<Secret>("default", "good"),
                &secret,
                Precondition::Absent,
            )
            .await
            .unwrap();
        let bad = key_of::<Secret>("default", "bad");
        store
            .put(
                bad.clone(),
                b"{\"metadata\": 7}".to_vec(),
                Precondition::Any,
            )
            .await
            .unwrap();

        let good = store
            .get_object::<Secret>("default", "good")
            .await
            .unwrap()
            .unwrap();
        assert_eq!((good.revision, good.value), (revision, secret));
        let refused = store.get_as::<Secret>(bad).await.unwrap_err().to_string();
        assert!(refused.starts_with("Secret/default/bad: "), "{refused}");
        let listed = store.list_objects::<Secret>().await.unwrap();
        assert_eq!(listed.len(), 1, "the bad one is left out");
        let all = store.list_all_objects::<Secret>().await.unwrap();
        assert_eq!(all.decoded.len(), 1);
        assert_eq!(all.undecodable.len(), 1, "the bad one is named");
        assert_eq!(all.undecodable[0].0, key_of::<Secret>("default", "bad"));
        assert!(
            all.undecodable[0].1.contains("invalid type"),
            "{:?}",
            all.undecodable[0].1
        );
    }
}
