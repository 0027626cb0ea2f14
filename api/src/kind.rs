//! The kind registry: every kind the API serves, its name and kubectl's spellings of it.
//! A new kind is added here and in its own module.

use crate::{
    container_recreate_request, image_list_pull_job, image_pull_job, lifecycle_cooperator, node,
    node_image, pod, secret, sidecar_set,
};

/// The kinds the API serves.
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
}

impl Kind {
    pub const ALL: [Self; 9] = [
        Self::ImagePullJob,
        Self::ContainerRecreateRequest,
        Self::Secret,
        Self::Pod,
        Self::LifecycleCooperator,
        Self::SidecarSet,
        Self::ImageListPullJob,
        Self::NodeImage,
        Self::Node,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Self::ImagePullJob => image_pull_job::KIND,
            Self::ContainerRecreateRequest => container_recreate_request::KIND,
            Self::Secret => secret::KIND,
            Self::Pod => pod::KIND,
            Self::LifecycleCooperator => lifecycle_cooperator::KIND,
            Self::SidecarSet => sidecar_set::KIND,
            Self::ImageListPullJob => image_list_pull_job::KIND,
            Self::NodeImage => node_image::KIND,
            Self::Node => node::KIND,
        }
    }

    /// kubectl's spellings: the kind, lowercase, plural, or short name.
    pub fn resolve(text: &str) -> Option<Self> {
        match text.to_ascii_lowercase().as_str() {
            "imagepulljob" | "imagepulljobs" | "ipj" => Some(Self::ImagePullJob),
            "containerrecreaterequest" | "containerrecreaterequests" | "crr" => {
                Some(Self::ContainerRecreateRequest)
            }
            "secret" | "secrets" => Some(Self::Secret),
            "pod" | "pods" | "po" => Some(Self::Pod),
            "lifecyclecooperator" | "lifecyclecooperators" | "lc" => {
                Some(Self::LifecycleCooperator)
            }
            "sidecarset" | "sidecarsets" => Some(Self::SidecarSet),
            "imagelistpulljob" | "imagelistpulljobs" => Some(Self::ImageListPullJob),
            "nodeimage" | "nodeimages" => Some(Self::NodeImage),
            "node" | "nodes" | "no" => Some(Self::Node),
            _ => None,
        }
    }

    /// [`Kind::resolve`], or an error listing the kinds there are.
    pub fn parse(text: &str) -> Result<Self, UnknownKind> {
        Self::resolve(text).ok_or_else(|| UnknownKind(text.to_owned()))
    }

    /// Nodes, NodeImages and SidecarSets (as in Kubernetes and Kruise) belong to no
    /// namespace.
    pub fn namespaced(self) -> bool {
        !matches!(self, Self::Node | Self::NodeImage | Self::SidecarSet)
    }
}

/// A kind name that is none of Rigger's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownKind(pub String);

impl std::error::Error for UnknownKind {}

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
    use super::*;

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
}
