//! The reference page of a kind (`riggerctl explain KIND`, `docs/reference/<kind>.md`),
//! generated from its types' JSON Schema (schemars reads the types and their doc
//! comments), so it cannot go stale: every field with its type, what it means and its
//! default, under a short note of what differs from OpenKruise.

use serde_json::Value;

use crate::kinds::Kind;

/// The kinds with a reference page: every kind users apply or read but Node (whose
/// shape is Kubernetes' and which is never applied).
pub fn documented() -> impl Iterator<Item = Kind> {
    Kind::ALL
        .into_iter()
        .filter(|kind| kind.info().notes.is_some())
}

/// The JSON Schema of `kind`'s type (none for a Node, which is never applied).
pub fn schema(kind: Kind) -> Option<Value> {
    kind.info().schema.map(|schema| schema())
}

/// `kind`'s reference page as Markdown; `None` for kinds without one.
pub fn page(kind: Kind) -> Option<String> {
    let root = schema(kind)?;
    let mut rows = Vec::new();
    walk(&root, &root, "", &mut Vec::new(), &mut rows);
    let mut out = format!(
        "# {kind}\n\n<!-- Generated from the types by `riggerctl explain {}` (`make docs`); a test fails when it is stale. -->\n\n{}\n\n| field | type | default | description |\n|---|---|---|---|\n",
        kind.name().to_ascii_lowercase(),
        kind.info().notes.unwrap_or_default()
    );
    for row in rows {
        out.push_str(&format!(
            "| `{}` | {} | {} | {} |\n",
            row.path, row.kind, row.default, row.description
        ));
    }
    Some(out)
}

struct Row {
    path: String,
    kind: String,
    default: String,
    description: String,
}

/// The schema `reference` points at (`#/$defs/Name`), or `schema` itself.
fn resolve<'a>(root: &'a Value, schema: &'a Value) -> (&'a Value, Option<&'a str>) {
    match schema["$ref"].as_str() {
        Some(reference) => {
            let name = reference.rsplit('/').next().unwrap_or_default();
            (&root["$defs"][name], Some(name))
        }
        None => (schema, None),
    }
}

/// The non-null alternative of an optional (`anyOf: [X, null]`), or `schema`.
fn unwrap_optional(schema: &Value) -> &Value {
    let alternatives = schema["anyOf"]
        .as_array()
        .or_else(|| schema["oneOf"].as_array());
    match alternatives.map(|a| a.iter().filter(|s| s["type"] != "null").collect::<Vec<_>>()) {
        Some(left) if left.len() == 1 => left[0],
        _ => schema,
    }
}

fn type_name(root: &Value, schema: &Value) -> String {
    let (schema, name) = resolve(root, unwrap_optional(schema));
    if let Some(values) = schema["enum"].as_array() {
        let values: Vec<String> = values
            .iter()
            .filter_map(|v| v.as_str().map(|s| format!("`{s}`")))
            .collect();
        return values.join(" \\| ");
    }
    if let Some(alternatives) = schema["oneOf"].as_array().or(schema["anyOf"].as_array()) {
        // An enum whose variants carry doc comments comes as alternatives of a `const`
        // each (or an `enum` of those without): all of them are its values.
        let values: Option<Vec<String>> = alternatives
            .iter()
            .map(|a| match (a["const"].as_str(), a["enum"].as_array()) {
                (Some(value), _) => Some(vec![format!("`{value}`")]),
                (None, Some(values)) => values
                    .iter()
                    .map(|v| v.as_str().map(|v| format!("`{v}`")))
                    .collect(),
                (None, None) => None,
            })
            .collect::<Option<Vec<_>>>()
            .map(|each| each.concat());
        if let Some(values) = values.filter(|v| !v.is_empty()) {
            return values.join(" \\| ");
        }
        if name == Some("IntOrPercent") {
            return "int or percent".to_owned();
        }
        let kinds: Vec<String> = alternatives
            .iter()
            .filter(|a| a["type"] != "null")
            .map(|a| type_name(root, a))
            .collect();
        return kinds.join(" or ");
    }
    let kind = match &schema["type"] {
        Value::String(t) => t.clone(),
        Value::Array(types) => types
            .iter()
            .filter_map(Value::as_str)
            .filter(|t| *t != "null")
            .collect::<Vec<_>>()
            .join(" or "),
        _ if schema["properties"].is_object() => "object".to_owned(),
        _ => "any".to_owned(),
    };
    match kind.as_str() {
        "array" => format!("[]{}", type_name(root, &schema["items"])),
        "object" if schema["additionalProperties"].is_object() => {
            format!(
                "map of {}",
                type_name(root, &schema["additionalProperties"])
            )
        }
        _ => kind,
    }
}

fn one_line(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

/// Rows for `schema`'s fields under `prefix`, depth first; `on_path` stops recursion.
fn walk<'a>(
    root: &'a Value,
    schema: &'a Value,
    prefix: &str,
    on_path: &mut Vec<&'a str>,
    rows: &mut Vec<Row>,
) {
    let (schema, name) = resolve(root, unwrap_optional(schema));
    let items_name = resolve(root, unwrap_optional(&schema["items"])).1;
    // Kubernetes' own types (a SidecarSet's containers' mounts, its volumes): their
    // fields are Kubernetes' manual's (`kubectl explain pod.spec`), not repeated here.
    if name
        .or(items_name)
        .is_some_and(|n| n.starts_with("io.k8s."))
    {
        return;
    }
    if let Some(name) = name {
        if on_path.contains(&name) {
            return;
        }
        on_path.push(name);
    }
    // What the fields live in: an object's properties, an array's items, a map's values.
    let (fields, suffix) = if schema["type"] == "array" {
        (resolve(root, unwrap_optional(&schema["items"])).0, "[]")
    } else if schema["additionalProperties"].is_object() {
        (
            resolve(root, unwrap_optional(&schema["additionalProperties"])).0,
            "{}",
        )
    } else {
        (schema, "")
    };
    if let Some(properties) = fields["properties"].as_object() {
        let required: Vec<&str> = fields["required"]
            .as_array()
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        for (field, field_schema) in properties {
            let path = if prefix.is_empty() {
                field.clone()
            } else {
                format!("{prefix}{suffix}.{field}")
            };
            let resolved = resolve(root, unwrap_optional(field_schema)).0;
            let description = field_schema["description"]
                .as_str()
                .or(resolved["description"].as_str())
                .unwrap_or_default();
            let mut description = one_line(description);
            if required.contains(&field.as_str()) && !description.contains("required") {
                description = if description.is_empty() {
                    "Required.".to_owned()
                } else {
                    format!("Required. {description}")
                };
            }
            let default = match &field_schema["default"] {
                Value::Null => String::new(),
                value => format!("`{value}`"),
            };
            rows.push(Row {
                path: path.clone(),
                kind: type_name(root, field_schema),
                default,
                description,
            });
            walk(root, field_schema, &path, on_path, rows);
        }
    }
    if name.is_some() {
        on_path.pop();
    }
}

/// Every number a user can apply in `kind`, as JSON pointers into an object
/// (`/spec/pullPolicy/timeoutSeconds`; an array's first item as `/0`), read from its
/// schema: integer fields and the numeric side of int-or-percent and int-or-name ones.
/// What the status and `metadata.generation` hold is the controller's, not the user's,
/// and is left out.
pub fn numeric_fields(kind: Kind) -> Vec<String> {
    let Some(root) = schema(kind) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    numbers(&root, &root, String::new(), &mut Vec::new(), &mut out);
    out.retain(|pointer| !pointer.starts_with("/status/") && pointer != "/metadata/generation");
    out
}

fn is_number(schema: &Value) -> bool {
    match &schema["type"] {
        Value::String(t) => t == "integer" || t == "number",
        Value::Array(types) => types.iter().any(|t| t == "integer" || t == "number"),
        _ => false,
    }
}

fn numbers<'a>(
    root: &'a Value,
    schema: &'a Value,
    pointer: String,
    on_path: &mut Vec<&'a str>,
    out: &mut Vec<String>,
) {
    let (schema, name) = resolve(root, unwrap_optional(schema));
    let items_name = resolve(root, unwrap_optional(&schema["items"])).1;
    // Kubernetes' own types (a SidecarSet's containers' mounts, its volumes): their
    // fields are Kubernetes' manual's (`kubectl explain pod.spec`), not repeated here.
    if name
        .or(items_name)
        .is_some_and(|n| n.starts_with("io.k8s."))
    {
        return;
    }
    if let Some(name) = name {
        if on_path.contains(&name) {
            return;
        }
        on_path.push(name);
    }
    let alternatives = schema["anyOf"].as_array().or(schema["oneOf"].as_array());
    if is_number(schema)
        || alternatives.is_some_and(|a| a.iter().any(|a| is_number(resolve(root, a).0)))
    {
        out.push(pointer);
    } else if schema["type"] == "array" {
        numbers(root, &schema["items"], format!("{pointer}/0"), on_path, out);
    } else if let Some(properties) = schema["properties"].as_object() {
        for (field, field_schema) in properties {
            numbers(
                root,
                field_schema,
                format!("{pointer}/{field}"),
                on_path,
                out,
            );
        }
    }
    if name.is_some() {
        on_path.pop();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_numbers_of_a_kind_are_found_in_its_schema() {
        let job = numeric_fields(Kind::ImagePullJob);
        for expected in [
            "/spec/pullPolicy/timeoutSeconds",
            "/spec/pullPolicy/backoffLimit",
            "/spec/completionPolicy/activeDeadlineSeconds",
            "/spec/completionPolicy/ttlSecondsAfterFinished",
            "/spec/parallelism",
        ] {
            assert!(job.contains(&expected.to_owned()), "{expected}: {job:?}");
        }
        assert!(!job.iter().any(|p| p.starts_with("/status")), "{job:?}");
        let pod = numeric_fields(Kind::Pod);
        for expected in [
            "/spec/terminationGracePeriodSeconds",
            "/spec/containers/0/ports/0/containerPort",
            "/spec/containers/0/readinessProbe/periodSeconds",
            "/spec/containers/0/lifecycle/preStop/httpGet/port",
        ] {
            assert!(pod.contains(&expected.to_owned()), "{expected}: {pod:?}");
        }
        let set = numeric_fields(Kind::SidecarSet);
        for expected in [
            "/spec/updateStrategy/maxUnavailable",
            "/spec/updateStrategy/priorityStrategy/weightPriority/0/weight",
            "/spec/revisionHistoryLimit",
        ] {
            assert!(set.contains(&expected.to_owned()), "{expected}: {set:?}");
        }
        assert!(numeric_fields(Kind::Secret).is_empty());
    }

    #[test]
    fn pages_list_every_field_with_its_meaning() {
        let page = page(Kind::SidecarSet).unwrap();
        for expected in [
            "| `spec.initContainers[].podInjectPolicy` | `BeforeAppContainer` \\| `AfterAppContainer`",
            "| `spec.containers[].transferEnv[].sourceContainerNameFrom.fieldRef.fieldPath` | string",
            "| `spec.updateStrategy.partition` | int or percent",
            "| `spec.injectionStrategy.revision.customVersion` | string",
            "| `status.latestRevision` | string",
            "| `spec.containers[].image` | string |",
            "| `spec.containers[].volumeMounts` | []",
            "| `spec.initContainers[].restartPolicy` | string |",
            "| `spec.volumes` | []",
        ] {
            assert!(page.contains(expected), "{expected}\n{page}");
        }
        let list = super::page(Kind::ImageListPullJob).unwrap();
        assert!(list.contains("| `spec.images` | []string"), "{list}");
        assert!(!list.contains("| `spec.image` |"), "{list}");
        // An enum with documented variants: every value, as an enum without.
        let job = super::page(Kind::ImagePullJob).unwrap();
        assert!(
            job.contains(
                "| `status.nodes[].phase` | `Pulling` \\| `Succeeded` \\| `Failed` \\| `Waiting` |"
            ),
            "{job}"
        );
        assert!(super::page(Kind::Node).is_none());
    }

    /// docs/reference/ holds each page as generated: a changed type or doc comment
    /// comes with `make docs`.
    #[test]
    fn the_committed_pages_are_current() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/reference");
        for kind in documented() {
            let path = dir.join(format!("{}.md", kind.name().to_ascii_lowercase()));
            let committed = std::fs::read_to_string(&path).unwrap_or_default();
            assert!(
                committed == page(kind).unwrap(),
                "{} is stale: run `make docs`",
                path.display()
            );
        }
    }
}
