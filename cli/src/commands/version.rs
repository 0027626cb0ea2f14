//! `riggerctl version`: riggerctl's release and the controller's, as `kubectl version`
//! prints the client's and the server's (the skew between them is the operator's to
//! see: docs/operator-guide.md, "Upgrades and version skew").

use rigger_proto::v1::VersionRequest;

use crate::client::{Client, refused};

/// Print riggerctl's version and commit, then the controller's.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// riggerctl's own version only; the controller is not asked.
    #[arg(long)]
    pub client: bool,
}

/// riggerctl's line: `Client Version: 0.2.0 (commit 0123456789ab)`.
pub fn client_line() -> String {
    format!("Client Version: {}", rigger_version::LONG)
}

pub async fn run(client: &mut Client) -> anyhow::Result<()> {
    match client.version(VersionRequest {}).await {
        Ok(reply) => {
            let info = reply.into_inner();
            println!("Server Version: {} (commit {})", info.version, info.commit);
            Ok(())
        }
        // Answered by a controller that predates the call.
        Err(status) if status.code() == tonic::Code::Unimplemented => {
            println!("Server Version: older than 0.2.0 (it cannot say)");
            Ok(())
        }
        Err(status) => Err(refused(&status)),
    }
}
