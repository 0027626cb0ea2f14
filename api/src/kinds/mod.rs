//! The kind registry: every kind the API serves ([`Kind`]), one module each (its types,
//! checks, table and [`KindInfo`]). A new kind is its module plus its lines here.

pub mod container_recreate_request;
pub mod event;
pub mod image_list_pull_job;
pub mod image_pull_job;
pub mod lifecycle_cooperator;
pub mod node;
pub mod node_image;
pub mod pod;
pub mod secret;
pub mod sidecar_set;

use crate::kind::KindInfo;
use crate::object::Object;

/// The kinds the API serves (each described by its module's `INFO`: [`Kind::info`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    ImagePullJob,
    ContainerRecreateRequest,
    Secret,
    Pod,
    LifecycleCooperator,
    SidecarSet,
    ImageListPullJob,
    /// Read-only: each node's, built from its inventory and its jobs.
    NodeImage,
    /// Nodes are not applied: they exist while their agents register.
    Node,
    /// Read-only: recorded by the controller.
    Event,
}

/// A kind name that is none of Rigger's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownKind(pub String);

impl std::error::Error for UnknownKind {}

/// Code generic over a kind's type, run for a [`Kind`] known only at run time
/// ([`Kind::visit`]): what the controller does alike for every kind (apply, show) is
/// written once, and a new kind reaches it through the registry alone.
pub trait KindVisitor {
    type Output;
    /// A kind users apply, as its type.
    fn applied<T: Object>(self) -> Self::Output;
    /// A kind users never apply or delete (Node, NodeImage, Event).
    fn read_only(self, info: &'static KindInfo) -> Self::Output;
}

impl Kind {
    pub const ALL: [Self; 10] = [
        Self::ImagePullJob,
        Self::ContainerRecreateRequest,
        Self::Secret,
        Self::Pod,
        Self::LifecycleCooperator,
        Self::SidecarSet,
        Self::ImageListPullJob,
        Self::NodeImage,
        Self::Node,
        Self::Event,
    ];

    /// What the kind is: its module's `INFO`.
    pub fn info(self) -> &'static KindInfo {
        match self {
            Self::ImagePullJob => &image_pull_job::INFO,
            Self::ContainerRecreateRequest => &container_recreate_request::INFO,
            Self::Secret => &secret::INFO,
            Self::Pod => &pod::INFO,
            Self::LifecycleCooperator => &lifecycle_cooperator::INFO,
            Self::SidecarSet => &sidecar_set::INFO,
            Self::ImageListPullJob => &image_list_pull_job::INFO,
            Self::NodeImage => &node_image::INFO,
            Self::Node => &node::INFO,
            Self::Event => &event::INFO,
        }
    }

    /// Run `visitor` with this kind's type.
    pub fn visit<V: KindVisitor>(self, visitor: V) -> V::Output {
        match self {
            Self::ImagePullJob => visitor.applied::<image_pull_job::ImagePullJob>(),
            Self::ContainerRecreateRequest => {
                visitor.applied::<container_recreate_request::ContainerRecreateRequest>()
            }
            Self::Secret => visitor.applied::<secret::Secret>(),
            Self::Pod => visitor.applied::<pod::Pod>(),
            Self::LifecycleCooperator => {
                visitor.applied::<lifecycle_cooperator::LifecycleCooperator>()
            }
            Self::SidecarSet => visitor.applied::<sidecar_set::SidecarSet>(),
            Self::ImageListPullJob => visitor.applied::<image_list_pull_job::ImageListPullJob>(),
            Self::NodeImage | Self::Node | Self::Event => visitor.read_only(self.info()),
        }
    }

    pub fn name(self) -> &'static str {
        self.info().name
    }

    /// The kind named exactly `name` (as in `kind:`).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|kind| kind.name() == name)
    }

    /// kubectl's spellings: the kind, lowercase, plural, or short name.
    pub fn resolve(text: &str) -> Option<Self> {
        let text = text.to_ascii_lowercase();
        Self::ALL.into_iter().find(|kind| {
            let info = kind.info();
            info.name.eq_ignore_ascii_case(&text) || info.spellings.contains(&text.as_str())
        })
    }

    /// [`Kind::resolve`], or an error listing the kinds there are.
    pub fn parse(text: &str) -> Result<Self, UnknownKind> {
        Self::resolve(text).ok_or_else(|| UnknownKind(text.to_owned()))
    }

    pub fn namespaced(self) -> bool {
        self.info().namespaced
    }
}

// The list is `Kind::ALL`'s, so a new kind cannot be missing from it.
impl std::fmt::Display for UnknownKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let known: Vec<&str> = Kind::ALL.iter().map(|k| k.name()).collect();
        write!(f, "unknown kind {:?} (known: {})", self.0, known.join(", "))
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::time::SystemTime;

    use super::image_list_pull_job::ImageListPullJob;
    use super::image_pull_job::ImagePullJob;
    use super::pod::{LIFECYCLE_STATE_LABEL, Pod};
    use super::*;
    use crate::object::admit;
    use crate::table::Columns;

    fn at(rfc3339: &str) -> SystemTime {
        humantime::parse_rfc3339(rfc3339).unwrap()
    }

    #[test]
    fn an_unknown_kind_lists_every_kind_there_is() {
        let message = Kind::parse("gadget").err().map(|e| e.to_string());
        let message = message.unwrap_or_default();
        assert!(message.starts_with("unknown kind \"gadget\""), "{message}");
        for kind in Kind::ALL {
            assert!(message.contains(kind.name()), "{kind} missing: {message}");
            assert_eq!(Kind::parse(&kind.name().to_ascii_lowercase()), Ok(kind));
        }
    }

    #[test]
    fn every_kind_describes_itself_and_answers_to_its_spellings() {
        for kind in Kind::ALL {
            let info = kind.info();
            assert_eq!(
                Kind::resolve(info.name),
                Some(kind),
                "{} is listed under another kind",
                info.name
            );
            for spelling in info.spellings {
                assert_eq!(Kind::resolve(spelling), Some(kind), "{spelling}");
                assert_eq!(Kind::resolve(&spelling.to_ascii_uppercase()), Some(kind));
            }
            // A kind users apply has a reference page and a schema; one they never apply
            // says why.
            if info.read_only.is_none() {
                assert!(info.notes.is_some() && info.schema.is_some(), "{kind}");
            }
            let table = (info.table)(
                &[],
                crate::table::TableOptions {
                    wide: true,
                    namespace_column: info.namespaced,
                    now: SystemTime::now(),
                },
            )
            .unwrap();
            assert!(table.rows.is_empty() && table.header.len() > 1, "{kind}");
        }
        let mut spellings: Vec<&str> = Kind::ALL
            .iter()
            .flat_map(|k| k.info().spellings.iter().copied())
            .collect();
        let all = spellings.len();
        spellings.sort_unstable();
        spellings.dedup();
        assert_eq!(spellings.len(), all, "two kinds share a spelling");
    }

    /// What the visitor sees of a kind is its INFO.
    struct InfoOf;

    impl KindVisitor for InfoOf {
        type Output = &'static KindInfo;
        fn applied<T: Object>(self) -> Self::Output {
            T::INFO
        }
        fn read_only(self, info: &'static KindInfo) -> Self::Output {
            info
        }
    }

    #[test]
    fn a_kind_is_visited_as_its_own_type_and_read_only_kinds_as_read_only() {
        for kind in Kind::ALL {
            let seen = kind.visit(InfoOf);
            assert_eq!(seen.name, kind.info().name);
            let applied_by_type = kind.info().read_only.is_none();
            assert_eq!(
                applied_by_type,
                !matches!(kind, Kind::Node | Kind::NodeImage | Kind::Event)
            );
        }
    }

    #[test]
    fn a_listing_row_that_is_not_its_kind_is_named_by_its_place() {
        let objects = [
            serde_json::json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "a"}, "type": "kubernetes.io/dockerconfigjson"}),
            serde_json::json!({"metadata": 7}),
        ];
        let options = crate::table::TableOptions {
            wide: false,
            namespace_column: true,
            now: SystemTime::now(),
        };
        let error = (Kind::Secret.info().table)(&objects, options).unwrap_err();
        assert_eq!(error.index, 1);
    }

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

    #[test]
    fn every_row_has_as_many_cells_as_its_header() {
        let now = at("2026-01-02T00:00:00Z");
        let job: ImagePullJob = serde_json::from_value(serde_json::json!({
            "apiVersion": "apps.kruise.io/v1alpha1", "kind": "ImagePullJob",
            "metadata": {"name": "warm", "creationTimestamp": "2026-01-01T23:59:00Z"},
            "spec": {"image": "busybox:1.36"},
            "status": {"desired": 2, "active": 1, "succeeded": 1, "failed": 0, "nodes": [
                {"name": "a", "phase": "Pulling", "bytesDone": 1024, "bytesTotal": 4096}
            ]}
        }))
        .unwrap();
        for wide in [false, true] {
            assert_eq!(job.row(wide, now).len(), ImagePullJob::header(wide).len());
        }
        assert_eq!(job.row(true, now)[5], "1.0K/4.0K");
        assert_eq!(job.row(true, now)[6], "60s");
        assert_eq!(job.row(true, now)[8], "busybox:1.36");
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web", "labels": {LIFECYCLE_STATE_LABEL: "Updating"}},
            "spec": {"containers": [{"name": "app", "image": "busybox"}]},
            "status": {"phase": "Running", "containerStatuses": [{"ready": true, "restartCount": 2}]}
        }))
        .unwrap();
        for wide in [false, true] {
            assert_eq!(pod.row(wide, now).len(), Pod::header(wide).len());
        }
        assert_eq!(
            pod.row(false, now)[1..5],
            ["1/1", "Running", "2", "Updating"]
        );
    }
}
