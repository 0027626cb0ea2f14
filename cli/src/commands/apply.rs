//! `riggerctl apply -f FILE|DIR`: every document checked by a dry run first; if one is
//! refused, none is applied.

use std::path::PathBuf;

use rigger_proto::v1::ApplyRequest;
use serde_json::Value;

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
    /// Change nothing. server (also a bare --dry-run): the controller checks every
    /// document and answers with the object as it would store it (defaults filled in);
    /// client: the documents are only read, the controller is not asked.
    #[arg(
        long,
        value_enum,
        num_args = 0..=1,
        require_equals = true,
        default_value = "none",
        default_missing_value = "server",
        value_name = "none|client|server"
    )]
    dry_run: DryRun,
    /// Print the objects (as stored, or as they would be) instead of what happened.
    #[arg(long, short = 'o', value_enum)]
    output: Option<ApplyOutput>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum DryRun {
    None,
    Client,
    Server,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum ApplyOutput {
    Json,
    Yaml,
    Name,
}

pub async fn run(args: Args, client: &mut Client) -> anyhow::Result<()> {
    let Args {
        filename,
        recursive,
        dry_run,
        output,
    } = args;
    let objects = crate::manifests::read(&filename, recursive)?;
    if dry_run == DryRun::Client {
        let read = objects
            .into_iter()
            .map(|o| (o, "created (dry run, client)".to_owned()));
        return print(&read.collect::<Vec<_>>(), output);
    }
    // All or nothing: every document passes a dry run before any is applied.
    let mut checked = Vec::with_capacity(objects.len());
    for object in &objects {
        let response = client
            .apply(ApplyRequest {
                json: object.to_string(),
                dry_run: true,
            })
            .await
            .map_err(|s| refused(&s))?
            .into_inner();
        checked.push((answered(response.object.as_ref(), object), response.outcome));
    }
    if dry_run == DryRun::Server {
        return print(&checked, output);
    }
    let mut stored = Vec::with_capacity(objects.len());
    for object in &objects {
        let response = client
            .apply(ApplyRequest {
                json: object.to_string(),
                dry_run: false,
            })
            .await
            .map_err(|s| refused(&s))?
            .into_inner();
        // Each line as soon as its object is applied: a later refusal leaves them said.
        if output.is_none() {
            println!("{} {}", display_name(object), response.outcome);
        }
        stored.push((answered(response.object.as_ref(), object), response.outcome));
    }
    match output {
        Some(_) => print(&stored, output),
        None => Ok(()),
    }
}

/// The object the controller answered with, or the document when it sent none.
fn answered(object: Option<&rigger_proto::v1::Object>, document: &Value) -> Value {
    object
        .and_then(|o| serde_json::from_str(&o.json).ok())
        .unwrap_or_else(|| document.clone())
}

/// Objects and what became of them: one line each, or the objects as `-o` asks
/// (several as a `List`, as kubectl does).
fn print(objects: &[(Value, String)], output: Option<ApplyOutput>) -> anyhow::Result<()> {
    let whole = || match objects {
        [(one, _)] => one.clone(),
        _ => {
            let items: Vec<&Value> = objects.iter().map(|(o, _)| o).collect();
            serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items})
        }
    };
    match output {
        None => {
            for (object, outcome) in objects {
                println!("{} {outcome}", display_name(object));
            }
        }
        Some(ApplyOutput::Name) => {
            for (object, _) in objects {
                println!("{}", display_name(object));
            }
        }
        Some(ApplyOutput::Json) => println!("{}", serde_json::to_string_pretty(&whole())?),
        Some(ApplyOutput::Yaml) => print!("{}", serde_yaml_ng::to_string(&whole())?),
    }
    Ok(())
}
