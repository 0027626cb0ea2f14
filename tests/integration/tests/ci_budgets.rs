//! CI's stage budgets (`.ci/budgets`, `scripts/stages`): every stage the scripts time has
//! one, docs/DEVELOPMENT.md shows the same numbers, and a stage over its budget warns
//! without failing the run.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::collections::BTreeMap;
use std::process::Command;

use rigger_integration_tests::repo_root;

/// `.ci/budgets`: stage → seconds.
fn budgets() -> BTreeMap<String, u64> {
    let text = std::fs::read_to_string(repo_root().join(".ci/budgets")).unwrap();
    text.lines()
        .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
        .map(|line| {
            let mut words = line.split_whitespace();
            let stage = words.next().unwrap().to_owned();
            let seconds = words.next().unwrap().parse().unwrap();
            assert!(words.next().is_none(), "{line}: a stage and its seconds");
            (stage, seconds)
        })
        .collect()
}

/// The stage names the scripts give `stage NAME ...`.
fn timed_stages() -> Vec<String> {
    let mut stages = Vec::new();
    for script in [
        ".ci/run",
        "scripts/test",
        "scripts/fresh-root-test",
        "scripts/fuzz",
    ] {
        let text = std::fs::read_to_string(repo_root().join(script)).unwrap();
        for line in text.lines() {
            let line = line.trim_start();
            if let Some(rest) = line.strip_prefix("stage ") {
                stages.push(rest.split_whitespace().next().unwrap().to_owned());
            }
        }
    }
    assert!(stages.len() >= 10, "found only {stages:?}");
    stages
}

#[test]
fn every_timed_stage_has_a_budget_and_the_guide_shows_them() {
    let budgets = budgets();
    for stage in timed_stages() {
        assert!(
            budgets.contains_key(&stage),
            "stage {stage} has no budget in .ci/budgets"
        );
    }
    // The guide's table: | `stage` | what | budget | warm | from nothing |
    let guide = std::fs::read_to_string(repo_root().join("docs/DEVELOPMENT.md")).unwrap();
    let section = guide
        .split("## CI and its budget")
        .nth(1)
        .expect("docs/DEVELOPMENT.md has a section \"CI and its budget\"");
    let mut shown = BTreeMap::new();
    for row in section.lines().filter(|line| line.starts_with("| `")) {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let stage = cells[1].trim_matches('`').to_owned();
        let budget: u64 = cells[3].replace(',', "").parse().unwrap();
        shown.insert(stage, budget);
    }
    for (stage, budget) in &shown {
        assert_eq!(
            budgets.get(stage),
            Some(budget),
            "docs/DEVELOPMENT.md shows {stage}'s budget as {budget} s, .ci/budgets says otherwise"
        );
    }
    let top: Vec<_> = budgets
        .keys()
        .filter(|stage| !stage.contains('/'))
        .collect();
    for stage in &top {
        assert!(
            shown.contains_key(*stage),
            "docs/DEVELOPMENT.md's table lacks the stage {stage}"
        );
    }
    let total: u64 = top.iter().map(|stage| budgets[*stage]).sum();
    let total_row = section
        .lines()
        .find(|line| line.starts_with("| **the run**"))
        .expect("the table's total row");
    let shown_total: u64 = total_row
        .split('|')
        .nth(3)
        .unwrap()
        .trim()
        .trim_matches('*')
        .replace(',', "")
        .parse()
        .unwrap();
    assert_eq!(
        shown_total, total,
        "the run's budget is the sum of its stages'"
    );
    assert!(
        total <= 40 * 60,
        "the stages' budgets add up past CI's 40 minutes: {total} s"
    );
}

/// `stage` runs its command, records it and prints its line; over its budget it warns and
/// the stage still succeeds; a failing command fails the stage with its exit status.
#[test]
fn a_stage_over_its_budget_warns_and_a_failing_one_fails() {
    let work = tempfile::tempdir().unwrap();
    let record = work.path().join("times.txt");
    let script = format!(
        r#"source {stages}
STAGES_BUDGETS={budgets}
printf 'quick 5\nslow 0\n' >"$STAGES_BUDGETS"
stages_begin {record}
stage quick true
stage slow sleep 1.2
stage broken sh -c 'exit 3' || echo "broken exited $?"
stage_table"#,
        stages = repo_root().join("scripts/stages").display(),
        budgets = work.path().join("budgets").display(),
        record = record.display(),
    );
    let out = Command::new("bash")
        .args(["-euc", &script])
        .env_remove("RIGGER_STAGE_TIMES")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stderr.contains("=== stage quick: "), "{stderr}");
    assert!(stderr.contains(" s (budget 5 s), "), "{stderr}");
    assert!(stderr.contains("WARNING: stage slow took "), "{stderr}");
    assert!(stderr.contains(" s, over its budget of 0 s"), "{stderr}");
    assert!(!stderr.contains("WARNING: stage quick"), "{stderr}");
    assert!(stdout.contains("broken exited 3"), "{stdout}");
    let rows: Vec<String> = std::fs::read_to_string(&record)
        .unwrap()
        .lines()
        .map(|line| {
            let cells: Vec<&str> = line.split('\t').collect();
            format!("{} {}", cells[0], cells[5])
        })
        .collect();
    assert_eq!(rows, ["quick 0", "slow 0", "broken 3"]);
    // The line's seconds are whole seconds of the clock, so `slow` counts 1 or 2.
    assert!(stdout.contains("OVER BUDGET"), "{stdout}");
    assert!(stdout.contains("failed (3)"), "{stdout}");
}
