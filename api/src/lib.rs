//! The objects users apply, in Kubernetes' shape (`apiVersion`, `kind`, `metadata`,
//! `spec`, `status`) and with OpenKruise's field names where Kruise has the object.
//!
//! Each kind validates itself whole before anything is stored; an error names the field
//! path (`spec.parallelism`) and why, as `kubectl` users expect.

pub mod crd;
pub mod fields;
pub mod kind;
pub mod kinds;
pub mod kube_types;
pub mod object;
pub mod reference;
pub mod selectors;
pub mod strict;
pub mod table;

pub use fields::*;
pub use kind::KindInfo;
pub use kinds::{Kind, UnknownKind};
// Each kind's module at the crate's top (`rigger_api::image_pull_job`), as users name it.
pub use kinds::*;
pub use object::Object;
