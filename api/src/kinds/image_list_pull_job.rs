//! `kind: ImageListPullJob` — OpenKruise's: several images pre-downloaded with one job
//! template. As in Kruise, it is carried out as one ImagePullJob per image (named
//! `<list>-<hash of the image>`, labelled with the list's name), and its status counts
//! those jobs.

use std::collections::BTreeSet;
use std::fmt;

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize, Serializer};

use super::image_pull_job::{ImagePullJob, ImagePullJobSpec};
use crate::fields::{FieldError, ObjectMeta, ValidateMeta as _, short_hash};

use std::time::SystemTime;

use crate::kind::KindInfo;
use crate::object::{Object, metadata_field};
use crate::table::{Columns, age};

pub const KIND: &str = "ImageListPullJob";
pub use super::image_pull_job::OWNER_LABEL;
/// Kubernetes' label for the version of the template a job was made from (Kruise's).
pub const TEMPLATE_HASH_LABEL: &str = "controller-revision-hash";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ImageListPullJob {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: ImageListPullJobSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<ImageListPullJobStatus>,
}

/// `images` and, beside it, every field of an ImagePullJob's spec but `image` (Kruise's
/// inline template).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageListPullJobSpec {
    pub images: Vec<String>,
    /// The job template: an ImagePullJob's spec with an empty `image`.
    pub template: ImagePullJobSpec,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImageListPullJobStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<String>,
    /// Images in the list.
    pub desired: u32,
    /// Images whose job has nodes pulling.
    pub active: u32,
    /// Images whose job finished on every node (pulled or failed).
    pub completed: u32,
    /// Images pulled on every node.
    pub succeeded: u32,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed_image_statuses: Vec<FailedImageStatus>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailedImageStatus {
    pub image_pull_job: String,
    pub name: String,
    pub message: String,
}

impl ImageListPullJob {
    /// Refuse what cannot run, naming the field: the list, then each image's job.
    pub fn validate(&self) -> Result<(), FieldError> {
        crate::fields::check_kruise_v1beta1_api_version(&self.api_version)?;
        self.metadata.validate()?;
        let images = &self.spec.images;
        if images.is_empty() {
            return Err(FieldError::new("spec.images", "at least one image"));
        }
        let mut seen = BTreeSet::new();
        for (i, image) in images.iter().enumerate() {
            if !seen.insert(image.as_str()) {
                return Err(FieldError::new(
                    format!("spec.images[{i}]"),
                    format!("{image:?} is listed twice"),
                ));
            }
            let mut spec = self.spec.template.clone();
            spec.image.clone_from(image);
            spec.validate().map_err(|e| {
                let path = if e.path == "spec.image" {
                    format!("spec.images[{i}]")
                } else {
                    e.path
                };
                FieldError::new(path, e.reason)
            })?;
        }
        Ok(())
    }

    /// The name of the job that pulls `image` for this list.
    pub fn job_name(&self, image: &str) -> String {
        format!("{}-{}", self.metadata.name, short_hash(image.as_bytes()))
    }

    /// A short hash of the template: a job made from another template is replaced.
    pub fn template_hash(&self) -> String {
        short_hash(&serde_json::to_vec(&self.spec.template).unwrap_or_default())
    }

    /// The ImagePullJob that pulls `image` for this list.
    pub fn job_for(&self, image: &str) -> ImagePullJob {
        let mut spec = self.spec.template.clone();
        image.clone_into(&mut spec.image);
        ImagePullJob {
            api_version: self.api_version.clone(),
            kind: super::image_pull_job::KIND.to_owned(),
            metadata: ObjectMeta {
                name: self.job_name(image),
                namespace: self.metadata.namespace.clone(),
                labels: [
                    (OWNER_LABEL.to_owned(), self.metadata.name.clone()),
                    (TEMPLATE_HASH_LABEL.to_owned(), self.template_hash()),
                ]
                .into(),
                ..ObjectMeta::default()
            },
            spec,
            status: None,
        }
    }
}

/// The schema as written: an ImagePullJob spec's with `images` for `image`.
impl schemars::JsonSchema for ImageListPullJobSpec {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "ImageListPullJobSpec".into()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let mut schema = ImagePullJobSpec::json_schema(generator);
        let images = schemars::json_schema!({
            "description": "The images to pull, each by its own ImagePullJob.",
            "type": "array",
            "items": {"type": "string"}
        });
        if let Some(properties) = schema
            .get_mut("properties")
            .and_then(serde_json::Value::as_object_mut)
        {
            properties.remove("image");
            properties.insert("images".to_owned(), images.to_value());
        }
        schema.insert("required".to_owned(), serde_json::json!(["images"]));
        schema
    }
}

impl Serialize for ImageListPullJobSpec {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut fields = match serde_json::to_value(&self.template) {
            Ok(serde_json::Value::Object(fields)) => fields,
            Ok(_) => serde_json::Map::new(),
            Err(e) => return Err(serde::ser::Error::custom(e)),
        };
        fields.remove("image");
        fields.insert(
            "images".to_owned(),
            serde_json::Value::from(self.images.clone()),
        );
        fields.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for ImageListPullJobSpec {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(SpecVisitor)
    }
}

struct SpecVisitor;

impl<'de> Visitor<'de> for SpecVisitor {
    type Value = ImageListPullJobSpec;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an ImageListPullJob spec (images and an ImagePullJob's fields)")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut images: Option<Vec<String>> = None;
        let mut rest = serde_json::Map::new();
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "images" if images.is_some() => {
                    return Err(de::Error::custom("duplicate field `images`"));
                }
                "images" => images = Some(map.next_value()?),
                // The list's jobs take their image from `images`.
                "image" => {
                    return Err(de::Error::custom(
                        "unknown field `image` (a list has `images`)",
                    ));
                }
                _ => {
                    let value: serde_json::Value = map.next_value()?;
                    if rest.insert(key.clone(), value).is_some() {
                        return Err(de::Error::custom(format!("duplicate field `{key}`")));
                    }
                }
            }
        }
        let images = images.ok_or_else(|| de::Error::missing_field("images"))?;
        rest.insert("image".to_owned(), serde_json::Value::String(String::new()));
        let template: ImagePullJobSpec =
            serde_path_to_error::deserialize(serde_json::Value::Object(rest)).map_err(|e| {
                let path = e.path().to_string();
                let message = e.into_inner().to_string();
                if path == "." || message.starts_with("unknown field") && !path.contains('.') {
                    de::Error::custom(message)
                } else {
                    de::Error::custom(format!("{path}: {message}"))
                }
            })?;
        Ok(ImageListPullJobSpec { images, template })
    }
}

/// ImageListPullJob, as the registry (`kinds/mod.rs`) lists it.
pub const INFO: KindInfo = KindInfo {
    name: KIND,
    spellings: &["imagelistpulljobs"],
    namespaced: true,
    read_only: None,
    notes: Some(
        "Several images with one job template, carried out as in Kruise by one \
             ImagePullJob per image (`<list>-<hash>`, labelled \
             `imagelistpulljob.rigger.dev/name`). Both Kruise versions.\n\n\
             Differs from Kruise: the jobs are made when the list is applied (a job deleted \
             by hand comes back on the next apply, and the status says it is missing); a \
             job of that name that is not the list's is left alone and reported.",
    ),
    schema: Some(crate::kind::schema_of::<ImageListPullJob>),
    crd: Some(&crate::kind::CrdInfo {
        group: crate::kind::KRUISE_GROUP,
        versions: &["v1alpha1", "v1beta1"],
        short_names: &[],
        columns: &[
            crate::kind::PrinterColumn {
                name: "TOTAL",
                kind: "integer",
                json_path: ".status.desired",
                description: "ImagePullJobs of the list.",
                only_in: None,
            },
            crate::kind::PrinterColumn {
                name: "SUCCEEDED",
                kind: "integer",
                json_path: ".status.succeeded",
                description: "ImagePullJobs that succeeded.",
                only_in: None,
            },
            crate::kind::PrinterColumn {
                name: "COMPLETED",
                kind: "integer",
                json_path: ".status.completed",
                description: "ImagePullJobs that finished.",
                only_in: None,
            },
            crate::kind::AGE,
        ],
    }),
    table: crate::table::table_of::<ImageListPullJob>,
};

impl Object for ImageListPullJob {
    const INFO: &'static KindInfo = &INFO;
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

/// Kruise's columns: TOTAL, ACTIVE, SUCCEEDED, COMPLETED.
impl Columns for ImageListPullJob {
    fn header(wide: bool) -> Vec<&'static str> {
        let mut header = vec!["NAME", "TOTAL", "ACTIVE", "SUCCEEDED", "COMPLETED", "AGE"];
        if wide {
            header.push("IMAGES");
        }
        header
    }

    fn row(&self, wide: bool, now: SystemTime) -> Vec<String> {
        let none = ImageListPullJobStatus::default();
        let status = self.status.as_ref().unwrap_or(&none);
        let mut row = vec![
            self.metadata.name.clone(),
            status.desired.to_string(),
            status.active.to_string(),
            status.succeeded.to_string(),
            status.completed.to_string(),
            age(self.metadata.creation_timestamp.as_deref(), now),
        ];
        if wide {
            row.push(self.spec.images.join(","));
        }
        row
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn list(spec: &serde_json::Value) -> Result<ImageListPullJob, String> {
        let list: ImageListPullJob = serde_path_to_error::deserialize(serde_json::json!({
            "apiVersion": crate::fields::KRUISE_API_VERSION_V1BETA1, "kind": KIND,
            "metadata": {"name": "warm", "namespace": "default"}, "spec": spec,
        }))
        .map_err(|e| format!("{}: {}", e.path(), e.inner()))?;
        list.validate().map_err(|e| e.to_string())?;
        Ok(list)
    }

    #[test]
    fn kruise_lists_apply_and_become_one_job_per_image() {
        let spec = serde_json::json!({
            "images": ["nginx:1.27", "redis:7"],
            "parallelism": 10,
            "selector": {"matchLabels": {"pool": "web"}},
            "completionPolicy": {"type": "Always", "activeDeadlineSeconds": 1200, "ttlSecondsAfterFinished": 300},
            "pullPolicy": {"backoffLimit": 3, "timeoutSeconds": 300},
            "imagePullPolicy": "Always",
            "sandboxConfig": {"labels": {"team": "web"}},
        });
        let list = list(&spec).unwrap();
        assert_eq!(
            serde_json::to_value(&list.spec).unwrap()["images"],
            spec["images"]
        );
        assert!(
            serde_json::to_value(&list.spec)
                .unwrap()
                .get("image")
                .is_none()
        );
        let job = list.job_for("redis:7");
        job.validate().unwrap();
        assert_eq!(job.spec.image, "redis:7");
        assert_eq!(job.metadata.labels[OWNER_LABEL], "warm");
        assert_eq!(job.metadata.name, list.job_name("redis:7"));
        assert_ne!(list.job_name("redis:7"), list.job_name("nginx:1.27"));
        assert_eq!(job.spec.parallelism, list.spec.template.parallelism);
        // The template's hash moves with the template only.
        let mut other = list.clone();
        other.spec.images.push("busybox:1".to_owned());
        assert_eq!(other.template_hash(), list.template_hash());
        other.spec.template.pull_policy.timeout_seconds = 60;
        assert_ne!(other.template_hash(), list.template_hash());
    }

    #[test]
    fn refusals_name_the_field() {
        for (spec, expected) in [
            (
                serde_json::json!({"images": []}),
                "spec.images: at least one image",
            ),
            (
                serde_json::json!({"images": ["nginx:1", "nginx:1"]}),
                "spec.images[1]: \"nginx:1\" is listed twice",
            ),
            (
                serde_json::json!({"images": ["nginx:1", "Not A Ref"]}),
                "spec.images[1]: \"Not A Ref\" is not an image reference",
            ),
            (
                serde_json::json!({"images": ["nginx:1"], "image": "redis:7"}),
                "unknown field `image` (a list has `images`)",
            ),
            (
                serde_json::json!({"images": ["nginx:1"], "paralelism": 2}),
                "unknown field `paralelism`",
            ),
            (
                serde_json::json!({"images": ["nginx:1"], "pullPolicy": {"timeoutSeconds": 0}}),
                "spec.pullPolicy.timeoutSeconds: must be between 1 and 2147483647",
            ),
            (
                serde_json::json!({"parallelism": 1}),
                "missing field `images`",
            ),
        ] {
            let err = list(&spec).unwrap_err();
            assert!(err.contains(expected), "{err}\n  expected: {expected}");
        }
    }
}
