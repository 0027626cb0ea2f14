//! What the controller needs of the API server before it starts: its own namespace and
//! every CRD it uses, served alone.

use kube::api::{Api, ApiResource, DynamicObject};
use serde_json::Value;

use super::{KubernetesStore, StoreError, client};

impl KubernetesStore {
    /// Every CRD the controller uses is served (alone, without a conversion webhook:
    /// [`conversion_refused`]), and its own namespace exists.
    pub(super) async fn check_definitions(&self, kruise_manager: bool) -> Result<(), StoreError> {
        let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(self.client.clone());
        let found = client::once_reachable(&self.location, || {
            namespaces.get_opt(&self.records_namespace)
        })
        .await
        .map_err(|e| self.error(&format!("namespace {}", self.records_namespace), &e))?;
        if found.is_none() {
            return Err(StoreError::Backend {
                location: self.location.clone(),
                detail: format!(
                    "namespace {} (kubernetes_namespace: where the controller keeps its records and Lease) does not exist",
                    self.records_namespace
                ),
            });
        }
        let definitions = ApiResource {
            group: "apiextensions.k8s.io".into(),
            version: "v1".into(),
            api_version: "apiextensions.k8s.io/v1".into(),
            kind: "CustomResourceDefinition".into(),
            plural: "customresourcedefinitions".into(),
        };
        let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &definitions);
        for crd in rigger_api::crd::all() {
            let name = crd["metadata"]["name"].as_str().unwrap_or_default();
            let found = api
                .get_opt(name)
                .await
                .map_err(|e| self.error(&format!("CustomResourceDefinition {name}"), &e))?;
            let Some(found) = found else {
                return Err(StoreError::Backend {
                    location: self.location.clone(),
                    detail: format!(
                        "the API server does not serve {name}: apply Rigger's CRDs first \
                         (kubectl apply -f deploy/kubernetes/crds.yaml)"
                    ),
                });
            };
            if let Some(detail) = conversion_refused(name, &found.data, kruise_manager) {
                return Err(StoreError::Backend {
                    location: self.location.clone(),
                    detail,
                });
            }
        }
        Ok(())
    }
}

/// Why CRD `name` (its object as read) cannot serve Rigger alone, if it cannot: it
/// serves more than one version and converts between them through a webhook — Kruise's, left from before a move —
/// which would answer for objects of both versions while its manager runs, and fail every
/// read of the other version once it is gone. Beside Kruise's manager, that is its own.
pub(super) fn conversion_refused(name: &str, crd: &Value, kruise_manager: bool) -> Option<String> {
    let strategy = crd["spec"]["conversion"]["strategy"]
        .as_str()
        .unwrap_or("None");
    // One version served is never converted.
    let served = crd["spec"]["versions"].as_array().map_or(0, |versions| {
        versions.iter().filter(|v| v["served"] == true).count()
    });
    (strategy == "Webhook" && served > 1 && !kruise_manager).then(|| {
        let service = &crd["spec"]["conversion"]["webhook"]["clientConfig"]["service"];
        let by = match (service["namespace"].as_str(), service["name"].as_str()) {
            (Some(namespace), Some(service)) => format!(" (service {namespace}/{service})"),
            _ => String::new(),
        };
        format!(
            "{name} converts between versions through a webhook{by}: Rigger alone serves \
             both versions itself and needs `conversion: None` (kubectl apply -f \
             deploy/kubernetes/crds.yaml; moving from Kruise, see \
             docs/guides/migrate-from-kruise.md)"
        )
    })
}
