//! Applying image layers into snapshot directories — the only code of Rigger that
//! writes inside a snapshot.
//!
//! The agent runs as root, and a layer is outside input: it may plant symlinks (to
//! `/etc`, to `/`, through `..`) and then write, chmod or chown "through" them. So
//! nothing here takes a host path for anything below a snapshot's root: [`root`] opens
//! the root once by descriptor and resolves every path inside it, and every change is
//! made to one entry of a directory held by descriptor, never following a symlink
//! there. [`apply`] is containerd's layer applier (overlayfs flavour) on top of it. This
//! crate's `clippy.toml` forbids the path-based calls of `std::fs`, `nix` and `xattr`,
//! so a path-based call cannot slip in unnoticed.

pub mod apply;
pub mod root;

pub use apply::{
    Applied, ApplyError, ApplyTarget, DiffIdReader, ImpliedParent, adopt_lowers, apply_layer,
};
pub use root::move_snapshot_dir;
