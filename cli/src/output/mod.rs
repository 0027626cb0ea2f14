//! How riggerctl prints: kubectl's table layout, its names for objects, ages and sizes.
//! Per-kind columns are in [`columns`].

mod columns;

use std::time::SystemTime;

use comfy_table::{Table, presets};
use serde_json::Value;

pub use self::columns::table_rows;

/// `-o`: what `get` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Table,
    Wide,
    Json,
    Yaml,
}

/// `imagepulljob.rigger.dev/warm`, as kubectl names objects.
pub fn display_name(object: &Value) -> String {
    let kind = object["kind"]
        .as_str()
        .unwrap_or("object")
        .to_ascii_lowercase();
    let group = object["apiVersion"]
        .as_str()
        .and_then(|v| v.split_once('/'))
        .map(|(group, _)| format!(".{group}"))
        .unwrap_or_default();
    let name = object["metadata"]["name"].as_str().unwrap_or("");
    format!("{kind}{group}/{name}")
}

/// The string at `pointer`, or `""`.
pub fn str_of<'a>(value: &'a Value, pointer: &str) -> &'a str {
    value.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

/// The number at `pointer`, or 0.
pub fn num_of(value: &Value, pointer: &str) -> u64 {
    value.pointer(pointer).and_then(Value::as_u64).unwrap_or(0)
}

/// kubectl-style age of an RFC 3339 time: `5s`, `3m`, `2h`, `4d`.
pub fn age(rfc3339: &str) -> String {
    let Ok(then) = humantime::parse_rfc3339(rfc3339) else {
        return "-".to_owned();
    };
    let secs = SystemTime::now()
        .duration_since(then)
        .unwrap_or_default()
        .as_secs();
    match secs {
        0..120 => format!("{secs}s"),
        120..7200 => format!("{}m", secs / 60),
        7200..172_800 => format!("{}h", secs / 3600),
        _ => format!("{}d", secs / 86_400),
    }
}

/// A size as kubectl-like short IEC units.
pub fn bytes(n: u64) -> String {
    bytesize::ByteSize::b(n).display().iec_short().to_string()
}

/// A table as lines, columns two spaces apart, trailing blanks trimmed.
pub fn render_table(header: &[String], rows: &[Vec<String>]) -> Vec<String> {
    let mut table = Table::new();
    table.load_preset(presets::NOTHING);
    table.set_header(header.to_vec());
    for row in rows {
        table.add_row(row.clone());
    }
    for column in table.column_iter_mut() {
        column.set_padding((0, 2));
    }
    table
        .to_string()
        .lines()
        .map(|l| l.trim_end().to_owned())
        .collect()
}

pub fn print_table(header: &[String], rows: &[Vec<String>], with_header: bool) {
    for (i, line) in render_table(header, rows).iter().enumerate() {
        if i > 0 || with_header {
            println!("{line}");
        }
    }
}
