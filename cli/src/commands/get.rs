//! `riggerctl get KIND [NAME]`: objects as a table, JSON or YAML; `-w` keeps watching.

use std::time::Duration;

use rigger_api::Kind;

use crate::client::{Client, Selectors, fetch, fetch_all};
use crate::output::{Output, display_name, print_table, render_table, table_rows};

/// Show objects: one by name, or all of a kind.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// imagepulljob (ipj), containerrecreaterequest (crr), pod (po), node (no), secret.
    kind: String,
    name: Option<String>,
    /// table, wide, json, yaml, name, or jsonpath=TEMPLATE (kubectl's syntax).
    #[arg(long, short = 'o', default_value = "table", value_parser = Output::parse)]
    output: Output,
    /// Keep watching and print changes.
    #[arg(long, short = 'w')]
    watch: bool,
    /// List across all namespaces.
    #[arg(long, short = 'A')]
    all_namespaces: bool,
    #[command(flatten)]
    selectors: Selectors,
}

pub async fn run(args: Args, client: &mut Client, namespace: &str) -> anyhow::Result<()> {
    let Args {
        kind,
        name,
        output,
        watch,
        all_namespaces,
        selectors,
    } = args;
    let (kind, name) = (kind.as_str(), name.as_deref());
    let resolved = Kind::parse(kind)?;
    if name.is_some() && !(selectors.labels.is_empty() && selectors.fields.is_empty()) {
        anyhow::bail!("a name cannot be given with a selector (-l, --field-selector)");
    }
    let namespace = if all_namespaces { "" } else { namespace };
    let mut printed_header = false;
    let mut last: Vec<String> = Vec::new();
    loop {
        let objects = match name {
            Some(name) => vec![fetch(client, kind, namespace, name).await?],
            None => fetch_all(client, kind, namespace, &selectors).await?,
        };
        match &output {
            Output::Json | Output::Yaml | Output::JsonPath(_) => {
                let value = match (name, objects.as_slice()) {
                    (Some(_), [one]) => one.clone(),
                    _ => serde_json::json!({"apiVersion": "v1", "kind": "List", "items": objects}),
                };
                let text = match &output {
                    Output::Json => format!("{}\n", serde_json::to_string_pretty(&value)?),
                    Output::JsonPath(template) => template.render(&value),
                    _ => serde_yaml_ng::to_string(&value)?,
                };
                if last.first() != Some(&text) {
                    if watch && !last.is_empty() && output == Output::Yaml {
                        println!("---");
                    }
                    print!("{text}");
                    last = vec![text];
                }
            }
            Output::Name => {
                // Watching: an object's name again whenever it changes.
                let current: Vec<String> = objects.iter().map(|o| o.to_string()).collect();
                for (object, text) in objects.iter().zip(&current) {
                    if !last.contains(text) {
                        println!("{}", display_name(object));
                    }
                }
                last = current;
            }
            Output::Table | Output::Wide => {
                let all_namespaces = namespace.is_empty();
                let (header, rows) =
                    table_rows(resolved, &objects, output == Output::Wide, all_namespaces)?;
                if !watch {
                    if rows.is_empty() {
                        eprintln!("No resources found.");
                    } else {
                        print_table(&header, &rows, true);
                    }
                    return Ok(());
                }
                // Watching: the header once, then each row whenever it changes.
                let lines: Vec<String> = render_table(&header, &rows);
                if !printed_header {
                    println!("{}", lines[0]);
                    printed_header = true;
                }
                for line in &lines[1..] {
                    if !last.contains(line) {
                        println!("{line}");
                    }
                }
                last = lines;
            }
        }
        if !watch {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
