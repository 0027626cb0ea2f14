//! The table `get` prints: each object decoded into its kind's type, whose columns the
//! kind names (`rigger_api::table`); `-A` adds the namespace of namespaced kinds.

use std::time::SystemTime;

use anyhow::Context as _;
use rigger_api::Kind;
use rigger_api::container_recreate_request::ContainerRecreateRequest;
use rigger_api::image_list_pull_job::ImageListPullJob;
use rigger_api::image_pull_job::ImagePullJob;
use rigger_api::lifecycle_cooperator::LifecycleCooperator;
use rigger_api::node::Node;
use rigger_api::node_image::NodeImage;
use rigger_api::pod::Pod;
use rigger_api::secret::Secret;
use rigger_api::sidecar_set::SidecarSet;
use rigger_api::table::Columns;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::{display_name, str_of};

/// The header and rows for `objects`, all of `kind`.
pub fn table_rows(
    kind: Kind,
    objects: &[Value],
    wide: bool,
    all_namespaces: bool,
) -> anyhow::Result<(Vec<String>, Vec<Vec<String>>)> {
    let namespace = all_namespaces && kind.namespaced();
    match kind {
        Kind::ImagePullJob => rows_of::<ImagePullJob>(objects, wide, namespace),
        Kind::ContainerRecreateRequest => {
            rows_of::<ContainerRecreateRequest>(objects, wide, namespace)
        }
        Kind::Secret => rows_of::<Secret>(objects, wide, namespace),
        Kind::Pod => rows_of::<Pod>(objects, wide, namespace),
        Kind::LifecycleCooperator => rows_of::<LifecycleCooperator>(objects, wide, namespace),
        Kind::SidecarSet => rows_of::<SidecarSet>(objects, wide, namespace),
        Kind::ImageListPullJob => rows_of::<ImageListPullJob>(objects, wide, namespace),
        Kind::NodeImage => rows_of::<NodeImage>(objects, wide, namespace),
        Kind::Node => rows_of::<Node>(objects, wide, namespace),
    }
}

fn rows_of<T: Columns + DeserializeOwned>(
    objects: &[Value],
    wide: bool,
    namespace: bool,
) -> anyhow::Result<(Vec<String>, Vec<Vec<String>>)> {
    let now = SystemTime::now();
    let mut header: Vec<String> = Vec::new();
    if namespace {
        header.push("NAMESPACE".to_owned());
    }
    header.extend(T::header(wide).into_iter().map(str::to_owned));
    let mut rows = Vec::with_capacity(objects.len());
    for object in objects {
        let typed: T = serde_json::from_value(object.clone()).with_context(|| {
            format!(
                "{} as the controller sent it is unreadable",
                display_name(object)
            )
        })?;
        let mut row = Vec::new();
        if namespace {
            row.push(str_of(object, "/metadata/namespace").to_owned());
        }
        row.extend(typed.row(wide, now));
        rows.push(row);
    }
    Ok((header, rows))
}
