//! The objects users apply, in Kubernetes' shape (`apiVersion`, `kind`, `metadata`,
//! `spec`, `status`) and with OpenKruise's field names where Kruise has the object.
//!
//! Each kind validates itself whole before anything is stored; an error names the field
//! path (`spec.parallelism`) and why, as `kubectl` users expect.

pub mod container_recreate_request;
pub mod fields;
pub mod image_list_pull_job;
pub mod image_pull_job;
pub mod kind;
pub mod lifecycle_cooperator;
pub mod node;
pub mod node_image;
pub mod object;
pub mod pod;
pub mod reference;
pub mod secret;
pub mod selectors;
pub mod sidecar_set;
pub mod table;

pub use fields::*;
pub use kind::{Kind, UnknownKind};
pub use object::Object;
