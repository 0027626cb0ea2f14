//! `riggerctl get KIND [NAME]`: objects as a table, JSON or YAML; `-w` keeps watching.

use std::collections::BTreeMap;

use rigger_api::Kind;

use crate::client::{Change, Client, ConnectArgs, Selectors, Watch, fetch, fetch_all};
use crate::output::{Output, display_name, print_table, render_table, table_rows};

/// Show objects: one by name, or all of a kind.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Any kind the controller serves, by kubectl's spellings: imagepulljob (ipj),
    /// imagelistpulljob, nodeimage, containerrecreaterequest (crr), sidecarset, pod (po),
    /// node (no), secret, lifecyclecooperator, event (ev). `riggerctl explain` lists them.
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

pub async fn run(
    args: Args,
    client: &mut Client,
    connection: &ConnectArgs,
    namespace: &str,
) -> anyhow::Result<()> {
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
    if watch {
        let into = Watching {
            connection,
            namespace,
            output: &output,
        };
        return watch_and_print(client, resolved, name, selectors, &into).await;
    }
    let objects = match name {
        Some(name) => vec![fetch(client, connection, kind, namespace, name).await?],
        None => fetch_all(client, connection, kind, namespace, &selectors).await?,
    };
    match &output {
        Output::Json | Output::Yaml | Output::JsonPath(_) => {
            let value = match (name, objects.as_slice()) {
                (Some(_), [one]) => one.clone(),
                _ => serde_json::json!({"apiVersion": "v1", "kind": "List", "items": objects}),
            };
            print!("{}", render(&output, &value)?);
        }
        Output::Name => {
            for object in &objects {
                println!("{}", display_name(object));
            }
        }
        Output::Table | Output::Wide => {
            let (header, rows) = table_rows(
                resolved,
                &objects,
                output == Output::Wide,
                namespace.is_empty(),
            )?;
            if rows.is_empty() {
                eprintln!("No resources found.");
            } else {
                print_table(&header, &rows, true);
            }
        }
    }
    Ok(())
}

fn render(output: &Output, value: &serde_json::Value) -> anyhow::Result<String> {
    Ok(match output {
        Output::Json => format!("{}\n", serde_json::to_string_pretty(value)?),
        Output::JsonPath(template) => template.render(value),
        _ => serde_yaml_ng::to_string(value)?,
    })
}

/// Where a `-w` watches and how it prints.
#[derive(Clone, Copy)]
struct Watching<'a> {
    connection: &'a ConnectArgs,
    namespace: &'a str,
    output: &'a Output,
}

/// `-w`: the objects there are, then each as it changes, from the controller's Watch
/// (it sends what changed, not the list again). Tables print their header once, then a
/// row whenever it changes; YAML separates documents with `---`. Through a failover it
/// follows the next leader.
async fn watch_and_print(
    client: &mut Client,
    kind: Kind,
    name: Option<&str>,
    mut selectors: Selectors,
    into: &Watching<'_>,
) -> anyhow::Result<()> {
    let Watching {
        connection,
        namespace,
        output,
    } = *into;
    if let Some(name) = name {
        selectors.fields = format!("metadata.name={name}");
    }
    let mut watch =
        Watch::new(client, kind.name(), namespace, &selectors).following_the_leader(connection);
    // The objects as now known (tables are rendered whole, so columns stay aligned),
    // and what was last printed of each.
    let mut objects: BTreeMap<String, serde_json::Value> = BTreeMap::new();
    let mut printed: BTreeMap<String, String> = BTreeMap::new();
    let mut printed_header = false;
    let mut documents = 0usize;
    loop {
        let (object, deleted) = match watch.next().await? {
            Change::Synced | Change::Relisted => continue,
            Change::Object { object, deleted } => (object, deleted),
        };
        let id = display_name(&object);
        match output {
            Output::Json | Output::Yaml | Output::JsonPath(_) => {
                let text = render(output, &object)?;
                if printed.get(&id) != Some(&text) {
                    if *output == Output::Yaml && documents > 0 {
                        println!("---");
                    }
                    print!("{text}");
                    documents += 1;
                    printed.insert(id.clone(), text);
                }
            }
            Output::Name => {
                let text = object.to_string();
                if printed.get(&id) != Some(&text) {
                    println!("{id}");
                    printed.insert(id.clone(), text);
                }
            }
            Output::Table | Output::Wide => {
                objects.insert(id.clone(), object);
                let all: Vec<serde_json::Value> = objects.values().cloned().collect();
                let (header, rows) =
                    table_rows(kind, &all, *output == Output::Wide, namespace.is_empty())?;
                let lines = render_table(&header, &rows);
                if !printed_header {
                    println!("{}", lines[0]);
                    printed_header = true;
                }
                // The changed object's row (rows follow the objects' order).
                let index = objects.keys().position(|k| *k == id).unwrap_or(0);
                if let Some(line) = lines.get(index + 1)
                    && printed.get(&id) != Some(line)
                {
                    println!("{line}");
                    printed.insert(id.clone(), line.clone());
                }
                if deleted {
                    objects.remove(&id);
                    printed.remove(&id);
                }
            }
        }
        if deleted && !matches!(output, Output::Table | Output::Wide) {
            printed.remove(&id);
        }
    }
}
