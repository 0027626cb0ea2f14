//! How riggerctl prints: kubectl's table layout and its names for objects. The columns
//! are the kinds' own ([`columns`]).

mod columns;
mod jsonpath;

use comfy_table::{Table, presets};
use serde_json::Value;

pub use self::columns::table_rows;
pub use self::jsonpath::Template;
pub use rigger_api::table::bytes;

/// `-o`: what `get` prints.
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    Table,
    Wide,
    Json,
    Yaml,
    /// `kind.group/name` per object, as kubectl's `-o name`.
    Name,
    /// `jsonpath=TEMPLATE`: kubectl's JSONPath template, applied to the object (or to
    /// the `List` of them).
    JsonPath(Template),
}

impl Output {
    /// `-o`'s value, as kubectl spells it; a template is parsed whole here.
    pub fn parse(text: &str) -> Result<Self, String> {
        Ok(match text {
            "table" => Self::Table,
            "wide" => Self::Wide,
            "json" => Self::Json,
            "yaml" => Self::Yaml,
            "name" => Self::Name,
            _ => match text.strip_prefix("jsonpath=") {
                Some(template) => {
                    Self::JsonPath(Template::parse(template).map_err(|e| e.to_string())?)
                }
                None => {
                    return Err(format!(
                        "{text:?}: expected table, wide, json, yaml, name or jsonpath=TEMPLATE"
                    ));
                }
            },
        })
    }
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
