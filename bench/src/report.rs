//! BENCHMARKS.md as the benchmarks write it: each writes its latest table between
//! markers of its own and touches nothing else, so the text around the tables (targets,
//! where the time goes) survives a re-run. [`SECTIONS`] lists every writer's markers, the
//! Python benches' in `bench/` too, and a test holds the report and the writers to them.

use std::path::Path;

use anyhow::Context as _;

/// One benchmark's section of the report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Section {
    /// The section's name in its markers (`fleet`).
    pub name: &'static str,
    /// Who writes it: a binary (`rigger-bench-fleet`) or a script (`bench/cold-pull`).
    pub writer: &'static str,
}

pub const COLD_PULL: Section = Section {
    name: "cold-pull",
    writer: "bench/cold-pull",
};
pub const CONCURRENCY: Section = Section {
    name: "concurrency",
    writer: "bench/pull-concurrent",
};
pub const FLEET_PULL: Section = Section {
    name: "fleet-pull",
    writer: "bench/fleet-pull",
};
pub const FLEET: Section = Section {
    name: "fleet",
    writer: "rigger-bench-fleet",
};
pub const API_LOAD: Section = Section {
    name: "api-load",
    writer: "rigger-bench-api-load",
};
pub const CLUSTER_SCALE: Section = Section {
    name: "cluster-scale",
    writer: "rigger-bench-cluster-scale",
};

pub const KRUISE: Section = Section {
    name: "kruise",
    writer: "bench/kruise",
};

/// Every section a benchmark writes, in the report's order. The Python benches write
/// theirs through `bench/report.py`, whose list must say the same (a test holds it to
/// this one).
pub const SECTIONS: &[Section] = &[
    COLD_PULL,
    CONCURRENCY,
    FLEET_PULL,
    FLEET,
    API_LOAD,
    CLUSTER_SCALE,
    KRUISE,
];

impl Section {
    /// The line before the section's table.
    pub fn begin(&self) -> String {
        format!("<!-- {}: written by {} -->", self.name, self.writer)
    }

    /// The line after it.
    pub fn end(&self) -> String {
        format!("<!-- {}: end -->", self.name)
    }

    /// `text` with `table` between this section's markers (at its end, markers and all,
    /// where it has none yet). Pure.
    pub fn replaced_in(&self, text: &str, table: &str) -> String {
        let (begin, end) = (self.begin(), self.end());
        let section = format!("{begin}\n{table}{end}");
        match (text.find(&begin), text.find(&end)) {
            (Some(start), Some(stop)) if stop > start => {
                format!("{}{section}{}", &text[..start], &text[stop + end.len()..])
            }
            _ => format!("{}\n\n{section}\n", text.trim_end()),
        }
    }

    /// Write `table` into this section of the report at `path`.
    pub fn write(&self, path: &Path, table: &str) -> anyhow::Result<()> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
        };
        std::fs::write(path, self.replaced_in(&text, table))
            .with_context(|| format!("cannot write {}", path.display()))
    }
}

/// Whether `text` holds every section of [`SECTIONS`] once, each begun before it ends,
/// none inside another, in the listed order: what a re-run of any benchmark needs to
/// replace its own table and nothing else. Pure.
pub fn check_layout(text: &str) -> Result<(), String> {
    let mut last_end = 0;
    for section in SECTIONS {
        let (begin, end) = (section.begin(), section.end());
        for marker in [&begin, &end] {
            let count = text.matches(marker.as_str()).count();
            if count != 1 {
                return Err(format!("{marker} is there {count} times, not once"));
            }
        }
        let (start, stop) = (text.find(&begin), text.find(&end));
        let (Some(start), Some(stop)) = (start, stop) else {
            return Err(format!("section {} has no markers", section.name));
        };
        if stop < start {
            return Err(format!("section {} ends before it begins", section.name));
        }
        if start < last_end {
            return Err(format!(
                "section {} begins before the section above it ends (inside it, or out of order)",
                section.name
            ));
        }
        last_end = stop;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn report() -> String {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../BENCHMARKS.md");
        std::fs::read_to_string(path).unwrap()
    }

    #[test]
    fn the_report_holds_every_benchmarks_section_once_and_none_inside_another() {
        check_layout(&report()).unwrap();
    }

    #[test]
    fn every_script_writes_the_markers_listed_for_it() {
        let bench = Path::new(env!("CARGO_MANIFEST_DIR"));
        for section in SECTIONS {
            let Some(script) = section.writer.strip_prefix("bench/") else {
                continue;
            };
            let code = std::fs::read_to_string(bench.join(script)).unwrap();
            assert!(
                code.contains(&format!("\"{}\"", section.name)),
                "{} does not name its section {:?}",
                section.writer,
                section.name
            );
        }
    }

    #[test]
    fn the_python_benches_list_the_same_sections() {
        let module = Path::new(env!("CARGO_MANIFEST_DIR")).join("report.py");
        let code = std::fs::read_to_string(module).unwrap();
        let listed = code.matches("\": \"").count();
        assert_eq!(listed, SECTIONS.len(), "report.py lists {listed} writers");
        for section in SECTIONS {
            let entry = format!("\"{}\": \"{}\",", section.name, section.writer);
            assert!(code.contains(&entry), "report.py lacks {entry}");
        }
    }

    #[test]
    fn a_rewrite_replaces_its_own_table_and_nothing_around_it() {
        let text = format!(
            "# Report\n\nbefore\n{}\nold table\n{}\nafter\n",
            FLEET.begin(),
            FLEET.end()
        );
        let written = FLEET.replaced_in(&text, "new table\n");
        assert_eq!(
            written,
            format!(
                "# Report\n\nbefore\n{}\nnew table\n{}\nafter\n",
                FLEET.begin(),
                FLEET.end()
            )
        );
        assert_eq!(FLEET.replaced_in(&written, "new table\n"), written);
    }

    #[test]
    fn a_section_missing_twice_out_of_order_or_nested_is_named() {
        let whole: String = SECTIONS
            .iter()
            .map(|s| format!("{}\nt\n{}\n", s.begin(), s.end()))
            .collect();
        check_layout(&whole).unwrap();
        let missing = whole.replace(&API_LOAD.end(), "");
        assert!(check_layout(&missing).unwrap_err().contains("api-load"));
        let twice = format!("{whole}{}", FLEET.begin());
        assert!(check_layout(&twice).unwrap_err().contains("2 times"));
        let api_load = format!("{}\nt\n{}\n", API_LOAD.begin(), API_LOAD.end());
        let fleet_begin = format!("{}\n", FLEET.begin());
        let nested = whole
            .replace(&api_load, "")
            .replace(&fleet_begin, &format!("{fleet_begin}{api_load}"));
        assert!(check_layout(&nested).unwrap_err().contains("api-load"));
    }
}
