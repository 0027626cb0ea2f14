//! `riggerctl apply -f FILE`: every document checked by a dry run first; if one is
//! refused, none is applied.

use std::path::PathBuf;

use rigger_proto::v1::ApplyRequest;

use crate::client::{Client, refused};
use crate::output::display_name;

/// Create or update objects from YAML (or JSON): files, directories (their .yaml, .yml
/// and .json files; with -R their subdirectories' too) or `-` for standard input.
/// Every document is checked first: if one is refused, none is applied.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[arg(long, short = 'f', value_name = "FILE|DIR", required = true)]
    filename: Vec<PathBuf>,
    /// Read directories' subdirectories too.
    #[arg(long, short = 'R')]
    recursive: bool,
    /// Check only; change nothing.
    #[arg(long)]
    dry_run: bool,
}

pub async fn run(args: Args, client: &mut Client) -> anyhow::Result<()> {
    let Args {
        filename,
        recursive,
        dry_run,
    } = args;
    let objects = crate::manifests::read(&filename, recursive)?;
    // All or nothing: every document passes a dry run before any is applied.
    for object in &objects {
        client
            .apply(ApplyRequest {
                json: object.to_string(),
                dry_run: true,
            })
            .await
            .map_err(|s| refused(&s))?;
    }
    if dry_run {
        for object in &objects {
            println!("{} (dry run)", display_name(object));
        }
        return Ok(());
    }
    for object in &objects {
        let response = client
            .apply(ApplyRequest {
                json: object.to_string(),
                dry_run: false,
            })
            .await
            .map_err(|s| refused(&s))?
            .into_inner();
        println!("{} {}", display_name(object), response.outcome);
    }
    Ok(())
}
