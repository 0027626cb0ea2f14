//! The SidecarSet injection webhook (Kubernetes mode, Rigger alone), as Kruise's manager
//! has it: a mutating admission webhook injects the sidecars into pods as the API server
//! creates them. The rollout that follows is an engine's
//! ([`crate::engines::sidecar_sets::cluster_rollout`]).
//!
//! - [`review`]: the answer to one review (pure);
//! - [`endpoint`]: the HTTPS endpoint, on every replica;
//! - [`connections`]: which connections it takes, so that nobody can starve it;
//! - [`certificate`]: its certificate, kept in a Secret every replica serves from;
//! - [`configuration`]: the MutatingWebhookConfiguration's entries, one per SidecarSet,
//!   kept by the leader (and why its failure policy is `Fail`).

pub mod certificate;
pub mod configuration;
pub mod connections;
pub mod endpoint;
pub mod review;
pub mod settings;

use std::sync::Arc;
use std::time::Duration;

use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use rigger_store::Leadership;
use rigger_store::Store;
use settings::SidecarWebhookSettings;

/// How often the certificate's Secret is read (another replica may have renewed it).
const CERTIFICATE_RESYNC: Duration = Duration::from_secs(60);
/// After a failure to read or write it.
const CERTIFICATE_RETRY: Duration = Duration::from_secs(5);

/// Everything the webhook needs.
pub struct SidecarWebhook {
    pub listener: TcpListener,
    pub settings: SidecarWebhookSettings,
    /// For what every replica does, leading or not: the serving certificate, the
    /// namespaces' labels.
    pub replica_client: kube::Client,
    /// For what only the leader writes (the webhook configuration): its writes fenced on
    /// the leadership as the store's are.
    pub leader_client: kube::Client,
    pub store: Store,
    /// The controller's namespace: the certificate's Secret lives there.
    pub namespace: String,
    pub metrics: crate::serve::metrics::WebhookMetrics,
}

impl std::fmt::Debug for SidecarWebhook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SidecarWebhook")
            .field("settings", &self.settings)
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

impl SidecarWebhook {
    /// Serve until `token`; the leader also keeps the webhook configuration current.
    /// `serving` turns true once this replica answers reviews as well as the leader would
    /// (its certificate loaded, the SidecarSets and their histories read once, which
    /// starts the watches a review reads): what the replica's readiness waits for.
    pub async fn run(
        self,
        mut leadership: Leadership,
        serving: watch::Sender<bool>,
        token: CancellationToken,
    ) {
        let (tls_sender, tls) = watch::channel(None);
        let (ca_sender, ca_bundle) = watch::channel(None);
        let names = self.settings.reached_at.certificate_names();
        let certificates = keep_certificate(
            self.replica_client.clone(),
            self.namespace.clone(),
            names,
            tls_sender,
            ca_sender,
            token.clone(),
        );
        let namespaces = Arc::new(crate::cluster::namespaces::NamespaceLabels::new(
            self.replica_client.clone(),
        ));
        let primed = primed(tls.clone(), self.store.clone(), serving, token.clone());
        let serving = endpoint::serve(
            self.listener,
            tls,
            self.store.clone(),
            namespaces,
            self.metrics.clone(),
            token.clone(),
        );
        let configuring = async {
            if leadership.elected().await {
                configuration::keep_current(
                    self.leader_client.clone(),
                    self.store.clone(),
                    self.settings.reached_at.clone(),
                    self.namespace.clone(),
                    ca_bundle,
                    token.clone(),
                )
                .await;
            }
        };
        tokio::join!(certificates, primed, serving, configuring);
    }
}

/// After a failure to read the SidecarSets while priming.
const PRIMING_RETRY: Duration = Duration::from_secs(1);

/// Say `serving` once a certificate is served and a review's reads answer: the first read
/// of a kind starts its watch and waits for its first list (up to the cache's sync
/// timeout), longer than the API server waits for a review.
async fn primed(
    mut tls: watch::Receiver<Option<Arc<rustls::ServerConfig>>>,
    store: Store,
    serving: watch::Sender<bool>,
    token: CancellationToken,
) {
    tokio::select! {
        () = token.cancelled() => return,
        loaded = tls.wait_for(Option::is_some) => if loaded.is_err() { return },
    }
    loop {
        let read = async {
            store
                .list_objects::<rigger_api::sidecar_set::SidecarSet>()
                .await
                .map_err(|e| e.to_string())?;
            crate::engines::sidecar_sets::histories(&store)
                .await
                .map_err(|e| e.to_string())
        };
        match read.await {
            Ok(_) => {
                serving.send_replace(true);
                tracing::info!("the SidecarSet webhook serves");
                return;
            }
            Err(error) => {
                tracing::warn!(%error, "the SidecarSet webhook cannot read SidecarSets yet");
            }
        }
        tokio::select! {
            () = token.cancelled() => return,
            () = tokio::time::sleep(PRIMING_RETRY) => {}
        }
    }
}

/// Keep the serving certificate (and the CA the configuration names) current.
async fn keep_certificate(
    client: kube::Client,
    namespace: String,
    names: Vec<String>,
    tls: watch::Sender<Option<Arc<rustls::ServerConfig>>>,
    ca_bundle: watch::Sender<Option<String>>,
    token: CancellationToken,
) {
    let mut serving: Option<certificate::WebhookPki> = None;
    loop {
        let wait = match certificate::ensure(&client, &namespace, &names).await {
            Ok(pki) => {
                if serving.as_ref() != Some(&pki) {
                    match server_config(&pki) {
                        Ok(config) => {
                            tls.send_replace(Some(Arc::new(config)));
                            ca_bundle.send_replace(Some(pki.ca_cert.clone()));
                            serving = Some(pki);
                        }
                        Err(error) => {
                            tracing::warn!(%error, "the sidecar webhook certificate cannot be served");
                        }
                    }
                }
                CERTIFICATE_RESYNC
            }
            Err(error) => {
                tracing::warn!(%error, "no sidecar webhook certificate yet");
                CERTIFICATE_RETRY
            }
        };
        tokio::select! {
            () = token.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
        }
    }
}

fn server_config(pki: &certificate::WebhookPki) -> Result<rustls::ServerConfig, String> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pki.cert.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| format!("the certificate: {e}"))?;
    let key =
        PrivateKeyDer::from_pem_slice(pki.key.as_bytes()).map_err(|e| format!("the key: {e}"))?;
    let mut config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| e.to_string())?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}
