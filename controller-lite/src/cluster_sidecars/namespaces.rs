//! The namespaces' labels, as a SidecarSet's `namespaceSelector` matches them (the API
//! server matches its webhook entry on them; Rigger must agree). Read when needed and
//! kept a few seconds: pods are created in bursts, in few namespaces.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use kube::api::Api;

/// How long labels read are trusted.
const FRESH: Duration = Duration::from_secs(10);

/// A namespace's labels and when they were read.
type Read = (Instant, BTreeMap<String, String>);

pub struct NamespaceLabels {
    client: kube::Client,
    read: Mutex<HashMap<String, Read>>,
}

impl std::fmt::Debug for NamespaceLabels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NamespaceLabels").finish_non_exhaustive()
    }
}

impl NamespaceLabels {
    pub fn new(client: kube::Client) -> Self {
        Self {
            client,
            read: Mutex::new(HashMap::new()),
        }
    }

    /// Namespace `name`'s labels (none for one that does not exist).
    pub async fn of(&self, name: &str) -> Result<BTreeMap<String, String>, kube::Error> {
        if let Ok(read) = self.read.lock()
            && let Some((at, labels)) = read.get(name)
            && at.elapsed() < FRESH
        {
            return Ok(labels.clone());
        }
        let api: Api<Namespace> = Api::all(self.client.clone());
        let labels = api
            .get_opt(name)
            .await?
            .and_then(|namespace| namespace.metadata.labels)
            .unwrap_or_default();
        if let Ok(mut read) = self.read.lock() {
            read.retain(|_, (at, _)| at.elapsed() < FRESH);
            read.insert(name.to_owned(), (Instant::now(), labels.clone()));
        }
        Ok(labels)
    }
}
