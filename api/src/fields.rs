//! The field types and checks every kind shares: API versions, metadata and label
//! rules, label selectors, conditions, ports, `IntOrPercent`, and the field error that
//! names a field's path. The ground floor of the crate: it knows no kind.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Rigger's API group and version.
pub const API_VERSION: &str = "rigger.dev/v1alpha1";
/// OpenKruise's, accepted as-is for the kinds Kruise has, so its YAML applies unchanged.
pub const KRUISE_API_VERSION: &str = "apps.kruise.io/v1alpha1";
/// OpenKruise's stored version since Kruise 1.9, for the kinds whose v1beta1 Rigger reads.
pub const KRUISE_API_VERSION_V1BETA1: &str = "apps.kruise.io/v1beta1";

/// Kinds OpenKruise also has accept its API group as well as Rigger's.
pub fn check_kruise_api_version(api_version: &str) -> Result<(), FieldError> {
    check_api_version(api_version, &[API_VERSION, KRUISE_API_VERSION])
}

/// [`check_kruise_api_version`] for the kinds whose Kruise v1beta1 Rigger reads too.
pub fn check_kruise_v1beta1_api_version(api_version: &str) -> Result<(), FieldError> {
    check_api_version(
        api_version,
        &[API_VERSION, KRUISE_API_VERSION, KRUISE_API_VERSION_V1BETA1],
    )
}

/// `api_version` is one of `accepted`; the object keeps the one it was applied with, so
/// `get -o yaml` answers in it.
pub fn check_api_version(api_version: &str, accepted: &[&str]) -> Result<(), FieldError> {
    if accepted.contains(&api_version) {
        Ok(())
    } else {
        Err(FieldError::new(
            "apiVersion",
            format!("{api_version:?}: expected one of {}", accepted.join(", ")),
        ))
    }
}

/// Objects applied without `metadata.namespace` land here, as with kubectl.
pub const DEFAULT_NAMESPACE: &str = "default";

/// Kubernetes' condition shape (`status.conditions[]`), what `riggerctl wait` reads.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(rename = "type")]
    pub kind: String,
    /// "True", "False" or "Unknown".
    pub status: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
}

/// A refused object: the field at fault and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {reason}")]
pub struct FieldError {
    /// e.g. `spec.selector.matchExpressions[0].operator`
    pub path: String,
    pub reason: String,
}

impl FieldError {
    pub fn new(path: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            reason: reason.into(),
        }
    }
}

/// The largest count or number of seconds any field takes: Kubernetes' and Kruise's
/// `int32`. Valid Kruise YAML never goes past it, and every deadline made from it stays
/// far from the end of a clock's range.
pub const MAX_INT32: u64 = i32::MAX as u64;

/// `value` of the field at `path` within `min..=max`, or the error saying so (Kubernetes'
/// wording).
pub fn check_range(path: &str, value: u64, min: u64, max: u64) -> Result<(), FieldError> {
    if (min..=max).contains(&value) {
        Ok(())
    } else {
        Err(FieldError::new(
            path,
            format!("must be between {min} and {max}, inclusive (got {value})"),
        ))
    }
}

pub use rigger_proto::pod::{IntOrName, ObjectMeta};

/// Validation of the shared metadata type.
pub trait ValidateMeta {
    /// Names are DNS-1123 subdomains, as in Kubernetes.
    fn validate(&self) -> Result<(), FieldError>;
}

impl ValidateMeta for ObjectMeta {
    fn validate(&self) -> Result<(), FieldError> {
        check_dns_subdomain(&self.name).map_err(|r| FieldError::new("metadata.name", r))?;
        if let Some(namespace) = &self.namespace {
            check_dns_subdomain(namespace).map_err(|r| FieldError::new("metadata.namespace", r))?;
        }
        for key in self.labels.keys() {
            check_label_key(key)
                .map_err(|r| FieldError::new(format!("metadata.labels[{key:?}]"), r))?;
        }
        // Kubernetes' rule: a finalizer is a qualified name (`example.com/cleanup`).
        for (i, finalizer) in self.finalizers.iter().enumerate() {
            check_label_key(finalizer).map_err(|_| {
                FieldError::new(
                    format!("metadata.finalizers[{i}]"),
                    format!("{finalizer:?} is not a qualified name (DOMAIN/NAME)"),
                )
            })?;
        }
        for (i, owner) in self.owner_references.iter().enumerate() {
            for (field, value) in [
                ("apiVersion", &owner.api_version),
                ("kind", &owner.kind),
                ("name", &owner.name),
                ("uid", &owner.uid),
            ] {
                if value.is_empty() {
                    return Err(FieldError::new(
                        format!("metadata.ownerReferences[{i}].{field}"),
                        "is required",
                    ));
                }
            }
        }
        if self
            .owner_references
            .iter()
            .filter(|o| o.controller == Some(true))
            .count()
            > 1
        {
            return Err(FieldError::new(
                "metadata.ownerReferences",
                "only one reference can have controller set to true",
            ));
        }
        Ok(())
    }
}

pub fn check_dns_subdomain(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not a valid name (lowercase letters, digits, '-' and '.', at most 253, alphanumeric at both ends)"
        ))
    }
}

/// A DNS label, as namespaces are named: a subdomain of one part, at most 63 long.
pub fn check_dns_label(name: &str) -> Result<(), String> {
    check_dns_subdomain(name)?;
    if name.len() > 63 || name.contains('.') {
        return Err(format!(
            "{name:?} is not a valid DNS label (no '.', at most 63 characters)"
        ));
    }
    Ok(())
}

/// `[prefix/]name`, name up to 63 of `[A-Za-z0-9._-]`, alphanumeric at both ends.
pub fn check_label_key(key: &str) -> Result<(), String> {
    let name = key.rsplit_once('/').map_or(key, |(prefix, name)| {
        if check_dns_subdomain(prefix).is_err() {
            return "";
        }
        name
    });
    if check_label_value(name) && !name.is_empty() {
        Ok(())
    } else {
        Err(format!("{key:?} is not a valid label key"))
    }
}

/// A label's key ([`check_label_key`]) and value ([`check_label_value`]).
pub fn check_label(key: &str, value: &str) -> Result<(), String> {
    check_label_key(key)?;
    if check_label_value(value) {
        Ok(())
    } else {
        Err(format!("{value:?} is not a valid label value"))
    }
}

pub fn check_label_value(value: &str) -> bool {
    value.is_empty()
        || (value.len() <= 63
            && value
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
            && value.starts_with(|c: char| c.is_ascii_alphanumeric())
            && value.ends_with(|c: char| c.is_ascii_alphanumeric()))
}

/// Kubernetes' label selector: every `matchLabels` pair and every expression must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LabelSelector {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub match_labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_expressions: Vec<LabelSelectorRequirement>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LabelSelectorRequirement {
    pub key: String,
    pub operator: SelectorOperator,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum SelectorOperator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

impl LabelSelector {
    pub fn is_empty(&self) -> bool {
        self.match_labels.is_empty() && self.match_expressions.is_empty()
    }

    pub fn validate(&self, path: &str) -> Result<(), FieldError> {
        for (key, value) in &self.match_labels {
            check_label(key, value)
                .map_err(|r| FieldError::new(format!("{path}.matchLabels[{key:?}]"), r))?;
        }
        for (i, requirement) in self.match_expressions.iter().enumerate() {
            let at = format!("{path}.matchExpressions[{i}]");
            check_label_key(&requirement.key)
                .map_err(|r| FieldError::new(format!("{at}.key"), r))?;
            let needs_values = matches!(
                requirement.operator,
                SelectorOperator::In | SelectorOperator::NotIn
            );
            if needs_values == requirement.values.is_empty() {
                return Err(FieldError::new(
                    format!("{at}.values"),
                    if needs_values {
                        "must not be empty for In and NotIn"
                    } else {
                        "must be empty for Exists and DoesNotExist"
                    },
                ));
            }
        }
        Ok(())
    }

    /// Whether `labels` satisfy the selector (an empty selector matches everything).
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.match_labels
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
            && self.match_expressions.iter().all(|r| {
                let value = labels.get(&r.key);
                match r.operator {
                    SelectorOperator::In => value.is_some_and(|v| r.values.contains(v)),
                    SelectorOperator::NotIn => value.is_none_or(|v| !r.values.contains(v)),
                    SelectorOperator::Exists => value.is_some(),
                    SelectorOperator::DoesNotExist => value.is_none(),
                }
            })
    }
}

/// Validation of ports by number or name.
pub trait ValidatePort {
    fn validate(&self, path: &str) -> Result<(), FieldError>;
}

impl ValidatePort for IntOrName {
    fn validate(&self, path: &str) -> Result<(), FieldError> {
        match self {
            Self::Int(0) => Err(FieldError::new(path, "must be 1-65535")),
            Self::Name(name)
                if name.is_empty()
                    || name.len() > 15
                    || !name
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-') =>
            {
                Err(FieldError::new(
                    path,
                    format!("{name:?} is neither a port number nor a port name"),
                ))
            }
            _ => Ok(()),
        }
    }
}

/// A short hash (10 hex digits of SHA-256) naming a version of some content: a
/// SidecarSet's containers, a revision, an image list's job or template.
pub(crate) fn short_hash(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    hex::encode(&sha2::Sha256::digest(bytes)[..5])
}

/// An int or a percentage string (`"25%"`), as Kubernetes' `IntOrString` for counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntOrPercent {
    Int(u32),
    Percent(u32),
}

impl IntOrPercent {
    /// The count for `total` (percentages round up, and are at least 1 for any nonzero
    /// percentage, so `1%` of 10 nodes still lets one pull).
    pub fn of(self, total: usize) -> usize {
        match self {
            Self::Int(n) => n as usize,
            Self::Percent(p) => (total * p as usize).div_ceil(100),
        }
    }
}

impl schemars::JsonSchema for IntOrPercent {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "IntOrPercent".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "A count, or a percentage such as \"25%\".",
            "anyOf": [
                {"type": "integer", "minimum": 0},
                {"type": "string", "pattern": "^[0-9]+%$"}
            ]
        })
    }
}

impl Serialize for IntOrPercent {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Int(n) => serializer.serialize_u32(*n),
            Self::Percent(p) => serializer.serialize_str(&format!("{p}%")),
        }
    }
}

impl<'de> Deserialize<'de> for IntOrPercent {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(i64),
            Big(u64),
            Text(String),
        }
        let out_of_range = |n: &dyn std::fmt::Display| {
            serde::de::Error::custom(format!(
                "{n} is not a count: must be between 0 and {MAX_INT32}, inclusive"
            ))
        };
        match Raw::deserialize(deserializer)? {
            Raw::Int(n) => u32::try_from(n)
                .ok()
                .filter(|n| u64::from(*n) <= MAX_INT32)
                .map(Self::Int)
                .ok_or_else(|| out_of_range(&n)),
            Raw::Big(n) => Err(out_of_range(&n)),
            Raw::Text(text) => {
                let percent = text
                    .strip_suffix('%')
                    .and_then(|p| p.parse::<u32>().ok())
                    .filter(|p| *p <= 100)
                    .ok_or_else(|| {
                        serde::de::Error::custom(format!(
                            "{text:?} is neither a count nor a percentage like \"25%\""
                        ))
                    })?;
                Ok(Self::Percent(percent))
            }
        }
    }
}
