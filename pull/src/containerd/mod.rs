//! containerd as the pull engine uses it: the content store (ingests, labels, reads),
//! leases, image records and the snapshotter, behind one narrow interface. [`grpc`] is
//! containerd itself (its gRPC API over the node's socket): the only code of the engine
//! that speaks containerd's protocol. [`memory`] holds what containerd would hold, in
//! memory and a directory, so the pipeline runs in tests without a containerd.
//!
//! Errors are containerd's own statuses (`tonic::Status`): the engine tells
//! `AlreadyExists`, `NotFound` and "containerd went away" apart by them, whichever side
//! answers.

pub mod grpc;
#[cfg(any(test, feature = "testing"))]
pub mod memory;

use std::collections::HashMap;

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use tonic::Status;

/// The label containerd puts on every unpacked layer snapshot.
pub const SNAPSHOT_REF_LABEL: &str = "containerd.io/snapshot.ref";

/// An answer of containerd's.
pub type Call<'a, T> = BoxFuture<'a, Result<T, Status>>;

/// Labels, as containerd keeps them on content, snapshots and images.
pub type Labels = HashMap<String, String>;

/// Where a call acts: a namespace, and the lease that keeps what it makes from garbage
/// collection (none: the call holds nothing).
#[derive(Debug, Clone, Copy)]
pub struct Scope<'a> {
    pub namespace: &'a str,
    pub lease: Option<&'a str>,
}

/// A blob, as content descriptors name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Descriptor {
    pub media_type: String,
    pub digest: String,
    pub size: u64,
}

/// A mount a prepared snapshot is used through (`overlay` with `upperdir=` and
/// `lowerdir=`, or `bind`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    pub kind: String,
    pub source: String,
    pub options: Vec<String>,
}

/// A name pointing at an image's top document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageRecord {
    pub name: String,
    pub target: Descriptor,
    pub labels: Labels,
}

/// Something a lease holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseResource {
    pub id: String,
    /// `content`, `ingests`, `snapshots/<snapshotter>`.
    pub kind: String,
}

/// What goes down an ingest's stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IngestMessage {
    /// `data` at `offset` (an empty write at 0 starts the ingest over).
    Write { offset: u64, data: Vec<u8> },
    /// Verify size and digest, and commit with `labels`.
    Commit {
        total: u64,
        offset: u64,
        expected: String,
        labels: Labels,
    },
}

/// An open ingest: messages go down, and each is answered with the offset containerd
/// holds then. It stays locked (to other writers of its ref) until its stream ends.
pub trait Ingest: Send + std::fmt::Debug {
    /// Queue `message`; `Err` when the stream is gone.
    fn send(&mut self, message: IngestMessage) -> BoxFuture<'_, Result<(), ()>>;
    /// The next answer: the offset held; `Ok(None)` once the stream ended.
    fn next(&mut self) -> Call<'_, Option<u64>>;
    /// End the stream from this side (containerd unlocks the ingest once it sees that).
    fn close(&mut self);
}

/// containerd, as far as a pull needs it.
pub trait Containerd: Send + Sync + std::fmt::Debug + 'static {
    fn lease_create<'a>(&'a self, namespace: &'a str, id: &'a str, labels: Labels) -> Call<'a, ()>;
    fn lease_delete<'a>(&'a self, namespace: &'a str, id: &'a str) -> Call<'a, ()>;
    /// The ids of the namespace's leases.
    fn leases<'a>(&'a self, namespace: &'a str) -> Call<'a, Vec<String>>;
    fn lease_resources<'a>(
        &'a self,
        namespace: &'a str,
        id: &'a str,
    ) -> Call<'a, Vec<LeaseResource>>;
    fn lease_delete_resource<'a>(
        &'a self,
        namespace: &'a str,
        id: &'a str,
        resource: LeaseResource,
    ) -> Call<'a, ()>;

    /// A committed blob's size and labels; `None` when the store lacks it.
    fn content_info<'a>(
        &'a self,
        scope: Scope<'a>,
        digest: &'a str,
    ) -> Call<'a, Option<(u64, Labels)>>;
    /// Set `labels` on a committed blob, keeping the others.
    fn content_add_labels<'a>(
        &'a self,
        scope: Scope<'a>,
        digest: &'a str,
        labels: Labels,
    ) -> Call<'a, ()>;
    /// A committed blob's bytes from `offset` on (all of them: `size` 0).
    fn content_read<'a>(
        &'a self,
        scope: Scope<'a>,
        digest: &'a str,
        offset: u64,
        size: u64,
    ) -> Call<'a, BoxStream<'static, Result<Bytes, Status>>>;
    /// Open (or resume) the ingest `reference` for a blob of `total` bytes and digest
    /// `expected`: its stream, whose first answer is the offset containerd holds.
    fn ingest_open<'a>(
        &'a self,
        scope: Scope<'a>,
        reference: &'a str,
        total: u64,
        expected: &'a str,
    ) -> Call<'a, Box<dyn Ingest>>;
    /// Drop the ingest `reference` and what it holds (`NotFound` when there is none).
    fn ingest_abort<'a>(&'a self, scope: Scope<'a>, reference: &'a str) -> Call<'a, ()>;

    fn image_get<'a>(&'a self, namespace: &'a str, name: &'a str) -> Call<'a, Option<ImageRecord>>;
    /// The directory of containerd's content store as this process sees it (its
    /// ingests are read there while they arrive); `None` when containerd does not say.
    fn content_root(&self) -> Call<'_, Option<std::path::PathBuf>>;
    /// The directory of `snapshotter`'s snapshots as this process sees it (the disk
    /// guard measures its filesystem); `None` when containerd does not say.
    fn snapshotter_root<'a>(&'a self, snapshotter: &'a str)
    -> Call<'a, Option<std::path::PathBuf>>;
    /// Create the record, or replace the one of that name.
    fn image_put<'a>(&'a self, scope: Scope<'a>, image: ImageRecord) -> Call<'a, ()>;

    /// Prepare an active snapshot `key` on `parent` (none: a base layer).
    fn snapshot_prepare<'a>(
        &'a self,
        scope: Scope<'a>,
        snapshotter: &'a str,
        key: &'a str,
        parent: Option<&'a str>,
        labels: Labels,
    ) -> Call<'a, Vec<Mount>>;
    /// Commit the active snapshot `key` as `name`.
    fn snapshot_commit<'a>(
        &'a self,
        scope: Scope<'a>,
        snapshotter: &'a str,
        name: &'a str,
        key: &'a str,
        labels: Labels,
    ) -> Call<'a, ()>;
    /// Whether the snapshot `key` exists (active or committed).
    fn snapshot_exists<'a>(
        &'a self,
        scope: Scope<'a>,
        snapshotter: &'a str,
        key: &'a str,
    ) -> Call<'a, bool>;
    fn snapshot_remove<'a>(
        &'a self,
        scope: Scope<'a>,
        snapshotter: &'a str,
        key: &'a str,
    ) -> Call<'a, ()>;
    /// Apply `layer` (a committed blob) through containerd's diff service onto
    /// `mounts`: the diff ID applied.
    fn diff_apply<'a>(
        &'a self,
        scope: Scope<'a>,
        layer: &'a Descriptor,
        mounts: Vec<Mount>,
    ) -> Call<'a, String>;
}
