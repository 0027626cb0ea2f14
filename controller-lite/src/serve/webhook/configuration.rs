//! Which pods the API server sends to the webhook: one entry of the
//! MutatingWebhookConfiguration per SidecarSet, with the set's own selectors, so that
//! only the pods a SidecarSet matches wait on Rigger.
//!
//! Failure policy (a choice, documented in the operator guide): `Fail`. A pod a
//! SidecarSet matches is refused while no replica answers — its owner (a Deployment,
//! a Job) retries and gets it with its sidecars once one does — rather than started
//! without them, which Kruise's users find only later (charts#54). Every other pod is
//! never sent, so a controller outage blocks nothing else; `kube-system` and the
//! controller's own namespace are never sent either, so that the controller can always
//! start.

use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, ServiceReference,
    WebhookClientConfig,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use kube::api::{Api, PostParams};
use rigger_api::sidecar_set::{NAMESPACE_NAME_LABEL, SidecarSet};
use tokio_util::sync::CancellationToken;

use super::settings::WebhookAddress;
use crate::engines::sidecar_sets::usable::{self, SetState};
use rigger_store::Store;

/// The MutatingWebhookConfiguration `deploy/kubernetes` installs and the controller
/// keeps (its `webhooks`, nothing else).
pub const CONFIGURATION_NAME: &str = "rigger-sidecar-injection";
/// Where the webhook answers: `/inject-sidecars/<SidecarSet>`.
pub const WEBHOOK_PATH: &str = "/inject-sidecars";
/// Never sent: the cluster's own and the controller's.
pub const SYSTEM_NAMESPACE: &str = "kube-system";
/// The label by which a namespace, or a pod, opts out of every SidecarSet (as other
/// injectors have theirs): the webhook entries leave out namespaces and pods that
/// carry it with [`INJECTION_DISABLED`], so the API server never waits on Rigger for
/// them — CNI or cert-manager pods a broad SidecarSet would otherwise catch, which
/// after an outage must start before Rigger can answer.
pub const INJECTION_LABEL: &str = "rigger.dev/sidecar-injection";
pub const INJECTION_DISABLED: &str = "disabled";
/// How long the API server waits for an answer.
const TIMEOUT_SECONDS: i32 = 10;
/// How often the configuration is read back even when nothing changed (someone may
/// have edited it).
const RESYNC: Duration = Duration::from_secs(60);

/// The webhook entries for `sets` (pure): one per SidecarSet whose injection is not
/// paused, named after it, in the sets' order. A set Rigger cannot use keeps the entry
/// `stored` holds for it (its last good selectors, with the current CA), and the webhook
/// refuses the pods it sends ([`usable`]); one never written gets none — never an
/// entry made from an empty or unreadable selector, which would send every pod.
pub fn desired(
    sets: &[SetState],
    stored: &[MutatingWebhook],
    address: &WebhookAddress,
    ca_bundle: &str,
    own_namespace: &str,
) -> Vec<MutatingWebhook> {
    sets.iter()
        .filter_map(|state| {
            let name = entry_name(state.name());
            // A webhook's name is a DNS subdomain; the longest set names do not fit.
            if name.len() > 253 {
                return None;
            }
            match state {
                SetState::Usable(set) if set.spec.injection_strategy.paused => None,
                SetState::Usable(set) => entry(set, name, address, ca_bundle, own_namespace),
                SetState::Unusable { .. } => {
                    let mut kept = stored.iter().find(|entry| entry.name == name)?.clone();
                    kept.client_config.ca_bundle = Some(ByteString(ca_bundle.as_bytes().to_vec()));
                    Some(kept)
                }
            }
        })
        .collect()
}

/// The entry of SidecarSet `set`.
fn entry_name(set: &str) -> String {
    format!("{set}.sidecarsets.rigger.dev")
}

fn entry(
    set: &SidecarSet,
    name: String,
    address: &WebhookAddress,
    ca_bundle: &str,
    own_namespace: &str,
) -> Option<MutatingWebhook> {
    let mut namespaces = LabelSelector {
        match_expressions: Some(vec![
            LabelSelectorRequirement {
                key: NAMESPACE_NAME_LABEL.to_owned(),
                operator: "NotIn".to_owned(),
                values: Some(vec![SYSTEM_NAMESPACE.to_owned(), own_namespace.to_owned()]),
            },
            opted_out(),
        ]),
        match_labels: None,
    };
    if let Some(namespace) = &set.spec.namespace {
        namespaces.match_labels =
            Some([(NAMESPACE_NAME_LABEL.to_owned(), namespace.clone())].into());
    }
    if let Some(selector) = &set.spec.namespace_selector {
        let theirs = kube_selector(selector)?;
        if let Some(labels) = theirs.match_labels {
            namespaces
                .match_labels
                .get_or_insert_with(Default::default)
                .extend(labels);
        }
        if let Some(expressions) = theirs.match_expressions {
            namespaces
                .match_expressions
                .get_or_insert_with(Vec::new)
                .extend(expressions);
        }
    }
    let bundle = Some(ByteString(ca_bundle.as_bytes().to_vec()));
    // Each entry calls the webhook for its own set (once per pod: reinvocation Never).
    let path = format!("{WEBHOOK_PATH}/{}", set.metadata.name);
    let client_config = match address {
        WebhookAddress::Service { namespace, name } => WebhookClientConfig {
            service: Some(ServiceReference {
                namespace: namespace.clone(),
                name: name.clone(),
                path: Some(path),
                port: Some(443),
            }),
            ca_bundle: bundle,
            url: None,
        },
        WebhookAddress::Url { base, .. } => WebhookClientConfig {
            url: Some(format!("{base}{path}")),
            ca_bundle: bundle,
            service: None,
        },
    };
    let mut object_selector = kube_selector(&set.spec.selector)?;
    object_selector
        .match_expressions
        .get_or_insert_with(Vec::new)
        .push(opted_out());
    Some(MutatingWebhook {
        name,
        admission_review_versions: vec!["v1".to_owned()],
        client_config,
        failure_policy: Some("Fail".to_owned()),
        match_policy: Some("Equivalent".to_owned()),
        namespace_selector: Some(namespaces),
        object_selector: Some(object_selector),
        reinvocation_policy: Some("Never".to_owned()),
        rules: Some(vec![RuleWithOperations {
            api_groups: Some(vec![String::new()]),
            api_versions: Some(vec!["v1".to_owned()]),
            operations: Some(vec!["CREATE".to_owned()]),
            resources: Some(vec!["pods".to_owned()]),
            scope: Some("Namespaced".to_owned()),
        }]),
        side_effects: "None".to_owned(),
        timeout_seconds: Some(TIMEOUT_SECONDS),
        match_conditions: None,
    })
}

/// What leaves out namespaces and pods that opted out.
fn opted_out() -> LabelSelectorRequirement {
    LabelSelectorRequirement {
        key: INJECTION_LABEL.to_owned(),
        operator: "NotIn".to_owned(),
        values: Some(vec![INJECTION_DISABLED.to_owned()]),
    }
}

/// Rigger's selector in Kubernetes' type (the same fields); `None` when it does not
/// convert — never an empty selector, which would match every pod.
fn kube_selector(selector: &rigger_api::fields::LabelSelector) -> Option<LabelSelector> {
    let value = serde_json::to_value(selector).ok()?;
    serde_json::from_value(value).ok()
}

/// Whether the stored entries say what `desired` does, as far as Rigger sets them (the
/// API server fills defaults Rigger leaves alone).
fn current(stored: &[MutatingWebhook], desired: &[MutatingWebhook]) -> bool {
    stored.len() == desired.len()
        && stored.iter().zip(desired).all(|(s, d)| {
            s.name == d.name
                && s.client_config == d.client_config
                && s.object_selector == d.object_selector
                && s.namespace_selector == d.namespace_selector
                && s.failure_policy == d.failure_policy
                && s.rules == d.rules
        })
}

/// Keep the configuration's entries those of the SidecarSets (leader only): written
/// when the sets or the CA change, read back every [`RESYNC`].
pub async fn keep_current(
    client: kube::Client,
    store: Store,
    address: WebhookAddress,
    own_namespace: String,
    mut ca_bundle: tokio::sync::watch::Receiver<Option<String>>,
    token: CancellationToken,
) {
    let api: Api<MutatingWebhookConfiguration> = Api::all(client);
    let mut written: Option<Vec<MutatingWebhook>> = None;
    let mut last_read = tokio::time::Instant::now();
    loop {
        let bundle = ca_bundle.borrow_and_update().clone();
        if let Some(bundle) = bundle {
            match store.list_all_objects::<SidecarSet>().await {
                Ok(listed) => {
                    let sets = usable::states(listed);
                    // What was last written stands for what is stored (read back every
                    // RESYNC, and on every write).
                    let want = written
                        .as_deref()
                        .map(|stored| desired(&sets, stored, &address, &bundle, &own_namespace));
                    let stale = last_read.elapsed() >= RESYNC;
                    if want.is_none() || written != want || stale {
                        last_read = tokio::time::Instant::now();
                        match write(&api, &sets, &address, &bundle, &own_namespace).await {
                            Ok(entries) => written = Some(entries),
                            Err(error) => {
                                written = None;
                                tracing::warn!(%error, "the sidecar webhook's configuration is not current");
                            }
                        }
                    }
                }
                Err(error) => tracing::debug!(%error, "SidecarSets not listed yet"),
            }
        }
        tokio::select! {
            () = token.cancelled() => return,
            _ = ca_bundle.changed() => {}
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

/// Make the configuration's entries those `desired` says for `sets` (at the version
/// read), when they differ; the entries it then holds.
async fn write(
    api: &Api<MutatingWebhookConfiguration>,
    sets: &[SetState],
    address: &WebhookAddress,
    ca_bundle: &str,
    own_namespace: &str,
) -> Result<Vec<MutatingWebhook>, String> {
    let Some(mut stored) = api
        .get_opt(CONFIGURATION_NAME)
        .await
        .map_err(|e| format!("MutatingWebhookConfiguration {CONFIGURATION_NAME}: {e}"))?
    else {
        return Err(format!(
            "MutatingWebhookConfiguration {CONFIGURATION_NAME} does not exist: apply deploy/kubernetes, which holds it (pods get no sidecars until it exists)"
        ));
    };
    let entries = stored.webhooks.as_deref().unwrap_or_default();
    let want = desired(sets, entries, address, ca_bundle, own_namespace);
    if current(entries, &want) {
        return Ok(want);
    }
    stored.webhooks = Some(want.clone());
    api.replace(CONFIGURATION_NAME, &PostParams::default(), &stored)
        .await
        .map(|_| {
            tracing::info!(
                webhooks = want.len(),
                "sidecar webhook configuration written"
            );
        })
        .map_err(|e| format!("MutatingWebhookConfiguration {CONFIGURATION_NAME}: {e}"))?;
    Ok(want)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn state(set: SidecarSet) -> SetState {
        match set.validate_served() {
            Ok(()) => SetState::Usable(Box::new(set)),
            Err(error) => SetState::Unusable {
                name: set.metadata.name,
                cause: error.to_string(),
            },
        }
    }

    fn set(name: &str, extra: &serde_json::Value) -> SidecarSet {
        let mut spec = json!({"selector": {"matchLabels": {"app": "web"}},
            "containers": [{"name": "proxy", "image": "r.example/p:1"}]});
        for (k, v) in extra.as_object().unwrap() {
            spec[k] = v.clone();
        }
        serde_json::from_value(
            json!({"apiVersion": "apps.kruise.io/v1alpha1", "kind": "SidecarSet",
            "metadata": {"name": name}, "spec": spec}),
        )
        .unwrap()
    }

    #[test]
    fn one_entry_per_set_with_its_selectors_and_never_the_system_namespaces() {
        let sets = [
            set("mesh", &json!({"namespace": "shop"})),
            // Refused by Rigger (as a typo the API server pruned would leave it) and
            // never served: no entry, so it cannot send every pod to the webhook.
            set("typo", &json!({"selector": {}})),
            set("paused", &json!({"injectionStrategy": {"paused": true}})),
            set(
                "logs",
                &json!({"namespaceSelector": {"matchLabels": {"team": "a"},
                "matchExpressions": [{"key": "tier", "operator": "Exists"}]}}),
            ),
        ]
        .map(state);
        let address = WebhookAddress::Service {
            namespace: "rigger-system".to_owned(),
            name: "rigger-controller".to_owned(),
        };
        let entries = desired(&sets, &[], &address, "CA", "rigger-system");
        let value = serde_json::to_value(&entries).unwrap();
        assert_eq!(entries.len(), 2, "{value:#}");
        assert_eq!(value[0]["name"], "mesh.sidecarsets.rigger.dev");
        assert_eq!(value[0]["failurePolicy"], "Fail");
        // Pods and namespaces labelled `rigger.dev/sidecar-injection: disabled` are never
        // sent, whatever the set selects.
        let opted_out =
            json!({"key": INJECTION_LABEL, "operator": "NotIn", "values": ["disabled"]});
        assert_eq!(
            value[0]["objectSelector"],
            json!({"matchLabels": {"app": "web"}, "matchExpressions": [opted_out]})
        );
        assert_eq!(
            value[0]["namespaceSelector"],
            json!({"matchLabels": {NAMESPACE_NAME_LABEL: "shop"},
                "matchExpressions": [{"key": NAMESPACE_NAME_LABEL, "operator": "NotIn",
                    "values": ["kube-system", "rigger-system"]}, opted_out]})
        );
        assert_eq!(
            value[0]["clientConfig"]["service"],
            json!({"namespace": "rigger-system", "name": "rigger-controller",
                "path": "/inject-sidecars/mesh", "port": 443})
        );
        assert_eq!(
            value[1]["namespaceSelector"]["matchLabels"],
            json!({"team": "a"})
        );
        assert_eq!(
            value[1]["namespaceSelector"]["matchExpressions"][2]["key"],
            "tier"
        );
        assert!(current(&entries, &entries));
        assert!(!current(&entries[..1], &entries));
        let url = WebhookAddress::Url {
            base: "https://127.0.0.1:9443".to_owned(),
            host: "127.0.0.1".to_owned(),
        };
        let by_url = desired(&sets[..1], &[], &url, "CA", "rigger-system");
        assert_eq!(
            by_url[0].client_config.url.as_deref(),
            Some("https://127.0.0.1:9443/inject-sidecars/mesh")
        );
        assert!(!current(&by_url, &entries[..1]));
    }

    #[test]
    fn a_set_rigger_cannot_use_keeps_its_last_entry_and_a_deleted_or_paused_one_loses_it() {
        let address = WebhookAddress::Service {
            namespace: "rigger-system".to_owned(),
            name: "rigger-controller".to_owned(),
        };
        let good = [
            set("mesh", &json!({})),
            set(
                "logs",
                &json!({"selector": {"matchLabels": {"app": "logs"}}}),
            ),
        ]
        .map(state);
        let stored = desired(&good, &[], &address, "OLD-CA", "rigger-system");
        assert_eq!(stored.len(), 2);

        // mesh edited into what Rigger refuses, logs no longer decodable, a new set
        // that never decoded: the two keep their entries (with the new CA), the new
        // one gets none.
        let unusable = |name: &str| SetState::Unusable {
            name: name.to_owned(),
            cause: "it does not decode: unknown field `x`".to_owned(),
        };
        let now = [
            unusable("fresh"),
            unusable("logs"),
            state(set("mesh", &json!({"selector": {}}))),
        ];
        let kept = desired(&now, &stored, &address, "NEW-CA", "rigger-system");
        let names: Vec<_> = kept.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(
            names,
            ["logs.sidecarsets.rigger.dev", "mesh.sidecarsets.rigger.dev"]
        );
        assert_eq!(
            kept[0].object_selector, stored[1].object_selector,
            "last good selector"
        );
        assert!(
            kept.iter()
                .all(|e| e.client_config.ca_bundle == Some(ByteString(b"NEW-CA".to_vec())))
        );
        assert!(current(
            &kept,
            &desired(&now, &kept, &address, "NEW-CA", "rigger-system")
        ));

        // Deleted (not listed) or paused: gone.
        let paused = [state(set(
            "mesh",
            &json!({"injectionStrategy": {"paused": true}}),
        ))];
        assert!(desired(&paused, &stored, &address, "NEW-CA", "rigger-system").is_empty());
        assert!(desired(&[], &stored, &address, "NEW-CA", "rigger-system").is_empty());
    }
}
