//! The table `get` prints: each object decoded into its kind's type, whose columns the
//! kind names (`KindInfo::table`); `-A` adds the namespace of namespaced kinds.

use std::time::SystemTime;

use rigger_api::Kind;
use rigger_api::table::TableOptions;
use serde_json::Value;

use super::display_name;

/// The header and rows for `objects`, all of `kind`.
pub fn table_rows(
    kind: Kind,
    objects: &[Value],
    wide: bool,
    all_namespaces: bool,
) -> anyhow::Result<(Vec<String>, Vec<Vec<String>>)> {
    let options = TableOptions {
        wide,
        namespace_column: all_namespaces && kind.namespaced(),
        now: SystemTime::now(),
    };
    let table = (kind.info().table)(objects, options).map_err(|unreadable| {
        let name = objects
            .get(unreadable.index)
            .map_or_else(|| kind.to_string(), display_name);
        anyhow::anyhow!(
            "{name} as the controller sent it is unreadable: {}",
            unreadable.source
        )
    })?;
    Ok((table.header, table.rows))
}
