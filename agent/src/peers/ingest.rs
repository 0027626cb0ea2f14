//! The bytes of a blob still arriving on this node: containerd's ingest file for it
//! (`<content root>/ingest/<sha256 of the ingest ref>/data`, the local content store's
//! layout in 1.6 to 2.x), read as far as containerd confirmed writing it.
//!
//! containerd's API reads only committed blobs, so this is the one place the agent reads
//! containerd's files: read-only, opened beneath the content root with no symlink
//! followed, a regular file only. The file is opened once per answer; when containerd
//! commits the blob it renames that file into its blob store, and the open descriptor
//! goes on reading the same bytes. Whoever receives them checks them against the blob's
//! digest; a write that stops or starts over ends the answer early.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt as _;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use futures::stream::{self, BoxStream, StreamExt as _};
use rigger_pull::arriving::{Arrival, ArrivalState, Following};
use rustix::fs::{Mode, OFlags, ResolveFlags};
use sha2::{Digest as _, Sha256};
use tokio::sync::watch;

/// Bytes read from the ingest file at a time.
const PIECE: u64 = 256 << 10;

/// The ingest file of `ingest_ref` under containerd's content root.
pub fn open(content_root: &Path, ingest_ref: &str) -> std::io::Result<File> {
    let root = rustix::fs::open(
        content_root,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let relative = format!("ingest/{}/data", hex::encode(Sha256::digest(ingest_ref)));
    let fd: OwnedFd = rustix::fs::openat2(
        &root,
        relative.as_str(),
        // NONBLOCK: a FIFO put there must not hang the open (it is refused below).
        OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW | OFlags::NOCTTY | OFlags::NONBLOCK,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )?;
    let file = File::from(fd);
    if !file.metadata()?.file_type().is_file() {
        return Err(std::io::Error::other(format!(
            "{relative} under {} is not a regular file",
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
    file: File,
    following: Following,
    start: u64,
    end: u64,
) -> BoxStream<'static, Result<Bytes, String>> {
    let reader = Reader {
        file: Arc::new(file),
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

    use rigger_pull::arriving::Arriving;

    use super::*;

    /// A content root with an ingest for `reference` holding `bytes`.
    fn content_root(reference: &str, bytes: &[u8]) -> (tempfile::TempDir, std::path::PathBuf) {
        let root = tempfile::tempdir().unwrap();
        let dir = root
            .path()
            .join("ingest")
            .join(hex::encode(Sha256::digest(reference)));
        std::fs::create_dir_all(&dir).unwrap();
        let data = dir.join("data");
        std::fs::write(&data, bytes).unwrap();
        (root, data)
    }

    #[tokio::test]
    async fn bytes_come_as_containerd_confirms_them_and_the_answer_ends_at_its_end() {
        let (root, data) = content_root("layer-sha256:a", b"0123");
        let arriving = Arriving::default();
        let guard = arriving.begin("sha256:a", "layer-sha256:a", 8, 4);
        let file = open(root.path(), "layer-sha256:a").unwrap();
        let mut bytes = read(file, arriving.follow("sha256:a").unwrap(), 1, 8);
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
        let guard = arriving.begin("sha256:a", "r", 8, 2);
        let file = open(root.path(), "r").unwrap();
        let mut bytes = read(file, arriving.follow("sha256:a").unwrap(), 0, 8);
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
        assert!(open(root.path(), "r").is_err());
        // The data file is a symlink.
        std::fs::remove_file(dir).unwrap();
        std::fs::create_dir(dir).unwrap();
        std::os::unix::fs::symlink(elsewhere.path().join("data"), &data).unwrap();
        assert!(open(root.path(), "r").is_err());
        // The data file is a directory, or a FIFO that would block a reader.
        std::fs::remove_file(&data).unwrap();
        std::fs::create_dir(&data).unwrap();
        assert!(open(root.path(), "r").is_err());
        std::fs::remove_dir(&data).unwrap();
        nix::unistd::mkfifo(&data, nix::sys::stat::Mode::S_IRWXU).unwrap();
        assert!(open(root.path(), "r").is_err());
        // Missing.
        assert!(open(root.path(), "other").is_err());
    }
}
