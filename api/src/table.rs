//! How `get` shows each kind as a table, as kubectl's printers do: every kind names its
//! columns and fills a row ([`Columns`]); `-o wide` adds some. The namespace column of
//! `-A` is the printer's, not the kind's.

use std::collections::BTreeMap;
use std::time::SystemTime;

use serde::de::DeserializeOwned;
use serde_json::Value;

/// A kind's table columns.
pub trait Columns {
    /// The column names; `wide` adds those `-o wide` shows.
    fn header(wide: bool) -> Vec<&'static str>;

    /// This object's cells, in the header's order; ages are counted to `now`.
    fn row(&self, wide: bool, now: SystemTime) -> Vec<String>;
}

/// How `get` asks for a table.
#[derive(Debug, Clone, Copy)]
pub struct TableOptions {
    /// `-o wide`'s extra columns.
    pub wide: bool,
    /// `-A`'s namespace column (namespaced kinds only).
    pub namespace_column: bool,
    /// Ages are counted to it.
    pub now: SystemTime,
}

/// A table: the header and a row per object.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Table {
    pub header: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

/// Object `index` of a listing is not of the kind it was listed as.
#[derive(Debug, thiserror::Error)]
#[error("object {index} is unreadable: {source}")]
pub struct UnreadableRow {
    pub index: usize,
    pub source: serde_json::Error,
}

/// The table of `objects`, each decoded as `T` (a kind's `KindInfo::table`).
pub fn table_of<T: Columns + DeserializeOwned>(
    objects: &[Value],
    options: TableOptions,
) -> Result<Table, UnreadableRow> {
    let mut header: Vec<String> = Vec::new();
    if options.namespace_column {
        header.push("NAMESPACE".to_owned());
    }
    header.extend(T::header(options.wide).into_iter().map(str::to_owned));
    let mut rows = Vec::with_capacity(objects.len());
    for (index, object) in objects.iter().enumerate() {
        let typed = T::deserialize(object).map_err(|source| UnreadableRow { index, source })?;
        let mut row = Vec::new();
        if options.namespace_column {
            let namespace = object
                .pointer("/metadata/namespace")
                .and_then(Value::as_str);
            row.push(namespace.unwrap_or_default().to_owned());
        }
        row.extend(typed.row(options.wide, options.now));
        rows.push(row);
    }
    Ok(Table { header, rows })
}

/// kubectl's age of an RFC 3339 time: `5s`, `3m`, `2h`, `4d`; `-` when unknown.
pub fn age(rfc3339: Option<&str>, now: SystemTime) -> String {
    let Some(then) = rfc3339.and_then(|t| humantime::parse_rfc3339(t).ok()) else {
        return "-".to_owned();
    };
    let secs = now.duration_since(then).unwrap_or_default().as_secs();
    match secs {
        0..120 => format!("{secs}s"),
        120..7200 => format!("{}m", secs / 60),
        7200..172_800 => format!("{}h", secs / 3600),
        _ => format!("{}d", secs / 86_400),
    }
}

/// A size in kubectl-like short IEC units.
pub fn bytes(n: u64) -> String {
    bytesize::ByteSize::b(n).display().iec_short().to_string()
}

/// `-` for an empty cell, as kubectl prints `<none>`-like values.
pub fn or_dash(s: &str) -> String {
    match s {
        "" => "-".to_owned(),
        s => s.to_owned(),
    }
}

/// `a=1,b=2`, as kubectl shows labels.
pub fn join_labels(labels: &BTreeMap<String, String>) -> String {
    labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::time::Duration;

    use super::*;

    fn at(rfc3339: &str) -> SystemTime {
        humantime::parse_rfc3339(rfc3339).unwrap()
    }

    #[test]
    fn ages_read_as_kubectl_prints_them() {
        let now = at("2026-01-02T00:00:00Z");
        assert_eq!(age(Some("2026-01-01T23:59:30Z"), now), "30s");
        assert_eq!(age(Some("2026-01-01T23:50:00Z"), now), "10m");
        assert_eq!(age(Some("2026-01-01T21:00:00Z"), now), "3h");
        assert_eq!(age(Some("2025-12-28T00:00:00Z"), now), "5d");
        assert_eq!(age(Some("not a time"), now), "-");
        assert_eq!(age(None, now), "-");
        assert_eq!(
            age(Some("2026-01-02T00:00:00Z"), now - Duration::from_secs(5)),
            "0s"
        );
    }
}
