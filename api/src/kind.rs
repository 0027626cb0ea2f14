//! What a kind is, as data: its name, kubectl's spellings of it, its scope, how it is
//! shown and documented. Each kind declares its own [`KindInfo`] beside its types
//! (`kinds/<kind>.rs`); the registry (`kinds/mod.rs`, with the `Kind` enum) lists them.
//! How a kind is served as a custom resource ([`CrdInfo`]) is data of the same sort;
//! `crd` turns it into CustomResourceDefinitions. Nothing here knows any kind, so every
//! layer of the crate may use it.

use serde_json::Value;

use crate::table::{Table, TableOptions, UnreadableRow};

/// Everything the crate's users need to know about a kind without its type.
#[derive(Debug)]
pub struct KindInfo {
    /// As in `kind:` (`ImagePullJob`).
    pub name: &'static str,
    /// kubectl's other spellings, lowercase: the plural first, then short names.
    pub spellings: &'static [&'static str],
    /// Nodes, NodeImages and SidecarSets (as in Kubernetes and Kruise) belong to no
    /// namespace.
    pub namespaced: bool,
    /// Why users never apply or delete it (`None`: they do).
    pub read_only: Option<&'static str>,
    /// What its reference page says before the fields (`None`: it has no page).
    pub notes: Option<&'static str>,
    /// Its type's JSON Schema (`None` for a kind whose shape is Kubernetes' own).
    pub schema: Option<fn() -> Value>,
    /// How it is served as a Kubernetes custom resource (`None`: the kind is the
    /// cluster's own, such as Pod, Node and Secret).
    pub crd: Option<&'static CrdInfo>,
    /// `get`'s table of objects of this kind.
    pub table: fn(&[Value], TableOptions) -> Result<Table, UnreadableRow>,
}

/// A type's JSON Schema: a kind's [`KindInfo::schema`] is `schema_of::<ItsType>`.
pub fn schema_of<T: schemars::JsonSchema>() -> Value {
    schemars::schema_for!(T).to_value()
}

/// Kruise's API group, where its kinds are served.
pub const KRUISE_GROUP: &str = "apps.kruise.io";
/// The group of Rigger's own kinds (LifecycleCooperator).
pub const RIGGER_GROUP: &str = "rigger.dev";

/// How a kind is served as a custom resource.
#[derive(Debug)]
pub struct CrdInfo {
    pub group: &'static str,
    /// The versions served, oldest first; the last is the one stored (Kruise stores
    /// v1beta1 since 1.9). Every version has the kind's one schema: Rigger's types
    /// accept each version's fields, so no conversion is needed between them.
    pub versions: &'static [&'static str],
    /// kubectl's short names, as Kruise declares them (only `crr`).
    pub short_names: &'static [&'static str],
    /// `kubectl get`'s columns (Kruise's), besides NAME.
    pub columns: &'static [PrinterColumn],
}

/// One column of `kubectl get`.
#[derive(Debug)]
pub struct PrinterColumn {
    pub name: &'static str,
    /// `integer`, `string` or `date`.
    pub kind: &'static str,
    pub json_path: &'static str,
    pub description: &'static str,
    /// Shown in this version only (Kruise's v1alpha1 ImagePullJob has MESSAGE).
    pub only_in: Option<&'static str>,
}

/// The AGE column every kind ends with.
pub const AGE: PrinterColumn = PrinterColumn {
    name: "AGE",
    kind: "date",
    json_path: ".metadata.creationTimestamp",
    description: "When the object was created.",
    only_in: None,
};

impl CrdInfo {
    /// The version the API server stores.
    pub fn storage_version(&self) -> &'static str {
        self.versions.last().copied().unwrap_or("v1alpha1")
    }

    /// `group/version` of the stored version, as in an object's `apiVersion`.
    pub fn storage_api_version(&self) -> String {
        format!("{}/{}", self.group, self.storage_version())
    }
}
