//! `riggerctl delete KIND NAME`.

use rigger_proto::v1::DeleteRequest;

use crate::client::{Client, refused};

/// Delete an object.
#[derive(Debug, clap::Args)]
pub struct Args {
    kind: String,
    name: String,
}

pub async fn run(args: Args, client: &mut Client, namespace: &str) -> anyhow::Result<()> {
    let Args { kind, name } = args;
    client
        .delete(DeleteRequest {
            kind: kind.clone(),
            namespace: namespace.to_owned(),
            name: name.clone(),
        })
        .await
        .map_err(|s| refused(&s))?;
    println!("{} \"{name}\" deleted", kind.to_ascii_lowercase());
    Ok(())
}
