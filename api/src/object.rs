//! What every kind users apply has in common: its metadata, what an apply takes from the
//! user, validation with field paths, and which changes move its generation or are
//! refused, and (through [`Columns`]) how `get` shows it. The controller's one apply path
//! works on this trait alone.

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::fields::{FieldError, ObjectMeta};
use crate::kind::KindInfo;
use crate::table::Columns;

/// A kind users apply.
pub trait Object:
    Columns + Serialize + DeserializeOwned + PartialEq + Send + Sync + 'static
{
    /// The kind's description (its `INFO`, beside its types).
    const INFO: &'static KindInfo;

    fn metadata(&self) -> &ObjectMeta;
    fn metadata_mut(&mut self) -> &mut ObjectMeta;

    /// Drop what an apply never takes from the user: the status, fields others own.
    fn strip_owned(&mut self) {}

    /// The whole object checked (and put in canonical form where the kind has one);
    /// the first fault, with its field path.
    fn validate(&mut self) -> Result<(), FieldError>;

    /// Whether the spec differs from `old`'s: the generation moves.
    fn spec_differs(&self, old: &Self) -> bool;

    /// Take from the stored `old` what the controller filled in at creation and an
    /// apply of the same document leaves out (so applying it again changes nothing).
    fn keep_filled(&mut self, _old: &Self) {}

    /// Refuse a change the stored object may not take.
    fn check_update(&self, _old: &Self) -> Result<(), FieldError> {
        Ok(())
    }
}

/// An object as an apply takes it, before the store is read: decoded (a type error
/// names its field), what others own stripped, a namespaced kind given the default
/// namespace, and validated whole. The refusal names the object (`what`, as the
/// apply's message does) and the field. Pure: the controller's apply and the fuzz
/// targets both go through it.
pub fn admit<T: Object>(value: serde_json::Value) -> Result<(T, String), (String, FieldError)> {
    let what_of = |namespace: Option<&str>, name: &str| {
        let kind = T::INFO.name;
        match namespace {
            Some(namespace) => format!("{kind} {namespace}/{name}"),
            None => format!("{kind} {name}"),
        }
    };
    let name = value
        .pointer("/metadata/name")
        .and_then(serde_json::Value::as_str)
        .unwrap_or("")
        .to_owned();
    let namespace = T::INFO.namespaced.then(|| {
        value
            .pointer("/metadata/namespace")
            .and_then(serde_json::Value::as_str)
            .unwrap_or(crate::fields::DEFAULT_NAMESPACE)
            .to_owned()
    });
    let mut object: T = crate::strict::decode_strict(value).map_err(|e| {
        (
            what_of(namespace.as_deref(), &name),
            nested(e.path, e.reason),
        )
    })?;
    object.strip_owned();
    let meta = object.metadata_mut();
    // The store's: set by a delete of an object with finalizers.
    meta.deletion_timestamp = None;
    // A deleted pod held back would keep running, a deleted secret keep being handed
    // out: Rigger's own pods and secrets go when deleted.
    if matches!(T::INFO.name, "Pod" | "Secret") && !meta.finalizers.is_empty() {
        let what = what_of(namespace.as_deref(), &meta.name);
        return Err((
            what,
            FieldError::new(
                "metadata.finalizers",
                format!(
                    "not taken on Rigger's own {}s: deleted, they stop at once (a cluster's take them, in Kubernetes mode)",
                    T::INFO.name
                ),
            ),
        ));
    }
    let what = if T::INFO.namespaced {
        let namespace = meta
            .namespace
            .get_or_insert_with(|| crate::fields::DEFAULT_NAMESPACE.to_owned())
            .clone();
        what_of(Some(&namespace), &meta.name)
    } else {
        // Cluster-scoped, as in Kubernetes and Kruise.
        meta.namespace = None;
        what_of(None, &meta.name)
    };
    match object.validate() {
        Ok(()) => Ok((object, what)),
        Err(error) => Err((what, error)),
    }
}

/// A decode error at `path` whose message starts with a path below it (a spec decoded
/// by hand says `completionPolicy.ttlSecondsAfterFinished: ...`): the whole path named
/// as the field.
fn nested(path: String, message: String) -> FieldError {
    let is_path = |text: &str| {
        text.starts_with(|c: char| c.is_ascii_alphabetic())
            && text
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '[' | ']' | '_'))
    };
    match message.split_once(": ") {
        Some((below, reason)) if !path.is_empty() && is_path(below) => {
            FieldError::new(format!("{path}.{below}"), reason)
        }
        _ => FieldError::new(path, message),
    }
}

/// `metadata`/`metadata_mut` for a kind whose metadata is its `metadata` field.
macro_rules! metadata_field {
    () => {
        fn metadata(&self) -> &$crate::fields::ObjectMeta {
            &self.metadata
        }
        fn metadata_mut(&mut self) -> &mut $crate::fields::ObjectMeta {
            &mut self.metadata
        }
    };
}
pub(crate) use metadata_field;
