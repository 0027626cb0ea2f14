//! The bytes of a blob still arriving on this node: containerd's ingest file for it,
//! read as far as containerd confirmed writing it.
//!
//! containerd's API reads only committed blobs, so this is the one place the agent reads
//! containerd's files: read-only, opened beneath the content root with no symlink
//! followed, a regular file only. The local content store (1.6 to 2.x) keeps a write in
//! `ingest/<sha256 of its key>/` with the key in `ref` and the bytes in `data`; the
//! metadata layer keys a namespace's write `<namespace>/<sequence>/<ref>`, the sequence
//! known only to its database, so the ingest is found by its `ref` file.
//!
//! The file is opened once per answer; when containerd commits the blob it renames that
//! file into its blob store, and the open descriptor goes on reading the same bytes.
//! Whoever receives them checks them against the blob's digest; a write that stops or
//! starts over ends the answer early.

use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::FileExt as _;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use futures::stream::{self, BoxStream, StreamExt as _};
use rigger_pull::arriving::{Arrival, ArrivalState, Following};
use rustix::fs::{Mode, OFlags};
use sha2::{Digest as _, Sha256};
use tokio::sync::watch;

/// Bytes read from the ingest file at a time.
const PIECE: u64 = 256 << 10;
/// A `ref` file longer than this is not containerd's.
const MAX_KEY: usize = 4096;
/// Ingests looked at, at most, to find one.
const MAX_INGESTS: usize = 4096;

/// `path` beneath `dir`, as the pull engine opens containerd's content files.
fn open_beneath(dir: impl AsFd, path: &str, flags: OFlags) -> std::io::Result<OwnedFd> {
    rigger_pull::store::direct::open_beneath(dir, path, flags, Mode::empty())
}

/// A regular file's contents, up to `limit` bytes (`None` if longer or not a file).
fn read_small(dir: impl AsFd, path: &str, limit: usize) -> std::io::Result<Option<Vec<u8>>> {
    let file = File::from(open_beneath(dir, path, OFlags::RDONLY)?);
    let metadata = file.metadata()?;
    if !metadata.file_type().is_file() || metadata.len() > limit as u64 {
        return Ok(None);
    }
    let mut contents = vec![0; usize::try_from(metadata.len()).unwrap_or(0)];
    file.read_exact_at(&mut contents, 0)?;
    Ok(Some(contents))
}

/// The sequence number in `key` when it is namespace `namespace`'s key for `reference`
/// (`<namespace>/<sequence>/<reference>`).
fn sequence_of(key: &str, namespace: &str, reference: &str) -> Option<u64> {
    let sequence = key
        .strip_prefix(namespace)?
        .strip_prefix('/')?
        .strip_suffix(reference)?
        .strip_suffix('/')?;
    if sequence.is_empty() || !sequence.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    sequence.parse().ok()
}

/// The ingest file of `reference` written in `namespace`, under containerd's content
/// root (the latest write when several are there).
pub fn open(content_root: &Path, namespace: &str, reference: &str) -> std::io::Result<File> {
    let root = rustix::fs::open(
        content_root,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let ingests = open_beneath(&root, "ingest", OFlags::RDONLY | OFlags::DIRECTORY)?;
    let mut found: Option<(u64, String)> = None;
    for entry in rustix::fs::Dir::read_from(&ingests)?.take(MAX_INGESTS) {
        let entry = entry?;
        let Ok(name) = entry.file_name().to_str() else {
            continue;
        };
        if name.len() != 64 || !name.bytes().all(|b| b.is_ascii_hexdigit()) {
            continue;
        }
        let Ok(Some(key)) = read_small(&ingests, &format!("{name}/ref"), MAX_KEY) else {
            continue;
        };
        let Ok(key) = String::from_utf8(key) else {
            continue;
        };
        // The directory is named for its key: anything else is not containerd's.
        if hex::encode(Sha256::digest(&key)) != name {
            continue;
        }
        if let Some(sequence) = sequence_of(&key, namespace, reference)
            && found.as_ref().is_none_or(|(latest, _)| sequence > *latest)
        {
            found = Some((sequence, name.to_owned()));
        }
    }
    let Some((_, name)) = found else {
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("no ingest of {reference} in namespace {namespace}"),
        ));
    };
    let file = File::from(open_beneath(
        &ingests,
        &format!("{name}/data"),
        OFlags::RDONLY,
    )?);
    if !file.metadata()?.file_type().is_file() {
        return Err(std::io::Error::other(format!(
            "ingest/{name}/data under {} is not a regular file",
            content_root.display()
        )));
    }
    Ok(file)
}

/// Where a reader stands: the bytes it has read up to, and up to where it reads.
struct Reader {
    file: Arc<File>,
    arrival: watch::Receiver<Arrival>,
    at: u64,
    end: u64,
}

/// Bytes `start..end` of the blob `following` is written to `file`, each as soon as
/// containerd confirmed holding it. Ends with an error when the write is abandoned
/// before reaching `end`.
pub fn read(
    file: Arc<File>,
    following: Following,
    start: u64,
    end: u64,
) -> BoxStream<'static, Result<Bytes, String>> {
    let reader = Reader {
        file,
        arrival: following.arrival,
        at: start,
        end,
    };
    stream::try_unfold(reader, |mut reader| async move {
        if reader.at >= reader.end {
            return Ok(None);
        }
        let held = reader.held_past_at().await?;
        let length = (held.min(reader.end) - reader.at).min(PIECE);
        let (file, at) = (reader.file.clone(), reader.at);
        let piece = tokio::task::spawn_blocking(move || {
            let mut buffer = vec![0; usize::try_from(length).unwrap_or(0)];
            file.read_exact_at(&mut buffer, at).map(|()| buffer)
        })
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("reading the blob as it arrives: {e}"))?;
        // The write may have started over while we read: those bytes are not the blob's.
        if reader.arrival.borrow().state == ArrivalState::Abandoned {
            return Err("the blob's write started over or stopped".to_owned());
        }
        reader.at += length;
        Ok(Some((Bytes::from(piece), reader)))
    })
    .boxed()
}

impl Reader {
    /// containerd holds bytes past `at`: how far it holds.
    async fn held_past_at(&mut self) -> Result<u64, String> {
        let at = self.at;
        let arrival = self
            .arrival
            .wait_for(|a| a.held > at || a.state == ArrivalState::Abandoned)
            .await
            .map_err(|_| "the blob's write ended".to_owned())?;
        if arrival.state == ArrivalState::Abandoned && arrival.held <= at {
            return Err("the blob's write stopped before these bytes".to_owned());
        }
        Ok(arrival.held)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::io::Write as _;

    use rigger_pull::arriving::{Arriving, BytesAt};

    use super::*;

    /// A content root with an ingest of `reference` in namespace "ns" holding `bytes`,
    /// as containerd lays it out; the data file's path.
    fn content_root(reference: &str, bytes: &[u8]) -> (tempfile::TempDir, std::path::PathBuf) {
        let root = tempfile::tempdir().unwrap();
        let data = ingest(root.path(), &format!("ns/7/{reference}"), bytes);
        (root, data)
    }

    fn ingest(root: &Path, key: &str, bytes: &[u8]) -> std::path::PathBuf {
        let dir = root.join("ingest").join(hex::encode(Sha256::digest(key)));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("ref"), key).unwrap();
        let data = dir.join("data");
        std::fs::write(&data, bytes).unwrap();
        data
    }

    #[test]
    fn the_ingest_is_the_namespaces_latest_write_of_the_ref() {
        let (root, _) = content_root("layer-sha256:a", b"latest");
        ingest(root.path(), "ns/3/layer-sha256:a", b"older");
        ingest(
            root.path(),
            "other/9/layer-sha256:a",
            b"another namespace's",
        );
        ingest(root.path(), "ns/9/layer-sha256:ab", b"another ref");
        ingest(root.path(), "ns/x9/layer-sha256:a", b"not a sequence");
        // A directory whose name is not its key's hash.
        let odd = root.path().join("ingest").join("0".repeat(64));
        std::fs::create_dir_all(&odd).unwrap();
        std::fs::write(odd.join("ref"), "ns/99/layer-sha256:a").unwrap();
        std::fs::write(odd.join("data"), "planted").unwrap();
        let file = open(root.path(), "ns", "layer-sha256:a").unwrap();
        let mut contents = String::new();
        std::io::Read::read_to_string(&mut &file, &mut contents).unwrap();
        assert_eq!(contents, "latest");
        assert_eq!(sequence_of("ns/12/r", "ns", "r"), Some(12));
        assert_eq!(sequence_of("ns/12/r", "n", "r"), None);
        assert_eq!(sequence_of("ns//r", "ns", "r"), None);
        assert_eq!(sequence_of("ns/1/2/r", "ns", "r"), None);
    }

    #[tokio::test]
    async fn bytes_come_as_containerd_confirms_them_and_the_answer_ends_at_its_end() {
        let (root, data) = content_root("layer-sha256:a", b"0123");
        let arriving = Arriving::default();
        let guard = arriving.begin(
            "sha256:a",
            BytesAt::Ingest("layer-sha256:a".to_owned()),
            8,
            4,
        );
        let file = open(root.path(), "ns", "layer-sha256:a").unwrap();
        let mut bytes = read(Arc::new(file), arriving.follow("sha256:a").unwrap(), 1, 8);
        assert_eq!(bytes.next().await.unwrap().unwrap(), &b"123"[..]);
        // Nothing more until containerd confirms more.
        let waiting = tokio::time::timeout(std::time::Duration::from_millis(50), bytes.next());
        assert!(waiting.await.is_err());
        std::fs::OpenOptions::new()
            .append(true)
            .open(&data)
            .unwrap()
            .write_all(b"4567")
            .unwrap();
        guard.held(8);
        guard.committed();
        assert_eq!(bytes.next().await.unwrap().unwrap(), &b"4567"[..]);
        assert!(bytes.next().await.is_none());
    }

    #[tokio::test]
    async fn a_write_abandoned_short_of_the_range_ends_the_answer_with_an_error() {
        let (root, _) = content_root("r", b"01");
        let arriving = Arriving::default();
        let guard = arriving.begin("sha256:a", BytesAt::Ingest("r".to_owned()), 8, 2);
        let file = open(root.path(), "ns", "r").unwrap();
        let mut bytes = read(Arc::new(file), arriving.follow("sha256:a").unwrap(), 0, 8);
        assert_eq!(bytes.next().await.unwrap().unwrap(), &b"01"[..]);
        drop(guard);
        assert!(bytes.next().await.unwrap().is_err());
    }

    #[test]
    fn an_ingest_reached_through_a_symlink_or_not_a_file_is_refused() {
        let (root, data) = content_root("r", b"x");
        // The ingest's directory is a symlink to elsewhere.
        let elsewhere = tempfile::tempdir().unwrap();
        std::fs::write(elsewhere.path().join("data"), b"secret").unwrap();
        let dir = data.parent().unwrap();
        std::fs::remove_dir_all(dir).unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), dir).unwrap();
        assert!(open(root.path(), "ns", "r").is_err());
        // The key file is a symlink to a key planted elsewhere.
        std::fs::remove_file(dir).unwrap();
        std::fs::create_dir(dir).unwrap();
        std::fs::write(elsewhere.path().join("ref"), "ns/7/r").unwrap();
        std::os::unix::fs::symlink(elsewhere.path().join("ref"), dir.join("ref")).unwrap();
        std::fs::write(&data, b"x").unwrap();
        assert!(open(root.path(), "ns", "r").is_err());
        // The data file is a symlink.
        std::fs::remove_file(dir.join("ref")).unwrap();
        std::fs::write(dir.join("ref"), "ns/7/r").unwrap();
        assert!(open(root.path(), "ns", "r").is_ok());
        std::fs::remove_file(&data).unwrap();
        std::os::unix::fs::symlink(elsewhere.path().join("data"), &data).unwrap();
        assert!(open(root.path(), "ns", "r").is_err());
        // The data file is a directory, or a FIFO that would block a reader.
        std::fs::remove_file(&data).unwrap();
        std::fs::create_dir(&data).unwrap();
        assert!(open(root.path(), "ns", "r").is_err());
        std::fs::remove_dir(&data).unwrap();
        nix::unistd::mkfifo(&data, nix::sys::stat::Mode::S_IRWXU).unwrap();
        assert!(open(root.path(), "ns", "r").is_err());
        // Missing.
        assert!(open(root.path(), "ns", "other").is_err());
        // The ingest directory itself is a symlink.
        std::fs::remove_file(&data).unwrap();
        std::fs::write(&data, b"x").unwrap();
        let ingests = root.path().join("ingest");
        std::fs::rename(&ingests, root.path().join("moved")).unwrap();
        std::os::unix::fs::symlink(root.path().join("moved"), &ingests).unwrap();
        assert!(open(root.path(), "ns", "r").is_err());
    }
}
