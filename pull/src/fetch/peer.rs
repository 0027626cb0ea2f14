//! A blob from the pull's peers, before the registry: each usable peer in turn streams
//! from the ingest's offset on, so what one peer sent is kept when the next goes on.
//! containerd checks the digest at commit; when it does not match, the blob starts over
//! from the registry, and the peer that sent its bytes is suspected (not asked again,
//! named in the result) — when one did: of several, none is (`Peers::blame`).

use std::collections::HashMap;

use futures::StreamExt as _;

use super::{Sink, Transfer};
use crate::error::PullError;
use crate::progress::ProgressEvent;
use crate::store::StoreError;

/// How a blob's turn with the peers ended.
pub(super) enum FromPeers {
    /// containerd holds the blob, committed.
    Committed,
    /// The registry does the rest (from the ingest's offset).
    Registry,
}

impl Transfer {
    pub(super) async fn fetch_from_peers(
        &self,
        digest: &str,
        size: u64,
        labels: &HashMap<String, String>,
        sink: &mut Sink,
    ) -> Result<FromPeers, PullError> {
        let Some(peers) = &self.peers else {
            return Ok(FromPeers::Registry);
        };
        for source in peers.usable() {
            let start = sink.writer.offset();
            if start >= size {
                break;
            }
            let (relayed, mut body) =
                match peers.get(&source, &self.repository, digest, start).await {
                    Ok(answer) => answer,
                    Err(refusal) => {
                        peers.refused(&source.node, digest, &refusal);
                        continue;
                    }
                };
            let mut sent = 0u64;
            let mut ended_early = false;
            while let Some(piece) = body.next().await {
                let piece = match piece {
                    Ok(piece) => piece,
                    Err(error) => {
                        peers.broke(&source.node, digest, &error);
                        ended_early = true;
                        break;
                    }
                };
                if sink.writer.offset() + piece.len() as u64 > size {
                    // More than the manifest promises: this peer sent it, whatever the
                    // others did (a relay passed it on: it is only left); the blob
                    // starts over without it.
                    if relayed {
                        peers.drop_source(&source.node, "its answer ran past the blob's size");
                    } else {
                        peers.suspect(std::slice::from_ref(&source.node));
                    }
                    self.restart_blob(digest, sink).await?;
                    // Its bytes are gone with the restart: it is no contributor now.
                    sent = 0;
                    break;
                }
                if let Some(rate) = &self.rate {
                    rate.acquire(piece.len()).await;
                }
                sink.write(piece.clone())
                    .await
                    .map_err(|e| self.store_err(e))?;
                sent += piece.len() as u64;
                peers.count(piece.len() as u64);
                self.progress.event(ProgressEvent::BlobBytes {
                    digest: digest.to_owned(),
                    bytes: piece.len() as u64,
                });
            }
            if sent > 0 && !sink.peer_nodes.contains(&source.node) {
                sink.peer_nodes.push(source.node.clone());
            }
            if sent > 0 && relayed && !sink.relayed_peers.contains(&source.node) {
                sink.relayed_peers.push(source.node.clone());
            }
            // An answer that ended before the blob did (the loop above also ends when the
            // peer's body ends short of the blob).
            if sent > 0
                && (ended_early || sink.writer.offset() < size)
                && !sink.broken_peers.contains(&source.node)
            {
                sink.broken_peers.push(source.node.clone());
            }
        }
        if sink.writer.offset() < size || sink.peer_nodes.is_empty() {
            return Ok(FromPeers::Registry);
        }
        match sink.writer.commit(labels.clone()).await {
            Ok(()) => {
                tracing::debug!(%digest, peers = ?sink.peer_nodes, "blob from peers");
                self.remove_spool(digest);
                self.progress.event(ProgressEvent::BlobDone {
                    digest: digest.to_owned(),
                    skipped: false,
                });
                Ok(FromPeers::Committed)
            }
            Err(StoreError::DigestMismatch { .. }) => {
                tracing::warn!(%digest, peers = ?sink.peer_nodes, "bytes from peers did not match the blob's digest; fetching it from the registry");
                peers.blame(&sink.peer_nodes, &sink.broken_peers, &sink.relayed_peers);
                self.restart_blob(digest, sink).await?;
                Ok(FromPeers::Registry)
            }
            Err(e) if e.is_connection_lost() => {
                self.resume_after_containerd(digest, sink).await?;
                Ok(FromPeers::Registry)
            }
            Err(e) => Err(self.store_err(e)),
        }
    }
}
