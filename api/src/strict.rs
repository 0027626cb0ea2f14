//! Users' input decoded strictly: a field the type does not have is refused with its
//! path. The types themselves take unknown fields leniently, since the same types travel
//! between Rigger's components, where a field added by a newer release must be ignored by
//! the older side (the version skew policy, docs/operator-guide.md); strictness is the
//! admission's, found by `serde_ignored` as the value is decoded.

use serde::de::DeserializeOwned;

use crate::fields::FieldError;

/// `value` decoded as `T`, refusing a field `T` does not have. The error's path is that
/// of the field (`spec.containers[0].imagePullPolicy`, empty for the whole value); a
/// field unknown is reported only when the rest decodes.
pub fn decode_strict<T: DeserializeOwned>(value: serde_json::Value) -> Result<T, FieldError> {
    let mut unknown: Option<(String, String)> = None;
    let mut note = |path: serde_ignored::Path<'_>| {
        if unknown.is_none() {
            let key = match &path {
                serde_ignored::Path::Map { key, .. } => key.clone(),
                _ => path.to_string(),
            };
            unknown = Some((path_text(&path), key));
        }
    };
    let decoded =
        serde_path_to_error::deserialize(serde_ignored::Deserializer::new(value, &mut note))
            .map_err(|e| {
                let path = e.path().to_string();
                let path = if path == "." { String::new() } else { path };
                FieldError::new(path, e.into_inner().to_string())
            })?;
    match unknown {
        Some((path, key)) => Err(FieldError::new(path, format!("unknown field `{key}`"))),
        None => Ok(decoded),
    }
}

/// A path as serde_path_to_error writes it: `a.b[0].c`, the root empty, options and
/// newtypes invisible.
fn path_text(path: &serde_ignored::Path<'_>) -> String {
    use serde_ignored::Path;
    match path {
        Path::Root => String::new(),
        Path::Seq { parent, index } => format!("{}[{index}]", path_text(parent)),
        Path::Map { parent, key } => match path_text(parent) {
            parent if parent.is_empty() => key.clone(),
            parent => format!("{parent}.{key}"),
        },
        Path::Some { parent }
        | Path::NewtypeStruct { parent }
        | Path::NewtypeVariant { parent } => path_text(parent),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use rigger_proto::pod::Pod;

    #[test]
    fn an_unknown_field_is_refused_with_its_path_and_the_types_alone_take_it() {
        let written = serde_json::json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
            "spec": {"hostNetwork": true, "containers": [
                {"name": "a", "image": "r.example/a:1"},
                {"name": "b", "image": "r.example/b:1", "imagePullPolicyy": "Always"}
            ]}
        });
        let refused = decode_strict::<Pod>(written.clone()).unwrap_err();
        assert_eq!(refused.path, "spec.containers[1].imagePullPolicyy");
        assert_eq!(refused.reason, "unknown field `imagePullPolicyy`");
        // The wire's side: a field from a newer release is passed by.
        let pod: Pod = serde_json::from_value(written).unwrap();
        assert_eq!(pod.spec.containers.len(), 2);
    }

    #[test]
    fn a_type_error_names_its_field_and_a_known_value_decodes() {
        let refused = decode_strict::<Pod>(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {"a": 1}},
            "spec": {"containers": []}
        }))
        .unwrap_err();
        assert_eq!(refused.path, "metadata.labels.a");
        let pod = decode_strict::<Pod>(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "finalizers": []},
            "spec": {"containers": [{"name": "a", "image": "r.example/a:1"}]}
        }))
        .unwrap();
        assert_eq!(pod.metadata.name, "p");
    }
}
