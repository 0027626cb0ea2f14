//! What every kind users apply has in common: its metadata, what an apply takes from the
//! user, validation with field paths, and which changes move its generation or are
//! refused, and (through [`Columns`]) how `get` shows it. The controller's one apply path
//! works on this trait alone.

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::container_recreate_request::ContainerRecreateRequest;
use crate::fields::{FieldError, ObjectMeta};
use crate::image_list_pull_job::{self, ImageListPullJob};
use crate::image_pull_job::ImagePullJob;
use crate::kind::Kind;
use crate::lifecycle_cooperator::LifecycleCooperator;
use crate::pod::{LIFECYCLE_STATE_LABEL, Pod};
use crate::secret::Secret;
use crate::sidecar_set::SidecarSet;
use crate::table::Columns;

/// A kind users apply.
pub trait Object:
    Columns + Serialize + DeserializeOwned + PartialEq + Send + Sync + 'static
{
    const KIND: Kind;

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
        let kind = T::KIND.name();
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
    let namespace = T::KIND.namespaced().then(|| {
        value
            .pointer("/metadata/namespace")
            .and_then(serde_json::Value::as_str)
            .unwrap_or(crate::fields::DEFAULT_NAMESPACE)
            .to_owned()
    });
    let mut object: T = serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let path = if path == "." { String::new() } else { path };
        (
            what_of(namespace.as_deref(), &name),
            nested(path, e.into_inner().to_string()),
        )
    })?;
    object.strip_owned();
    let meta = object.metadata_mut();
    let what = if T::KIND.namespaced() {
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
        fn metadata(&self) -> &ObjectMeta {
            &self.metadata
        }
        fn metadata_mut(&mut self) -> &mut ObjectMeta {
            &mut self.metadata
        }
    };
}

impl Object for ImagePullJob {
    const KIND: Kind = Kind::ImagePullJob;
    metadata_field!();

    /// The owner label of an ImageListPullJob's jobs is the controller's to set: a job
    /// applied with it does not become a list's (to be replaced or deleted with it).
    fn strip_owned(&mut self) {
        self.status = None;
        self.metadata
            .labels
            .remove(image_list_pull_job::OWNER_LABEL);
    }

    /// A list's job applied again stays the list's.
    fn keep_filled(&mut self, old: &Self) {
        if let Some(owner) = old.metadata.labels.get(image_list_pull_job::OWNER_LABEL) {
            self.metadata
                .labels
                .insert(image_list_pull_job::OWNER_LABEL.to_owned(), owner.clone());
        }
    }

    fn validate(&mut self) -> Result<(), FieldError> {
        ImagePullJob::validate(self)
    }

    fn spec_differs(&self, old: &Self) -> bool {
        self.spec != old.spec
    }

    fn check_update(&self, old: &Self) -> Result<(), FieldError> {
        let immutable = [
            ("spec.image", old.spec.image != self.spec.image),
            ("spec.selector", old.spec.selector != self.spec.selector),
            (
                "spec.podSelector",
                old.spec.pod_selector != self.spec.pod_selector,
            ),
        ];
        match immutable.iter().find(|(_, changed)| *changed) {
            Some((field, _)) => Err(FieldError::new(
                *field,
                "cannot change on an existing job; delete it and apply again",
            )),
            None => Ok(()),
        }
    }
}

impl Object for ContainerRecreateRequest {
    const KIND: Kind = Kind::ContainerRecreateRequest;
    metadata_field!();

    fn strip_owned(&mut self) {
        self.status = None;
    }

    fn validate(&mut self) -> Result<(), FieldError> {
        ContainerRecreateRequest::validate(self)
    }

    fn spec_differs(&self, old: &Self) -> bool {
        self.spec != old.spec
    }

    /// The statusContext filled in from the pod's status at creation.
    fn keep_filled(&mut self, old: &Self) {
        for container in &mut self.spec.containers {
            if container.status_context.is_none()
                && let Some(stored) = old
                    .spec
                    .containers
                    .iter()
                    .find(|c| c.name == container.name)
            {
                container.status_context.clone_from(&stored.status_context);
            }
        }
    }

    /// Like Kruise's, a request cannot change once created.
    fn check_update(&self, old: &Self) -> Result<(), FieldError> {
        if self.spec == old.spec {
            Ok(())
        } else {
            Err(FieldError::new(
                "spec",
                "cannot change once created; delete the request and apply a new one",
            ))
        }
    }
}

impl Object for Secret {
    const KIND: Kind = Kind::Secret;
    metadata_field!();

    fn validate(&mut self) -> Result<(), FieldError> {
        self.validate_and_normalize()
    }

    fn spec_differs(&self, old: &Self) -> bool {
        self.data != old.data || self.secret_type != old.secret_type
    }
}

impl Object for Pod {
    const KIND: Kind = Kind::Pod;
    metadata_field!();

    fn strip_owned(&mut self) {
        self.status = None;
        // Shown on reads, owned by the agent: a re-applied copy must not store it.
        self.metadata.labels.remove(LIFECYCLE_STATE_LABEL);
    }

    fn validate(&mut self) -> Result<(), FieldError> {
        crate::pod::validate(self)
    }

    fn spec_differs(&self, old: &Self) -> bool {
        self.spec != old.spec
    }
}

impl Object for LifecycleCooperator {
    const KIND: Kind = Kind::LifecycleCooperator;
    metadata_field!();

    fn validate(&mut self) -> Result<(), FieldError> {
        LifecycleCooperator::validate(self)
    }

    fn spec_differs(&self, old: &Self) -> bool {
        self.spec != old.spec
    }
}

impl Object for SidecarSet {
    const KIND: Kind = Kind::SidecarSet;
    metadata_field!();

    fn strip_owned(&mut self) {
        self.status = None;
    }

    fn validate(&mut self) -> Result<(), FieldError> {
        SidecarSet::validate(self)
    }

    fn spec_differs(&self, old: &Self) -> bool {
        self.spec != old.spec
    }
}

impl Object for ImageListPullJob {
    const KIND: Kind = Kind::ImageListPullJob;
    metadata_field!();

    fn strip_owned(&mut self) {
        self.status = None;
    }

    fn validate(&mut self) -> Result<(), FieldError> {
        ImageListPullJob::validate(self)
    }

    fn spec_differs(&self, old: &Self) -> bool {
        self.spec != old.spec
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn admission_names_the_field_even_inside_a_spec_decoded_by_hand() {
        let list = serde_json::json!({
            "apiVersion": "apps.kruise.io/v1alpha1", "kind": "ImageListPullJob",
            "metadata": {"name": "l"},
            "spec": {"images": ["r.example/a:1"], "completionPolicy": {"type": "Always", "ttlSecondsAfterFinished": ""}},
        });
        let (what, error) = admit::<ImageListPullJob>(list).unwrap_err();
        assert_eq!(what, "ImageListPullJob default/l");
        assert_eq!(error.path, "spec.completionPolicy.ttlSecondsAfterFinished");
        let job = serde_json::json!({
            "apiVersion": "apps.kruise.io/v1alpha1", "kind": "ImagePullJob",
            "metadata": {"name": "j", "namespace": "team"},
            "spec": {"image": "r.example/a:1", "pullPolicy": {"timeoutSeconds": -1}},
        });
        let (what, error) = admit::<ImagePullJob>(job).unwrap_err();
        assert_eq!(what, "ImagePullJob team/j");
        assert_eq!(error.path, "spec.pullPolicy.timeoutSeconds");
    }
}
