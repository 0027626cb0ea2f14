//! Printing the inventory for people (tables, like kubectl) and for programs (JSON).

use std::fmt::Write as _;

use bytesize::ByteSize;
use comfy_table::{Table, presets};

use crate::inventory::Inventory;

/// Output format of `rigger-agent status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum OutputFormat {
    #[default]
    Table,
    Json,
}

pub fn render(inventory: &Inventory, format: OutputFormat) -> Result<String, serde_json::Error> {
    match format {
        OutputFormat::Json => serde_json::to_string_pretty(inventory).map(|mut s| {
            s.push('\n');
            s
        }),
        OutputFormat::Table => Ok(table(inventory)),
    }
}

fn bytes(n: u64) -> String {
    ByteSize::b(n).display().iec().to_string()
}

fn or_dash(value: Option<&str>) -> &str {
    value.filter(|v| !v.is_empty()).unwrap_or("-")
}

/// `sha256:0123456789ab`: enough to tell images apart on one node; JSON has the full one.
fn short_digest(digest: &str) -> &str {
    let end = digest.find(':').map_or(12, |i| i + 1 + 12);
    digest.get(..end).unwrap_or(digest)
}

fn list(header: &[&str], rows: Vec<Vec<String>>) -> String {
    let mut table = Table::new();
    table.load_preset(presets::NOTHING);
    table.set_header(header.to_vec());
    for row in rows {
        table.add_row(row);
    }
    for column in table.column_iter_mut() {
        column.set_padding((0, 2));
    }
    // comfy-table pads the last column too; trailing blanks only get in the way of grep.
    table
        .to_string()
        .lines()
        .map(str::trim_end)
        .collect::<Vec<_>>()
        .join("\n")
}

fn table(inv: &Inventory) -> String {
    let mut out = String::new();
    let rt = &inv.runtime;
    let host = &inv.host;
    let _ = writeln!(out, "RUNTIME");
    let _ = writeln!(out, "  socket      {}", rt.address);
    let _ = writeln!(
        out,
        "  containerd  {} (revision {})",
        rt.containerd.version,
        or_dash(Some(&rt.containerd.revision))
    );
    match &rt.cri {
        Some(cri) => {
            let _ = writeln!(
                out,
                "  cri         {} {} (CRI API {})",
                cri.runtime_name, cri.runtime_version, cri.api_version
            );
        }
        None => {
            let _ = writeln!(out, "  cri         unavailable (see warnings)");
        }
    }
    let _ = writeln!(
        out,
        "  root        {} ({} used)",
        or_dash(rt.root_dir.as_deref()),
        rt.root_bytes_used.map_or_else(|| "-".to_owned(), bytes)
    );
    let _ = writeln!(out, "HOST");
    let _ = writeln!(out, "  hostname    {}", or_dash(host.hostname.as_deref()));
    let _ = writeln!(
        out,
        "  kernel      {}",
        or_dash(host.kernel_version.as_deref())
    );
    let [one, five, fifteen] = host.load_average;
    let _ = writeln!(
        out,
        "  cpu         {} cpus, load {one:.2} {five:.2} {fifteen:.2}",
        host.cpus
    );
    let _ = writeln!(
        out,
        "  memory      {} available of {}",
        bytes(host.memory_available_bytes),
        bytes(host.memory_total_bytes)
    );
    if let Some(fs) = &host.filesystem {
        let _ = writeln!(
            out,
            "  filesystem  {} ({}): {} available of {}",
            fs.mount_point,
            fs.fs_type,
            bytes(fs.available_bytes),
            bytes(fs.total_bytes)
        );
    }

    let _ = writeln!(out, "\nIMAGES ({})", inv.images.len());
    let rows = inv
        .images
        .iter()
        .map(|i| {
            vec![
                i.namespace.clone(),
                i.name.clone(),
                short_digest(&i.digest).to_owned(),
                i.size.map_or_else(|| "-".to_owned(), bytes),
            ]
        })
        .collect();
    let _ = writeln!(
        out,
        "{}",
        list(&["NAMESPACE", "NAME", "DIGEST", "SIZE"], rows)
    );

    let _ = writeln!(out, "\nPODS ({})", inv.pods.len());
    let rows = inv
        .pods
        .iter()
        .map(|p| {
            vec![
                p.namespace.clone(),
                p.name.clone(),
                p.owner.as_str().to_owned(),
                p.state.clone(),
                p.attempt.to_string(),
                or_dash(p.created_at.as_deref()).to_owned(),
                p.id.get(..13).unwrap_or(&p.id).to_owned(),
            ]
        })
        .collect();
    let _ = writeln!(
        out,
        "{}",
        list(
            &[
                "NAMESPACE",
                "NAME",
                "OWNER",
                "STATE",
                "ATTEMPT",
                "CREATED",
                "ID"
            ],
            rows
        )
    );

    let _ = writeln!(out, "\nCONTAINERS ({})", inv.containers.len());
    let rows = inv
        .containers
        .iter()
        .map(|c| {
            let pod = match (&c.pod_namespace, &c.pod_name) {
                (Some(ns), Some(name)) => format!("{ns}/{name}"),
                _ => format!("({})", c.namespace),
            };
            vec![
                pod,
                c.name.clone(),
                c.image.clone(),
                c.state.clone(),
                c.attempt.to_string(),
                c.restart_count.to_string(),
                or_dash(c.started_at.as_deref()).to_owned(),
                c.id.get(..13).unwrap_or(&c.id).to_owned(),
            ]
        })
        .collect();
    let _ = writeln!(
        out,
        "{}",
        list(
            &[
                "POD",
                "CONTAINER",
                "IMAGE",
                "STATE",
                "ATTEMPT",
                "RESTARTS",
                "STARTED",
                "ID"
            ],
            rows
        )
    );

    if !inv.warnings.is_empty() {
        let _ = writeln!(out, "\nWARNINGS");
        for w in &inv.warnings {
            let _ = writeln!(out, "  {w}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_are_shortened_for_tables() {
        assert_eq!(
            short_digest("sha256:0123456789abcdef0123456789abcdef"),
            "sha256:0123456789ab"
        );
        assert_eq!(short_digest("short"), "short");
    }

    #[test]
    fn lists_have_no_trailing_blanks() {
        let text = list(&["A", "B"], vec![vec!["x".into(), "y".into()]]);
        assert!(text.lines().all(|l| l == l.trim_end()), "{text:?}");
        assert!(text.starts_with("A  B"), "{text:?}");
    }
}
