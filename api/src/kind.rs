//! What a kind is, as data: its name, kubectl's spellings of it, its scope, how it is
//! shown and documented. Each kind declares its own [`KindInfo`] beside its types
//! (`kinds/<kind>.rs`); the registry (`kinds/mod.rs`, with the `Kind` enum) lists them.
//! Nothing here knows any kind, so every layer of the crate may use it.

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
    pub crd: Option<&'static crate::crd::CrdInfo>,
    /// `get`'s table of objects of this kind.
    pub table: fn(&[Value], TableOptions) -> Result<Table, UnreadableRow>,
}

/// A type's JSON Schema: a kind's [`KindInfo::schema`] is `schema_of::<ItsType>`.
pub fn schema_of<T: schemars::JsonSchema>() -> Value {
    schemars::schema_for!(T).to_value()
}
