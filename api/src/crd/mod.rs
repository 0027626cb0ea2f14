//! Rigger's kinds as Kubernetes CustomResourceDefinitions, generated from the types
//! themselves (never copied from Kruise's files): in a cluster, the API server stores
//! and validates what users apply, `kubectl get` shows Kruise's columns, and status lives
//! in the status subresource.
//!
//! Each kind says how it is served in its [`KindInfo::crd`]; [`custom_resource_definition`]
//! turns that and the kind's JSON Schema ([`structural::structural_schema`]) into the
//! object `kubectl apply` takes. `deploy/kubernetes/crds.yaml` is this module's output
//! (`rigger-controller crds`), checked current by a test.

pub mod structural;

use serde_json::{Value, json};

use crate::kind::{AGE, KindInfo, RIGGER_GROUP};
use crate::kinds::Kind;

/// The kind of the controller's own records on a Kubernetes store (per-node job
/// status shards, node labels, SidecarSet histories): its bookkeeping, never applied
/// by users, in the controller's namespace.
pub const RECORD_KIND: &str = "ControllerRecord";

/// The plural resource name of a kind (`imagepulljobs`): its first spelling.
pub fn plural(info: &KindInfo) -> String {
    info.spellings.first().map_or_else(
        || format!("{}s", info.name.to_lowercase()),
        |s| (*s).to_owned(),
    )
}

/// The CustomResourceDefinition of `info`'s kind (`None`: the kind is the cluster's own,
/// such as Pod or Node, or has no schema).
pub fn custom_resource_definition(info: &KindInfo) -> Option<Value> {
    let crd = info.crd?;
    let schema = structural::structural_schema(&(info.schema?)());
    let plural = plural(info);
    let versions: Vec<Value> = crd
        .versions
        .iter()
        .map(|version| {
            let columns: Vec<Value> = crd
                .columns
                .iter()
                .filter(|column| column.only_in.is_none_or(|only| only == *version))
                .map(|column| {
                    json!({
                        "name": column.name,
                        "type": column.kind,
                        "jsonPath": column.json_path,
                        "description": column.description,
                    })
                })
                .collect();
            json!({
                "name": version,
                "served": true,
                "storage": *version == crd.storage_version(),
                "schema": {"openAPIV3Schema": schema},
                "subresources": {"status": {}},
                "additionalPrinterColumns": columns,
            })
        })
        .collect();
    let mut names = json!({
        "kind": info.name,
        "listKind": format!("{}List", info.name),
        "plural": plural,
        "singular": info.name.to_lowercase(),
    });
    if !crd.short_names.is_empty() {
        names["shortNames"] = json!(crd.short_names);
    }
    Some(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": format!("{plural}.{}", crd.group),
            "labels": {"app.kubernetes.io/part-of": "rigger"},
        },
        "spec": {
            "group": crd.group,
            "names": names,
            "scope": if info.namespaced { "Namespaced" } else { "Cluster" },
            "versions": versions,
        },
    }))
}

/// The CustomResourceDefinition of [`RECORD_KIND`]: a key (the record's store kind,
/// namespace and name) and the record as the controller wrote it.
pub fn record_definition() -> Value {
    let text = || json!({"type": "string"});
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": format!("controllerrecords.{RIGGER_GROUP}"),
            "labels": {"app.kubernetes.io/part-of": "rigger"},
        },
        "spec": {
            "group": RIGGER_GROUP,
            "names": {
                "kind": RECORD_KIND,
                "listKind": format!("{RECORD_KIND}List"),
                "plural": "controllerrecords",
                "singular": "controllerrecord",
            },
            "scope": "Namespaced",
            "versions": [{
                "name": "v1alpha1",
                "served": true,
                "storage": true,
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "description": "The Rigger controller's own bookkeeping; not for users to edit.",
                    "properties": {
                        "apiVersion": text(),
                        "kind": text(),
                        "metadata": {"type": "object"},
                        "spec": {
                            "type": "object",
                            "required": ["kind", "namespace", "name", "object"],
                            "properties": {
                                "kind": text(),
                                "namespace": text(),
                                "name": text(),
                                "object": {"x-kubernetes-preserve-unknown-fields": true},
                            },
                        },
                    },
                }},
                "additionalPrinterColumns": [
                    {"name": "RECORD", "type": "string", "jsonPath": ".spec.kind",
                     "description": "What the record is."},
                    {"name": "OF", "type": "string", "jsonPath": ".spec.name",
                     "description": "The object it belongs to."},
                    {"name": "AGE", "type": "date", "jsonPath": ".metadata.creationTimestamp",
                     "description": AGE.description},
                ],
            }],
        },
    })
}

/// Every kind's CustomResourceDefinition, in the registry's order, then the
/// controller's records.
pub fn all() -> Vec<Value> {
    Kind::ALL
        .iter()
        .filter_map(|kind| custom_resource_definition(kind.info()))
        .chain([record_definition()])
        .collect()
}

/// [`all`] (or only `group`'s) as one YAML stream, the way `deploy/kubernetes/crds.yaml`
/// holds it.
pub fn manifests_yaml(group: Option<&str>) -> Result<String, serde_yaml_ng::Error> {
    let mut out = String::from(
        "# Generated by `rigger-controller crds` from Rigger's API types; do not edit.\n",
    );
    let chosen = all()
        .into_iter()
        .filter(|crd| group.is_none_or(|group| crd["spec"]["group"] == group));
    for crd in chosen {
        out.push_str("---\n");
        out.push_str(&serde_yaml_ng::to_string(&crd)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Every node of a structural schema has a type, or says why it needs none.
    fn assert_structural(schema: &Value, path: &str) {
        let node = schema.as_object().unwrap();
        let open = node.contains_key("x-kubernetes-preserve-unknown-fields")
            || node.contains_key("x-kubernetes-int-or-string");
        assert!(open || node.contains_key("type"), "{path}: no type");
        for forbidden in [
            "$ref", "anyOf", "oneOf", "allOf", "$defs", "default", "const",
        ] {
            assert!(!node.contains_key(forbidden), "{path}: {forbidden}");
        }
        assert!(
            !(node.contains_key("properties") && node.contains_key("additionalProperties")),
            "{path}: properties beside additionalProperties"
        );
        if let Some(properties) = node.get("properties").and_then(Value::as_object) {
            for (name, property) in properties {
                assert_structural(property, &format!("{path}.{name}"));
            }
        }
        for key in ["items", "additionalProperties"] {
            if let Some(child) = node.get(key).filter(|child| child.is_object()) {
                assert_structural(child, &format!("{path}[{key}]"));
            }
        }
    }

    #[test]
    fn kruises_kinds_are_served_in_both_versions_with_v1beta1_stored() {
        let crds = all();
        let names: Vec<&str> = crds
            .iter()
            .map(|crd| crd["metadata"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "imagepulljobs.apps.kruise.io",
                "containerrecreaterequests.apps.kruise.io",
                "lifecyclecooperators.rigger.dev",
                "sidecarsets.apps.kruise.io",
                "imagelistpulljobs.apps.kruise.io",
                "nodeimages.apps.kruise.io",
                "controllerrecords.rigger.dev",
            ]
        );
        for crd in &crds {
            let versions = crd["spec"]["versions"].as_array().unwrap();
            let stored: Vec<&str> = versions
                .iter()
                .filter(|v| v["storage"] == json!(true))
                .map(|v| v["name"].as_str().unwrap())
                .collect();
            assert_eq!(stored.len(), 1, "{}", crd["metadata"]["name"]);
            if crd["spec"]["group"] == crate::kind::KRUISE_GROUP {
                assert_eq!(stored, ["v1beta1"]);
                assert_eq!(versions.len(), 2);
            }
            for version in versions {
                assert_structural(&version["schema"]["openAPIV3Schema"], "");
                if crd["spec"]["names"]["kind"] != RECORD_KIND {
                    assert_eq!(version["subresources"], json!({"status": {}}));
                }
            }
        }
    }

    #[test]
    fn columns_are_kruises() {
        let crd = custom_resource_definition(Kind::ImagePullJob.info()).unwrap();
        let columns = |version: usize| -> Vec<String> {
            crd["spec"]["versions"][version]["additionalPrinterColumns"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c["name"].as_str().unwrap().to_owned())
                .collect()
        };
        assert_eq!(
            columns(0),
            ["TOTAL", "ACTIVE", "SUCCEED", "FAILED", "AGE", "MESSAGE"]
        );
        assert_eq!(columns(1), ["TOTAL", "ACTIVE", "SUCCEED", "FAILED", "AGE"]);
        let crr = custom_resource_definition(Kind::ContainerRecreateRequest.info()).unwrap();
        assert_eq!(crr["spec"]["names"]["shortNames"], json!(["crr"]));
        assert_eq!(
            crr["spec"]["versions"][1]["additionalPrinterColumns"][2]["jsonPath"],
            ".metadata.labels.crr\\.apps\\.kruise\\.io/node-name"
        );
    }

    #[test]
    fn the_shipped_manifests_are_current() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../deploy/kubernetes/crds.yaml"
        );
        let shipped = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            shipped == manifests_yaml(None).unwrap(),
            "deploy/kubernetes/crds.yaml is not current: run \
             `cargo run -p rigger-controller -- crds > deploy/kubernetes/crds.yaml`"
        );
    }
}
