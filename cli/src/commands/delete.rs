//! `riggerctl delete KIND NAME` and `riggerctl delete -f FILE|DIR`.

use std::path::PathBuf;

use anyhow::Context as _;
use rigger_proto::v1::DeleteRequest;

use crate::client::{Client, refused};
use crate::output::display_name;

/// Delete an object, or every object of files and directories (as `apply -f` reads
/// them; each in its `metadata.namespace`, else -n's).
#[derive(Debug, clap::Args)]
pub struct Args {
    #[arg(required_unless_present = "filename", conflicts_with = "filename")]
    kind: Option<String>,
    #[arg(required_unless_present = "filename")]
    name: Option<String>,
    #[arg(long, short = 'f', value_name = "FILE|DIR")]
    filename: Vec<PathBuf>,
    /// Read directories' subdirectories too.
    #[arg(long, short = 'R', requires = "filename")]
    recursive: bool,
    /// An object that does not exist is no error.
    #[arg(long)]
    ignore_not_found: bool,
}

pub async fn run(args: Args, client: &mut Client, namespace: &str) -> anyhow::Result<()> {
    let Args {
        kind,
        name,
        filename,
        recursive,
        ignore_not_found,
    } = args;
    if let (Some(kind), Some(name)) = (kind, name) {
        return match delete(client, &kind, namespace, &name, ignore_not_found).await? {
            true => {
                println!("{} \"{name}\" deleted", kind.to_ascii_lowercase());
                Ok(())
            }
            false => Ok(()),
        };
    }
    let objects = crate::manifests::read(&filename, recursive)?;
    // Every object named is checked before any is deleted: a file with a typo deletes
    // nothing.
    let mut targets = Vec::new();
    for object in &objects {
        let field = |pointer: &str| {
            object
                .pointer(pointer)
                .and_then(|v| v.as_str())
                .filter(|s| !s.is_empty())
        };
        let kind = field("/kind").with_context(|| format!("{}: no kind", display_name(object)))?;
        let name = field("/metadata/name")
            .with_context(|| format!("{}: no metadata.name", display_name(object)))?;
        let namespace = field("/metadata/namespace").unwrap_or(namespace);
        targets.push((object, kind, name, namespace));
    }
    // Like kubectl: every object is tried; the failures are reported at the end.
    let mut failed = 0;
    for (object, kind, name, namespace) in targets {
        match delete(client, kind, namespace, name, ignore_not_found).await {
            Ok(true) => println!("{} deleted", display_name(object)),
            Ok(false) => {}
            Err(e) => {
                eprintln!("riggerctl: {}: {e:#}", display_name(object));
                failed += 1;
            }
        }
    }
    match failed {
        0 => Ok(()),
        n => anyhow::bail!("{n} of {} objects not deleted", objects.len()),
    }
}

/// Delete one object. `Ok(false)`: it did not exist and `ignore_not_found` said that is
/// fine.
async fn delete(
    client: &mut Client,
    kind: &str,
    namespace: &str,
    name: &str,
    ignore_not_found: bool,
) -> anyhow::Result<bool> {
    match client
        .delete(DeleteRequest {
            kind: kind.to_owned(),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        })
        .await
    {
        Ok(_) => Ok(true),
        Err(status) if ignore_not_found && status.code() == tonic::Code::NotFound => Ok(false),
        Err(status) => Err(refused(&status)),
    }
}
