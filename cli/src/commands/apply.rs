//! `riggerctl apply -f FILE`: every document checked by a dry run first; if one is
//! refused, none is applied.

use std::io::Read as _;
use std::path::PathBuf;

use anyhow::Context as _;
use rigger_proto::v1::ApplyRequest;
use serde_json::Value;

use crate::client::{Client, refused};
use crate::output::display_name;

/// Create or update objects from YAML (or JSON); `-` reads standard input. Every
/// document is checked first: if one is refused, none is applied.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[arg(long, short = 'f', value_name = "FILE")]
    filename: PathBuf,
    /// Check only; change nothing.
    #[arg(long)]
    dry_run: bool,
}

/// Every document of a YAML stream, as JSON values; empty documents skipped.
fn documents(text: &str, source: &str) -> anyhow::Result<Vec<Value>> {
    let mut out = Vec::new();
    for (i, document) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        let value: Value = serde::Deserialize::deserialize(document)
            .map_err(|e| anyhow::anyhow!("{source}: document {}: {e}", i + 1))?;
        if !value.is_null() {
            out.push(value);
        }
    }
    if out.is_empty() {
        anyhow::bail!("{source}: no objects");
    }
    Ok(out)
}

pub async fn run(args: Args, client: &mut Client) -> anyhow::Result<()> {
    let Args { filename, dry_run } = args;
    let (text, source) = if filename.as_os_str() == "-" {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .context("cannot read standard input")?;
        (text, "<stdin>".to_owned())
    } else {
        let text = std::fs::read_to_string(&filename)
            .with_context(|| format!("cannot read {}", filename.display()))?;
        (text, filename.display().to_string())
    };
    let objects = documents(&text, &source)?;
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
