//! The namespaces' labels, as a SidecarSet's `namespaceSelector` matches them (the API
//! server matches its webhook entry on them; Rigger must agree). Read when needed and
//! kept a few seconds: pods are created in bursts, in few namespaces. Reads of names
//! not kept are rate-limited: anyone who can reach the webhook can name namespaces,
//! and must not turn it into a stream of requests to the API server.

use std::collections::{BTreeMap, HashMap};
use std::num::NonZeroU32;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use governor::Quota;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::Api;

/// How long labels read are trusted.
const FRESH: Duration = Duration::from_secs(10);

/// Namespaces read from the API server per second, and at once.
const READS_PER_SECOND: u32 = 20;
const READS_BURST: u32 = 40;

/// Why a namespace's labels are not known.
#[derive(Debug, thiserror::Error)]
pub enum NamespaceError {
    #[error("reading namespace {namespace}: {source}")]
    Read {
        namespace: String,
        source: kube::Error,
    },
    #[error(
        "namespace {namespace} not read: more than {READS_PER_SECOND} namespaces a second are asked for"
    )]
    TooManyReads { namespace: String },
}

/// A namespace's labels and when they were read.
type Read = (Instant, BTreeMap<String, String>);

pub struct NamespaceLabels {
    client: kube::Client,
    read: Mutex<HashMap<String, Read>>,
    reads: governor::DefaultDirectRateLimiter,
}

impl std::fmt::Debug for NamespaceLabels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NamespaceLabels").finish_non_exhaustive()
    }
}

impl NamespaceLabels {
    pub fn new(client: kube::Client) -> Self {
        let per_second = NonZeroU32::new(READS_PER_SECOND).unwrap_or(NonZeroU32::MIN);
        let burst = NonZeroU32::new(READS_BURST).unwrap_or(NonZeroU32::MIN);
        Self {
            client,
            read: Mutex::new(HashMap::new()),
            reads: governor::RateLimiter::direct(Quota::per_second(per_second).allow_burst(burst)),
        }
    }

    /// Namespace `name`'s labels (none for one that does not exist).
    pub async fn of(&self, name: &str) -> Result<BTreeMap<String, String>, NamespaceError> {
        if let Ok(read) = self.read.lock()
            && let Some((at, labels)) = read.get(name)
            && at.elapsed() < FRESH
        {
            return Ok(labels.clone());
        }
        if self.reads.check().is_err() {
            return Err(NamespaceError::TooManyReads {
                namespace: name.to_owned(),
            });
        }
        let api: Api<Namespace> = Api::all(self.client.clone());
        let labels = api
            .get_opt(name)
            .await
            .map_err(|source| NamespaceError::Read {
                namespace: name.to_owned(),
                source,
            })?
            .and_then(|namespace| namespace.metadata.labels)
            .unwrap_or_default();
        if let Ok(mut read) = self.read.lock() {
            read.retain(|_, (at, _)| at.elapsed() < FRESH);
            read.insert(name.to_owned(), (Instant::now(), labels.clone()));
        }
        Ok(labels)
    }
}
