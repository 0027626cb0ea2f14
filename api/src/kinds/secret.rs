//! `kind: Secret` with `type: kubernetes.io/dockerconfigjson`: registry credentials for
//! ImagePullJobs' `pullSecrets`, in Kubernetes' shape, so `kubectl get secret -o yaml`
//! output applies unchanged. Values never leave the controller except to the nodes of a
//! job that names the secret; reads through the API show only the keys.

use std::collections::BTreeMap;

use base64::Engine as _;
use serde::{Deserialize, Serialize};

use crate::fields::{FieldError, ObjectMeta, ValidateMeta as _};

use std::time::SystemTime;

use crate::kind::KindInfo;
use crate::object::{Object, metadata_field};
use crate::table::{Columns, age};

pub const KIND: &str = "Secret";
pub const API_VERSION: &str = "v1";
pub const DOCKER_CONFIG_JSON_TYPE: &str = "kubernetes.io/dockerconfigjson";
pub const DOCKER_CONFIG_JSON_KEY: &str = ".dockerconfigjson";
/// Shown instead of a value in API reads.
pub const REDACTED: &str = "<redacted>";

#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Secret {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    #[serde(rename = "type")]
    pub secret_type: String,
    /// Kubernetes' `immutable`: once true, the data and type never change and it stays
    /// true (the API server enforces it in a cluster, the store in standalone mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub immutable: Option<bool>,
    /// Base64 values, as in Kubernetes.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub data: BTreeMap<String, String>,
    /// Plain values; folded into `data` when applied.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub string_data: BTreeMap<String, String>,
}

// Hand-written so that no `{:?}` anywhere can print a credential.
impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Secret")
            .field("metadata", &self.metadata)
            .field("type", &self.secret_type)
            .field(
                "keys",
                &self
                    .data
                    .keys()
                    .chain(self.string_data.keys())
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl Secret {
    /// Check the object and fold `stringData` into `data`.
    pub fn validate_and_normalize(&mut self) -> Result<(), FieldError> {
        if self.api_version != API_VERSION {
            return Err(FieldError::new(
                "apiVersion",
                format!("{:?}: expected {API_VERSION}", self.api_version),
            ));
        }
        self.metadata.validate()?;
        if self.secret_type != DOCKER_CONFIG_JSON_TYPE {
            return Err(FieldError::new(
                "type",
                format!(
                    "{:?}: only {DOCKER_CONFIG_JSON_TYPE} secrets are supported (registry credentials for pullSecrets)",
                    self.secret_type
                ),
            ));
        }
        for (key, value) in std::mem::take(&mut self.string_data) {
            self.data
                .insert(key, base64::engine::general_purpose::STANDARD.encode(value));
        }
        for key in self.data.keys() {
            if key != DOCKER_CONFIG_JSON_KEY {
                return Err(FieldError::new(
                    format!("data[{key:?}]"),
                    format!(
                        "a {DOCKER_CONFIG_JSON_TYPE} secret holds only {DOCKER_CONFIG_JSON_KEY}"
                    ),
                ));
            }
        }
        // The reason never quotes the value: it is a credential.
        let path = format!("data[{DOCKER_CONFIG_JSON_KEY:?}]");
        let document = self
            .docker_config()
            .ok_or_else(|| FieldError::new(&path, "is required"))?
            .map_err(|reason| FieldError::new(&path, reason))?;
        let parsed: serde_json::Value = serde_json::from_str(&document).map_err(|e| {
            FieldError::new(
                &path,
                format!("is not JSON (line {}, column {})", e.line(), e.column()),
            )
        })?;
        if !parsed
            .get("auths")
            .is_some_and(serde_json::Value::is_object)
        {
            return Err(FieldError::new(
                &path,
                "has no \"auths\" object (docker config.json format)",
            ));
        }
        Ok(())
    }

    /// The docker config.json document, decoded; `None` when absent.
    pub fn docker_config(&self) -> Option<Result<String, String>> {
        let encoded = self.data.get(DOCKER_CONFIG_JSON_KEY)?;
        Some(
            base64::engine::general_purpose::STANDARD
                .decode(encoded.trim())
                .map_err(|_| "is not base64".to_owned())
                .and_then(|bytes| String::from_utf8(bytes).map_err(|_| "is not UTF-8".to_owned())),
        )
    }

    /// The object as API reads show it: keys kept, values replaced.
    pub fn redacted(&self) -> Self {
        let mut shown = self.clone();
        for value in shown.data.values_mut() {
            *value = REDACTED.to_owned();
        }
        shown
    }
}

/// Secret, as the registry (`kinds/mod.rs`) lists it.
pub const INFO: KindInfo = KindInfo {
    name: KIND,
    spellings: &["secrets"],
    namespaced: true,
    read_only: None,
    notes: Some(
        "Kubernetes' Secret of type `kubernetes.io/dockerconfigjson` (`apiVersion: v1`), \
             for ImagePullJobs' `pullSecrets` and pods' `imagePullSecrets`. Values are never \
             shown by reads and go only to the nodes that pull with them.",
    ),
    schema: Some(crate::kind::schema_of::<Secret>),
    crd: None,
    table: crate::table::table_of::<Secret>,
};

impl Object for Secret {
    const INFO: &'static KindInfo = &INFO;
    metadata_field!();

    fn validate(&mut self) -> Result<(), FieldError> {
        self.validate_and_normalize()
    }

    fn spec_differs(&self, old: &Self) -> bool {
        self.data != old.data
            || self.secret_type != old.secret_type
            || self.immutable != old.immutable
    }

    /// As the API server: an immutable secret's data, type and immutability stay.
    fn check_update(&self, old: &Self) -> Result<(), FieldError> {
        if old.immutable != Some(true) {
            return Ok(());
        }
        let changed = if self.immutable != Some(true) {
            Some("immutable")
        } else if self.data != old.data {
            Some("data")
        } else if self.secret_type != old.secret_type {
            Some("type")
        } else {
            None
        };
        match changed {
            Some(field) => Err(FieldError::new(
                field,
                "cannot change: the secret is immutable (delete and create it again)",
            )),
            None => Ok(()),
        }
    }
}

impl Columns for Secret {
    fn header(_wide: bool) -> Vec<&'static str> {
        vec!["NAME", "TYPE", "DATA", "AGE"]
    }

    fn row(&self, _wide: bool, now: SystemTime) -> Vec<String> {
        vec![
            self.metadata.name.clone(),
            self.secret_type.clone(),
            self.data.len().to_string(),
            age(self.metadata.creation_timestamp.as_deref(), now),
        ]
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn secret(extra: &serde_json::Value) -> Result<Secret, String> {
        let mut value = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "registry-login", "namespace": "default"},
            "type": DOCKER_CONFIG_JSON_TYPE,
        });
        value
            .as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let mut secret: Secret = serde_json::from_value(value).map_err(|e| e.to_string())?;
        secret.validate_and_normalize().map_err(|e| e.to_string())?;
        Ok(secret)
    }

    #[test]
    fn string_data_is_folded_and_reads_are_redacted() {
        let document = r#"{"auths":{"reg.example":{"auth":"dXNlcjpzM2NyZXQ="}}}"#;
        let s =
            secret(&serde_json::json!({"stringData": {".dockerconfigjson": document}})).unwrap();
        assert_eq!(s.docker_config().unwrap().unwrap(), document);
        let shown = serde_json::to_string(&s.redacted()).unwrap();
        assert!(
            !shown.contains("dXNlcjpzM2NyZXQ") && shown.contains(REDACTED),
            "{shown}"
        );
        assert!(!format!("{s:?}").contains("auths"));
    }

    #[test]
    fn an_immutable_secret_is_read_and_keeps_its_data() {
        let document = r#"{"auths":{"reg.example":{"auth":"dXNlcjpzM2NyZXQ="}}}"#;
        let old = secret(&serde_json::json!({"immutable": true,
            "stringData": {".dockerconfigjson": document}}))
        .unwrap();
        assert_eq!(old.immutable, Some(true));
        assert!(old.check_update(&old.clone()).is_ok());
        let mut changed = old.clone();
        changed.data.insert(
            DOCKER_CONFIG_JSON_KEY.to_owned(),
            base64::engine::general_purpose::STANDARD.encode(r#"{"auths":{}}"#),
        );
        let err = changed.check_update(&old).unwrap_err().to_string();
        assert!(err.starts_with("data: cannot change"), "{err}");
        let mut mutable_again = old.clone();
        mutable_again.immutable = Some(false);
        let err = mutable_again.check_update(&old).unwrap_err().to_string();
        assert!(err.starts_with("immutable: cannot change"), "{err}");
        let mut now_immutable = old.clone();
        now_immutable.immutable = None;
        assert!(
            old.check_update(&now_immutable).is_ok(),
            "a mutable one may become immutable"
        );
    }

    #[test]
    fn refusals_name_the_field_and_never_the_value() {
        let err =
            secret(&serde_json::json!({"data": {".dockerconfigjson": "c2VjcmV0LW5vdC1qc29u"}}))
                .unwrap_err();
        assert!(
            err.starts_with("data[\".dockerconfigjson\"]: is not JSON"),
            "{err}"
        );
        assert!(!err.contains("secret-not-json"), "{err}");
        let err = secret(&serde_json::json!({"type": "Opaque", "data": {}})).unwrap_err();
        assert!(err.starts_with("type: "), "{err}");
        let err = secret(&serde_json::json!({})).unwrap_err();
        assert!(err.contains("is required"), "{err}");
    }
}
