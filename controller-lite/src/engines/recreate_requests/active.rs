//! A finished request's `crr.apps.kruise.io/active` label, which Kruise's manager
//! clears (its daemon watches only active requests) and Rigger alone clears as it does.

use rigger_api::container_recreate_request::ContainerRecreateRequest;

use super::{ACTIVE_LABEL, RecreateEngine};
use rigger_store::{ObjectKey, Precondition, StoreError};

impl RecreateEngine {
    /// In a cluster, as Kruise's manager does: a finished request loses its
    /// `crr.apps.kruise.io/active` label (Kruise's daemon watches only active ones).
    /// Beside Kruise's manager, that manager does it.
    pub(super) async fn clear_active(&self) {
        if self.inner.cluster_pods.is_none() || self.inner.beside_kruise_manager {
            return;
        }
        let finished: Vec<ObjectKey> = {
            let mut state = self.lock();
            state
                .requests
                .iter_mut()
                .filter(|(_, t)| t.finished() && t.label(ACTIVE_LABEL) == "true")
                .map(|(key, t)| {
                    t.request.metadata.labels.remove(ACTIVE_LABEL);
                    key.clone()
                })
                .collect()
        };
        for key in finished {
            let written = self.remove_active_label(&key).await;
            match written {
                Ok(_) | Err(StoreError::NotFound { .. }) => {}
                Err(error) => {
                    tracing::warn!(request = %key, %error, "cannot clear the request's active label");
                    if let Some(t) = self.lock().requests.get_mut(&key) {
                        t.request
                            .metadata
                            .labels
                            .insert(ACTIVE_LABEL.to_owned(), "true".to_owned());
                    }
                }
            }
        }
    }

    /// Remove the label from the request as it is now, and only the label: what users
    /// and other controllers wrote meanwhile (labels, annotations, finalizers) stays, a
    /// request deleted meanwhile stays deleted, and a request kept only by a finalizer
    /// is kept. A request changed between the read and the write is a conflict, and
    /// read again next pass.
    async fn remove_active_label(&self, key: &ObjectKey) -> Result<u64, StoreError> {
        let store = &self.inner.store;
        let Some(current) = store.get(key.clone()).await? else {
            return Ok(0);
        };
        let at = Precondition::Revision(current.revision);
        let mut request: ContainerRecreateRequest =
            rigger_store::typed::decode_object(current)?.value;
        if request.metadata.labels.remove(ACTIVE_LABEL).is_none() {
            return Ok(0);
        }
        let bytes = rigger_store::typed::encode(key, &request)?;
        store.put(key.clone(), bytes, at).await
    }
}
