//! A finished request's `crr.apps.kruise.io/active` label, which Kruise's manager
//! clears (its daemon watches only active requests) and Rigger alone clears as it does.

use rigger_api::container_recreate_request::ContainerRecreateRequest;

use super::{ACTIVE_LABEL, RecreateEngine};
use crate::store::{ObjectKey, Precondition, StoreError};

impl RecreateEngine {
    /// In a cluster, as Kruise's manager does: a finished request loses its
    /// `crr.apps.kruise.io/active` label (Kruise's daemon watches only active ones).
    /// Beside Kruise's manager, that manager does it.
    pub(super) async fn clear_active(&self) {
        if self.inner.cluster_pods.is_none() || self.inner.beside_kruise_manager {
            return;
        }
        let finished: Vec<(ObjectKey, ContainerRecreateRequest)> = {
            let mut state = self.lock();
            state
                .requests
                .iter_mut()
                .filter(|(_, t)| t.finished() && t.label(ACTIVE_LABEL) == "true")
                .map(|(key, t)| {
                    t.request.metadata.labels.remove(ACTIVE_LABEL);
                    (key.clone(), t.request.clone())
                })
                .collect()
        };
        for (key, request) in finished {
            // Only over the request as it is now: one deleted meanwhile stays deleted.
            let written = match self.inner.store.get(key.clone()).await {
                Ok(None) => Ok(0),
                Ok(Some(current)) => match crate::store::typed::encode(&key, &request) {
                    Ok(bytes) => {
                        let at = Precondition::Revision(current.revision);
                        self.inner.store.put(key.clone(), bytes, at).await
                    }
                    Err(error) => Err(error),
                },
                Err(error) => Err(error),
            };
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
}
