//! Reading a whole response body that must stay small (manifests, token responses):
//! refused as soon as it passes its limit, however much the server would send.

use bytes::Bytes;
use futures::StreamExt as _;

/// Why a capped read stopped.
pub enum CappedRead {
    /// Past the limit (by `Content-Length` or by what arrived): nothing more was read.
    TooBig,
    /// The body could not be read.
    Failed(String),
}

/// The body of `response`, refused (without reading further) past `cap` bytes.
pub async fn read_capped(response: reqwest::Response, cap: u64) -> Result<Bytes, CappedRead> {
    if response.content_length().is_some_and(|n| n > cap) {
        return Err(CappedRead::TooBig);
    }
    let mut body = Vec::new();
    let mut stream = response.bytes_stream();
    while let Some(piece) = stream.next().await {
        let piece = piece.map_err(|e| CappedRead::Failed(rigger_daemon::error_chain(&e)))?;
        if (body.len() + piece.len()) as u64 > cap {
            return Err(CappedRead::TooBig);
        }
        body.extend_from_slice(&piece);
    }
    Ok(Bytes::from(body))
}
