//! The node's one connection to containerd's socket: made when first used (containerd
//! may start after the agent), kept, and made again after containerd went away. The
//! pull engine, CRI and the agent's other calls share it, so the node's containerd has
//! one client connection from Rigger, not one per caller.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tonic::Status;
use tonic::transport::Channel;

use crate::{ConnectError, Runtime};

/// A connection to containerd, shared (`Arc`) by everything on the node that calls it.
#[derive(Debug)]
pub struct Connection {
    address: PathBuf,
    timeout: Duration,
    current: tokio::sync::Mutex<Option<Runtime>>,
}

impl Connection {
    /// Nothing is dialled until the first call.
    pub fn new(address: &Path, timeout: Duration) -> Self {
        Self {
            address: address.to_owned(),
            timeout,
            current: tokio::sync::Mutex::new(None),
        }
    }

    pub fn address(&self) -> &Path {
        &self.address
    }

    /// The connection, made now if there is none (checked: containerd answers).
    pub async fn runtime(&self) -> Result<Runtime, ConnectError> {
        let mut current = self.current.lock().await;
        if let Some(runtime) = current.as_ref() {
            return Ok(runtime.clone());
        }
        let runtime = Runtime::connect(&self.address, self.timeout).await?;
        Ok(current.insert(runtime).clone())
    }

    /// The channel, made now if there is none; a failure as containerd's status
    /// (`Unavailable`, naming the socket and the cause).
    pub async fn channel(&self) -> Result<Channel, Status> {
        self.runtime()
            .await
            .map(|r| r.channel())
            .map_err(|e| Status::unavailable(e.to_string()))
    }

    /// A call failed with `status`: when it says containerd is gone, the next call
    /// dials again.
    pub async fn failed(&self, status: &Status) {
        if status.code() == tonic::Code::Unavailable {
            *self.current.lock().await = None;
        }
    }
}
