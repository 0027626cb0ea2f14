//! A kind's JSON Schema (schemars, draft 2020-12) as the *structural* OpenAPI v3 schema a
//! CustomResourceDefinition needs: every `$ref` inlined, `Option`s as `nullable`, unions
//! Kubernetes can express (string enums, int-or-string) in its own words, and every node
//! typed. What Kubernetes cannot express structurally is kept open
//! (`x-kubernetes-preserve-unknown-fields`) rather than guessed: the controller still
//! validates every object with the kind's own checks.
//!
//! Pure: JSON in, JSON out, no I/O.

use serde_json::{Map, Value, json};

/// How deep `$ref`s may nest before a schema is taken as recursive and kept open.
const MAX_DEPTH: usize = 32;

/// `schema` (a schemars root, with its `$defs`) as a structural schema for a CRD's
/// `openAPIV3Schema`. `metadata` becomes `type: object`, as the API server requires.
pub fn structural_schema(schema: &Value) -> Value {
    let defs = schema
        .get("$defs")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let converter = Converter { defs: &defs };
    let mut root = converter.convert(schema, &mut Vec::new());
    if let Some(properties) = root.get_mut("properties").and_then(Value::as_object_mut) {
        if properties.contains_key("metadata") {
            properties.insert("metadata".into(), json!({"type": "object"}));
        }
        // The API server sets these; a schema that requires them refuses nothing useful.
        for key in ["apiVersion", "kind"] {
            if properties.contains_key(key) {
                properties.insert(key.into(), json!({"type": "string"}));
            }
        }
    }
    if let Some(required) = root.get_mut("required").and_then(Value::as_array_mut) {
        // Status is written through its subresource, after the object exists.
        required.retain(|name| {
            !matches!(
                name.as_str(),
                Some("apiVersion" | "kind" | "metadata" | "status")
            )
        });
    }
    root
}

struct Converter<'a> {
    defs: &'a Map<String, Value>,
}

impl Converter<'_> {
    /// One schema node; `expanding` holds the `$ref`s being inlined above it.
    fn convert(&self, schema: &Value, expanding: &mut Vec<String>) -> Value {
        let Some(node) = schema.as_object() else {
            // `true` (anything) or `false` (nothing): the first is an open field.
            return open();
        };
        if let Some(target) = node.get("$ref").and_then(Value::as_str) {
            return self.inline(target, node, expanding);
        }
        for union in ["anyOf", "oneOf"] {
            if let Some(options) = node.get(union).and_then(Value::as_array) {
                let mut out = self.union(options, expanding);
                if let Value::Object(out) = &mut out {
                    copy_annotations(node, out);
                }
                return out;
            }
        }
        let mut out = Map::new();
        copy_annotations(node, &mut out);
        // Kubernetes' IntOrString, as k8s-openapi describes it.
        if node.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true)) {
            out.insert("x-kubernetes-int-or-string".into(), Value::Bool(true));
            return Value::Object(out);
        }
        match node.get("type") {
            Some(Value::String(kind)) => {
                out.insert("type".into(), Value::String(kind.clone()));
            }
            Some(Value::Array(kinds)) => {
                let named: Vec<&str> = kinds
                    .iter()
                    .filter_map(Value::as_str)
                    .filter(|kind| *kind != "null")
                    .collect();
                match named.as_slice() {
                    [kind] => {
                        out.insert("type".into(), Value::String((*kind).into()));
                        out.insert("nullable".into(), Value::Bool(true));
                    }
                    _ => return open_with(out),
                }
            }
            _ if node.contains_key("properties") => {
                out.insert("type".into(), "object".into());
            }
            _ if node.contains_key("const") || node.contains_key("enum") => {
                out.insert("type".into(), "string".into());
            }
            _ => return open_with(out),
        }
        for key in [
            "minimum",
            "maximum",
            "exclusiveMinimum",
            "exclusiveMaximum",
            "pattern",
            "minLength",
            "maxLength",
            "minItems",
            "maxItems",
            "enum",
        ] {
            if let Some(value) = node.get(key) {
                out.insert(key.into(), value.clone());
            }
        }
        if let Some(constant) = node.get("const") {
            out.insert("enum".into(), json!([constant]));
        }
        if let Some(format) = node
            .get("format")
            .and_then(Value::as_str)
            .and_then(kubernetes_format)
        {
            out.insert("format".into(), format.into());
        }
        if let Some(properties) = node.get("properties").and_then(Value::as_object) {
            let converted: Map<String, Value> = properties
                .iter()
                .map(|(name, schema)| (name.clone(), self.convert(schema, expanding)))
                .collect();
            out.insert("properties".into(), Value::Object(converted));
            if let Some(required) = node.get("required") {
                out.insert("required".into(), required.clone());
            }
        } else if let Some(values) = node.get("additionalProperties") {
            // A map: its values' schema. (Beside `properties` the API server allows none.)
            if values.is_object() || values == &Value::Bool(true) {
                out.insert(
                    "additionalProperties".into(),
                    self.convert(values, expanding),
                );
            }
        }
        if let Some(items) = node.get("items") {
            out.insert("items".into(), self.convert(items, expanding));
        }
        if out.get("type") == Some(&Value::String("object".into()))
            && !out.contains_key("properties")
            && !out.contains_key("additionalProperties")
        {
            // An object of unknown shape (a free-form map): keep what the user wrote.
            out.insert(
                "x-kubernetes-preserve-unknown-fields".into(),
                Value::Bool(true),
            );
        }
        Value::Object(out)
    }

    /// `$ref` inlined, with the referring node's own description over the target's.
    fn inline(
        &self,
        target: &str,
        node: &Map<String, Value>,
        expanding: &mut Vec<String>,
    ) -> Value {
        let name = target.trim_start_matches("#/$defs/");
        let Some(definition) = self.defs.get(name) else {
            return open();
        };
        if expanding.iter().any(|open| open == name) || expanding.len() >= MAX_DEPTH {
            // A recursive type: Kubernetes schemas cannot refer to themselves.
            return open();
        }
        expanding.push(name.to_owned());
        let mut out = self.convert(definition, expanding);
        expanding.pop();
        if name.starts_with(KUBERNETES_DEFINITIONS) {
            // Kubernetes' own types (a SidecarSet's containers and volumes) come with
            // Kubernetes' whole manual: kept out, so that the CRD stays within what
            // `kubectl apply` can record (`kubectl explain pod.spec` has it).
            strip_descriptions(&mut out);
        }
        if let Value::Object(out) = &mut out {
            copy_annotations(node, out);
        }
        out
    }

    /// `anyOf`/`oneOf` in the forms Kubernetes can say structurally.
    fn union(&self, options: &[Value], expanding: &mut Vec<String>) -> Value {
        let is_null = |option: &Value| option.get("type") == Some(&Value::String("null".into()));
        let others: Vec<&Value> = options.iter().filter(|option| !is_null(option)).collect();
        let nullable = others.len() < options.len();
        let mut out = match others.as_slice() {
            [single] => self.convert(single, expanding),
            _ if others.iter().all(|option| string_values(option).is_some()) => {
                let values: Vec<Value> = others
                    .iter()
                    .filter_map(|option| string_values(option))
                    .flatten()
                    .collect();
                json!({"type": "string", "enum": values})
            }
            _ if is_int_or_string(&others) => json!({"x-kubernetes-int-or-string": true}),
            _ => open(),
        };
        if let (true, Value::Object(out)) = (nullable, &mut out) {
            out.insert("nullable".into(), Value::Bool(true));
        }
        out
    }
}

/// The string values a `const`/`enum` string option allows.
fn string_values(option: &Value) -> Option<Vec<Value>> {
    if option.get("type") != Some(&Value::String("string".into())) {
        return None;
    }
    if let Some(constant) = option.get("const") {
        return Some(vec![constant.clone()]);
    }
    option.get("enum").and_then(Value::as_array).cloned()
}

fn is_int_or_string(options: &[&Value]) -> bool {
    let kind = |option: &&Value| {
        option
            .get("type")
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    let mut kinds: Vec<String> = options.iter().filter_map(kind).collect();
    kinds.sort();
    kinds == ["integer", "string"]
}

/// Kubernetes validates a few formats and warns on others: Rust's unsigned widths become
/// the signed ones that hold them (bounds stay in `minimum`/`maximum`).
fn kubernetes_format(format: &str) -> Option<&'static str> {
    match format {
        "int8" | "int16" | "int32" | "uint8" | "uint16" => Some("int32"),
        "int64" | "uint32" | "uint64" | "uint" | "int" => Some("int64"),
        "double" => Some("double"),
        "float" => Some("float"),
        "date-time" => Some("date-time"),
        _ => None,
    }
}

/// Where k8s-openapi's schemas name Kubernetes' own types.
const KUBERNETES_DEFINITIONS: &str = "io.k8s.";

fn strip_descriptions(node: &mut Value) {
    match node {
        Value::Object(fields) => {
            fields.remove("description");
            for (key, value) in fields.iter_mut() {
                // `properties` maps field names to schemas; a field may be named so.
                if key == "properties" {
                    if let Value::Object(properties) = value {
                        properties.values_mut().for_each(strip_descriptions);
                    }
                } else {
                    strip_descriptions(value);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(strip_descriptions),
        _ => {}
    }
}

fn copy_annotations(from: &Map<String, Value>, to: &mut Map<String, Value>) {
    if let Some(description) = from.get("description") {
        to.insert("description".into(), description.clone());
    }
}

fn open() -> Value {
    open_with(Map::new())
}

fn open_with(mut node: Map<String, Value>) -> Value {
    node.remove("type");
    node.insert(
        "x-kubernetes-preserve-unknown-fields".into(),
        Value::Bool(true),
    );
    Value::Object(node)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[allow(clippy::needless_pass_by_value)]
    fn convert(schema: Value) -> Value {
        structural_schema(&schema)
    }

    #[test]
    fn options_become_nullable_and_refs_are_inlined() {
        let out = convert(json!({
            "type": "object",
            "properties": {
                "a": {"type": ["string", "null"]},
                "b": {"anyOf": [{"$ref": "#/$defs/B"}, {"type": "null"}], "description": "the b"},
            },
            "$defs": {"B": {"type": "object", "properties": {"n": {"type": "integer", "format": "uint32", "minimum": 0}}, "additionalProperties": false}},
        }));
        assert_eq!(
            out["properties"]["a"],
            json!({"type": "string", "nullable": true})
        );
        assert_eq!(
            out["properties"]["b"],
            json!({"type": "object", "nullable": true, "description": "the b",
                   "properties": {"n": {"type": "integer", "format": "int64", "minimum": 0}}})
        );
    }

    #[test]
    fn string_unions_are_enums_and_int_or_string_is_kubernetes_own() {
        let out = convert(json!({
            "type": "object",
            "properties": {
                "phase": {"$ref": "#/$defs/Phase"},
                "port": {"anyOf": [{"type": "integer", "minimum": 0}, {"type": "string"}]},
            },
            "$defs": {"Phase": {"oneOf": [
                {"type": "string", "enum": ["Pulling", "Failed"]},
                {"type": "string", "const": "Waiting", "description": "waiting"},
            ]}},
        }));
        assert_eq!(
            out["properties"]["phase"],
            json!({"type": "string", "enum": ["Pulling", "Failed", "Waiting"]})
        );
        assert_eq!(
            out["properties"]["port"],
            json!({"x-kubernetes-int-or-string": true})
        );
    }

    #[test]
    fn maps_keep_their_value_schema_and_free_objects_stay_open() {
        let out = convert(json!({
            "type": "object",
            "properties": {
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                "anything": true,
                "object": {"type": "object"},
            },
        }));
        assert_eq!(
            out["properties"]["labels"],
            json!({"type": "object", "additionalProperties": {"type": "string"}})
        );
        assert_eq!(
            out["properties"]["anything"],
            json!({"x-kubernetes-preserve-unknown-fields": true})
        );
        assert_eq!(
            out["properties"]["object"],
            json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true})
        );
    }

    #[test]
    fn a_recursive_type_is_kept_open_where_it_recurs() {
        let out = convert(json!({
            "$ref": "#/$defs/Tree",
            "$defs": {"Tree": {"type": "object", "properties": {
                "children": {"type": "array", "items": {"$ref": "#/$defs/Tree"}},
            }}},
        }));
        assert_eq!(
            out["properties"]["children"]["items"],
            json!({"x-kubernetes-preserve-unknown-fields": true})
        );
    }

    #[test]
    fn metadata_api_version_and_kind_are_the_api_servers() {
        let out = convert(json!({
            "type": "object",
            "required": ["apiVersion", "kind", "metadata", "spec", "status"],
            "properties": {
                "apiVersion": {"type": "string"},
                "kind": {"type": "string"},
                "metadata": {"$ref": "#/$defs/Meta"},
                "spec": {"type": "object", "properties": {}},
            },
            "$defs": {"Meta": {"type": "object", "properties": {"name": {"type": "string"}}}},
        }));
        assert_eq!(out["properties"]["metadata"], json!({"type": "object"}));
        assert_eq!(out["required"], json!(["spec"]));
    }
}
